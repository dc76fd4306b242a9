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
from typing import Any

from pipeline.bench.document import BenchDoc, RaceDoc, named_for, validate
from pipeline.core.bounded import read_json as read_checked_json
from pipeline.core.errors import InputError, is_slug

MAX_FILE_BYTES = 4 << 20  # a bench or codec document is a few KB
THIS_MACHINE = "this-machine"  # the name of metrics/bench's machine when its files do not say


class ReportError(InputError):
    """An input the report cannot render: a bad metrics file, or a README block naming a
    file outside results/ or metrics/, a missing one, or one holding a block marker."""


def read_metrics(path: Path) -> Any:
    """A metrics file's JSON, read with a byte cap; a special file or bad JSON is refused."""
    path = Path(path)
    try:  # a special file, an oversized one, not JSON, a key twice, NaN: one line
        return read_checked_json(path, MAX_FILE_BYTES, "metrics file", finite=True)
    except InputError as err:
        raise ReportError(str(err)) from None


def as_model(path: Path, data: Any, model: Any) -> Any:
    """`data` as `model`, or ReportError naming `path` and the first bad key."""
    return validate(path, data, model, ReportError)


# --- machines and their newest runs -----------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One bench document, with where it came from."""

    doc: BenchDoc
    path: Path
    machine: str  # a slug
    local: bool  # from this machine's `dvc repro` (metrics/bench), not results/

    @property
    def when(self) -> dt.date | None:
        return self.doc.date or (self.doc.env.date if self.doc.env else None)


def is_bench_document(data: Any) -> bool:
    """A bench result (it has a ladder), as opposed to other JSON kept under results/ (a
    scale or loader benchmark's own figures), which this stage leaves alone."""
    return isinstance(data, dict) and "variants" in data


def load_run(path: Path, default_machine: str, local: bool, data: Any = None) -> Run:
    doc = named_for(path, as_model(path, read_metrics(path) if data is None else data, BenchDoc), ReportError)
    if doc.machine is None and doc.env is None:
        raise ReportError(f"{path}: machine: Field required (neither 'machine' nor the older 'env')")
    return Run(doc, Path(path), doc.machine.name if doc.machine else default_machine, local)


def collect_runs(bench_paths: list[Path], results_dir: Path | None) -> list[Run]:
    """This machine's runs (every file of metrics/bench/) and every committed machine's (the
    bench results among results/<machine>/*.json), all checked."""
    runs = [load_run(p, THIS_MACHINE, True) for p in sorted(bench_paths)]
    if results_dir is not None and Path(results_dir).is_dir():
        for folder in sorted(p for p in Path(results_dir).iterdir() if p.is_dir()):
            documents = [(p, data) for p in sorted(folder.glob("*.json")) if is_bench_document(data := read_metrics(p))]
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
    docs = [as_model(p, read_metrics(p), RaceDoc) for p in sorted(folder.glob("scale-*.json"))]
    return sorted(docs, key=lambda d: d.meta.samples)
