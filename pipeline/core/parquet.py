"""The two Parquet layouts the convert stage writes, and the checks every reader of them runs.

`wide` is the write-up's layout (label + one uint8 column per pixel); `compact` keeps each
image as one 784-byte fixed-size binary value. A reader takes columns by name, checks their
types (a file from elsewhere with wider ones would wrap when cast to uint8) and that none
holds a null (Arrow reads a null as 0), and checks the file against the `SHA256SUMS` the
convert stage wrote beside it before trusting its bytes. pyarrow only: the shard stage
uses this without polars.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.core.bounded import open_regular, read_capped
from pipeline.core.dataset import COLUMNS, IMAGE_SHAPE, PIXELS, SPLITS
from pipeline.core.errors import DataError, is_hex, reason

LAYOUTS = ("wide", "compact")
IMAGE_TYPE = pa.binary(PIXELS)
_TYPES = {**{name: pa.uint8() for name in COLUMNS}, "image": IMAGE_TYPE}  # what either layout holds


def compact_table(labels: np.ndarray, pixels: np.ndarray) -> pa.Table:
    """One row-major 784-byte value per image, zero-copy over `pixels`."""
    images = pa.FixedSizeBinaryArray.from_buffers(
        IMAGE_TYPE, len(labels), [None, pa.py_buffer(np.ascontiguousarray(pixels))]
    )
    return pa.Table.from_arrays([pa.array(labels, pa.uint8()), images], names=["label", "image"])


def check_types(path: Path, schema: pa.Schema) -> None:
    """Exactly the types this module writes: a file from elsewhere with wider ones (int64,
    float) would be cast to uint8 by its readers and wrap (300 -> 44) without a word."""
    for field in schema:
        expected = _TYPES.get(field.name)
        if expected is not None and field.type != expected:
            raise DataError(f"{path}: column {field.name!r} is {field.type}, expected {expected}")


def check_present(path: Path, name: str, column: pa.Array | pa.ChunkedArray) -> None:
    """Every value there: Arrow reads a null as 0 (or leftover bytes) when asked for numbers."""
    if column.null_count:
        raise DataError(f"{path}: column {name!r} has {column.null_count} empty (null) values")


def _present(path: Path, table: pa.Table, name: str) -> pa.ChunkedArray:
    column = table.column(name)
    check_present(path, name, column)
    return column


def read_parquet_arrays(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(labels [n], images [n, *IMAGE_SHAPE]) uint8 of the whole file, from either layout:
    `iter_parquet_arrays`' row groups joined, with its checks."""
    labels, images = zip(*iter_parquet_arrays(path), strict=True)
    return np.concatenate(labels), np.concatenate(images)


def iter_parquet_arrays(path: Path) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(labels, images) uint8 one row group at a time, from either layout, page checksums
    verified where the writer stored them: memory bounded by a row group, not the file (a
    split of any size reads back). A damaged file is a DataError naming it; a file of no row
    groups gives its schema's checks and no rows."""
    try:
        open_regular(path).close()  # a FIFO or a device is refused, not read
        parquet = pq.ParquetFile(path, page_checksum_verification=True)
    except FileNotFoundError:
        raise DataError(f"{path}: missing") from None
    except (pa.ArrowException, OSError) as err:
        raise DataError(f"{path}: not a readable Parquet file, damaged or cut? ({reason(err)})") from None
    with parquet:
        if parquet.num_row_groups == 0:
            yield _arrays(path, parquet.schema_arrow.empty_table())
        for group in range(parquet.num_row_groups):
            try:
                table = parquet.read_row_group(group)
            except (pa.ArrowException, OSError) as err:
                raise DataError(f"{path}: row group {group} unreadable, damaged or cut? ({reason(err)})") from None
            yield _arrays(path, table)


