"""The race: the project's shards against the loaders users pick (LitData, MosaicML Streaming,
WebDataset, Lance), on MNIST train at 1x and 10x.

    make peers                                  # its own venv (.venv-peers), then this
    python benchmarks/peers.py --scales 1 10 --out results/peers
    python benchmarks/peers.py --tiny 2000 --scales 1 --repeat 1 --out /tmp/p   # the test's run

Every measurement runs in its own process (imports excluded from the timings, one torch
thread, `--repeat` runs, min and median kept; peak memory is the process's max RSS), on
data each system wrote itself with comparable settings: ~4 MB shards (blocks, chunks,
files), uncompressed and zstd. Every sample carries an int64 `id` (its index in the
split) besides its uint8 [28, 28] image and uint8 label, so that the rank measurements can
tell which samples each rank saw; the 8 bytes per sample are the same for all.

What is measured (per system, where it has the feature; "-" where it does not):
- write: seconds to write the split into a fresh folder (an earlier run's output is removed
  before the clock starts), uncompressed and zstd (hashes included where the system records
  them: the project's sha256 + xxh3), and its size on disk;
- epoch: one shuffled epoch of float batches of 512 ([b, 1, 28, 28] in 0..1 and int64
  labels), workers 0, 2 and 4, from the loader's first batch to its last; with 4 workers also
  the peak PSS summed over the process and its workers (the project: a plain DataLoader over
  its ShardDataset, `freeze_inherited` its worker_init_fn, `preload_forkserver` called
  first), which counts a page shared by several processes once, and apart its anonymous part
  (`Pss_Anon`: what the kernel cannot drop) and its file-backed part (`Pss_File`: the page
  cache the maps read); every system's workers start as `--start-method` says (the
  process's default start method is set to it, as on a platform whose default it is);
- first batch: from opening the data set to the first shuffled float batch of 512;
- random batches: batches of 256 samples at random indices, samples per second;
- ranks 2/4/8: per rank, the steps of one epoch (batch 64), samples dropped or repeated
  across ranks, shuffle quality (distinct source blocks in a batch of 64, a block being a
  shard's worth of consecutive samples, ~5,300: a full shuffle sees nearly all of them),
  and determinism (the same seed gives the same order; the next epoch another). LitData's
  ranks are real processes of one gloo process group (it asks torch.distributed who it is).

Results: <out>/scale-<k>.json (every run's figures), <out>/table.md (min / median; the page
includes it: refill it with `python tools/record_commands.py --refill`) and <out>/history.md
(every command that measured or re-measured a scale).
"""

from __future__ import annotations

import argparse
import gzip
import importlib.machinery
import importlib.util
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the project's library, whatever the venv

SHARD_BYTES = 4 << 20  # ~4 MB shards for everyone
EPOCH_BATCH, RANDOM_BATCH, RANK_BATCH = 512, 256, 64
SEED = 7


# ---- the data ---------------------------------------------------------------------------


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (gzip) as a uint8 array: MNIST's own format, read with numpy alone."""
    raw = gzip.decompress(path.read_bytes())
    dims = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * dims).reshape(shape)


def make_data(work: Path, scale: int, mnist: Path | None, tiny: int | None) -> Path:
    """images [n, 28, 28] uint8, labels [n] uint8, ids [n] int64 in <work>/data.npz: MNIST
    train tiled `scale` times, or `tiny` random samples."""
    if tiny:
        rng = np.random.default_rng(0)
        images, labels = rng.integers(0, 256, (tiny, 28, 28), dtype=np.uint8), rng.integers(0, 10, tiny, dtype=np.uint8)
    else:
        images = read_idx(mnist / "train-images-idx3-ubyte.gz")
        labels = read_idx(mnist / "train-labels-idx1-ubyte.gz")
    images, labels = np.tile(images, (scale, 1, 1)), np.tile(labels, scale)
    path = work / "data.npz"
    np.savez(path, images=images, labels=labels, ids=np.arange(len(labels), dtype=np.int64))
    return path


