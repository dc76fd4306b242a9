"""The IDX format of MNIST and Fashion-MNIST, read and written with full validation.

The header is two zero bytes, a type code, the number of dimensions, then one big-endian
uint32 per dimension. A reader that trusted it blindly would turn a truncated download into
a silently short data set; here every field is checked and the error names the file.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from pipeline.core.atomic import atomic_path
from pipeline.core.bounded import open_regular
from pipeline.core.dataset import IMAGE_SHAPE, NUM_CLASSES, PIXELS
from pipeline.core.errors import DataError
from pipeline.stages.idxheader import TYPES, IdxError, header_size, idx_header, parse_header
from pipeline.stages.sample import first_bad_label

# Type codes of the IDX format; MNIST only uses 0x08, the others are read for completeness.
_DTYPES: dict[int, np.dtype] = {code: np.dtype(spec) for code, (spec, _) in TYPES.items()}
_CODES = {dt.newbyteorder(">") if dt.itemsize > 1 else dt: code for code, dt in _DTYPES.items()}

__all__ = ["IdxError", "idx_bytes", "parse_idx", "read_idx", "read_split", "write_idx"]


def _check_size(source: str, shape: tuple[int, ...], expected: int, actual: int) -> None:
    if actual != expected:
        kind = "truncated" if actual < expected else "trailing bytes"
        raise IdxError(f"{source}: {kind}: header says shape {shape} ({expected:,} bytes), file has {actual:,} bytes")


def _array(data: bytes, code: int, header: int, shape: tuple[int, ...], source: str) -> np.ndarray:
    try:
        return np.frombuffer(data, dtype=_DTYPES[code], offset=header).reshape(shape)
    except ValueError:  # an empty body with other dimensions whose product numpy cannot hold
        raise IdxError(f"{source}: header says shape {shape}, which no array can have") from None


def parse_idx(data: bytes, source: str = "<bytes>") -> np.ndarray:
    """Turn the bytes of an IDX file into an array, or say precisely why not."""
    code, shape, header, expected = parse_header(data, source)
    _check_size(source, shape, expected, len(data))
    return _array(data, code, header, shape, source)


def read_idx(path: Path, max_bytes: int | None = None, within: Path | None = None) -> np.ndarray:
    """An IDX file whose header is checked before its body is read: the size the header
    declares must be the file's, and at most `max_bytes`. Only a regular file is opened
    (inside `within`, when given): a FIFO or a link to a device is refused, not read."""
    path = Path(path)
    with open_regular(path, within) as f:
        head = f.read(4)
        head += f.read(header_size(head, str(path)) - 4)
        code, shape, header, expected = parse_header(head, str(path))
        _check_size(str(path), shape, expected, os.fstat(f.fileno()).st_size)
        if max_bytes is not None and expected > max_bytes:
            raise IdxError(
                f"{path}: header says shape {shape} ({expected:,} bytes), more than the {max_bytes:,} "
                f"bytes this file can have"
            )
        data = head + f.read(expected - header)
    _check_size(str(path), shape, expected, len(data))  # the file changed while read
    return _array(data, code, header, shape, str(path))


def idx_bytes(array: np.ndarray) -> bytes:
    dtype = array.dtype.newbyteorder(">") if array.dtype.itemsize > 1 else array.dtype
    if dtype not in _CODES:
        raise IdxError(f"dtype {array.dtype} has no IDX type code")
    return idx_header(_CODES[dtype], array.shape) + np.ascontiguousarray(array, dtype=dtype).tobytes()


def write_idx(path: Path, array: np.ndarray) -> None:
    with atomic_path(Path(path)) as tmp:
        tmp.write_bytes(idx_bytes(array))


def read_split(raw_dir: Path, split: str, rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Images [n, 28, 28] uint8 and labels [n] uint8 of one fetched split, cross-checked;
    n must be `rows` (the data set's count, sources.yaml) when given, and no file larger
    than n samples can be is read. Files must be regular files inside `raw_dir`."""
    raw_dir = Path(raw_dir)
    images_path, labels_path = raw_dir / f"{split}-images.idx", raw_dir / f"{split}-labels.idx"
    images_cap, labels_cap = (None, None) if rows is None else (16 + rows * PIXELS, 8 + rows)
    images, labels = read_idx(images_path, images_cap, raw_dir), read_idx(labels_path, labels_cap, raw_dir)
    if images.ndim != 3 or images.shape[1:] != IMAGE_SHAPE or images.dtype != np.uint8:
        raise DataError(
            f"{images_path}: expected uint8 images of shape [n, {IMAGE_SHAPE[0]}, {IMAGE_SHAPE[1]}], got "
            f"{images.dtype} {list(images.shape)}"
        )
    if labels.ndim != 1 or labels.dtype != np.uint8:
        raise DataError(f"{labels_path}: expected uint8 labels of shape [n], got {labels.dtype} {list(labels.shape)}")
    if len(images) != len(labels):
        raise DataError(f"{split}: {len(images):,} images in {images_path} but {len(labels):,} labels in {labels_path}")
    if rows is not None and len(images) != rows:
        raise DataError(
            f"{images_path}: {len(images):,} samples, but the data set's {split} split has {rows:,} (sources.yaml rows)"
        )
    bad = first_bad_label(labels)
    if bad is not None:
        raise DataError(f"{labels_path}: label {labels[bad]} at index {bad} is outside 0..{NUM_CLASSES - 1}")
    return images, labels
