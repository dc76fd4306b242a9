"""The bench on a machine that has torch but not this project's other tools (no polars, dvc
or zstandard, no internet): the bench's inputs built from the IDX files alone, then the same
bench as `dvc repro`, written to `results/<machine>/` (docs/bench.md, "On a GPU machine,
without DVC").

    python -m pipeline standalone-bench --mirror <folder with mnist/ and fashion-mnist/>

Fetch is the pipeline's own download code (every file checked against its pinned sha256),
Parquet the wide layout written by pyarrow in `bench.parquet_codec` (parsed by `core.codec`),
shards the shard stage's writer, the bench `ladder.run_bench` with params.yaml's `bench`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from pipeline.bench.ladder import run_bench
from pipeline.bench.settings import settings_from_params
from pipeline.bench.stage import warn_unstable, write_bench
from pipeline.budget import fingerprint
from pipeline.core.atomic import atomic_path
from pipeline.core.codec import Codec
from pipeline.core.dataset import COLUMNS, SPLITS
from pipeline.core.params import load_params, section
from pipeline.core.parquet import write_checksums
from pipeline.shards.writer import write_split
from pipeline.stages.fetch.settings import FetchSettings
from pipeline.stages.fetch.stage import MIRROR_ENV, fetch_dataset, load_sources
from pipeline.stages.mnist import MNIST, idx_bytes, read_raw_split


def write_wide_parquet(images: np.ndarray, labels: np.ndarray, dest: Path, codec: str) -> None:
    """The write-up's layout (label + pixel1..pixel784, uint8) with pyarrow (the convert
    stage writes it with polars, absent here), in `codec` as params.yaml spells it
    (`zstd-3`: zstd at level 3, parsed by the pipeline's own `Codec`)."""
    flat = images.reshape(len(images), -1)
    columns = [pa.array(labels)] + [pa.array(np.ascontiguousarray(flat[:, i])) for i in range(flat.shape[1])]
    with atomic_path(dest) as tmp:
        pq.write_table(pa.Table.from_arrays(columns, names=COLUMNS), tmp, **Codec.parse(codec).writer_options())


def build_inputs(
    dataset: str, mirror: Path, work: Path, sources: Path, samples_per_shard: int, codec: str | None
) -> tuple[Path | None, Path]:
    """Verified raw files -> wide Parquet in `codec` and uncompressed shards under
    `work/<dataset>`; `codec` None writes the shards alone (a benchmark that reads no Parquet),
    and returns None for the Parquet."""
    files, _ = load_sources(sources, dataset)
    raw, parquet, shards = (work / dataset / part for part in ("raw", "parquet", "shards"))
    fetch_dataset(dataset, files, [], raw, FetchSettings(retries=0), env={MIRROR_ENV: str(mirror)})
    for split in SPLITS:
        images, labels = read_raw_split(raw, split)
        if codec is not None:
            write_wide_parquet(images, labels, parquet / "wide" / f"{split}.parquet", codec)
        write_split(
            {"images": images, "labels": labels},
            shards / split,
            sample=MNIST,
            dataset=dataset,
            split=split,
            samples_per_shard=samples_per_shard,
            compression="none",
            # what the shard stage records of its source: the bench checks the Parquet against it
            source={
                "idx_sha256": {
                    k: hashlib.sha256(idx_bytes(a)).hexdigest() for k, a in (("images", images), ("labels", labels))
                }
            },
        )
    if codec is None:
        return None, shards
    write_checksums(parquet, layouts=("wide",))  # the bench checks the Parquet against it, as in the pipeline
    return parquet / "wide", shards


def checked_params(params: dict, path: Path) -> dict:
    """params.yaml (with the command line's overrides) checked against its schema where
    pydantic is installed; where it is not, the user is told so."""
    try:
        import pydantic  # noqa: F401
    except ImportError:
        print(f"{path}: not checked against its schema (pydantic is not installed here)", file=sys.stderr)
        return params
    from pipeline.stages.params import validate_params

    return validate_params(params, path)


def documents_under(out_root: Path, params_path: Path) -> list[Path]:
    """The bench documents a standalone run can take its time estimate from: those of every
    machine under `out_root` and the project's own `results/` beside params.yaml (a fresh
    `--out` folder holds none)."""
    roots = {Path(out_root).resolve(), Path(params_path).resolve().parent / "results"}
    return sorted({doc for root in roots for doc in root.glob("*/*.json")})


def run_standalone(
    mirror: Path,
    out_root: Path,
    work: Path,
    datasets: list[str],
    params_path: Path,
    sources: Path,
    device: str,
    commit: str,
    overrides: dict,
) -> list[Path]:
    params = load_params(params_path)
    params["bench"] = {**section(params, "bench"), **overrides}
    checked_params(params, params_path)
    settings = settings_from_params(params["bench"], params_path)
    samples_per_shard = int(section(params, "shard", "samples_per_shard"))
    device_ = torch.device(device)
    written = []
    for dataset in datasets:
        parquet, shards = build_inputs(
            dataset, Path(mirror), Path(work), Path(sources), samples_per_shard, settings.parquet_codec
        )
        machine = fingerprint(device)
        out = Path(out_root) / machine.name / f"{dataset}.json"
        earlier = documents_under(out_root, params_path)
        document = run_bench(dataset, parquet, shards, device_, settings, earlier, machine.name)
        env = dataclasses.replace(document.env, commit=commit)
        document = dataclasses.replace(document, env=env, machine=machine, date=dt.date.today())
        write_bench(document, out)
        warn_unstable(document)
        print(f"wrote {out}", file=sys.stderr)
        written.append(out)
    return written
