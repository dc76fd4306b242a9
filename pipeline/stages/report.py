"""Stage `report`: everything a person reads about the measurements, regenerated from files.

Inputs: the bench metrics of this machine (`metrics/bench/<dataset>.json`, written by
`dvc repro`), those committed from other machines (`results/<machine>/<dataset>.json`), the
codec table (`metrics/codecs.json`) and recorded benchmark outputs under `results/`.
Outputs:

- `docs/results.md`, written whole: every machine's tables, the codec table, the storage
  and loading benchmarks;
- `docs/img/*.svg` and the Vega-Lite spec each was drawn from (`*.vl.json`);
- the plot data `dvc plots show` draws (`metrics/ladder.csv`, `metrics/budget.csv`);
- in the README, the blocks between `<!-- generated: NAME -->` and `<!-- /generated -->`
  and the recorded outputs between `<!-- embed: PATH -->` (fenced) or
  `<!-- include: PATH -->` (markdown) and their end markers; the prose around them stays.

Every metrics file is untrusted: it is read with a byte cap and checked against a schema
(numbers finite and in range, names plain slugs, free text escaped) before anything is
rendered, and a bad one stops the stage with one line naming the file and the key. Nothing
rendered can contain a block marker, so a run never makes the README grow.
"""

from __future__ import annotations

import csv
import html
import io
import math
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass
import datetime as dt
from pathlib import Path
from typing import Annotated, Any, Optional

from pydantic import BaseModel, ConfigDict, Field, Strict, StrictBool, StrictInt, StringConstraints
from pydantic import ValidationError

from pipeline.core.atomic import atomic_dir, write_text
from pipeline.core.bounded import read_capped
from pipeline.core.bounded import read_json as read_checked_json
from pipeline.core.errors import SLUG, InputError, is_slug
from pipeline.stages import charts

MAX_FILE_BYTES = 4 << 20  # a bench or codec document is a few KB
GENERATED = re.compile(r"<!-- generated: (?P<name>[a-z0-9-]+) -->\n.*?<!-- /generated -->", re.DOTALL)
EMBED = re.compile(r"<!-- embed: (?P<path>\S+) -->\n```(?P<lang>\w*)\n.*?```\n<!-- /embed -->", re.DOTALL)
INCLUDE = re.compile(r"<!-- include: (?P<path>\S+) -->\n.*?<!-- /include -->", re.DOTALL)  # markdown, unfenced
EMBED_ROOTS = ("results", "metrics")
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


class BenchDoc(Loose):
    dataset: Slug
    machine: Optional[Machine] = None
    env: Optional[Env] = None
    date: Optional[IsoDate] = None
    params: RunParams
    floor: Floor = Floor()
    variants: dict[Slug, Variant] = Field(min_length=1, max_length=64)


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


# --- text --------------------------------------------------------------------------------

def text(value: str) -> str:
    """Free text from a metrics file, safe in a markdown table and in HTML: entities escaped
    (so no tag and no `<!--` marker), pipes escaped, whitespace runs one space."""
    return html.escape(" ".join(value.split()), quote=True).replace("|", "\\|")


def num(x: float) -> str:
    """Three significant figures, never scientific: 0.0535, 1.35, 68.8, 1494."""
    if x == 0:
        return "0"
    digits = max(0, 2 - math.floor(math.log10(abs(x))))
    return f"{x:.{digits}f}"


def opt(x: float | None, fmt: Callable[[float], str] = num) -> str:
    return "n/a" if x is None else fmt(x)


