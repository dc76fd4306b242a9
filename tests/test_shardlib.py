"""The shard library as a user takes it into their own code: any fields come back bit for bit
through every public reading path, transforms only when named, DataLoader workers hold nothing of the split,
memory within a bound, elastic resume, parallel writes, and docs/shards.md's code runs."""

from __future__ import annotations

import gc
import importlib.util
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from pipeline.shards import (
    DeviceBatches,
    Field,
    Int64,
    Sample,
    ShardDataset,
    ShardError,
    ShardSampler,
    UnitFloat,
    merge_parts,
    read_split,
    write_part,
    write_split,
)
from pipeline.shards.mapped import MappedSplit
from pipeline.shards.order import EPOCHS, MAX_INTERVALS, Order

ROOT = Path(__file__).resolve().parents[1]

MIXED = Sample(
    (
        Field("x", "float32", (16,)),
        Field("target", "float32", ()),
        Field("image", "uint8", (3, 8, 8)),
        Field("label", "int64", (), classes=100),
        Field("half", "float16", (2,)),
        Field("wide", "float64", ()),
        Field("count", "int16", (3,)),
        Field("mask", "bool", (5,)),
        Field("big", "uint16", ()),
    )
)


def mixed_columns(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "x": rng.standard_normal((n, 16)).astype(np.float32),
        "target": (rng.standard_normal(n) * 5).astype(np.float32),  # -4.257 stays -4.257
        "image": rng.integers(0, 256, (n, 3, 8, 8), dtype=np.uint8),
        "label": rng.integers(0, 100, n),
        "half": rng.standard_normal((n, 2)).astype(np.float16),
        "wide": rng.standard_normal(n),
        "count": rng.integers(-30000, 30000, (n, 3)).astype(np.int16),
        "mask": rng.random((n, 5)) < 0.5,
        "big": rng.integers(0, 65536, n).astype(np.uint16),
    }


def same(got: torch.Tensor | np.ndarray, want: np.ndarray, name: str) -> None:
    """Bit for bit: dtype, shape and bytes."""
    got = torch.from_numpy(got) if isinstance(got, np.ndarray) else got
    assert str(got.dtype).removeprefix("torch.") == want.dtype.name, (name, got.dtype, want.dtype)
    assert tuple(got.shape) == want.shape, (name, got.shape, want.shape)
    assert got.contiguous().numpy().tobytes() == np.ascontiguousarray(want).tobytes(), name


def has_zstandard() -> bool:
    """Whether zstd shards can be written here: the bare install (`pip install .`, the shard
    library alone) lacks zstandard, which `[shards]` adds."""
    return importlib.util.find_spec("zstandard") is not None


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """The mixed split under `none/`, and under `zstd/` where zstandard is installed."""
    root = tmp_path_factory.mktemp("mixed")
    columns = mixed_columns(230)
    for codec in ("none", "zstd") if has_zstandard() else ("none",):
        write_split(
            columns, root / codec, sample=MIXED, dataset="mixed", split="train", samples_per_shard=64, compression=codec
        )
    return root, columns


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_every_reading_path_returns_the_written_values_untouched(mixed, codec):
    if codec == "zstd":
        pytest.importorskip("zstandard", reason="zstd shards need zstandard (pip install '.[shards]')")
    root, columns = mixed
    folder = root / codec
    names = list(columns)
    order = np.random.default_rng(1).permutation(230)

    def check(fields, index, where):
        assert len(fields) == len(names), where
        for name, got in zip(names, fields):
            same(got, columns[name][index], f"{where}: {name}")

    data = ShardDataset(folder, dataset="mixed", split="train")
    check(data[17], 17, "dataset[i]")
    check(data.batch(order[:50]), order[:50], "batch")
    check(tuple(MappedSplit(folder).take(order).values()), order, "MappedSplit.take")
    check(tuple(read_split(folder).values()), np.arange(230), "read_split")
    for workers in (0, 2):
        got = [torch.cat(column) for column in zip(*DataLoader(data, batch_size=40, num_workers=workers))]
        check(got, np.arange(230), f"DataLoader, workers {workers}")
        loader = data.loader(40, shuffle=True, seed=5, num_workers=workers)
        seen, parts = [], []
        for fields in loader:
            seen.append(loader.indices.numpy())
            parts.append(fields)
        check([torch.cat(column) for column in zip(*parts)], np.concatenate(seen), f"loader, workers {workers}")
    resident = DeviceBatches(read_split(folder), 1000)
    check(next(iter(resident)), np.arange(230), "DeviceBatches")


