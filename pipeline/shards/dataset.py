"""Feeding a training loop from shards: one map-style dataset, one loader, and the same rules
for a split held on the device.

- `ShardDataset(location)`: a local folder or URL, for any DataLoader (samplers, workers, a
  `DistributedSampler`, a `collate_fn`); `dataset[i]` is a tuple of the sample's fields.
- `ShardDataset.loader(...)` / `ShardLoader`: the batched path (one gather per batch, no
  collate), with ranks, shuffles and a resumable position (`order.ShardSampler`).
- `DeviceBatches(columns, ...)`: a split already on the device (e.g. `read_split(path,
  "cuda")`), batches gathered there, by the same sampler.

Every path returns every field, in the manifest's order, with its stored dtype and shape; a
`transform` (see `transforms`) is the only way values change.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from pipeline.core.errors import reason
from pipeline.shards.format import ShardError, ShardTypeError
from pipeline.shards.mapped import MappedSplit
from pipeline.shards.order import Order, ShardSampler
from pipeline.shards.transforms import Transform, compose

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's own from Python 3.11


class ShardDataset(Dataset):
    """Map-style view of a shard split, mapped and verified as used (`mapped.MappedSplit`).

    `dataset[i]` is one sample: a tuple of its fields in the manifest's order, each a tensor of
    the field's dtype and shape. `__getitems__` follows PyTorch's contract (a list of samples,
    which the default collate stacks) while gathering the batch with one index. `transform`
    (a callable of a batch dict, or a list of them) is applied to every batch, and to a single
    sample as a batch of one. Other keyword arguments go to `MappedSplit`: dataset, split,
    verify, max_resident, max_open, pread, cache, cache_bytes, storage_options, deadlines
    (`watched.Deadlines`). Every process, DataLoader workers included, reads through the same
    bounded maps; `loader()` freezes the parent's objects for its workers, and
    `freeze_inherited` does the same for a DataLoader of your own."""

    def __init__(
        self, location: Path | str, *, transform: Transform | Sequence[Transform] | None = None, **split_options
    ) -> None:
        self.split = MappedSplit(location, **split_options)
        self.sample = self.split.sample
        self.transform = compose(transform, {f.name: f.dtype for f in self.sample.fields})

    @property
    def names(self) -> list[str]:
        return self.sample.names

    @property
    def shard_counts(self) -> list[int]:
        return list(self.split.counts)

    def __len__(self) -> int:
        return len(self.split)

    def batch(self, indices: Sequence[int] | np.ndarray | torch.Tensor) -> tuple:
        """The samples at `indices` as one batch: a tuple of [b, *shape] tensors in field order."""
        if isinstance(indices, torch.Tensor):
            indices = indices.cpu().numpy()
        columns = {name: torch.from_numpy(values) for name, values in self.split.take(indices).items()}
        if self.transform is not None:
            columns = self.transform(columns)
        return tuple(columns.values())

    def __getitem__(self, index: int) -> tuple:
        if isinstance(index, bool | np.bool_) or not isinstance(index, int | np.integer):
            raise ShardTypeError(f"a sample index is an integer, got {type(index).__name__} {index!r:.40}")
        return tuple(column[0] for column in self.batch([int(index)]))

    def __getitems__(self, indices: list[int]) -> list[tuple]:
        return list(zip(*(column.unbind(0) for column in self.batch(indices)), strict=True))

    def wait(self) -> None:
        """Map (fetch) and verify the whole split now, raising what is wrong."""
        self.split.wait()

    def sampler(self, batch_size: int, **order: Unpack[Order]) -> ShardSampler:
        """A `ShardSampler` for this split (its shard counts included, for shuffle="shards");
        `order`: the sampler's shuffle, seed, rank, world_size and drop_last."""
        return ShardSampler(len(self), batch_size, **order, shard_counts=self.shard_counts)

    def loader(self, batch_size: int, *, freeze: bool = True, preload: bool = True, **options: Any) -> ShardLoader:
        """The batched path: a `ShardLoader` over this dataset. The order keywords (shuffle,
        seed, rank, world_size, drop_last: see `order` for their rules, ranks and resuming) go
        to its sampler, other keyword arguments (num_workers, pin_memory, ...) to the DataLoader
        underneath; `freeze=False` leaves the workers' gc as it is, `preload=False` the fork
        server's preload list (see `ShardLoader`)."""
        order = {key: options.pop(key) for key in Order.__annotations__ if key in options}
        return ShardLoader(self, self.sampler(batch_size, **order), freeze=freeze, preload=preload, **options)