def machine_line(run: Run) -> str:
    """Who measured: the machine's description, torch, date, where the file is."""
    d = run.doc
    if d.machine:
        m = d.machine
        gpu = f", {m.gpu_count} x {text(m.gpu)}" if m.gpu else ""
        cuda = f", CUDA {text(m.cuda)}" if m.cuda else ""
        what = f"{text(m.cpu)}, {m.cores} cores, {num(m.memory_gb)} GB{gpu}; torch {text(m.torch)}{cuda}; on {m.device}"
    else:
        e = d.env
        commit = f", commit {text(e.commit)}" if e.commit else ""
        what = f"{text(e.device)} ({text(e.device_type)}), {e.cpu_count} CPUs; torch {text(e.torch)}{commit}"
    when = f", {run.when.isoformat()}" if run.when else ""
    source = "`dvc repro` on this machine" if run.local else f"`{run.path.parent.name}/{run.path.name}`"
    p = d.params
    sampled = (f"; sampled rungs: {p.sample_steps} steps x {p.sample_epochs} epochs"
               if p.sample_steps and p.sample_epochs else "")
    quick = "**quick run** (`bench.quick`: fewer epochs and steps, no spread): " if p.quick else ""
    return f"{quick}{what}{when}; {p.epochs} epochs, batch {p.batch_size}{sampled} ({source})"


def spread_text(spread: Spread | None) -> str:
    """(max - min) / median of the timed epochs, as a percentage: unit-free, so it reads the
    same for a sampled variant (whose epochs are its sampled steps) as for a full one."""
    if spread is None:
        return "n/a"
    if spread.median == 0:
        return "0%" if spread.max == spread.min else "n/a"
    return f"{100 * (spread.max - spread.min) / spread.median:.0f}%"


VS_NAIVE = "vs naive: `naive`'s steady train s/epoch over the row's"
WALL_VS_NAIVE = "wall vs naive: `naive`'s wall s over the row's, what the whole run cost"


def vs_naive(naive: float | None, row: float | None) -> str:
    """`naive`'s figure over the row's, as "12.3x": the one meaning of "vs naive" everywhere."""
    if naive is None or row is None or row <= 0:
        return "n/a"
    return f"{num(naive / row)}x"


def reached(time: TimeToAccuracy | None) -> str:
    """"12.3 s (epoch 2) to 98%", "not reached (98%)", or "n/a" where not measured."""
    if time is None:
        return "n/a"
    target = f"{100 * time.target:g}%"
    if time.seconds is None:
        return f"not reached ({target})"
    return f"{num(time.seconds)} s to {target} (epoch {time.epoch})"