def test_a_url_split_returns_the_written_values_untouched(mixed, tmp_path):
    fsspec = pytest.importorskip("fsspec")
    root, columns = mixed
    url = f"memory://lib-{uuid.uuid4().hex}/train"
    fs, base = fsspec.core.url_to_fs(url)
    for file in (root / "none").iterdir():
        fs.pipe_file(f"{base}/{file.name}", file.read_bytes())
    data = ShardDataset(url, cache=tmp_path / "cache", dataset="mixed", split="train")
    for name, got in zip(columns, data.batch(np.arange(230))):
        same(got, columns[name], name)
    with pytest.raises(ShardError, match="manifest is for dataset 'mixed', expected 'mnist'"):
        ShardDataset(url, cache=tmp_path / "cache", dataset="mnist")
    fs.rm(base, recursive=True)


def test_values_change_only_through_a_named_transform_that_fits(mixed):
    root, columns = mixed
    data = ShardDataset(root / "none", transform=[UnitFloat("image", add_channel=True), Int64("label")])
    fields = dict(zip(columns, data.batch([0, 1])))
    assert fields["image"].dtype == torch.float32 and fields["image"].shape == (2, 1, 3, 8, 8)
    assert torch.equal(fields["image"][:, 0], torch.from_numpy(columns["image"][:2]).float() / 255)
    assert fields["label"].dtype == torch.int64
    same(fields["x"], columns["x"][:2], "x")  # the fields no transform names: untouched
    for transform, message in (
        (UnitFloat("x"), "field 'x' is float32, not uint8"),
        (Int64("target"), "field 'target' is float32, not an integer field"),
        (UnitFloat("images"), "no field 'images'"),
    ):
        with pytest.raises(ValueError, match=re.escape(message)):
            ShardDataset(root / "none", transform=transform)
    resident = read_split(root / "none")
    with pytest.raises(ValueError, match="not uint8"):
        DeviceBatches(resident, 10, transform=UnitFloat("x"))


# --- one order rule: ranks and elastic resume -------------------------------------------------


def take_steps(samplers: list[ShardSampler], steps: int | None) -> tuple[list[int], list[int]]:
    """Run every rank's sampler for `steps` steps (all: None); the indices taken, and the
    batch count per rank."""
    taken, counts = [], []
    for sampler in samplers:
        batches = iter(sampler)
        mine = [next(batches) for _ in range(len(sampler) if steps is None else steps)]
        taken += [int(i) for batch in mine for i in batch]
        counts.append(len(mine))
    return taken, counts


@pytest.mark.parametrize("shuffle", ["samples", "shards", "none"])
@pytest.mark.parametrize("old, new", [(3, 2), (2, 5), (4, 4), (1, 3)])
def test_an_epoch_resumed_with_another_world_size_takes_every_sample_once(shuffle, old, new):
    n, counts = 1003, [300, 300, 300, 103]

    def ranks(world, batch):
        return [
            ShardSampler(n, batch, shuffle=shuffle, seed=9, rank=r, world_size=world, shard_counts=counts)
            for r in range(world)
        ]

    first = ranks(old, 17)
    before, steps = take_steps(first, 5)
    states = [sampler.state_dict(5) for sampler in first]
    assert all(state == states[0] for state in states)  # every rank saves the same position
    resumed = ranks(new, 23)
    for sampler in resumed:
        sampler.load_state_dict(states[0])
    after, counts_after = take_steps(resumed, None)
    assert len(set(counts_after)) == 1  # equal steps on every new rank
    assert sorted(before + after) == list(range(n))  # nothing repeated, nothing dropped
    # the state's positions are those of the epoch's order (the same for any world size) not yet taken
    whole = ShardSampler(n, 50, shuffle=shuffle, seed=9, shard_counts=counts).order(0)
    due = {int(whole[p]) for a, b in states[0]["due"] for p in range(a, b)}
    assert due == set(range(n)) - set(before) and len(before) == 5 * 17 * old


