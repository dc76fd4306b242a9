"""sources.yaml: what each data set is, as its publisher fixed it, read strictly.

Per data set: `files` (each raw file's name on the mirrors, the sha256 of its decompressed
content and, optionally, its decompressed size in `bytes`), `mirrors`, and `rows`: how many
samples each split has. The rows are what every stage that reads samples checks its input
against (fetch the IDX headers, csv the IDX files, convert the CSV lines, shard the Parquet
row counts), so an input with more rows than the data set has is refused before it costs
what its size would. Standard library and PyYAML only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.core.bounded import load_yaml, short
from pipeline.core.errors import InputError

SOURCES_CAP = 1 << 20          # bytes: the file is a few KiB
MAX_ROWS = 1 << 24             # samples in one split: far above any data set of 28x28 images here
SPLITS = ("train", "test")


class SourcesError(InputError):
    """sources.yaml lacks what a command needs, or holds it in the wrong shape."""


def read_sources(path: Path) -> dict[str, Any]:
    try:
        sources = load_yaml(Path(path), SOURCES_CAP, "sources file")
    except FileNotFoundError:
        raise SourcesError(f"{path}: no such sources file") from None
    except InputError as err:
        raise SourcesError(str(err)) from None
    return sources if isinstance(sources, dict) else {}


def dataset_entry(path: Path, dataset: str) -> dict[str, Any]:
    """`dataset`'s mapping in sources.yaml, which must hold a `files` mapping."""
    sources = read_sources(path)
    entry = sources.get(dataset)
    if not isinstance(entry, dict) or not isinstance(entry.get("files"), dict):
        raise SourcesError(f"{path}: no data set {short(dataset)} with a `files` mapping "
                           f"(known: {sorted(map(str, sources))[:20]})")
    return entry


def known_rows(path: Path, dataset: str) -> dict[str, int]:
    """{split: rows} of `dataset`, as sources.yaml records them (`rows: {train: N, test: M}`)."""
    rows = dataset_entry(path, dataset).get("rows")
    if not isinstance(rows, dict) or set(rows) != set(SPLITS):
        raise SourcesError(f"{path}: {dataset}.rows must map each of {list(SPLITS)} to its number of samples "
                           f"(got {short(rows)})")
    for split in SPLITS:
        value = rows[split]
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_ROWS:
            raise SourcesError(f"{path}: {dataset}.rows.{split}: expected an integer in 1..{MAX_ROWS:,}, "
                               f"got {short(value)}")
    return {split: rows[split] for split in SPLITS}
