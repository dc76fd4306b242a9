"""The write-up's training ladder, timed per epoch, and beyond it: what stage `bench@` runs.

Every variant trains the same SimpleCNN from the same seed with Adam (lr 1e-3) and
cross-entropy, testing after every epoch; only the data path (`datapaths`) and, on the last
rungs, the way the steps run (`train`) change. Per variant the metrics hold the steady
per-epoch figures and what a user pays in all: `setup_s` (building the data path,
compiling, warming up, capturing) and `wall_s` (setup plus every epoch, train and test).

Variants whose per-item pandas path would take many minutes per epoch on a small CPU can be
timed over a fixed number of steps per epoch; their figures are then scaled to the full
epoch and marked `extrapolated`, and their accuracy is not reported (not measured).

This module imports only torch, numpy, pandas and pyarrow (plus the shards reader), so it
runs on a machine with torch but without polars, dvc and zstandard (`standalone-bench`).
"""

from __future__ import annotations

import dataclasses
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

from pipeline.bench.datapaths import Resident, data_path
from pipeline.bench.estimate import (Calibration, Pace, announce, busy_processes, calibrate, find_reference,
                                     host_report, pace_for)
from pipeline.bench.model import SimpleCNN, parameter_count
from pipeline.shards.format import read_manifest
from pipeline.bench.variants import STATIC_VARIANTS
from pipeline.bench.hostmem import reuse_host_memory
from pipeline.bench.runners import (Execution, Floor, OneCycle, Timing, TrainConfig, cudnn_benchmark, train_eager,
                                    train_static)
from pipeline.budget.units import duration

@dataclass(frozen=True)
class BenchSettings:
    """params.yaml's `bench` block, as its settings model (`pipeline.stages.bench_settings`)
    checked it: that model is the one place its keys, ranges and defaults are stated."""

    parquet_codec: str                   # the naive rungs' Parquet codec (dvc.yaml picks the folder)
    epochs: int
    batch_size: int
    lr: float
    seed: int
    num_workers: int                     # 0: min(4, CPU count)
    variants: tuple[str, ...]
    # Variants timed over the samples of `sample_steps` train steps at `batch_size` (and as many
    # test samples) per epoch for `sample_epochs` epochs, then scaled to a full epoch. Empty:
    # every variant runs in full.
    sample: tuple[str, ...]
    sample_steps: int
    sample_epochs: int
    accuracy_tolerance: float            # vs the `preprocessed` variant (the write-up's best)
    # What `compiled` adds, per device type (see `runners.Execution`); chosen by measurement.
    compiled: dict
    floor: bool                          # also time the floor: the same steps with no data path
    reuse_host_memory: bool              # keep freed host blocks in the heap (`hostmem`)
    # A variant whose timed epochs spread more than this (max - min over the median), or
    # whose twin doing identical work disagrees by more, is marked unstable.
    max_spread: float
    budget: bool                         # profile `sample_steps` more steps per variant: its time budget
    quick: bool = False                  # a first answer: QUICK's settings, marked in every table
    # The test accuracies each data set's time to accuracy is measured to (data set -> the
    # fractions, ascending; a single number is one target).
    target_accuracy: dict = dataclasses.field(default_factory=dict)
    accuracy_seeds: int = 0              # fresh seeds the fastest rung's time to accuracy is taken again over
    # The `tuned` rung's recipe (`Recipe`); None: the rung is not configured.
    tuned: Recipe | None = None

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
        """`graphed` is `device` with static steps in one CUDA graph (fp32, as `device`);
        `compiled` adds what makes the model itself fast, per device type; `tuned` runs as
        `compiled` does."""
        if variant == "graphed":
            return Execution(cuda_graph=True)
        options = self.compiled.get(device.type) or {}
        autocast = options.get("autocast")
        return Execution(compile_mode=str(options.get("compile_mode", "none")),
                         autocast=native_bf16(device) if autocast == "auto" else bool(autocast),
                         channels_last=bool(options.get("channels_last")),
                         cuda_graph=bool(options.get("cuda_graph")))


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
        return TrainConfig(batch_size=self.batch_size, lr=self.max_lr, seed=seed, betas=tuple(self.betas),
                           schedule=OneCycle(max_lr=self.max_lr, pct_start=self.pct_start))


