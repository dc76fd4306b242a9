"""Writers, readers and merges sharing one folder, and inputs the library boundary refuses:
never new bytes under an old manifest, never a short split, one line for each refusal."""

from __future__ import annotations

import json
import re
import shutil
import time

import numpy as np
import pytest
import torch

from pipeline.core.atomic import BusyError, locked
from pipeline.shards import (
    DeviceBatches,
    Field,
    Int64,
    Sample,
    ShardBusyError,
    ShardDataset,
    ShardError,
    ShardWriter,
    UnitFloat,
    merge_parts,
    read_manifest,
    read_split,
    write_part,
    write_split,
)
from pipeline.shards.watched import Deadlines

SAMPLE = Sample((Field("x", "float64", (4,)), Field("y", "int64", ())))


def columns(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((n, 4)), "y": rng.integers(-(2**62), 2**62, n)}


def write(folder, data: dict, per_shard: int = 8) -> dict:
    return write_split(data, folder, sample=SAMPLE, dataset="d", split="train", samples_per_shard=per_shard)


# ---- a published split is never rewritten under a reader --------------------------------------


@pytest.mark.parametrize("verify", ["xxh3", "none"])
def test_a_writer_over_an_open_split_never_feeds_the_reader_new_bytes(tmp_path, verify):
    """A reader that has opened the split (shard 0 verified, shard 1 not yet touched) while a
    ShardWriter writes another split into the same folder: it reads the old samples, or
    stops with a ShardError naming a shard, never the new writer's samples."""
    folder = tmp_path / "split"
    old, new = columns(16, 0), columns(16, 1)
    write(folder, old)
    reader = ShardDataset(folder, verify=verify)
    assert torch.equal(reader[0][0], torch.from_numpy(old["x"][0]))
    with ShardWriter(folder, sample=SAMPLE, dataset="d", split="train", samples_per_shard=8) as writer:
        writer.add(new)
        writer.finish()
    assert torch.equal(read_split(folder)["x"], torch.from_numpy(new["x"]))  # the new split is published
    assert torch.equal(reader[0][0], torch.from_numpy(old["x"][0]))  # the old reader: the old bytes
    try:
        got = reader[12][0]
    except ShardError as err:
        assert "shard-00001" in str(err) and "\n" not in str(err)
    else:
        assert torch.equal(got, torch.from_numpy(old["x"][12]))


def test_a_second_writer_of_one_folder_is_refused_up_front(tmp_path):
    folder = tmp_path / "split"
    first = ShardWriter(folder, sample=SAMPLE, dataset="d", split="train", samples_per_shard=8)
    first.add(columns(8, 0))
    with pytest.raises(ShardBusyError, match=r"split: another run is writing it right now"):
        ShardWriter(folder, sample=SAMPLE, dataset="d", split="train", samples_per_shard=8)
    first.add(columns(8, 1))
    first.finish()
    assert len(read_split(folder)["x"]) == 16


def test_a_writer_left_unfinished_publishes_nothing(tmp_path):
    folder = tmp_path / "split"
    write(folder, columns(16, 0))
    before = sorted(p.name for p in folder.iterdir())
    with pytest.raises(ShardError, match="not a number"):
        with ShardWriter(folder, sample=SAMPLE, dataset="d", split="train", samples_per_shard=8) as writer:
            writer.add(columns(8, 1))
            writer.add({"x": np.array([["a", 1, 2, 3]] * 8, dtype=object), "y": np.zeros(8, np.int64)})
    assert sorted(p.name for p in folder.iterdir()) == before
    assert torch.equal(read_split(folder)["x"], torch.from_numpy(columns(16, 0)["x"]))
    ShardWriter(folder, sample=SAMPLE, dataset="d", split="train", samples_per_shard=8).abort()  # the lock is free


def test_a_part_writer_refuses_a_shard_the_folder_publishes(tmp_path):
    folder = tmp_path / "split"
    write(folder, columns(16, 0))
    published = (folder / "shard-00000.safetensors").read_bytes()
    with pytest.raises(
        ShardError,
        match=r"shard-00000.safetensors: listed in .*manifest.json; a published shard "
        r"is never rewritten",
    ):
        write_part(
            columns(8, 1),
            folder,
            first_sample=0,
            total=16,
            sample=SAMPLE,
            dataset="d",
            split="train",
            samples_per_shard=8,
        )
    assert (folder / "shard-00000.safetensors").read_bytes() == published


