"""The streaming shard writer: the same bytes as the in-memory one, in bounded memory."""

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import make_split, write_shards

from pipeline.core.parquet import compact_table
from pipeline.shards import ShardError, ShardWriter, merge_parts, read_split, write_part
from pipeline.stages.convert.stage import convert_dataset
from pipeline.stages.csvdata import write_csv
from pipeline.stages.mnist import MNIST
from pipeline.stages.shard.settings import ShardSettings
from pipeline.stages.shard.stage import shard_dataset

ROOT = Path(__file__).resolve().parents[1]


def files(folder: Path) -> dict[str, str]:
    """Every file's digest, but the stage's ownership marker (a stage's output folder has one)."""
    from pipeline.core.atomic import MARKER

    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MARKER
    }


@pytest.mark.parametrize("layout, compression", [("compact", "none"), ("wide", "zstd"), ("compact", "zstd")])
def test_streamed_stage_writes_the_bytes_of_the_whole_split_in_memory(tmp_path, tiny, layout, compression):
    """Fed 10-row record batches (Parquet row groups of 10) into 24-sample shards, the stage
    writes what the writer fed the whole split at once writes, digests included (the IDX
    ones equal to the sha256 of the files the tiny data set publishes)."""
    for split in ("train", "test"):
        write_csv(tiny.arrays[f"{split}_images"], tiny.arrays[f"{split}_labels"], tmp_path / "csv" / f"{split}.csv")
    convert_dataset(tmp_path / "csv", tmp_path / "pq", tmp_path / "f.json", "zstd-3", row_group_rows=10)
    shard_dataset(tmp_path / "pq" / layout, tmp_path / "streamed", "tiny", ShardSettings(24, compression, 5))
    for split in ("train", "test"):
        labels, images = tiny.arrays[f"{split}_labels"], tiny.arrays[f"{split}_images"]
        digest = hashlib.sha256(labels.tobytes() + images.tobytes()).hexdigest()
        write_shards(
            images,
            labels,
            tmp_path / "whole" / split,
            dataset="tiny",
            split=split,
            samples_per_shard=24,
            compression=compression,
            level=5,
            source={
                "content_sha256": digest,
                "idx_sha256": {  # the published files' digests
                    "images": tiny.files[f"{split}_images"]["sha256"],
                    "labels": tiny.files[f"{split}_labels"]["sha256"],
                },
            },
        )
    assert files(tmp_path / "streamed") == files(tmp_path / "whole")
    assert len(files(tmp_path / "streamed" / "train")) == 1 + -(-len(tiny.arrays["train_labels"]) // 24)
    images = read_split(tmp_path / "streamed" / "train")["images"]
    np.testing.assert_array_equal(images.numpy(), tiny.arrays["train_images"])


@pytest.mark.parametrize("batch_rows", [1, 7, 24, 25, 1000])
def test_shard_bytes_do_not_depend_on_how_the_input_arrives(tmp_path, batch_rows):
    """Batches smaller, equal to and larger than a shard, and ones that straddle shard ends."""
    images, labels = make_split(100, 5)
    whole = write_shards(images, labels, tmp_path / "whole", dataset="d", split="train", samples_per_shard=24)
    writer = ShardWriter(tmp_path / "fed", sample=MNIST, dataset="d", split="train", samples_per_shard=24)
    for start in range(0, 100, batch_rows):  # int64 labels (numpy's default): converted, whatever the batch
        writer.add(
            {
                "labels": labels[start : start + batch_rows].astype(np.int64),
                "images": images[start : start + batch_rows],
            }
        )
    assert writer.finish() == whole
    assert files(tmp_path / "fed") == files(tmp_path / "whole")
    assert [s["count"] for s in whole["shards"]] == [24, 24, 24, 24, 4]


def test_writer_refuses_label_ten(tmp_path):
    images, labels = make_split(30, 1)
    labels[17] = 10
    with pytest.raises(
        ShardError, match="^d/train: field 'labels': value 10 at sample 17 is outside 0..9$"
    ):  # no origin given: data set/split
        write_shards(images, labels, tmp_path / "s", dataset="d", split="train", samples_per_shard=8)
    assert not (tmp_path / "s").exists()


@pytest.mark.slow
def test_memory_is_bounded_by_one_shard(tmp_path):
    """A 40,000-sample split (31 MB of pixels) through 2,000-sample shards (1.6 MB): the
    writer's peak (numpy via tracemalloc, plus Arrow's pool) stays near one shard and a
    few row groups, far below the split."""
    n, rows = 40_000, 1_000
    images, labels = make_split(n, 3)
    path = tmp_path / "big" / "compact" / "train.parquet"
    path.parent.mkdir(parents=True)
    with pq.ParquetWriter(path, compact_table(labels[:1], images[:1].reshape(1, -1)).schema, compression="zstd") as w:
        for start in range(0, n, rows):
            w.write_table(compact_table(labels[start : start + rows], images[start : start + rows].reshape(-1, 784)))
    del images
    code = f"""
import tracemalloc, pyarrow as pa
from pathlib import Path
from pipeline.stages.shard.settings import ShardSettings
from pipeline.stages.shard.stage import stream_split
run = lambda out: stream_split(Path({str(path)!r}), Path(out), dataset='big', split='train',
                               layout=ShardSettings(2000), batch_rows=1000)
run({str(tmp_path / "warm")!r})  # the first call's lazy imports are not the writer's memory
tracemalloc.start()
run({str(tmp_path / "out")!r})
print(tracemalloc.get_traced_memory()[1], pa.default_memory_pool().max_memory())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    numpy_peak, arrow_peak = map(int, out.split())
    split_bytes = n * 785
    assert numpy_peak + arrow_peak < split_bytes / 4, (numpy_peak, arrow_peak, split_bytes)
    loaded = read_split(tmp_path / "out")["images"]
    assert len(loaded) == n


@pytest.mark.parametrize("layout", ["compact", "wide"])
def test_parquet_column_order_and_extra_columns_do_not_matter(tmp_path, layout):
    """Columns are read by name: a file written by another tool, with its columns in another
    order and one more, gives the same shards (label first would be a guess)."""
    from pipeline.core.dataset import COLUMNS
    from pipeline.stages.shard.stage import stream_split

    images, labels = make_split(40, 3)
    if layout == "compact":
        table = compact_table(labels, images.reshape(40, 784))
    else:
        pixels = images.reshape(40, 784)
        table = pa.table(
            {name: pa.array(pixels[:, i - 1] if i else labels, pa.uint8()) for i, name in enumerate(COLUMNS)}
        )
    names = ["note", *reversed(table.column_names)]
    table = table.append_column("note", pa.array(["x"] * 40)).select(names)
    pq.write_table(table, tmp_path / "foreign.parquet")
    manifest = stream_split(
        tmp_path / "foreign.parquet", tmp_path / "s", dataset="d", split="train", layout=ShardSettings(16)
    )
    got = read_split(tmp_path / "s")
    got_images, got_labels = got["images"], got["labels"]
    np.testing.assert_array_equal(got_labels.numpy(), labels)
    np.testing.assert_array_equal(got_images.numpy(), images)
    digest = hashlib.sha256(labels.tobytes() + images.reshape(40, 784).tobytes()).hexdigest()
    from pipeline.stages.mnist import idx_bytes

    assert manifest["source"] == {
        "content_sha256": digest,
        "idx_sha256": {
            "images": hashlib.sha256(idx_bytes(images)).hexdigest(),
            "labels": hashlib.sha256(idx_bytes(labels)).hexdigest(),
        },
    }


def test_stream_split_passes_the_zstd_level_on_and_names_its_source(tmp_path):
    from pipeline.stages.shard.stage import stream_split

    images, labels = make_split(300, 4)
    pq.write_table(compact_table(labels, images.reshape(300, 784)), tmp_path / "train.parquet")
    default = stream_split(
        tmp_path / "train.parquet",
        tmp_path / "default",
        dataset="d",
        split="train",
        layout=ShardSettings(300, "zstd"),
    )
    assert default["compression"] == {"codec": "zstd", "level": 3}
    sizes = {}
    for level in (1, 19):
        manifest = stream_split(
            tmp_path / "train.parquet",
            tmp_path / f"z{level}",
            dataset="d",
            split="train",
            layout=ShardSettings(300, "zstd", level),
        )
        assert manifest["compression"] == {"codec": "zstd", "level": level}
        sizes[level] = manifest["shards"][0]["bytes"]
    assert sizes[19] < sizes[1]  # the level reached the compressor, not only the manifest
    labels[7] = 10
    pq.write_table(compact_table(labels, images.reshape(300, 784)), tmp_path / "bad.parquet")
    with pytest.raises(
        ShardError, match=rf"^{tmp_path / 'bad.parquet'}: field 'labels': value 10 at sample 7 is outside 0\.\.9$"
    ):
        stream_split(tmp_path / "bad.parquet", tmp_path / "bad", dataset="d", split="train", layout=ShardSettings(300))


def test_writer_edges_one_sample_shards_nested_folder_default_level(tmp_path):
    images, labels = make_split(3, 2)
    manifest = write_shards(images, labels, tmp_path / "a" / "b" / "c", dataset="d", split="train", samples_per_shard=1)
    assert [s["count"] for s in manifest["shards"]] == [1, 1, 1]
    np.testing.assert_array_equal(read_split(tmp_path / "a" / "b" / "c")["labels"].numpy(), labels)
    with pytest.raises(ValueError, match="samples_per_shard"):
        write_shards(images, labels, tmp_path / "zero", dataset="d", split="train", samples_per_shard=0)
    zstd = write_shards(
        images, labels, tmp_path / "z", dataset="d", split="train", samples_per_shard=3, compression="zstd"
    )
    assert zstd["compression"] == {"codec": "zstd", "level": 3}


def test_stream_split_of_an_empty_or_one_row_parquet(tmp_path):
    from pipeline.core.errors import DataError
    from pipeline.stages.shard.stage import stream_split

    images, labels = make_split(1, 6)
    pq.write_table(compact_table(labels, images.reshape(1, 784)), tmp_path / "one.parquet")
    assert (
        stream_split(tmp_path / "one.parquet", tmp_path / "one", dataset="d", split="test", layout=ShardSettings(4))[
            "count"
        ]
        == 1
    )
    pq.write_table(compact_table(labels[:0], images[:0].reshape(0, 784)), tmp_path / "empty.parquet")
    with pytest.raises(DataError, match=rf"^{tmp_path / 'empty.parquet'}: no samples$"):
        stream_split(tmp_path / "empty.parquet", tmp_path / "empty", dataset="d", split="test", layout=ShardSettings(4))


def _wide(labels: pa.Array, pixels: np.ndarray, **override: pa.Array) -> pa.Table:
    from pipeline.core.dataset import COLUMNS

    columns = {name: pa.array(pixels[:, i - 1], pa.uint8()) for i, name in enumerate(COLUMNS) if i}
    return pa.table({"label": labels, **columns, **override})


@pytest.mark.parametrize(
    "name, table, message",
    [
        (
            "int64 pixel",
            lambda labels, p: _wide(pa.array(labels, pa.uint8()), p, pixel1=pa.array([300] + [0] * 9, pa.int64())),
            r"column 'pixel1' is int64, expected uint8",
        ),
        (
            "float label",
            lambda labels, p: _wide(pa.array(labels, pa.float64()), p),
            r"column 'label' is double, expected uint8",
        ),
        (
            "int64 label",
            lambda labels, p: compact_table(labels, p).set_column(0, "label", pa.array(labels.astype(np.int64) + 256)),
            r"column 'label' is int64, expected uint8",
        ),
        (
            "null label",
            lambda labels, p: _wide(pa.array([None] + list(labels[1:]), pa.uint8()), p),
            r"column 'label' has 1 empty \(null\) values",
        ),
        (
            "null pixel",
            lambda labels, p: _wide(
                pa.array(labels, pa.uint8()), p, pixel784=pa.array([1, None, None] + [0] * 7, pa.uint8())
            ),
            r"column 'pixel784' has 2 empty \(null\) values",
        ),
        (
            "null image",
            lambda labels, p: compact_table(labels, p).set_column(
                1, "image", pa.array([None] + [bytes(784)] * 9, compact_table(labels, p).schema.field("image").type)
            ),
            r"column 'image' has 1 empty \(null\) values",
        ),
    ],
)
def test_parquet_of_other_types_or_with_nulls_is_refused(tmp_path, name, table, message):
    """A file not written by convert: wider types would wrap (300 -> 44) and a null would read
    as 0, both silently; the writer refuses them, naming the column."""
    from pipeline.core.errors import DataError
    from pipeline.stages.shard.stage import stream_split

    images, labels = make_split(10, 8)
    pq.write_table(table(labels, images.reshape(10, 784)), tmp_path / "odd.parquet")
    with pytest.raises(DataError, match=rf"^{tmp_path / 'odd.parquet'}: {message}$"):
        stream_split(tmp_path / "odd.parquet", tmp_path / "out", dataset="d", split="train", layout=ShardSettings(4))
    assert not (tmp_path / "out" / "manifest.json").exists()  # a folder without one is not a split


def test_compact_batches_that_start_inside_a_row_group(tmp_path):
    """Batches smaller than a row group: each comes out whole, in file order, of the size
    asked for (pyarrow 26 decodes each into its own buffer; the reader still honours an
    array's offset, should a version hand out slices)."""
    from pipeline.stages.shard.source import iter_samples

    images, labels = make_split(50, 9)
    pq.write_table(compact_table(labels, images.reshape(50, 784)), tmp_path / "t.parquet", row_group_size=50)
    batches = list(iter_samples(tmp_path / "t.parquet", batch_rows=7))
    assert [len(b[0]) for b in batches] == [7] * 7 + [1]
    np.testing.assert_array_equal(np.concatenate([b[1] for b in batches]), images.reshape(50, 784))
    np.testing.assert_array_equal(np.concatenate([b[0] for b in batches]), labels)


def test_write_shards_takes_labels_of_any_integer_type(tmp_path):
    """Labels from a list or an int64 array (what torch/numpy hand out by default) give the
    same bytes as uint8 ones: they are converted, not written at their own width."""
    images, labels = make_split(30, 5)
    for name, given in (("uint8", labels), ("int64", labels.astype(np.int64)), ("list", labels.tolist())):
        write_shards(images, given, tmp_path / name, dataset="d", split="train", samples_per_shard=12)
    assert files(tmp_path / "int64") == files(tmp_path / "uint8") == files(tmp_path / "list")


def test_safetensors_parts_are_what_safetensors_writes():
    """The writer serialises without the library's copies; the library is the judge of the
    bytes: every dtype the format declares, against each other (layout order), several names,
    shapes and an empty column."""
    from safetensors.numpy import save

    from pipeline.shards.format import DTYPES
    from pipeline.shards.writer import safetensors_parts

    rng = np.random.default_rng(0)
    dtypes = sorted(DTYPES)
    cases = [{"a": np.zeros((3, 2), a), "b": np.ones(3, b)} for a in dtypes for b in dtypes]
    cases += [
        {
            name: rng.integers(0, 2, (n, *shape)).astype(dtype)
            for name, dtype, shape in zip(
                rng.choice(["x", "images", "labels", "ids", "Z9", "_w"], k, replace=False),
                rng.choice(dtypes, k),
                [(), (28, 28), (3, 4, 5), (1,), (2, 2)][:k],
            )
        }
        for n in (0, 1, 17)
        for k in (1, 3, 5)
    ]
    for columns in cases:
        assert b"".join(safetensors_parts(columns)) == save(columns), {k: v.dtype for k, v in columns.items()}


# ---- Parallel writers: parts merged into one split ---------------------------------------


def _parts(folder: Path, images, labels, cuts: list[int], per_shard: int, **options) -> None:
    """Write samples cuts[i]..cuts[i+1] as one part each (in reverse order: no writer waits
    for another)."""
    options.setdefault("total", len(images))
    for a, b in reversed(list(zip(cuts, cuts[1:]))):
        write_part(
            {"images": images[a:b], "labels": labels[a:b]},
            folder,
            first_sample=a,
            sample=MNIST,
            dataset="d",
            split="train",
            samples_per_shard=per_shard,
            **options,
        )


def test_one_sample_shards_are_numbered_from_zero(tmp_path):
    """A shard's number is its first sample over the shard size, for a whole split and a
    part alike, whatever that size (one included)."""
    images, labels = make_split(3, 7)
    whole = write_shards(images, labels, tmp_path / "whole", dataset="d", split="train", samples_per_shard=1)
    assert [e["file"] for e in whole["shards"]] == [f"shard-0000{i}.safetensors" for i in range(3)]
    _parts(tmp_path / "parts", images, labels, [0, 2, 3], 1)
    assert merge_parts(tmp_path / "parts")["shards"] == whole["shards"]


@pytest.mark.parametrize("compression", ["none", "zstd"])
@pytest.mark.parametrize("cuts", [[0, 100], [0, 24, 48, 100], [0, 72, 96, 100]])
def test_parts_merge_into_the_bytes_one_writer_writes(tmp_path, compression, cuts):
    images, labels = make_split(100, 7)
    whole = write_shards(
        images, labels, tmp_path / "whole", dataset="d", split="train", samples_per_shard=24, compression=compression
    )
    _parts(tmp_path / "parts", images, labels, cuts, 24, compression=compression)
    assert not (tmp_path / "parts" / "manifest.json").exists()  # not a split until merged
    assert merge_parts(tmp_path / "parts") == whole
    assert files(tmp_path / "parts") == files(tmp_path / "whole")  # the part records are gone
    np.testing.assert_array_equal(read_split(tmp_path / "parts")["images"].numpy(), images)


def test_a_writer_given_first_sample_numbers_its_shards_by_their_place(tmp_path):
    images, labels = make_split(30, 2)
    writer = ShardWriter(
        tmp_path / "s", sample=MNIST, dataset="d", split="train", samples_per_shard=10, first_sample=20
    )
    writer.add({"images": images[20:], "labels": labels[20:]})
    writer.finish()
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == [".parts", "shard-00002.safetensors"]
    for first in (5, -10, 1.0):
        with pytest.raises(ValueError, match=r"first_sample must be a multiple of samples_per_shard \(10\)"):
            ShardWriter(
                tmp_path / "t", sample=MNIST, dataset="d", split="train", samples_per_shard=10, first_sample=first
            )


@pytest.mark.parametrize(
    ("pieces", "message"),
    [
        (
            [(0, 20), (24, 100)],
            r"000000000000\.json: 20 samples is not a whole number of shards of 24 \(only the last part",
        ),
        (
            [(0, 24), (48, 100)],
            r"000000000048\.json: starts at sample 48, expected 24 \(a part missing or overlapping\)$",
        ),
        ([(24, 100)], r"000000000024\.json: starts at sample 24, expected 0 \(a part missing or overlapping\)$"),
        (
            [(0, 48), (24, 100)],
            r"000000000024\.json: starts at sample 24, expected 48 \(a part missing or overlapping\)$",
        ),
    ],
)
def test_parts_that_do_not_tile_the_split_are_refused(tmp_path, pieces, message):
    images, labels = make_split(100, 7)
    folder = tmp_path / "parts"
    for a, b in pieces:
        _parts(folder, images, labels, [a, b], 24)
    with pytest.raises(ShardError, match=message):
        merge_parts(folder)
    assert not (folder / "manifest.json").exists() and len(list((folder / ".parts").glob("*.json"))) == len(pieces)


@pytest.mark.parametrize(
    "key, second",
    [
        ("dataset", {"dataset": "e"}),
        ("fields", {"sample": "wide labels"}),
        ("compression", {"compression": "zstd"}),
        ("compression", {"compression": "zstd", "level": 9}),
        ("samples_per_shard", {"samples_per_shard": 12}),
    ],
)
def test_a_part_that_differs_in_any_setting_is_named(tmp_path, key, second):
    """Every setting a merged split records must agree across its parts: the first part that
    differs is named with the setting, and no manifest is written."""
    from pipeline.shards.format import Field, Sample

    images, labels = make_split(48, 7)
    folder = tmp_path / "parts"
    first = {"compression": "zstd"} if "level" in second else {}
    _parts(folder, images, labels, [0, 24], 24, **first)
    options = {"sample": MNIST, "dataset": "d", "split": "train", "samples_per_shard": 24, **first, **second}
    if options["sample"] == "wide labels":
        options["sample"] = Sample((MNIST.fields[0], Field(MNIST.fields[1].name, "int64", MNIST.fields[1].shape)))
    write_part({"images": images[24:], "labels": labels[24:]}, folder, first_sample=24, **options)
    with pytest.raises(ShardError, match=rf"000000000024\.json: {key} .* differs from the first part's"):
        merge_parts(folder)
    assert not (folder / "manifest.json").exists()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda part: [part], r"not a part record \(JSON list, not an object\)"),
        (lambda part: {k: v for k, v in part.items() if k != "count"}, r"\(keys\): missing \['count'\]"),
        (lambda part: {**part, "count": "24"}, r"count: expected an integer, got '24'"),
        (lambda part: {**part, "samples_per_shard": 0}, r"samples_per_shard: 0, expected an integer of at least 1"),
        (lambda part: {**part, "first_sample": 0.0}, r"first_sample: 0.0, expected an integer of at least 0"),
        (
            lambda part: {k: v for k, v in part.items() if k != "first_sample"},
            r"first_sample: None, expected an integer",
        ),
        (lambda part: {**part, "compression": "none"}, r"compression: expected an object, got 'none'"),
        (lambda part: {**part, "shards": "abc"}, r"shards: expected a list, got 'abc'"),
        (
            lambda part: {**part, "block_bytes": part["block_bytes"] * 2},
            r"block_bytes 32768 differs from the first part's 16384",
        ),
        (
            lambda part: {**part, "shards": [{**part["shards"][0], "file": "shard-00002.safetensors"}]},
            r"shards\[0\]\.file: 'shard-00002.safetensors' where 'shard-00001.safetensors' belongs",
        ),
    ],
)
def test_a_part_record_of_the_wrong_shape_is_named_before_it_is_used(tmp_path, edit, message):
    """Part records are files in the user's folder: each is checked as a manifest before any
    value in it is used, so a damaged one is one ShardError naming it and the key."""
    images, labels = make_split(48, 7)
    folder = tmp_path / "parts"
    _parts(folder, images, labels, [0, 24, 48], 24)
    record = folder / ".parts" / "000000000024.json"
    record.write_text(json.dumps(edit(json.loads(record.read_text()))))
    with pytest.raises(ShardError, match=rf"000000000024\.json: {message}"):
        merge_parts(folder)
    assert not (folder / "manifest.json").exists() and len(list((folder / ".parts").glob("*.json"))) == 2


