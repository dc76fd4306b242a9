"""The bench document and the other metrics files, one type each: what the bench builds and
writes (`metrics/bench/<dataset>.json`, `results/<machine>/<dataset>.json`) is what the summary
and the report read back, so a key its readers do not declare cannot be written.

Frozen dataclasses with their bounds on their annotations (`core.bounds`): built unchecked
where pydantic is absent (a machine with torch alone), validated by `validate` where it is
installed, each problem one line naming the file and the key. A reader passes over keys it
does not know (a later bench may add fields); numbers are finite and in range, names plain
slugs, free text bounded (escaped where rendered).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Optional, TypeVar

from pipeline.bench.settings import SAMPLE_EPOCHS, SAMPLE_STEPS, WORKERS, Recipe  # params.yaml's types
from pipeline.bench.variants import Execution, writeup_recipe
from pipeline.budget import Fingerprint  # the machine stage's type: one for both
from pipeline.core.bounded import short
from pipeline.core.bounds import (
    BATCH,
    EPOCHS,
    LOOSE,
    SEED,
    BeforeValidator,
    Bool,
    Int,
    Len,
    Line,
    Name,
    Num,
    Strict,
)
from pipeline.core.errors import DataError, InputError

try:  # Python 3.11+: tells type checkers that `record` makes dataclasses
    from typing import dataclass_transform
except ImportError:  # pragma: no cover (Python 3.10)

    def dataclass_transform(**_: bool):
        return lambda decorator: decorator


Seconds = Num(ge=0, le=1e7)  # under four months
Ratio = Num(ge=0, le=1e7)
Fraction = Num(ge=0, le=1)
Count = Int(0, 1 << 40)
Epoch = Int(1, 1 << 20)
Tally = Int(0, 100)  # seeds counted
IsoDate = Annotated[dt.date, Strict(False)]  # JSON holds dates as "2026-11-23"
T = TypeVar("T")


@dataclass_transform(frozen_default=True, kw_only_default=True)
def record(cls: type[T]) -> type[T]:
    """A document's part: a frozen dataclass whose reader passes over keys it does not know."""
    cls.__pydantic_config__ = LOOSE
    return dataclass(frozen=True, kw_only=True)(cls)


@record
class Spread:
    min: Seconds
    median: Seconds
    max: Seconds


@record
class BudgetDoc:
    """Where a rung's train step goes (`profiled.profile_steps`), seconds per step by part."""

    data_wait_s: Seconds
    copy_s: Seconds
    compute_s: Seconds
    overhead_s: Seconds
    other_s: Seconds
    step_s: Seconds
    steps: Optional[Count] = None  # the profiled pass's steps
    wall_s: Optional[Seconds] = None  # the profiled pass on a plain clock, per step
    vs_wall: Optional[Ratio] = None  # step_s over wall_s: how much of the pass the events account for
    host_wait_s: Optional[Seconds] = None  # the overhead's halves (CUDA): nothing queued on the device,
    launch_gap_s: Optional[Seconds] = None  # or launched work waiting to start
    kernels_per_step: Optional[Ratio] = None  # device kernels (CUDA)
    epoch_step_s: Optional[Seconds] = None  # the timed epochs' median, per step
    vs_epoch: Optional[Ratio] = None  # step_s over epoch_step_s


@record
class Measured:
    """The raw epoch times the bench took (for sampled variants: the sampled steps only)."""

    train_s: Annotated[list[Seconds], Len(0, 10_000)]
    test_s: Annotated[list[Seconds], Len(0, 10_000)]


@record
class TimeToAccuracy:
    target: Fraction
    seconds: Optional[Seconds] = None  # None: no timed epoch reached the target; the setup counted
    warm_seconds: Optional[Seconds] = None  # the same, warm-up and capture left out (older documents: none)
    epoch: Optional[Epoch] = None


def _listed(value: Any) -> Any:
    return [value] if isinstance(value, dict) else value


