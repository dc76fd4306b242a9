"""params.yaml's `train` section, as the DDP training stage reads it, with the rule between
its keys that the training loop relies on: the global batch splits evenly across the ranks."""

from __future__ import annotations

from pydantic import Field, StrictInt, model_validator

from pipeline.core.bounds import BATCH, EPOCHS, RATE, SEED
from pipeline.core.strict import Number, Strict


class Remote(Strict):
    """Deadlines of every read from a URL (a shard or a manifest)."""

    connect_s: Number = Field(gt=0, le=600)
    first_byte_s: Number = Field(gt=0, le=3600)
    min_kib_s: Number = Field(gt=0, le=1 << 30)  # the slowest rate accepted, over any window
    window_s: Number = Field(gt=0, le=3600)


class TrainParams(Strict):
    """Ranks, epochs, the global batch, checkpoints, the remote cache and deadlines."""

    world_size: StrictInt = Field(ge=1, le=1024)
    epochs: EPOCHS
    batch_size: BATCH
    lr: RATE
    seed: SEED
    checkpoint_every: StrictInt = Field(ge=0, le=1 << 30)  # optimizer steps; 0: never
    cache_mib: StrictInt = Field(ge=1, le=1 << 30)  # the node-local cache of a remote split
    timeout_s: Number = Field(gt=0, le=3600)  # the most a collective may wait for the other ranks
    remote: Remote

    @model_validator(mode="after")
    def _even(self) -> TrainParams:
        # Each rank takes batch_size / world_size samples a step (so at least one).
        if self.batch_size % self.world_size:
            raise ValueError(f"batch_size {self.batch_size} does not split evenly across {self.world_size} ranks")
        return self
