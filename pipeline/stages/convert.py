"""CSV -> Parquet, streamed, validated, in two layouts and any codec.

`wide` is the write-up's layout (label + one uint8 column per pixel) so its size table is
reproduced like for like; `compact` keeps each image as one 784-byte fixed-size binary
value, which compresses as well as the raw IDX bytes and reads back into a uint8 array
without a per-column gather.

Each layout is written by the tool that is fastest at it, both streaming so memory stays
bounded however large the CSV grows (benchmarks/convert_speed.py measures both):
- compact: we read the CSV in fixed-size blocks of whole lines, polars parses each block
  (in parallel, explicit uint8, no int64 detour), we validate it and pack the pixels into
  row groups for pyarrow, which can write fixed-size binary (polars cannot). polars' own
  streaming reader was as fast but buffered ahead: 5x the memory, growing with the file.
  This pass runs first, so a bad CSV fails here, naming its line, before anything else.
- wide: polars reads and writes the 785 columns itself (`scan_csv` -> `sink_parquet`),
  encoding columns in parallel; pyarrow's single-threaded writer took twice as long.
polars' parse errors carry no line number, so on failure the failing block is scanned
line by line to name the first bad line.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.core.atomic import atomic_dir, atomic_path, write_json
from pipeline.core.bounded import open_regular
from pipeline.stages.csvdata import HEADER, is_header, line_body
from pipeline.core.codec import Codec
from pipeline.core.errors import DataError, reason
from pipeline.core.dataset import COLUMNS, CSV_LINE_MAX, CSV_ROW_MAX, CSV_ROW_MIN, NUM_CLASSES, PIXELS, SPLITS
from pipeline.stages.sample import first_bad_label
from pipeline.core.parquet import IMAGE_TYPE, LAYOUTS, compact_table, iter_parquet_arrays, write_checksums



# ---------------------------------------------------------------- reading the CSV


def _check_header(csv_path: Path, f: BinaryIO) -> None:
    first = f.readline(64 << 10)  # the header is 7,969 bytes: what follows is not read as one line
    if not first:
        raise DataError(f"{csv_path}: empty file (expected the header {HEADER[:30]!r}...)")
    if not is_header(first):
        names = line_body(first).decode("utf-8", "replace").split(",")
        where = next((i for i, (a, b) in enumerate(zip(names, COLUMNS)) if a != b), min(len(names), len(COLUMNS)))
        got = names[where] if where < len(names) else "<end of line>"
        raise DataError(f"{csv_path}: line 1: header does not match: column {where + 1} is "
                        f"{got!r}, expected {COLUMNS[where] if where < len(COLUMNS) else '<end of line>'!r} "
                        f"({len(names)} columns, expected {len(COLUMNS)})")


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
    return DataError(f"{csv_path}: line {line}: {size} bytes, longer than any row can be (785 fields of at "
                     f"most 3 digits and their commas: {CSV_ROW_MAX:,} bytes, then LF or CRLF)")


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
    if rest.strip():
        # A last line without its newline may be cut inside its last number ("...,25"
        # for "...,255"): nothing can tell, so it is refused rather than guessed.
        raise DataError(f"{csv_path}: the file does not end with a newline: its last line is cut "
                        f"short or incomplete (ends {bytes(rest[-20:])!r})")


def _check_lines(csv_path: Path, first: int, block: bytes, before: int, rows: int | None) -> None:
    """Before a parser sees the block: it must not take the split past its `rows`, and each
    line's length must be one a row can have (CSV_ROW_MIN..CSV_ROW_MAX bytes and a CR): a
    parser given one 40 MB line makes a column per field, gigabytes."""
    ends = np.flatnonzero(np.frombuffer(block, np.uint8) == 10)  # the block ends with one
    if rows is not None and before + len(ends) > rows:
        raise DataError(f"{csv_path}: more than {rows:,} data rows (line {rows + 2:,} is one too many): the data "
                        f"set's split has {rows:,} (sources.yaml rows)")
    lengths = np.diff(ends, prepend=-1) - 1  # without the LF
    bad = np.flatnonzero((lengths < CSV_ROW_MIN) | (lengths > CSV_ROW_MAX + 1))
    if len(bad):
        index = int(bad[0])
        if lengths[index] > CSV_ROW_MAX + 1:
            raise _too_long(csv_path, first + index, f"{int(lengths[index]):,}")
        start = int(ends[index - 1]) + 1 if index else 0
        raise DataError(f"{csv_path}: {_locate_bad_line(block[start:int(ends[index]) + 1], first + index)}")


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
        raise DataError(f"{csv_path}: line {first + bad}, column 'label': {labels[bad]} is outside 0..{NUM_CLASSES - 1}")
    # Pixels stay column-major: whoever needs rows transposes once, on its own copy (the
    # row-group buffer does so as it fills).
    return labels, table[:, 1:]


def iter_csv(csv_path: Path, block_bytes: int = 16 << 20, rows: int | None = None
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


# ---------------------------------------------------------------- layouts


# ---------------------------------------------------------------- the stage


class _RowGroups:
    """Packs blocks into row groups of exactly `rows`, so output bytes do not depend on
    how the reader happened to batch the CSV; one preallocated buffer bounds memory."""

    def __init__(self, writer: pq.ParquetWriter, rows: int) -> None:
        self.writer, self.rows, self.filled = writer, rows, 0
        self.labels = np.empty(rows, np.uint8)
        self.pixels = np.empty((rows, PIXELS), np.uint8)

    def add(self, labels: np.ndarray, pixels: np.ndarray) -> None:
        while len(labels):
            take = min(self.rows - self.filled, len(labels))
            self.labels[self.filled:self.filled + take] = labels[:take]
            self.pixels[self.filled:self.filled + take] = pixels[:take]
            self.filled += take
            labels, pixels = labels[take:], pixels[take:]
            if self.filled == self.rows:
                self.flush()

    def flush(self) -> None:
        if self.filled:
            table = compact_table(self.labels[:self.filled], self.pixels[:self.filled])
            self.writer.write_table(table, row_group_size=self.rows)
            self.filled = 0


def write_compact(csv_path: Path, out: Path, codec: Codec, row_group_rows: int, rows: int | None = None,
                  blocks: Iterator[tuple[np.ndarray, np.ndarray]] | None = None) -> int:
    """CSV -> compact Parquet, validating every row on the way (`rows` of them, when given);
    returns the row count. `blocks`: the CSV's validated blocks from elsewhere (the Ray
    engine's tasks) instead of `iter_csv`; the row groups, and so the bytes, are the same."""
    schema = pa.schema([("label", pa.uint8()), ("image", IMAGE_TYPE)])
    count = 0
    # A group larger than the split is the split: the buffer is no larger than it needs to be.
    group_rows = row_group_rows if rows is None else min(row_group_rows, rows)
    # Page checksums (CRC32): a flipped byte in a data page is caught when it is read back.
    with atomic_path(out) as tmp, pq.ParquetWriter(tmp, schema, use_dictionary=["label"], write_page_checksum=True,
                                                   **codec.writer_options()) as writer:
        groups = _RowGroups(writer, group_rows)
        for labels, pixels in iter_csv(csv_path, rows=rows) if blocks is None else blocks:
            groups.add(labels, pixels)
            count += len(labels)
        groups.flush()
    return count


