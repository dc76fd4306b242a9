"""The shard library: write a data set as a few large checksummed tensor files, read it back
verified, and feed a training loop from it, on one process or per DDP rank.

    from pipeline.shards import load_split, DeviceBatches, ShardDataset

Modules: `format` (the manifest and sample schema), `writer`, `reader`, `loaders` (feeding a
training loop), `ranks` (one DDP rank's part of a split). It needs torch, numpy and
safetensors (xxhash and zstandard when present) and imports nothing of the pipeline's
stages: no polars, pyarrow, dvc or pydantic.
"""

import importlib

_WHERE = {
    "FORMAT_VERSION": "format", "IMAGE_SHAPE": "format", "ShardError": "format", "check_manifest": "format",
    "read_manifest": "format", "DeviceBatches": "loaders", "ShardDataset": "loaders", "to_float": "loaders",
    "RankShards": "ranks", "VERIFY": "reader", "load_split": "reader", "ShardWriter": "writer",
    "write_shards": "writer",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    """Each name imported from its module on first use, so that `pipeline.shards.format` (which
    the stages use for the sample schema) loads without torch."""
    if name not in _WHERE:
        raise AttributeError(f"module 'pipeline.shards' has no attribute {name!r}")
    return getattr(importlib.import_module(f"pipeline.shards.{_WHERE[name]}"), name)
