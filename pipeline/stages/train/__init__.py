"""The train stage: the write-up's model on the shards, one process or torchrun ranks, checkpointed."""