# pragma: no mutate start (runs training and probes the device: exercised by test_bench, too slow per mutant)
def native_bf16(device: torch.device) -> bool:
    """Whether bf16 autocast pays here: on CUDA, and on CPUs whose flags list AMX-BF16 or
    AVX512-BF16 (Linux's /proc/cpuinfo; elsewhere fp32 is kept). On other CPUs bf16 is
    emulated and slower per step than fp32, so `compiled` keeps fp32 there."""
    if device.type == "cuda":
        return True
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            text = info.read(1 << 22)
    except OSError:
        return False
    flags = {flag for line in text.splitlines() if line.startswith("flags") for flag in line.split(":", 1)[-1].split()}
    return bool(flags & {"amx_bf16", "avx512_bf16"})


def run_variant(variant: str, dataset: str, parquet: Path, shards: Path, device: torch.device,
                settings: BenchSettings, progress: str = "", until: float | None = None) -> tuple[Timing, int, int]:
    """Build one variant's inputs and train it; returns (timing, train steps, test steps).
    With `until`, its epochs stop at the first test pass at that accuracy.

    The clock starts before anything of the variant is built, so `setup_s` is all a user
    waits for before its first step."""
    started = time.perf_counter()
    config = settings.train_config(variant)
    if variant in STATIC_VARIANTS:
        data = Resident.load(shards, device, dataset)
        timing = train_static(data, device, config, settings.execution(variant, device),
                              epochs=settings.epochs_of(variant), started=started, progress=progress,
                              budget=settings.budget_steps(),
                              until=until)
        return timing, math.ceil(len(data.train_labels) / config.batch_size), \
            math.ceil(len(data.test_labels) / config.batch_size)
    sampled = variant in settings.sample
    # a sampled rung's epoch: the samples of `sample_steps` steps at the bench's batch size,
    # whatever its own batch, so every sampled rung is timed over the same data
    path = data_path(variant, parquet, shards, device, dataset=dataset, batch_size=config.batch_size, seed=config.seed,
                     workers=settings.workers(),
                     epoch_samples=settings.sample_steps * settings.batch_size if sampled else None)
    timing = train_eager(path, device, config, epochs=settings.sample_epochs if sampled else settings.epochs,
                         steps=path.sampled_steps, test_steps=path.sampled_test_steps, started=started,
                         progress=progress, budget=settings.budget_steps(), until=until)
    return timing, path.train_steps, path.test_steps


# pragma: no mutate end


def _sampled_epochs(seconds: list[float], scale: float, epochs: int) -> tuple[float, float, float]:
    """(steady epoch, first epoch, all `epochs`) from epochs timed over a sample of steps.

    The steady epoch scales the median of the epochs after the first by the steps left out.
    What the first epoch took beyond that is a one-time cost (worker start-up, CUDA
    initialisation, cuDNN's first search): added once, not scaled with the steps."""
    steady_sample = statistics.median(seconds[1:] or seconds)
    steady = steady_sample * scale
    first = steady + max(0.0, seconds[0] - steady_sample)
    return steady, first, first + steady * (epochs - 1)


def time_to_accuracy(timing: Timing, target: float) -> dict:
    """From the variant's start (its setup included) to the end of the first test pass that
    reached `target`: {"target", "seconds", "epoch"} (1-based), seconds and epoch None when
    no timed epoch reached it. What the user waits for, beside seconds per epoch."""
    elapsed = timing.setup_s
    for epoch, (train, test, accuracy) in enumerate(zip(timing.train_s, timing.test_s, timing.accuracies), 1):
        elapsed += train + test
        if accuracy >= target:
            return {"target": target, "seconds": round(elapsed, 3), "epoch": epoch}
    return {"target": target, "seconds": None, "epoch": None}


def times_to_accuracy(timing: Timing, targets: tuple[float, ...]) -> list[dict] | None:
    """`time_to_accuracy` for each target, in order; None when there is none."""
    return [time_to_accuracy(timing, target) for target in targets] or None


