"""params.yaml's `bench` section, as the bench stage reads it: the ladder's rungs, epochs,
sampling, the floor, the time budget and the time to accuracy. The ladder
(`pipeline.bench.settings.BenchSettings`) takes the section once this model has checked it."""

from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import Field, StrictBool, StrictInt, StrictStr, field_validator, model_validator

from pipeline.bench.variants import COMPILE_MODES, GRAPH_SCOPES, STATIC_VARIANTS, VARIANTS
from pipeline.core.strict import Number, Strict, epochs, seed

Variant = Literal[VARIANTS]  # type: ignore[valid-type]


class ExecutionParams(Strict):
    """What the `compiled` rung adds on one device type."""

    compile_mode: Literal[COMPILE_MODES]  # type: ignore[valid-type]
    autocast: Union[StrictBool, Literal["auto"]]
    channels_last: StrictBool
    cuda_graph: StrictBool


class Tuned(Strict):
    """The `tuned` rung's recipe: Adam with a one-cycle rate over `epochs` epochs at its own
    batch, measured over `seeds` fresh seeds."""

    epochs: StrictInt = epochs()
    batch_size: StrictInt = Field(ge=1, le=1 << 16)
    max_lr: Number = Field(gt=0, le=10)
    pct_start: Number = Field(gt=0, lt=1)
    betas: list[Number] = Field(min_length=2, max_length=2)
    seeds: StrictInt = Field(ge=0, le=100)

    @field_validator("betas")
    @classmethod
    def _betas(cls, betas: list) -> list:
        if not all(0 <= b < 1 for b in betas):
            raise ValueError(f"Adam's betas are each in [0, 1): {betas}")
        return betas


class BenchParams(Strict):
    """The ladder's knobs; `parquet_codec` must also be one of convert.codecs (the `params`
    stage checks that rule, between two sections)."""

    parquet_codec: StrictStr
    epochs: StrictInt = epochs()
    batch_size: StrictInt = Field(ge=1, le=1 << 16)
    lr: Number = Field(gt=0, le=10)
    seed: StrictInt = seed()
    num_workers: StrictInt = Field(ge=0, le=256)
    variants: list[Variant] = Field(min_length=1)
    sample: list[Variant]
    sample_steps: StrictInt = Field(ge=1, le=10_000)
    sample_epochs: StrictInt = Field(ge=1, le=100)
    accuracy_tolerance: Number = Field(ge=0, le=1)
    compiled: dict[Literal["cpu", "cuda"], ExecutionParams]
    floor: StrictBool
    reuse_host_memory: StrictBool
    max_spread: Number = Field(gt=0, le=10)
    budget: StrictBool
    quick: StrictBool = False
    quick_minutes: Number = Field(default=5, gt=0, le=24 * 60)
    target_accuracy: dict[StrictStr, Union[Number, list[Number]]] = Field(default_factory=dict)
    accuracy_seeds: StrictInt = Field(default=0, ge=0, le=100)
    tuned: Optional[Tuned] = None
    graph: Literal[GRAPH_SCOPES] = "epoch"  # type: ignore[valid-type]

    @field_validator("target_accuracy")
    @classmethod
    def _targets(cls, targets: dict) -> dict:
        listed = {name: value if isinstance(value, list) else [value] for name, value in targets.items()}
        bad = {
            name: value
            for name, value in listed.items()
            if not value or len(value) > 4 or not all(0 < v <= 1 for v in value)
        }
        if bad:
            raise ValueError(
                f"a data set's target accuracies are 1 to 4 fractions in (0, 1]: {dict(list(bad.items())[:3])}"
            )
        return targets

    @model_validator(mode="after")
    def _sampled(self) -> BenchParams:
        static = [v for v in self.sample if v in STATIC_VARIANTS]
        if static:
            raise ValueError(f"sample: {static} run whole epochs as one graph and cannot be sampled")
        if "tuned" in self.variants and self.tuned is None:
            raise ValueError("variants: `tuned` needs its recipe, bench.tuned")
        return self
