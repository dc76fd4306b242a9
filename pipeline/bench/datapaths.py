"""Each rung's data path: where a variant's batches come from, in one place per variant.

The loader rungs follow the write-up's story one change at a time (batch size, workers,
persistent workers, pinned memory, Dataset v2); `batched` serves whole batches from shards
by one tensor index; `device` keeps the split on the accelerator and shuffles it there.
Every variant builds its own inputs (nothing is shared between variants), so each one's
setup time is what a user of that variant pays.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from pipeline.bench.model import MODEL_INPUT
from pipeline.bench.seed import NaiveDataset, PreprocessedDataset
from pipeline.bench.variants import EAGER_VARIANTS, LOADER_VARIANTS
from pipeline.core.dataset import SPLITS
from pipeline.shards.dataset import DeviceBatches, ShardDataset
from pipeline.shards.reader import read_split


@dataclass
class DataPath:
    """How a variant feeds the model: train and test batch sources, iterated once per epoch."""

    train: Callable[[], Iterable]
    test: Callable[[], Iterable]
    train_steps: int
    test_steps: int
    batch_size: int
    sampled_steps: int | None = None  # train steps per timed epoch when sampled
    sampled_test_steps: int | None = None  # test steps per timed epoch when sampled: the same share of the split


@dataclass(frozen=True)
class Resident:
    """Both splits as uint8 tensors on the device: the input of the static-step variants."""

    train_images: torch.Tensor
    train_labels: torch.Tensor
    test_images: torch.Tensor
    test_labels: torch.Tensor

    @classmethod
    def load(cls, shards: Path, device: torch.device, dataset: str) -> Resident:
        """Both splits of `dataset`, verified: a folder of another data set or split is refused."""
        train, test = (read_split(Path(shards) / split, device, dataset=dataset, split=split) for split in SPLITS)
        return cls(train["images"], train["labels"], test["images"], test["labels"])


def checked_parquet(parquet: Path, split: str) -> Path:
    """The wide split the write-up's Datasets read, checked before they touch it: its bytes
    against the convert stage's SHA256SUMS (polars writes no page checksums), and its columns
    by name and order (the write-up's Datasets take pixels by position: columns in another order
    would train on scrambled images without a word)."""
    import pyarrow.parquet as pq

    from pipeline.core.dataset import COLUMNS
    from pipeline.core.errors import DataError
    from pipeline.core.parquet import verify_checksum

    path = Path(parquet) / f"{split}.parquet"
    verify_checksum(path)
    names = pq.read_schema(path).names
    if names != COLUMNS:
        first = next((i for i, (a, b) in enumerate(zip(names, COLUMNS)) if a != b), min(len(names), len(COLUMNS)))
        raise DataError(
            f"{path}: columns are not label, pixel1..pixel{len(COLUMNS) - 1} in order "
            f"(column {first + 1} is {names[first] if first < len(names) else 'missing'!r})"
        )
    return path


def check_same_data(parquet: Path, shards: Path, dataset: str) -> None:
    """The wide Parquet holds, split by split, the labels of `dataset`'s shards (the shard
    stage recorded them from its source, pinned by sources.yaml; the reader checks the shards
    are that data set's): a Parquet folder of another data set or split would otherwise be
    trained on and recorded under `dataset` without a word."""
    import pyarrow.parquet as pq

    from pipeline.core.dataset import idx_sha256
    from pipeline.core.errors import DataError
    from pipeline.shards.format import read_manifest

    for split in SPLITS:
        path = checked_parquet(parquet, split)
        folder = Path(shards) / split
        source = read_manifest(folder, dataset, split).get("source") or {}
        wanted = (source.get("idx_sha256") or {}).get("labels")
        if not isinstance(wanted, str):
            raise DataError(
                f"{folder}: its manifest records no digest of its source's labels, so {path} cannot be "
                f"checked to hold {dataset}'s {split} split (shards written by `python -m pipeline shard` have it)"
            )
        labels = pq.read_table(path, columns=["label"]).column(0)
        if labels.null_count or str(labels.type) != "uint8":
            raise DataError(f"{path}: its label column is not uint8 without nulls ({labels.type})")
        digest = idx_sha256((len(labels),))
        for chunk in labels.chunks:
            digest.update(chunk.to_numpy().tobytes())
        if digest.hexdigest() != wanted:
            raise DataError(
                f"{path}: its labels are not those of {dataset}'s {split} split ({folder} records "
                f"{wanted[:16]}..., this file's are {digest.hexdigest()[:16]}...): another data set or split"
            )


def _loader(
    dataset, batch_size: int, shuffle: bool, seed: int, samples: int | None = None, **kwargs
) -> torch.utils.data.DataLoader:
    """The write-up's DataLoader; with `samples`, one whose epochs are `samples` samples of a fresh
    shuffle each (the first epoch's: the first of the order a whole one takes). A sampled
    epoch then ends when its sampler does, so persistent workers hold no batch prefetched for
    it when the next epoch starts (PyTorch makes the next epoch wait for such batches, which
    would time the previous epoch's leftovers as the new epoch's work)."""
    generator = torch.Generator().manual_seed(seed) if shuffle else None
    if samples is None:
        return torch.utils.data.DataLoader(
            dataset, batch_size=batch_size, shuffle=shuffle, generator=generator, **kwargs
        )
    sampler = (
        torch.utils.data.RandomSampler(dataset, num_samples=samples, generator=generator) if shuffle else range(samples)
    )
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, sampler=sampler, generator=generator, **kwargs)


def sampled_test_steps(sampled: int | None, train_steps: int, test_steps: int) -> int | None:
    """Test steps of a sampled epoch: the share of the test split that the sampled train steps
    are of the train split (at least one step); None: whole epochs."""
    if sampled is None:
        return None
    return max(1, min(test_steps, math.ceil(sampled * test_steps / train_steps)))


def sampled_steps(epoch_samples: int | None, batch_size: int, steps: int) -> int | None:
    """Steps per sampled epoch: those of `epoch_samples` samples (the same data whatever the
    variant's batch, so `naive_bs16` takes 32 times the steps of `naive` at 512), at most a
    whole epoch's `steps`; None: whole epochs."""
    return None if epoch_samples is None else min(math.ceil(epoch_samples / batch_size), steps)


def loader_options(variant: str, workers: int, device: torch.device) -> dict:
    """The DataLoader settings each rung of the write-up's story adds to the one before."""
    steps = LOADER_VARIANTS.index(variant)
    options: dict = {}
    if steps >= LOADER_VARIANTS.index("workers"):
        options["num_workers"] = workers
    if steps >= LOADER_VARIANTS.index("persistent"):
        options["persistent_workers"] = True
    if steps >= LOADER_VARIANTS.index("pinned"):
        options["pin_memory"] = device.type == "cuda"
    return options


def _samples(steps: int | None, batch: int, n: int) -> int | None:
    """Samples `steps` batches hold, None (the whole split) when they cover it."""
    return None if steps is None or steps * batch >= n else steps * batch


def data_path(
    variant: str,
    parquet: Path,
    shards: Path,
    device: torch.device,
    *,
    dataset: str,
    batch_size: int,
    seed: int,
    workers: int,
    epoch_samples: int | None = None,
) -> DataPath:
    """Build one eager variant's batch sources from `dataset`'s inputs (wide Parquet or shards),
    each checked before use; with `epoch_samples`, for epochs of that many samples (sampled
    timing, `DataPath.sampled_steps`)."""
    steps = lambda n, b: math.ceil(n / b)  # noqa: E731
    if variant in LOADER_VARIANTS:
        cls = PreprocessedDataset if variant == "preprocessed" else NaiveDataset
        train_set, test_set = (cls(checked_parquet(parquet, split)) for split in SPLITS)
        options = loader_options(variant, workers, device)
        batch = 16 if variant == "naive_bs16" else batch_size
        train_steps, test_steps = steps(len(train_set), batch), steps(len(test_set), batch)
        sampled = sampled_steps(epoch_samples, batch, train_steps)
        sampled_test = sampled_test_steps(sampled, train_steps, test_steps)
        train_loader = _loader(train_set, batch, True, seed, _samples(sampled, batch, len(train_set)), **options)
        test_loader = _loader(test_set, batch, False, seed, _samples(sampled_test, batch, len(test_set)), **options)
        return DataPath(
            lambda: train_loader, lambda: test_loader, train_steps, test_steps, batch, sampled, sampled_test
        )
    if variant == "batched":
        train_set, test_set = (
            ShardDataset(Path(shards) / split, dataset=dataset, split=split, transform=list(MODEL_INPUT))
            for split in SPLITS
        )
        pin = device.type == "cuda"
        train_loader = train_set.loader(batch_size, shuffle=True, seed=seed, pin_memory=pin)
        test_loader = test_set.loader(batch_size, pin_memory=pin)
        train_steps, test_steps = steps(len(train_set), batch_size), steps(len(test_set), batch_size)
        sampled = sampled_steps(epoch_samples, batch_size, train_steps)
        return DataPath(
            lambda: train_loader,
            lambda: test_loader,
            train_steps,
            test_steps,
            batch_size,
            sampled,
            sampled_test_steps(sampled, train_steps, test_steps),
        )
    if variant == "device":
        data = Resident.load(shards, device, dataset)
        train = DeviceBatches(
            {"images": data.train_images, "labels": data.train_labels},
            batch_size,
            shuffle=True,
            seed=seed,
            transform=list(MODEL_INPUT),
        )
        test = DeviceBatches(
            {"images": data.test_images, "labels": data.test_labels}, batch_size, transform=list(MODEL_INPUT)
        )
        sampled = sampled_steps(epoch_samples, batch_size, len(train))
        return DataPath(
            lambda: train,
            lambda: test,
            len(train),
            len(test),
            batch_size,
            sampled,
            sampled_test_steps(sampled, len(train), len(test)),
        )
    raise ValueError(f"unknown eager variant {variant!r}; expected one of {EAGER_VARIANTS}")