def test_parts_whose_records_swap_their_shards_are_refused(tmp_path):
    """Every shard hashes right when two records swap their shard lists, but the split's
    samples would come out of order: the files must be the ones each part's place numbers."""
    images, labels = make_split(48, 7)
    folder = tmp_path / "parts"
    _parts(folder, images, labels, [0, 24, 48], 24)
    first, second = sorted((folder / ".parts").glob("*.json"))
    a, b = json.loads(first.read_text()), json.loads(second.read_text())
    a["shards"], b["shards"] = b["shards"], a["shards"]
    first.write_text(json.dumps(a))
    second.write_text(json.dumps(b))
    with pytest.raises(
        ShardError,
        match=r"000000000000\.json: shards\[0\]\.file: 'shard-00001.safetensors' where "
        r"'shard-00000.safetensors' belongs",
    ):
        merge_parts(folder)
    assert not (folder / "manifest.json").exists()


@pytest.mark.parametrize(
    ("record_name", "counts", "message"),
    [
        ("000000000000.json", [13, 11], r"shard-00000.safetensors holds 13 samples, not 12"),
        ("000000000000.json", [11, 13], r"shard-00000.safetensors holds 11 samples, not 12"),
        ("000000000024.json", [11, 13], r"shard-00002.safetensors holds 11 samples, not 12"),
        ("000000000024.json", [12, 13], r"shard-00003.safetensors holds 13 samples, not 12"),  # the last: not more
    ],
)
def test_every_shard_but_the_splits_last_holds_samples_per_shard(tmp_path, record_name, counts, message):
    """A record whose shard counts add up to its count, but whose shards are not of its shard
    size, is refused at the merge, not left for a reader to find."""
    images, labels = make_split(47, 7)
    folder = tmp_path / "parts"
    _parts(folder, images, labels, [0, 24, 47], 12)
    record = folder / ".parts" / record_name
    part = json.loads(record.read_text())
    part["shards"] = [{**entry, "count": n} for entry, n in zip(part["shards"], counts)]
    part["count"] = sum(counts)
    record.write_text(json.dumps(part))
    with pytest.raises(
        ShardError,
        match=rf"{re.escape(record_name)}: {message} \(every shard holds samples_per_shard, "
        r"the split's last at most that\)$",
    ):
        merge_parts(folder)
    assert not (folder / "manifest.json").exists()


