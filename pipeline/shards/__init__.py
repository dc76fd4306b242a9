"""The shard API in one import: what a user of the shards needs, from the modules that
hold it (format: `manifest`; writing: `shardwriter`; reading: `shardreader`; feeding a
training loop: `loaders`; one DDP rank's part: `ranks`).

    from pipeline.shards import load_split, DeviceBatches, ShardDataset
"""

from pipeline.loaders import DeviceBatches, ShardDataset, to_float
from pipeline.manifest import FORMAT_VERSION, IMAGE_SHAPE, ShardError, check_manifest, read_manifest
from pipeline.ranks import RankShards
from pipeline.shardreader import VERIFY, load_split
from pipeline.shardwriter import ShardWriter, shard_dataset, write_shards

__all__ = ["FORMAT_VERSION", "IMAGE_SHAPE", "VERIFY", "DeviceBatches", "RankShards", "ShardDataset", "ShardError",
           "ShardWriter", "check_manifest", "load_split", "read_manifest", "shard_dataset", "to_float", "write_shards"]
