"""Stage `bench@<dataset>`: the training ladder (`pipeline.bench.ladder`) run on this
machine, written as the data set's bench metrics, labelled with the machine it measured."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import sys
from pathlib import Path

from pipeline.bench.document import BenchDoc, validate
from pipeline.bench.ladder import run_bench
from pipeline.bench.settings import BenchSettings
from pipeline.budget import Fingerprint
from pipeline.core.atomic import as_json, write_json
from pipeline.core.bounded import read_json
from pipeline.core.errors import DataError, InputError, reason


def read_machine(path: Path) -> Fingerprint:
    """The machine stage's fingerprint, checked: the bench copies it into every result."""
    try:  # a few hundred bytes: 64 KiB read at most
        machine = read_json(Path(path), 1 << 16, "machine fingerprint")
    except (OSError, InputError) as err:
        raise InputError(f"{path}: not a machine fingerprint ({reason(err)}); run `dvc repro machine`") from None
    keys = [field.name for field in dataclasses.fields(Fingerprint)]
    if not isinstance(machine, dict) or set(machine) != set(keys):
        found = sorted(machine) if isinstance(machine, dict) else type(machine).__name__
        raise InputError(
            f"{path}: expected the keys {sorted(keys)}, found {found} (written by an older or other "
            "version?): run `dvc repro machine`"
        )
    return validate(path, machine, Fingerprint, InputError)


def write_bench(document: BenchDoc, out: Path) -> None:
    """Write the bench document, its values first checked against their bounds (its keys are
    its type's): a value out of range stops the stage with one line and leaves `out` as it
    was; the refused document is kept in the system's temporary folder, named in that line,
    so a long run is not lost. Where pydantic is not installed (a machine with torch alone),
    written unchecked: the report checks it when the results come home."""
    written = as_json(document)
    try:
        validate(out, written, BenchDoc)
    except ImportError:
        print(f"{out}: written unchecked (pydantic is not installed here)", file=sys.stderr)
    except DataError as err:
        raise DataError(f"{err}; the run's document is kept as {keep_rejected(written, out)}") from None
    write_json(Path(out), written)


def keep_rejected(document: dict, out: Path) -> str:
    """Write a refused bench document to a new file in the system's temporary folder (never
    beside `out`, where readers would take it for a result); its path."""
    import tempfile

    fd, path = tempfile.mkstemp(prefix=f"bench-{Path(out).stem}-refused-", suffix=".json")
    with open(fd, "w", encoding="utf-8") as f:
        json.dump(document, f, indent=2)
        f.write("\n")
    return path


def warn_unstable(document: BenchDoc, stream=sys.stderr) -> None:
    """One line naming the variants whose figures are not to be trusted, and what to do."""
    shaky = [f"{name} ({entry.unstable_reason})" for name, entry in document.variants.items() if entry.unstable]
    if shaky:
        print(
            f"warning: {document.dataset}: unstable on this machine: {'; '.join(shaky)}. Re-run on a "
            f"quiet machine: dvc repro -f -s bench@{document.dataset}",
            file=stream,
        )


def earlier_runs(out: Path, results: Path = Path("results")) -> list[Path]:
    """Bench documents the estimate may scale from: the workspace's (`out`'s folder) and
    every machine's committed ones (`results/<machine>/`)."""
    return sorted(Path(out).parent.glob("*.json")) + sorted(Path(results).glob("*/*.json"))


QUICK_KEEP = "PIPELINE_QUICK_KEEP"  # `make bench-quick`: where each finished data set's document is kept


def bench_dataset(
    dataset: str,
    parquet: Path,
    shards: Path,
    out: Path,
    device: str,
    settings: BenchSettings,
    machine: Fingerprint,
    earlier: list[Path] | None = None,
) -> BenchDoc:
    """Every variant of `settings` on one data set's wide Parquet and shards -> `out`; the
    estimate printed first scales from `earlier` (default: `earlier_runs(out)`). A quick run
    under `make bench-quick` also leaves a copy in the folder QUICK_KEEP names (outside the
    experiment's scratch copy, which a stopped run loses)."""
    earlier = earlier_runs(out) if earlier is None else earlier
    document = run_bench(dataset, Path(parquet), Path(shards), device, settings, earlier, machine.name)
    document = dataclasses.replace(document, machine=machine, date=dt.date.today())
    write_bench(document, out)
    keep = os.environ.get(QUICK_KEEP)
    if settings.quick and keep:
        write_json(Path(keep) / f"{dataset}.json", document)
    warn_unstable(document)
    return document
