import json
import re

import duckdb
import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import ROOT, make_split

from pipeline.core.codec import Codec
from pipeline.core.parquet import read_parquet_arrays
from pipeline.stages.codecs import write_codecs
from pipeline.stages.convert.csvread import iter_csv
from pipeline.stages.convert.stage import convert_dataset
from pipeline.stages.csvdata import DataError, write_csv


@pytest.fixture
def csv_dir(tmp_path, tiny):
    out = tmp_path / "csv"
    write_csv(tiny.arrays["train_images"], tiny.arrays["train_labels"], out / "train.csv")
    write_csv(tiny.arrays["test_images"], tiny.arrays["test_labels"], out / "test.csv")
    return out


def test_codec_specs():
    assert Codec.parse("zstd-19") == Codec("zstd", 19)
    assert Codec.parse("snappy").label == "snappy"
    for bad, message in (
        ("zip", "unknown codec 'zip'"),
        ("zstd-x", "must be an integer"),
        ("zstd-99", "zstd levels are"),
        ("snappy-3", "snappy takes no level"),
        ("none-1", "none takes no level"),
        ("lz4-3", "lz4 takes no level"),
    ):
        with pytest.raises(ValueError, match=message):
            Codec.parse(bad)


@pytest.mark.parametrize("codec", ["none", "snappy", "gzip", "brotli", "lz4", "zstd-3"])
def test_both_layouts_round_trip(tmp_path, csv_dir, tiny, codec):
    figures = convert_dataset(csv_dir, tmp_path / "pq", tmp_path / "fig.json", codec, row_group_rows=20)
    expected_codec = {"none": "UNCOMPRESSED", "zstd-3": "ZSTD"}.get(codec, codec.upper())
    for layout in ("wide", "compact"):
        path = tmp_path / "pq" / layout / "train.parquet"
        labels, images = read_parquet_arrays(path)
        np.testing.assert_array_equal(labels, tiny.arrays["train_labels"])
        np.testing.assert_array_equal(images, tiny.arrays["train_images"])
        meta = pq.ParquetFile(path).metadata
        assert meta.num_rows == 64 and meta.num_row_groups == 4  # 20 + 20 + 20 + 4
        assert meta.row_group(0).column(1).compression == expected_codec
        assert figures["train"][layout]["bytes"] == path.stat().st_size
    assert json.loads((tmp_path / "fig.json").read_text())["codec"] == codec


def test_readable_by_pandas_polars_duckdb(tmp_path, csv_dir, tiny):
    convert_dataset(csv_dir, tmp_path / "pq", tmp_path / "fig.json", "zstd-3")
    labels, images = tiny.arrays["test_labels"], tiny.arrays["test_images"].reshape(-1, 784)
    wide, compact = tmp_path / "pq/wide/test.parquet", tmp_path / "pq/compact/test.parquet"

    frame = pd.read_parquet(wide)
    assert frame["pixel1"].dtype == np.uint8
    np.testing.assert_array_equal(frame.drop(columns="label").to_numpy(), images)
    np.testing.assert_array_equal(pl.read_parquet(wide)["label"].to_numpy(), labels)
    assert duckdb.sql(f"select sum(pixel784) from '{wide}'").fetchall()[0][0] == int(images[:, 783].sum())

    blobs = pd.read_parquet(compact)["image"]
    assert blobs.iloc[3] == images[3].tobytes()
    assert pl.read_parquet(compact)["image"][5] == images[5].tobytes()
    row = duckdb.sql(f"select label, image from '{compact}' limit 1 offset 7").fetchall()[0]
    assert row == (labels[7], images[7].tobytes())


def test_deterministic_bytes(tmp_path, csv_dir):
    convert_dataset(csv_dir, tmp_path / "a", tmp_path / "a.json", "zstd-3")
    convert_dataset(csv_dir, tmp_path / "b", tmp_path / "b.json", "zstd-3")
    for rel in ("wide/train.parquet", "compact/train.parquet", "wide/test.parquet"):
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()


def _corrupt(csv_dir, line_no, transform):
    path = csv_dir / "train.csv"
    lines = path.read_text().split("\n")
    lines[line_no - 1] = transform(lines[line_no - 1])
    path.write_text("\n".join(lines))


