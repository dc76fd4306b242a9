"""Feeding a training loop from shards, three ways, fastest last:
- `ShardDataset`: map-style, with `__getitems__`, for code that keeps its DataLoader;
- `load_split` (shardreader): the verified split as uint8 tensors on a device;
- `DeviceBatches`: the split resident on the device, batches gathered there in a seeded order,
  converted to float per batch; equal batch counts on every DDP rank.
For data that do not fit one device, `ranks.RankShards` gives each DDP rank only its shards.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from pipeline.shards.format import ShardError, epoch_seed
from pipeline.shards.reader import load_split


def to_float(images: torch.Tensor, mean: float | None = None, std: float | None = None,
             dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 [b, 28, 28] -> float [b, 1, 28, 28] in 0..1 (normalised when given mean and std),
    on its device. No channels_last here: a 1-channel batch has the same strides either way
    (the model's weights are what `Execution.channels_last` converts)."""
    if (mean is None) != (std is None):
        raise ValueError(f"to_float: mean and std go together (got mean={mean}, std={std})")
    x = images.unsqueeze(1).to(dtype).div_(255)
    if mean is not None:
        x = x.sub_(mean).div_(std)
    return x


class ShardDataset(torch.utils.data.Dataset):
    """Map-style view of a shard split. `__getitems__` serves a whole batch in one gather;
    use `collate_fn=ShardDataset.collate` (or `loader()`) so the DataLoader passes it through."""

    def __init__(self, path: Path, **load_kwargs) -> None:
        self.images, self.labels = load_split(path, **load_kwargs)  # on the CPU: workers share it

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = self.__getitems__([index])
        return images[0], labels[0]

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.as_tensor(indices)
        return to_float(self.images[index]), self.labels[index].long()

    @staticmethod
    def collate(batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return batch

    def loader(self, batch_size: int, **kwargs) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(self, batch_size=batch_size, collate_fn=self.collate, **kwargs)


@dataclass
class DeviceBatches:
    """Batches from a split held on the device: no host work and no copies per step.

    Every epoch draws a fresh permutation from a generator seeded with (seed, epoch), so runs
    repeat exactly and epochs differ. It is drawn on the CPU (60,000 indices: well under a
    millisecond) and moved, so CPU and GPU runs of one seed train on the same order. With
    `world_size > 1` each rank takes a disjoint, equal-sized slice of the same permutation, so
    every rank yields the same number of batches (uneven counts hang DDP's collectives).
    """

    images: torch.Tensor
    labels: torch.Tensor
    batch_size: int
    shuffle: bool = True
    seed: int = 0
    drop_last: bool = False
    mean: float | None = None
    std: float | None = None
    rank: int = 0
    world_size: int = 1
    dtype: torch.dtype = torch.float32
    epoch: int = 0
    position: int = 0  # batches of `epoch` already taken: the next iteration starts after them

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside 0..{self.world_size - 1}")
        self.per_rank = len(self.labels) // self.world_size
        self._taken: tuple[int, int] | None = None  # (epoch, batches taken) while an iteration runs

    def __len__(self) -> int:
        whole = self.per_rank // self.batch_size
        return whole if self.drop_last else math.ceil(self.per_rank / self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.position, self._taken = epoch, 0, None

    def indices(self, epoch: int) -> torch.Tensor:
        """This rank's sample order for `epoch`, on the data's device."""
        n = len(self.labels)
        if self.shuffle:
            order = torch.randperm(n, generator=torch.Generator().manual_seed(epoch_seed(self.seed, epoch)))
        else:
            order = torch.arange(n)
        mine = order[: self.per_rank * self.world_size][self.rank :: self.world_size]
        return mine[: len(self) * self.batch_size].to(self.labels.device)  # drop_last: whole batches

    def state_dict(self) -> dict:
        """Where the next batch comes from (epoch, position: batches of it already taken), with
        what fixes the order; `load_state_dict` of it resumes exactly there, mid-epoch too."""
        epoch, position = self._taken or (self.epoch, self.position)
        if position >= len(self):
            epoch, position = epoch + 1, 0
        return {"epoch": epoch, "position": position, "seed": self.seed, "shuffle": self.shuffle,
                "world_size": self.world_size, "count": len(self.labels), "batch_size": self.batch_size}

    def load_state_dict(self, state: dict) -> None:
        """Resume at `state`'s position; refused (ShardError, naming the key) when the state was
        saved with another order: seed, shuffle, world size, split size or batch size."""
        ours = self.state_dict()
        for key in ("seed", "shuffle", "world_size", "count", "batch_size"):
            if state.get(key) != ours[key]:
                raise ShardError(f"DeviceBatches state: {key} {state.get(key)!r}, this loader has {ours[key]!r}")
        epoch, position = state.get("epoch"), state.get("position")
        if not (isinstance(epoch, int) and isinstance(position, int) and epoch >= 0 and 0 <= position <= len(self)):
            raise ShardError(f"DeviceBatches state: epoch {epoch!r}, position {position!r} is out of range")
        self.epoch, self.position, self._taken = epoch, position, None

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        epoch, first = self.epoch, self.position
        order = self.indices(epoch)
        self.epoch, self.position = epoch + 1, 0  # the next iteration is the next epoch, even after a break
        for step in range(first, math.ceil(len(order) / self.batch_size)):
            index = order[step * self.batch_size : (step + 1) * self.batch_size]
            self._taken = (epoch, step + 1)
            yield (to_float(self.images[index], self.mean, self.std, self.dtype),
                   self.labels[index].long())
        self._taken = None