def test_the_order_does_not_depend_on_the_world_size_and_steps_are_equal():
    n = 1001
    one = ShardSampler(n, 10, shuffle=True, seed=4)
    orders = [
        np.concatenate(list(iter(ShardSampler(n, 10, shuffle=True, seed=4, rank=r, world_size=3)))) for r in range(3)
    ]
    assert np.array_equal(np.concatenate(orders), one.order(0))
    assert [len(o) for o in orders] == [334, 334, 333]
    assert len({len(ShardSampler(n, 10, shuffle=True, seed=4, rank=r, world_size=3)) for r in range(3)}) == 1
    assert not np.array_equal(one.order(0), one.order(1))  # a new order each epoch
    assert np.array_equal(one.order(1), ShardSampler(n, 7, shuffle=True, seed=4).order(1))


def test_a_state_for_another_order_is_refused_in_one_line():
    sampler = ShardSampler(100, 10, shuffle=True, seed=1)
    state = sampler.state_dict()
    for key, value, message in (
        ("seed", 2, "saved with seed 2"),
        ("count", 99, "saved with count 99"),
        ("shuffle", "none", "saved with shuffle 'none'"),
        ("due", [[5, 3]], "due interval [5, 3]"),
        ("epoch", 2**62, "epoch must be an integer in 0..1000002, got 4611686018427387904"),
        ("due", [[0, 101]], "inside 0..100"),
        ("due", [[3, 3]], "due interval [3, 3]"),
        ("epoch", EPOCHS, "got 1000003"),
        ("epoch", -1, "got -1"),
        ("due", [[i, i + 1] for i in range(MAX_INTERVALS + 1)], "at most 65536 intervals"),
        ("due", {"0": 1}, "at most 65536 intervals"),
    ):
        with pytest.raises(ShardError, match=re.escape(message)):
            ShardSampler(100, 10, shuffle=True, seed=1).load_state_dict({**state, key: value})
    # the bounds themselves are a state: the last epoch the range holds, MAX_INTERVALS runs
    last = ShardSampler(100, 10, shuffle=True, seed=1)
    last.load_state_dict({**state, "epoch": EPOCHS - 1})
    assert last.epoch == EPOCHS - 1
    many = ShardSampler(MAX_INTERVALS * 2, 10, shuffle=True, seed=1)
    many.load_state_dict({**many.state_dict(), "due": [[2 * i, 2 * i + 1] for i in range(MAX_INTERVALS)]})
    assert len(many.due) == MAX_INTERVALS


def test_the_loader_state_counts_the_batches_taken_not_those_fetched_ahead(mixed):
    root, _ = mixed
    data = ShardDataset(root / "none")
    loader = data.loader(10, shuffle=True, seed=2, num_workers=2, prefetch_factor=4)
    taken = []
    for step, _ in enumerate(loader):
        taken += loader.indices.tolist()
        if step == 6:
            break
    state = loader.state_dict()
    assert sum(b - a for a, b in state["due"]) == 230 - 70
    again = data.loader(10, shuffle=True, seed=2)
    again.load_state_dict(state)
    for _ in again:
        taken += again.indices.tolist()
    assert sorted(taken) == list(range(230))
    assert again.state_dict()["epoch"] == 1


