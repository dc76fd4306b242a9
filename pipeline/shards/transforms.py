"""Transforms a caller names: the only way a reader returns values other than those stored.

A transform maps a batch ({field name: tensor [b, *shape]}, in the manifest's field order) to
a batch. The two here are what an image classifier usually wants; each checks, when the
reader is built, that the field it names exists and has a dtype it fits, and refuses it
otherwise with a ShardError (a ValueError) naming the field:

    ShardDataset(path, transform=[UnitFloat("images", add_channel=True), Int64("labels")])

Any other callable of a batch dict works too (it is not checked in advance).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch

from pipeline.shards.format import ShardError

Batch = dict[str, torch.Tensor]
# The float dtypes numpy computes exactly as torch does (same IEEE operations, same dtype):
# on the CPU the conversion runs in numpy on one thread, which a busy host does not slow down
# as it does torch's intra-op threads. Other dtypes go through torch.
_HOST_FLOATS = {torch.float32: np.float32, torch.float64: np.float64}


def unit_float(
    images: torch.Tensor,
    *,
    mean: float | None = None,
    std: float | None = None,
    dtype: torch.dtype = torch.float32,
    add_channel: bool = False,
) -> torch.Tensor:
    """uint8 [b, ...] -> `dtype` in 0..1 (x / 255), then (x - mean) / std when both are given;
    `add_channel` inserts a channel axis of 1 after the batch axis ([b, H, W] -> [b, 1, H, W]).
    On its device; on the CPU the same values computed with numpy."""
    if images.dtype != torch.uint8:
        raise ShardError(f"unit_float: expected uint8 values, got {images.dtype}")
    _check_unit_float("unit_float", mean, std, dtype, add_channel)
    if images.device.type == "cpu" and dtype in _HOST_FLOATS:
        kind = _HOST_FLOATS[dtype]
        x = images.numpy().astype(kind)
        np.divide(x, kind(255), out=x)
        if mean is not None:
            np.subtract(x, kind(mean), out=x)
            np.divide(x, kind(std), out=x)
        out = torch.from_numpy(x)
    else:
        out = images.to(dtype).div_(255)
        if mean is not None:
            out = out.sub_(mean).div_(std)
    return out.unsqueeze(1) if add_channel else out


_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check_unit_float(who: str, mean, std, dtype, add_channel) -> None:
    """unit_float's arguments, each refused in one line naming it."""
    if (mean is None) != (std is None):
        raise ShardError(f"{who}: mean and std go together (got mean={mean!r:.40}, std={std!r:.40})")
    for name, value in (("mean", mean), ("std", std)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value)
        ):
            raise ShardError(f"{who}: {name} must be a finite number, got {value!r:.40}")
    if std is not None and std <= 0:
        raise ShardError(f"{who}: std must be above 0, got {std!r:.40}")
    if dtype not in _FLOATS:
        raise ShardError(
            f"{who}: dtype must be a torch float dtype ({', '.join(map(str, _FLOATS))}), got {dtype!r:.40}"
        )
    if not isinstance(add_channel, bool):
        raise ShardError(f"{who}: add_channel must be True or False, got {add_channel!r:.40}")


class UnitFloat:
    """A uint8 field as floats in 0..1 (optionally normalised, optionally with a channel axis):
    `unit_float` of that field. Refuses a field that is not uint8."""

    def __init__(
        self,
        field: str,
        *,
        mean: float | None = None,
        std: float | None = None,
        dtype: torch.dtype = torch.float32,
        add_channel: bool = False,
    ) -> None:
        if not isinstance(field, str):
            raise ShardError(f"UnitFloat: field must be a field's name (str), got {type(field).__name__}")
        _check_unit_float(f"UnitFloat({field!r:.40})", mean, std, dtype, add_channel)
        self.field, self.mean, self.std, self.dtype, self.add_channel = field, mean, std, dtype, add_channel

    def check(self, dtypes: Mapping[str, str]) -> None:
        if self.field not in dtypes:
            raise ShardError(f"UnitFloat: no field {self.field!r} (fields: {list(dtypes)})")
        if dtypes[self.field] != "uint8":
            raise ShardError(f"UnitFloat: field {self.field!r} is {dtypes[self.field]}, not uint8 (0..255)")

    def __call__(self, batch: Batch) -> Batch:
        return {
            **batch,
            self.field: unit_float(
                batch[self.field], mean=self.mean, std=self.std, dtype=self.dtype, add_channel=self.add_channel
            ),
        }


class Int64:
    """An integer field as int64 (what `cross_entropy` takes as class indices). Refuses a
    field that is not an integer one."""

    def __init__(self, field: str) -> None:
        if not isinstance(field, str):
            raise ShardError(f"Int64: field must be a field's name (str), got {type(field).__name__}")
        self.field = field

    def check(self, dtypes: Mapping[str, str]) -> None:
        if self.field not in dtypes:
            raise ShardError(f"Int64: no field {self.field!r} (fields: {list(dtypes)})")
        if not dtypes[self.field].startswith(("int", "uint")):
            raise ShardError(f"Int64: field {self.field!r} is {dtypes[self.field]}, not an integer field")

    def __call__(self, batch: Batch) -> Batch:
        values = batch[self.field]
        if values.dtype == torch.uint64 and values.numel():  # 2**63 and up have no int64: refused, never wrapped
            wrapped = values.view(torch.int64).reshape(len(values), -1) < 0
            rows = wrapped.any(dim=1).nonzero()
            if len(rows):
                row = int(rows[0])
                value = int(values[row].reshape(-1)[wrapped[row]].view(torch.int64)[0]) + (1 << 64)
                raise ShardError(
                    f"Int64: field {self.field!r}: value {value} (batch row {row}) does not fit int64; "
                    f"keep the field uint64, or write values below 2**63"
                )
        return {**batch, self.field: values.to(torch.int64)}


Transform = Callable[[Batch], Batch]


def compose(transform: Transform | Sequence[Transform] | None, dtypes: Mapping[str, str]) -> Transform | None:
    """One callable of the caller's transform(s), each checked against the fields' dtypes."""
    if transform is None:
        return None
    steps = list(transform) if isinstance(transform, list | tuple) else [transform]
    for step in steps:
        if not callable(step):
            raise ShardError(
                f"a transform must be callable, got {type(step).__name__} (transform= takes a "
                f"callable of a batch dict, or a list of them)"
            )
        if hasattr(step, "check"):
            step.check(dtypes)
    return steps[0] if len(steps) == 1 else Compose(steps)


class Compose:
    """Transforms applied in turn (a class, not a closure: DataLoader workers started with
    spawn or forkserver receive the dataset pickled)."""

    def __init__(self, steps: Sequence[Transform]) -> None:
        self.steps = list(steps)

    def __call__(self, batch: Batch) -> Batch:
        for step in self.steps:
            batch = step(batch)
        return batch
