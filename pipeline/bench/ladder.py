"""The write-up's training ladder, timed per epoch, and beyond it: what stage `bench@` runs.

Every variant trains the same SimpleCNN from the same seed; only the data path
(`datapaths`) and, on the last rungs, the way the steps run (`runners`) change; `tuned`
changes the recipe (`settings.Recipe`), measured over its seeds. This module trains; the
settings (`pipeline.bench.settings`) and the figures (`pipeline.bench.figures`) live apart,
testable without a step. It imports only torch, numpy, pandas and pyarrow (plus the shards
reader), so it runs where polars, dvc and zstandard are absent (`standalone-bench`).
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from pipeline.bench.datapaths import Resident, check_same_data, data_path
from pipeline.bench.document import (
    BenchDoc,
    Calibration,
    Env,
    FloorDoc,
    QuickPlan,
    RunParams,
    Seeds,
    TargetSeconds,
    TunedSeeds,
    Variant,
)
from pipeline.bench.estimate import (
    Pace,
    announce,
    busy_processes,
    calibrate,
    find_reference,
    host_report,
    pace_for,
    predict,
    reference_step_s,
    settings_of,
)
from pipeline.bench.figures import FLOOR_OF, finish, floor_field, seconds_spread, summarise, time_to_accuracy
from pipeline.bench.hostmem import reuse_host_memory
from pipeline.bench.model import SimpleCNN, parameter_count
from pipeline.bench.quickplan import Plan, Pricer, plan_rest
from pipeline.bench.recipe import execution_of, train_config
from pipeline.bench.runners import Floor, Timing, cudnn_benchmark, train_eager, train_static
from pipeline.bench.settings import BenchSettings, Recipe
from pipeline.bench.variants import LOADER_VARIANTS, STATIC_VARIANTS, Execution, writeup_recipe
from pipeline.budget import duration
from pipeline.shards.format import read_manifest


# pragma: no mutate start (runs training: exercised by test_bench, too slow per mutant)
def run_variant(
    variant: str,
    dataset: str,
    parquet: Path,
    shards: Path,
    device: torch.device,
    settings: BenchSettings,
    progress: str = "",
    until: float | None = None,
) -> tuple[Timing, int, int]:
    """Build one variant's inputs and train it; returns (timing, train steps, test steps).
    With `until`, its epochs stop at the first test pass at that accuracy.

    The clock starts before anything of the variant is built, so `setup_s` is all a user
    waits for before its first step."""
    started = time.perf_counter()
    config = train_config(settings, variant)
    if variant in STATIC_VARIANTS:
        data = Resident.load(shards, device, dataset)
        timing = train_static(
            data,
            device,
            config,
            execution_of(settings, variant, device),
            epochs=settings.epochs_of(variant),
            started=started,
            progress=progress,
            budget=settings.budget_steps(),
            until=until,
        )
        return (
            timing,
            math.ceil(len(data.train_labels) / config.batch_size),
            math.ceil(len(data.test_labels) / config.batch_size),
        )
    sampled = variant in settings.sample
    # a sampled rung's epoch: the samples of `sample_steps` steps at the bench's batch size,
    # whatever its own batch, so every sampled rung is timed over the same data
    path = data_path(
        variant,
        parquet,
        shards,
        device,
        dataset=dataset,
        batch_size=config.batch_size,
        seed=config.seed,
        workers=settings.workers(),
        epoch_samples=settings.sample_steps * settings.batch_size if sampled else None,
    )
    timing = train_eager(
        path,
        device,
        config,
        epochs=settings.sample_epochs if sampled else settings.epochs,
        steps=path.sampled_steps,
        test_steps=path.sampled_test_steps,
        started=started,
        progress=progress,
        budget=settings.budget_steps(),
        until=until,
    )
    return timing, path.train_steps, path.test_steps


def environment(device: torch.device, device_init_s: float) -> Env:
    return Env(
        device=torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or platform.machine(),
        device_type=device.type,
        torch=torch.__version__,
        cuda=torch.version.cuda,
        cpu_count=os.cpu_count(),
        threads=torch.get_num_threads(),
        python=platform.python_version(),
        device_init_s=round(device_init_s, 3),
    )


def run_bench(
    dataset: str,
    parquet: Path,
    shards: Path,
    device: str | torch.device,
    settings: BenchSettings,
    earlier: list[Path] = (),
    machine: str | None = None,
) -> BenchDoc:
    """Every variant of the ladder on one data set; returns the full bench document, with
    `wall_s`: the seconds the whole bench took (floor, variants, profiled passes, seeds).

    First it calibrates and prints what the bench will take, scaled from the `earlier` bench
    document of this device type and mode (`machine`'s own preferred; `estimate`), and says
    so when the host is too busy to measure well."""
    started = time.perf_counter()
    device = torch.device(device)
    if set(settings.variants) & set(LOADER_VARIANTS):  # the rungs that read the Parquet
        check_same_data(Path(parquet), Path(shards), dataset)
    pace = announce_bench(dataset, device, settings, list(earlier), machine)
    with cudnn_benchmark(device), reuse_host_memory(settings.reuse_host_memory) as host_memory:
        document = _run_bench(dataset, Path(parquet), Path(shards), device, settings, pace, started)
    return dataclasses.replace(
        document,
        env=dataclasses.replace(document.env, host_memory=host_memory),
        calibration=pace.calibration.written(),
        wall_s=round(time.perf_counter() - started, 1),
    )


@dataclass
class Announced:
    """What the bench printed before it began: its calibration and, where an earlier run
    exists, the pace the time left is reckoned by."""

    calibration: Calibration
    pace: Pace | None
    reference: dict | None = None  # the earlier run the pace scales from

    def left(self, done: dict[str, float], elapsed: float, variants_done: int, variants: int) -> str:
        """'; 2 min so far, about 12 min left' (the earlier run's parts, at this run's pace,
        where known; else the variants' average so far). `done`: part -> its seconds."""
        if self.pace is not None:
            left = self.pace.left(done)
        elif variants_done == variants:
            return f"; {duration(elapsed)} so far"
        elif variants_done:
            left = elapsed / variants_done * (variants - variants_done)
        else:
            return ""
        return f"; {duration(elapsed)} so far, about {duration(left)} left"


def announce_bench(
    dataset: str, device: torch.device, settings: BenchSettings, earlier: list[Path], machine: str | None
) -> Announced:
    """Calibrate, find the earlier run to scale from, and print the estimate (this data set
    and the others `earlier` holds) and, on a busy host, what runs beside the bench."""
    busy = busy_processes(exclude=(os.getppid(),))
    calibration = calibrate(device, settings.batch_size)
    reference = None
    try:
        reference = find_reference(dataset, earlier, device.type, settings.quick, machine)
        pace = pace_for(reference, calibration, settings) if reference else None
        others = {}
        for name in sorted({path.stem for path in earlier} - {dataset}):
            other = find_reference(name, earlier, device.type, settings.quick, machine)
            if other:
                others[name] = pace_for(other, calibration, settings).total()
        said = announce(dataset, reference, calibration, pace, others)
    except Exception as err:  # an earlier run's file is a hint: a malformed one never stops a bench
        pace = None
        said = f"bench {dataset}: no estimate (an earlier run's file could not be read: {type(err).__name__})"
    announced = Announced(calibration, pace, reference if pace is not None else None)
    if settings.quick:  # the estimate is the plan for the budget
        plan = plan_quick(announced, settings, settings.variants, {}, quick_left(settings, 0.0))
        step = f"a training step of the write-up's model takes {duration(calibration.step_s)} here"
        said = f"bench {dataset}, quick: {settings.quick_minutes:g} min for it; {plan.said} ({step})"
    print(said, file=sys.stderr, flush=True)
    warning = host_report(calibration, settings.max_spread, busy)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    return announced


@dataclass(frozen=True)
class QuickStep:
    """The quick bench's plan for the rungs left, with its price and what it says of it."""

    plan: Plan
    priced_s: dict[str, float]
    base_s: dict[str, float] = dataclasses.field(default_factory=dict)  # before this run's own pace

    @property
    def said(self) -> str:
        total = sum(self.priced_s.values())
        cuts = list(self.plan.cuts)
        if self.plan.skipped:
            cuts.append(f"{', '.join(self.plan.skipped)} left out unless the run catches up")
        cut = f" ({'; '.join(cuts)})" if cuts else ""
        if total <= 0:
            return "no earlier run here to price the rungs from: each is planned from the ones before it"
        return f"planned: about {duration(total)} for the rungs left{cut}"


QUICK_DEADLINE = "PIPELINE_QUICK_DEADLINE"  # `make bench-quick`'s end, a Unix time, for every data set


def quick_left(settings: BenchSettings, elapsed: float) -> float:
    """Seconds the quick bench of this data set has left: its own `bench.quick_minutes` less
    `elapsed`, and no more than what `make bench-quick`'s whole budget has left (its end
    passed in the environment: the data sets before this one may have taken more)."""
    left = settings.quick_minutes * 60 - elapsed
    end = os.environ.get(QUICK_DEADLINE, "")
    try:
        return min(left, float(end) - time.time()) if end else left
    except ValueError:
        return left


def base_pricer(announced: Announced, took: dict[str, tuple[float, float]]) -> Pricer:
    """Each rung's seconds here before this run's own pace: the earlier run's parts
    (`estimate.predict`, corrected as `estimate.pace_for` corrects them by how far `predict`
    missed that run's own wall time) scaled by the two calibrations; with no earlier run, the
    median rung this run has taken so far (nothing before the first)."""
    reference = announced.reference
    if reference is None:
        typical = statistics.median(t for t, _ in took.values()) if took else 0.0
        return lambda settings, rest: {rung: typical for rung in rest}
    scale = announced.calibration.step_s / reference_step_s(reference)
    wall = reference.get("wall_s")

    def price(settings: BenchSettings, rest: tuple[str, ...]) -> dict[str, float]:
        expected = predict(reference, dataclasses.replace(settings, variants=rest))
        ran = sum(predict(reference, settings_of(reference, settings)).values())
        missed = (
            min(2.0, max(0.5, float(wall) / ran)) if ran > 0 and isinstance(wall, (int, float)) and wall > 0 else 1.0
        )
        return {rung: expected[rung] * scale * missed for rung in rest}

    return price


def pricer(announced: Announced, took: dict[str, tuple[float, float]]) -> Pricer:
    """Each rung's seconds here: `base_pricer`'s, times how this run's rungs so far took
    against their base price (`took`: rung -> (seconds taken, base seconds); the median
    rung's ratio, so one rung's one-time cost, a cold disk say, does not reprice the rest)."""
    ratios = [t / p for t, p in took.values() if p > 0 and t > 0]
    behind = min(8.0, max(0.25, statistics.median(ratios))) if ratios and announced.reference is not None else 1.0
    base = base_pricer(announced, took)
    return lambda settings, rest: {rung: seconds * behind for rung, seconds in base(settings, rest).items()}


def plan_quick(
    announced: Announced,
    settings: BenchSettings,
    rest: tuple[str, ...],
    took: dict[str, tuple[float, float]],
    left_s: float,
    need_whole: bool = True,
) -> QuickStep:
    """The rungs `rest` planned to fit in `left_s` (`quickplan.plan_rest`), their price and
    their base price (`base_pricer`: what this run's pace is measured against)."""
    price = pricer(announced, took)
    plan = plan_rest(settings, rest, price, left_s, need_whole)
    kept = tuple(r for r in rest if r not in plan.skipped)
    base = base_pricer(announced, took)(plan.settings, kept) if kept else {}
    return QuickStep(plan, price(plan.settings, kept) if kept else {}, base)


def _run_bench(
    dataset: str,
    parquet: Path,
    shards: Path,
    device: torch.device,
    settings: BenchSettings,
    announced: Announced,
    started: float,
) -> BenchDoc:
    results: dict[str, Variant] = {}
    # The process's one-time CUDA start, outside every variant (it would land in the first one's).
    start = time.perf_counter()
    torch.zeros(1, device=device)
    init_s = time.perf_counter() - start
    floor_runs = floors(dataset, shards, device, settings) if settings.floor else {}
    floor_s = time.perf_counter() - start
    distinct_floors = list({id(run): run for run in floor_runs.values()}.values())  # shared options: one run
    done_parts = {"floor": floor_s}
    # quick: before each rung, the rungs left planned afresh from the settings to end within the
    # budget (a cut made while behind is undone once the run catches up)
    planned = settings
    took: dict[str, tuple[float, float]] = {}
    cuts_said: list[str] = []  # the quick plan's cuts, each time they changed
    skipped: list[str] = []
    for done, variant in enumerate(settings.variants):
        priced = 0.0
        left = announced.left(done_parts, time.perf_counter() - started, done, len(settings.variants))
        if settings.quick:
            budget_left = quick_left(settings, time.perf_counter() - started)
            whole_run = any(not entry.extrapolated for entry in results.values())
            step = plan_quick(announced, settings, settings.variants[done:], took, budget_left, not whole_run)
            cuts = "; ".join(step.plan.cuts)
            if cuts and cuts not in cuts_said[-1:]:
                if done:  # the first plan was announced
                    print(
                        f"{dataset}: {duration(max(0.0, budget_left))} of the quick budget left; {step.said}",
                        file=sys.stderr,
                        flush=True,
                    )
                cuts_said.append(cuts)
            planned = step.plan.settings
            if variant in step.plan.skipped and results:  # the first rung runs whatever: a document has one
                skipped.append(variant)
                print(
                    f"{dataset} [{done + 1}/{len(settings.variants)}] {variant}: left out (the quick budget)",
                    file=sys.stderr,
                    flush=True,
                )
                continue
            priced = step.base_s.get(variant, 0.0)
            left = f"; {duration(time.perf_counter() - started)} so far, about {duration(sum(step.priced_s.values()))} left"
        sampled = variant in planned.sample
        begun = time.perf_counter()
        what = (
            f"sampled: {planned.sample_epochs} epochs of {planned.sample_steps} steps, extrapolated"
            if sampled
            else f"{planned.epochs_of(variant)} epochs"
        )
        print(f"{dataset} [{done + 1}/{len(settings.variants)}] {variant}: {what}{left}", file=sys.stderr, flush=True)
        timing, train_steps, test_steps = run_variant(
            variant, dataset, Path(parquet), Path(shards), device, planned, progress=f"{dataset}/{variant}"
        )
        figures = summarise(timing, train_steps, test_steps, planned, settings.targets(dataset))
        # Free this variant's loaders now: their (persistent) worker processes must not
        # share the CPU with the next variant's timed epochs (nor with the floor's).
        gc.collect()
        if floor_after(settings, done):
            for run in distinct_floors:
                run.epoch()
        # what the rung cost the bench, its floor epoch included
        results[variant] = dataclasses.replace(figures, bench_s=round(time.perf_counter() - begun, 1))
        done_parts[variant] = results[variant].bench_s
        if settings.quick:  # its base price, or what it took where nothing priced it
            taken = time.perf_counter() - begun
            took[variant] = (taken, priced if priced > 0 else taken)
    n_train = read_manifest(Path(shards) / "train")["count"]
    params = RunParams(
        epochs=settings.epochs,
        batch_size=settings.batch_size,
        seed=settings.seed,
        num_workers=settings.workers(),
        parameters=parameter_count(SimpleCNN()),
        train_samples=n_train,
        sample_steps=settings.sample_steps,
        sample_epochs=settings.sample_epochs,
        quick=settings.quick,
        tuned=tuned_recipe(settings),
    )
    floor = (
        FloorDoc(
            **{key: round(run.seconds, 4) for key, run in floor_runs.items()}, epochs=len(distinct_floors[0].train_s)
        )
        if floor_runs
        else FloorDoc()
    )
    quick_plan = QuickPlan(budget_s=round(settings.quick_minutes * 60, 1), cuts=cuts_said, skipped=skipped)
    targets = settings.targets(dataset)
    target = targets[0] if targets else None
    seeds_started = time.perf_counter()

    def rerun(variant: str, seed: int, until: float | None = None) -> Timing:
        """`variant` trained again from `seed` (stopped at its first test pass at `until`, when
        given), outside the epoch budget."""
        gc.collect()  # the last run's loader workers must not share the CPU with this one
        reseeded = dataclasses.replace(settings, seed=seed, budget=False)
        return run_variant(
            variant,
            dataset,
            parquet,
            shards,
            device,
            reseeded,
            progress=f"{dataset}/{variant} seed {seed}",
            until=until,
        )[0]

    seeds, tuned = None, None
    if target is not None and settings.accuracy_seeds > 0:
        print(
            f"{dataset}: time to {target:.0%} from {settings.accuracy_seeds} more seeds"
            f"{announced.left(done_parts, time.perf_counter() - started, 1, 1)}",
            file=sys.stderr,
            flush=True,
        )
        seeds = over_seeds(results, settings, target, functools.partial(rerun, until=target))
    if "tuned" in results and settings.tuned is not None and settings.tuned.seeds > 0:
        print(
            f"{dataset}: the tuned recipe's accuracy and time to {', '.join(f'{t:.0%}' for t in targets)} over "
            f"{settings.tuned.seeds} seed{'s' if settings.tuned.seeds > 1 else ''}",
            file=sys.stderr,
            flush=True,
        )
        tuned = tuned_over_seeds(settings, targets, functools.partial(rerun, "tuned"))
    document = BenchDoc(
        dataset=dataset,
        env=environment(device, init_s),
        params=params,
        compiled_options=execution_of(settings, "compiled", device),
        variants=results,
        quick_plan=quick_plan if settings.quick else None,
        floor=floor,
        floor_s=round(floor_s, 1),
        seeds=seeds,
        tuned=tuned,
        seeds_s=round(time.perf_counter() - seeds_started, 1),
    )
    return finish(document, settings)


def floor_after(settings: BenchSettings, done: int) -> bool:
    """Whether the floor takes an epoch after variant number `done`: after every fully run
    variant (the floor bounds those; a sampled rung is several times slower than it), and
    after the last one when no variant ran in full."""
    variants = settings.variants
    if variants[done] not in settings.sample:
        return True
    return done == len(variants) - 1 and all(v in settings.sample for v in variants)


def tuned_recipe(settings: BenchSettings) -> Recipe | None:
    """The `tuned` recipe the run used, for the document's params (None where it did not run)."""
    return settings.tuned if "tuned" in settings.variants else None


def tuned_over_seeds(settings: BenchSettings, targets: tuple[float, ...], run: Callable[[int], Timing]) -> TunedSeeds:
    """The `tuned` recipe from `settings.tuned.seeds` fresh seeds (seed + 1, ...), each its
    whole schedule: the final test accuracy of each (mean, min, max) and, per target, the
    seconds to it (`seconds_spread`); the rung's own ladder run is not one of them."""
    recipe = settings.tuned
    seeds = list(range(settings.seed + 1, settings.seed + 1 + recipe.seeds))
    timings = [run(seed) for seed in seeds]
    accuracies = [round(t.accuracy, 4) for t in timings]
    return TunedSeeds(
        recipe=recipe,
        seeds=seeds,
        accuracy=accuracies,
        accuracy_mean=round(statistics.mean(accuracies), 4),
        accuracy_min=min(accuracies),
        accuracy_max=max(accuracies),
        targets=[
            TargetSeconds(target=target, **seconds_spread([time_to_accuracy(t, target).seconds for t in timings]))
            for target in targets
        ],
    )


def over_seeds(
    results: dict[str, Variant], settings: BenchSettings, target: float, again: Callable[[str, int], Timing]
) -> Seeds | None:
    """The time to `target` of the rung that reached it first in the ladder, taken again from
    `settings.accuracy_seeds` fresh seeds (seed + 1, ...; the ladder's own run, which chose the
    rung, is left out), each run stopped at its first test pass at the target. A seed that
    never reaches it counts as slower than every other: the median is None when half or more
    missed, and so is the max when any did. None when no rung reached the target."""
    reached = {
        name: first.seconds
        for name, entry in results.items()
        if writeup_recipe(name)
        and entry.time_to_accuracy
        and (first := entry.time_to_accuracy[0]).target == target
        and first.seconds is not None
    }
    if not reached:
        return None
    rung = min(reached, key=lambda name: reached[name])
    seeds = list(range(settings.seed + 1, settings.seed + 1 + settings.accuracy_seeds))
    found = [time_to_accuracy(again(rung, seed), target) for seed in seeds]
    return Seeds(
        variant=rung,
        target=target,
        seeds=seeds,
        epochs=[f.epoch for f in found],
        **seconds_spread([f.seconds for f in found]),
    )


def floors(dataset: str, shards: Path, device: torch.device, settings: BenchSettings) -> dict[str, Floor]:
    """The floor of every execution the variants use (`runners.Floor`), keyed as in the
    metrics: `train_s` for plain eager steps, `graphed_train_s`, `compiled_train_s`. Options
    that are the same work on this device share one run."""
    data = Resident.load(shards, device, dataset)
    config = train_config(settings)
    runs: dict[Execution, Floor] = {}
    out = {}
    for key in dict.fromkeys(k for v in settings.variants if (k := FLOOR_OF.get(v, "eager")) is not None):
        execution = Execution() if key == "eager" else execution_of(settings, key, device)
        same = replace(execution, cuda_graph=execution.cuda_graph and device.type == "cuda")
        if same not in runs:
            runs[same] = Floor(data, device, config, execution, progress=f"{dataset}/floor ({key})")
        out[floor_field(key)] = runs[same]
    return out


# pragma: no mutate end
