"""Stage `bench@<dataset>`: the seed's training ladder, timed per epoch, and beyond it.

Every variant trains the same SimpleCNN from the same seed with Adam (lr 1e-3) and
cross-entropy, testing after every epoch; only the data path (and, last, the execution of
the model) changes. Clocks are read after synchronising the device. Variants whose
per-item pandas path would take many minutes per epoch on a small CPU can be timed over a
fixed number of steps per epoch; their per-epoch figures are then scaled to the full
epoch and marked `extrapolated`, and their accuracy is not reported (not measured).

This module imports only torch, numpy, pandas and pyarrow (plus the shards reader), so it
runs on the lent GPU machines, which lack polars, dvc and zstandard.
"""

from __future__ import annotations

import gc
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn

from pipeline.model import SimpleCNN, parameter_count
from pipeline.shards import DeviceBatches, ShardDataset, load_split, read_manifest, to_float

VARIANTS = ("naive_bs16", "naive", "workers", "persistent", "pinned", "preprocessed",
            "batched", "device", "compiled")
Batch = tuple[torch.Tensor, torch.Tensor]


# ---------------------------------------------------------------- the seed's Datasets


class NaiveDataset(torch.utils.data.Dataset):
    """The seed's Dataset v1: a pandas frame, and all the work per item, every epoch."""

    def __init__(self, parquet_path: Path) -> None:
        self.df = pd.read_parquet(parquet_path)
        self.feature_cols = [c for c in self.df.columns if c != "label"]

    def __len__(self) -> int:
        return len(self.df)

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        row = self.df.iloc[idx]
        features = row[self.feature_cols].values.astype(np.float32)
        image = torch.tensor(features).reshape(1, 28, 28) / 255.0
        label = torch.tensor(row["label"], dtype=torch.long)
        return {"image": image, "label": label}


class PreprocessedDataset(torch.utils.data.Dataset):
    """The seed's Dataset v2: everything converted once in `__init__`; items only index."""

    def __init__(self, parquet_path: Path) -> None:
        df = pd.read_parquet(parquet_path)
        features = df.drop(columns="label").to_numpy(dtype=np.float32)
        self.images = torch.from_numpy(np.require(features, requirements="W")).reshape(-1, 1, 28, 28) / 255.0
        self.labels = torch.from_numpy(df["label"].to_numpy().astype(np.int64))

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        return {"image": self.images[idx], "label": self.labels[idx]}


# ---------------------------------------------------------------- settings and results


@dataclass(frozen=True)
class BenchSettings:
    epochs: int = 5
    batch_size: int = 512
    lr: float = 1e-3
    seed: int = 42
    num_workers: int = 0                 # 0: min(4, CPU count)
    variants: tuple[str, ...] = VARIANTS
    # Variants timed over `sample_steps` train steps (and as many test steps) per epoch for
    # `sample_epochs` epochs, then scaled to a full epoch. Empty: every variant runs in full.
    sample: tuple[str, ...] = ()
    sample_steps: int = 20
    sample_epochs: int = 2
    accuracy_tolerance: float = 0.01     # vs the `preprocessed` variant (the seed's best)
    # What `compiled` adds, per device type: torch.compile mode ("none": eager), bf16
    # autocast, channels_last. Chosen by measurement (README, "Results").
    compiled: dict = field(default_factory=lambda: {
        "cpu": {"compile_mode": "none", "autocast": True, "channels_last": True},
        "cuda": {"compile_mode": "max-autotune", "autocast": True, "channels_last": True},
    })
    floor: bool = True                   # also time the pure-compute floor (a fixed batch)

    def workers(self) -> int:
        return self.num_workers or min(4, os.cpu_count() or 1)


@dataclass
class Timing:
    train_s: list[float] = field(default_factory=list)
    test_s: list[float] = field(default_factory=list)
    accuracy: float | None = None
    loss: float | None = None
    first_epoch_s: float | None = None


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------- one training run