def freeze_inherited(worker_id: int = 0) -> None:
    """A `worker_init_fn` for a DataLoader of your own: freezes the objects the worker
    inherited from its parent (`gc.freeze`), so that the worker's garbage collections never
    write to them and the pages holding them stay shared with the parent instead of being
    copied into every worker, as Python's gc documentation describes for forked children."""
    gc.freeze()


FORKSERVER_PRELOAD = ["__main__", "pipeline.shards.dataset"]  # Python's default, and this loader with torch


def start_method(context) -> str:
    """The start method of the workers of a DataLoader given `multiprocessing_context=context`
    (None: the process's default, which this call fixes, as starting the workers would)."""
    if context is None:
        return multiprocessing.get_start_method()
    return context if isinstance(context, str) else context.get_start_method()


def preload_forkserver(context=None) -> bool:
    """Ask the fork server to import this loader (and torch with it) before it forks any
    worker, when workers given `context` start by forkserver: each worker then shares the
    server's copy of those modules instead of importing its own. Replaces the preload list
    (`multiprocessing.set_forkserver_preload`) with Python's default plus this library;
    a fork server already running keeps the list it started with. True when set."""
    if start_method(context) != "forkserver":
        return False
    multiprocessing.set_forkserver_preload(FORKSERVER_PRELOAD)
    return True


class _FreezeThen:
    """`freeze_inherited`, then the caller's own worker_init_fn (a class: workers started
    with spawn or forkserver receive it pickled)."""

    def __init__(self, then: Callable[[int], None] | None) -> None:
        self.then = then

    def __call__(self, worker_id: int) -> None:
        freeze_inherited(worker_id)
        if self.then is not None:
            self.then(worker_id)


@contextlib.contextmanager
def _parent_frozen(active: bool) -> Iterator[None]:
    """The parent's objects frozen while its workers start (so that forked workers inherit
    them frozen, and their collections never touch those pages), unfrozen after. Unfreezing
    puts the parent's objects in its oldest generation, so they are collected later than they
    would have been. A process that froze objects itself is left alone (unfreezing would undo
    its freeze)."""
    if not active or gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class _Batches(Dataset):
    """A ShardDataset indexed by whole batches: each item is (indices, fields)."""

    def __init__(self, dataset: ShardDataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, indices: np.ndarray) -> tuple[torch.Tensor, tuple]:
        return torch.from_numpy(np.asarray(indices, dtype=np.int64)), self.dataset.batch(indices)


