"""A bench run's figures: per-epoch summaries, times to accuracy, speed-ups, unstable marks.

Pure functions over timings and bench documents, with no training, so the tests pin down
every figure the metrics carry without running a step. Per variant the metrics hold the
steady per-epoch figures and what a user pays in all: `setup_s` (building the data path,
compiling, warming up, capturing) and `wall_s` (setup plus every epoch, train and test). A
timing of sampled epochs is scaled to the full epoch and marked `extrapolated`, and its
accuracy is not reported (not measured).
"""

from __future__ import annotations

import dataclasses
import math
import statistics

from pipeline.bench.document import BenchDoc, BudgetDoc, Measured, Spread, TimeToAccuracy, Variant
from pipeline.bench.runners import Timing
from pipeline.bench.settings import BenchSettings
from pipeline.bench.variants import writeup_recipe


def _sampled_epochs(seconds: list[float], scale: float, epochs: int) -> tuple[float, float, float]:
    """(steady epoch, first epoch, all `epochs`) from epochs timed over a sample of steps.

    The steady epoch scales the median of the epochs after the first by the steps left out.
    What the first epoch took beyond that is a one-time cost (worker start-up, CUDA
    initialisation, cuDNN's first search): added once, not scaled with the steps."""
    steady_sample = statistics.median(seconds[1:] or seconds)
    steady = steady_sample * scale
    first = steady + max(0.0, seconds[0] - steady_sample)
    return steady, first, first + steady * (epochs - 1)


def time_to_accuracy(timing: Timing, target: float) -> TimeToAccuracy:
    """From the variant's start to the end of the first test pass that reached `target`, and
    that pass's epoch (1-based); all but the target None when no timed epoch reached it. `seconds` counts the whole setup (what the user waits for, in
    this process); `warm_seconds` leaves the warm-up and capture out of it, as public records
    time a run (compile and capture done by an untimed warm-up, the model reset after it)."""
    elapsed = timing.setup_s
    for epoch, (train, test, accuracy) in enumerate(zip(timing.train_s, timing.test_s, timing.accuracies), 1):
        elapsed += train + test
        if accuracy >= target:
            warm = max(0.0, elapsed - timing.warmup_s - timing.capture_s)
            return TimeToAccuracy(target=target, seconds=round(elapsed, 3), warm_seconds=round(warm, 3), epoch=epoch)
    return TimeToAccuracy(target=target)


def times_to_accuracy(timing: Timing, targets: tuple[float, ...]) -> list[TimeToAccuracy] | None:
    """`time_to_accuracy` for each target, in order; None when there is none."""
    return [time_to_accuracy(timing, target) for target in targets] or None


def summarise(
    timing: Timing,
    train_steps: int,
    test_steps: int,
    settings: BenchSettings,
    targets: tuple[float, ...] = (),
    epochs: int | None = None,
) -> Variant:
    """Steady per-epoch figures and the whole cost of the configured epochs (`wall_s`); a
    timing of sampled epochs (`timing.sampled_steps`) is scaled to `epochs` whole ones (the
    bench's by default). With `targets` and whole epochs, the time to each test accuracy
    (sampled ones measure no accuracy)."""
    sampled = timing.sampled_steps is not None
    if sampled:
        epochs = settings.epochs if epochs is None else epochs
        train, first, train_all = _sampled_epochs(timing.train_s, train_steps / timing.sampled_steps, epochs)
        tested = timing.sampled_test_steps or min(timing.sampled_steps, test_steps)
        test, _, test_all = _sampled_epochs(timing.test_s, test_steps / tested, epochs)
    else:
        train, test = statistics.median(timing.train_s), statistics.median(timing.test_s)
        first, train_all, test_all = timing.train_s[0], sum(timing.train_s), sum(timing.test_s)
    return Variant(
        train_s=round(train, 4),
        test_s=round(test, 4),
        first_epoch_train_s=round(first, 4),
        setup_s=round(timing.setup_s, 3),
        warmup_s=round(timing.warmup_s, 3),
        capture_s=round(timing.capture_s, 3),
        wall_s=round(timing.setup_s + train_all + test_all, 3),
        accuracy=None if sampled or timing.accuracy is None else round(timing.accuracy, 4),
        extrapolated=sampled,
        cuda_graph=timing.cuda_graph,
        measured=Measured(train_s=[round(s, 4) for s in timing.train_s], test_s=[round(s, 4) for s in timing.test_s]),
        spread=spread(timing.train_s),
        budget=None if timing.budget is None else with_epoch_step(timing.budget, steady_step(timing, train_steps)),
        accuracy_by_epoch=None if sampled else [round(a, 4) for a in timing.accuracies],
        time_to_accuracy=None if sampled else times_to_accuracy(timing, targets),
    )


def with_epoch_step(budget: dict, epoch_step_s: float) -> BudgetDoc:
    """The budget beside the timed epochs' seconds per step, and their ratio: the profiled
    pass is steps of one more epoch of the same kind, so the two should agree within the noise."""
    ratio = budget["step_s"] / epoch_step_s if epoch_step_s > 0 else None
    return BudgetDoc(**budget, epoch_step_s=round(epoch_step_s, 6), vs_epoch=None if ratio is None else round(ratio, 3))


def steady_epochs(seconds: list[float]) -> list[float]:
    """The timed epochs that show the steady state: all but the first (worker start-up,
    first cuDNN search, caches) when at least two others remain."""
    return seconds[1:] if len(seconds) >= 3 else seconds


