"""Render the raw data sets as CSV: the format the write-up's story starts from.

One row per image: the label, then the 784 pixels as decimal integers, comma-separated,
`\\n` line ends, under the Kaggle edition's header `label,pixel1,...,pixel784`. Written by
polars' multithreaded writer, many times faster than numpy.savetxt (`benchmarks/csv_write.py`
measures both).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import polars as pl

from pipeline.core.atomic import atomic_dir, atomic_path
from pipeline.core.bounded import open_regular
from pipeline.core.dataset import COLUMNS, CSV_HEADER, CSV_HEADER_MAX, CSV_LINE_MAX, PIXELS, SPLITS
from pipeline.core.errors import DataError
from pipeline.stages.mnist import read_raw_split

HEADER = CSV_HEADER + "\n"
HEADER_LINE = CSV_HEADER.encode()


def line_body(line: bytes) -> bytes:
    """A line as read (ending in LF, CRLF, or nothing at the end of the file) without its one
    line ending, and nothing more stripped (no blanks, no stray CR)."""
    return line.removesuffix(b"\n").removesuffix(b"\r")


def is_header(line: bytes) -> bool:
    return line_body(line) == HEADER_LINE


def write_csv(images: np.ndarray, labels: np.ndarray, dest: Path) -> None:
    """Write one split as CSV (atomically; byte-for-byte reproducible)."""
    # One contiguous copy per pixel column: slicing columns out of the row-major images
    # would make polars gather 784 strided arrays, which costs more than the write.
    columns = np.ascontiguousarray(images.reshape(len(images), PIXELS).T)
    frame = pl.DataFrame(
        [pl.Series("label", labels, dtype=pl.UInt8)]
        + [pl.Series(name, columns[i], dtype=pl.UInt8) for i, name in enumerate(COLUMNS[1:])]
    )
    with atomic_path(dest) as tmp:
        frame.write_csv(tmp, include_header=True, line_terminator="\n")


def copy_csv(source: Path, dest: Path, rows: int | None = None, within: Path | None = None) -> None:
    """Copy a CSV edition, adding the header when the source (as most mirrors') has none. A
    regular file only (inside `within`, when given), and with `rows`, no more bytes than a
    header and that many rows can take (the convert stage checks each line)."""
    cap = None if rows is None else CSV_HEADER_MAX + rows * CSV_LINE_MAX
    with open_regular(source, within) as src, atomic_path(dest) as tmp, tmp.open("wb") as out:
        first = src.readline(max(CSV_HEADER_MAX, CSV_LINE_MAX) + 1)
        if not first:
            raise DataError(f"{source}: empty file")
        if not is_header(first):
            if first[:1].isdigit():
                out.write(HEADER.encode())
            else:
                raise DataError(
                    f"{source}: line 1 is neither the header {HEADER[:30]!r}... nor a data row: {first[:60]!r}"
                )
        out.write(first)
        copied = len(first)
        while chunk := src.read(1 << 20):
            copied += len(chunk)
            if cap is not None and copied > cap:
                raise DataError(
                    f"{source}: more than {cap:,} bytes, more than a header and the split's {rows:,} "
                    f"rows (sources.yaml) can take"
                )
            out.write(chunk)


def render_csvs(raw_dir: Path, out_dir: Path, rows: dict[str, int] | None = None) -> None:
    """Stage `csv@<dataset>`: `{train,test}.csv` from the fetched IDX (or CSV) files; with
    `rows` (sources.yaml), each split must have its count."""
    raw_dir, out_dir = Path(raw_dir), Path(out_dir)
    said = []  # said once both splits are in place
    with atomic_dir(out_dir) as tmp:  # both splits or neither
        for split in SPLITS:
            dest = tmp / f"{split}.csv"
            csv_source = raw_dir / f"{split}.csv"
            expected = None if rows is None else rows[split]
            if csv_source.exists() or csv_source.is_symlink():
                copy_csv(csv_source, dest, expected, raw_dir)
            else:
                images, labels = read_raw_split(raw_dir, split, expected)
                write_csv(images, labels, dest)
            said.append(f"{out_dir / dest.name}: {dest.stat().st_size:,} bytes")
    print("\n".join(said), file=sys.stderr)