def _arrays(path: Path, table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """A table of either layout as (labels, images) uint8, its columns checked."""
    if "label" not in table.column_names:
        raise DataError(f"{path}: no 'label' column (columns: {table.column_names[:5]}...)")
    check_types(path, table.schema)
    labels = _present(path, table, "label").to_numpy()
    if "image" in table.column_names:
        images = _present(path, table, "image").combine_chunks()
        flat = np.frombuffer(images.buffers()[1], np.uint8, len(images) * PIXELS, images.offset * PIXELS)
    else:
        names = set(table.column_names)
        missing = [c for c in COLUMNS if c not in names]
        if missing:
            raise DataError(f"{path}: neither an 'image' column nor the pixel columns (missing {missing[:3]}...)")
        # Fill column-major (each column a contiguous copy), then transpose once: filling
        # row-major column by column is a strided write per byte, ten times slower.
        by_column = np.empty((PIXELS, len(labels)), np.uint8)
        for i, name in enumerate(COLUMNS[1:]):
            by_column[i] = _present(path, table, name).to_numpy()
        flat = np.ascontiguousarray(by_column.T)
    return labels, flat.reshape(len(labels), *IMAGE_SHAPE)


CHECKSUMS = "SHA256SUMS"
SUMS_CAP = 64 << 10


def _sha256(path: Path, within: Path | None = None) -> str:
    digest = hashlib.sha256()
    with open_regular(path, within) as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def write_checksums(folder: Path, layouts: tuple[str, ...] = LAYOUTS) -> None:
    """`SHA256SUMS` beside the Parquet files (`sha256sum -c` reads it): what later stages
    check before they trust a file that sat on a disk or went through a copy."""
    names = [f"{layout}/{split}.parquet" for layout in layouts for split in SPLITS]
    (folder / CHECKSUMS).write_text("".join(f"{_sha256(folder / name)}  {name}\n" for name in names))


def _read_sums(sums: Path) -> dict[str, str]:
    """`sha256sum`'s text format, read strictly: a damaged list must not pass as a shorter one."""
    try:  # four lines of 64 + 2 + 22 bytes: 64 KiB is plenty, and no more is read
        text = read_capped(sums, SUMS_CAP, "SHA256SUMS", within=sums.parent).decode("ascii")
    except UnicodeDecodeError:
        raise DataError(f"{sums}: not a SHA256SUMS text file (bytes that are not ASCII)") from None
    return parse_sums(text, sums)


def parse_sums(text: str, sums: Path | str) -> dict[str, str]:
    """{file: sha256} of a SHA256SUMS text (`sums` names it in errors), read strictly: a line
    that is not '<64 hex digits>  <file>', or a file named twice, refuses the whole list (a
    damaged list must not pass as a shorter one, nor its second line win)."""
    recorded: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        digest, sep, name = line.partition("  ")
        if not (sep and is_hex(digest, 64) and name and name not in recorded):
            raise DataError(f"{sums}: line {number} is not '<64 hex digits>  <file>' (or names a file twice)")
        recorded[name] = digest
    return recorded


def verify_checksum(path: Path) -> None:
    """Check `<codec>/<layout>/<split>.parquet` against its folder's SHA256SUMS."""
    path = Path(path)
    sums = path.parent.parent / CHECKSUMS
    name = f"{path.parent.name}/{path.name}"
    try:
        recorded = _read_sums(sums)
    except FileNotFoundError:
        raise DataError(f"{sums}: missing, so {path} cannot be checked (not written by the convert stage?)") from None
    if name not in recorded:
        raise DataError(f"{sums}: no checksum for {name}")
    if not (path.exists() or path.is_symlink()):
        raise DataError(f"{path}: missing ({sums.name} lists it: the convert stage's output is incomplete)")
    actual = _sha256(path, within=sums.parent)
    if actual != recorded[name]:
        raise DataError(
            f"{path}: checksum mismatch: {sums.name} says {recorded[name][:16]}..., file is "
            f"{actual[:16]}... (damaged after the convert stage wrote it)"
        )
