"""The IDX format of MNIST and Fashion-MNIST, read and written with full validation.

The header is two zero bytes, a type code, the number of dimensions, then one big-endian
uint32 per dimension. A reader that trusted it blindly would turn a truncated download into
a silently short data set; here every field is checked and the error names the file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.core.atomic import atomic_path
from pipeline.core.errors import DataError, InputError
from pipeline.core.dataset import IMAGE_SHAPE, NUM_CLASSES, first_bad_label

# Type codes of the IDX format; MNIST only uses 0x08, the others are read for completeness.
_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_CODES = {dt.newbyteorder(">") if dt.itemsize > 1 else dt: code for code, dt in _DTYPES.items()}


class IdxError(InputError):
    """An IDX file whose header or length does not describe a valid array."""


def parse_idx(data: bytes, source: str = "<bytes>") -> np.ndarray:
    """Turn the bytes of an IDX file into an array, or say precisely why not."""
    if len(data) < 4:
        raise IdxError(f"{source}: {len(data)} bytes, too short for an IDX header (4 bytes)")
    zero, code, ndim = int.from_bytes(data[:2], "big"), data[2], data[3]
    if zero != 0 or code not in _DTYPES:
        raise IdxError(
            f"{source}: bad magic number 0x{data[:4].hex()}: expected 0x0000 then a type "
            f"code in {sorted(hex(c) for c in _DTYPES)} (is this a gzip file not unpacked?)"
        )
    if ndim == 0:
        raise IdxError(f"{source}: header declares 0 dimensions")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise IdxError(f"{source}: truncated header: {ndim} dimensions need {header} bytes")
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    dtype = _DTYPES[code]
    expected = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) != expected:
        kind = "truncated" if len(data) < expected else "trailing bytes"
        raise IdxError(
            f"{source}: {kind}: header says shape {shape} ({expected:,} bytes), "
            f"file has {len(data):,} bytes"
        )
    return np.frombuffer(data, dtype=dtype, offset=header).reshape(shape)


def read_idx(path: Path) -> np.ndarray:
    return parse_idx(Path(path).read_bytes(), str(path))


def idx_bytes(array: np.ndarray) -> bytes:
    dtype = array.dtype.newbyteorder(">") if array.dtype.itemsize > 1 else array.dtype
    if dtype not in _CODES:
        raise IdxError(f"dtype {array.dtype} has no IDX type code")
    header = bytes([0, 0, _CODES[dtype], array.ndim])
    header += b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return header + np.ascontiguousarray(array, dtype=dtype).tobytes()


def write_idx(path: Path, array: np.ndarray) -> None:
    with atomic_path(Path(path)) as tmp:
        tmp.write_bytes(idx_bytes(array))


def read_split(raw_dir: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Images [n, 28, 28] uint8 and labels [n] uint8 of one fetched split, cross-checked."""
    images_path, labels_path = Path(raw_dir) / f"{split}-images.idx", Path(raw_dir) / f"{split}-labels.idx"
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.ndim != 3 or images.shape[1:] != IMAGE_SHAPE or images.dtype != np.uint8:
        raise DataError(f"{images_path}: expected uint8 images of shape [n, {IMAGE_SHAPE[0]}, {IMAGE_SHAPE[1]}], got "
                        f"{images.dtype} {list(images.shape)}")
    if labels.ndim != 1 or labels.dtype != np.uint8:
        raise DataError(f"{labels_path}: expected uint8 labels of shape [n], got "
                        f"{labels.dtype} {list(labels.shape)}")
    if len(images) != len(labels):
        raise DataError(f"{split}: {len(images):,} images in {images_path} but "
                        f"{len(labels):,} labels in {labels_path}")
    bad = first_bad_label(labels)
    if bad is not None:
        raise DataError(f"{labels_path}: label {labels[bad]} at index {bad} is outside 0..{NUM_CLASSES - 1}")
    return images, labels