def spread(seconds: list[float]) -> Spread:
    """min / median / max of the steady train epochs, in seconds per timed epoch (sampled
    variants: per sampled epoch, which is what was measured)."""
    steady = steady_epochs(seconds)
    return Spread(min=round(min(steady), 4), median=round(statistics.median(steady), 4), max=round(max(steady), 4))


def steady_step(timing: Timing, train_steps: int) -> float:
    """Seconds per train step in the timed epochs, to set beside the profiled pass's."""
    steps = train_steps if timing.sampled_steps is None else timing.sampled_steps
    return statistics.median(steady_epochs(timing.train_s)) / max(steps, 1)


def seconds_spread(seconds: list[float | None]) -> dict:
    """Seconds to a target over seeds, a seed that never reached it (None) counted as slower
    than every other: the median is None when half or more missed, the max when any did."""
    ranked = sorted(seconds, key=lambda s: math.inf if s is None else s)
    middle = ranked[(len(ranked) - 1) // 2 : len(ranked) // 2 + 1]
    done = [s for s in seconds if s is not None]
    return {
        "seconds": seconds,
        "reached": len(done),
        "min": min(done) if done else None,
        "median": None if None in middle else round(statistics.mean(middle), 3),
        "max": None if len(done) < len(seconds) else max(done),
    }


# The floor each rung is bounded by; every other rung runs plain eager steps. `tuned` has none:
# its batch and steps are its recipe's, not the floors'.
FLOOR_OF = {"graphed": "graphed", "compiled": "compiled", "tuned": None}


def floor_field(kind: str) -> str:
    """The `FloorDoc` field of a floor kind: `train_s` for plain eager steps, else `<kind>_train_s`."""
    return "train_s" if kind == "eager" else f"{kind}_train_s"


def finish(document: BenchDoc, settings: BenchSettings) -> BenchDoc:
    """Speed-ups against `naive` (steady epochs and wall time), samples/s, the accuracy check
    and the unstable marks. A rung of its own recipe (`variants.writeup_recipe`) trains other
    epochs: its epoch is set beside naive's (the same data once), its wall time and accuracy
    are not (they are its seeds' claim)."""
    variants = document.variants
    n_train = document.params.train_samples
    reference = variants.get("naive")
    anchor = variants.get("preprocessed") or next(
        (v for name, v in variants.items() if v.accuracy is not None and writeup_recipe(name)), None
    )
    finished = {}
    for name, entry in variants.items():
        figures = {}
        if reference:
            figures["speedup"] = round((reference.train_s + reference.test_s) / (entry.train_s + entry.test_s), 2)
            if writeup_recipe(name):
                figures["wall_speedup"] = round(reference.wall_s / entry.wall_s, 2)
        if n_train:
            figures["samples_per_s"] = round(n_train / entry.train_s)
        if entry.accuracy is not None and anchor and anchor.accuracy is not None and writeup_recipe(name):
            # Accuracies carry 4 decimals: compare the difference at that precision, so a
            # difference of exactly the tolerance passes (0.99 - 0.98 is 0.01000000000000001).
            figures["accuracy_ok"] = round(abs(entry.accuracy - anchor.accuracy), 6) <= settings.accuracy_tolerance
        finished[name] = dataclasses.replace(entry, **figures)
    done = dataclasses.replace(document, variants=finished, accuracy_tolerance=settings.accuracy_tolerance)
    return flag_unstable(done, settings.max_spread)


# On the CPU `pinned` does exactly what `persistent` does (pin_memory only pins for CUDA):
# two timings of one piece of work, so their gap is the machine's noise.
TWINS = {"cpu": [("persistent", "pinned")]}


def flag_unstable(document: BenchDoc, max_spread: float) -> BenchDoc:
    """Mark each variant `unstable` (with why) whose steady epochs spread more than
    `max_spread` of their median, whose twin disagrees by more than that, or that beats the
    floor of its own options by more than that (`below_floor`)."""
    variants, floor_ = document.variants, document.floor
    reasons: dict[str, list[str]] = {name: [] for name in variants}
    below = set()
    for name, entry in variants.items():
        low, mid, high = entry.spread.min, entry.spread.median, entry.spread.max
        if mid > 0 and (high - low) / mid > max_spread:
            reasons[name].append(f"epochs spread {(high - low) / mid:.0%} of their median")
        kind = FLOOR_OF.get(name, "eager")
        bound = None if kind is None else getattr(floor_, floor_field(kind))
        if bound and entry.train_s < bound * (1 - max_spread):
            reasons[name].append(f"{entry.train_s:.3g} s/epoch is below its floor {bound:.3g} s")
            below.add(name)
    device_type = document.env.device_type if document.env else "cpu"
    for a, b in TWINS.get(device_type, []):
        if a in variants and b in variants:
            x, y = variants[a].train_s, variants[b].train_s
            if min(x, y) > 0 and abs(x - y) / min(x, y) > max_spread:
                for name, twin in ((a, b), (b, a)):
                    reasons[name].append(
                        f"{abs(x - y) / min(x, y):.0%} apart from {twin}, which does the same work here"
                    )
    marked = {
        name: dataclasses.replace(
            entry,
            below_floor=name in below,
            unstable=bool(reasons[name]),
            unstable_reason="; ".join(reasons[name]) or None,
        )
        for name, entry in variants.items()
    }
    return dataclasses.replace(document, variants=marked)
