"""params.yaml's `shard` section: how many samples a shard holds, how its files are compressed,
and the engine that writes them (local or Ray). One type for the section and for the stage's
functions, which take it whole."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pipeline.core.bounds import STRICT, Int
from pipeline.stages.engine_settings import Engine


@dataclass(frozen=True)
class ShardSettings:
    """Shard size and compression (zstd level only where compression is zstd)."""

    __pydantic_config__ = STRICT
    samples_per_shard: Int(1, 1 << 24)
    compression: Literal["none", "zstd"] = "none"
    level: Int(1, 22) = 3
    # local: one process; ray: Ray tasks, the same bytes (docs/scale.md). Not a DVC param of
    # the stage: switching it alone reruns nothing.
    engine: Engine = "local"