# --- memory: one copy between workers, and a bound ----------------------------------------------


def tree_pss(folder: Path | None = None) -> tuple[int, int]:
    """(PSS of the anonymous memory, PSS of the pages mapped from files under `folder`), in
    bytes, summed over this process and its children (the DataLoader's workers). PSS divides
    a page shared by several processes among them, so a page held once counts once."""
    me = os.getpid()
    pids = [me] + [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _parent(p) == me]
    anon = mapped = 0
    for pid in pids:
        try:
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
            smaps = Path(f"/proc/{pid}/smaps").read_text() if folder else ""
        except OSError:
            continue
        anon += int(re.search(r"^Pss_Anon:\s+(\d+) kB", rollup, re.M).group(1)) * 1024
        inside = False
        for line in smaps.splitlines():
            if re.match(r"[0-9a-f]+-[0-9a-f]+ ", line):
                inside = str(folder) in line
            elif inside and line.startswith("Pss:"):
                mapped += int(line.split()[1]) * 1024
    return anon, mapped


def _parent(proc: Path) -> int:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


class Blank(torch.utils.data.Dataset):
    """Batches of zeros shaped like the split's, made as ShardDataset makes its batches (one
    array per field, unbound into samples): what the workers cost without any data."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitems__(self, indices):
        images = torch.from_numpy(np.zeros((len(indices), 28, 28), np.uint8))
        labels = torch.from_numpy(np.zeros(len(indices), np.int64))
        return list(zip(images.unbind(0), labels.unbind(0)))


def epochs_pss(dataset, folder: Path | None = None, workers: int = 3) -> tuple[int, int]:
    """What two shuffled epochs add to `tree_pss` (anonymous, mapped from `folder`), taken
    while the DataLoader's workers are still up."""
    anon, _ = tree_pss()
    loader = DataLoader(dataset, batch_size=512, shuffle=True, num_workers=workers, persistent_workers=True)
    for _ in range(2):
        for _ in loader:
            pass
    after, mapped = tree_pss(folder)
    del loader
    return after - anon, mapped


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="needs Linux's /proc")
def test_dataloader_workers_read_through_shared_maps_and_copy_nothing(tmp_path):
    """3 workers over a 48 MB split read through maps, as the main process does: the split's
    pages are the page cache's, counted once over all the processes (their file-backed PSS
    adds up to at most one split), and the workers' own memory grows no more than over a
    data set of zeros plus one split (a copy in each worker: 3 more)."""
    n = 60_000
    rng = np.random.default_rng(0)
    write_split(
        {"images": rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), "labels": rng.integers(0, 10, n)},
        tmp_path / "s",
        sample=Sample((Field("images", "uint8", (28, 28)), Field("labels", "int64", ()))),
        dataset="d",
        split="train",
        samples_per_shard=16384,
    )
    split_bytes = n * (28 * 28 + 8)
    dataset = ShardDataset(tmp_path / "s")
    dataset.batch([0, n - 1])  # the parent maps its first and last shard before the workers start
    import gc

    gc.freeze()  # the test process's own objects out of the zeros' workers' collections (as ShardDataset's)
    try:
        blank, _ = epochs_pss(Blank(n))
        anon, mapped = epochs_pss(dataset, tmp_path / "s")
    finally:
        gc.unfreeze()
    assert 0.5 * split_bytes <= mapped <= 1.05 * split_bytes, f"{mapped:,} bytes of the split's pages held"
    # (the workers' heaps keep some of the batches they gathered and collated; one copy of the
    # split each would be three)
    assert anon - blank <= 1.0 * split_bytes, f"the workers' memory grew {anon - blank:,} bytes more than over zeros"


