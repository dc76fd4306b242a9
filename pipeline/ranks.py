"""Shards that stream to DDP ranks: each rank reads only the shards it is dealt.

Per epoch, a permutation of the shards seeded by (seed, epoch) is dealt greedily: each
shard goes to the rank holding the fewest samples so far, so the ranks' totals differ by at
most one shard. Every rank then keeps the same number of samples (the smallest total:
the few extra samples of the larger ranks are dropped for that epoch, and counted), which
DDP needs (uneven step counts hang its collectives), and shuffles what it holds with a
generator seeded by (seed, epoch, rank). A rank's memory is its shards, about 1/world of
the data, never the data set; across epochs every sample is seen (the dropped ones
change with the permutation).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from pipeline.shards import IMAGE_SHAPE, _read_shard_into, read_manifest


def deal(counts: list[int], world_size: int, seed: int, epoch: int) -> list[list[int]]:
    """Shard indices per rank for one epoch: a seeded permutation, dealt to the emptiest rank."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    order = torch.randperm(len(counts), generator=generator).tolist()
    ranks: list[list[int]] = [[] for _ in range(world_size)]
    totals = [0] * world_size
    for shard in order:
        emptiest = min(range(world_size), key=lambda r: (totals[r], r))
        ranks[emptiest].append(shard)
        totals[emptiest] += counts[shard]
    return ranks


@dataclass
class RankEpoch:
    images: torch.Tensor      # uint8 [n, 28, 28], this rank's samples in this epoch's order
    labels: torch.Tensor      # uint8 [n]
    ids: torch.Tensor         # each sample's index in the split (for checks and logs)
    dropped: int              # samples of this rank's shards left out to equalise the ranks


class RankShards:
    """One rank's view of a shard split; `epoch(e)` loads only the shards dealt to it."""

    def __init__(self, folder: Path, rank: int, world_size: int, seed: int, verify: str = "xxh3") -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
        self.folder, self.rank, self.world_size, self.seed, self.verify = Path(folder), rank, world_size, seed, verify
        self.manifest = read_manifest(self.folder)
        self.counts = [entry["count"] for entry in self.manifest["shards"]]
        if len(self.counts) < world_size:
            raise ValueError(f"{self.folder}: {len(self.counts)} shards cannot feed {world_size} ranks; "
                             f"write smaller shards (shard.samples_per_shard)")
        self.starts = [sum(self.counts[:i]) for i in range(len(self.counts))]

    def per_rank(self, epoch: int) -> int:
        dealt = deal(self.counts, self.world_size, self.seed, epoch)
        return min(sum(self.counts[s] for s in shards) for shards in dealt)

    def epoch(self, epoch: int) -> RankEpoch:
        mine = deal(self.counts, self.world_size, self.seed, epoch)[self.rank]
        n = sum(self.counts[s] for s in mine)
        images = torch.empty((n, *IMAGE_SHAPE), dtype=torch.uint8)
        labels = torch.empty(n, dtype=torch.uint8)
        ids = torch.empty(n, dtype=torch.long)
        start = 0
        codec = self.manifest["compression"]["codec"]
        for shard in mine:
            entry, stop = self.manifest["shards"][shard], start + self.counts[shard]
            _read_shard_into(self.folder, entry, codec, self.verify,
                             {"images": images[start:stop], "labels": labels[start:stop]})
            ids[start:stop] = torch.arange(self.starts[shard], self.starts[shard] + self.counts[shard])
            start = stop
        keep = self.per_rank(epoch)
        generator = torch.Generator().manual_seed((self.seed * 1_000_003 + epoch) * 1009 + self.rank)
        order = torch.randperm(n, generator=generator)[:keep]
        return RankEpoch(images[order], labels[order], ids[order], n - keep)