@record
class Variant:
    """One rung's figures (`figures.summarise`, completed by `figures.finish`)."""

    train_s: Seconds
    test_s: Seconds
    first_epoch_train_s: Optional[Seconds] = None
    setup_s: Optional[Seconds] = None
    warmup_s: Optional[Seconds] = None  # of the setup: warm-up steps (compiling, autotuning)
    capture_s: Optional[Seconds] = None  # of the setup: capturing the CUDA graphs
    wall_s: Optional[Seconds] = None
    accuracy: Optional[Fraction] = None
    extrapolated: Bool = False
    cuda_graph: Bool = False
    measured: Optional[Measured] = None
    spread: Optional[Spread] = None
    budget: Optional[BudgetDoc] = None
    accuracy_by_epoch: Optional[Annotated[list[Fraction], Len(0, 1 << 20)]] = None
    # one per target accuracy, ascending (a document of one target may hold it bare)
    time_to_accuracy: Annotated[Optional[Annotated[list[TimeToAccuracy], Len(0, 4)]], BeforeValidator(_listed)] = None
    bench_s: Optional[Seconds] = None  # what the rung cost the bench, its floor epoch included
    speedup: Optional[Ratio] = None
    wall_speedup: Optional[Ratio] = None
    samples_per_s: Optional[Count] = None
    accuracy_ok: Optional[Bool] = None  # within bench.accuracy_tolerance of the anchor; None: not checked
    below_floor: Bool = False
    unstable: Bool = False
    unstable_reason: Optional[Line] = None


@record
class Env:
    """The process's view of the device (older documents: the only description of the machine)."""

    device: Line
    device_type: Line
    torch: Line
    cuda: Optional[Line] = None
    cpu_count: Int(1, 1 << 20)
    threads: Optional[Int(1, 1 << 20)] = None
    python: Optional[Line] = None
    device_init_s: Optional[Seconds] = None  # the process's one-time device start, outside every rung
    host_memory: Optional[Line] = None  # `hostmem.reuse_host_memory`: freed blocks kept or not
    commit: Optional[Line] = None
    date: Optional[IsoDate] = None


@record
class RunParams:
    """The `bench` settings the run used, within the settings' own bounds, and what it counted."""

    epochs: EPOCHS
    batch_size: BATCH
    seed: Optional[SEED] = None
    num_workers: Optional[WORKERS] = None  # as the run resolved it (`BenchSettings.workers`)
    parameters: Optional[Count] = None  # the model's
    train_samples: Optional[Count] = None
    sample_steps: Optional[SAMPLE_STEPS] = None
    sample_epochs: Optional[SAMPLE_EPOCHS] = None
    quick: Bool = False
    tuned: Optional[Recipe] = None  # the `tuned` rung's recipe, where it ran


@record
class FloorDoc:
    """The floor of each execution the rungs used: the same steps with no data path."""

    train_s: Optional[Seconds] = None
    graphed_train_s: Optional[Seconds] = None
    compiled_train_s: Optional[Seconds] = None
    epochs: Optional[Epoch] = None  # the fastest of this many


FreshSeeds = Annotated[list[Int(0, (1 << 32) + 100)], Len(1, 100)]  # seed + 1, ..., seed + 100 at most


@record
class TargetSeconds:
    """Seconds to one target accuracy over seeds (`figures.seconds_spread`): a seed that never
    reached it (None) counts as slower than every other."""

    target: Fraction
    seconds: Annotated[list[Optional[Seconds]], Len(1, 100)]
    reached: Tally
    min: Optional[Seconds] = None  # None: no seed reached the target
    median: Optional[Seconds] = None  # None: half or more of the seeds did not reach it
    max: Optional[Seconds] = None  # None: a seed did not reach it


@record
class Seeds(TargetSeconds):
    """The fastest rung's time to accuracy over several seeds (`ladder.over_seeds`)."""

    variant: Name
    seeds: FreshSeeds
    epochs: Optional[Annotated[list[Optional[Epoch]], Len(0, 100)]] = None  # the epoch each reached it


@record
class TunedSeeds:
    """The `tuned` recipe over fresh seeds (`ladder.tuned_over_seeds`)."""

    recipe: Optional[Recipe] = None
    seeds: FreshSeeds
    accuracy: Annotated[list[Fraction], Len(1, 100)]
    accuracy_mean: Fraction
    accuracy_min: Fraction
    accuracy_max: Fraction
    targets: Annotated[list[TargetSeconds], Len(0, 4)]


