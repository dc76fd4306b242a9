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
from pipeline.core.dataset import SPLITS
from pipeline.core.errors import InputError, is_hex

SOURCES_CAP = 1 << 20  # bytes: the file is a few KiB
MAX_ROWS = 1 << 24  # samples in one split: far above any data set of 28x28 images here
IDX_ROLES = ("train_images", "train_labels", "test_images", "test_labels")


class SourcesError(InputError):
    """sources.yaml lacks what a command needs, or holds it in the wrong shape."""


def read_sources(path: Path) -> dict[str, Any]:
    sources = load_yaml(Path(path), SOURCES_CAP, "sources file", SourcesError)
    return sources if isinstance(sources, dict) else {}


def dataset_entry(path: Path, dataset: str) -> dict[str, Any]:
    """`dataset`'s mapping in sources.yaml, which must hold a `files` mapping."""
    sources = read_sources(path)
    entry = sources.get(dataset)
    if not isinstance(entry, dict) or not isinstance(entry.get("files"), dict):
        raise SourcesError(
            f"{path}: no data set {short(dataset)} with a `files` mapping (known: {sorted(map(str, sources))[:20]})"
        )
    return entry


def known_rows(path: Path, dataset: str) -> dict[str, int]:
    """{split: rows} of `dataset`, as sources.yaml records them (`rows: {train: N, test: M}`)."""
    rows = dataset_entry(path, dataset).get("rows")
    if not isinstance(rows, dict) or set(rows) != set(SPLITS):
        raise SourcesError(
            f"{path}: {dataset}.rows must map each of {list(SPLITS)} to its number of samples (got {short(rows)})"
        )
    for split in SPLITS:
        value = rows[split]
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_ROWS:
            raise SourcesError(
                f"{path}: {dataset}.rows.{split}: expected an integer in 1..{MAX_ROWS:,}, got {short(value)}"
            )
    return {split: rows[split] for split in SPLITS}


def _pin(path: Path, dataset: str, role: str, entry: Any) -> str:
    sha = entry.get("sha256") if isinstance(entry, dict) else None
    if not (isinstance(sha, str) and is_hex(sha.lower(), 64)):
        raise SourcesError(f"{path}: {dataset}.files.{role}.sha256 must be 64 hex digits, got {short(sha)}")
    return sha.lower()


def idx_pins(path: Path, dataset: str) -> dict[str, str] | None:
    """{role: sha256} of `dataset`'s four IDX files as published (decompressed), or None for
    a data set published as CSV: what a split's samples, written out as IDX, must hash to."""
    files = dataset_entry(path, dataset)["files"]
    if not all(role in files for role in IDX_ROLES):
        return None
    return {role: _pin(path, dataset, role, files[role]) for role in IDX_ROLES}


def pin_owners(path: Path) -> dict[str, str]:
    """{sha256: "<dataset> <role>"} over every IDX file sources.yaml pins: names what a
    mislabelled input holds."""
    owners = {}
    for dataset, entry in read_sources(path).items():
        files = entry.get("files") if isinstance(entry, dict) else None
        for role in IDX_ROLES if isinstance(files, dict) else ():
            spec = files.get(role)
            if isinstance(spec, dict) and isinstance(spec.get("sha256"), str):
                owners[spec["sha256"].lower()] = f"{dataset}'s {role.replace('_', ' ')}"
    return owners
