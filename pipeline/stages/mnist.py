"""MNIST's and Fashion-MNIST's files and sample: the IDX format, read and written with full
validation, and the sample (images and labels) every stage writes and reads.

An IDX file is two zero bytes, a type code, the number of dimensions, then one big-endian
uint32 per dimension; the body is the product of the dimensions times the type's size, computed
with Python's integers, so dimensions that would wrap a 64-bit product give a size that is
simply too large, never a small one. The fetch stage checks a download's header while it
streams (`header_size`, `parse_header`); the readers check every field before they read a body,
and each error names the file: a truncated download is refused, never a short data set.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from pipeline.core.atomic import atomic_path
from pipeline.core.bounded import open_regular
from pipeline.core.dataset import IMAGE_SHAPE, NUM_CLASSES, PIXELS, idx_header
from pipeline.core.errors import DataError, InputError
from pipeline.shards.format import Field, Sample

# Type code -> (numpy dtype string, bytes per value); MNIST uses 0x08 only.
TYPES: dict[int, tuple[str, int]] = {
    0x08: ("u1", 1),
    0x09: ("i1", 1),
    0x0B: (">i2", 2),
    0x0C: (">i4", 4),
    0x0D: (">f4", 4),
    0x0E: (">f8", 8),
}
MAX_DIMS = 8  # MNIST's files have 1 or 3; numpy takes at most 32 (1.x) or 64 (2.x)
MAX_HEADER = 4 + 4 * MAX_DIMS


class IdxError(InputError):
    """An IDX file whose header or length does not describe a valid array."""


def header_size(prefix: bytes, source: str) -> int:
    """The header's length in bytes, from its first 4 bytes (magic and dimension count)."""
    if len(prefix) < 4:
        raise IdxError(f"{source}: {len(prefix)} bytes, too short for an IDX header (4 bytes)")
    if prefix[0] != 0 or prefix[1] != 0 or prefix[2] not in TYPES:
        raise IdxError(
            f"{source}: bad magic number 0x{prefix[:4].hex()}: expected 0x0000 then a type "
            f"code in {sorted(hex(c) for c in TYPES)} (is this a gzip file not unpacked?)"
        )
    ndim = prefix[3]
    if ndim == 0:
        raise IdxError(f"{source}: header declares 0 dimensions")
    if ndim > MAX_DIMS:
        raise IdxError(
            f"{source}: header declares {ndim} dimensions, more than the {MAX_DIMS} an IDX file here may have"
        )
    return 4 + 4 * ndim


def parse_header(data: bytes, source: str) -> tuple[int, tuple[int, ...], int, int]:
    """(type code, shape, header bytes, whole file bytes) from the start of an IDX file."""
    header = header_size(data, source)
    if len(data) < header:
        raise IdxError(f"{source}: truncated header: {data[3]} dimensions need {header} bytes")
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(data[3]))
    count = 1
    for dim in shape:
        count *= dim
    return data[2], shape, header, header + count * TYPES[data[2]][1]


# The tensor names and dtypes of every shard the pipeline writes (the same as what shard
# format version 2 fixed, so those shards' bytes did not change).
MNIST = Sample((Field("images", "uint8", IMAGE_SHAPE), Field("labels", "uint8", (), classes=NUM_CLASSES)))


def first_bad_label(labels) -> int | None:
    """The index of the first label outside 0..NUM_CLASSES-1 (numpy array or CPU tensor), or
    None: the label field's own rule, so the stages cannot drift from the shard writer's."""
    return MNIST["labels"].first_bad(labels)


# Type codes of the IDX format; MNIST only uses 0x08, the others are read for completeness.
_DTYPES: dict[int, np.dtype] = {code: np.dtype(spec) for code, (spec, _) in TYPES.items()}
_CODES = {dt.newbyteorder(">") if dt.itemsize > 1 else dt: code for code, dt in _DTYPES.items()}


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


def read_raw_split(raw_dir: Path, split: str, rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
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
