"""What each rung trains with on this device: its hyper-parameters (`TrainConfig`) and its
execution (`Execution`), from the bench's settings; decided here alone."""

from __future__ import annotations

import torch

from pipeline.bench.runners import OneCycle, TrainConfig
from pipeline.bench.settings import BenchSettings, Compiled, Recipe
from pipeline.bench.variants import Execution
from pipeline.budget import cpu_flags, native_bf16

EAGER = Compiled("none", False, False, False)  # a device type `bench.compiled` has no entry for


def recipe_config(recipe: Recipe, seed: int) -> TrainConfig:
    """The `tuned` recipe's hyper-parameters: Adam at its betas, a one-cycle rate, the loss's
    label smoothing."""
    return TrainConfig(
        batch_size=recipe.batch_size,
        lr=recipe.max_lr,
        seed=seed,
        betas=tuple(recipe.betas),
        schedule=OneCycle(max_lr=recipe.max_lr, pct_start=recipe.pct_start),
        label_smoothing=recipe.label_smoothing,
    )


def train_config(settings: BenchSettings, variant: str = "") -> TrainConfig:
    """The write-up's hyper-parameters; `tuned`'s recipe for that rung."""
    if variant == "tuned" and settings.tuned is not None:
        return recipe_config(settings.tuned, settings.seed)
    return TrainConfig(batch_size=settings.batch_size, lr=settings.lr, seed=settings.seed)


def execution_of(settings: BenchSettings, variant: str, device: torch.device) -> Execution:
    """`graphed` is `device` with static steps in CUDA graphs (fp32, as `device`), each
    holding `bench.graph`'s scope; `compiled` adds what makes the model itself fast, per
    device type; `tuned` runs as `compiled` does."""
    if variant == "graphed":
        return Execution(cuda_graph=True, graph_scope=settings.graph)
    options = settings.compiled.get(device.type) or EAGER
    return Execution(
        compile_mode=options.compile_mode,
        autocast=bf16_pays(device) if options.autocast == "auto" else options.autocast,
        channels_last=options.channels_last,
        cuda_graph=options.cuda_graph,
        graph_scope=settings.graph,
    )


# pragma: no mutate start (probes the device: exercised by test_bench, too slow per mutant)
def bf16_pays(device: torch.device) -> bool:
    """Whether bf16 autocast pays here: on CUDA, and on CPUs whose flags list AMX-BF16 or
    AVX512-BF16 (Linux's /proc/cpuinfo; elsewhere fp32 is kept). On other CPUs bf16 is
    emulated and slower per step than fp32, so `compiled` keeps fp32 there."""
    return device.type == "cuda" or native_bf16(cpu_flags())


# pragma: no mutate end
