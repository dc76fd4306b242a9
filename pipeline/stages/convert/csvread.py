"""Reading a CSV split in blocks of whole lines, checked and parsed: what both engines of
the convert stage share (the local one streams `iter_csv`; Ray tasks run `parse_lines`).

We read the CSV in fixed-size blocks of whole lines, so memory stays flat however large the
file grows; each block's line lengths are checked before polars parses it (in parallel,
explicit uint8, no int64 detour). polars' parse errors carry no line number, so on failure
the failing block is scanned line by line to name the first bad line.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np
import polars as pl

from pipeline.core.bounded import open_regular
from pipeline.core.dataset import COLUMNS, CSV_LINE_MAX, CSV_ROW_MAX, CSV_ROW_MIN, NUM_CLASSES
from pipeline.core.errors import DataError, reason
from pipeline.stages.csvdata import HEADER, is_header, line_body
from pipeline.stages.mnist import first_bad_label


def _check_header(csv_path: Path, f: BinaryIO) -> None:
    first = f.readline(64 << 10)  # the header is 7,969 bytes: what follows is not read as one line
    if not first:
        raise DataError(f"{csv_path}: empty file (expected the header {HEADER[:30]!r}...)")
    if not is_header(first):
        names = line_body(first).decode("utf-8", "replace").split(",")
        where = next((i for i, (a, b) in enumerate(zip(names, COLUMNS)) if a != b), min(len(names), len(COLUMNS)))
        got = names[where] if where < len(names) else "<end of line>"
        raise DataError(
            f"{csv_path}: line 1: header does not match: column {where + 1} is "
            f"{got!r}, expected {COLUMNS[where] if where < len(COLUMNS) else '<end of line>'!r} "
            f"({len(names)} columns, expected {len(COLUMNS)})"
        )


def _locate_bad_line(lines: bytes, first_number: int) -> str:
    """The first line of a block that breaks the format, described; run only on failure,
    since the readers' own errors carry no line number."""
    for number, raw in enumerate(lines.splitlines(), start=first_number):
        fields = raw.decode("utf-8", "replace").split(",")
        if len(fields) != len(COLUMNS):
            return f"line {number}: {len(fields)} columns, expected {len(COLUMNS)}"
        for column, text in zip(COLUMNS, fields):
            top = NUM_CLASSES - 1 if column == "label" else 255
            if not (text.strip().isascii() and text.strip().isdigit()):
                return f"line {number}, column {column!r}: {text!r} is not a non-negative integer"
            if int(text) > top:
                return f"line {number}, column {column!r}: {text.strip()} is outside 0..{top}"
    last = first_number + lines.count(b"\n")
    return f"a bad line in lines {first_number}..{last}"


def _too_long(csv_path: Path, line: int, size: str) -> DataError:
    return DataError(
        f"{csv_path}: line {line}: {size} bytes, longer than any row can be (785 fields of at "
        f"most 3 digits and their commas: {CSV_ROW_MAX:,} bytes, then LF or CRLF)"
    )


def _line_blocks(csv_path: Path, f: BinaryIO, block_bytes: int) -> Iterator[tuple[int, bytes]]:
    """(number of its first line, block) for blocks of whole lines after the header. A fixed
    block size keeps memory flat however large the CSV is: a block is at most `block_bytes`
    plus the one line begun before it, and a line is refused once it runs past CSV_LINE_MAX
    bytes without ending, not read to its end."""
    line, rest = 2, b""
    while chunk := f.read(block_bytes):
        cut = chunk.rfind(b"\n") + 1
        if cut:
            block = b"".join((rest, memoryview(chunk)[:cut]))  # one copy, not two
            yield line, block
            line += block.count(b"\n")
            rest = chunk[cut:]
        else:
            rest += chunk
        if len(rest) > CSV_LINE_MAX:
            raise _too_long(csv_path, line, f"more than {CSV_LINE_MAX:,}")
    if rest:
        # A last line without its newline may be cut inside its last number ("...,25"
        # for "...,255"): nothing can tell, so it is refused rather than guessed. Blanks
        # too: polars, writing the wide layout, would read them as a row of nulls.
        raise DataError(
            f"{csv_path}: the file does not end with a newline: its last line is cut "
            f"short or incomplete (ends {bytes(rest[-20:])!r})"
        )


