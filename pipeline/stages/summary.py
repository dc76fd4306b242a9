"""Stage `summary`: the few figures a user compares across experiments, in one small file.

`dvc metrics show` prints one row per metrics file with a column per key, and `dvc exp show`
one column per key, prefixed with the file's path whenever two files share a key. Both fit a
120-column terminal only with one metrics file of a few dataset-qualified keys: per data
set, the train split's Parquet MB in the codec under study (the `convert.codec` param, a
column of its own) and the fastest variant's steady seconds per epoch. A codec experiment
changes the first (its shards are byte-identical, so no training reruns); a bench change,
the second. The full tables are `metrics/codecs.json` and `metrics/bench/<dataset>.json`,
drawn by `dvc plots` and rendered in docs/results.md.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.core.atomic import write_text
from pipeline.core.codec import Codec


def fastest(variants: dict) -> tuple[str, dict]:
    """The fully-run variant with the fastest steady train epoch."""
    measured = {name: v for name, v in variants.items() if not v.get("extrapolated")}
    name = min(measured, key=lambda n: measured[n]["train_s"])
    return name, measured[name]


def headline(codec_figures: dict, layout: str, bench: dict) -> dict:
    _, best = fastest(bench["variants"])
    return {"MB": round(codec_figures["train"][layout]["bytes"] / 1e6, 3), "epoch_s": round(best["train_s"], 4)}


def write_summary(figures_dir: Path, bench_dir: Path, datasets: list[str], codec: str, layout: str,
                  out: Path) -> dict:
    label = Codec.parse(codec).label
    summary = {dataset: headline(json.loads((Path(figures_dir) / dataset / f"{label}.json").read_text()), layout,
                                 json.loads((Path(bench_dir) / f"{dataset}.json").read_text()))
               for dataset in datasets}
    write_text(Path(out), json.dumps(summary, indent=2) + "\n")
    return summary
