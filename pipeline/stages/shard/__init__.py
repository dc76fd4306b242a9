"""The shard stage: Parquet (or the fetched IDX files) to checksummed tensor shards; its
local and Ray engines share the source reader (`source`)."""
