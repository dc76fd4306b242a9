"""Stage `codecs`: the size/speed table of every data set x split x layout x codec.

Gathers the figures each convert stage measured into one metrics file for
`dvc metrics show` / `dvc metrics diff`, and a flat table for `dvc plots` (written with the
csv module). Every figure is checked first: a size is a positive integer, a time a finite
number of seconds in range; anything else stops the stage naming the file and the key.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from pipeline.core.atomic import write_json, write_text
from pipeline.core.bounded import number, read_json, short
from pipeline.core.codec import Codec
from pipeline.core.dataset import SPLIT_BYTES_MAX, SPLITS
from pipeline.core.errors import DataError
from pipeline.core.parquet import LAYOUTS

MAX_SECONDS = 24 * 3600  # writing or reading one split


def _entry(path: Path, figures, key: str) -> dict:
    node = figures
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if not isinstance(node, dict):
        raise DataError(f"{path}: {key}: expected an object, got {short(node)}")
    return node


def _round(value: float, digits: int = 3) -> float:
    return float(f"{value:.{digits}g}") if value < 1 else round(value, digits)


def codec_table(figures_dir: Path, datasets: list[str], codecs: list[str]) -> dict:
    """{dataset: {layout: {codec: {split: {MB, ratio, write_s, read_s}}}}}."""
    table: dict = {}
    for dataset in datasets:
        for spec in codecs:
            label = Codec.parse(spec).label
            path = Path(figures_dir) / dataset / f"{label}.json"
            figures = read_json(path, what="figures file")
            for layout in LAYOUTS:
                for split in SPLITS:
                    entry = _entry(path, figures, f"{split}.{layout}")
                    where = f"{split}.{layout}"
                    size = number(path, f"{where}.bytes", entry.get("bytes"), 1, SPLIT_BYTES_MAX, integer=True)
                    csv_bytes = number(
                        path,
                        f"{split}.csv_bytes",
                        _entry(path, figures, split).get("csv_bytes"),
                        1,
                        SPLIT_BYTES_MAX,
                        integer=True,
                    )
                    table.setdefault(dataset, {}).setdefault(layout, {}).setdefault(label, {})[split] = {
                        "MB": round(size / 1e6, 3),
                        "ratio": round(csv_bytes / size, 2),
                        "write_s": _round(number(path, f"{where}.write_s", entry.get("write_s"), 0, MAX_SECONDS)),
                        "read_s": _round(number(path, f"{where}.read_s", entry.get("read_s"), 0, MAX_SECONDS)),
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


def write_codecs(
    figures_dir: Path, datasets: list[str], codecs: list[str], metrics_path: Path, plot_path: Path
) -> dict:
    table = codec_table(figures_dir, datasets, codecs)
    write_json(Path(metrics_path), table)
    rows = size_rows(table)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    write_text(Path(plot_path), buffer.getvalue())
    return table