@pytest.mark.parametrize(
    ("line_no", "transform", "message"),
    [
        (5, lambda s: s.rsplit(",", 1)[0], r"line 5: 784 columns, expected 785"),
        (9, lambda s: s.replace(",", ",x", 1), r"line 9, column 'pixel1': 'x\d*' is not a non-negative integer"),
        (
            12,
            lambda s: s[: s.index(",") + 1] + "256" + s[s.index(",", s.index(",") + 1) :],
            r"line 12, column 'pixel1': 256 is outside 0..255",
        ),
        (40, lambda s: "12" + s[1:], r"line 40, column 'label': 12 is outside 0..9"),
        (41, lambda s: "10" + s[1:], r"line 41, column 'label': 10 is outside 0..9"),
        (1, lambda s: s.replace("pixel7,", "px7,"), r"line 1: header does not match: column 8 is 'px7'"),
        (1, lambda s: s + "\r\r", r"line 1: header does not match: column 785 is 'pixel784\\r', expected 'pixel784'"),
        (3, lambda s: s.replace(",0,", ",,", 1), r"line 3, column 'pixel\d+': '' is not a non-negative integer"),
        (7, lambda s: s.replace(",0,", ",\u00b2,", 1), r"line 7, column 'pixel\d+': '\u00b2' is not a non-negative"),
        (15, lambda s: f'"{s[0]}"{s[1:]}', r"line 15, column 'label': '\"\d\"' is not a non-negative integer"),
    ],
)
def test_malformed_csv_rejected(tmp_path, csv_dir, line_no, transform, message):
    _corrupt(csv_dir, line_no, transform)
    with pytest.raises(DataError, match=message) as err:
        convert_dataset(csv_dir, tmp_path / "pq", tmp_path / "fig.json", "snappy")
    assert "train.csv" in str(err.value)
    assert not list((tmp_path / "pq").rglob("*.parquet")) if (tmp_path / "pq").exists() else True
    assert not (tmp_path / "fig.json").exists()


def test_malformed_test_csv_leaves_no_new_parquet(tmp_path, csv_dir):
    """The train split converts fine first; a bad test.csv must still leave nothing."""
    path = csv_dir / "test.csv"
    lines = path.read_text().split("\n")
    lines[3] = "10" + lines[3][1:]
    path.write_text("\n".join(lines))
    with pytest.raises(DataError, match=r"test.csv: line 4, column 'label': 10 is outside 0..9"):
        convert_dataset(csv_dir, tmp_path / "pq", tmp_path / "fig.json", "snappy")
    assert not (tmp_path / "pq").exists() and not (tmp_path / "fig.json").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["csv"]  # no temporary left beside it either


@pytest.mark.parametrize("family", ["zstd", "gzip", "brotli"])
def test_codec_level_reaches_both_writers(tmp_path, csv_dir, family):
    """Level 1 and the highest level must give different files in both layouts (a level
    dropped on the way would write both at the default), the compact one smaller at the
    highest level (the wide layout's 64-row columns are too short for that to hold)."""
    low, high = {"zstd": (1, 19), "gzip": (1, 9), "brotli": (1, 11)}[family]
    written = {}
    for level in (low, high):
        convert_dataset(csv_dir, tmp_path / str(level), tmp_path / f"{level}.json", f"{family}-{level}")
        written[level] = {layout: (tmp_path / str(level) / layout / "train.parquet") for layout in ("wide", "compact")}
    for layout in ("wide", "compact"):
        assert written[low][layout].read_bytes() != written[high][layout].read_bytes(), layout
    assert written[high]["compact"].stat().st_size < written[low]["compact"].stat().st_size


def test_first_bad_line_is_named_when_a_block_has_two(tmp_path, csv_dir):
    """Label 12 on line 5 and a non-number on line 9 of the same block: the parser fails on
    the block, and the message names the first bad line, the label."""
    _corrupt(csv_dir, 5, lambda s: "12" + s[1:])
    _corrupt(csv_dir, 9, lambda s: s.replace(",", ",x", 1))
    with pytest.raises(DataError, match=r"train.csv: line 5, column 'label': 12 is outside 0..9"):
        convert_dataset(csv_dir, tmp_path / "pq", tmp_path / "fig.json", "snappy")