def write_wide(csv_path: Path, out: Path, codec: Codec, row_group_rows: int) -> None:
    """CSV -> wide Parquet (the write-up's layout), read and encoded in parallel by polars.

    Call after `write_compact` has validated the same CSV: polars' own errors carry no
    line number, and a missing field would be written as null rather than rejected."""
    with atomic_path(out) as tmp:
        pl.scan_csv(csv_path, schema=SCHEMA, quote_char=None).sink_parquet(tmp, row_group_size=row_group_rows, **codec.polars_options())


def convert_split(csv_path: Path, out_paths: dict[str, Path], codec: Codec, row_group_rows: int,
                  rows: int | None = None, blocks: Iterator[tuple[np.ndarray, np.ndarray]] | None = None) -> dict:
    """One CSV split into each layout's Parquet file; returns rows and seconds per layout
    (the whole CSV -> file time, parsing included, as a user would see it). `blocks`: as
    for `write_compact`."""
    figures: dict = {"csv_bytes": Path(csv_path).stat().st_size}
    start = time.perf_counter()
    figures["rows"] = write_compact(csv_path, out_paths["compact"], codec, row_group_rows, rows, blocks)
    figures["compact"] = {"write_s": time.perf_counter() - start}
    start = time.perf_counter()
    write_wide(csv_path, out_paths["wide"], codec, row_group_rows)
    figures["wide"] = {"write_s": time.perf_counter() - start}
    return figures