@pytest.mark.parametrize("extra", [{"first_sample": 0}, {"total": 16}, {"first_sample": 8, "total": 16}])
def test_write_split_refuses_a_parts_keywords_and_writes_nothing(tmp_path, extra):
    """`write_split` and `write_part` pass their keywords on to one ShardWriter; a part's
    keywords given to `write_split` are refused (a TypeError naming `write_part`), not written
    as a part the caller thought was a whole split."""
    folder = tmp_path / "split"
    with pytest.raises(TypeError, match="write_split writes a whole split; a part is write_part's"):
        write_split(columns(16, 0), folder, sample=SAMPLE, dataset="d", split="train", samples_per_shard=8, **extra)
    assert not folder.exists()


# ---- merge_parts never returns a short split -------------------------------------------------


def _parts(folder, data: dict, cuts: list[int], total: int | None = None) -> None:
    for a, b in zip(cuts, cuts[1:]):
        write_part(
            {k: v[a:b] for k, v in data.items()},
            folder,
            first_sample=a,
            total=total,
            sample=SAMPLE,
            dataset="d",
            split="train",
            samples_per_shard=8,
        )


def test_parts_past_the_total_given_are_said_to_be_past_it(tmp_path):
    """Parts of 24 samples merged with total=20: past the total, not a part missing."""
    folder = tmp_path / "p"
    _parts(folder, columns(24, 0), [0, 8, 16, 24])
    with pytest.raises(ShardError, match=r"p: the parts hold samples 0\.\.24, past the split's total of 20 "):
        merge_parts(folder, total=20)
    assert not (folder / "manifest.json").exists()


def test_a_part_whose_writer_died_is_named_not_merged_short(tmp_path):
    """Three writers of 16 samples each; the last dies after its first shard (no record):
    the merge names the missing part and the dead writer's shard, and writes nothing."""
    folder, data = tmp_path / "p", columns(48, 0)
    _parts(folder, data, [0, 16, 32], total=48)
    dead = ShardWriter(
        folder, sample=SAMPLE, dataset="d", split="train", samples_per_shard=8, first_sample=32, total=48
    )
    dead.add({k: v[32:40] for k, v in data.items()})  # one whole shard written, then the process dies
    dead.abort()
    assert (folder / "shard-00004.safetensors").exists()
    with pytest.raises(
        ShardError,
        match=r"p: the parts hold samples 0..32 of the split's 48: the part from sample "
        r"32 is missing .*; shard files no part lists: shard-00004.safetensors$",
    ):
        merge_parts(folder)
    assert not (folder / "manifest.json").exists()
    _parts(folder, data, [32, 48], total=48)  # the part rerun: merged whole
    assert merge_parts(folder)["count"] == 48
    assert torch.equal(read_split(folder)["x"], torch.from_numpy(data["x"]))


def test_without_a_recorded_total_the_merge_is_refused_unless_given_one(tmp_path):
    folder, data = tmp_path / "p", columns(24, 0)
    _parts(folder, data, [0, 16])
    with pytest.raises(ShardError, match=r"no part records the split's total and none was given"):
        merge_parts(folder)
    with pytest.raises(ShardError, match=r"the parts hold samples 0..16 of the split's 24"):
        merge_parts(folder, total=24)
    assert merge_parts(folder, total=16)["count"] == 16


def test_parts_that_disagree_on_the_total_are_refused(tmp_path):
    folder, data = tmp_path / "p", columns(24, 0)
    _parts(folder, data, [0, 16], total=24)
    _parts(folder, data, [16, 24], total=32)
    with pytest.raises(ShardError, match=r"disagree on the split's total"):
        merge_parts(folder)


def test_a_shard_file_no_part_lists_is_refused_by_name(tmp_path):
    folder, data = tmp_path / "p", columns(16, 0)
    _parts(folder, data, [0, 16], total=16)
    (folder / "shard-00007.safetensors").write_bytes(b"left over")
    with pytest.raises(ShardError, match=r"shard files no part lists: shard-00007.safetensors \(a writer killed"):
        merge_parts(folder)
    assert not (folder / "manifest.json").exists()


def test_a_merge_while_the_split_is_written_whole_is_one_line_and_a_late_merge_says_it_is_merged(tmp_path):
    """While a writer of the whole split holds the folder's lock, a merge is refused in one
    line (a ShardBusyError: a ShardError and a BusyError); once a merge is done, a later one
    finds nothing to merge and says that a merge did it (one line too)."""
    folder, data = tmp_path / "p", columns(16, 0)
    _parts(folder, data, [0, 8, 16], total=16)
    with locked(folder):
        with pytest.raises(ShardBusyError, match=r"p: another run is writing it right now") as caught:
            merge_parts(folder)
    assert isinstance(caught.value, BusyError) and "\n" not in str(caught.value)
    assert merge_parts(folder)["count"] == 16
    with pytest.raises(
        ShardError,
        match=rf"^{re.escape(str(folder))}: no parts to merge: another merge_parts "
        rf"merged them already \(its manifest.json holds the split, 16 samples\)$",
    ):
        merge_parts(folder)


