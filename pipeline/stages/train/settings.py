"""params.yaml's `train` section, as the DDP training stage reads it, with the rule between
its keys that the training loop relies on: the global batch splits evenly across the ranks."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.core.bounds import BATCH, EPOCHS, RATE, SEED, STRICT, Int, Num, model_validator


@dataclass(frozen=True)
class Remote:
    """Deadlines of every read from a URL (a shard or a manifest)."""

    __pydantic_config__ = STRICT
    connect_s: Num(gt=0, le=600)
    first_byte_s: Num(gt=0, le=3600)
    min_kib_s: Num(gt=0, le=1 << 30)  # the slowest rate accepted, over any window
    window_s: Num(gt=0, le=3600)


@dataclass(frozen=True)
class TrainSettings:
    """Ranks, epochs, the global batch, checkpoints, the remote cache and deadlines."""

    __pydantic_config__ = STRICT
    world_size: Int(1, 1024)
    epochs: EPOCHS
    batch_size: BATCH
    lr: RATE
    seed: SEED
    checkpoint_every: Int(0, 1 << 30)  # optimizer steps; 0: only at the end
    cache_mib: Int(1, 1 << 30)  # the node-local cache of a remote split
    timeout_s: Num(gt=0, le=3600)  # the most a collective may wait for the other ranks
    remote: Remote

    @model_validator(mode="after")
    def _even(self) -> TrainSettings:
        # Each rank takes batch_size / world_size samples a step (so at least one).
        if self.batch_size % self.world_size:
            raise ValueError(f"batch_size {self.batch_size} does not split evenly across {self.world_size} ranks")
        return self