def measure_reads(out_paths: dict[str, Path], figures: dict) -> None:
    """Add each file's size and the seconds to read it back into uint8 arrays, a row group
    at a time: the stage's memory stays bounded by a row group whatever the split's size."""
    for layout, path in out_paths.items():
        start = time.perf_counter()
        rows = sum(len(labels) for labels, _ in iter_parquet_arrays(path))
        if rows != figures["rows"]:
            raise DataError(f"{path}: read back {rows} rows, {figures['rows']} were written")
        figures[layout].update(bytes=path.stat().st_size, read_s=time.perf_counter() - start)


def interruptible(work: Callable[[], None], poll_s: float = 0.1) -> None:
    """Run `work` in a worker thread while this (the main) thread waits in short slices, so
    Ctrl-C stops the stage at once. pyarrow's writer, called from the main thread, takes
    SIGINT for itself during a long write (zstd-19 compressing a whole split: tens of
    seconds) and the interrupt is lost; off the main thread it installs no handler. The
    abandoned work ends with the process; its temporary output is removed as for any
    failure. An exception of `work` is raised here."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread as it is
            failed.append(err)

    worker = threading.Thread(target=run, name="convert", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(poll_s)
    if failed:
        raise failed[0]


def _engine(engine: str) -> contextlib.AbstractContextManager:
    """The CSV's blocks as an engine gives them: None for the local reader (`iter_csv`), or,
    for "ray", a function of (csv path, rows) giving the blocks parsed by Ray tasks."""
    if engine != "ray":
        return contextlib.nullcontext(None)
    from pipeline.stages.ray_convert import ray_blocks

    return ray_blocks()


def convert_dataset(csv_dir: Path, out_dir: Path, figures_path: Path, codec_spec: str,
                    row_group_rows: int = 65536, rows: dict[str, int] | None = None, engine: str = "local") -> dict:
    """Stage `convert@<dataset>-<codec>`: both splits, both layouts, one codec; with `rows`
    (sources.yaml), each split must have its count. `engine` "ray": the CSV parsed and
    checked by Ray tasks (pipeline.stages.ray_convert), the same Parquet bytes."""
    codec = Codec.parse(codec_spec)
    figures: dict = {"codec": codec.label}
    engine_blocks = _engine(engine)
    # The whole output folder is built beside the target and swapped in at the end: a bad
    # test.csv leaves the old train.parquet and test.parquet as they were, not a mix.
    with engine_blocks as blocks_of, atomic_dir(Path(out_dir)) as tmp:
        for split in SPLITS:
            paths = {layout: tmp / layout / f"{split}.parquet" for layout in LAYOUTS}

            def convert(split=split, paths=paths) -> None:
                csv_path, count = Path(csv_dir) / f"{split}.csv", None if rows is None else rows[split]
                figures[split] = convert_split(csv_path, paths, codec, row_group_rows, count,
                                               None if blocks_of is None else blocks_of(csv_path, count))
                measure_reads(paths, figures[split])

            interruptible(convert)
            sizes = ", ".join(f"{layout} {figures[split][layout]['bytes'] / 1e6:.2f} MB" for layout in LAYOUTS)
            print(f"{csv_dir}/{split}.csv -> {codec.label}: {sizes}", file=sys.stderr)
        write_checksums(tmp)
    write_json(Path(figures_path), figures)
    return figures
