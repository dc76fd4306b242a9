"""CSV -> Parquet, streamed, validated, in two layouts and any codec.

`wide` is the seed's layout (label + one uint8 column per pixel) so its size table is
reproduced like for like; `compact` keeps each image as one 784-byte fixed-size binary
value, which compresses as well as the raw IDX bytes and reads back into a uint8 array
without a per-column gather. The CSV is parsed by pyarrow in blocks with explicit uint8
types (no int64 detour); rows are written in row groups of a fixed size, so memory stays
flat however large the CSV grows. pyarrow's own parse errors carry no row number, so on
failure a slow line-by-line scan finds the first bad line for the message.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from pipeline.atomic import atomic_path
from pipeline.csvdata import COLUMNS, HEADER, PIXELS, SPLITS, DataError

LAYOUTS = ("wide", "compact")
CODECS = ("none", "snappy", "gzip", "brotli", "lz4", "zstd")
IMAGE_TYPE = pa.binary(PIXELS)


@dataclass(frozen=True)
class Codec:
    """A Parquet codec and optional level, spelled `name` or `name-level` in params."""

    name: str
    level: int | None = None

    @classmethod
    def parse(cls, spec: str) -> Codec:
        name, _, level = str(spec).partition("-")
        if name not in CODECS:
            raise ValueError(f"unknown codec {spec!r}; expected one of {CODECS}, optionally -<level>")
        if level and not level.isdigit():
            raise ValueError(f"codec {spec!r}: the level after '-' must be an integer")
        if level and name in ("none", "snappy", "lz4"):
            raise ValueError(f"codec {spec!r}: {name} takes no level")
        return cls(name, int(level) if level else None)

    @property
    def label(self) -> str:
        return self.name if self.level is None else f"{self.name}-{self.level}"

    def writer_options(self) -> dict:
        return {"compression": self.name, "compression_level": self.level}


# ---------------------------------------------------------------- reading the CSV


def _check_header(csv_path: Path) -> None:
    with csv_path.open("rb") as f:
        first = f.readline()
    if not first:
        raise DataError(f"{csv_path}: empty file (expected the header {HEADER[:30]!r}...)")
    if first.rstrip(b"\r\n") != HEADER.rstrip("\n").encode():
        names = first.decode("utf-8", "replace").rstrip("\r\n").split(",")
        where = next((i for i, (a, b) in enumerate(zip(names, COLUMNS)) if a != b), min(len(names), len(COLUMNS)))
        got = names[where] if where < len(names) else "<end of line>"
        raise DataError(f"{csv_path}: line 1: header does not match: column {where + 1} is "
                        f"{got!r}, expected {COLUMNS[where] if where < len(COLUMNS) else '<end of line>'!r} "
                        f"({len(names)} columns, expected {len(COLUMNS)})")


def _locate_bad_line(csv_path: Path) -> str:
    """The first line that breaks the format, described; only run after a failure."""
    with csv_path.open("r", encoding="utf-8", errors="replace", newline="") as f:
        next(f)
        for number, line in enumerate(f, start=2):
            fields = line.rstrip("\r\n").split(",")
            if len(fields) != len(COLUMNS):
                return f"line {number}: {len(fields)} columns, expected {len(COLUMNS)}"
            for column, text in zip(COLUMNS, fields):
                top = 9 if column == "label" else 255
                if not text.isdigit():
                    return f"line {number}, column {column!r}: {text!r} is not a non-negative integer"
                if int(text) > top:
                    return f"line {number}, column {column!r}: {text} is outside 0..{top}"
    return "no bad line found by the line scan"


def iter_csv(csv_path: Path, block_bytes: int = 16 << 20) -> Iterator[pa.RecordBatch]:
    """Yield validated blocks of a CSV split: `label` + 784 pixel columns, all uint8."""
    csv_path = Path(csv_path)
    _check_header(csv_path)
    types = {name: pa.uint8() for name in COLUMNS}
    rows = 0
    try:
        reader = pacsv.open_csv(
            csv_path,
            read_options=pacsv.ReadOptions(block_size=block_bytes, use_threads=True),
            parse_options=pacsv.ParseOptions(newlines_in_values=False),
            convert_options=pacsv.ConvertOptions(column_types=types, null_values=[],
                                                  quoted_strings_can_be_null=False),
        )
        for batch in reader:
            labels = batch.column(0).to_numpy()
            bad = np.flatnonzero(labels > 9)
            if bad.size:
                raise DataError(f"{csv_path}: line {rows + bad[0] + 2}, column 'label': "
                                f"{labels[bad[0]]} is outside 0..9")
            rows += batch.num_rows
            yield batch
    except pa.ArrowInvalid as err:
        raise DataError(f"{csv_path}: {_locate_bad_line(csv_path)} (pyarrow: {err})") from None
    if rows == 0:
        raise DataError(f"{csv_path}: no data rows after the header")


# ---------------------------------------------------------------- layouts


def wide_table(batch: pa.RecordBatch) -> pa.Table:
    return pa.Table.from_batches([batch])


def compact_table(batch: pa.RecordBatch) -> pa.Table:
    """Pixel columns interleaved into one row-major 784-byte value per image."""
    pixels = np.empty((batch.num_rows, PIXELS), np.uint8)
    for i in range(PIXELS):
        pixels[:, i] = batch.column(i + 1).to_numpy()
    images = pa.FixedSizeBinaryArray.from_buffers(IMAGE_TYPE, batch.num_rows, [None, pa.py_buffer(pixels)])
    return pa.Table.from_arrays([batch.column(0), images], names=["label", "image"])


TABLES = {"wide": wide_table, "compact": compact_table}


def _writer_options(layout: str, codec: Codec) -> dict:
    # Dictionary pages help the wide layout's sparse pixel columns (the seed's pandas default)
    # and only cost time on 784-byte images, which never repeat.
    dictionary: bool | list[str] = True if layout == "wide" else ["label"]
    return {**codec.writer_options(), "use_dictionary": dictionary}


def read_parquet_arrays(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(labels [n], images [n, 28, 28]) uint8 from either layout."""
    table = pq.read_table(path)
    labels = table.column("label").to_numpy().astype(np.uint8, copy=False)
    if "image" in table.column_names:
        images = table.column("image").combine_chunks()
        if images.type != IMAGE_TYPE:
            raise DataError(f"{path}: column 'image' is {images.type}, expected {IMAGE_TYPE}")
        flat = np.frombuffer(images.buffers()[1], np.uint8, len(images) * PIXELS, images.offset * PIXELS)
    else:
        missing = [c for c in COLUMNS if c not in table.column_names]
        if missing:
            raise DataError(f"{path}: neither an 'image' column nor the pixel columns (missing {missing[:3]}...)")
        flat = np.column_stack([table.column(c).to_numpy() for c in COLUMNS[1:]]).astype(np.uint8, copy=False)
    return labels, flat.reshape(len(labels), 28, 28)


