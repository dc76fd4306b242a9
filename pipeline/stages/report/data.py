"""The report's inputs, read and checked: bench documents (this machine's and every
committed machine's, the newest run of each), the codec table and the loader race's results.

Every metrics file is untrusted: it is read with a byte cap and checked against a schema
(numbers finite and in range, names plain slugs, free text escaped where rendered), and a bad
one stops the stage with one line naming the file and the key.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Optional

from pydantic import BaseModel, ConfigDict, Field, Strict, StrictBool, StrictInt, StringConstraints
from pydantic import ValidationError

from pipeline.core.bounded import read_json as read_checked_json
from pipeline.core.errors import SLUG, InputError, is_slug

MAX_FILE_BYTES = 4 << 20  # a bench or codec document is a few KB
THIS_MACHINE = "this-machine"  # the name of metrics/bench's machine when its files do not say


class ReportError(InputError):
    """An input the report cannot render: a bad metrics file, or a README block naming a
    file outside results/ or metrics/, a missing one, or one holding a block marker."""


# --- the schema of what is rendered ------------------------------------------------------

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


class Budget(Loose):
    step_s: Seconds
    data_wait_s: Seconds
    copy_s: Seconds
    compute_s: Seconds
    overhead_s: Seconds
    other_s: Seconds
    wall_s: Optional[Seconds] = None        # the profiled pass on a plain clock, per step
    epoch_step_s: Optional[Seconds] = None  # the timed epochs' median, per step
    kernels_per_step: Optional[float] = Field(default=None, ge=0, le=1e7)  # device kernels (CUDA)


class Measured(Loose):
    """The raw epoch times the bench took (for sampled variants: the sampled steps only)."""
    train_s: list[Seconds] = Field(max_length=10_000)
    test_s: list[Seconds] = Field(max_length=10_000)


class TimeToAccuracy(Loose):
    target: Fraction
    seconds: Optional[Seconds] = None          # None: no timed epoch reached the target
    epoch: Optional[StrictInt] = Field(default=None, ge=1, le=1 << 20)


class Variant(Loose):
    train_s: Seconds
    test_s: Seconds
    first_epoch_train_s: Optional[Seconds] = None
    setup_s: Optional[Seconds] = None
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
    budget: Optional[Budget] = None
    measured: Optional[Measured] = None
    time_to_accuracy: Optional[TimeToAccuracy] = None


class Machine(Loose):
    name: Slug
    cpu: Text
    cores: StrictInt = Field(ge=1, le=1 << 20)
    memory_gb: Annotated[float, Field(ge=0, le=1e7, allow_inf_nan=False)]
    gpu: Optional[Text] = None
    gpu_count: StrictInt = Field(default=0, ge=0, le=1 << 16)
    torch: Text
    cuda: Optional[Text] = None
    device: Annotated[str, StringConstraints(pattern=r"^(cpu|cuda)$", strict=True)]


class Env(Loose):
    """The older documents' description of the machine (before "machine")."""
    device: Text
    device_type: Text
    torch: Text
    cpu_count: StrictInt = Field(ge=1, le=1 << 20)
    commit: Optional[Text] = None
    date: Optional[IsoDate] = None


class RunParams(Loose):
    epochs: StrictInt = Field(ge=1, le=1 << 20)
    batch_size: StrictInt = Field(ge=1, le=1 << 30)
    sample_steps: Optional[StrictInt] = Field(default=None, ge=1, le=1 << 30)
    sample_epochs: Optional[StrictInt] = Field(default=None, ge=1, le=1 << 20)
    quick: StrictBool = False


class Floor(Loose):
    train_s: Optional[Seconds] = None
    compiled_train_s: Optional[Seconds] = None
    epochs: Optional[StrictInt] = Field(default=None, ge=1, le=1 << 20)  # the fastest of this many


class Seeds(Loose):
    """The fastest rung's time to accuracy over several seeds (`ladder.over_seeds`)."""
    variant: Slug
    target: Fraction
    seeds: list[StrictInt] = Field(min_length=1, max_length=100)
    seconds: list[Optional[Seconds]] = Field(min_length=1, max_length=100)
    reached: StrictInt = Field(ge=0, le=100)
    min: Seconds
    median: Seconds
    max: Seconds


class BenchDoc(Loose):
    dataset: Slug
    machine: Optional[Machine] = None
    env: Optional[Env] = None
    date: Optional[IsoDate] = None
    params: RunParams
    floor: Floor = Floor()
    variants: dict[Slug, Variant] = Field(min_length=1, max_length=64)
    seeds: Optional[Seeds] = None


class Split(Loose):
    MB: Megabytes
    read_s: Seconds


class CodecEntry(Loose):
    train: Split