def load_data(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    with np.load(path) as data:
        return data["images"], data["labels"], data["ids"]


def per_shard(n: int) -> int:
    return max(1, SHARD_BYTES // (28 * 28 + 1 + 8)) if n > 20_000 else max(1, n // 12)


def to_batch(images, labels):
    """What every system hands the model: float [b, 1, 28, 28] in 0..1, int64 labels."""
    import torch

    x = torch.as_tensor(np.asarray(images)).reshape(-1, 1, 28, 28).float().div_(255)
    return x, torch.as_tensor(np.asarray(labels)).long()


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


# ---- the systems ------------------------------------------------------------------------


class System:
    """What every system shares: its folder under the run's work folder, and where it writes
    a codec's data (removed by the child before a write's clock starts: deleting an earlier
    run's ~500 MB is the kernel freeing pages, not writing, and it took a third of a 10x write)."""

    suffix = ""

    def __init__(self, root: Path) -> None:
        self.root = root

    def output(self, codec: str) -> Path:
        return self.root / f"{codec}{self.suffix}"

    def rank_orders(self, world: int, seed: int) -> tuple[list[list[list[np.ndarray]]], list[np.ndarray]]:
        """The batches' ids of every rank in epochs 0 and 1, and of rank 0 in epoch 0 again from
        a fresh start (`rank_report`); here from the system's `rank_ids`, one rank at a time."""
        epochs = [[self.rank_ids(world, rank, epoch, seed) for rank in range(world)] for epoch in (0, 1)]
        return epochs, self.rank_ids(world, 0, 0, seed)


class Project(System):
    """The project's shards (pipeline.shards): ShardDataset.loader, the batched path; a plain
    DataLoader over the ShardDataset for the workers-4 memory row."""

    module = "pipeline.shards"
    imports = ("pipeline.shards.dataset", "pipeline.shards.writer", "torch.utils.data")

    def write(self, data, codec: str) -> Path:
        from pipeline.shards import Field, Sample, write_split

        images, labels, ids = data
        sample = Sample(
            (Field("images", "uint8", (28, 28)), Field("labels", "uint8", (), classes=10), Field("ids", "int64"))
        )
        out = self.output(codec)
        write_split(
            {"images": images, "labels": labels, "ids": ids},
            out,
            sample=sample,
            dataset="mnist",
            split="train",
            samples_per_shard=per_shard(len(ids)),
            compression=codec,
        )
        return out

    def open(self):
        from pipeline.shards import Int64, ShardDataset, UnitFloat

        return ShardDataset(self.output("none"), transform=[UnitFloat("images", add_channel=True), Int64("labels")])

    def batches(self, dataset, batch: int, workers: int, seed: int, epoch: int = 0, plain: bool = False):
        import torch
        from torch.utils.data import DataLoader

        context = {"multiprocessing_context": START_METHOD} if workers and START_METHOD else {}
        if plain:  # what a user who keeps their DataLoader writes, with the helpers docs/shards.md names
            from pipeline.shards import freeze_inherited, preload_forkserver

            if workers:
                preload_forkserver(START_METHOD)
            generator = torch.Generator().manual_seed(seed * 1000 + epoch)
            loader = DataLoader(
                dataset,
                batch_size=batch,
                shuffle=True,
                generator=generator,
                num_workers=workers,
                worker_init_fn=freeze_inherited if workers else None,
                **context,
            )
        else:
            loader = dataset.loader(batch, shuffle=True, seed=seed, num_workers=workers, **context)
            loader.set_epoch(epoch)
        for x, y, _ in loader:
            yield x, y

    def random(self, dataset, index: np.ndarray):
        x, y, _ = dataset.batch(index)
        return x, y

    def rank_ids(self, world: int, rank: int, epoch: int, seed: int) -> list[np.ndarray]:
        loader = self.open().loader(RANK_BATCH, shuffle=True, seed=seed, rank=rank, world_size=world)
        loader.set_epoch(epoch)
        return [ids.numpy() for _, _, ids in loader]


class Lance(System):
    """Lance (pylance): one data set, files of ~4 MB; batches of rows read in a shuffled
    order of 512-row blocks (its torch loader's shuffle), random rows with `take`."""

    module = "lance"
    suffix = ".lance"
    imports = ("lance", "lance.sampler", "pyarrow")

    def write(self, data, codec: str) -> Path:
        import lance
        import pyarrow as pa

        images, labels, ids = data
        flat = pa.FixedSizeListArray.from_arrays(pa.array(images.reshape(-1)), 28 * 28)
        table = pa.table({"image": flat, "label": pa.array(labels), "id": pa.array(ids)})
        out = self.output(codec)
        kwargs = {"max_rows_per_file": per_shard(len(ids))}
        if codec == "zstd":  # Lance reads compression from each leaf field's metadata (the list's item)
            zstd = {"lance-encoding:compression": "zstd"}
            schema = pa.schema(
                [
                    pa.field("image", pa.list_(pa.field("item", pa.uint8(), metadata=zstd), 28 * 28)),
                    pa.field("label", pa.uint8(), metadata=zstd),
                    pa.field("id", pa.int64(), metadata=zstd),
                ]
            )
            table = table.cast(schema)
            kwargs["data_storage_version"] = "2.1"  # the file version whose encoder takes general compression
        lance.write_dataset(table, out, **kwargs)
        return out

    def open(self):
        import lance

        return lance.dataset(self.output("none"))

    def batches(self, dataset, batch: int, workers: int, seed: int, epoch: int = 0):
        rng = np.random.default_rng(seed * 1000 + epoch)
        n = dataset.count_rows()
        starts = rng.permutation(np.arange(0, n, batch))  # block shuffle: whole 512-row ranges
        for start in starts:
            table = dataset.take(np.arange(start, min(n, start + batch)), columns=["image", "label"])
            yield to_batch(table.column("image").combine_chunks().values.to_numpy(), table.column("label").to_numpy())

    def random(self, dataset, index: np.ndarray):
        table = dataset.take(np.sort(index), columns=["image", "label"])
        return to_batch(table.column("image").combine_chunks().values.to_numpy(), table.column("label").to_numpy())

    def rank_ids(self, world: int, rank: int, epoch: int, seed: int) -> list[np.ndarray]:
        from lance.sampler import ShardedBatchSampler

        dataset = self.open()
        sampler = ShardedBatchSampler(rank, world, randomize=True, seed=seed)
        out = []
        for table in sampler(dataset, batch_size=RANK_BATCH, columns=["id"]):
            out.append(table.column("id").to_numpy())
        return out


class LitData(System):
    """LitData: `optimize` into ~4 MB chunks, `StreamingDataset` + `StreamingDataLoader`."""

    module = "litdata"
    imports = ("litdata",)

    def write(self, data, codec: str) -> Path:
        import litdata

        images, labels, ids = data
        out = self.output(codec)
        litdata.optimize(
            fn=_litdata_sample,
            inputs=[(images[i], int(labels[i]), int(ids[i])) for i in range(len(ids))],
            output_dir=str(out),
            chunk_bytes="4MB",
            num_workers=1,
            compression="zstd" if codec == "zstd" else None,
            mode="overwrite",
        )
        return out

    def open(self, shuffle: bool = True, seed: int = SEED):
        import litdata

        return litdata.StreamingDataset(str(self.output("none")), shuffle=shuffle, seed=seed)

    def batches(self, dataset, batch: int, workers: int, seed: int, epoch: int = 0):
        import litdata

        loader = litdata.StreamingDataLoader(dataset, batch_size=batch, num_workers=workers)
        for images, labels, _ in loader:
            yield to_batch(images, labels)

    def random(self, dataset, index: np.ndarray):
        samples = [dataset[int(i)] for i in index]
        return to_batch(np.stack([s[0] for s in samples]), np.array([s[1] for s in samples]))

    def rank_orders(self, world: int, seed: int) -> tuple[list[list[list[np.ndarray]]], list[np.ndarray]]:
        """`System.rank_orders` from `world` real processes, each a rank of one gloo process
        group (where LitData asks torch.distributed who it is)."""
        with tempfile.TemporaryDirectory(prefix="litdata-ranks-") as tmp:
            folder = Path(tmp)
            ranks = [
                subprocess.Popen(
                    [
                        sys.executable,
                        __file__,
                        "--litdata-rank",
                        str(world),
                        str(rank),
                        "--work",
                        str(self.root.parent),
                        "--out",
                        str(folder),
                        "--seed",
                        str(seed),
                    ],
                    stdout=subprocess.DEVNULL,
                )  # (the race reads the child's stdout)
                for rank in range(world)
            ]
            try:
                codes = [rank.wait(timeout=600) for rank in ranks]
            finally:
                for rank in ranks:
                    rank.kill()
            if any(codes):
                raise RuntimeError(f"a LitData rank failed: exit statuses {codes}")
            orders = [np.load(folder / f"rank-{rank}.npz") for rank in range(world)]
            epochs = [
                [_batches(order[f"epoch{epoch}"], order[f"sizes{epoch}"]) for order in orders] for epoch in (0, 1)
            ]
            again = _batches(orders[0]["again"], orders[0]["sizes_again"])
        return epochs, again


def _batches(ids: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
    return np.split(ids, np.cumsum(sizes)[:-1]) if len(sizes) else []


def litdata_rank(world: int, rank: int, root: Path, out: Path, seed: int) -> None:
    """One LitData rank of `world` (gloo on the CPU): the ids of its batches in epochs 0 and
    1 of one loader (it counts its epochs itself), and in epoch 0 of a fresh one."""
    import datetime

    import litdata
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"file://{out}/rendezvous",
        world_size=world,
        rank=rank,
        timeout=datetime.timedelta(seconds=300),
    )
    try:
        folder = str(LitData(root / "litdata").output("none"))

        def loader():
            dataset = litdata.StreamingDataset(folder, shuffle=True, seed=seed)
            return litdata.StreamingDataLoader(dataset, batch_size=RANK_BATCH, num_workers=0)

        first = loader()
        found = {}
        for epoch in (0, 1):
            batches = [np.asarray(ids) for _, _, ids in first]
            found[f"epoch{epoch}"], found[f"sizes{epoch}"] = _joined(batches)
        found["again"], found["sizes_again"] = _joined([np.asarray(ids) for _, _, ids in loader()])
        np.savez(out / f"rank-{rank}.npz", **found)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _joined(batches: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    return (np.concatenate(batches) if batches else np.empty(0, np.int64)), np.array([len(b) for b in batches])


def _litdata_sample(item):
    image, label, index = item
    return image, label, index


def torchvision_or_stub() -> None:
    """`import streaming` imports its vision module, which imports torchvision; PyPI's
    torchvision for this torch is not built for the CPU wheel and fails on import ("operator
    torchvision::nms does not exist"). Then the two names streaming.vision takes at import
    stand in (the race uses none of them)."""
    import types

    try:
        import torchvision  # noqa: F401
    except (RuntimeError, ImportError):
        import torch.utils.data

        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        stub = {
            name: types.ModuleType(name)
            for name in (
                "torchvision",
                "torchvision.datasets",
                "torchvision.transforms",
                "torchvision.transforms.functional",
            )
        }
        for name, module in stub.items():
            module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        stub["torchvision.datasets"].VisionDataset = torch.utils.data.Dataset
        stub["torchvision.transforms.functional"].to_tensor = None
        stub["torchvision"].datasets, stub["torchvision"].transforms = (
            stub["torchvision.datasets"],
            stub["torchvision.transforms"],
        )
        stub["torchvision.transforms"].functional = stub["torchvision.transforms.functional"]
        sys.modules.update(stub)


class Streaming(System):
    """MosaicML Streaming: `MDSWriter` (~4 MB shards), `StreamingDataset` (py1e shuffle)."""

    module = "streaming"
    imports = ("torch.utils.data",)

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        torchvision_or_stub()
        import streaming  # noqa: F401

    def write(self, data, codec: str) -> Path:
        from streaming import MDSWriter

        images, labels, ids = data
        out = self.output(codec)
        columns = {"image": "ndarray:uint8:28,28", "label": "uint8", "id": "int64"}
        with MDSWriter(
            out=str(out),
            columns=columns,
            compression="zstd" if codec == "zstd" else None,
            size_limit=SHARD_BYTES,
            progress_bar=False,
        ) as writer:
            for i in range(len(ids)):
                writer.write({"image": images[i], "label": labels[i], "id": ids[i]})
        return out

    def open(self, seed: int = SEED):
        from streaming import StreamingDataset
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
        return StreamingDataset(local=str(self.output("none")), shuffle=True, shuffle_seed=seed, batch_size=EPOCH_BATCH)

    def batches(self, dataset, batch: int, workers: int, seed: int, epoch: int = 0):
        from torch.utils.data import DataLoader

        for sample in DataLoader(dataset, batch_size=batch, num_workers=workers):
            yield to_batch(sample["image"], sample["label"])

    def random(self, dataset, index: np.ndarray):
        samples = [dataset.get_item(int(i)) for i in index]
        return to_batch(np.stack([s["image"] for s in samples]), np.array([s["label"] for s in samples]))


class WebData(System):
    """WebDataset: tar shards of ~4 MB (`ShardWriter`), shard shuffle + a 1,000-sample buffer."""

    module = "webdataset"
    imports = ("webdataset", "torch.utils.data")

    def write(self, data, codec: str) -> Path:
        if codec != "none":
            raise NotImplementedError("WebDataset writes no compressed shards of its own")
        import webdataset as wds

        images, labels, ids = data
        out = self.output(codec)
        out.mkdir(parents=True)
        with wds.ShardWriter(str(out / "shard-%06d.tar"), maxsize=SHARD_BYTES, verbose=0) as sink:
            for i in range(len(ids)):
                sink.write(
                    {"__key__": f"{i:09d}", "image.npy": images[i], "label.cls": int(labels[i]), "id.cls": int(ids[i])}
                )
        return out

    def _urls(self) -> list[str]:
        return sorted(str(p) for p in (self.output("none")).glob("*.tar"))

    def open(self, seed: int = SEED):
        import webdataset as wds

        return (
            wds.WebDataset(self._urls(), shardshuffle=len(self._urls()), seed=seed, empty_check=False)
            .shuffle(1000)
            .decode()
            .to_tuple("image.npy", "label.cls", "id.cls")
        )

    def batches(self, dataset, batch: int, workers: int, seed: int, epoch: int = 0):
        from torch.utils.data import DataLoader

        for images, labels, _ in DataLoader(dataset.batched(batch), batch_size=None, num_workers=workers):
            yield to_batch(images, labels)

    def rank_ids(self, world: int, rank: int, epoch: int, seed: int) -> list[np.ndarray]:
        import webdataset as wds

        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world))
        dataset = (
            wds.WebDataset(
                self._urls(),
                shardshuffle=len(self._urls()),
                seed=seed + epoch,
                nodesplitter=wds.split_by_node,
                empty_check=False,
            )
            .shuffle(1000)
            .decode()
            .to_tuple("id.cls")
            .batched(RANK_BATCH)
        )
        return [np.asarray(batch[0]) for batch in dataset]


SYSTEMS = {"project": Project, "litdata": LitData, "streaming": Streaming, "webdataset": WebData, "lance": Lance}
LABELS = {
    "project": "project",
    "litdata": "LitData",
    "streaming": "MosaicML Streaming",
    "webdataset": "WebDataset",
    "lance": "Lance",
}


def installed(name: str) -> bool:
    return importlib.util.find_spec(SYSTEMS[name].module) is not None


# ---- one measurement, in its own process -------------------------------------------------


def peak_mb() -> float:
    """This process's peak resident memory (VmHWM: getrusage's ru_maxrss would carry the
    parent's peak across fork and exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


PSS_KEYS = {"Pss:": "total", "Pss_Anon:": "anon", "Pss_File:": "file"}


def tree_pss() -> dict[str, int]:
    """PSS in bytes summed over this process and every process below it (DataLoader workers),
    from each one's /proc/<pid>/smaps_rollup: `total`, and apart, `anon` (anonymous pages:
    what the kernel cannot drop, only swap) and `file` (file-backed pages, such as the page
    cache a map reads, which the kernel may drop and read again). Shared pages are divided
    among their sharers, so each sum counts a page once."""
    me, total = os.getpid(), dict.fromkeys(PSS_KEYS.values(), 0)
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    tree, grew = {me}, True
    while grew:
        grown = {pid for pid, parent in parents.items() if parent in tree} | tree
        grew, tree = grown != tree, grown
    for pid in tree:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                key = PSS_KEYS.get(line.split(maxsplit=1)[0] if line else "")
                if key:
                    total[key] += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


class TreePss:
    """The peak of each of `tree_pss`'s sums while the block runs (each its own peak), sampled
    every 50 ms on a thread."""

    def __enter__(self):
        import threading

        self.start = tree_pss()
        self.peak = dict(self.start)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        now = tree_pss()
        self.peak = {key: max(value, now[key]) for key, value in self.peak.items()}

    def _watch(self) -> None:
        while not self._stop.wait(0.05):
            self._sample()

    def __exit__(self, *exc) -> None:
        self._sample()
        self._stop.set()
        self._thread.join()


START_ENV = "PEERS_START_METHOD"
START_METHOD = os.environ.get(START_ENV) or None  # every system's workers' start method; None: the platform's


def child(system: str, task: str, work: Path, data_path: Path) -> dict:
    import multiprocessing

    import torch

    torch.set_num_threads(1)
    if START_METHOD:  # every system's workers start so, as on a platform whose default it is
        multiprocessing.set_start_method(START_METHOD, force=True)
    root = work / system
    impl = SYSTEMS[system](root)
    for module in impl.imports:  # imported before any clock starts
        importlib.import_module(module)
    if task.startswith("write-"):
        codec = task.removeprefix("write-")
        data = load_data(data_path)
        if impl.output(codec).exists():  # an earlier run's: every system writes into a fresh folder
            shutil.rmtree(impl.output(codec))
        os.sync()
        start = time.perf_counter()
        out = impl.write(data, codec)
        return {"seconds": time.perf_counter() - start, "bytes": folder_bytes(out)}
    if task == "first":
        start = time.perf_counter()
        dataset = impl.open()
        next(iter(impl.batches(dataset, EPOCH_BATCH, 0, SEED)))
        return {"seconds": time.perf_counter() - start}
    if task.startswith("epoch-"):
        workers = int(task.removeprefix("epoch-"))
        dataset = impl.open()
        count = 0
        options = {"plain": True} if workers == 4 and system == "project" else {}
        with TreePss() as pss:
            start = time.perf_counter()
            for x, y in impl.batches(dataset, EPOCH_BATCH, workers, SEED, **options):
                count += len(y)
            seconds = time.perf_counter() - start
        return {
            "seconds": seconds,
            "samples": count,
            "peak_mb": peak_mb(),
            "pss_mb": pss.peak["total"] / 1e6,
            "pss_start_mb": pss.start["total"] / 1e6,
            "pss_anon_mb": pss.peak["anon"] / 1e6,
            "pss_file_mb": pss.peak["file"] / 1e6,
            "start_method": START_METHOD,
        }
    if task == "random":
        dataset = impl.open()
        n = len(load_data(data_path)[2])
        rng = np.random.default_rng(SEED)
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < 3 and count < 200 * RANDOM_BATCH:
            x, y = impl.random(dataset, rng.integers(0, n, RANDOM_BATCH))
            count += len(y)
        return {"samples_per_s": count / (time.perf_counter() - start)}
    if task.startswith("ranks-"):
        world = int(task.removeprefix("ranks-"))
        n = len(load_data(data_path)[2])
        return rank_report(impl, world, n)
    raise ValueError(f"unknown task {task!r}")


def rank_report(impl, world: int, n: int) -> dict:
    """Steps per rank, samples dropped/repeated, source blocks per batch, determinism."""
    epochs, again = impl.rank_orders(world, SEED)
    first = epochs[0]
    seen = np.concatenate([np.concatenate(batches) for batches in first if batches])
    counts = np.bincount(seen, minlength=n)
    block = per_shard(n)
    blocks = [len(np.unique(batch // block)) for batches in first for batch in batches if len(batch) == RANK_BATCH]
    order = lambda ranks: np.concatenate(ranks[0]) if ranks[0] else np.empty(0)  # noqa: E731
    return {
        "steps": [len(batches) for batches in first],
        "dropped": int((counts == 0).sum()),
        "repeated": int((counts > 1).sum()),
        "blocks_per_batch": float(np.mean(blocks)) if blocks else 0.0,
        "blocks": int(np.ceil(n / block)),
        "same_order_same_seed": bool(np.array_equal(np.concatenate(again) if again else np.empty(0), order(first))),
        "new_order_next_epoch": not np.array_equal(order(epochs[1]), order(first)),
    }


# ---- the race ---------------------------------------------------------------------------

TASKS = [
    "write-none",
    "write-zstd",
    "first",
    "epoch-0",
    "epoch-2",
    "epoch-4",
    "random",
    "ranks-2",
    "ranks-4",
    "ranks-8",
]
WHAT = {  # what each system cannot do, so it is not run
    "webdataset": {"write-zstd", "random"},
    "streaming": {"ranks-2", "ranks-4", "ranks-8"},  # its ranks coordinate through shared memory: real processes
    "lance": {"epoch-2", "epoch-4"},  # its reads are its own threads, not DataLoader workers
}


def run_one(system: str, task: str, work: Path, data: Path, timeout: float) -> dict:
    command = [sys.executable, __file__, "--child", system, task, "--work", str(work), "--data", str(data)]
    os.sync()  # no run waits on, or reads beside, the writeback of an earlier run's dirty pages
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": tail[:200]}
    return json.loads(lines[-1])


def race(
    scale: int,
    systems: list[str],
    tasks: list[str],
    repeat: int,
    work: Path,
    data: Path,
    timeout: float,
    interleave: bool = False,
) -> dict:
    """Every (system, task) run `repeat` times (ranks once), writes first: the reads use what
    they wrote. System by system, so that each system's reads find its data in the page cache;
    with `interleave`, each read task's runs go round the systems in turn instead, so that a
    slow spell of a shared host falls on all of them alike (for systems whose data fit in the
    page cache together)."""
    plan = [
        (system, task)
        for system in systems
        for task in sorted(tasks, key=TASKS.index)
        if task not in WHAT.get(system, set())
    ]

    def runs(task: str) -> int:
        return 1 if task.startswith("ranks-") else repeat

    if interleave:  # TASKS lists the writes first
        order = [
            (system, task)
            for task in sorted({t for _, t in plan}, key=TASKS.index)
            for _ in range(runs(task))
            for system, t in plan
            if t == task
        ]
    else:
        order = [(system, task) for system, task in plan for _ in range(runs(task))]
    results: dict = {system: {} for system in systems}
    for system, task in order:
        figures = results[system].setdefault(task, [])
        figures.append(run_one(system, task, work, data, timeout))
        if len(figures) == runs(task):
            shown = [f.get("seconds", f.get("samples_per_s", f.get("steps", f.get("error")))) for f in figures]
            print(f"x{scale} {system:10s} {task:10s} {shown}", file=sys.stderr, flush=True)
    return results


def _values(figures: list[dict], key: str) -> list[float]:
    return [f[key] for f in figures if key in f]


def spread(figures: list[dict] | None, key: str, digits: int = 2, scale: float = 1.0) -> str:
    if not figures:
        return "-"
    values = _values(figures, key)
    if not values:
        return "failed" if any("error" in f for f in figures) else "n/m"
    low, mid = min(values) * scale, statistics.median(values) * scale
    return f"{low:.{digits}f}" if len(values) == 1 else f"{low:.{digits}f} / {mid:.{digits}f}"


def ranks_cell(figures: list[dict] | None) -> str:
    if not figures:
        return "-"
    f = figures[0]
    if "error" in f:
        return "failed"
    steps = f["steps"]
    step_text = f"{steps[0]}" if len(set(steps)) == 1 else f"unequal {min(steps)}-{max(steps)}"
    return (
        f"steps {step_text}; dropped {f['dropped']}, repeated {f['repeated']}; "
        f"{f['blocks_per_batch']:.1f}/{f['blocks']} blocks per batch; "
        f"{'same' if f['same_order_same_seed'] else 'other'} order for a seed, "
        f"{'new' if f['new_order_next_epoch'] else 'same'} order next epoch"
    )


def runnable(command: str) -> str:
    """A recorded command as it runs today: `--docs PAGE`, an option of an earlier version of
    this script that only refreshed a page (no figure depends on it), left out."""
    return re.sub(r" --docs \S+", "", command)


def remeasures(meta: dict) -> list[str]:
    """One line per command that re-measured some tasks, however often it ran (in the order of
    its first run), with the host's state at the start of each run."""
    hosts: dict[str, list[str]] = {}
    for again in meta.get("remeasured", []):
        hosts.setdefault(runnable(again["command"]), []).append(again["host"])
    return [
        f"Also measured by{f' ({len(runs)} runs)' if len(runs) > 1 else ''}: `{command}` ({'; '.join(runs)})."
        for command, runs in hosts.items()
    ]