# ---------------------------------------------------------------- the stage


class _RowGroupWriter:
    """Buffers blocks into fixed-size row groups, so output bytes do not depend on block size."""

    def __init__(self, path: Path, layout: str, codec: Codec, rows: int) -> None:
        self.layout, self.rows, self.seconds = layout, rows, 0.0
        self.pending: list[pa.Table] = []
        self.pending_rows = 0
        self.writer: pq.ParquetWriter | None = None
        self.path, self.options = path, _writer_options(layout, codec)

    def add(self, batch: pa.RecordBatch) -> None:
        start = time.perf_counter()
        self.pending.append(TABLES[self.layout](batch))
        self.pending_rows += batch.num_rows
        while self.pending_rows >= self.rows:
            self._flush(self.rows)
        self.seconds += time.perf_counter() - start

    def _flush(self, rows: int) -> None:
        table = pa.concat_tables(self.pending)
        if self.writer is None:
            self.writer = pq.ParquetWriter(self.path, table.schema, **self.options)
        self.writer.write_table(table.slice(0, rows), row_group_size=rows)
        rest = table.slice(rows)
        self.pending, self.pending_rows = ([rest] if rest.num_rows else []), rest.num_rows

    def close(self) -> None:
        start = time.perf_counter()
        if self.pending_rows:
            self._flush(self.pending_rows)
        if self.writer is not None:
            self.writer.close()
        self.seconds += time.perf_counter() - start


def convert_split(csv_path: Path, out_paths: dict[str, Path], codec: Codec, row_group_rows: int) -> dict:
    """One CSV split into each layout's Parquet file; returns the figures measured."""
    figures: dict = {"csv_bytes": Path(csv_path).stat().st_size}
    with atomic_path(out_paths["wide"]) as wide_tmp, atomic_path(out_paths["compact"]) as compact_tmp:
        writers = {layout: _RowGroupWriter(tmp, layout, codec, row_group_rows)
                   for layout, tmp in (("wide", wide_tmp), ("compact", compact_tmp))}
        start, rows = time.perf_counter(), 0
        for batch in iter_csv(csv_path):
            rows += batch.num_rows
            for writer in writers.values():
                writer.add(batch)
        for writer in writers.values():
            writer.close()
        figures["rows"] = rows
        figures["csv_parse_s"] = time.perf_counter() - start - sum(w.seconds for w in writers.values())
        for layout, writer in writers.items():
            figures[layout] = {"write_s": writer.seconds}
    for layout, path in out_paths.items():
        start = time.perf_counter()
        labels, _ = read_parquet_arrays(path)
        figures[layout].update(bytes=path.stat().st_size, read_s=time.perf_counter() - start)
    return figures


def convert_dataset(csv_dir: Path, out_dir: Path, figures_path: Path, codec_spec: str,
                    row_group_rows: int = 65536) -> dict:
    """Stage `convert@<dataset>-<codec>`: both splits, both layouts, one codec."""
    codec = Codec.parse(codec_spec)
    figures: dict = {"codec": codec.label}
    for split in SPLITS:
        paths = {layout: Path(out_dir) / layout / f"{split}.parquet" for layout in LAYOUTS}
        figures[split] = convert_split(Path(csv_dir) / f"{split}.csv", paths, codec, row_group_rows)
        sizes = ", ".join(f"{layout} {figures[split][layout]['bytes'] / 1e6:.2f} MB" for layout in LAYOUTS)
        print(f"{csv_dir}/{split}.csv -> {codec.label}: {sizes}", file=sys.stderr)
    with atomic_path(Path(figures_path)) as tmp:
        tmp.write_text(json.dumps(figures, indent=2) + "\n")
    return figures