def summarise(timing: Timing, train_steps: int, test_steps: int, settings: BenchSettings,
              targets: tuple[float, ...] = (), epochs: int | None = None) -> dict:
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
    return {
        "train_s": round(train, 4),
        "test_s": round(test, 4),
        "first_epoch_train_s": round(first, 4),
        "setup_s": round(timing.setup_s, 3),
        "warmup_s": round(timing.warmup_s, 3),
        "capture_s": round(timing.capture_s, 3),
        "wall_s": round(timing.setup_s + train_all + test_all, 3),
        "accuracy": None if sampled or timing.accuracy is None else round(timing.accuracy, 4),
        "extrapolated": sampled,
        "cuda_graph": timing.cuda_graph,
        "measured": {"train_s": [round(s, 4) for s in timing.train_s], "test_s": [round(s, 4) for s in timing.test_s]},
        "spread": spread(timing.train_s),
        "budget": None if timing.budget is None else with_epoch_step(
            timing.budget, steady_step(timing, train_steps)),
        "accuracy_by_epoch": None if sampled else [round(a, 4) for a in timing.accuracies],
        "time_to_accuracy": None if sampled else times_to_accuracy(timing, targets),
    }


def with_epoch_step(budget: dict, epoch_step_s: float) -> dict:
    """The budget beside the timed epochs' seconds per step, and their ratio: the profiled
    pass is steps of one more epoch of the same kind, so the two should agree within the noise."""
    ratio = budget["step_s"] / epoch_step_s if epoch_step_s > 0 else None
    return {**budget, "epoch_step_s": round(epoch_step_s, 6), "vs_epoch": None if ratio is None else round(ratio, 3)}


def steady_epochs(seconds: list[float]) -> list[float]:
    """The timed epochs that show the steady state: all but the first (worker start-up,
    first cuDNN search, caches) when at least two others remain."""
    return seconds[1:] if len(seconds) >= 3 else seconds


def spread(seconds: list[float]) -> dict:
    """min / median / max of the steady train epochs, in seconds per timed epoch (sampled
    variants: per sampled epoch, which is what was measured)."""
    steady = steady_epochs(seconds)
    return {"min": round(min(steady), 4), "median": round(statistics.median(steady), 4),
            "max": round(max(steady), 4)}


def steady_step(timing: Timing, train_steps: int) -> float:
    """Seconds per train step in the timed epochs, to set beside the profiled pass's."""
    steps = train_steps if timing.sampled_steps is None else timing.sampled_steps
    return statistics.median(steady_epochs(timing.train_s)) / max(steps, 1)


# pragma: no mutate start (runs training: exercised by test_bench, too slow per mutant)
def environment(device: torch.device) -> dict:
    return {"device": torch.cuda.get_device_name(device) if device.type == "cuda"
            else platform.processor() or platform.machine(),
            "device_type": device.type, "torch": torch.__version__, "cuda": torch.version.cuda,
            "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(),
            "python": platform.python_version()}


def run_bench(dataset: str, parquet: Path, shards: Path, device: str | torch.device,
              settings: BenchSettings, earlier: list[Path] = (), machine: str | None = None) -> dict:
    """Every variant of the ladder on one data set; returns the full bench document, with
    `wall_s`: the seconds the whole bench took (floor, variants, profiled passes, seeds).

    First it calibrates and prints what the bench will take, scaled from the `earlier` bench
    document of this device type and mode (`machine`'s own preferred; `estimate`), and says
    so when the host is too busy to measure well."""
    started = time.perf_counter()
    device = torch.device(device)
    pace = announce_bench(dataset, device, settings, list(earlier), machine)
    with cudnn_benchmark(device), reuse_host_memory(settings.reuse_host_memory) as host_memory:
        document = _run_bench(dataset, Path(parquet), Path(shards), device, settings, pace, started)
    document["env"]["host_memory"] = host_memory
    document["calibration"] = pace.calibration.to_json()
    document["wall_s"] = round(time.perf_counter() - started, 1)
    return document


@dataclass
class Announced:
    """What the bench printed before it began: its calibration and, where an earlier run
    exists, the pace the time left is reckoned by."""

    calibration: Calibration
    pace: Pace | None

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


def announce_bench(dataset: str, device: torch.device, settings: BenchSettings, earlier: list[Path],
                   machine: str | None) -> Announced:
    """Calibrate, find the earlier run to scale from, and print the estimate (this data set
    and the others `earlier` holds) and, on a busy host, what runs beside the bench."""
    busy = busy_processes(exclude=(os.getppid(),))
    calibration = calibrate(device, settings.batch_size)
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
    print(said, file=sys.stderr, flush=True)
    warning = host_report(calibration, settings.max_spread, busy)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    return Announced(calibration, pace)