def test_a_part_record_that_links_out_of_the_folder_is_refused(tmp_path):
    images, labels = make_split(48, 7)
    folder = tmp_path / "parts"
    _parts(folder, images, labels, [0, 24, 48], 24)
    record = folder / ".parts" / "000000000024.json"
    outside = tmp_path / "elsewhere.json"
    outside.write_bytes(record.read_bytes())
    record.unlink()
    record.symlink_to(outside)
    with pytest.raises(ShardError, match=r"000000000024\.json: a link to .*elsewhere\.json, outside") as err:
        merge_parts(folder)
    assert str(err.value).count("000000000024.json") == 1  # the record named once
    assert not (folder / "manifest.json").exists()


def test_an_oversized_part_record_is_refused_by_what_it_is(tmp_path):
    """A part record is read with a manifest's byte cap; one past it is refused by name and
    kind before it is parsed."""
    from pipeline.shards.format import MAX_MANIFEST

    images, labels = make_split(48, 7)
    folder = tmp_path / "parts"
    _parts(folder, images, labels, [0, 24, 48], 24)
    record = folder / ".parts" / "000000000024.json"
    record.write_bytes(b" " * (MAX_MANIFEST + 1))
    with pytest.raises(ShardError, match=r"000000000024\.json: .* larger than any part record can be") as err:
        merge_parts(folder)
    assert str(err.value).count("000000000024.json") == 1
    assert not (folder / "manifest.json").exists()


