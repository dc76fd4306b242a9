"""Stage `summary`: the few figures a user compares across experiments, in one small file.

Per data set, the train split's Parquet MB in the codec under study and the fastest rung's
steady seconds per epoch, with the machine that measured them: what `dvc metrics show` and
`dvc exp show` print in a 120-column terminal (docs/stages.md, "summary"). Every number read
is checked (finite, typed, in range) before it is written.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.bench.document import BenchDoc, Variant, fastest_full, named_for, validate
from pipeline.core.atomic import write_json
from pipeline.core.bounded import number, read_json, short
from pipeline.core.codec import Codec
from pipeline.core.dataset import SPLIT_BYTES_MAX
from pipeline.core.errors import DataError


def _object_at(source: Path, key: str, value) -> dict:
    if not isinstance(value, dict):
        raise DataError(f"{source}: {key}: expected an object, got {short(value)}")
    return value


def fastest(variants: dict[str, Variant], source: Path | str = "<bench>") -> tuple[str, Variant]:
    """The fully-run variant with the fastest steady train epoch."""
    best = fastest_full(variants)
    if best is None:
        raise DataError(
            f"{source}: variants: none was run in full (every one extrapolated), so there is no steady epoch to report"
        )
    return best


def headline(codec_figures: dict, layout: str, bench: BenchDoc, figures_source: Path, bench_source: Path) -> dict:
    """The data set's train split in `layout` (MB) and its fastest fully run rung (s/epoch)."""
    _, best = fastest(bench.variants, bench_source)
    entry = _object_at(
        Path(figures_source),
        f"train.{layout}",
        _object_at(Path(figures_source), "train", codec_figures.get("train")).get(layout),
    )
    size = number(figures_source, f"train.{layout}.bytes", entry.get("bytes"), 1, SPLIT_BYTES_MAX, integer=True)
    return {"MB": round(size / 1e6, 3), "epoch_s": round(best.train_s, 4)}


def machines(names: dict[str, str]) -> str:
    """One name when every data set's bench came from one machine, else each with its data set."""
    if len(set(names.values())) == 1:
        return next(iter(names.values()))
    return ", ".join(f"{name} ({dataset})" for dataset, name in names.items())


def write_summary(figures_dir: Path, bench_dir: Path, datasets: list[str], codec: str, layout: str, out: Path) -> dict:
    label = Codec.parse(codec).label
    summary: dict = {}
    names = {}
    for dataset in datasets:
        figures_path = Path(figures_dir) / dataset / f"{label}.json"
        bench_path = Path(bench_dir) / f"{dataset}.json"
        bench = named_for(
            bench_path, validate(bench_path, read_json(bench_path, 64 << 20, "bench metrics file"), BenchDoc)
        )
        summary[dataset] = headline(
            read_json(figures_path, what="figures file"), layout, bench, figures_path, bench_path
        )
        names[dataset] = bench.machine.name if bench.machine else "unnamed"
    summary = {"machine": machines(names), **summary}
    write_json(Path(out), summary)
    return summary