def runs_said(results: dict[str, dict[str, list]]) -> str:
    """How many runs the timed cells hold, as the caption says it: the count most cells have,
    then each other count with its cells (a cell of one run shows one figure). The ranks rows
    are checks of one run each, not timings, and are left out."""
    counts = Counter(
        len(figures)
        for tasks in results.values()
        for task, figures in tasks.items()
        if isinstance(figures, list) and figures and not task.startswith("ranks-")
    )
    if not counts:
        return "no runs"
    usual = counts.most_common(1)[0][0]
    others = [
        f"{n} cell{'s' if n > 1 else ''} of {'one run, one figure' if k == 1 else f'{k} runs'}"
        for k, n in sorted(counts.items())
        if k != usual
    ]
    return f"{usual} runs" + (f" ({'; '.join(others)})" if others else "")


def table(runs: dict[int, dict]) -> str:
    lines = []
    for scale, run in runs.items():
        meta, results = run["meta"], run["results"]
        if isinstance(meta["samples"], dict):  # written by the first version of this script
            meta["samples"] = meta["samples"][str(scale)]
        systems = list(results)
        versions = ", ".join(f"{LABELS[s]} {meta['versions'].get(s, '?')}" for s in systems if s != "project")
        lines += [
            f"**MNIST train x{scale}** ({meta['samples']:,} samples): min / median of {runs_said(results)}, "
            f"each its own process, one torch thread; {meta['host']}; torch {meta['torch']}"
            + (f"; {versions}" if versions else "")
            + (f"; not installed: {', '.join(meta['missing'])}" if meta.get("missing") else "")
            + (
                f"; every system's workers started by {meta['start_method']}"
                if meta.get("start_method", "the platform's") != "the platform's"
                else ""
            )
            + "."
        ]
        if meta.get("remeasured"):
            lines += [
                f"Measured by `{runnable(meta['command'])}`, some tasks re-measured since (the commands: "
                f"`results/peers/history.md`)."
            ]
        lines += [""]
        lines.append("| | " + " | ".join(LABELS[s] for s in systems) + " |")
        lines.append("|---|" + "---|" * len(systems))
        rows = [
            ("write, uncompressed (s)", lambda r: spread(r.get("write-none"), "seconds")),
            ("write, zstd (s)", lambda r: spread(r.get("write-zstd"), "seconds")),
            (
                "size uncompressed / zstd (MB)",
                lambda r: (
                    f"{spread(r.get('write-none'), 'bytes', 1, 1e-6).split(' / ')[0]}"
                    f" / {spread(r.get('write-zstd'), 'bytes', 1, 1e-6).split(' / ')[0]}"
                ),
            ),
            ("shuffled epoch, batch 512, workers 0 (s)", lambda r: spread(r.get("epoch-0"), "seconds")),
            ("shuffled epoch, batch 512, workers 2 (s)", lambda r: spread(r.get("epoch-2"), "seconds")),
            ("shuffled epoch, batch 512, workers 4 (s)", lambda r: spread(r.get("epoch-4"), "seconds")),
            ("PSS, parent + 4 workers, peak in that epoch (MB)", lambda r: spread(r.get("epoch-4"), "pss_mb", 0)),
            ("of which anonymous (Pss_Anon, MB)", lambda r: spread(r.get("epoch-4"), "pss_anon_mb", 0)),
            ("of which file-backed (Pss_File, MB)", lambda r: spread(r.get("epoch-4"), "pss_file_mb", 0)),
            ("time to first batch (s)", lambda r: spread(r.get("first"), "seconds", 3)),
            ("peak memory, epoch with workers 0 (MB)", lambda r: spread(r.get("epoch-0"), "peak_mb", 0)),
            ("random batches of 256 (samples/s)", lambda r: spread(r.get("random"), "samples_per_s", 0)),
        ] + [(f"{w} ranks", lambda r, w=w: ranks_cell(r.get(f"ranks-{w}"))) for w in (2, 4, 8)]
        for name, cell in rows:
            lines.append(f"| {name} | " + " | ".join(cell(results[s]) for s in systems) + " |")
        lines.append("")
    lines.append(
        "Shuffles: project, per sample over the whole split; Lance, whole 512-row blocks in a random "
        "order (`take` of row ranges); LitData, chunks in a random order then samples within them; "
        "MosaicML Streaming, py1e; WebDataset, shards in a random order then a 1,000-sample buffer. "
        "Blocks per batch: distinct runs of a shard's worth of consecutive samples in a batch of 64 "
        '(a full shuffle sees nearly all). "-": not run (no such feature: WebDataset has no random '
        "access nor zstd of its own; MosaicML Streaming's ranks need real processes; Lance's reads are "
        'its own threads, not DataLoader workers). "failed": the error is in the JSON. "n/m": not measured '
        "by the runs that filled the cell (the anonymous and file-backed parts of PSS are recorded since "
        "the project's workers read through maps; a run of the epoch-4 task fills them)."
    )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", nargs=2, metavar=("SYSTEM", "TASK"))
    parser.add_argument("--litdata-rank", nargs=2, type=int, metavar=("WORLD", "RANK"))
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--work", type=Path)
    parser.add_argument("--data", type=Path)
    parser.add_argument("--scales", type=int, nargs="+", default=[1, 10])
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS))
    parser.add_argument("--tasks", nargs="+", default=TASKS, choices=TASKS)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tiny", type=int, help="random samples instead of MNIST (for the test)")
    mirror = os.environ.get("PIPELINE_MIRROR")
    parser.add_argument(
        "--mnist",
        type=Path,
        default=Path(mirror) / "mnist" if mirror else None,
        help="a folder of MNIST's IDX files (default: $PIPELINE_MIRROR/mnist)",
    )
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "peers")
    parser.add_argument("--merge", action="store_true", help="update <out>/scale-<k>.json with these tasks only")
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="writes first, then each read task's runs taken in turn across the systems",
    )
    parser.add_argument("--render", action="store_true", help="only render the table from <out>/scale-*.json")
    parser.add_argument(
        "--start-method",
        choices=("fork", "spawn", "forkserver"),
        help="how every system's DataLoader workers start (default: the platform's)",
    )
    args = parser.parse_args()
    if args.start_method:
        os.environ[START_ENV] = args.start_method  # (the children read it)
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args.work, args.data)))
        return
    if args.litdata_rank:
        litdata_rank(*args.litdata_rank, args.work, args.out, args.seed)
        return
    if args.render:
        print(render(args.out))
        return
    if args.tiny is None and args.mnist is None:
        parser.error("--mnist: give MNIST's IDX folder, or set PIPELINE_MIRROR to a folder holding mnist/")
    if "write-none" not in args.tasks and any(not task.startswith("write-") for task in args.tasks):
        parser.error(
            "the read tasks read what write-none writes in this run (into a fresh folder): add write-none to --tasks"
        )
    systems = [s for s in args.systems if installed(s)]
    missing = sorted(set(args.systems) - set(systems))
    if missing:
        print(f"peers: not installed, left out: {missing}", file=sys.stderr)
    import platform

    import torch

    meta = {
        "command": "python benchmarks/peers.py " + " ".join(sys.argv[1:]),
        "repeat": args.repeat,
        "host": f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "versions": {s: _version(s) for s in systems},
        "missing": missing,
        "start_method": args.start_method or "the platform's",
    }
    args.out.mkdir(parents=True, exist_ok=True)
    for scale in args.scales:
        with tempfile.TemporaryDirectory(prefix=f"peers-x{scale}-") as tmp:
            work = Path(tmp)
            data = make_data(work, scale, args.mnist, args.tiny)
            run = {
                "meta": {**meta, "samples": len(load_data(data)[2])},
                "results": race(scale, systems, args.tasks, args.repeat, work, data, args.timeout, args.interleave),
            }
        file = args.out / f"scale-{scale}.json"
        if args.merge and file.exists():  # re-measured tasks replace theirs, the rest is kept
            run = merged(json.loads(file.read_text()), run)
        file.write_text(json.dumps(run, indent=1, sort_keys=True) + "\n")
    print(render(args.out))


