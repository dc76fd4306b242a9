"""params.yaml's `shard` section, as the shard stage reads it: how many samples a shard
holds, how its files are compressed, and the engine that writes them (local or Ray)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, StrictInt

from pipeline.core.strict import Strict
from pipeline.stages.engine_settings import Engine


class ShardParams(Strict):
    """Shard size and compression (zstd level only where compression is zstd)."""

    samples_per_shard: StrictInt = Field(ge=1, le=1 << 24)
    compression: Literal["none", "zstd"]
    level: StrictInt = Field(ge=1, le=22)
    # local: one process; ray: Ray tasks, the same bytes (docs/scale.md). Not a DVC param of
    # the stage: switching it alone reruns nothing.
    engine: Engine = "local"