def test_undecodable_bytes_are_named_not_a_traceback(tmp_path, csv_dir):
    path = csv_dir / "train.csv"
    lines = path.read_bytes().split(b"\n")
    lines[6] = lines[6].replace(b",0,", b",\xff,", 1)
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(DataError, match="train.csv: line 7, column 'pixel\\d+': '\ufffd' is not a non-negative"):
        convert_dataset(csv_dir, tmp_path / "pq", tmp_path / "fig.json", "snappy")


def _read_all(path, **options) -> tuple[np.ndarray, np.ndarray]:
    blocks = list(iter_csv(path, **options))
    return np.concatenate([b[0] for b in blocks]), np.concatenate([b[1] for b in blocks])


def test_blocks_split_anywhere_give_the_same_rows_and_line_numbers(csv_dir, tiny):
    # A block size smaller than a line, and one cutting lines mid-way, must give the same
    # rows as one block; and an error in a late block must still name its true line.
    expected = tiny.arrays["train_images"].reshape(-1, 784)
    for block_bytes in (100, 5_000, 1 << 20):
        labels, pixels = _read_all(csv_dir / "train.csv", block_bytes=block_bytes)
        np.testing.assert_array_equal(pixels, expected)
        np.testing.assert_array_equal(labels, tiny.arrays["train_labels"])
    _corrupt(csv_dir, 60, lambda s: s.replace(",", ",7.5,", 1))
    with pytest.raises(DataError, match=r"line 60: 786 columns"):
        list(iter_csv(csv_dir / "train.csv", block_bytes=5_000))


def test_empty_file_rejected(tmp_path, csv_dir):
    (csv_dir / "test.csv").write_text("")
    with pytest.raises(DataError, match="test.csv: empty file"):
        convert_dataset(csv_dir, tmp_path / "pq", tmp_path / "fig.json", "snappy")
    (csv_dir / "test.csv").write_text((csv_dir / "train.csv").read_text().split("\n")[0] + "\n")
    with pytest.raises(DataError, match="test.csv: no data rows"):
        convert_dataset(csv_dir, tmp_path / "pq2", tmp_path / "fig.json", "snappy")
    assert not (tmp_path / "pq2" / "wide" / "test.parquet").exists()


def test_codec_table(tmp_path, csv_dir):
    import time

    for codec in ("none", "zstd-3"):
        start = time.perf_counter()
        convert_dataset(csv_dir, tmp_path / "pq" / codec, tmp_path / "fig" / "tiny" / f"{codec}.json", codec)
        elapsed = time.perf_counter() - start  # zstd-3's, the last: its read and write lie inside it
    table = write_codecs(tmp_path / "fig", ["tiny"], ["none", "zstd-3"], tmp_path / "m.json", tmp_path / "p.csv")
    entry = table["tiny"]["compact"]["zstd-3"]["train"]
    size = (tmp_path / "pq/zstd-3/compact/train.parquet").stat().st_size
    assert entry["MB"] == round(size / 1e6, 3)
    figures = json.loads((tmp_path / "fig/tiny/zstd-3.json").read_text())["train"]
    assert entry["ratio"] == pytest.approx(figures["csv_bytes"] / size, rel=0.01)
    assert figures["csv_bytes"] == (csv_dir / "train.csv").stat().st_size
    assert 0 < figures["compact"]["read_s"] < elapsed and 0 < figures["compact"]["write_s"] < elapsed
    assert json.loads((tmp_path / "m.json").read_text()) == table
    header, *rows = (tmp_path / "p.csv").read_text().splitlines()
    assert header == "codec,tiny wide,tiny compact" and [r.split(",")[0] for r in rows] == ["none", "zstd-3"]


def test_row_groups_are_exact_whatever_the_blocks():
    """Blocks smaller than, straddling and larger than a row group: every group but the last
    holds exactly `rows`, in order (so the file's bytes do not depend on the CSV reader's blocks)."""
    from pipeline.stages.convert.stage import _RowGroups

    class Recorder:  # keeps what a ParquetWriter would have written (the buffer is reused)
        def __init__(self) -> None:
            self.groups: list[tuple[np.ndarray, bytes]] = []

        def write_table(self, table, row_group_size: int) -> None:
            assert row_group_size == 10
            images = b"".join(v.as_py() for v in table.column("image"))
            self.groups.append((table.column("label").to_numpy().copy(), images))

    labels = (np.arange(43) % 10).astype(np.uint8)
    pixels = (np.arange(43 * 784) % 251).astype(np.uint8).reshape(43, 784)
    recorder = Recorder()
    groups = _RowGroups(recorder, 10)
    start = 0
    for size in (7, 7, 25, 1, 3):
        groups.add(labels[start : start + size], pixels[start : start + size])
        start += size
    groups.flush()
    assert [len(group_labels) for group_labels, _ in recorder.groups] == [10, 10, 10, 10, 3]
    np.testing.assert_array_equal(np.concatenate([g for g, _ in recorder.groups]), labels)
    assert b"".join(images for _, images in recorder.groups) == pixels.tobytes()


