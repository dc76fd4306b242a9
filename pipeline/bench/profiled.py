"""Where a rung's train step goes: the ladder's use of the time budget (`pipeline.budget`).

Eager rungs run their own steps through `TimeBudget`, as any user's loop would; a rung that
replays a whole epoch as one CUDA graph has no step to mark, so its epoch is one window
(`pipeline.budget.timed_window`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from pipeline.budget import TimeBudget


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