@pytest.mark.parametrize("sizes", [[3, 5], [3, 1, 4], [4, 4], [1, 7, 2, 6], [0, 8, 0], [5, 11, 3, 8, 9]])
def test_block_digests_are_those_of_the_joined_bytes(sizes):
    """However the shard's buffers split its bytes, every `block` bytes of the whole get one
    digest (the last may be short): blocks that span buffers hash as if joined."""
    from xxhash import xxh3_64_digest

    from pipeline.shards.writer import block_digests

    data = bytes(range(256)) * 2
    starts = np.cumsum([0, *sizes])
    parts = [memoryview(data[a:b]) for a, b in zip(starts[:-1], starts[1:])]
    whole = data[: starts[-1]]
    expected = b"".join(xxh3_64_digest(whole[at : at + 4]) for at in range(0, len(whole), 4)).hex()
    assert block_digests(parts, 4) == expected


def test_merged_zstd_parts_keep_their_level(tmp_path):
    images, labels = make_split(48, 7)
    _parts(tmp_path / "parts", images, labels, [0, 24, 48], 24, compression="zstd", level=9)
    merged = merge_parts(tmp_path / "parts")
    whole = write_shards(
        images,
        labels,
        tmp_path / "whole",
        dataset="d",
        split="train",
        samples_per_shard=24,
        compression="zstd",
        level=9,
    )
    assert merged["compression"] == whole["compression"] and merged["compression"]["level"] == 9
    assert merged["shards"] == whole["shards"]


def test_parts_written_with_other_settings_are_refused(tmp_path):
    images, labels = make_split(48, 7)
    folder = tmp_path / "parts"
    _parts(folder, images, labels, [0, 24], 24)
    write_part(
        {"images": images[24:], "labels": labels[24:]},
        folder,
        first_sample=24,
        sample=MNIST,
        dataset="d",
        split="test",
        samples_per_shard=24,
    )
    with pytest.raises(ShardError, match=r"000000000024\.json: split 'test' differs from the first part's 'train'"):
        merge_parts(folder)
    assert not (folder / "manifest.json").exists()
    with pytest.raises(ShardError, match=r"empty: no parts to merge"):
        merge_parts(tmp_path / "empty")
