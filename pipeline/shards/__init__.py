"""The shard library: write a data set as a few large checksummed tensor files, read it back
verified, and feed a training loop from it, on one process or per DDP rank.

    from pipeline.shards import Field, Sample, write_shards, ShardDataset, load_split, DeviceBatches

Any fixed-shape data: a `Sample` of named `Field`s (dtype, shape per sample, classes for a
label), declared in each split's manifest and checked on every write and read.

Modules: `format` (the manifest and sample schema), `writer`, `reader`, `loaders` (feeding a
training loop), `ranks` (one DDP rank's part of a split). It needs torch, numpy and
safetensors (xxhash and zstandard when present) and imports nothing of the pipeline's
stages: no polars, pyarrow, dvc or pydantic.
"""

import importlib

_WHERE = {
    "FORMAT_VERSION": "format", "Field": "format", "Sample": "format", "ShardError": "format",
    "check_manifest": "format", "read_manifest": "format", "DeviceBatches": "loaders", "ShardDataset": "loaders",
    "to_float": "loaders", "RankShards": "ranks", "VERIFY": "reader", "load_split": "reader", "read_split": "reader",
    "ShardWriter": "writer", "write_shards": "writer", "write_split": "writer",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    """Each name imported from its module on first use, so that `pipeline.shards.format` (which
    the stages use for the sample schema) loads without torch."""
    if name not in _WHERE:
        raise AttributeError(f"module 'pipeline.shards' has no attribute {name!r}")
    return getattr(importlib.import_module(f"pipeline.shards.{_WHERE[name]}"), name)