@dataclass
class DataPath:
    """How a variant feeds the model: train and test batch sources, remade per epoch."""

    train: Callable[[], Iterable]
    test: Callable[[], Iterable]
    train_steps: int
    test_steps: int


def _as_batch(item, device: torch.device, non_blocking: bool) -> Batch:
    x, y = (item["image"], item["label"]) if isinstance(item, dict) else item
    return x.to(device, non_blocking=non_blocking), y.to(device, non_blocking=non_blocking)


def _limited(iterable: Iterable, steps: int | None) -> Iterator:
    for step, item in enumerate(iterable):
        if steps is not None and step >= steps:
            return
        yield item


def run_variant(path: DataPath, device: torch.device, settings: BenchSettings, *, steps: int | None,
                epochs: int, compile_mode: str = "none", autocast: bool = False,
                channels_last: bool = False, progress: str = "") -> tuple[Timing, float]:
    """Train and test for `epochs`; `steps` caps the steps per epoch (sampled timing)."""
    torch.manual_seed(settings.seed)
    model = SimpleCNN().to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.Adam(model.parameters(), lr=settings.lr)
    loss_fn = nn.CrossEntropyLoss()
    forward: Callable = model
    compile_s = 0.0
    non_blocking = device.type == "cuda"

    def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            loss = loss_fn(forward(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss

    if compile_mode != "none":
        forward = torch.compile(model, mode=compile_mode)
        compile_s = _warm_up(train_step, forward, path, device, autocast)
        torch.manual_seed(settings.seed)  # the warm-up trained: reset weights and optimizer
        model.load_state_dict(SimpleCNN().to(device).state_dict())
        optimizer = torch.optim.Adam(model.parameters(), lr=settings.lr)

    timing = Timing()
    for epoch in range(epochs):
        sync(device)
        start = time.perf_counter()
        total_loss = torch.zeros((), device=device)
        for item in _limited(path.train(), steps):
            x, y = _as_batch(item, device, non_blocking)
            total_loss += train_step(x, y).detach()
        sync(device)
        timing.train_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        correct, seen = torch.zeros((), device=device, dtype=torch.long), 0
        with torch.inference_mode(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            for item in _limited(path.test(), steps):
                x, y = _as_batch(item, device, non_blocking)
                correct += (forward(x).argmax(1) == y).sum()
                seen += len(y)
        accuracy = correct.item() / max(seen, 1)
        sync(device)
        timing.test_s.append(time.perf_counter() - start)
        timing.accuracy, timing.loss = accuracy, total_loss.item() / max(steps or path.train_steps, 1)
        print(f"  {progress} epoch {epoch + 1}/{epochs}: train {timing.train_s[-1]:.3f} s, "
              f"test {timing.test_s[-1]:.3f} s, accuracy {accuracy:.4f}", file=sys.stderr, flush=True)
    return timing, compile_s


def _warm_up(train_step: Callable, forward: Callable, path: DataPath, device: torch.device,
             autocast: bool) -> float:
    """Compile outside the timed epochs: a few train and eval steps (weights reset afterwards)."""
    sync(device)
    start = time.perf_counter()
    for _ in range(2):
        for item in _limited(path.train(), 3):
            train_step(*_as_batch(item, device, False))
        with torch.inference_mode(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            for item in _limited(path.test(), 2):
                forward(_as_batch(item, device, False)[0])
    sync(device)
    return time.perf_counter() - start


# ---------------------------------------------------------------- the variants' data paths


def _loader(dataset, batch_size: int, shuffle: bool, seed: int, **kwargs) -> torch.utils.data.DataLoader:
    generator = torch.Generator().manual_seed(seed) if shuffle else None
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=shuffle,
                                       generator=generator, **kwargs)


def data_path(variant: str, parquet: Path, shards: Path, device: torch.device,
              settings: BenchSettings, cache: dict) -> DataPath:
    """Build the batch sources of one variant; datasets are cached across variants."""
    bs, seed, workers = settings.batch_size, settings.seed, settings.workers()
    steps = lambda n, b: math.ceil(n / b)  # noqa: E731

    if variant in ("naive_bs16", "naive", "workers", "persistent", "pinned", "preprocessed"):
        cls = PreprocessedDataset if variant == "preprocessed" else NaiveDataset
        key = cls.__name__
        if key not in cache:
            cache[key] = tuple(cls(parquet / f"{split}.parquet") for split in ("train", "test"))
        train_set, test_set = cache[key]
        kwargs: dict = {}
        if variant in ("workers", "persistent", "pinned", "preprocessed"):
            kwargs["num_workers"] = workers
        if variant in ("persistent", "pinned", "preprocessed"):
            kwargs["persistent_workers"] = True
        if variant in ("pinned", "preprocessed"):
            kwargs["pin_memory"] = device.type == "cuda"
        batch = 16 if variant == "naive_bs16" else bs
        train_loader = _loader(train_set, batch, True, seed, **kwargs)
        test_loader = _loader(test_set, batch, False, seed, **kwargs)
        return DataPath(lambda: train_loader, lambda: test_loader,
                        steps(len(train_set), batch), steps(len(test_set), batch))

    if variant == "batched":
        if "shards_cpu" not in cache:
            cache["shards_cpu"] = tuple(ShardDataset(shards / split) for split in ("train", "test"))
        train_set, test_set = cache["shards_cpu"]
        pin = device.type == "cuda"
        train_loader = train_set.loader(bs, shuffle=True, generator=torch.Generator().manual_seed(seed),
                                        pin_memory=pin)
        test_loader = test_set.loader(bs, pin_memory=pin)
        return DataPath(lambda: train_loader, lambda: test_loader,
                        steps(len(train_set), bs), steps(len(test_set), bs))

    if variant in ("device", "compiled"):
        key = f"device_{device}"
        if key not in cache:
            cache[key] = tuple(load_split(shards / split, device) for split in ("train", "test"))
        (train_x, train_y), (test_x, test_y) = cache[key]
        channels_last = variant == "compiled" and _compiled_options(settings, device)["channels_last"]
        train = DeviceBatches(train_x, train_y, bs, shuffle=True, seed=seed, channels_last=channels_last)
        test = DeviceBatches(test_x, test_y, bs, shuffle=False, channels_last=channels_last)
        return DataPath(lambda: train, lambda: test, len(train), len(test))

    raise ValueError(f"unknown variant {variant!r}; expected one of {VARIANTS}")


def compute_floor(device: torch.device, settings: BenchSettings, train_steps: int, epochs: int = 3,
                  **options) -> float:
    """Seconds per epoch of the training steps alone, on one pre-made batch on the device.

    The fastest epoch, not the median: a floor is what the steps can do, and on a shared
    machine a neighbour's burst only ever slows an epoch down."""
    torch.manual_seed(settings.seed)
    x = to_float(torch.randint(0, 256, (settings.batch_size, 28, 28), dtype=torch.uint8, device=device),
                 channels_last=options.get("channels_last", False))
    y = torch.randint(0, 10, (settings.batch_size,), device=device)
    path = DataPath(lambda: [(x, y)] * train_steps, lambda: [], train_steps, 0)
    timing, _ = run_variant(path, device, settings, steps=None, epochs=epochs, progress="floor", **options)
    return min(timing.train_s)


# ---------------------------------------------------------------- the stage


def environment(device: torch.device) -> dict:
    env = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
           or platform.machine(), "device_type": device.type, "torch": torch.__version__,
           "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(),
           "python": platform.python_version()}
    return env


def _compiled_options(settings: BenchSettings, device: torch.device) -> dict:
    options = settings.compiled.get(device.type) or {}
    return {"compile_mode": str(options.get("compile_mode", "none")),
            "autocast": bool(options.get("autocast", False)),
            "channels_last": bool(options.get("channels_last", False))}


def run_bench(dataset: str, parquet: Path, shards: Path, device: str | torch.device,
              settings: BenchSettings) -> dict:
    """Every variant of the ladder on one data set; returns the metrics document."""
    device = torch.device(device)
    cache: dict = {}
    results: dict = {}
    for variant in settings.variants:
        path = data_path(variant, Path(parquet), Path(shards), device, settings, cache)
        sampled = variant in settings.sample
        options = _compiled_options(settings, device) if variant == "compiled" else {}
        epochs = settings.sample_epochs if sampled else settings.epochs
        steps = settings.sample_steps if sampled else None
        print(f"{dataset}/{variant}: {'sampled ' if sampled else ''}{epochs} epochs", file=sys.stderr)
        timing, compile_s = run_variant(path, device, settings, steps=steps, epochs=epochs,
                                        progress=f"{dataset}/{variant}", **options)
        results[variant] = summarise(timing, path, settings, sampled, compile_s)
        # Free this variant's loaders now: their (persistent) worker processes must not
        # share the CPU with the next variant's timed epochs.
        del path
        gc.collect()
    cache.clear()
    document = {"dataset": dataset, "env": environment(device),
                "params": {"epochs": settings.epochs, "batch_size": settings.batch_size,
                           "seed": settings.seed, "num_workers": settings.workers(),
                           "parameters": parameter_count(SimpleCNN())},
                "compiled_options": _compiled_options(settings, device),
                "variants": results}
    n_train = read_manifest(Path(shards) / "train")["count"]
    document["params"]["train_samples"] = n_train
    if settings.floor:
        train_steps = math.ceil(n_train / settings.batch_size)
        plain = compute_floor(device, settings, train_steps)
        document["floor"] = {"train_s": round(plain, 4)}
        if "compiled" in results:
            document["floor"]["compiled_train_s"] = round(
                compute_floor(device, settings, train_steps, **_compiled_options(settings, device)), 4)
    finish(document, settings)
    return document


def summarise(timing: Timing, path: DataPath, settings: BenchSettings, sampled: bool, compile_s: float) -> dict:
    # Sampled runs: the first epoch pays worker start-up, the median of the rest is steady state.
    scale_train = path.train_steps / settings.sample_steps if sampled else 1.0
    scale_test = path.test_steps / min(settings.sample_steps, path.test_steps) if sampled else 1.0
    train = statistics.median(timing.train_s) * scale_train
    test = statistics.median(timing.test_s) * scale_test
    entry = {
        "train_s": round(train, 4),
        "test_s": round(test, 4),
        "total_s": round((train + test) * settings.epochs, 3),
        "first_epoch_train_s": round(timing.train_s[0] * scale_train, 4),
        "accuracy": None if sampled else round(timing.accuracy or 0.0, 4),
        "extrapolated": sampled,
        "compile_s": round(compile_s, 2),
    }
    return entry


def finish(document: dict, settings: BenchSettings) -> None:
    """Speed-ups against `naive`, samples per second, and the accuracy check."""
    variants = document["variants"]
    n_train = document["params"]["train_samples"]
    reference = variants.get("naive")
    anchor = variants.get("preprocessed") or next(
        (v for v in variants.values() if v["accuracy"] is not None), None)
    for entry in variants.values():
        if reference:
            entry["speedup"] = round(reference["total_s"] / entry["total_s"], 2)
        if n_train:
            entry["samples_per_s"] = round(n_train / entry["train_s"])
        if entry["accuracy"] is not None and anchor and anchor["accuracy"] is not None:
            entry["accuracy_ok"] = abs(entry["accuracy"] - anchor["accuracy"]) <= settings.accuracy_tolerance
    document["accuracy_tolerance"] = settings.accuracy_tolerance


def write_bench(document: dict, out: Path) -> None:
    from pipeline.atomic import write_text

    write_text(Path(out), json.dumps(document, indent=2) + "\n")