def _check_lines(csv_path: Path, first: int, block: bytes, before: int, rows: int | None) -> None:
    """Before a parser sees the block: it must not take the split past its `rows`, and each
    line's length must be one a row can have (CSV_ROW_MIN..CSV_ROW_MAX bytes and a CR): a
    parser given one 40 MB line makes a column per field, gigabytes."""
    ends = np.flatnonzero(np.frombuffer(block, np.uint8) == 10)  # the block ends with one
    if rows is not None and before + len(ends) > rows:
        extra = rows - before  # the block's line that is one too many
        start = int(ends[extra - 1]) + 1 if extra else 0
        blank = not block[start : int(ends[extra]) + 1].strip()
        raise DataError(
            f"{csv_path}: more than {rows:,} data rows (line {rows + 2:,} is one too many"
            f"{', and blank' if blank else ''}): the data set's split has {rows:,} (sources.yaml rows)"
        )
    lengths = np.diff(ends, prepend=-1) - 1  # without the LF
    bad = np.flatnonzero((lengths < CSV_ROW_MIN) | (lengths > CSV_ROW_MAX + 1))
    if len(bad):
        index = int(bad[0])
        if lengths[index] > CSV_ROW_MAX + 1:
            raise _too_long(csv_path, first + index, f"{int(lengths[index]):,}")
        start = int(ends[index - 1]) + 1 if index else 0
        raise DataError(f"{csv_path}: {_locate_bad_line(block[start : int(ends[index]) + 1], first + index)}")


SCHEMA = {name: pl.UInt8 for name in COLUMNS}


def parse_lines(csv_path: Path, block: bytes) -> tuple[np.ndarray, np.ndarray]:
    """A block of whole data lines, checked and parsed as `iter_csv` does each of its blocks
    (its line numbers counted from the block's start): a Ray task's work. The Ray engine
    names a bad line by rereading the file with `iter_csv`, which knows its number."""
    _check_lines(csv_path, 2, block, 0, None)
    return _parse_block(csv_path, 2, block)


def _parse_block(csv_path: Path, first: int, block: bytes) -> tuple[np.ndarray, np.ndarray]:
    try:
        # quote_char=None: the format has no quoting, and polars' tokenizer is faster without.
        frame = pl.read_csv(block, has_header=False, new_columns=COLUMNS, schema=SCHEMA, quote_char=None)
    except pl.exceptions.PolarsError as err:
        raise DataError(f"{csv_path}: {_locate_bad_line(block, first)} (polars: {reason(err)})") from None
    # One Fortran-ordered [n, 785] array (6x faster than converting the pixels apart). polars
    # reads a missing or empty field as null, and a column with nulls comes out as floats.
    table = frame.to_numpy()
    if table.dtype != np.uint8:
        raise DataError(f"{csv_path}: {_locate_bad_line(block, first)}")
    labels = table[:, 0]
    bad = first_bad_label(labels)
    if bad is not None:
        raise DataError(
            f"{csv_path}: line {first + bad}, column 'label': {labels[bad]} is outside 0..{NUM_CLASSES - 1}"
        )
    # Pixels stay column-major: whoever needs rows transposes once, on its own copy (the
    # row-group buffer does so as it fills).
    return labels, table[:, 1:]


def iter_csv(
    csv_path: Path, block_bytes: int = 16 << 20, rows: int | None = None
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield validated (labels [n], pixels [n, 784]) uint8 blocks of a CSV split, in order
    (pixels Fortran-ordered: use np.ascontiguousarray for row-major bytes); with `rows`, the
    split must have exactly that many.

    polars parses each block in parallel with explicit uint8 types, once its lines have
    lengths a row can have. Memory: one block and what polars makes of it, whatever the file."""
    csv_path = Path(csv_path)
    count = 0
    with open_regular(csv_path, csv_path.parent) as f:
        _check_header(csv_path, f)
        for first, block in _line_blocks(csv_path, f, block_bytes):
            _check_lines(csv_path, first, block, count, rows)
            # Every line is one row (polars reads a blank line as a row of nulls, rejected).
            labels, pixels = _parse_block(csv_path, first, block)
            count += len(labels)
            yield labels, pixels
    if count == 0:
        raise DataError(f"{csv_path}: no data rows after the header")
    if rows is not None and count != rows:
        raise DataError(f"{csv_path}: {count:,} data rows, but the data set's split has {rows:,} (sources.yaml rows)")