@record
class Calibration:
    """The bench's first measure of this host (`estimate.calibrate`): seconds per train step of
    the write-up's model at the bench's batch on random data already on the device, and how
    much blocks of those steps disagreed."""

    step_s: Seconds  # the fastest block's
    spread: Ratio  # (slowest - fastest) / median over the blocks

    def written(self) -> Calibration:
        """As the document holds it: the step to a microsecond, the spread to 3 places."""
        return Calibration(step_s=round(self.step_s, 6), spread=round(self.spread, 3))


@record
class QuickPlan:
    """What a quick bench cut to end within its budget (`ladder._run_bench`)."""

    budget_s: Seconds
    cuts: Annotated[list[Line], Len(0, 64)] = field(default_factory=list)
    skipped: Annotated[list[Name], Len(0, 64)] = field(default_factory=list)


@record
class BenchDoc:
    """A data set's bench (`ladder.run_bench`, labelled by `stage.bench_dataset`)."""

    dataset: Name
    env: Optional[Env] = None
    params: RunParams
    compiled_options: Optional[Execution] = None  # what `compiled` ran with here
    variants: Annotated[dict[Name, Variant], Len(1, 64)]
    quick_plan: Optional[QuickPlan] = None
    floor: FloorDoc = FloorDoc()
    floor_s: Optional[Seconds] = None  # of wall_s: the floor's set-up and first epochs
    seeds: Optional[Seeds] = None
    tuned: Optional[TunedSeeds] = None
    seeds_s: Optional[Seconds] = None  # of wall_s: the runs over fresh seeds
    accuracy_tolerance: Optional[Fraction] = None
    calibration: Optional[Calibration] = None
    wall_s: Optional[Seconds] = None  # the whole bench of this data set (`ladder.run_bench`)
    machine: Optional[Fingerprint] = None
    date: Optional[IsoDate] = None


@record
class Split:
    MB: Num(ge=0, le=1e7)
    read_s: Seconds


@record
class CodecEntry:
    train: Split


CodecTable = dict[Name, dict[Name, dict[Name, CodecEntry]]]  # data set -> layout -> codec


@record
class RaceMeta:
    samples: Int(1, 10**10)


@record
class RaceRun:
    seconds: Optional[Seconds] = None  # absent where the run failed (its error is kept instead)


@record
class RaceDoc:
    """results/peers/scale-<n>.json, written by benchmarks/peers.py: per system and task, its runs."""

    meta: RaceMeta
    results: Annotated[dict[Name, dict[Name, list[RaceRun]]], Len(0, 64)]


def fastest_full(variants: dict[str, Variant]) -> tuple[str, Variant] | None:
    """The fully run variant (not extrapolated) with the fastest steady train epoch, or None
    when every one was sampled: the summary's headline and the report's "best here". The
    write-up's recipe only (`variants.writeup_recipe`)."""
    full = {name: entry for name, entry in variants.items() if not entry.extrapolated and writeup_recipe(name)}
    if not full:
        return None
    name = min(full, key=lambda n: full[n].train_s)
    return name, full[name]


def named_for(path: Path | str, doc: BenchDoc, error: type[InputError] = DataError) -> BenchDoc:
    """`doc`, read from `path`, when the file's name is the data set it holds (every bench
    file is `<dataset>.json`, and its readers find it by that name): a copy under another
    data set's name would put its figures under that data set."""
    stem = Path(path).stem
    if doc.dataset != stem:
        raise error(
            f"{path}: holds the bench of {doc.dataset!r}, but its name says {stem!r} (a bench file is "
            f"named for its data set: {doc.dataset}.json)"
        )
    return doc


def validate(path: Path | str, data: Any, model: Any, error: type[InputError] = DataError) -> Any:
    """`data` as `model`, or `error` naming `path` and the first bad key."""
    from pydantic import TypeAdapter, ValidationError

    try:
        return TypeAdapter(model).validate_python(data)
    except ValidationError as err:
        first = err.errors()[0]
        key = ".".join(str(part) for part in first["loc"]) or "(top level)"
        got = first.get("input")
        shown = f" (got {short(got)})" if isinstance(got, (int, float, str, bool)) or got is None else ""
        raise error(f"{path}: {key}: {first['msg']}{shown}") from None