def test_a_shard_switched_to_pread_reads_the_file_it_mapped(tmp_path):
    """`use_pread` (what a worker does with a shard mapped before it started) reads the same
    values; where the path now holds another file, the shard keeps reading the one it checked."""
    sample = Sample((Field("x", "int32", ()),))
    write_split(
        {"x": np.arange(40, dtype=np.int32)},
        tmp_path / "s",
        sample=sample,
        dataset="d",
        split="train",
        samples_per_shard=16,
    )
    split = MappedSplit(tmp_path / "s")
    before = split.take([3, 20, 39])["x"]
    for number in range(3):
        split.shard(number).use_pread()
    assert all(split.shard(n).fd is not None for n in range(3))
    assert np.array_equal(split.take([3, 20, 39])["x"], before)

    other = MappedSplit(tmp_path / "s")
    other.take([3])
    write_split(
        {"x": np.arange(40, dtype=np.int32) + 100},
        tmp_path / "t",
        sample=sample,
        dataset="d",
        split="train",
        samples_per_shard=16,
    )
    name = other.manifest["shards"][0]["file"]
    os.replace(tmp_path / "t" / name, tmp_path / "s" / name)
    other.shard(0).use_pread()
    assert other.shard(0).fd is None
    assert other.take([3])["x"].tolist() == [3]

    # a link in the shard's place, even to the very file mapped, is not opened: the map stays
    linked = MappedSplit(tmp_path / "s")
    linked.take([20])
    second = tmp_path / "s" / linked.manifest["shards"][1]["file"]
    os.replace(second, tmp_path / "kept")
    os.symlink(tmp_path / "kept", second)
    linked.shard(1).use_pread()
    assert linked.shard(1).fd is None and linked.take([20])["x"].tolist() == [20]


class Frozen(ShardDataset):
    """A ShardDataset whose samples carry how many objects the process's gc holds frozen."""

    def __getitems__(self, indices):
        import gc

        return [(*sample, gc.get_freeze_count()) for sample in super().__getitems__(indices)]


@pytest.mark.slow
def test_freeze_inherited_is_a_worker_init_fn_for_your_own_dataloader(tmp_path):
    """Given as worker_init_fn, `freeze_inherited` freezes the objects a worker inherited
    from its parent (so its collections do not copy the parent's pages); without it, reading
    a ShardDataset changes no process's gc; the parent's gc is left as it was either way."""
    import gc

    from pipeline.shards import freeze_inherited

    write_split(
        {"x": np.arange(40, dtype=np.int32)},
        tmp_path / "s",
        sample=Sample((Field("x", "int32", ()),)),
        dataset="d",
        split="train",
        samples_per_shard=16,
    )
    before = gc.get_freeze_count()
    [[_, frozen]] = DataLoader(Frozen(tmp_path / "s"), batch_size=40, num_workers=1, worker_init_fn=freeze_inherited)
    assert (frozen > 1000).all(), frozen
    assert gc.get_freeze_count() == before
    [[_, frozen]] = DataLoader(Frozen(tmp_path / "s"), batch_size=40, num_workers=1)
    assert (frozen == before).all(), "reading the dataset froze a worker's objects"
    [[_, frozen]] = DataLoader(Frozen(tmp_path / "s"), batch_size=40, num_workers=0)
    assert (frozen == before).all(), "the main process froze its objects"


FORKSERVER_PROBE = """
import os, sys
from pathlib import Path
import numpy as np
from pipeline.shards import Field, Sample, ShardDataset, write_split
root, preload = Path(sys.argv[1]), sys.argv[2] == "1"
write_split({"x": np.arange(40, dtype=np.int32)}, root, sample=Sample((Field("x", "int32", ()),)), dataset="d",
            split="train", samples_per_shard=16)
loader = ShardDataset(root).loader(8, num_workers=1, multiprocessing_context="forkserver", preload=preload)
assert sorted(int(v) for (x,) in loader for v in x) == list(range(40))
def ours(pid):  # a child of this process whose command line names the fork server
    try:  # (another process on the host may end between the listing and the read)
        parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        return parent == os.getpid() and b"forkserver" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return False
[server] = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and ours(p.name)]
print("torch in the fork server:", "libtorch_cpu" in Path(f"/proc/{server}/maps").read_text())
"""


