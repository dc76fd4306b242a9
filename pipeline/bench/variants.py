"""The ladder's rungs and the compile modes, named once: the bench stage's settings model,
the data paths and the runners all take these lists (plain names, no torch: the `params`
stage imports them to check params.yaml).

Loader rungs follow the write-up's story one change at a time; `batched` and `device` change
where batches come from; the static rungs change how the steps run (one batch shape,
whole epochs as one graph) and so cannot be timed on a sample of steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pipeline.core.bounds import STRICT, Bool, Text

LOADER_VARIANTS = ("naive_bs16", "naive", "workers", "persistent", "pinned", "preprocessed")
EAGER_VARIANTS = LOADER_VARIANTS + ("batched", "device")
# `tuned`: `compiled`'s execution with a training recipe chosen for time to accuracy (its own
# batch, Adam betas, a one-cycle rate over a fixed number of epochs): the same model, a
# different recipe, so it is timed to accuracy over many seeds, not only per epoch.
STATIC_VARIANTS = ("graphed", "compiled", "tuned")
VARIANTS = EAGER_VARIANTS + STATIC_VARIANTS
OWN_RECIPE = ("tuned",)


def writeup_recipe(name: str) -> bool:
    """Whether rung `name` trains the write-up's recipe (its batch, rate and epochs): only
    such rungs compare with one another on accuracy and wall time, anchor the accuracy check,
    or stand as the ladder's best; a rung of its own recipe makes its claim over its seeds."""
    return name not in OWN_RECIPE


COMPILE_MODES = ("none", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# What one CUDA graph of a static run holds: a whole epoch's steps, or one step replayed per step.
GRAPH_SCOPES = ("epoch", "step")


@dataclass(frozen=True)
class Execution:
    """How the model itself runs: compiled or not, bf16 autocast, memory layout, CUDA graph
    (`runners` runs it; the bench document records `compiled`'s, validated as this type)."""

    __pydantic_config__ = STRICT
    compile_mode: Literal[COMPILE_MODES] = "none"  # type: ignore[valid-type]  # "none": eager
    autocast: Bool = False  # bf16 autocast for forward and loss
    channels_last: Bool = False
    cuda_graph: Bool = False  # capture CUDA graphs; ignored (recorded) off CUDA
    backend: Text = "inductor"  # torch.compile backend; the tests use "eager" (cheap)
    graph_scope: Literal[GRAPH_SCOPES] = "epoch"  # type: ignore[valid-type]  # what one graph holds (`StaticSteps`)

    def __post_init__(self) -> None:
        for name, allowed in (("compile_mode", COMPILE_MODES), ("graph_scope", GRAPH_SCOPES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} {getattr(self, name)!r} is not one of {', '.join(allowed)}")