def _run_bench(dataset: str, parquet: Path, shards: Path, device: torch.device, settings: BenchSettings,
               announced: Announced, started: float) -> dict:
    results: dict = {}
    # The process's one-time CUDA start, outside every variant (it would land in the first one's).
    start = time.perf_counter()
    torch.zeros(1, device=device)
    init_s = time.perf_counter() - start
    floor_runs = floors(dataset, shards, device, settings) if settings.floor else {}
    floor_s = time.perf_counter() - start
    distinct_floors = list({id(run): run for run in floor_runs.values()}.values())  # shared options: one run
    done_parts = {"floor": floor_s}
    for done, variant in enumerate(settings.variants):
        sampled = variant in settings.sample
        begun = time.perf_counter()
        what = (f"sampled: {settings.sample_epochs} epochs of {settings.sample_steps} steps, extrapolated"
                if sampled else f"{settings.epochs_of(variant)} epochs")
        print(f"{dataset} [{done + 1}/{len(settings.variants)}] {variant}: {what}"
              f"{announced.left(done_parts, begun - started, done, len(settings.variants))}",
              file=sys.stderr, flush=True)
        timing, train_steps, test_steps = run_variant(variant, dataset, Path(parquet), Path(shards), device, settings,
                                                      progress=f"{dataset}/{variant}")
        results[variant] = summarise(timing, train_steps, test_steps, settings, settings.targets(dataset))
        # Free this variant's loaders now: their (persistent) worker processes must not
        # share the CPU with the next variant's timed epochs (nor with the floor's).
        gc.collect()
        if floor_after(settings, done):
            for run in distinct_floors:
                run.epoch()
        results[variant]["bench_s"] = round(time.perf_counter() - begun, 1)  # its floor epoch included
        done_parts[variant] = results[variant]["bench_s"]
    n_train = read_manifest(Path(shards) / "train")["count"]
    document = {"dataset": dataset, "env": {**environment(device), "device_init_s": round(init_s, 3)},
                "params": {"epochs": settings.epochs, "batch_size": settings.batch_size,
                           "seed": settings.seed, "num_workers": settings.workers(),
                           "parameters": parameter_count(SimpleCNN()), "train_samples": n_train,
                           "sample_steps": settings.sample_steps, "sample_epochs": settings.sample_epochs,
                           "quick": settings.quick},
                "compiled_options": dataclasses.asdict(settings.execution("compiled", device)),
                "variants": results}
    if floor_runs:
        document["floor"] = {**{key: round(run.seconds, 4) for key, run in floor_runs.items()},
                             "epochs": len(distinct_floors[0].train_s)}
    document["floor_s"] = round(floor_s, 1)
    targets = settings.targets(dataset)
    target = targets[0] if targets else None
    seeds_started = time.perf_counter()
    if target is not None and settings.accuracy_seeds > 0:
        def again(variant: str, seed: int) -> Timing:
            gc.collect()  # the last run's loader workers must not share the CPU with this one
            reseeded = dataclasses.replace(settings, seed=seed, budget=False)
            return run_variant(variant, dataset, parquet, shards, device, reseeded,
                               progress=f"{dataset}/{variant} seed {seed}", until=target)[0]
        print(f"{dataset}: time to {target:.0%} from {settings.accuracy_seeds} more seeds"
              f"{announced.left(done_parts, time.perf_counter() - started, 1, 1)}", file=sys.stderr, flush=True)
        document["seeds"] = over_seeds(results, settings, target, again)
    if "tuned" in results and settings.tuned is not None and settings.tuned.seeds > 0:
        def tuned(seed: int) -> Timing:
            gc.collect()
            reseeded = dataclasses.replace(settings, seed=seed, budget=False)
            return run_variant("tuned", dataset, parquet, shards, device, reseeded,
                               progress=f"{dataset}/tuned seed {seed}")[0]
        print(f"{dataset}: the tuned recipe's accuracy and time to {', '.join(f'{t:.0%}' for t in targets)} over "
              f"{settings.tuned.seeds} seeds", file=sys.stderr, flush=True)
        document["tuned"] = tuned_over_seeds(settings, targets, tuned)
    document["seeds_s"] = round(time.perf_counter() - seeds_started, 1)
    finish(document, settings)
    return document


def floor_after(settings: BenchSettings, done: int) -> bool:
    """Whether the floor takes an epoch after variant number `done`: after every fully run
    variant (the floor bounds those; a sampled rung is several times slower than it), and
    after the last one when no variant ran in full."""
    variants = settings.variants
    if variants[done] not in settings.sample:
        return True
    return done == len(variants) - 1 and all(v in settings.sample for v in variants)


