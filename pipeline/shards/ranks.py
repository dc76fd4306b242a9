"""Shards that stream to DDP ranks: each rank reads only the part of the split it trains on.

Per epoch, the shards are put in an order seeded by (seed, epoch) and the samples, in that
order, are cut into `world_size` equal contiguous ranges, one per rank. A rank reads the
shards its range covers: whole ones, plus at most two partly (those are verified whole,
but only the rows in range are copied). Every rank then holds exactly n // world_size
samples, which DDP needs (uneven step counts hang its collectives); the n % world_size
left over (fewer than world_size samples) are dropped for that epoch, and change with the
order. Within its range a rank shuffles with a generator seeded by (seed, epoch, rank).

Why cut ranges rather than deal whole shards: with the few large shards DVC likes (two of
32,768 for MNIST's 60,000), dealing whole shards to two ranks leaves them 32,768 and
27,232 samples, and equalising drops 5,536 samples (9%) every epoch.

A rank's memory is its range, 1/world_size of the split, never the data set.

The split may live in object storage (`s3://bucket/shards/mnist/train`, any fsspec URL): then
each rank fetches only the shards its range covers into a node-local cache (`remote`).
`RankStream` walks a rank's batches epoch after epoch and can be saved and resumed mid-epoch.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from pipeline.shards.format import ShardError, epoch_seed, manifest_sample, read_manifest
from pipeline.shards.reader import VERIFY, allocate, check_classes, read_shard_into

Piece = tuple[int, int, int]  # (shard, first row, stop row)


def shard_order(shards: int, seed: int, epoch: int) -> list[int]:
    generator = torch.Generator().manual_seed(epoch_seed(seed, epoch))
    return torch.randperm(shards, generator=generator).tolist()


def pieces(counts: list[int], world_size: int, seed: int, epoch: int) -> list[list[Piece]]:
    """Per rank, the (shard, first, stop) row ranges it reads this epoch: the shards in
    their seeded order, their samples cut into world_size equal contiguous ranges."""
    per_rank = sum(counts) // world_size
    ranks: list[list[Piece]] = [[] for _ in range(world_size)]
    position = 0
    for shard in shard_order(len(counts), seed, epoch):
        begin, end = position, position + counts[shard]
        for rank in range(world_size):  # the ranks whose range overlaps this shard's samples
            low, high = rank * per_rank, (rank + 1) * per_rank
            if max(begin, low) < min(end, high):
                ranks[rank].append((shard, max(begin, low) - begin, min(end, high) - begin))
        position = end
    return ranks


@dataclass
class RankEpoch:
    """A rank's samples for one epoch, as read, and the order to take them in: batches
    gather `images[order[a:b]]`, so the shuffle costs no copy of the data (a shuffled copy
    would double the rank's peak memory). Each field is also an attribute
    (`part.images`, `part.labels` for MNIST's schema)."""

    columns: dict[str, torch.Tensor]  # each field of the sample, this rank's range, as read
    ids: torch.Tensor         # each sample's index in the split (for checks and logs)
    order: torch.Tensor       # long [n]: this epoch's shuffled positions into images/labels
    dropped: int              # samples of the split no rank trains on this epoch (< world_size)

    def __getattr__(self, name: str) -> torch.Tensor:
        columns = self.__dict__.get("columns", {})
        if name in columns:
            return columns[name]
        raise AttributeError(f"{type(self).__name__!r} has no field or attribute {name!r}")

    def seen(self) -> torch.Tensor:
        """The split indices this rank trains on this epoch, in order."""
        return self.ids[self.order]


class RankShards:
    """One rank's view of a shard split; `epoch(e)` reads only this rank's range.

    `folder` is a local shard folder or a URL (`s3://...`); a URL needs `cache`, the node-local
    folder its shards are fetched into, and `cache_bytes`, that folder's bound."""

    def __init__(self, folder: Path | str, rank: int, world_size: int, seed: int, verify: str = "xxh3",
                 cache: Path | None = None, cache_bytes: int = 1 << 40, storage_options: dict | None = None) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
        if verify not in VERIFY:
            raise ValueError(f"verify must be one of {VERIFY}, got {verify!r}")
        self.remote = None
        if "://" in str(folder):
            from pipeline.shards.remote import RemoteShards

            if cache is None:
                raise ValueError(f"{folder}: a remote split needs a cache folder")
            self.remote = RemoteShards(str(folder), Path(cache), cache_bytes, verify=verify,
                                       storage_options=storage_options)
        self.folder = folder if self.remote else Path(folder)
        self.rank, self.world_size, self.seed, self.verify = rank, world_size, seed, verify
        self.manifest = self.remote.manifest if self.remote else read_manifest(self.folder)
        self.sample = manifest_sample(self.manifest)
        self.counts = [entry["count"] for entry in self.manifest["shards"]]
        if sum(self.counts) < world_size:
            raise ValueError(f"{self.folder}: {sum(self.counts)} samples cannot feed {world_size} ranks")
        self.starts = [sum(self.counts[:i]) for i in range(len(self.counts))]

    def epoch(self, epoch: int) -> RankEpoch:
        mine = pieces(self.counts, self.world_size, self.seed, epoch)[self.rank]
        n = sum(self.counts) // self.world_size
        columns = allocate(self.sample, n)
        ids = torch.empty(n, dtype=torch.long)
        start = 0
        codec = self.manifest["compression"]["codec"]
        for shard, first, stop in mine:
            end = start + stop - first
            targets = {name: column[start:end] for name, column in columns.items()}
            if self.remote:  # fetched (or found) in the cache and verified there: not hashed twice
                folder, entry = self.remote.local(shard)
                read_shard_into(folder, entry, codec, "none", targets, rows=(first, stop))
            else:
                read_shard_into(self.folder, self.manifest["shards"][shard], codec, self.verify, targets,
                                rows=(first, stop))
            ids[start:end] = torch.arange(self.starts[shard] + first, self.starts[shard] + stop)
            start = end
        check_classes(self.sample, columns, str(self.folder), ids=ids)
        generator = torch.Generator().manual_seed(epoch_seed(self.seed, epoch) * 1009 + self.rank)
        return RankEpoch(columns, ids, torch.randperm(n, generator=generator),
                         sum(self.counts) - n * self.world_size)


class RankStream:
    """One rank's batches, epoch after epoch, as (images uint8, labels uint8, ids) on `device`,
    resumable mid-epoch: `state_dict()` is the position of the next batch (epoch, step) with
    what fixes the sample order (seed, world size, split size, global batch); a stream loaded
    with it yields exactly the batches an uninterrupted one would from there on.

    Resuming with a different world size is refused unless the state is at an epoch's start:
    mid-epoch, the samples still due were cut into ranges for the old world size, and a new cut
    would repeat or skip some. At an epoch's start, the new world size simply cuts that epoch
    and the following ones its own way (each epoch still covers the split once)."""

    def __init__(self, shards: RankShards, batch_size: int, device: torch.device | str = "cpu") -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.shards, self.batch_size, self.device = shards, batch_size, torch.device(device)
        self.epoch, self.step = 0, 0
        self.part: RankEpoch | None = None  # the epoch read last (kept for its `dropped` and `seen`)
        self._read_epoch = -1

    def steps(self) -> int:
        """Batches per epoch: the same on every rank (equal ranges), the last one partial."""
        return math.ceil(sum(self.shards.counts) // self.shards.world_size / self.batch_size)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "step": self.step, "seed": self.shards.seed,
                "world_size": self.shards.world_size, "count": sum(self.shards.counts),
                "global_batch": self.batch_size * self.shards.world_size}

    def load_state_dict(self, state: dict) -> None:
        ours = self.state_dict()
        epoch, step = state.get("epoch"), state.get("step")
        if state.get("world_size") != ours["world_size"] and step != 0:
            raise ShardError(f"data position: saved by {state.get('world_size')!r} ranks at step {step} of epoch "
                             f"{epoch}, this job has {ours['world_size']}; resume mid-epoch with the same world "
                             f"size (a new world size can start at an epoch's start)")
        for key in ("seed", "count", "global_batch"):
            if state.get(key) != ours[key]:
                raise ShardError(f"data position: saved with {key} {state.get(key)!r}, this run has {ours[key]!r}; "
                                 f"it cannot continue that sample order")
        if not (isinstance(epoch, int) and isinstance(step, int) and epoch >= 0 and 0 <= step <= self.steps()):
            raise ShardError(f"data position: epoch {epoch!r}, step {step!r} is not a position in this split")
        self.epoch, self.step = epoch, step

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """The rest of the current epoch; the position moves past each batch as it is yielded,
        and to the next epoch's start once this one is done."""
        if self._read_epoch != self.epoch:
            self.part, self._read_epoch = self.shards.epoch(self.epoch), self.epoch
            self._images, self._labels = self.part.images.to(self.device), self.part.labels.to(self.device)
            self._order = self.part.order.to(self.device)
        while self.step < self.steps():
            index = self._order[self.step * self.batch_size : (self.step + 1) * self.batch_size]
            ids = self.part.ids[self.part.order[self.step * self.batch_size : (self.step + 1) * self.batch_size]]
            self.step += 1
            yield self._images[index], self._labels[index], ids
        self.epoch, self.step = self.epoch + 1, 0
