"""Read params.yaml, the one place every knob lives (as in DVC's example-get-started), and
check it whole against its schema before any stage does work.

The schema is pydantic's (already installed with DVC): strict types (`1.5` is not a sample
count, `null` is not a number), ranges, known keys only, and every problem listed at once
with its dotted key. It is used by the DVC stage commands; `standalone-bench`, which runs
where only torch and its neighbours are installed, checks its `bench` block itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from pipeline.errors import InputError


class ParamsError(InputError):
    """params.yaml lacks a key a command needs, or holds a value of the wrong kind."""


def load_params(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ParamsError(f"{path}: no such params file") from None
    if not isinstance(data, dict):
        raise ParamsError(f"{path}: expected a mapping at the top level")
    return data


def section(params: dict[str, Any], *keys: str) -> Any:
    """params[k1][k2]..., with an error that names the missing dotted key."""
    node: Any = params
    for depth, key in enumerate(keys):
        if not isinstance(node, dict) or key not in node:
            raise ParamsError(f"params.yaml has no key {'.'.join(keys[: depth + 1])!r}")
        node = node[key]
    return node


SLUG = r"^[a-z0-9][a-z0-9_-]{0,63}$"


def _schema():
    """The pydantic models, built on first use (pydantic is imported only by the CLI)."""
    from typing import Literal, Union

    from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, field_validator
    from pydantic import model_validator

    class Strict(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)

    Number = Union[StrictInt, StrictFloat]

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
            from pipeline.convert import Codec

            labels = [Codec.parse(spec).label for spec in codecs]  # ValueError names the spec
            if len(set(labels)) != len(labels):
                raise ValueError(f"codecs listed twice: {sorted({c for c in labels if labels.count(c) > 1})}")
            return codecs

        @model_validator(mode="after")
        def _codec_listed(self):
            if self.codec not in self.codecs:
                raise ValueError(f"codec {self.codec!r} is not one of codecs {self.codecs}")
            return self

    class Shard(Strict):
        samples_per_shard: StrictInt = Field(ge=1, le=1 << 24)
        compression: Literal["none", "zstd"]
        level: StrictInt = Field(ge=1, le=22)

    class Execution(Strict):
        compile_mode: Literal["none", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
        autocast: Union[StrictBool, Literal["auto"]]
        channels_last: StrictBool
        cuda_graph: StrictBool

    variant_names = Literal["naive_bs16", "naive", "workers", "persistent", "pinned", "preprocessed",
                            "batched", "device", "graphed", "compiled"]

    class Bench(Strict):
        parquet_codec: StrictStr
        epochs: StrictInt = Field(ge=1, le=1000)
        batch_size: StrictInt = Field(ge=1, le=1 << 16)
        lr: Number = Field(gt=0, le=10)
        seed: StrictInt = Field(ge=0, lt=1 << 63)
        num_workers: StrictInt = Field(ge=0, le=256)
        variants: list[variant_names] = Field(min_length=1)
        sample: list[variant_names]
        sample_steps: StrictInt = Field(ge=1)
        sample_epochs: StrictInt = Field(ge=1)
        accuracy_tolerance: Number = Field(ge=0, le=1)
        compiled: dict[Literal["cpu", "cuda"], Execution]
        floor: StrictBool

        @model_validator(mode="after")
        def _sampled(self):
            static = [v for v in self.sample if v in ("graphed", "compiled")]
            if static:
                raise ValueError(f"sample: {static} run whole epochs as one graph and cannot be sampled")
            return self

    class Train(Strict):
        world_size: StrictInt = Field(ge=1, le=1024)
        epochs: StrictInt = Field(ge=1, le=1000)
        batch_size: StrictInt = Field(ge=1, le=1 << 16)
        lr: Number = Field(gt=0, le=10)
        seed: StrictInt = Field(ge=0, lt=1 << 63)

        @model_validator(mode="after")
        def _even(self):
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
            import re

            bad = [n for n in names if not re.match(SLUG, n)]
            if bad:
                raise ValueError(f"data set names must be plain slugs (a-z, 0-9, '-', '_'): {bad}")
            if len(set(names)) != len(names):
                raise ValueError("a data set is listed twice")
            return names

        @model_validator(mode="after")
        def _bench_codec(self):
            if self.bench.parquet_codec not in self.convert.codecs:
                raise ValueError(f"bench.parquet_codec {self.bench.parquet_codec!r} is not one of convert.codecs")
            return self

    return Params


def validate_params(params: dict[str, Any], path: Path = Path("params.yaml")) -> dict[str, Any]:
    """`params` unchanged if it fits the schema; else ParamsError listing every problem."""
    from pydantic import ValidationError

    try:
        _schema().model_validate(params)
    except ValidationError as err:
        problems = []
        for error in err.errors():
            key = ".".join(str(part) for part in error["loc"]) or "(top level)"
            message = error["msg"].removeprefix("Value error, ")
            got = "" if error["type"] in ("missing", "value_error") else f" (got {error.get('input')!r:.60})"
            problems.append(f"{key}: {message}{got}")
        raise ParamsError(f"{path}: {len(problems)} problem(s): " + "; ".join(problems)) from None
    return params