def merged(old: dict, new: dict) -> dict:
    """`old` (a scale's file) with `new`'s tasks in place of its own, `new`'s command and host
    listed as a re-measurement and its systems' versions."""
    for system, tasks in new["results"].items():
        old["results"].setdefault(system, {}).update(tasks)
    old["meta"].setdefault("remeasured", []).append({"command": new["meta"]["command"], "host": new["meta"]["host"]})
    old["meta"].setdefault("versions", {}).update(new["meta"]["versions"])  # the systems just run
    return old


def render(out: Path) -> str:
    """table.md from every scale-<k>.json in `out` (docs/shards.md includes it: refresh the page
    with `python tools/record_commands.py --refill`)."""
    runs = {int(p.stem.removeprefix("scale-")): json.loads(p.read_text()) for p in out.glob("scale-*.json")}
    text = table({k: runs[k] for k in sorted(runs)})
    (out / "table.md").write_text(text)
    (out / "history.md").write_text(history({k: runs[k] for k in sorted(runs)}))
    return text


def history(runs: dict[int, dict]) -> str:
    """history.md: per scale, the command that measured the table and every command that
    re-measured some of its tasks since, with the host's state at each start."""
    lines = [
        "# The race's commands",
        "",
        "Every command below runs as shown (`--docs PAGE`, an option of an earlier version that only "
        "refreshed a page, is left out of the older ones).",
        "",
    ]
    for scale, run in runs.items():
        meta = run["meta"]
        lines += [f"## MNIST train x{scale}", "", f"Measured by: `{runnable(meta['command'])}` ({meta['host']}).", ""]
        lines += [f"- {line}" for line in remeasures(meta)] + [""]
    return "\n".join(lines)


def _version(system: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    name = {
        "project": "trainpath",
        "litdata": "litdata",
        "streaming": "mosaicml-streaming",
        "webdataset": "webdataset",
        "lance": "pylance",
    }[system]
    try:
        return version(name)
    except PackageNotFoundError:
        return "(source tree)"


if __name__ == "__main__":
    main()
