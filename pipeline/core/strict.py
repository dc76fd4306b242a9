"""What every stage's settings model shares: strict pydantic models and the value types
that more than one section uses.

Strict: `1.5` is not a sample count, `null` is not a number, an unknown key is refused.
Each stage declares its section's model in its folder (`pipeline/stages/<stage>/settings.py`);
the bench's is a dataclass whose annotations carry its bounds (`pipeline/bench/settings.py`).
"""

from __future__ import annotations

from typing import Union

from pydantic import BaseModel, ConfigDict, StrictFloat, StrictInt

Number = Union[StrictInt, StrictFloat]


class Strict(BaseModel):
    """A settings model: strict types, no unknown key."""

    model_config = ConfigDict(extra="forbid", strict=True)
