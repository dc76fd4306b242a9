"""params.yaml's schema: every knob's type, range and relations, stated once.

pydantic (installed with DVC), strict: `1.5` is not a sample count, `null` is not a number,
unknown keys are refused. `pipeline.core.params.validate_params` runs it and lists every
problem at once with its dotted key; the stages then trust what they read.
"""

from __future__ import annotations

from collections import Counter
from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, field_validator
from pydantic import model_validator

from pipeline.core.variants import COMPILE_MODES, STATIC_VARIANTS, VARIANTS
from pipeline.core.codec import Codec
from pipeline.core.errors import is_slug

Number = Union[StrictInt, StrictFloat]
Variant = Literal[VARIANTS]  # type: ignore[valid-type]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


# Seeds: numpy's and torch's generators take any 32-bit value, and a shuffle's seed
# (seed x 1,000,003 + epoch) must stay within torch's 64 bits.
Seed = Field(ge=0, le=(1 << 32) - 1)
Epochs = Field(ge=1, le=100)  # a CPU epoch of the slowest rung takes minutes: 100 is days


class Fetch(Strict):
    timeout_s: Number = Field(gt=0, le=600)      # per connect and per read
    retries: StrictInt = Field(ge=0, le=10)
    backoff_s: Number = Field(ge=0, le=600)      # first pause, doubling
    deadline_s: Number = Field(gt=0, le=3600)    # the most one file may take from one mirror, all tries

    @model_validator(mode="after")
    def _fits_deadline(self) -> Fetch:
        pauses = self.backoff_s * ((1 << self.retries) - 1)
        if pauses > self.deadline_s:
            raise ValueError(f"the pauses between retries (backoff_s x (2^retries - 1) = {pauses:g} s) "
                             f"exceed deadline_s ({self.deadline_s:g} s)")
        if self.timeout_s > self.deadline_s:
            raise ValueError(f"timeout_s ({self.timeout_s:g} s) exceeds deadline_s ({self.deadline_s:g} s)")
        return self


class Convert(Strict):
    codecs: list[StrictStr] = Field(min_length=1)
    # Below 1,024 rows a group, the wide layout's 785 column chunks per group outweigh the
    # data (1 row: 189 MB for 1,000 rows); the writer buffers one group (784 bytes a row).
    row_group_rows: StrictInt = Field(ge=1024, le=1 << 20)
    codec: StrictStr
    layout: Literal["wide", "compact"]

    @field_validator("codecs")
    @classmethod
    def _codecs(cls, codecs: list[str]) -> list[str]:
        labels = [Codec.parse(spec).label for spec in codecs]  # ValueError names the spec
        if len(set(labels)) != len(labels):  # (counted once each: linear in the list's length)
            twice = sorted(label for label, n in Counter(labels).items() if n > 1)
            raise ValueError(f"codecs listed twice: {twice[:5]}{' ...' if len(twice) > 5 else ''}")
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
    epochs: StrictInt = Epochs
    batch_size: StrictInt = Field(ge=1, le=1 << 16)
    lr: Number = Field(gt=0, le=10)
    seed: StrictInt = Seed
    num_workers: StrictInt = Field(ge=0, le=256)
    variants: list[Variant] = Field(min_length=1)
    sample: list[Variant]
    sample_steps: StrictInt = Field(ge=1, le=10_000)
    sample_epochs: StrictInt = Field(ge=1, le=100)
    accuracy_tolerance: Number = Field(ge=0, le=1)
    compiled: dict[Literal["cpu", "cuda"], Execution]
    floor: StrictBool
    reuse_host_memory: StrictBool
    max_spread: Number = Field(gt=0, le=10)
    budget: StrictBool
    quick: StrictBool = False
    target_accuracy: dict[StrictStr, Number] = Field(default_factory=dict)
    accuracy_seeds: StrictInt = Field(default=0, ge=0, le=100)

    @field_validator("target_accuracy")
    @classmethod
    def _targets(cls, targets: dict) -> dict:
        bad = {name: value for name, value in targets.items() if not 0 < value <= 1}
        if bad:
            raise ValueError(f"a target accuracy is a fraction in (0, 1]: {dict(list(bad.items())[:3])}")
        return targets

    @model_validator(mode="after")
    def _sampled(self) -> Bench:
        static = [v for v in self.sample if v in STATIC_VARIANTS]
        if static:
            raise ValueError(f"sample: {static} run whole epochs as one graph and cannot be sampled")
        return self


class Remote(Strict):
    """Deadlines of every read from a URL (a shard or a manifest)."""

    connect_s: Number = Field(gt=0, le=600)
    first_byte_s: Number = Field(gt=0, le=3600)
    min_kib_s: Number = Field(gt=0, le=1 << 30)   # the slowest rate accepted, over any window
    window_s: Number = Field(gt=0, le=3600)


class Train(Strict):
    world_size: StrictInt = Field(ge=1, le=1024)
    epochs: StrictInt = Epochs
    batch_size: StrictInt = Field(ge=1, le=1 << 16)
    lr: Number = Field(gt=0, le=10)
    seed: StrictInt = Seed
    checkpoint_every: StrictInt = Field(ge=0, le=1 << 30)  # optimizer steps; 0: never
    cache_mib: StrictInt = Field(ge=1, le=1 << 30)         # the node-local cache of a remote split
    timeout_s: Number = Field(gt=0, le=3600)               # the most a collective may wait for the other ranks
    remote: Remote

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
        bad = [n for n in names if not is_slug(n)]
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
