"""Feeding a training loop from shards, three ways, fastest last:
- `ShardDataset`: map-style, for code that keeps its DataLoader: `DataLoader(ShardDataset(path),
  batch_size=512, shuffle=True)` works as with any dataset (samplers, workers, a
  `DistributedSampler`, a `collate_fn`), and `ShardDataset.loader()` is the batched fast path
  (one gather per batch);
- `load_split` (reader): the verified split as tensors on a device;
- `DeviceBatches`: the split resident on the device, batches gathered there in a seeded order,
  converted to float per batch; equal batch counts on every DDP rank.
For data that do not fit one device, `ranks.RankShards` gives each DDP rank only its shards.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.random  # noqa: F401 - randperm_head's MT19937: loaded here, not by a first batch (6 ms)
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, Sampler

from pipeline.shards.format import Field, ShardError, epoch_seed
from pipeline.shards.reader import MappedSplit


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


def model_ready(field: Field, batch: np.ndarray) -> np.ndarray:
    """What a model takes of a gathered batch of one field, by the field's declaration: a class
    label as int64 (what cross-entropy wants); a uint8 image ([H, W] or [C, H, W] per sample)
    as float32 in 0..1, [b, 1, H, W] for a 2-D one (as `to_float`, the same values); anything
    else as stored. numpy, single-threaded: on a busy host torch's intra-op threads fight
    the other processes for the cores (see docs/shards.md)."""
    if field.classes is not None:
        return batch.astype(np.int64)
    if field.dtype == "uint8" and len(field.shape) in (2, 3):
        x = batch.astype(np.float32)
        np.divide(x, np.float32(255), out=x)
        return x[:, None] if len(field.shape) == 2 else x
    return batch


class ShardDataset(Dataset):
    """Map-style view of a shard split, memory-mapped and verified as used
    (`reader.MappedSplit`: constructing it reads the manifest; the first batch maps the shards
    (under `loader()`, before the epoch's permutation is drawn: its first batch's indices come
    from the generator's state, `randperm_head`); each batch verifies the blocks
    it touches, so the first batch does not wait for the whole split to be hashed, while a
    thread verifies the rest and joins the shards into one array for the batches after it,
    if the split fits in `join_limit` bytes; a larger one stays mapped).
    Damage is raised by the first use that finds it (`split.wait()` checks everything now).

    `dataset[i]` is one sample: a tuple of its fields in the manifest's order, made model-ready
    (`model_ready`: for MNIST, float [1, 28, 28] in 0..1 and an int64 label; `raw=True` keeps
    the stored dtypes), then passed through `transform` if given. `__getitems__` follows
    PyTorch's contract (a list of samples, which the default collate stacks) while gathering
    the whole batch with one index. `loader()` is the fast path: a `BatchSampler` hands each
    fetch a batch of indices, the batch is gathered and converted at once and no collate runs.
    """

    def __init__(self, path: Path, *, raw: bool = False, transform: Callable | None = None, **load_kwargs) -> None:
        self.split = MappedSplit(path, **load_kwargs)
        self.sample = self.split.sample
        self.raw, self.transform = raw, transform

    @property
    def images(self) -> torch.Tensor:  # MNIST's field names, for code written before the schema
        return torch.from_numpy(self.split.column("images").copy())

    @property
    def labels(self) -> torch.Tensor:
        return torch.from_numpy(self.split.column("labels").copy())

    def __len__(self) -> int:
        return len(self.split)

    def batch(self, indices: Sequence[int] | torch.Tensor) -> tuple:
        """The samples at `indices` as one batch: a tuple of [b, ...] tensors in field order."""
        columns = self.split.take(indices)
        out = tuple(torch.from_numpy(values if self.raw else model_ready(field, values))
                    for field, values in zip(self.sample.fields, columns.values(), strict=True))
        return self.transform(out) if self.transform is not None else out

    def __getitem__(self, index: int) -> tuple:
        return tuple(column[0] for column in self.batch([index]))

    def __getitems__(self, indices: list[int]) -> list[tuple]:
        return list(zip(*(column.unbind(0) for column in self.batch(indices)), strict=True))

    def loader(self, batch_size: int, *, shuffle: bool = False, drop_last: bool = False,
               generator: torch.Generator | None = None, sampler: Sampler[int] | None = None,
               **kwargs) -> DataLoader:
        """The batched fast path: a DataLoader whose every fetch is one `batch()`. `sampler`
        (e.g. a `DistributedSampler`) orders the samples, or `shuffle` draws a fresh
        per-sample permutation each epoch from `generator`; other keyword arguments (workers,
        pin_memory, ...) go to the DataLoader."""
        if sampler is None:
            batches = IndexBatches(len(self), batch_size, shuffle=shuffle, drop_last=drop_last, generator=generator,
                                   meanwhile=self.split.prepare)
        elif shuffle:
            raise ValueError("loader: give shuffle or a sampler, not both")
        else:
            batches = BatchSampler(sampler, batch_size, drop_last)
        return DataLoader(_Batches(self), batch_size=None, sampler=batches, generator=generator, **kwargs)


def randperm_head(generator: torch.Generator, n: int, k: int) -> np.ndarray | None:
    """The first `k` indices of `torch.randperm(n, generator=generator)`, without drawing it and
    without advancing the generator; None where they cannot be derived here.

    Why: a 600,000-sample permutation takes 5-10 ms in a fresh process, which a first batch
    would otherwise wait for. How: torch's CPU `randperm` below 2**32 / 20 elements is a forward
    Fisher-Yates shuffle whose i-th swap takes the i-th 32-bit draw modulo n - i, and its
    generator is a 32-bit Mersenne Twister whose state `get_state()` holds (624 words, the
    position); numpy's MT19937 continues from that state. That is torch's implementation, not
    its contract, so `IndexBatches` compares the head with the permutation once drawn (tested
    against `torch.randperm` too)."""
    if not isinstance(generator, torch.Generator) or generator.device.type != "cpu" or not k < n < 0xFFFFFFFF // 20:
        return None
    state = generator.get_state().numpy()
    if state.nbytes != 5056:  # the layout read below: seed, left, seeded, next, state[624] (uint64 each word)
        return None
    left, position = int(state[8:12].view("<i4")[0]), int(state[16:24].view("<u8")[0])
    words = state[24 : 24 + 624 * 8].view("<u8")
    if not (0 < left <= 624 and position <= 624 and int(words.max()) < 1 << 32):
        return None
    bits = np.random.MT19937(0)
    position = 624 if left == 1 else position  # torch regenerates on the draw that takes `left` to 0
    bits.state = {"bit_generator": "MT19937", "state": {"key": words.astype(np.uint32), "pos": position}}
    head, moved = np.empty(k, np.int64), {}  # moved: what the swaps so far put at a position
    for i, draw in enumerate(bits.random_raw(k).tolist()):
        z = i + draw % (n - i)
        head[i] = moved.get(z, z)
        moved[z] = moved.get(i, i)
    return head


def _after(head: np.ndarray, order: np.ndarray) -> np.ndarray:
    """The epoch's order once the whole permutation is drawn: `order` itself when its head is
    the one already served (always, with the torch whose randperm `randperm_head` follows),
    else the served head followed by the rest of `order` in its order, so that the epoch still
    takes every sample once."""
    if np.array_equal(order[: len(head)], head):
        return order
    import warnings

    warnings.warn("IndexBatches: torch.randperm no longer draws the order randperm_head derives; this "
                  "epoch's order is not RandomSampler's (every sample is still taken once)", stacklevel=3)
    rest = np.ones(len(order), bool)
    rest[head] = False
    return np.concatenate([head, order[rest[order]]])


class IndexBatches(Sampler[np.ndarray]):
    """Batches of sample indices as int64 arrays cut from one permutation per epoch
    (`torch.randperm` from the generator), or from 0..n-1: what `BatchSampler` over
    `RandomSampler` gives, without a Python int per sample. The first epoch is the one a
    `RandomSampler` on the same generator gives; its later epochs differ, as `RandomSampler`
    also draws an (empty) permutation for its remainder at the end of each epoch.

    A shuffled epoch's first batch does not wait for the permutation: its indices are derived
    from the generator's state (`randperm_head`), and the permutation is drawn when the second
    batch is asked for (drawing it on a thread beside the first batch slowed that batch as
    much: the two fault memory in at once). `meanwhile`, if given, runs once, before the first
    batch: `ShardDataset.loader` maps the shards then. Where the head cannot be derived, the
    permutation is drawn on a thread while `meanwhile` runs (torch releases the GIL), so a
    first batch waits for the longer of the two."""

    def __init__(self, n: int, batch_size: int, *, shuffle: bool = False, drop_last: bool = False,
                 generator: torch.Generator | None = None, meanwhile: Callable[[], None] | None = None) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.n, self.batch_size, self.shuffle, self.drop_last, self.generator = n, batch_size, shuffle, drop_last, generator
        self.meanwhile = meanwhile

    def __len__(self) -> int:
        return self.n // self.batch_size if self.drop_last else math.ceil(self.n / self.batch_size)

    def _permutation(self, generator: torch.Generator) -> np.ndarray:
        # int32 where it holds every index: the same permutation (torch draws the same numbers either
        # way), in half the memory, and a fresh process pays half the page faults before a first batch.
        dtype = torch.int32 if self.n <= torch.iinfo(torch.int32).max else torch.int64
        return torch.randperm(self.n, generator=generator, dtype=dtype).numpy()

    def __iter__(self) -> Iterator[np.ndarray]:
        meanwhile, self.meanwhile = self.meanwhile or (lambda: None), None
        first = 0  # where the batches cut from `order` start
        if not self.shuffle:
            meanwhile()
            order = np.arange(self.n, dtype=np.int64)
        else:
            generator = self.generator
            if generator is None:  # as RandomSampler does: a fresh seed from torch's global generator
                generator = torch.Generator().manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
            head = randperm_head(generator, self.n, self.batch_size) if len(self) > 1 else None
            if head is None:
                with ThreadPoolExecutor(1, thread_name_prefix="shards-order") as pool:  # (waits for it on any exit)
                    drawn = pool.submit(self._permutation, generator)
                    meanwhile()
                    order = drawn.result()  # (its error, if any, raised here)
            else:
                meanwhile()
                yield head
                order, first = _after(head, self._permutation(generator)), len(head)
        for start in range(first, len(self) * self.batch_size, self.batch_size):
            yield order[start : start + self.batch_size].astype(np.int64, copy=False)


class _Batches(Dataset):
    """A ShardDataset indexed by whole batches (what `loader()` hands its DataLoader)."""

    def __init__(self, dataset: ShardDataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, indices: list[int]) -> tuple:
        return self.dataset.batch(indices)


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
        on_host = self.images.device.type == "cpu" and self.dtype in HOST_FLOATS
        for step in range(first, math.ceil(len(order) / self.batch_size)):
            index = order[step * self.batch_size : (step + 1) * self.batch_size]
            self._taken = (epoch, step + 1)
            if on_host:
                yield self._host_batch(index.numpy())
            else:
                yield (to_float(self.images[index], self.mean, self.std, self.dtype),
                       self.labels[index].long())
        self._taken = None

    def _host_batch(self, index: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch `to_float` would give (the same values: IEEE division and subtraction
        in the same dtype), made with numpy on one thread. On a loaded 2-core host torch's
        intra-op threads made an epoch several times slower (docs/shards.md)."""
        x = np.take(self.images.numpy(), index, axis=0)[:, None].astype(HOST_FLOATS[self.dtype])
        np.divide(x, x.dtype.type(255), out=x)
        if self.mean is not None:
            np.subtract(x, x.dtype.type(self.mean), out=x)
            np.divide(x, x.dtype.type(self.std), out=x)
        return torch.from_numpy(x), torch.from_numpy(np.take(self.labels.numpy(), index).astype(np.int64))


# The float dtypes numpy computes exactly as torch does (float16: torch computes in float32
# and rounds once, numpy in float16; bfloat16: no numpy dtype): the others go through torch.
HOST_FLOATS = {torch.float32: np.float32, torch.float64: np.float64}