def test_unreadable_parquet_says_why(tmp_path):
    """The reader's own reason (first line), not just the exception's type."""
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all" * 10)
    with pytest.raises(DataError, match=r"junk\.parquet: .*Parquet magic bytes not found"):
        read_parquet_arrays(tmp_path / "junk.parquet")


def test_wide_parquet_without_its_pixel_columns(tmp_path):
    import pyarrow as pa

    pq.write_table(
        pa.table({"label": pa.array([1], pa.uint8()), "pixel1": pa.array([0], pa.uint8())}), tmp_path / "w.parquet"
    )
    with pytest.raises(
        DataError,
        match=r"w\.parquet: neither an 'image' column nor the pixel columns "
        r"\(missing \['pixel2', 'pixel3', 'pixel4'\]\.\.\.\)",
    ):
        read_parquet_arrays(tmp_path / "w.parquet")


def test_parquet_reader_refuses_other_types_and_nulls(tmp_path):
    """read_parquet_arrays reads what convert writes; a foreign file with int64 pixels (300
    would wrap to 44) or a null pixel or image (read as 0) is refused, file and column named."""
    from pipeline.core.dataset import COLUMNS
    from pipeline.core.parquet import IMAGE_TYPE

    wide = {name: pa.array([1, 2], pa.uint8()) for name in COLUMNS}
    cases = {
        "int64": ({**wide, "pixel9": pa.array([300, 2], pa.int64())}, r"column 'pixel9' is int64, expected uint8"),
        "null": ({**wide, "pixel9": pa.array([None, 2], pa.uint8())}, r"column 'pixel9' has 1 empty \(null\) values"),
        "null label": (
            {**wide, "label": pa.array([1, None], pa.uint8())},
            r"column 'label' has 1 empty \(null\) values",
        ),
        "null image": (
            {"label": pa.array([1, 2], pa.uint8()), "image": pa.array([bytes(784), None], IMAGE_TYPE)},
            r"column 'image' has 1 empty \(null\) values",
        ),
    }
    for name, (columns, message) in cases.items():
        path = tmp_path / f"{name}.parquet"
        pq.write_table(pa.table(columns), path)
        with pytest.raises(DataError, match=rf"^{path}: {message}$"):
            read_parquet_arrays(path)
    pq.write_table(pa.table(wide), tmp_path / "ok.parquet")
    labels, images = read_parquet_arrays(tmp_path / "ok.parquet")
    assert labels.tolist() == [1, 2] and images.shape == (2, 28, 28) and images.dtype == np.uint8


def test_rows_counted_across_csv_blocks_and_figures_consistent(tmp_path, csv_dir, tiny, monkeypatch, capsys):
    """Small CSV blocks (so the row count adds up several), and the figures a stage records:
    rows per split, write/read seconds inside the call's own wall time, the stderr line."""
    import functools
    import time

    import pipeline.stages.convert.stage as convert

    monkeypatch.setattr(convert, "iter_csv", functools.partial(convert.iter_csv, block_bytes=8192))
    start = time.perf_counter()
    figures = convert_dataset(csv_dir, tmp_path / "pq", tmp_path / "f.json", "snappy", row_group_rows=16)
    elapsed = time.perf_counter() - start
    assert figures["train"]["rows"] == 64 and figures["test"]["rows"] == 32
    for split in ("train", "test"):
        for layout in ("compact", "wide"):
            assert 0 < figures[split][layout]["write_s"] < elapsed and 0 < figures[split][layout]["read_s"] < elapsed
    err = capsys.readouterr().err
    for split in ("train", "test"):
        mb = {layout: f"{figures[split][layout]['bytes'] / 1e6:.2f}" for layout in ("compact", "wide")}
        assert f"{split}.csv -> snappy: wide {mb['wide']} MB, compact {mb['compact']} MB\n" in err


