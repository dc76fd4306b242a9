"""The metrics files' schema, written once: what the summary and the report accept of a
bench document (`metrics/bench/<dataset>.json`, `results/<machine>/<dataset>.json`), the codec
table and the loader race's results, and the one check that applies it.

A model checks the keys it names and ignores the rest (the bench adds fields over time);
numbers are finite and in range, names plain slugs, free text bounded (escaped where
rendered). `validate` turns the first problem into one line naming the file and the key.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated, Any, Optional, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StrictBool,
    StrictInt,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    field_validator,
)

from pipeline.bench.settings import SAMPLE_EPOCHS, SAMPLE_STEPS, WORKERS, Recipe  # params.yaml's types
from pipeline.bench.variants import Execution, writeup_recipe
from pipeline.budget.machine import Fingerprint  # the machine stage's type: one for both
from pipeline.core.bounded import short
from pipeline.core.bounds import BATCH, EPOCHS, SEED
from pipeline.core.errors import SLUG, DataError, InputError

Slug = Annotated[str, StringConstraints(pattern=f"^{SLUG}$", strict=True)]  # (pydantic's Rust regex: `$` is the end)
Text = Annotated[str, StringConstraints(max_length=2000, strict=True)]  # escaped where rendered
Seconds = Annotated[float, Field(ge=0, le=1e7, allow_inf_nan=False)]  # under four months
Ratio = Annotated[float, Field(ge=0, le=1e7, allow_inf_nan=False)]
Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
Megabytes = Annotated[float, Field(ge=0, le=1e7, allow_inf_nan=False)]
IsoDate = Annotated[dt.date, Strict(False)]  # JSON holds dates as "2026-11-23"


class Loose(BaseModel):
    """Checks the keys it names and ignores the rest: the bench adds fields over time."""

    model_config = ConfigDict(extra="ignore", strict=True)


class Spread(Loose):
    min: Seconds
    median: Seconds
    max: Seconds


Count = Annotated[int, Field(ge=0, le=1 << 40), Strict()]


class BudgetDoc(Loose):
    step_s: Seconds
    steps: Optional[Count] = None  # the profiled pass's steps
    data_wait_s: Seconds
    copy_s: Seconds
    compute_s: Seconds
    overhead_s: Seconds
    other_s: Seconds
    wall_s: Optional[Seconds] = None  # the profiled pass on a plain clock, per step
    vs_wall: Optional[Ratio] = None  # step_s over wall_s: how much of the pass the events account for
    vs_epoch: Optional[Ratio] = None  # step_s over epoch_step_s
    epoch_step_s: Optional[Seconds] = None  # the timed epochs' median, per step
    kernels_per_step: Optional[float] = Field(default=None, ge=0, le=1e7)  # device kernels (CUDA)
    host_wait_s: Optional[Seconds] = None  # the overhead's halves (CUDA): nothing queued on the device,
    launch_gap_s: Optional[Seconds] = None  # or launched work waiting to start


class Measured(Loose):
    """The raw epoch times the bench took (for sampled variants: the sampled steps only)."""

    train_s: list[Seconds] = Field(max_length=10_000)
    test_s: list[Seconds] = Field(max_length=10_000)


class TimeToAccuracy(Loose):
    target: Fraction
    seconds: Optional[Seconds] = None  # None: no timed epoch reached the target; the setup counted
    warm_seconds: Optional[Seconds] = None  # the same, warm-up and capture left out (older documents: none)
    epoch: Optional[StrictInt] = Field(default=None, ge=1, le=1 << 20)


class Variant(Loose):
    train_s: Seconds
    test_s: Seconds
    first_epoch_train_s: Optional[Seconds] = None
    setup_s: Optional[Seconds] = None
    warmup_s: Optional[Seconds] = None  # of the setup: warm-up steps (compiling, autotuning)
    capture_s: Optional[Seconds] = None  # of the setup: capturing the CUDA graphs
    bench_s: Optional[Seconds] = None  # what the rung cost the bench, its floor epoch included
    samples_per_s: Optional[Ratio] = None
    below_floor: StrictBool = False
    accuracy_by_epoch: Optional[list[Fraction]] = Field(default=None, max_length=1 << 20)
    wall_s: Optional[Seconds] = None
    accuracy: Optional[Fraction] = None
    accuracy_ok: StrictBool = True
    extrapolated: StrictBool = False
    cuda_graph: StrictBool = False
    speedup: Optional[Ratio] = None
    wall_speedup: Optional[Ratio] = None
    spread: Optional[Spread] = None
    unstable: StrictBool = False
    unstable_reason: Optional[Text] = None
    budget: Optional[BudgetDoc] = None
    measured: Optional[Measured] = None
    # one per target accuracy, ascending (a document of one target may hold it bare)
    time_to_accuracy: Optional[list[TimeToAccuracy]] = Field(default=None, max_length=4)

    @field_validator("time_to_accuracy", mode="before")
    @classmethod
    def _listed(cls, value: Any) -> Any:
        return [value] if isinstance(value, dict) else value


class Env(Loose):
    """The process's view of the device (older documents: the only description of the machine)."""

    device: Text
    device_type: Text
    torch: Text
    cpu_count: StrictInt = Field(ge=1, le=1 << 20)
    cuda: Optional[Text] = None
    threads: Optional[StrictInt] = Field(default=None, ge=1, le=1 << 20)
    python: Optional[Text] = None
    device_init_s: Optional[Seconds] = None  # the process's one-time device start, outside every rung
    host_memory: Optional[Text] = None  # `hostmem.reuse_host_memory`: freed blocks kept or not
    commit: Optional[Text] = None
    date: Optional[IsoDate] = None


