"""CSV -> Parquet, streamed, validated, in two layouts and any codec.

`wide` is the write-up's layout (label + one uint8 column per pixel) so its size table is
reproduced like for like; `compact` keeps each image as one 784-byte fixed-size binary
value, which compresses as well as the raw IDX bytes and reads back into a uint8 array
without a per-column gather.

Each layout is written by the tool that is fastest at it, both streaming so memory stays
bounded however large the CSV grows (benchmarks/convert_speed.py measures both):
- compact: the CSV read in blocks of whole lines and parsed by polars (`csvread`), the
  pixels packed into row groups for pyarrow, which can write fixed-size binary (polars
  cannot). polars' own streaming reader was as fast but buffered ahead: 5x the memory,
  growing with the file. This pass runs first, so a bad CSV fails here, naming its line,
  before anything else.
- wide: polars reads and writes the 785 columns itself (`scan_csv` -> `sink_parquet`),
  encoding columns in parallel; pyarrow's single-threaded writer took twice as long.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.core.atomic import atomic_dir, atomic_path, write_json
from pipeline.core.codec import Codec
from pipeline.core.dataset import PIXELS, SPLITS
from pipeline.core.errors import DataError
from pipeline.core.parquet import IMAGE_TYPE, LAYOUTS, compact_table, iter_parquet_arrays, write_checksums
from pipeline.stages.convert.csvread import SCHEMA, iter_csv

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
            self.labels[self.filled : self.filled + take] = labels[:take]
            self.pixels[self.filled : self.filled + take] = pixels[:take]
            self.filled += take
            labels, pixels = labels[take:], pixels[take:]
            if self.filled == self.rows:
                self.flush()

    def flush(self) -> None:
        if self.filled:
            table = compact_table(self.labels[: self.filled], self.pixels[: self.filled])
            self.writer.write_table(table, row_group_size=self.rows)
            self.filled = 0


def write_compact(
    csv_path: Path,
    out: Path,
    codec: Codec,
    row_group_rows: int,
    rows: int | None = None,
    blocks: Iterator[tuple[np.ndarray, np.ndarray]] | None = None,
) -> int:
    """CSV -> compact Parquet, validating every row on the way (`rows` of them, when given);
    returns the row count. `blocks`: the CSV's validated blocks from elsewhere (the Ray
    engine's tasks) instead of `iter_csv`; the row groups, and so the bytes, are the same."""
    schema = pa.schema([("label", pa.uint8()), ("image", IMAGE_TYPE)])
    count = 0
    # A group larger than the split is the split: the buffer is no larger than it needs to be.
    group_rows = row_group_rows if rows is None else min(row_group_rows, rows)
    # Page checksums (CRC32): a flipped byte in a data page is caught when it is read back.
    with (
        atomic_path(out) as tmp,
        pq.ParquetWriter(
            tmp, schema, use_dictionary=["label"], write_page_checksum=True, **codec.writer_options()
        ) as writer,
    ):
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
        pl.scan_csv(csv_path, schema=SCHEMA, quote_char=None).sink_parquet(
            tmp, row_group_size=row_group_rows, **codec.polars_options()
        )


def convert_split(
    csv_path: Path,
    out_paths: dict[str, Path],
    codec: Codec,
    row_group_rows: int,
    rows: int | None = None,
    blocks: Iterator[tuple[np.ndarray, np.ndarray]] | None = None,
) -> dict:
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
    from pipeline.stages.convert.ray import ray_blocks

    return ray_blocks()


def convert_dataset(
    csv_dir: Path,
    out_dir: Path,
    figures_path: Path,
    codec_spec: str,
    row_group_rows: int = 65536,
    rows: dict[str, int] | None = None,
    engine: str = "local",
) -> dict:
    """Stage `convert@<dataset>-<codec>`: both splits, both layouts, one codec; with `rows`
    (sources.yaml), each split must have its count. `engine` "ray": the CSV parsed and
    checked by Ray tasks (pipeline.stages.convert.ray), the same Parquet bytes."""
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
                figures[split] = convert_split(
                    csv_path,
                    paths,
                    codec,
                    row_group_rows,
                    count,
                    None if blocks_of is None else blocks_of(csv_path, count),
                )
                measure_reads(paths, figures[split])

            interruptible(convert)
            sizes = ", ".join(f"{layout} {figures[split][layout]['bytes'] / 1e6:.2f} MB" for layout in LAYOUTS)
            print(f"{csv_dir}/{split}.csv -> {codec.label}: {sizes}", file=sys.stderr)
        write_checksums(tmp)
    write_json(Path(figures_path), figures)
    return figures