def test_compact_layout_dictionary_encodes_the_label_only(tmp_path, csv_dir):
    """Ten label values compress to almost nothing as a dictionary; 784-byte images would
    only grow one (every image differs)."""
    convert_dataset(csv_dir, tmp_path / "pq", tmp_path / "f.json", "none")
    group = pq.ParquetFile(tmp_path / "pq" / "compact" / "train.parquet").metadata.row_group(0)
    assert "RLE_DICTIONARY" in group.column(0).encodings
    assert "RLE_DICTIONARY" not in group.column(1).encodings and "PLAIN" in group.column(1).encodings


def test_polars_reason_is_quoted_after_our_own(tmp_path):
    """Our message names the line and column; polars' first line of reason follows it."""
    images, labels = make_split(5, 1)
    write_csv(images, labels, tmp_path / "t.csv")
    lines = (tmp_path / "t.csv").read_text().splitlines()
    lines[3] = lines[3].replace(",", ",x", 1)
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(
        DataError,
        match=r"t\.csv: line 4, column 'pixel1': 'x\d+' is not a non-negative integer "
        r"\(polars: could not parse `x\d+` as dtype `u8` at column 'pixel1' "
        r"\(column number 2\)\)$",
    ):
        list(iter_csv(tmp_path / "t.csv"))


@pytest.mark.parametrize(
    "header, message",
    [
        (lambda h: b",".join(h.split(b",")[:700]), r"column 701 is '<end of line>', expected 'pixel700' \(700 columns"),
        (lambda h: h + b",extra", r"column 786 is 'extra', expected '<end of line>' \(786 columns, expected 785\)"),
        (
            lambda h: h.replace(b"pixel7,", b"pixel\xff7,"),
            r"column 8 is 'pixel\ufffd7', expected 'pixel7' \(785 columns",
        ),
    ],
)
def test_header_short_long_or_undecodable(tmp_path, header, message):
    images, labels = make_split(3, 2)
    write_csv(images, labels, tmp_path / "t.csv")
    first, rest = (tmp_path / "t.csv").read_bytes().split(b"\n", 1)
    (tmp_path / "t.csv").write_bytes(header(first) + b"\n" + rest)
    with pytest.raises(DataError, match=rf"t\.csv: line 1: header does not match: {message}"):
        list(iter_csv(tmp_path / "t.csv"))


def test_ctrl_c_stops_the_conversion_at_once():
    """The conversion runs in a worker thread while the stage's thread waits in slices:
    SIGINT (Ctrl-C) raises KeyboardInterrupt within a fraction of a second, not when a long
    call returns (pyarrow's writer, on the main thread, swallowed it: a zstd-19 convert of
    MNIST ran on to the end); an error in the work reaches the caller as it is."""
    import os
    import signal
    import threading
    import time

    from pipeline.stages.convert.stage import interruptible

    started = threading.Event()  # Ctrl-C once the work runs: never before the stage's thread waits for it

    def work() -> None:
        started.set()
        time.sleep(10)  # a long call that releases the GIL, as pyarrow's does

    threading.Thread(target=lambda: started.wait(60) and os.kill(os.getpid(), signal.SIGINT), daemon=True).start()
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        interruptible(work)
    assert time.monotonic() - start < 2
    with pytest.raises(ValueError, match="from the worker"):
        interruptible(lambda: (_ for _ in ()).throw(ValueError("from the worker")))


def test_rows_at_the_length_bounds_are_read_and_one_byte_more_is_refused(tmp_path):
    """The longest row a CSV can hold (three digits a field: 3,139 bytes, then CRLF) and the
    shortest (single digits: 1,569 bytes) are read as the values they spell; a line one byte
    longer is refused by file, line and length before any parser sees it."""
    from pipeline.core.dataset import CSV_HEADER, CSV_ROW_MAX, CSV_ROW_MIN

    longest, shortest = "007" + ",255" * 784, "3" + ",0" * 784
    assert (len(longest), len(shortest)) == (CSV_ROW_MAX, CSV_ROW_MIN)
    path = tmp_path / "edge.csv"
    path.write_bytes(f"{CSV_HEADER}\r\n{longest}\r\n{shortest}\r\n".encode())
    labels, pixels = _read_all(path)
    assert labels.tolist() == [7, 3] and (pixels[0] == 255).all() and (pixels[1] == 0).all()
    path.write_bytes(f"{CSV_HEADER}\n{shortest}\n0{longest}\r\n".encode())
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}: line 3: 3,141 bytes, longer than any row can be"):
        _read_all(path)