class RunParams(Loose):
    """The `bench` settings the run used, within the settings' own bounds, and what it counted."""

    epochs: EPOCHS
    batch_size: BATCH
    seed: Optional[SEED] = None
    num_workers: Optional[WORKERS] = None  # as the run resolved it (`BenchSettings.workers`)
    parameters: Optional[Count] = None  # the model's
    train_samples: Optional[Count] = None
    tuned: Optional[Recipe] = None  # the `tuned` rung's recipe, where it ran
    sample_steps: Optional[SAMPLE_STEPS] = None
    sample_epochs: Optional[SAMPLE_EPOCHS] = None
    quick: StrictBool = False


class FloorDoc(Loose):
    train_s: Optional[Seconds] = None
    graphed_train_s: Optional[Seconds] = None
    compiled_train_s: Optional[Seconds] = None
    epochs: Optional[StrictInt] = Field(default=None, ge=1, le=1 << 20)  # the fastest of this many


class Seeds(Loose):
    """The fastest rung's time to accuracy over several seeds (`ladder.over_seeds`)."""

    variant: Slug
    target: Fraction
    seeds: list[StrictInt] = Field(min_length=1, max_length=100)
    seconds: list[Optional[Seconds]] = Field(min_length=1, max_length=100)
    epochs: Optional[list[Optional[StrictInt]]] = Field(default=None, max_length=100)  # the epoch each reached it
    reached: StrictInt = Field(ge=0, le=100)
    min: Optional[Seconds] = None  # None: no seed reached the target
    median: Optional[Seconds] = None  # None: half or more of the seeds did not reach it
    max: Optional[Seconds] = None  # None: a seed did not reach it


class TargetSeconds(Loose):
    """Seconds to one target accuracy over seeds (`figures.seconds_spread`)."""

    target: Fraction
    seconds: list[Optional[Seconds]] = Field(min_length=1, max_length=100)
    reached: StrictInt = Field(ge=0, le=100)
    min: Optional[Seconds] = None
    median: Optional[Seconds] = None
    max: Optional[Seconds] = None


class TunedSeeds(Loose):
    """The `tuned` recipe over fresh seeds (`ladder.tuned_over_seeds`)."""

    recipe: Optional[Recipe] = None
    seeds: list[StrictInt] = Field(min_length=1, max_length=100)
    accuracy: list[Fraction] = Field(min_length=1, max_length=100)
    accuracy_mean: Fraction
    accuracy_min: Fraction
    accuracy_max: Fraction
    targets: list[TargetSeconds] = Field(max_length=4)


class CalibrationDoc(Loose):
    """The bench's first measure of this host (`estimate.calibrate`)."""

    step_s: Seconds
    spread: Ratio


