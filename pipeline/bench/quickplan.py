"""The quick bench within its time budget: the rungs left, re-planned before each one.

`bench.quick` promises the shape of the answer in minutes, on a busy host too. Before each
rung the rest of the ladder is priced (`price`: an earlier run's parts scaled to this machine
by the calibration, then by how far this run has run behind or ahead of that so far); where
it does not fit in what is left of `bench.quick_minutes`, the rest is planned cheaper, one
lever at a time: fewer sampled steps, then the eager rungs timed on a sample of steps (no
accuracy), then rungs left out (the ladder's anchors last, one whole-epoch rung always
kept). Every cut is printed and recorded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from pipeline.bench.settings import BenchSettings
from pipeline.bench.variants import EAGER_VARIANTS

MIN_SAMPLE_STEPS = 2  # a sampled epoch's steps: below this a step's time is mostly its first
FILL = 0.85  # of the time left a plan may take: a rung may run slower than priced

# rung -> its predicted seconds, for the settings and rungs given
Pricer = Callable[[BenchSettings, tuple[str, ...]], dict[str, float]]


@dataclass(frozen=True)
class Plan:
    """The settings the rungs left run with, the rungs left out, and each cut in words."""

    settings: BenchSettings
    skipped: tuple[str, ...] = ()
    cuts: tuple[str, ...] = ()


def cheaper(settings: BenchSettings, rest: tuple[str, ...]) -> Iterator[Plan]:
    """Plans for the rungs `rest`, each cheaper than the one before: the settings as they
    are, fewer sampled steps, then the eager rungs of `rest` sampled too."""
    yield Plan(settings)
    cuts: tuple[str, ...] = ()
    for steps in (3, MIN_SAMPLE_STEPS):
        if steps < settings.sample_steps:
            settings = dataclasses.replace(settings, sample_steps=steps)
            cuts = (f"{steps} sampled steps an epoch",)
            yield Plan(settings, cuts=cuts)
    whole = tuple(r for r in rest if r in EAGER_VARIANTS and r not in settings.sample)
    if whole:
        settings = dataclasses.replace(settings, sample=settings.sample + whole)
        yield Plan(settings, cuts=cuts + (f"{', '.join(whole)} timed on sampled steps (no accuracy)",))


# The rungs the ladder's comparisons rest on: the write-up's baseline, its best, data on the
# device, and the fast rungs; the others are left out first where time runs short.
ANCHORS = ("naive", "preprocessed", "device", "compiled", "tuned")
BASELINE = "naive"  # never left out: the ladder's speed-ups are against it


def plan_rest(
    settings: BenchSettings, rest: tuple[str, ...], price: Pricer, left_s: float, need_whole: bool = False
) -> Plan:
    """The first of `cheaper`'s plans whose price fits in `FILL` of `left_s`; where none does,
    the cheapest, with rungs left out until it fits: the others before the ANCHORS, the
    dearest first, and the first rung of `rest` only when it alone does not fit; never the
    BASELINE. With
    `need_whole` (no rung has run whole epochs yet), the cheapest rung of `rest` that runs
    whole epochs is kept: the summary's steady epoch needs one."""
    plan = Plan(settings)
    for plan in cheaper(settings, rest):
        if sum(price(plan.settings, rest).values()) <= FILL * left_s:
            return plan
    costs = price(plan.settings, rest)
    whole = [r for r in rest if r not in plan.settings.sample]
    keep = {min(whole, key=lambda r: costs[r])} if need_whole and whole else set()
    keep |= {BASELINE} & set(rest)  # every speed-up is against it
    kept = list(rest)
    while sum(costs[r] for r in kept) > FILL * left_s:
        movable = [r for r in kept[1:] if r not in keep] or [r for r in kept if r not in keep]
        if not movable:
            break
        others = [r for r in movable if r not in ANCHORS]
        kept.remove(max(others or movable, key=lambda r: costs[r]))
    return Plan(plan.settings, tuple(r for r in rest if r not in kept), plan.cuts)
