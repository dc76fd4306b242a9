"""Stage `codecs`: the size/speed table of every data set x split x layout x codec.

Gathers the figures each convert stage measured into one metrics file for
`dvc metrics show` / `dvc metrics diff`, and a flat table for `dvc plots`.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from pipeline.core.atomic import write_text
from pipeline.core.codec import Codec
from pipeline.core.dataset import SPLITS
from pipeline.stages.parquet import LAYOUTS


def _round(value: float, digits: int = 3) -> float:
    return float(f"{value:.{digits}g}") if value < 1 else round(value, digits)


def codec_table(figures_dir: Path, datasets: list[str], codecs: list[str]) -> dict:
    """{dataset: {layout: {codec: {split: {MB, ratio, write_s, read_s}}}}}."""
    table: dict = {}
    for dataset in datasets:
        for spec in codecs:
            label = Codec.parse(spec).label
            path = Path(figures_dir) / dataset / f"{label}.json"
            figures = json.loads(path.read_text())
            for layout in LAYOUTS:
                for split in SPLITS:
                    entry = figures[split][layout]
                    table.setdefault(dataset, {}).setdefault(layout, {}).setdefault(label, {})[split] = {
                        "MB": round(entry["bytes"] / 1e6, 3),
                        "ratio": round(figures[split]["csv_bytes"] / entry["bytes"], 2),
                        "write_s": _round(entry["write_s"]),
                        "read_s": _round(entry["read_s"]),
                    }
    return table


def size_rows(table: dict) -> list[dict]:
    """One row per codec, one column per data set x layout (train split MB): the plot's data."""
    codecs = list(next(iter(next(iter(table.values())).values())))
    rows = []
    for codec in codecs:
        row: dict = {"codec": codec}
        for dataset, layouts in table.items():
            for layout, by_codec in layouts.items():
                row[f"{dataset} {layout}"] = by_codec[codec]["train"]["MB"]
        rows.append(row)
    return rows


def write_codecs(figures_dir: Path, datasets: list[str], codecs: list[str],
                 metrics_path: Path, plot_path: Path) -> dict:
    table = codec_table(figures_dir, datasets, codecs)
    write_text(Path(metrics_path), json.dumps(table, indent=2) + "\n")
    rows = size_rows(table)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    write_text(Path(plot_path), buffer.getvalue())
    return table