@pytest.mark.parametrize(
    ("line", "short", "message"),
    [
        (2, ",5,1", r"line 2: 3 columns, expected 785"),  # the block's first line
        (4, "5,1,2", r"line 4: 3 columns, expected 785"),  # a line after others in the block
    ],
)
def test_a_line_too_short_for_a_row_is_named_wherever_it_is_in_its_block(tmp_path, csv_dir, line, short, message):
    """A line shorter than any row is refused before parsing, named by its own number and
    column count whether it opens its block or follows other lines."""
    lines = (csv_dir / "train.csv").read_text().split("\n")
    lines[line - 1] = short
    path = tmp_path / "short.csv"
    path.write_text("\n".join(lines))
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}: {message}$"):
        _read_all(path)


def test_rows_are_counted_across_blocks_against_the_splits_count(csv_dir, tiny):
    """Blocks of a couple of rows each: the split's row count adds up over all of them, and
    one row more than `rows` allows is named by its line."""
    path = csv_dir / "train.csv"
    labels, _ = _read_all(path, block_bytes=4096, rows=64)
    np.testing.assert_array_equal(labels, tiny.arrays["train_labels"])
    with pytest.raises(
        DataError, match=rf"^{re.escape(str(path))}: more than 63 data rows \(line 65 is one too many\)"
    ):
        _read_all(path, block_bytes=4096, rows=63)
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}: 64 data rows, but the data set's split has 65"):
        _read_all(path, block_bytes=4096, rows=65)


@pytest.mark.parametrize("layout", ["wide", "compact"])
def test_the_read_back_by_row_group_gives_the_whole_files_values(tmp_path, layout):
    """`iter_parquet_arrays`: row group after row group, the very rows `read_parquet_arrays`
    reads whole, in order; a damaged group is one line naming the file."""
    from pipeline.core.parquet import iter_parquet_arrays
    from pipeline.stages.convert.stage import write_compact, write_wide

    images, labels = make_split(1000, 3)
    write_csv(images, labels, tmp_path / "train.csv")
    path = tmp_path / f"{layout}.parquet"
    (write_wide if layout == "wide" else write_compact)(tmp_path / "train.csv", path, Codec.parse("snappy"), 300)
    assert pq.ParquetFile(path).num_row_groups == 4
    groups = list(iter_parquet_arrays(path))
    assert [len(g[0]) for g in groups] == [300, 300, 300, 100]
    whole_labels, whole_images = read_parquet_arrays(path)
    assert np.array_equal(np.concatenate([g[0] for g in groups]), whole_labels)
    assert np.array_equal(np.concatenate([g[1] for g in groups]), whole_images)
    assert np.array_equal(whole_images.reshape(len(labels), -1), images.reshape(len(labels), -1))
    assert np.array_equal(whole_labels, labels)
    data = bytearray(path.read_bytes())
    middle = pq.ParquetFile(path).metadata.row_group(2).column(0).file_offset
    data[middle - 40 : middle] = b"\xff" * 40
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match=re.escape(str(path))):
        list(iter_parquet_arrays(path))


@pytest.mark.slow
def test_the_convert_stages_read_back_holds_a_row_group_not_the_file(tmp_path):
    """The stage's read-back of a split many row groups long: its peak memory grows by about
    a row group's arrays, not by the split's (which would be the whole file decoded)."""
    import subprocess
    import sys

    from pipeline.stages.convert.stage import write_wide

    write_csv(*make_split(40_000, 5), tmp_path / "train.csv")
    write_wide(tmp_path / "train.csv", tmp_path / "wide.parquet", Codec.parse("none"), 2000)
    whole_mb = 40_000 * 785 / 1e6
    script = (
        "import resource, sys\nfrom pathlib import Path\nfrom pipeline.stages.convert.stage import measure_reads\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "figures = {'rows': 40000, 'wide': {}}\n"
        "measure_reads({'wide': Path(sys.argv[1])}, figures)\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1e3, figures['wide']['read_s'])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "wide.parquet")],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout.split()
    grown_mb, read_s = float(out[0]), float(out[1])
    assert read_s > 0 and grown_mb < whole_mb / 2, (grown_mb, whole_mb)
