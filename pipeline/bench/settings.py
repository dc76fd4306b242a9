"""The bench's settings: params.yaml's `bench` block, the `tuned` rung's recipe, quick mode.

One definition for every reader (the stage, the standalone bench, the estimate, the
benchmarks), apart from the ladder that runs them: the block's keys, ranges and defaults are
its settings model's (`pipeline.bench.params`), and what each rung trains with, its
hyper-parameters and its execution on this device, is decided here alone.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import torch

from pipeline.bench.runners import Execution, OneCycle, TrainConfig
from pipeline.budget import machine


@dataclass(frozen=True)
class BenchSettings:
    """params.yaml's `bench` block, as its settings model (`pipeline.bench.params`)
    checked it: that model is the one place its keys, ranges and defaults are stated."""

    parquet_codec: str  # the naive rungs' Parquet codec (dvc.yaml picks the folder)
    epochs: int
    batch_size: int
    lr: float
    seed: int
    num_workers: int  # 0: min(4, CPU count)
    variants: tuple[str, ...]
    # Variants timed over the samples of `sample_steps` train steps at `batch_size` (and as many
    # test samples) per epoch for `sample_epochs` epochs, then scaled to a full epoch. Empty:
    # every variant runs in full.
    sample: tuple[str, ...]
    sample_steps: int
    sample_epochs: int
    accuracy_tolerance: float  # vs the `preprocessed` variant (the write-up's best)
    # What `compiled` adds, per device type (see `runners.Execution`); chosen by measurement.
    compiled: dict
    floor: bool  # also time the floor: the same steps with no data path
    reuse_host_memory: bool  # keep freed host blocks in the heap (`hostmem`)
    # A variant whose timed epochs spread more than this (max - min over the median), or
    # whose twin doing identical work disagrees by more, is marked unstable.
    max_spread: float
    budget: bool  # profile `sample_steps` more steps per variant: its time budget
    quick: bool = False  # a first answer: QUICK's settings, marked in every table
    quick_minutes: float = 5.0  # quick: this data set's time budget, the rungs re-planned to fit
    # The test accuracies each data set's time to accuracy is measured to (data set -> the
    # fractions, ascending; a single number is one target).
    target_accuracy: dict = dataclasses.field(default_factory=dict)
    accuracy_seeds: int = 0  # fresh seeds the fastest rung's time to accuracy is taken again over
    # The `tuned` rung's recipe (`Recipe`); None: the rung is not configured.
    tuned: Recipe | None = None
    graph: str = "epoch"  # what one CUDA graph holds (`runners.GRAPH_SCOPES`)

    def targets(self, dataset: str) -> tuple[float, ...]:
        """The data set's target accuracies, ascending; () when it has none."""
        found = self.target_accuracy.get(dataset)
        if found is None:
            return ()
        return tuple(sorted(found)) if isinstance(found, (list, tuple)) else (float(found),)

    def workers(self) -> int:
        return self.num_workers or min(4, os.cpu_count() or 1)

    def budget_steps(self) -> int:
        """The steps each variant's profiled pass covers: 0, none, when `budget` is off."""
        return self.sample_steps if self.budget else 0

    def train_config(self, variant: str = "") -> TrainConfig:
        """The write-up's hyper-parameters; `tuned`'s recipe for that rung."""
        if variant == "tuned" and self.tuned is not None:
            return self.tuned.train_config(self.seed)
        return TrainConfig(batch_size=self.batch_size, lr=self.lr, seed=self.seed)

    def epochs_of(self, variant: str) -> int:
        """The epochs a fully run rung trains: the bench's; `tuned`'s schedule has its own length."""
        return self.tuned.epochs if variant == "tuned" and self.tuned is not None else self.epochs

    def execution(self, variant: str, device: torch.device) -> Execution:
        """`graphed` is `device` with static steps in CUDA graphs (fp32, as `device`), each
        holding `graph`'s scope; `compiled` adds what makes the model itself fast, per device type; `tuned` runs as
        `compiled` does."""
        if variant == "graphed":
            return Execution(cuda_graph=True, graph_scope=self.graph)
        options = self.compiled.get(device.type) or {}
        autocast = options.get("autocast")
        return Execution(
            compile_mode=str(options.get("compile_mode", "none")),
            autocast=native_bf16(device) if autocast == "auto" else bool(autocast),
            channels_last=bool(options.get("channels_last")),
            cuda_graph=bool(options.get("cuda_graph")),
            graph_scope=self.graph,
        )


@dataclass(frozen=True)
class Recipe:
    """params.yaml's `bench.tuned`: the `tuned` rung's training recipe, and the fresh seeds
    its accuracy and time to accuracy are measured over (a recipe is judged by its spread,
    not by one lucky seed)."""

    epochs: int
    batch_size: int
    max_lr: float
    pct_start: float
    betas: tuple[float, float]
    seeds: int

    def train_config(self, seed: int) -> TrainConfig:
        return TrainConfig(
            batch_size=self.batch_size,
            lr=self.max_lr,
            seed=seed,
            betas=tuple(self.betas),
            schedule=OneCycle(max_lr=self.max_lr, pct_start=self.pct_start),
        )


# pragma: no mutate start (probes the device: exercised by test_bench, too slow per mutant)
def native_bf16(device: torch.device) -> bool:
    """Whether bf16 autocast pays here: on CUDA, and on CPUs whose flags list AMX-BF16 or
    AVX512-BF16 (Linux's /proc/cpuinfo; elsewhere fp32 is kept). On other CPUs bf16 is
    emulated and slower per step than fp32, so `compiled` keeps fp32 there."""
    return device.type == "cuda" or machine.native_bf16(machine.cpu_flags())


# pragma: no mutate end


# `bench.quick`: every rung, fewer epochs and fewer sampled steps, no floor and no profiled
# epoch: the shape of the answer in a few minutes. One warm-up epoch and one timed one, so no
# spread (its tables say "n/a" and every one is marked quick).
QUICK = {"epochs": 2, "sample_steps": 5, "sample_epochs": 2, "floor": False, "budget": False, "accuracy_seeds": 0}
QUICK_TUNED_SEEDS = 0  # quick: the tuned rung runs once, no seeds


def settings_from_params(block: dict) -> BenchSettings:
    """BenchSettings from params.yaml's `bench` block, already checked by the params schema
    (lists become tuples); with `quick`, QUICK's settings in place of the block's."""
    tuned = block.get("tuned")
    recipe = None if tuned is None else Recipe(**{**tuned, "betas": tuple(tuned["betas"])})
    settings = BenchSettings(
        **{**block, "variants": tuple(block["variants"]), "sample": tuple(block["sample"]), "tuned": recipe}
    )
    if not settings.quick:
        return settings
    quick_tuned = None if recipe is None else dataclasses.replace(recipe, seeds=QUICK_TUNED_SEEDS)
    return dataclasses.replace(settings, **QUICK, tuned=quick_tuned)
