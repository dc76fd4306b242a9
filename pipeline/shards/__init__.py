"""The shard library: write any fixed-shape data set as a few large checksummed tensor files,
read it back verified, and feed a training loop from it, on one process or per DDP rank.

    from pipeline.shards import Field, Sample, write_split, ShardDataset

A sample is a `Sample` of named `Field`s (dtype, shape per sample, classes for a label),
declared in each split's manifest and checked on every write and read. Every reader returns
every field with its stored dtype and shape; only a named transform changes values.

Modules: `format` (the manifest and sample schema), `writer` (one writer, parallel parts),
`reader` (a whole split into tensors; the per-shard checks), `mapped` (a split mapped for
random access), `order` (shuffles, ranks, resuming), `dataset` (the dataset and loaders),
`transforms`, `remote` (shards at a URL, in a node-local cache), `watched` (reads from a
store under deadlines). It needs torch, numpy, safetensors and xxhash (zstandard for zstd
shards, fsspec for URLs) and imports nothing of the pipeline's stages.
"""

import importlib

_WHERE = {
    "FORMAT_VERSION": "format",
    "Field": "format",
    "Sample": "format",
    "ShardError": "format",
    "ShardIndexError": "format",
    "ShardTypeError": "format",
    "check_manifest": "format",
    "read_manifest": "format",
    "ShardWriter": "writer",
    "write_split": "writer",
    "write_part": "writer",
    "merge_parts": "writer",
    "ShardBusyError": "writer",
    "ShardSystemError": "writer",
    "VERIFY": "reader",
    "read_split": "reader",
    "MappedSplit": "mapped",
    "SHUFFLES": "order",
    "ShardSampler": "order",
    "ShardDataset": "dataset",
    "ShardLoader": "dataset",
    "DeviceBatches": "dataset",
    "freeze_inherited": "dataset",
    "preload_forkserver": "dataset",
    "UnitFloat": "transforms",
    "Int64": "transforms",
    "unit_float": "transforms",
    "RemoteShards": "remote",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    """Each name imported from its module on first use, so that `pipeline.shards.format` (which
    the stages use for the sample schema) loads without torch."""
    if name not in _WHERE:
        raise AttributeError(f"module 'pipeline.shards' has no attribute {name!r}")
    return getattr(importlib.import_module(f"pipeline.shards.{_WHERE[name]}"), name)
