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
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from pipeline.shards.format import epoch_seed, manifest_sample, read_manifest
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
    """One rank's view of a shard split; `epoch(e)` reads only this rank's range."""

    def __init__(self, folder: Path, rank: int, world_size: int, seed: int, verify: str = "xxh3") -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
        if verify not in VERIFY:
            raise ValueError(f"verify must be one of {VERIFY}, got {verify!r}")
        self.folder, self.rank, self.world_size, self.seed, self.verify = Path(folder), rank, world_size, seed, verify
        self.manifest = read_manifest(self.folder)
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
            read_shard_into(self.folder, self.manifest["shards"][shard], codec, self.verify,
                            {name: t[start:end] for name, t in columns.items()}, rows=(first, stop))
            ids[start:end] = torch.arange(self.starts[shard] + first, self.starts[shard] + stop)
            start = end
        check_classes(self.sample, columns, str(self.folder), ids=ids)
        generator = torch.Generator().manual_seed(epoch_seed(self.seed, epoch) * 1009 + self.rank)
        return RankEpoch(columns, ids, torch.randperm(n, generator=generator),
                         sum(self.counts) - n * self.world_size)
