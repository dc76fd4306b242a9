"""The bench's settings: params.yaml's `bench` block, the `tuned` rung's recipe, quick mode.

One type per concept, its bounds written once: each field's range rides on its annotation,
which pydantic reads where it is installed (`settings_from_params` validates the block with
it, each problem named by its dotted key); on a machine with torch alone (the standalone
bench) the same classes are built without it, and the rules between fields, in
`__post_init__`, hold on both. Plain data, no torch: the params check reads these classes;
what each rung trains with on a device is `recipe`'s.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Optional, Union

from pipeline.bench.variants import COMPILE_MODES, GRAPH_SCOPES, STATIC_VARIANTS, VARIANTS
from pipeline.core.bounds import BATCH, EPOCHS, RATE, SEED, SEEDS, STRICT, Bool, Int, Len, Num, Text

Variant = Literal[VARIANTS]  # type: ignore[valid-type]
WORKERS = Int(0, 256)  # DataLoader workers; 0 in params.yaml: min(4, CPU count)
SAMPLE_STEPS = Int(1, 10_000)
SAMPLE_EPOCHS = Int(2, 100)  # the first is a warm-up: scaled alone, its start-up would be too


@dataclass(frozen=True)
class Compiled:
    """`bench.compiled.<device type>`: what the `compiled` rung adds on that device type,
    chosen by measurement (`variants.Execution` runs it)."""

    __pydantic_config__ = STRICT
    compile_mode: Literal[COMPILE_MODES]  # type: ignore[valid-type]
    autocast: Union[Bool, Literal["auto"]]  # "auto": where this device computes bf16 natively
    channels_last: Bool
    cuda_graph: Bool


@dataclass(frozen=True)
class Recipe:
    """`bench.tuned`: the `tuned` rung's training recipe (Adam, a one-cycle rate over `epochs`
    at its own batch, the loss's label smoothing), and the fresh seeds its accuracy and time
    to accuracy are measured over (a recipe is judged by its spread, not by one lucky seed)."""

    __pydantic_config__ = STRICT
    epochs: EPOCHS
    batch_size: BATCH
    max_lr: RATE
    pct_start: Num(gt=0, lt=1)
    betas: Annotated[tuple[Num(ge=0, lt=1), Num(ge=0, lt=1)], Len(2, 2)]
    seeds: SEEDS
    label_smoothing: Num(ge=0, lt=1) = 0.0  # the train loss's (`F.cross_entropy`); 0: none


@dataclass(frozen=True)
class BenchSettings:
    """params.yaml's `bench` block. `parquet_codec` must also be one of convert.codecs (the
    `params` stage checks that rule, between two sections)."""

    __pydantic_config__ = STRICT
    parquet_codec: Text  # the naive rungs' Parquet codec (dvc.yaml picks the folder)
    epochs: EPOCHS
    batch_size: BATCH
    lr: RATE
    seed: SEED
    num_workers: WORKERS
    variants: Annotated[tuple[Variant, ...], Len(1)]
    # Variants timed over the samples of `sample_steps` train steps at `batch_size` (and as many
    # test samples) per epoch for `sample_epochs` epochs, then scaled to a full epoch. Empty:
    # every variant runs in full.
    sample: tuple[Variant, ...]
    sample_steps: SAMPLE_STEPS
    sample_epochs: SAMPLE_EPOCHS
    accuracy_tolerance: Num(ge=0, le=1)  # vs the `preprocessed` variant (the write-up's best)
    compiled: dict[Literal["cpu", "cuda"], Compiled]
    floor: Bool  # also time the floor: the same steps with no data path
    reuse_host_memory: Bool  # keep freed host blocks in the heap (`hostmem`)
    # A variant whose timed epochs spread more than this (max - min over the median), or
    # whose twin doing identical work disagrees by more, is marked unstable.
    max_spread: Num(gt=0, le=10)
    budget: Bool  # profile `sample_steps` more steps per variant: its time budget
    quick: Bool = False  # a first answer: QUICK's settings, marked in every table
    quick_minutes: Num(gt=0, le=24 * 60) = 5.0  # quick: this data set's time budget, the rungs re-planned to fit
    # The test accuracies each data set's time to accuracy is measured to (data set -> 1 to 4
    # fractions in (0, 1]; a single number is one target).
    target_accuracy: dict[Text, Union[Num(), list[Num()]]] = dataclasses.field(default_factory=dict)
    accuracy_seeds: SEEDS = 0  # fresh seeds the fastest rung's time to accuracy is taken again over
    tuned: Optional[Recipe] = None  # None: the `tuned` rung is not configured
    graph: Literal[GRAPH_SCOPES] = "epoch"  # type: ignore[valid-type]  # what one CUDA graph holds

    def __post_init__(self) -> None:
        for name in ("variants", "sample"):  # a rung named twice would run twice, its second run kept
            names = getattr(self, name)
            twice = sorted({v for v in names if names.count(v) > 1})
            if twice:
                raise ValueError(f"{name}: {twice} listed twice; each rung runs once")
        listed = {name: v if isinstance(v, (list, tuple)) else [v] for name, v in self.target_accuracy.items()}
        bad = {name: v for name, v in listed.items() if not v or len(v) > 4 or not all(0 < x <= 1 for x in v)}
        if bad:
            raise ValueError(
                f"a data set's target accuracies are 1 to 4 fractions in (0, 1]: {dict(list(bad.items())[:3])}"
            )
        static = [v for v in self.sample if v in STATIC_VARIANTS]
        if static:
            raise ValueError(f"sample: {static} run whole epochs as one graph and cannot be sampled")
        if "tuned" in self.variants and self.tuned is None:
            raise ValueError("variants: `tuned` needs its recipe, bench.tuned")

    @classmethod
    def built(cls, block: dict) -> BenchSettings:
        """The block as these classes, unvalidated: for a machine without pydantic, where
        the block is the repository's own params.yaml."""
        tuned, compiled = block.get("tuned"), block.get("compiled", {})
        return cls(
            **{
                **block,
                "variants": tuple(block["variants"]),
                "sample": tuple(block["sample"]),
                "compiled": {device: Compiled(**options) for device, options in compiled.items()},
                "tuned": None if tuned is None else Recipe(**{**tuned, "betas": tuple(tuned["betas"])}),
            }
        )

    def for_run(self) -> BenchSettings:
        """These settings as a run uses them: with `quick`, QUICK's in place of the block's."""
        if not self.quick:
            return self
        tuned = None if self.tuned is None else dataclasses.replace(self.tuned, seeds=QUICK_TUNED_SEEDS)
        return dataclasses.replace(self, **QUICK, tuned=tuned)

    def targets(self, dataset: str) -> tuple[float, ...]:
        """The data set's target accuracies, ascending; () when it has none."""
        found = self.target_accuracy.get(dataset)
        if found is None:
            return ()
        return tuple(sorted(found)) if isinstance(found, (list, tuple)) else (float(found),)

    def workers(self) -> int:
        return self.num_workers or min(4, os.cpu_count() or 1)

    def budget_steps(self) -> int:
        """The steps each variant's profiled pass covers: 0, none, when `budget` is off."""
        return self.sample_steps if self.budget else 0

    def epochs_of(self, variant: str) -> int:
        """The epochs a fully run rung trains: the bench's; `tuned`'s schedule has its own length."""
        return self.tuned.epochs if variant == "tuned" and self.tuned is not None else self.epochs


# `bench.quick`: every rung, fewer epochs and fewer sampled steps, no floor and no profiled
# epoch: the shape of the answer in a few minutes. One warm-up epoch and one timed one, so no
# spread (its tables say "n/a" and every one is marked quick).
QUICK = {"epochs": 2, "sample_steps": 5, "sample_epochs": 2, "floor": False, "budget": False, "accuracy_seeds": 0}
QUICK_TUNED_SEEDS = 0  # quick: the tuned rung runs once, no seeds


def settings_from_params(block: dict, path: Path = Path("params.yaml")) -> BenchSettings:
    """BenchSettings from params.yaml's `bench` block (`path`: named in errors), as a run uses
    them: validated where pydantic is installed (ParamsError naming each problem by its
    dotted key), built as they are where it is not."""
    try:
        import pydantic  # noqa: F401
    except ImportError:
        return BenchSettings.built(block).for_run()
    from pipeline.core.params import validated

    return validated(BenchSettings, block, "bench", path).for_run()