class _Resumable:
    """What ShardLoader and DeviceBatches share: a sampler, the plan of the iteration started
    last and the batches the caller took of it, and the state built from both."""

    sampler: ShardSampler
    plan: tuple | None = None
    taken: int = 0

    def _begin(self) -> None:
        if self.plan is not None:  # continue after what the loop took (the whole epoch: the next one)
            self.sampler.load_state_dict(self.state_dict())
        self.plan, self.taken, self.indices = (self.sampler.epoch, list(self.sampler.due)), 0, None

    def __len__(self) -> int:
        return len(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` from its beginning at the next iteration."""
        self.sampler.set_epoch(epoch)
        self.plan, self.taken = None, 0

    @property
    def epoch(self) -> int:
        """The epoch the next batch belongs to."""
        return self.state_dict()["epoch"]

    def state_dict(self) -> dict:
        """Where the next batch comes from (the same on every rank); `load_state_dict` of it
        resumes there, with this world size or another."""
        if self.plan is None:
            return self.sampler.state_dict()
        return self.sampler.state(*self.sampler.after(*self.plan, self.taken))

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state)
        self.plan, self.taken = None, 0


class ShardLoader(_Resumable):
    """Batches of a ShardDataset drawn by a ShardSampler through a DataLoader (workers,
    pinned memory, prefetching: any DataLoader option): each batch a tuple of the fields.
    `indices` holds the sample indices of the batch just yielded; `state_dict()` counts the
    batches the loop took, not those the DataLoader fetched ahead. With workers, they are
    persistent unless `persistent_workers=False` is given; unless `freeze=False`, the
    parent's objects are frozen while they start and each freezes what it inherited
    (`freeze_inherited`); unless `preload=False`, workers started by forkserver share the
    fork server's import of this loader (`preload_forkserver`)."""

    def __init__(
        self,
        dataset: ShardDataset,
        sampler: ShardSampler,
        *,
        freeze: bool = True,
        preload: bool = True,
        **dataloader_options,
    ) -> None:
        for name, value in (("freeze", freeze), ("preload", preload)):
            if not isinstance(value, bool):
                raise ShardError(f"{name} must be True or False, got {value!r:.40}")
        workers = dataloader_options.get("num_workers", 0)
        if type(workers) is not int or workers < 0:
            raise ShardError(f"num_workers must be an integer (0 or more), got {workers!r:.40}")
        self.dataset, self.sampler = dataset, sampler
        self.indices = None
        self.freeze = freeze and dataloader_options.get("num_workers", 0) > 0
        self.preload = preload and dataloader_options.get("num_workers", 0) > 0
        if dataloader_options.get("num_workers", 0) > 0:
            dataloader_options.setdefault("persistent_workers", True)  # workers keep their maps across epochs
            if freeze:
                dataloader_options["worker_init_fn"] = _FreezeThen(dataloader_options.get("worker_init_fn"))
        try:
            self.dataloader = DataLoader(_Batches(dataset), batch_size=None, sampler=sampler, **dataloader_options)
        except (TypeError, ValueError) as err:  # an option DataLoader refuses (num_workers=-1, an unknown one)
            raise ShardError(f"loader: {reason(err)}") from None

    def __iter__(self) -> Iterator[tuple]:
        self._begin()
        if self.preload:  # before the first workers start (the fork server starts with them)
            preload_forkserver(self.dataloader.multiprocessing_context)
            self.preload = False
        with _parent_frozen(self.freeze):  # (the workers start here, the first time)
            batches = iter(self.dataloader)
        for indices, fields in batches:
            self.taken += 1
            self.indices = indices
            yield fields


class DeviceBatches(_Resumable):
    """Batches of a split held as tensors (on any device: `read_split(path, device)`), gathered
    where they are, in the order a ShardSampler gives: no host work per step. `columns` maps
    field names to tensors [n, *shape]; each batch is a tuple of them in that order, as
    stored unless `transform` is given. `order`: the sampler's keywords (`order.Order`)."""

    def __init__(
        self,
        columns: Mapping[str, torch.Tensor],
        batch_size: int,
        *,
        transform: Transform | Sequence[Transform] | None = None,
        shard_counts: Sequence[int] | None = None,
        **order: Unpack[Order],
    ) -> None:
        if not isinstance(columns, Mapping) or not columns:
            raise ShardError("DeviceBatches: columns must map field names to tensors")
        kinds = {name: type(t).__name__ for name, t in columns.items() if not isinstance(t, torch.Tensor)}
        if kinds:
            raise ShardError(f"DeviceBatches: columns must map field names to tensors, got {kinds!r:.80}")
        lengths = {name: len(t) for name, t in columns.items()}
        if len(set(lengths.values())) != 1:
            raise ShardError(f"DeviceBatches: fields differ in length: {lengths}")
        devices = {str(t.device) for t in columns.values()}
        if len(devices) != 1:
            raise ShardError(f"DeviceBatches: fields on several devices: {sorted(devices)}")
        self.columns = dict(columns)
        self.device = next(iter(columns.values())).device
        self.transform = compose(transform, {n: str(t.dtype).removeprefix("torch.") for n, t in columns.items()})
        self.sampler = ShardSampler(next(iter(lengths.values())), batch_size, **order, shard_counts=shard_counts)
        self.indices = None

    def rank_order(self, epoch: int) -> torch.Tensor:
        """The sample indices this rank takes in a fresh `epoch`, in order, on the data's device."""
        return torch.from_numpy(self.sampler.rank_order(epoch)).to(self.device)

    def __iter__(self) -> Iterator[tuple]:
        self._begin()
        for indices in self.sampler:
            index = torch.from_numpy(indices).to(self.device)
            batch = {name: values[index] for name, values in self.columns.items()}
            if self.transform is not None:
                batch = self.transform(batch)
            self.taken += 1
            self.indices = index
            yield tuple(batch.values())
