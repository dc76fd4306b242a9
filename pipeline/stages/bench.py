"""Stage `bench@<dataset>`: the training ladder (`pipeline.bench.ladder`) run on this
machine, written as the data set's bench metrics."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.bench.ladder import BenchSettings, run_bench
from pipeline.core.atomic import write_text


def write_bench(document: dict, out: Path) -> None:
    write_text(Path(out), json.dumps(document, indent=2) + "\n")


def bench_dataset(dataset: str, parquet: Path, shards: Path, out: Path, device: str,
                  settings: BenchSettings) -> dict:
    """Every variant of `settings` on one data set's wide Parquet and shards -> `out`."""
    document = run_bench(dataset, Path(parquet), Path(shards), device, settings)
    write_bench(document, out)
    return document