def tuned_over_seeds(settings: BenchSettings, targets: tuple[float, ...],
                     run: Callable[[int], Timing]) -> dict:
    """The `tuned` recipe from `settings.tuned.seeds` fresh seeds (seed + 1, ...), each its
    whole schedule: the final test accuracy of each (mean, min, max) and, per target, the
    seconds to it (`seconds_spread`); the rung's own ladder run is not one of them."""
    recipe = settings.tuned
    seeds = list(range(settings.seed + 1, settings.seed + 1 + recipe.seeds))
    timings = [run(seed) for seed in seeds]
    accuracies = [round(t.accuracy, 4) for t in timings]
    return {"recipe": dataclasses.asdict(recipe), "seeds": seeds, "accuracy": accuracies,
            "accuracy_mean": round(statistics.mean(accuracies), 4), "accuracy_min": min(accuracies),
            "accuracy_max": max(accuracies),
            "targets": [{"target": target, **seconds_spread([time_to_accuracy(t, target)["seconds"] for t in timings])}
                        for target in targets]}


def seconds_spread(seconds: list[float | None]) -> dict:
    """Seconds to a target over seeds, a seed that never reached it (None) counted as slower
    than every other: the median is None when half or more missed, the max when any did."""
    ranked = sorted(seconds, key=lambda s: math.inf if s is None else s)
    middle = ranked[(len(ranked) - 1) // 2: len(ranked) // 2 + 1]
    done = [s for s in seconds if s is not None]
    return {"seconds": seconds, "reached": len(done), "min": min(done) if done else None,
            "median": None if None in middle else round(statistics.mean(middle), 3),
            "max": None if len(done) < len(seconds) else max(done)}


def over_seeds(results: dict, settings: BenchSettings, target: float,
               again: Callable[[str, int], Timing]) -> dict | None:
    """The time to `target` of the rung that reached it first in the ladder, taken again from
    `settings.accuracy_seeds` fresh seeds (seed + 1, ...; the ladder's own run, which chose the
    rung, is left out), each run stopped at its first test pass at the target. A seed that
    never reaches it counts as slower than every other: the median is None when half or more
    missed, and so is the max when any did. None when no rung reached the target."""
    reached = {name: first["seconds"] for name, entry in results.items()
               if name != "tuned" and entry.get("time_to_accuracy")
               and (first := entry["time_to_accuracy"][0])["target"] == target and first["seconds"] is not None}
    if not reached:
        return None
    rung = min(reached, key=lambda name: reached[name])
    seeds = list(range(settings.seed + 1, settings.seed + 1 + settings.accuracy_seeds))
    found = [time_to_accuracy(again(rung, seed), target) for seed in seeds]
    return {"variant": rung, "target": target, "seeds": seeds, "epochs": [f["epoch"] for f in found],
            **seconds_spread([f["seconds"] for f in found])}


# The floor each rung is bounded by; every other rung runs plain eager steps. `tuned` has none:
# its batch and steps are its recipe's, not the floors'.
FLOOR_OF = {"graphed": "graphed", "compiled": "compiled", "tuned": None}


def floors(dataset: str, shards: Path, device: torch.device, settings: BenchSettings) -> dict[str, Floor]:
    """The floor of every execution the variants use (`runners.Floor`), keyed as in the
    metrics: `train_s` for plain eager steps, `graphed_train_s`, `compiled_train_s`. Options
    that are the same work on this device share one run."""
    data = Resident.load(shards, device, dataset)
    config = settings.train_config()
    runs: dict[Execution, Floor] = {}
    out = {}
    for key in dict.fromkeys(k for v in settings.variants if (k := FLOOR_OF.get(v, "eager")) is not None):
        execution = Execution() if key == "eager" else settings.execution(key, device)
        same = replace(execution, cuda_graph=execution.cuda_graph and device.type == "cuda")
        if same not in runs:
            runs[same] = Floor(data, device, config, execution, progress=f"{dataset}/floor ({key})")
        out["train_s" if key == "eager" else f"{key}_train_s"] = runs[same]
    return out


# pragma: no mutate end


def finish(document: dict, settings: BenchSettings) -> None:
    """Speed-ups against `naive` (steady epochs and wall time), samples/s, the accuracy check."""
    variants = document["variants"]
    n_train = document["params"]["train_samples"]
    reference = variants.get("naive")
    anchor = variants.get("preprocessed") or next(
        (v for v in variants.values() if v["accuracy"] is not None), None)
    for name, entry in variants.items():
        if reference:
            entry["speedup"] = round((reference["train_s"] + reference["test_s"])
                                     / (entry["train_s"] + entry["test_s"]), 2)
            entry["wall_speedup"] = round(reference["wall_s"] / entry["wall_s"], 2)
        if n_train:
            entry["samples_per_s"] = round(n_train / entry["train_s"])
        # `tuned` trains another recipe: its accuracy is its own claim, judged over seeds
        if entry["accuracy"] is not None and anchor and anchor["accuracy"] is not None and name != "tuned":
            # Accuracies carry 4 decimals: compare the difference at that precision, so a
            # difference of exactly the tolerance passes (0.99 - 0.98 is 0.01000000000000001).
            entry["accuracy_ok"] = round(abs(entry["accuracy"] - anchor["accuracy"]), 6) <= settings.accuracy_tolerance
    document["accuracy_tolerance"] = settings.accuracy_tolerance
    flag_unstable(document, settings.max_spread)


# On the CPU `pinned` does exactly what `persistent` does (pin_memory only pins for CUDA):
# two timings of one piece of work, so their gap is the machine's noise.
TWINS = {"cpu": [("persistent", "pinned")]}


def flag_unstable(document: dict, max_spread: float) -> list[str]:
    """Mark each variant `unstable` (with why) whose steady epochs spread more than
    `max_spread` of their median, whose twin disagrees by more than that, or that beats the
    floor of its own options by more than that; returns the names marked."""
    variants, floor_ = document["variants"], document.get("floor") or {}
    reasons: dict[str, list[str]] = {name: [] for name in variants}
    for name, entry in variants.items():
        low, mid, high = (entry["spread"][k] for k in ("min", "median", "max"))
        if mid > 0 and (high - low) / mid > max_spread:
            reasons[name].append(f"epochs spread {(high - low) / mid:.0%} of their median")
        bound = floor_.get("train_s" if name not in FLOOR_OF else f"{FLOOR_OF[name]}_train_s") \
            if FLOOR_OF.get(name, "eager") is not None else None
        if bound and entry["train_s"] < bound * (1 - max_spread):
            reasons[name].append(f"{entry['train_s']:.3g} s/epoch is below its floor {bound:.3g} s")
            entry["below_floor"] = True
    device_type = document.get("env", {}).get("device_type", "cpu")
    for a, b in TWINS.get(device_type, []):
        if a in variants and b in variants:
            x, y = variants[a]["train_s"], variants[b]["train_s"]
            if min(x, y) > 0 and abs(x - y) / min(x, y) > max_spread:
                for name, twin in ((a, b), (b, a)):
                    reasons[name].append(f"{abs(x - y) / min(x, y):.0%} apart from {twin}, which does the same work here")
    for name, entry in variants.items():
        entry["unstable"] = bool(reasons[name])
        entry["unstable_reason"] = "; ".join(reasons[name]) or None
    return [name for name, why in reasons.items() if why]


# `bench.quick`: every rung, fewer epochs and fewer sampled steps, no floor and no profiled
# epoch: the shape of the answer in a few minutes. One warm-up epoch and one timed one, so no
# spread (its tables say "n/a" and every one is marked quick).
QUICK = {"epochs": 2, "sample_steps": 5, "sample_epochs": 2, "floor": False, "budget": False, "accuracy_seeds": 0}
QUICK_TUNED_SEEDS = 0   # quick: the tuned rung runs once, no seeds


def settings_from_params(block: dict) -> BenchSettings:
    """BenchSettings from params.yaml's `bench` block, already checked by the params schema
    (lists become tuples); with `quick`, QUICK's settings in place of the block's."""
    tuned = block.get("tuned")
    recipe = None if tuned is None else Recipe(**{**tuned, "betas": tuple(tuned["betas"])})
    settings = BenchSettings(**{**block, "variants": tuple(block["variants"]), "sample": tuple(block["sample"]),
                                "tuned": recipe})
    if not settings.quick:
        return settings
    quick_tuned = None if recipe is None else dataclasses.replace(recipe, seeds=QUICK_TUNED_SEEDS)
    return dataclasses.replace(settings, **QUICK, tuned=quick_tuned)