@pytest.mark.slow
@pytest.mark.parametrize("preload", [True, False])
def test_workers_started_by_forkserver_share_the_servers_torch_unless_told_not_to(tmp_path, preload):
    """Under forkserver the loader asks the fork server to import it (torch with it) before
    the server starts, so that every worker shares that one import instead of holding its
    own; `preload=False` leaves the server as Python starts it, without torch."""
    done = subprocess.run(
        [sys.executable, "-c", FORKSERVER_PROBE, str(tmp_path / "s"), str(int(preload))],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"torch in the fork server: {preload}" in done.stdout


def test_the_forkserver_preload_is_asked_for_only_where_workers_start_by_forkserver(monkeypatch):
    import multiprocessing

    from pipeline.shards import preload_forkserver
    from pipeline.shards.dataset import FORKSERVER_PRELOAD, start_method

    asked = []
    monkeypatch.setattr(multiprocessing, "set_forkserver_preload", asked.append)
    assert not preload_forkserver("fork") and not preload_forkserver(multiprocessing.get_context("spawn"))
    assert asked == []
    assert preload_forkserver(multiprocessing.get_context("forkserver")) and asked == [FORKSERVER_PRELOAD]
    assert "pipeline.shards.dataset" in FORKSERVER_PRELOAD and "__main__" in FORKSERVER_PRELOAD
    assert start_method(None) == multiprocessing.get_start_method()


def _file_pages() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[2]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs Linux's /proc")
def test_a_split_reads_within_a_memory_bound(tmp_path):
    """A 32 MB split read in shuffled batches with max_resident: this process's file pages do
    not grow (the split is read with pread, nothing of it mapped in), and the batches are the
    mapped reader's; without the bound the touched pages stay mapped in."""
    n = 40_000
    rng = np.random.default_rng(0)
    values = rng.integers(0, 256, (n, 800), dtype=np.uint8)
    write_split(
        {"v": values},
        tmp_path / "s",
        sample=Sample((Field("v", "uint8", (800,)),)),
        dataset="d",
        split="train",
        samples_per_shard=8192,
    )
    order = np.random.default_rng(1).permutation(n)
    for bound, within in ((4 << 20, True), (None, False)):
        split = MappedSplit(tmp_path / "s", max_resident=bound)
        split.take(order[:1])
        base, peak = _file_pages(), 0
        for start in range(0, n, 256):
            batch = split.take(order[start : start + 256])["v"]
            peak = max(peak, _file_pages() - base)
        assert np.array_equal(batch, values[order[start : start + 256]])
        assert (peak <= 1 << 20) is within, peak
        del split


# --- parallel writes ---------------------------------------------------------------------------


def _write_part(args) -> None:
    folder, first, n = args
    columns = mixed_columns(230)
    write_part(
        {k: v[first : first + n] for k, v in columns.items()},
        folder,
        first_sample=first,
        sample=MIXED,
        dataset="mixed",
        split="train",
        samples_per_shard=64,
        total=230,
    )


@pytest.mark.slow
def test_parts_written_by_several_processes_merge_into_the_single_writers_bytes(mixed, tmp_path):
    import concurrent.futures
    import multiprocessing

    root, _ = mixed
    for plan in ([(0, 128), (128, 102)], [(0, 64), (64, 64), (128, 64), (192, 38)]):
        folder = tmp_path / f"parts{len(plan)}"
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(2, mp_context=context) as pool:
            list(pool.map(_write_part, [(folder, first, n) for first, n in plan]))
        merge_parts(folder)
        files = sorted(p.name for p in folder.iterdir())
        assert files == sorted(p.name for p in (root / "none").iterdir())
        for name in files:
            assert (folder / name).read_bytes() == (root / "none" / name).read_bytes(), name


@pytest.mark.parametrize(
    "plan, message",
    [
        ([(0, 64), (128, 102)], "starts at sample 128, expected 64 (a part missing or overlapping)"),
        ([(0, 100), (100, 130)], "ValueError"),
        ([(64, 64)], "starts at sample 64, expected 0"),
    ],
)
def test_parts_that_do_not_tile_the_split_are_refused_and_nothing_is_merged(tmp_path, plan, message):
    folder = tmp_path / "p"
    try:
        for first, n in plan:
            _write_part((folder, first, n))
    except ValueError as err:  # a part that does not start on a shard boundary: refused by the writer
        assert message == "ValueError" and "multiple of samples_per_shard" in str(err)
        return
    with pytest.raises(ShardError, match=re.escape(message)):
        merge_parts(folder)
    assert not (folder / "manifest.json").exists()


def test_parts_that_disagree_are_refused(tmp_path):
    columns = mixed_columns(128)
    write_part(
        {k: v[:64] for k, v in columns.items()},
        tmp_path,
        first_sample=0,
        sample=MIXED,
        dataset="mixed",
        split="train",
        samples_per_shard=64,
        total=128,
    )
    write_part(
        {k: v[64:] for k, v in columns.items()},
        tmp_path,
        first_sample=64,
        sample=MIXED,
        dataset="other",
        split="train",
        samples_per_shard=64,
    )
    with pytest.raises(ShardError, match="dataset 'other' differs from the first part's 'mixed'"):
        merge_parts(tmp_path)


# --- the docs' code ----------------------------------------------------------------------------


@pytest.mark.slow  # (starts the CLI in a process)
def test_the_code_blocks_of_docs_shards_md_run(tmp_path):
    text = (ROOT / "docs" / "shards.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 4
    script = tmp_path / "docs_shards.py"
    script.write_text("\n".join(blocks))
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_loop_that_breaks_and_iterates_again_continues_where_it_stopped(mixed):
    """`for batch in loader` after a `break` goes on with the next batch of the same epoch
    (the batches the loop took are not given again), for both batched paths."""
    root, columns = mixed
    data = ShardDataset(root / "none")
    labels = torch.from_numpy(columns["label"])
    paths = {
        "loader": lambda: data.loader(16, shuffle=True, seed=5),
        "device": lambda: DeviceBatches({"label": labels}, 16, shuffle=True, seed=5),
    }
    for name, make in paths.items():
        whole = make()
        expected = torch.cat([whole.indices.cpu() for _ in whole])
        loader, seen = make(), []
        for stop in (3, 5):
            for step, _ in enumerate(loader):
                seen.append(loader.indices.cpu())
                if step + 1 == stop:
                    break
        seen += [loader.indices.cpu() for _ in loader]
        assert torch.equal(torch.cat(seen), expected), name
        assert loader.epoch == 1, name


def test_the_defaults_are_in_order_from_seed_0_and_options_reach_the_dataloader(mixed):
    root, columns = mixed
    data = ShardDataset(root / "none")
    assert np.array_equal(np.concatenate(list(data.sampler(16))), np.arange(230))  # no shuffle by default
    assert np.array_equal(
        np.concatenate(list(data.sampler(16, shuffle=True))),
        np.concatenate(list(data.sampler(16, shuffle=True, seed=0))),
    )
    loader = data.loader(16, shuffle=True, timeout=7, prefetch_factor=None)
    assert loader.dataloader.timeout == 7
    assert loader.state_dict()["seed"] == 0 and data.sampler(16).state_dict()["seed"] == 0
    labels = torch.from_numpy(columns["label"])
    default = torch.cat([y for (y,) in DeviceBatches({"label": labels}, 16, shuffle=True)])
    assert torch.equal(default, torch.cat([y for (y,) in DeviceBatches({"label": labels}, 16, shuffle=True, seed=0)]))


def test_device_batches_shuffle_by_shards_as_the_sampler_does(mixed):
    """DeviceBatches with shuffle="shards" takes the split's shard counts, and its order is
    the ShardSampler's over the same shards."""
    root, columns = mixed
    data = ShardDataset(root / "none")
    labels = torch.from_numpy(columns["label"])
    batches = DeviceBatches({"label": labels}, 16, shuffle="shards", seed=2, shard_counts=data.shard_counts)
    order = data.sampler(16, shuffle="shards", seed=2).order(0)
    assert torch.equal(torch.cat([y for (y,) in batches]), labels[torch.from_numpy(order)])
    with pytest.raises(ValueError, match="needs the shard_counts"):
        DeviceBatches({"label": labels}, 16, shuffle="shards")


def test_device_batches_refuse_fields_on_two_devices():
    """Every field of DeviceBatches is indexed by one index tensor, so all must be on one
    device (a `meta` tensor stands in for a second device on a machine without one)."""
    columns = {"x": torch.zeros(8, 2), "y": torch.zeros(8, device="meta")}
    with pytest.raises(ValueError, match=r"fields on several devices: \['cpu', 'meta'\]"):
        DeviceBatches(columns, 4)


def _freeze_count(columns):
    """A transform that adds how many objects the reading process has frozen (gc.freeze)."""
    count = len(next(iter(columns.values())))
    return {**columns, "frozen": torch.full((count,), gc.get_freeze_count())}


def test_a_worker_freezes_what_it_inherited_and_the_main_process_does_not(mixed):
    """A DataLoader worker freezes the objects it inherited before its first batch, so that its
    collections leave the parent's pages shared; the main process's collections are left as
    they are."""
    root, _ = mixed
    data = ShardDataset(root / "none", transform=_freeze_count)
    before = gc.get_freeze_count()
    assert int(data.batch([0, 1])[-1][0]) == before and gc.get_freeze_count() == before
    counts = torch.cat([fields[-1] for fields in data.loader(64, num_workers=1)])
    assert int(counts.min()) > before  # every batch the worker read, from its first
    assert gc.get_freeze_count() == before
    counts = torch.cat([fields[-1] for fields in data.loader(64, num_workers=1, freeze=False)])
    assert int(counts.max()) == before  # the opt-out: the worker's gc as it was


def test_the_forwarded_order_keywords_are_the_samplers_own():
    """`Order` names the keywords that `ShardDataset.sampler`, `.loader` and `DeviceBatches`
    pass on to `ShardSampler`; `loader` picks them out of its keywords by those names, so a
    keyword the sampler gains and `Order` lacks would go to the DataLoader instead. Every
    keyword-only argument of the sampler but the split's own shard counts is in it."""
    import inspect

    keywords = {
        name
        for name, parameter in inspect.signature(ShardSampler).parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY
    }
    assert set(Order.__annotations__) == keywords - {"shard_counts"}


@pytest.mark.slow
def test_a_worker_that_reopens_a_split_a_writer_replaced_refuses_it(tmp_path):
    """A spawned DataLoader worker opens the split again from its path: one a writer replaced
    since the dataset opened it is refused with a ShardError (the main process's sampler still
    counts the old split), never read as the new writer's samples."""
    sample = Sample((Field("v", "int64", ()),))
    path = tmp_path / "s"
    write_split({"v": np.full(40, 1)}, path, sample=sample, dataset="d", split="s", samples_per_shard=10)
    data = ShardDataset(path)
    loader = lambda: data.loader(20, num_workers=1, multiprocessing_context="spawn")  # noqa: E731
    assert [x.tolist() for (x,) in loader()] == [[1] * 20] * 2  # the same split: read as it is
    write_split({"v": np.full(40, 2)}, path, sample=sample, dataset="d", split="s", samples_per_shard=10)
    with pytest.raises(ShardError, match=r"replaced by a writer since it was opened in the process that sent it"):
        list(loader())
