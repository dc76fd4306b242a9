"""What every stage's settings model shares: strict pydantic models and the value types
that more than one section uses.

Strict: `1.5` is not a sample count, `null` is not a number, an unknown key is refused.
Each stage declares its section's model beside it (`pipeline.stages.<stage>_settings`).
"""

from __future__ import annotations

from typing import Union

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt

Number = Union[StrictInt, StrictFloat]


class Strict(BaseModel):
    """A settings model: strict types, no unknown key."""

    model_config = ConfigDict(extra="forbid", strict=True)


def seed() -> object:
    """A seed field: numpy's and torch's generators take any 32-bit value, and a shuffle's
    seed (seed x 1,000,003 + epoch) must stay within torch's 64 bits."""
    return Field(ge=0, le=(1 << 32) - 1)


def epochs() -> object:
    """An epoch count: a CPU epoch of the slowest rung takes minutes, so 100 is days."""
    return Field(ge=1, le=100)