CodecTable = dict[Slug, dict[Slug, dict[Slug, CodecEntry]]]  # data set -> layout -> codec


class RaceMeta(Loose):
    samples: StrictInt = Field(ge=1, le=10**10)


class RaceRun(Loose):
    seconds: Optional[Seconds] = None   # absent where the run failed (its error is kept instead)


class RaceDoc(Loose):
    """results/peers/scale-<n>.json, written by benchmarks/peers.py: per system and task, its runs."""
    meta: RaceMeta
    results: dict[Slug, dict[Slug, list[RaceRun]]] = Field(max_length=64)


def read_json(path: Path) -> Any:
    """A metrics file's JSON, read with a byte cap; a special file or bad JSON is refused."""
    path = Path(path)
    try:  # a special file, an oversized one, not JSON, a key twice, NaN: one line
        return read_checked_json(path, MAX_FILE_BYTES, "metrics file", finite=True)
    except InputError as err:
        raise ReportError(str(err)) from None


def checked(path: Path, data: Any, model: Any) -> Any:
    """`data` as `model`, or ReportError naming `path` and the first bad key."""
    from pydantic import TypeAdapter

    try:
        return TypeAdapter(model).validate_python(data)
    except ValidationError as err:
        first = err.errors()[0]
        key = ".".join(str(part) for part in first["loc"]) or "(top level)"
        got = first.get("input")
        shown = f" (got {_short(got)})" if isinstance(got, (int, float, str, bool)) or got is None else ""
        raise ReportError(f"{path}: {key}: {first['msg']}{shown}") from None


def _short(value: Any) -> str:
    text = repr(value) if not isinstance(value, str) else repr(value[:40])
    return text[:60]


# --- machines and their newest runs -----------------------------------------------------

@dataclass(frozen=True)
class Run:
    """One bench document, with where it came from."""
    doc: BenchDoc
    path: Path
    machine: str   # a slug
    local: bool    # from this machine's `dvc repro` (metrics/bench), not results/

    @property
    def when(self) -> dt.date | None:
        return self.doc.date or (self.doc.env.date if self.doc.env else None)


def is_bench_document(data: Any) -> bool:
    """A bench result (it has a ladder), as opposed to other JSON kept under results/ (a
    scale or loader benchmark's own figures), which this stage leaves alone."""
    return isinstance(data, dict) and "variants" in data


def load_run(path: Path, default_machine: str, local: bool, data: Any = None) -> Run:
    doc = checked(path, read_json(path) if data is None else data, BenchDoc)
    if doc.machine is None and doc.env is None:
        raise ReportError(f"{path}: machine: Field required (neither 'machine' nor the older 'env')")
    return Run(doc, Path(path), doc.machine.name if doc.machine else default_machine, local)


def collect_runs(bench_paths: list[Path], results_dir: Path | None) -> list[Run]:
    """This machine's runs (every file of metrics/bench/) and every committed machine's (the
    bench results among results/<machine>/*.json), all checked."""
    runs = [load_run(p, THIS_MACHINE, True) for p in sorted(bench_paths)]
    if results_dir is not None and Path(results_dir).is_dir():
        for folder in sorted(p for p in Path(results_dir).iterdir() if p.is_dir()):
            documents = [(p, data) for p in sorted(folder.glob("*.json")) if is_bench_document(data := read_json(p))]
            if documents and not is_slug(folder.name):
                raise ReportError(f"{folder}: a machine folder's name must be a plain slug (a-z, 0-9, '-', '_')")
            runs += [load_run(p, folder.name, False, data) for p, data in documents]
    return runs


def newest(runs: list[Run]) -> dict[str, dict[str, Run]]:
    """{machine: {dataset: its newest run}}: a machine both measured here and committed
    shows the run with the later date (an undated run counts as older; on a tie, or both
    undated, this machine's `dvc repro` wins). Machines in name order, this one first."""
    def key(run: Run) -> tuple:
        return (run.when or dt.date.min, run.local)

    best: dict[str, dict[str, Run]] = {}
    for run in runs:
        slot = best.setdefault(run.machine, {})
        if run.doc.dataset not in slot or key(run) > key(slot[run.doc.dataset]):
            slot[run.doc.dataset] = run
    order = sorted(best, key=lambda m: (not any(r.local for r in best[m].values()), m))
    return {m: dict(sorted(best[m].items())) for m in order}


def race_docs(results_dir: Path | None) -> list[RaceDoc]:
    """The loader race's results (results/peers/scale-*.json), checked, smallest scale first."""
    folder = Path(results_dir) / "peers" if results_dir is not None else None
    if folder is None or not folder.is_dir():
        return []
    docs = [checked(p, read_json(p), RaceDoc) for p in sorted(folder.glob("scale-*.json"))]
    return sorted(docs, key=lambda d: d.meta.samples)