def ladder_table(run: Run) -> str:
    """One data set's ladder on one machine: steady figures beside what a user pays."""
    lines = [f"**{run.doc.dataset}**: {machine_line(run)}", "",
             "| variant | train s/epoch | spread | test s/epoch | setup s | wall s | accuracy "
             "| time to accuracy | vs naive | wall vs naive |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    naive = run.doc.variants.get("naive")
    for name, v in run.doc.variants.items():
        mark = " *" if v.extrapolated else ""
        mark += " (graph)" if v.cuda_graph else ""
        mark += " **unstable**" if v.unstable else ""
        spread = spread_text(v.spread)
        accuracy = opt(v.accuracy, lambda a: f"{a:.4f}") + ("" if v.accuracy_ok else " (outside tolerance)")
        vs = (f"{vs_naive(naive and naive.train_s, v.train_s)} | "
              f"{vs_naive(naive and naive.wall_s, v.wall_s)}")
        lines.append(f"| {name}{mark} | {num(v.train_s)} | {spread} | {num(v.test_s)} | {opt(v.setup_s)} "
                     f"| {opt(v.wall_s)} | {accuracy} | {reached(v.time_to_accuracy)} | {vs} |")
    reasons = [f"`{n}`: {text(v.unstable_reason or 'no reason given')}"
               for n, v in run.doc.variants.items() if v.unstable]
    if reasons:
        lines += ["", "Unstable (re-run on a quiet machine before trusting these): " + "; ".join(reasons) + "."]
    floor = run.doc.floor
    if floor.train_s is not None:
        extra = (f"; with `compiled`'s options {num(floor.compiled_train_s)} s/epoch"
                 if floor.compiled_train_s is not None else "")
        taken = f", the fastest of {floor.epochs} epochs taken between the variants" if floor.epochs else ""
        lines += ["", f"Compute floor (the same steps with no data path{taken}): {num(floor.train_s)} s/epoch{extra}."]
    return "\n".join(lines)


def budget_table(run: Run) -> str | None:
    rows = [(n, v.budget) for n, v in run.doc.variants.items() if v.budget]
    if not rows:
        return None
    head = " | ".join(charts.BUDGET_LABELS[p] for p in charts.BUDGET_PARTS)
    lines = [f"**{run.doc.dataset}** on `{run.machine}`, milliseconds per train step (clock: the profiled "
             "pass on a plain clock; timed: the timed epochs' median):", "",
             f"| variant | step | {head} | clock | timed |", "|---|---:|" + "---:|" * (len(charts.BUDGET_PARTS) + 2)]
    for name, b in rows:
        parts = " | ".join(num(1000 * getattr(b, p)) for p in charts.BUDGET_PARTS)
        clocks = " | ".join(opt(None if s is None else 1000 * s) for s in (b.wall_s, b.epoch_step_s))
        lines.append(f"| {name} | {num(1000 * b.step_s)} | {parts} | {clocks} |")
    return "\n".join(lines)


def best_variant(run: Run) -> tuple[str, Variant]:
    """The fastest steady train epoch among the fully run variants (sampled ones if none)."""
    full = {n: v for n, v in run.doc.variants.items() if not v.extrapolated} or run.doc.variants
    name = min(full, key=lambda n: full[n].train_s)
    return name, full[name]


def headline(machines: dict[str, dict[str, Run]]) -> str:
    """Per machine and data set: the write-up's naive loop, its best rung, and the fastest here."""
    lines = ["| machine | data set | naive | the write-up's best (`preprocessed`) | best here | vs naive |",
             "|---|---|---:|---:|---:|---:|"]
    for machine, runs in machines.items():
        for dataset, run in runs.items():
            variants = run.doc.variants
            naive = variants.get("naive")
            seed = variants.get("preprocessed")
            name, best = best_variant(run)
            flag = lambda n: " (unstable)" if variants[n].unstable else ""  # noqa: E731
            ratio = vs_naive(naive and naive.train_s, best.train_s)
            quick = " (quick)" if run.doc.params.quick else ""
            lines.append(f"| `{machine}`{quick} | {dataset} | {opt(naive and naive.train_s)}{naive and flag('naive') or ''} "
                         f"| {opt(seed and seed.train_s)}{seed and flag('preprocessed') or ''} "
                         f"| {num(best.train_s)} (`{name}`){flag(name)} | {ratio} |")
    return "\n".join(lines) + ("\n\nSeconds per train epoch (steady: the median of the timed epochs); "
                               + VS_NAIVE + ".")


def codec_table(codecs: dict[str, dict[str, dict[str, CodecEntry]]]) -> str:
    names = list(dict.fromkeys(c for layouts in codecs.values() for by in layouts.values() for c in by))
    lines = ["| data set | layout | " + " | ".join(names) + " |", "|---|---|" + "---:|" * len(names)]
    for dataset, layouts in codecs.items():
        for layout, by_codec in layouts.items():
            cells = [f"{num(by_codec[c].train.MB)} MB / {num(by_codec[c].train.read_s)} s" if c in by_codec else "n/a"
                     for c in names]
            lines.append(f"| {dataset} | {layout} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --- plot data ----------------------------------------------------------------------------

def csv_text(header: list[str], rows: list[list[Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue()


def ladder_csv(runs: list[Run]) -> str:
    """This machine's ladder for `dvc plots show`: a row per variant, a column per data set."""
    names = list(dict.fromkeys(n for r in runs for n in r.doc.variants))
    rows = [[n] + [r.doc.variants[n].train_s if n in r.doc.variants else "" for r in runs] for n in names]
    return csv_text(["variant"] + [r.doc.dataset for r in runs], rows)


def budget_csv(runs: list[Run]) -> str:
    """This machine's budget for the stacked bars: a row per variant and part, seconds per step."""
    names = list(dict.fromkeys(n for r in runs for n, v in r.doc.variants.items() if v.budget))
    rows = []
    for n in names:
        for part in charts.BUDGET_PARTS:
            cells = []
            for r in runs:
                b = r.doc.variants.get(n) and r.doc.variants[n].budget
                cells.append(getattr(b, part) if b else "")
            rows.append([n, charts.BUDGET_LABELS[part]] + cells)
    return csv_text(["variant", "part"] + [r.doc.dataset for r in runs], rows)


# --- chart data ---------------------------------------------------------------------------

def ladder_rows(machines: dict[str, dict[str, Run]]) -> list[dict[str, Any]]:
    return [{"machine": m, "dataset": d, "variant": n, "rank": i, "train_s": v.train_s}
            for m, runs in machines.items() for d, r in runs.items()
            for i, (n, v) in enumerate(r.doc.variants.items())]


def codec_rows(codecs: dict[str, dict[str, dict[str, CodecEntry]]]) -> list[dict[str, Any]]:
    return [{"dataset": d, "layout": layout, "codec": c, "rank": i, "MB": e.train.MB}
            for d, layouts in codecs.items() for layout, by in layouts.items()
            for i, (c, e) in enumerate(by.items())]


def budget_rows(machines: dict[str, dict[str, Run]]) -> list[dict[str, Any]]:
    return [{"panel": f"{m} / {d}", "variant": n, "rank": i, "part": charts.BUDGET_LABELS[p], "order": k,
             "seconds": getattr(v.budget, p)}
            for m, runs in machines.items() for d, r in runs.items()
            for i, (n, v) in enumerate(r.doc.variants.items()) if v.budget
            for k, p in enumerate(charts.BUDGET_PARTS)]


# The race's measures the chart shows (benchmarks/peers.py task -> label); docs/shards.md has them all.
RACE_TASKS = {"write-none": "write, uncompressed", "epoch-0": "shuffled epoch, batch 512, workers 0",
              "first": "time to first batch"}
SYSTEM_LABELS = {"litdata": "LitData", "streaming": "MosaicML Streaming", "webdataset": "WebDataset",
                 "lance": "Lance"}


def race_docs(results_dir: Path | None) -> list[RaceDoc]:
    """The loader race's results (results/peers/scale-*.json), checked, smallest scale first."""
    folder = Path(results_dir) / "peers" if results_dir is not None else None
    if folder is None or not folder.is_dir():
        return []
    docs = [checked(p, read_json(p), RaceDoc) for p in sorted(folder.glob("scale-*.json"))]
    return sorted(docs, key=lambda d: d.meta.samples)


def race_rows(docs: list[RaceDoc]) -> list[dict[str, Any]]:
    """The median seconds of each system's runs of each charted measure, per scale."""
    rows = []
    for doc in docs:
        for task, label in RACE_TASKS.items():
            for system, tasks in doc.results.items():
                seconds = [r.seconds for r in tasks.get(task, []) if r.seconds is not None]
                if seconds:
                    rows.append({"panel": f"{label}, {doc.meta.samples:,} samples",
                                 "system": SYSTEM_LABELS.get(system, system), "project": system == "project",
                                 "seconds": statistics.median(seconds)})
    return rows


def chart_specs(machines: dict[str, dict[str, Run]], codecs: dict | None,
                race: list[dict[str, Any]] | None = None) -> dict[str, charts.Spec]:
    """{image name: spec} of every chart the inputs support."""
    specs = {"ladder": charts.ladder_spec(ladder_rows(machines))} if machines else {}
    if codecs:
        specs["codecs"] = charts.codec_spec(codec_rows(codecs))
    budget = budget_rows(machines)
    if budget:
        specs["budget"] = charts.budget_spec(budget)
    if race:
        specs["race"] = charts.race_spec(race)
    return specs


# --- the generated documents --------------------------------------------------------------

NOTE = ("`*` sampled: timed over a fixed number of steps per epoch and scaled to the whole epoch "
        "(accuracy not measured). `(graph)`: each epoch replays one CUDA graph. **unstable**: the timed "
        "epochs spread more than `bench.max_spread`, a twin doing identical work disagrees, or it beats "
        "its floor. spread: (max - min) / median of the timed epochs. setup s: everything before the "
        "first timed step; wall s: setup plus every epoch, train and test (a sampled row's: scaled from its "
        "sampled steps, like its epochs). time to accuracy: from the rung's start, setup included, to "
        "the end of the first test pass at or above `bench.target_accuracy` (a sampled rung measures "
        "no accuracy). " + VS_NAIVE + "; " + WALL_VS_NAIVE + ".")


def image(name: str, alt: str, prefix: str) -> str:
    return f"![{alt}]({prefix}img/{name}.svg)"


def spent_s(run: Run) -> float | None:
    """Seconds the bench spent on a run's variants: each one's setup and every epoch it
    actually timed (a sampled variant's sampled steps, not its extrapolated epoch); None
    when a variant does not record them."""
    total = 0.0
    for v in run.doc.variants.values():
        if v.measured is None:
            return None
        total += (v.setup_s or 0.0) + sum(v.measured.train_s) + sum(v.measured.test_s)
    return total


def bench_time(machines: dict[str, dict[str, Run]]) -> str:
    """How long the bench ran on each CPU machine, from what its metrics record."""
    lines = []
    for machine, runs in machines.items():
        cpu = [r for r in runs.values() if (r.doc.machine.device if r.doc.machine else r.doc.env.device_type) == "cpu"]
        spent = [spent_s(r) for r in cpu]
        if cpu and None not in spent:
            first = cpu[0]
            cores = first.doc.machine.cores if first.doc.machine else first.doc.env.cpu_count
            lines.append(f"- `{machine}` ({cores} cores): {num(sum(spent) / 60)} minutes for "
                         f"{', '.join(r.doc.dataset for r in cpu)} (setup and timed epochs of every variant)")
    return "\n".join(lines) or "No CPU bench run on record yet."


def blocks(machines: dict[str, dict[str, Run]], codecs: dict | None, images: set[str]) -> dict[str, str]:
    """The README's generated blocks, by name."""
    out = {"headline": headline(machines) if machines else "No bench results yet: run `dvc repro`.",
           "bench-time": bench_time(machines)}
    out["ladder-chart"] = (image("ladder", "Seconds per train epoch per rung, per machine (log scale)", "docs/")
                           if "ladder" in images else "No bench results yet.")
    out["codec-chart"] = (image("codecs", "Train split size by Parquet codec", "docs/")
                          if "codecs" in images else "No codec table yet: run `dvc repro codecs`.")
    out["budget-chart"] = (image("budget", "Where a train step's time goes, per rung", "docs/")
                           if "budget" in images else
                           "The bench metrics on hand carry no time budget yet: run `dvc repro bench@mnist`.")
    return out


def benchmark_outputs(root: Path, folders: set[Path]) -> list[Path]:
    """Recorded benchmark outputs: results/benchmarks/<machine>/<name>.txt, and the text
    outputs kept beside a machine's bench results (`folders`: results/<machine>/)."""
    base = root.resolve() / "results"
    recorded = set(base.glob("benchmarks/*/*.txt")) if base.is_dir() else set()
    return sorted(recorded | {t for folder in folders for t in folder.glob("*.txt")})


def results_page(machines: dict[str, dict[str, Run]], codecs: dict | None, images: set[str], root: Path,
                 folders: set[Path]) -> str:
    """docs/results.md, whole."""
    parts = ["# Results", "",
             "<!-- Written by `dvc repro report` from metrics/ and results/; edits here are overwritten. -->", "",
             "Every figure on this page comes from a file: `metrics/bench/<dataset>.json` (this machine's "
             "`dvc repro`) and `results/<machine>/<dataset>.json` (runs committed from other machines; the "
             "newest run of each machine is shown). How they are measured: [the bench](bench.md).", ""]
    if machines:
        parts += ["## Headline", "", headline(machines), ""]
    if "ladder" in images:
        parts += [image("ladder", "Seconds per train epoch per rung, per machine (log scale)", ""), ""]
    for machine, runs in machines.items():
        parts += [f"## `{machine}`", ""]
        parts += [p for r in runs.values() for p in (ladder_table(r), "")]
    if machines:
        parts += [NOTE, ""]
    budgets = [t for runs in machines.values() for r in runs.values() if (t := budget_table(r))]
    if budgets:
        parts += ["## Where a train step's time goes", "",
                  "A profiled pass outside the timed epochs splits each train step into parts that add up to "
                  "the step ([how](bench.md#the-time-budget)).", ""]
        if "budget" in images:
            parts += [image("budget", "Where a train step's time goes, per rung", ""), ""]
        parts += [p for t in budgets for p in (t, "")]
    if codecs:
        parts += ["## Parquet codecs", "", "Train split: Parquet size / seconds to read it back into a uint8 "
                  "array (`metrics/codecs.json`).", "", codec_table(codecs), ""]
        if "codecs" in images:
            parts += [image("codecs", "Train split size by Parquet codec", ""), ""]
    if "race" in images:
        parts += ["## The loader race", "", "The project's shards against the loaders users pick, from "
                  "`results/peers/` ([every measure, and how](shards.md#the-race)).", "",
                  image("race", "The loader race: median seconds per system", ""), ""]
    outputs = benchmark_outputs(root, folders)
    if outputs:
        parts += ["## Storage and loading benchmarks", "",
                  "Each block is a benchmark's own output, recorded with `python benchmarks/record.py NAME -- "
                  "COMMAND` (the command is its first line). Re-run them on your machine the same way: the "
                  "figures depend on its cores, memory bandwidth and disk cache.", ""]
        for path in outputs:
            name = path.relative_to(root.resolve()).as_posix()
            parts += [f"### `{name}`", "", f"<!-- embed: {name} -->", "```", "```", "<!-- /embed -->", ""]
    train = sorted((root / "metrics" / "train").glob("*.json")) if (root / "metrics" / "train").is_dir() else []
    if train:
        parts += ["## Training under torchrun (`train@<dataset>`)", ""]
        for path in train:
            name = path.relative_to(root).as_posix()
            parts += [f"<!-- embed: {name} -->", "```json", "```", "<!-- /embed -->", ""]
    if (root / "results" / "mutation" / "score.md").is_file():
        parts += ["## Mutation score", "", "What it means: [testing](testing.md#mutation-testing).", "",
                  "<!-- include: results/mutation/score.md -->", "<!-- /include -->", ""]
    return embed("\n".join(parts).rstrip("\n") + "\n", root)


def _no_markers(where: str, body: str) -> str:
    if "<!--" in body or "-->" in body:
        raise ReportError(f"{where}: holds a block marker ('<!--' or '-->'); refusing to embed it")
    return body


def splice(readme: str, bodies: dict[str, str], where: str = "README.md") -> str:
    """`readme` with each `<!-- generated: NAME -->` block's body replaced by `bodies[NAME]`."""
    def fill(match: re.Match) -> str:
        name = match["name"]
        if name not in bodies:
            raise ReportError(f"{where}: unknown generated block {name!r} (known: {', '.join(sorted(bodies))})")
        return f"<!-- generated: {name} -->\n{_no_markers(name, bodies[name])}\n<!-- /generated -->"

    return GENERATED.sub(fill, readme)


def embed(text: str, root: Path) -> str:
    """`text` with every embed block (fenced) and include block (markdown as is) refreshed
    from its file under `root` (the repository)."""
    def read(name: str, fenced: bool) -> str:
        path = (root / name).resolve()
        if not any(path.is_relative_to((root / top).resolve()) for top in EMBED_ROOTS):
            raise ReportError(f"embed {name!r}: only files under {' or '.join(EMBED_ROOTS)}/ may be embedded")
        if not path.is_file():
            raise ReportError(f"embed {name!r}: no such file")
        data = read_capped(path, MAX_FILE_BYTES, "embedded file")
        body = _no_markers(name, data.decode("utf-8", errors="replace").rstrip("\n"))
        if fenced and "```" in body:
            raise ReportError(f"embed {name!r}: holds a code fence (```); refusing to embed it")
        return body

    text = EMBED.sub(lambda m: f"<!-- embed: {m['path']} -->\n```{m['lang']}\n{read(m['path'], True)}\n```\n"
                               f"<!-- /embed -->", text)
    return INCLUDE.sub(lambda m: f"<!-- include: {m['path']} -->\n{read(m['path'], False)}\n<!-- /include -->", text)


# --- the stage ----------------------------------------------------------------------------

@dataclass
class Rendered:
    """Everything the stage writes, as text, keyed by what it is."""
    readme: str
    results: str
    ladder_csv: str
    budget_csv: str
    specs: dict[str, str]  # image name -> spec text


def render_all(bench_paths: list[Path], codecs_path: Path | None, results_dir: Path | None,
               readme_text: str, root: Path) -> tuple[Rendered, dict[str, charts.Spec]]:
    """What the stage writes, but the SVGs (see `write_report`), computed from the inputs alone."""
    runs = collect_runs(bench_paths, results_dir)
    machines = newest(runs)
    codecs = None
    if codecs_path is not None and Path(codecs_path).exists():
        codecs = {d: {lay: dict(by) for lay, by in layouts.items()}
                  for d, layouts in checked(codecs_path, read_json(codecs_path), CodecTable).items()}
    specs = chart_specs(machines, codecs, race_rows(race_docs(results_dir)))
    local = [r for r in runs if r.local]
    readme = embed(splice(readme_text, blocks(machines, codecs, set(specs))), root)
    inside = root.resolve()
    folders = {r.path.parent.resolve() for r in runs if not r.local and r.path.resolve().is_relative_to(inside)}
    rendered = Rendered(readme=readme, results=results_page(machines, codecs, set(specs), root, folders),
                        ladder_csv=ladder_csv(local), budget_csv=budget_csv(local),
                        specs={name: charts.spec_text(s) for name, s in specs.items()})
    return rendered, specs


def write_report(bench_paths: list[Path], codecs_path: Path | None, readme: Path, results_dir: Path | None,
                 results_page_path: Path, images: Path, ladder_plot: Path, budget_plot: Path) -> None:
    """Render everything from the inputs, then write it; a bad input changes no output."""
    readme = Path(readme)
    root = readme.resolve().parent
    rendered, specs = render_all(bench_paths, codecs_path, results_dir, readme.read_text(), root)
    svgs = {name: charts.to_svg(spec) for name, spec in specs.items()}
    write_text(Path(ladder_plot), rendered.ladder_csv)
    write_text(Path(budget_plot), rendered.budget_csv)
    with atomic_dir(Path(images)) as tmp:
        for name, spec in rendered.specs.items():
            (tmp / f"{name}.vl.json").write_text(spec)
            (tmp / f"{name}.svg").write_text(svgs[name])
    write_text(Path(results_page_path), rendered.results)
    write_text(readme, rendered.readme)