MERGE = """
import json, os, sys, time
from pipeline.shards import ShardError, merge_parts
while not os.path.exists(sys.argv[2]):  # every process imported and waiting: then all merge at once
    time.sleep(0.001)
try:
    print(json.dumps(merge_parts(sys.argv[1])))
except ShardError as err:
    print(f"{type(err).__name__}: {err}", file=sys.stderr)
    sys.exit(2)
"""


def _merge_outcomes(folder, outcomes: list, manifest: dict) -> None:
    """Each outcome of merges run at once is the merged split's manifest (one merged, the
    others waited for it) or one ShardError line saying another merge did it; at least one
    merged, and the split reads back whole with no part, lock or temporary left."""
    said = f"{folder}: no parts to merge: another merge_parts merged them already"
    assert any(outcome == manifest for outcome in outcomes), outcomes
    assert all(
        outcome == manifest
        or isinstance(outcome, str)
        and outcome.startswith(f"ShardError: {said}")
        and "\n" not in outcome.strip()
        for outcome in outcomes
    ), outcomes
    assert sorted(p.name for p in folder.iterdir()) == ["manifest.json"] + [
        f"shard-{i:05d}.safetensors" for i in range(manifest["count"] // 8)
    ]
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name]


def test_merges_at_once_in_processes_one_merges_the_others_wait_and_return_its_manifest(tmp_path):
    """Three processes merge one folder at the same instant, five times over: one merges;
    each other one waits for it and returns the manifest it wrote (or, where it began after
    that merge had ended, says in one line that another merge did it). Never a BusyError,
    never a traceback, never a split left unreadable."""
    import subprocess
    import sys

    data = columns(64, 0)
    for trial in range(5):
        folder, go = tmp_path / f"t{trial}" / "p", tmp_path / f"go{trial}"
        _parts(folder, data, list(range(0, 72, 8)), total=64)
        runs = [
            subprocess.Popen(
                [sys.executable, "-c", MERGE, str(folder), str(go)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(3)
        ]
        go.touch()
        outputs = [run.communicate(timeout=120) for run in runs]
        outcomes = [
            json.loads(out) if run.returncode == 0 else err.strip() if run.returncode == 2 else (out, err)
            for run, (out, err) in zip(runs, outputs)
        ]
        manifest = json.loads((folder / "manifest.json").read_text())
        _merge_outcomes(folder, outcomes, manifest)
        assert torch.equal(read_split(folder)["x"], torch.from_numpy(data["x"]))


def test_merges_at_once_in_threads_while_one_is_slow_the_others_wait_for_it(tmp_path, monkeypatch):
    """Four threads merge one folder at once, the manifest's write slowed so that the others
    surely arrive while the first one merges: they wait for it and return its manifest."""
    import threading

    import pipeline.shards.writer as writer

    slow, wrote = writer.write_manifest, []

    def write_manifest(folder, manifest):
        time.sleep(0.3)
        wrote.append(folder)
        slow(folder, manifest)

    monkeypatch.setattr(writer, "write_manifest", write_manifest)
    data = columns(64, 0)
    for trial in range(3):
        folder = tmp_path / f"t{trial}" / "p"
        _parts(folder, data, list(range(0, 72, 8)), total=64)
        start, outcomes = threading.Barrier(4), []

        def merge():
            start.wait()
            try:
                outcomes.append(merge_parts(folder))
            except ShardError as err:
                outcomes.append(f"{type(err).__name__}: {err}")

        threads = [threading.Thread(target=merge) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        manifest = read_manifest(folder)
        assert outcomes == [manifest] * 4 and wrote.count(folder) == 1
        _merge_outcomes(folder, outcomes, manifest)
        assert torch.equal(read_split(folder)["x"], torch.from_numpy(data["x"]))


def test_a_merge_waits_for_another_merge_a_bounded_time(tmp_path, monkeypatch):
    """A merge holding the parts past MERGE_WAIT_S: the waiting one stops with one line
    naming the folder and the lock, then merges once that one has let go."""
    import pipeline.shards.writer as writer
    from pipeline.shards.writer import parts_held

    monkeypatch.setattr(writer, "MERGE_WAIT_S", 0.3)
    folder, data = tmp_path / "p", columns(16, 0)
    _parts(folder, data, [0, 8, 16], total=16)
    began = time.monotonic()
    with parts_held(folder, exclusive=True):  # as another merge holds them
        with pytest.raises(
            ShardBusyError,
            match=rf"^{re.escape(str(folder))}: another merge of its parts has held "
            rf"them for over 0.3 s \(lock .*\.writers\.lock\); try again once "
            rf"it has ended$",
        ):
            merge_parts(folder)
    assert 0.3 <= time.monotonic() - began < 5
    assert merge_parts(folder)["count"] == 16


# ---- inputs the boundary checks ----------------------------------------------------------------


@pytest.mark.parametrize("name", ["../x", "a/b", "tr\nain", "", "Train", "x" * 65])
@pytest.mark.parametrize("key", ["dataset", "split"])
def test_names_that_are_not_slugs_are_refused(tmp_path, key, name):
    names = {"dataset": "d", "split": "train", key: name}
    with pytest.raises(ShardError, match=rf"^{key} .* is not a plain name"):
        write_split(columns(8, 0), tmp_path / "s", sample=SAMPLE, samples_per_shard=8, **names)
    assert not (tmp_path / "s").exists()


def test_the_safetensors_metadata_name_is_refused_as_a_field():
    with pytest.raises(ValueError, match=r"field '__metadata__': the name __metadata__ is reserved by safetensors"):
        Field("__metadata__", "uint8")


@pytest.mark.parametrize("dtype", [np.float32, np.dtype("float32"), torch.float32, "float32"])
def test_numpy_and_torch_dtypes_are_accepted_in_a_field(dtype):
    assert Field("x", dtype, (2,)) == Field("x", "float32", (2,))


@pytest.mark.parametrize("dtype", [torch.bfloat16, np.complex64, object])
def test_a_dtype_no_shard_holds_is_refused_by_its_name(dtype):
    with pytest.raises(ValueError, match=r"field 'x': dtype '?(bfloat16|complex64|object)'? is not one of"):
        Field("x", dtype)


def test_an_object_array_of_numbers_is_written_as_the_numbers(tmp_path):
    """What a mixed pandas frame's `.values` gives: numbers in an object array."""
    data = columns(8, 0)
    as_objects = {"x": data["x"].astype(object), "y": data["y"].astype(object)}
    write(tmp_path / "a", data)
    write(tmp_path / "b", as_objects)
    for name in ("shard-00000.safetensors", "manifest.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


@pytest.mark.parametrize("value, shown", [("a", "'a'"), (None, "None"), (1 + 2j, r"\(1\+2j\)"), ([1], r"\[1\]")])
def test_an_object_array_of_anything_else_is_refused_naming_field_value_and_sample(tmp_path, value, shown):
    x = np.zeros((8, 4)).astype(object)
    x[5, 2] = value
    with pytest.raises(ShardError, match=rf"field 'x': value {shown} \(\w+\) at sample 5 is not a number$"):
        write(tmp_path / "s", {"x": x, "y": np.zeros(8, np.int64)})


def test_an_object_integer_past_every_dtype_is_refused_naming_it(tmp_path):
    y = np.zeros(8, object)
    y[3] = 2**70
    with pytest.raises(ShardError, match=rf"field 'y': value {2**70} at sample 3 does not fit int64"):
        write(tmp_path / "s", {"x": np.zeros((8, 4)), "y": y})


def test_a_bfloat16_tensor_is_refused_naming_the_field(tmp_path):
    with pytest.raises(ShardError, match=r"field 'x': torch.bfloat16 values cannot be written as float64"):
        write(tmp_path / "s", {"x": torch.zeros((8, 4), dtype=torch.bfloat16), "y": np.zeros(8, np.int64)})


def test_int64_refuses_a_uint64_it_cannot_hold():
    field = {"y": torch.from_numpy(np.array([0, 2**63 - 1, 2**64 - 1], np.uint64))}
    with pytest.raises(ShardError, match=rf"Int64: field 'y': value {2**64 - 1} \(batch row 2\) does not fit int64"):
        Int64("y")(field)
    fits = {"y": torch.from_numpy(np.array([0, 2**63 - 1], np.uint64))}
    assert Int64("y")(fits)["y"].tolist() == [0, 2**63 - 1]


def test_a_part_rerun_that_dies_leaves_no_record_of_its_earlier_run_to_merge():
    """A part written, then written again by a run that dies after one shard: the merge must
    not pair the first run's record with the second run's file (the manifest would list
    digests its shard no longer has)."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as scratch:
        folder, data = Path(scratch) / "p", columns(16, 0)
        _parts(folder, data, [0, 8, 16], total=16)
        again = ShardWriter(
            folder, sample=SAMPLE, dataset="d", split="train", samples_per_shard=8, first_sample=0, total=16
        )
        again.add({k: np.ones_like(v[:8]) for k, v in data.items()})  # one new shard over the old, then it dies
        again.abort()
        with pytest.raises(ShardError, match=r"starts at sample 8, expected 0 \(a part missing"):
            merge_parts(folder)
        assert not (folder / "manifest.json").exists()


def test_int64_takes_an_empty_batch():
    empty = {"y": torch.from_numpy(np.zeros(0, np.uint64))}
    assert Int64("y")(empty)["y"].dtype == torch.int64 and Int64("y")(empty)["y"].numel() == 0


def test_a_merge_while_a_part_is_being_written_is_refused_and_no_part_starts_under_a_merge(tmp_path):
    """A writer holds its part's lock for its whole run: a merge meanwhile is one line naming
    the part, and writes nothing; while a merge holds the parts, a writer of one is refused."""
    folder, data = tmp_path / "p", columns(24, 0)
    _parts(folder, data, [0, 8, 16, 24], total=24)
    with ShardWriter(
        folder, sample=SAMPLE, dataset="d", split="train", samples_per_shard=8, first_sample=8, total=24
    ):  # a rerun of the middle part, under way
        with pytest.raises(ShardBusyError, match=r"p: the part from sample 8 is being written right now"):
            merge_parts(folder)
        assert not (folder / "manifest.json").exists()
    _parts(folder, data, [8, 16], total=24)
    with locked(folder / ".parts" / "000000000016"):  # as the merge holds it
        with pytest.raises(ShardBusyError, match=r"another run is writing it right now"):
            write_part(
                {k: v[16:24] for k, v in data.items()},
                folder,
                first_sample=16,
                total=24,
                sample=SAMPLE,
                dataset="d",
                split="train",
                samples_per_shard=8,
            )
    assert merge_parts(folder)["count"] == 24
    assert torch.equal(read_split(folder)["x"], torch.from_numpy(data["x"]))


def test_a_part_writer_not_on_record_yet_stops_a_merge_and_a_merge_stops_a_new_writer(tmp_path):
    """A writer of a part no record or lock names yet still holds the parts (shared): the
    merge is one line; while a merge holds them (exclusive), a new part's writer is refused."""
    from pipeline.shards.writer import PARTS_DIR, parts_held

    folder, data = tmp_path / "p", columns(16, 0)
    _parts(folder, data, [0, 8, 16], total=16)
    with parts_held(folder, exclusive=False):  # as a writer between its start and its part's lock
        with pytest.raises(ShardBusyError, match=r"p: a part is being written right now"):
            merge_parts(folder)
    with parts_held(folder, exclusive=True):  # as a merge
        with pytest.raises(ShardBusyError, match=r"p: a merge of its parts is under way"):
            write_part(
                {k: v[8:16] for k, v in data.items()},
                folder,
                first_sample=8,
                total=16,
                sample=SAMPLE,
                dataset="d",
                split="train",
                samples_per_shard=8,
            )
    assert merge_parts(folder)["count"] == 16 and not (folder / PARTS_DIR).exists()
    assert torch.equal(read_split(folder)["x"], torch.from_numpy(data["x"]))


# ---- issue 61: nothing changed or removed without a word; every error one line, a ShardError ----


def test_write_split_over_a_split_never_removes_a_file_its_manifest_does_not_list(tmp_path):
    """Issue 61: a user's `shard-notes.txt` in a split's folder was deleted by the next
    write_split (any name starting "shard-" passed for the library's). Only the files the
    manifest lists are the split's: the write is refused naming the file, and the folder
    (split and file) is left as it was; so for a folder named like a shard, and for a shard
    file the manifest does not list."""
    folder, old, new = tmp_path / "split", columns(16, 0), columns(16, 1)
    write(folder, old)
    for name, make in (
        ("shard-notes.txt", lambda p: p.write_text("my notes\n")),
        ("shard-00000.safetensors.bak", lambda p: p.write_bytes(b"a copy")),
        ("shard-00007.safetensors", lambda p: p.write_bytes(b"not listed")),
        ("shard-extra", lambda p: (p.mkdir(), (p / "inside.txt").write_text("mine\n"))),
    ):
        make(folder / name)
        before = {p.name: p.read_bytes() if p.is_file() else None for p in folder.iterdir()}
        with pytest.raises(
            ShardError,
            match=rf"^{re.escape(str(folder))}: holds '{re.escape(name)}', which its "
            rf"manifest.json does not list: a folder this project did not write "
            rf"alone; refusing to replace it \(only the files a split's manifest "
            rf"lists are ever removed: move that one out, or choose another folder\)$",
        ):
            write(folder, new)
        assert {p.name: p.read_bytes() if p.is_file() else None for p in folder.iterdir()} == before
        assert torch.equal(read_split(folder)["x"], torch.from_numpy(old["x"]))
        assert sorted(p.name for p in tmp_path.iterdir()) == ["split"]  # no lock, no temporary
        shutil.rmtree(folder / name) if (folder / name).is_dir() else (folder / name).unlink()
    write(folder, new)  # the split alone again: replaced
    assert torch.equal(read_split(folder)["x"], torch.from_numpy(new["x"]))


def test_a_file_put_into_the_folder_while_the_split_is_written_is_kept(tmp_path):
    """The folder is looked at again just before the new split is swapped in: a file put in
    meanwhile stops the swap (one line naming it), and the old split and the file stay."""
    folder, old = tmp_path / "split", columns(16, 0)
    write(folder, old)
    writer = ShardWriter(folder, sample=SAMPLE, dataset="d", split="train", samples_per_shard=8)
    writer.add(columns(16, 1))
    (folder / "shard-notes.txt").write_text("written meanwhile\n")
    with pytest.raises(ShardError, match=r"split: holds 'shard-notes.txt', which its manifest.json does not list"):
        writer.finish()
    assert (folder / "shard-notes.txt").read_text() == "written meanwhile\n"
    assert torch.equal(read_split(folder)["x"], torch.from_numpy(old["x"]))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["split"]


def test_a_bool_is_not_a_sample_index(tmp_path):
    """Issue 61: `dataset[True]` returned sample 1. Indices are integers: a bool (Python's
    or numpy's) is refused in one line, a ShardTypeError (a TypeError too); a uint64 index
    past int64 is out of range, not wrapped to a negative one."""
    from pipeline.shards import ShardIndexError, ShardTypeError

    folder = tmp_path / "split"
    write(folder, columns(16, 0))
    data = ShardDataset(folder)
    for index, shown in ((True, "bool True"), (np.True_, "bool np.True_"), (1.0, "float 1.0"), ("1", "str '1'")):
        with pytest.raises(ShardTypeError, match=rf"^a sample index is an integer, got {re.escape(shown)}$") as caught:
            data[index]
        assert isinstance(caught.value, TypeError)
    for indices in (np.array([2**64 - 1], np.uint64), [16], [-17]):
        with pytest.raises(ShardIndexError, match=r"^sample index out of range 0\.\.15$") as caught:
            data.batch(indices)
        assert isinstance(caught.value, IndexError)
    with pytest.raises(ShardIndexError, match=r"^sample index 1180591620717411303424 is outside 0\.\.15$"):
        data[2**70]  # past int64: out of range, not of the wrong type
    for indices, shown in (([True, False], "bool [2]"), ([1.0], "float64 [1]")):
        with pytest.raises(
            ShardTypeError, match=rf"^expected a 1-D sequence of integer sample indices, got {re.escape(shown)}$"
        ):
            data.batch(indices)
    write(tmp_path / "empty", columns(0, 0))
    with pytest.raises(ShardIndexError, match=r"^sample index out of range \(the split holds no samples\)$"):
        ShardDataset(tmp_path / "empty")[0]
    assert torch.equal(data[np.int64(3)][0], data[3][0]) and len(list(data)) == 16  # iteration ends at the index error


def test_read_split_names_a_device_torch_does_not_know(tmp_path):
    """Issue 61: `read_split(path, "gpu")` was torch's raw RuntimeError listing every device
    type over several lines; now one line naming the argument."""
    folder = tmp_path / "split"
    write(folder, columns(8, 0))
    with pytest.raises(
        ShardError,
        match=r"^device 'gpu' is not a torch device \(such as 'cpu', 'cuda' or "
        r"'cuda:1'\)$",
    ):
        read_split(folder, "gpu")
    with pytest.raises(
        ShardError,
        match=r"^device must be a torch device or its name \(such as 'cpu' or "
        r"'cuda:0'\), got float 1.5$",
    ):
        read_split(folder, 1.5)
    assert read_split(folder, torch.device("cpu"))["x"].shape == (8, 4)


def _folder(tmp_path):
    folder = tmp_path / "split"
    if not folder.exists():
        write(folder, columns(8, 0))
    return folder


def _writer(**changed):
    arguments = {"sample": SAMPLE, "dataset": "d", "split": "train", "samples_per_shard": 8, **changed}
    return lambda tmp_path: write_split(columns(8, 0), arguments.pop("folder", tmp_path / "new"), **arguments)


ARGUMENTS = [  # (call, the one line it gives): every argument of the public API, refused naming it
    (_writer(level=3.5, compression="zstd"), r"level must be a zstd level, an integer in -131072\.\.22, got 3\.5"),
    (_writer(level=True), r"level must be a zstd level, an integer in -131072\.\.22, got True"),
    (_writer(level=23, compression="zstd"), r"level must be a zstd level, an integer in -131072\.\.22, got 23"),
    (_writer(level="3"), r"level must be a zstd level, an integer in -131072\.\.22, got '3'"),
    (_writer(compression=["zstd"]), r"shard compression must be one of \('none', 'zstd'\), got \['zstd'\]"),
    (_writer(samples_per_shard=2.5), r"samples_per_shard must be at least 1 \(an integer\), got 2\.5"),
    (_writer(sample="x"), r"sample must be a Sample of Fields \(pipeline.shards.Sample\), got str"),
    (_writer(folder=None), r"folder must be a path \(str or pathlib.Path\), got NoneType"),
    (_writer(source=["a"]), r"source must be a dict \(recorded in manifest.json\), got list"),
    (
        _writer(source={"at": {1}}),
        r"source must hold only what JSON holds \(it is recorded in manifest.json\): "
        r"Object of type set is not JSON serializable",
    ),
    (_writer(source={"x": float("nan")}), r"source must hold only what JSON holds .*: Out of range float values"),
    (
        lambda p: write_part(
            columns(8, 0), p / "q", first_sample=4, sample=SAMPLE, dataset="d", split="train", samples_per_shard=8
        ),
        r"first_sample must be a multiple of samples_per_shard \(8\), got 4",
    ),
    (  # an empty split cannot be merged from parts: refused where it is written, not at the merge
        lambda p: _parts(p / "q", columns(0, 0), [0, 0], total=0),
        r"total must be the split's sample count \(1 or more: an empty split is write_split's\)",
    ),
    (
        lambda p: merge_parts(p / "q", total=2.0),
        r"total must be the split's sample count \(an integer, 1 or more\), "
        r"got 2\.0",
    ),
    (lambda p: merge_parts(p / "q", source=5), r"source must be a dict \(recorded in manifest.json\), got int"),
    (lambda p: Sample("xy"), r"a sample's fields are a tuple of Field, got str"),
    (lambda p: Sample((Field("x", "uint8"), "y")), r"a sample's fields are a tuple of Field: fields\[1\] is str 'y'"),
    (lambda p: read_split(_folder(p), verify="md5"), r"verify must be one of \('xxh3', 'sha256', 'none'\), got 'md5'"),
    (lambda p: read_split(3), r"path must be a shard folder \(str or pathlib.Path\), got int"),
    (lambda p: ShardDataset(None), r"location must be a folder or a URL \(str or pathlib.Path\), got NoneType"),
    (lambda p: ShardDataset(_folder(p), dataset=1), r"dataset must be a name \(str\) or None, got int"),
    (lambda p: ShardDataset(_folder(p), cache_bytes=0), r"cache_bytes must be a number of bytes \(1 or more\), got 0"),
    (lambda p: ShardDataset(_folder(p), storage_options=[1]), r"storage_options must be a dict, got list"),
    (
        lambda p: ShardDataset(_folder(p), transform=5),
        r"a transform must be callable, got int \(transform= takes a "
        r"callable of a batch dict, or a list of them\)",
    ),
    (lambda p: ShardDataset(_folder(p)).loader(2, drop_last="yes"), r"drop_last must be True or False, got 'yes'"),
    (
        lambda p: ShardDataset(_folder(p)).loader(2, num_workers="2"),
        r"num_workers must be an integer \(0 or more\), "
        r"got '2'",
    ),
    (
        lambda p: ShardDataset(_folder(p)).loader(2, prefetch_factor=2),
        r"loader: prefetch_factor option could only be "
        r"specified in multiprocessing",
    ),
    (lambda p: ShardDataset(_folder(p)).loader(2, freeze=1), r"freeze must be True or False, got 1"),
    (
        lambda p: ShardDataset(_folder(p)).sampler(2, shuffle="random"),
        r"shuffle must be True, False or one of "
        r"\('none', 'samples', 'shards'\), got 'random'",
    ),
    (lambda p: ShardDataset(_folder(p)).sampler(2, rank=1), r"rank 1 is outside 0\.\.0"),
    (lambda p: Int64(3), r"Int64: field must be a field's name \(str\), got int"),
    (lambda p: UnitFloat("x", mean=0.5, std=0.0), r"UnitFloat\('x'\): std must be above 0, got 0\.0"),
    (lambda p: UnitFloat("x", mean="0.5", std=1.0), r"UnitFloat\('x'\): mean must be a finite number, got '0\.5'"),
    (lambda p: UnitFloat("x", dtype=torch.int32), r"UnitFloat\('x'\): dtype must be a torch float dtype "),
    (lambda p: UnitFloat("x", add_channel=1), r"UnitFloat\('x'\): add_channel must be True or False, got 1"),
    (
        lambda p: DeviceBatches({"x": [1, 2]}, 2),
        r"DeviceBatches: columns must map field names to tensors, got "
        r"\{'x': 'list'\}",
    ),
    (lambda p: DeviceBatches({"x": torch.zeros(4)}, 0), r"batch_size must be an integer of at least 1, got 0"),
    (lambda p: Deadlines(connect_s=-1), r"Deadlines.connect_s must be a positive number, got -1"),
]


@pytest.mark.parametrize(("call", "message"), ARGUMENTS)
def test_every_argument_error_is_one_shard_error_line_naming_the_argument(tmp_path, call, message):
    """Issue 61: `level=3.5` was zstandard's raw TypeError, which named no argument. Every
    argument of the public API is checked where it is given: one line, a ShardError (a
    ValueError too, as the library's argument errors always were), naming the argument and
    the value; nothing is written."""
    with pytest.raises(ShardError, match=rf"^{message}") as caught:
        call(tmp_path)
    assert "\n" not in str(caught.value) and isinstance(caught.value, ValueError)
    assert not (tmp_path / "new").exists() and not (tmp_path / "q" / "manifest.json").exists()


def test_a_full_disk_is_a_shard_error_naming_the_folder(tmp_path, monkeypatch):
    """An OS failure while writing (here ENOSPC, as a full disk gives it) is a ShardSystemError:
    a ShardError and the project's SystemFailure, one line naming the folder the caller gave
    (never the writer's temporary), for a whole split and for a part; nothing is published."""
    import errno
    import os

    from pipeline.core.errors import SystemFailure
    from pipeline.shards import ShardSystemError

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(ShardWriter, "_write", full)
    for name, call in (
        ("whole", lambda f: write(f, columns(16, 0))),
        (
            "part",
            lambda f: write_part(
                columns(8, 0),
                f,
                first_sample=0,
                total=16,
                sample=SAMPLE,
                dataset="d",
                split="train",
                samples_per_shard=8,
            ),
        ),
    ):
        folder = tmp_path / name
        with pytest.raises(
            ShardSystemError,
            match=rf"^{re.escape(str(folder))}: No space left on device \(ENOSPC\); "
            rf"the disk is full",
        ) as caught:
            call(folder)
        assert isinstance(caught.value, SystemFailure) and "\n" not in str(caught.value)
        assert ".tmp" not in str(caught.value) and not (folder / "manifest.json").exists()


UNFINISHED = """
import sys
import numpy as np
from pipeline.shards import Field, Sample, ShardWriter
sample = Sample((Field("x", "float64"),))
part = {"first_sample": 0, "total": 8} if sys.argv[2] == "part" else {}
writer = ShardWriter(sys.argv[1], sample=sample, dataset="d", split="s", samples_per_shard=4, **part)
writer.add({"x": np.zeros(6)})
if sys.argv[3] == "late":   # held by a module: let go only as the interpreter tears its modules down
    import json
    json.kept = writer
elif sys.argv[3] == "raised":
    raise SystemExit(3)
"""


@pytest.mark.parametrize("kept", ["global", "late", "raised"])
@pytest.mark.parametrize("kind", ["whole", "part"])
def test_a_writer_never_closed_aborts_quietly_at_exit(tmp_path, kind, kept):
    """Issue 61: a ShardWriter dropped without close() at interpreter exit printed "Exception
    ignored in ShardWriter.__del__ ... ImportError: sys.meta_path is None" (and, held late,
    left its temporary folder and lock behind). Now every writer still open is aborted as
    the interpreter exits: nothing on stderr, nothing published, no lock or temporary left;
    a part leaves its complete shard and no record, as `abort()` does."""
    import subprocess
    import sys

    folder = tmp_path / "out" / "split"
    folder.parent.mkdir()
    run = subprocess.run(
        [sys.executable, "-c", UNFINISHED, str(folder), kind, kept], capture_output=True, text=True, timeout=120
    )
    assert run.stderr == "" and run.returncode == (3 if kept == "raised" else 0)
    if kind == "whole":
        assert sorted(p.name for p in folder.parent.iterdir()) == []
    else:
        assert sorted(p.name for p in folder.parent.iterdir()) == ["split"]
        assert sorted(p.name for p in folder.iterdir()) == [".parts", "shard-00000.safetensors"]
        assert sorted(p.name for p in (folder / ".parts").iterdir()) == [".writers.lock"]  # (the merge removes it)