class QuickPlan(Loose):
    """What a quick bench cut to end within its budget (`ladder._run_bench`)."""

    budget_s: Seconds
    cuts: list[Text] = Field(default_factory=list, max_length=64)
    skipped: list[Slug] = Field(default_factory=list, max_length=64)


class BenchDoc(Loose):
    dataset: Slug
    machine: Optional[Fingerprint] = None
    env: Optional[Env] = None
    date: Optional[IsoDate] = None
    params: RunParams
    floor: FloorDoc = FloorDoc()
    variants: dict[Slug, Variant] = Field(min_length=1, max_length=64)
    seeds: Optional[Seeds] = None
    tuned: Optional[TunedSeeds] = None
    calibration: Optional[CalibrationDoc] = None
    compiled_options: Optional[Execution] = None  # what `compiled` ran with here
    accuracy_tolerance: Optional[Fraction] = None
    floor_s: Optional[Seconds] = None  # of wall_s: the floor's set-up and first epochs
    seeds_s: Optional[Seconds] = None  # of wall_s: the runs over fresh seeds
    wall_s: Optional[Seconds] = None  # the whole bench of this data set (`ladder.run_bench`)
    quick_plan: Optional[QuickPlan] = None


class Split(Loose):
    MB: Megabytes
    read_s: Seconds


class CodecEntry(Loose):
    train: Split


CodecTable = dict[Slug, dict[Slug, dict[Slug, CodecEntry]]]  # data set -> layout -> codec


class RaceMeta(Loose):
    samples: StrictInt = Field(ge=1, le=10**10)


class RaceRun(Loose):
    seconds: Optional[Seconds] = None  # absent where the run failed (its error is kept instead)


class RaceDoc(Loose):
    """results/peers/scale-<n>.json, written by benchmarks/peers.py: per system and task, its runs."""

    meta: RaceMeta
    results: dict[Slug, dict[Slug, list[RaceRun]]] = Field(max_length=64)


def fastest_full(variants: dict[str, Variant]) -> tuple[str, Variant] | None:
    """The fully run variant (not extrapolated) with the fastest steady train epoch, or None
    when every one was sampled: the summary's headline and the report's "best here". The
    write-up's recipe only (`variants.writeup_recipe`)."""
    full = {name: entry for name, entry in variants.items() if not entry.extrapolated and writeup_recipe(name)}
    if not full:
        return None
    name = min(full, key=lambda n: full[n].train_s)
    return name, full[name]


def validate(path: Path | str, data: Any, model: Any, error: type[InputError] = DataError) -> Any:
    """`data` as `model`, or `error` naming `path` and the first bad key."""
    try:
        return TypeAdapter(model).validate_python(data)
    except ValidationError as err:
        first = err.errors()[0]
        key = ".".join(str(part) for part in first["loc"]) or "(top level)"
        got = first.get("input")
        shown = f" (got {short(got)})" if isinstance(got, (int, float, str, bool)) or got is None else ""
        raise error(f"{path}: {key}: {first['msg']}{shown}") from None


def undeclared(data: Any, annotation: Any, where: str = "") -> list[str]:
    """The keys of `data` that `annotation` (a model, or a type built of models) does not
    declare, as dotted paths: a writer checks its document against the reader's schema so
    that a key the reader would silently ignore (a misspelt one) cannot be written."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return undeclared(data, args[0], where)
    if origin is Union:
        fits = [a for a in args if a is not type(None)]
        return min((undeclared(data, a, where) for a in fits), key=len, default=[])
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if not isinstance(data, dict):
            return []
        fields = annotation.model_fields
        found = [f"{where}{key}" for key in data if key not in fields]
        for key, value in data.items():
            if key in fields:
                found += undeclared(value, fields[key].annotation, f"{where}{key}.")
        return found
    if origin is list and isinstance(data, list) and args:
        return [k for i, item in enumerate(data) for k in undeclared(item, args[0], f"{where}{i}.")]
    if origin is dict and isinstance(data, dict) and len(args) == 2:
        return [k for key, value in data.items() for k in undeclared(value, args[1], f"{where}{key}.")]
    return []
