"""params.yaml's `shard` section, as the shard stage reads it: how many samples a shard
holds and how its files are compressed."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, StrictInt

from pipeline.core.strict import Strict


class ShardParams(Strict):
    """Shard size and compression (zstd level only where compression is zstd)."""

    samples_per_shard: StrictInt = Field(ge=1, le=1 << 24)
    compression: Literal["none", "zstd"]
    level: StrictInt = Field(ge=1, le=22)
