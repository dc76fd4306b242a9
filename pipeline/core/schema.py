"""params.yaml's schema: every knob's type, range and relations, stated once.

pydantic (installed with DVC), strict: `1.5` is not a sample count, `null` is not a number,
unknown keys are refused. `pipeline.core.params.validate_params` runs it and lists every
problem at once with its dotted key; the stages then trust what they read.
"""

from __future__ import annotations

import re
from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, field_validator
from pydantic import model_validator

from pipeline.core.variants import COMPILE_MODES, STATIC_VARIANTS, VARIANTS
from pipeline.core.codec import Codec

SLUG = r"^[a-z0-9][a-z0-9_-]{0,63}$"
Number = Union[StrictInt, StrictFloat]
Variant = Literal[VARIANTS]  # type: ignore[valid-type]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Fetch(Strict):
    timeout_s: Number = Field(gt=0, le=3600)
    retries: StrictInt = Field(ge=0, le=20)
    backoff_s: Number = Field(ge=0, le=600)


class Convert(Strict):
    codecs: list[StrictStr] = Field(min_length=1)
    row_group_rows: StrictInt = Field(ge=1, le=1 << 24)
    codec: StrictStr
    layout: Literal["wide", "compact"]

    @field_validator("codecs")
    @classmethod
    def _codecs(cls, codecs: list[str]) -> list[str]:
        labels = [Codec.parse(spec).label for spec in codecs]  # ValueError names the spec
        if len(set(labels)) != len(labels):
            raise ValueError(f"codecs listed twice: {sorted({c for c in labels if labels.count(c) > 1})}")
        return codecs

    @model_validator(mode="after")
    def _codec_listed(self) -> Convert:
        if self.codec not in self.codecs:
            raise ValueError(f"codec {self.codec!r} is not one of codecs {self.codecs}")
        return self


class Shard(Strict):
    samples_per_shard: StrictInt = Field(ge=1, le=1 << 24)
    compression: Literal["none", "zstd"]
    level: StrictInt = Field(ge=1, le=22)


class Execution(Strict):
    compile_mode: Literal[COMPILE_MODES]  # type: ignore[valid-type]
    autocast: Union[StrictBool, Literal["auto"]]
    channels_last: StrictBool
    cuda_graph: StrictBool


class Bench(Strict):
    parquet_codec: StrictStr
    epochs: StrictInt = Field(ge=1, le=1000)
    batch_size: StrictInt = Field(ge=1, le=1 << 16)
    lr: Number = Field(gt=0, le=10)
    seed: StrictInt = Field(ge=0, lt=1 << 63)
    num_workers: StrictInt = Field(ge=0, le=256)
    variants: list[Variant] = Field(min_length=1)
    sample: list[Variant]
    sample_steps: StrictInt = Field(ge=1)
    sample_epochs: StrictInt = Field(ge=1)
    accuracy_tolerance: Number = Field(ge=0, le=1)
    compiled: dict[Literal["cpu", "cuda"], Execution]
    floor: StrictBool
    max_spread: Number = Field(gt=0, le=10)
    budget_steps: StrictInt = Field(ge=0, le=10_000)

    @model_validator(mode="after")
    def _sampled(self) -> Bench:
        static = [v for v in self.sample if v in STATIC_VARIANTS]
        if static:
            raise ValueError(f"sample: {static} run whole epochs as one graph and cannot be sampled")
        return self


class Train(Strict):
    world_size: StrictInt = Field(ge=1, le=1024)
    epochs: StrictInt = Field(ge=1, le=1000)
    batch_size: StrictInt = Field(ge=1, le=1 << 16)
    lr: Number = Field(gt=0, le=10)
    seed: StrictInt = Field(ge=0, lt=1 << 63)
    checkpoint_every: StrictInt = Field(ge=0, le=1 << 30)  # optimizer steps; 0: never
    cache_mib: StrictInt = Field(ge=1, le=1 << 30)         # the node-local cache of a remote split

    @model_validator(mode="after")
    def _even(self) -> Train:
        if self.batch_size % self.world_size:
            raise ValueError(f"batch_size {self.batch_size} does not split evenly across {self.world_size} ranks")
        return self


class Params(Strict):
    datasets: list[StrictStr] = Field(min_length=1)
    fetch: Fetch
    convert: Convert
    shard: Shard
    bench: Bench
    train: Train

    @field_validator("datasets")
    @classmethod
    def _slugs(cls, names: list[str]) -> list[str]:
        bad = [n for n in names if not re.match(SLUG, n)]
        if bad:
            raise ValueError(f"data set names must be plain slugs (a-z, 0-9, '-', '_'): {bad}")
        if len(set(names)) != len(names):
            raise ValueError("a data set is listed twice")
        return names

    @model_validator(mode="after")
    def _bench_codec(self) -> Params:
        if self.bench.parquet_codec not in self.convert.codecs:
            raise ValueError(f"bench.parquet_codec {self.bench.parquet_codec!r} is not one of convert.codecs")
        return self
