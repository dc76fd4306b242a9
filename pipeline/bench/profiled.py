"""Where a rung's train step goes: the ladder's use of the time budget (`pipeline.budget`).

Eager rungs run their own steps through `TimeBudget`, as any user's loop would; a rung that
replays a whole epoch as one CUDA graph has no step to mark, so its epoch is one window.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from pipeline.budget.timebudget import TimeBudget
from pipeline.budget.trace import RANGE, QuietProfiler, sync, window_parts


def profile_steps(
    batches: Iterator,
    to_device: Callable[[Any], Any],
    step: Callable[[Any], None],
    steps: int,
    device: torch.device,
    warmup: int = 2,
) -> dict:
    """Run `steps` train steps (after `warmup` unprofiled ones) under the profiler and
    return the parts per step, in seconds, with the pass's step time (`step_s`) and, on
    CUDA, the kernels launched per step.

    `batches` yields what the variant's loader yields; `to_device` moves one to the device;
    `step` trains on it."""
    budget = TimeBudget(device, steps=steps, skip=warmup, flops=False, threads_check=0, peak=None)
    for item in budget.batches(batches):
        with budget.copy():
            batch = to_device(item)
        with budget.step():
            step(batch)
        if budget.done:
            break
    if not budget.done or budget.result.partial:
        raise ValueError(f"the loader gave {budget.seen} batches, fewer than the {warmup} + {steps} to profile")
    return {**budget.result.per_step, "kernels_per_step": budget.result.kernels_per_step}


def timed_window(run: Callable[[], None], device: torch.device, steps: int) -> dict:
    """The parts of a whole replayed epoch (one CUDA graph), where no step can be marked:
    kernels are compute, memcpys copy, the rest of the host's wait overhead; with the
    kernels launched per step (None off CUDA)."""
    sync(device)
    with QuietProfiler(device) as prof:
        start = time.perf_counter()
        with torch.profiler.record_function(RANGE + "step"):
            run()
            sync(device)
        wall = time.perf_counter() - start
    window = window_parts(list(prof.events()), steps, wall, device, flops=False)
    return {**window.per_step, "kernels_per_step": window.kernels_per_step}
