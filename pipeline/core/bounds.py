"""The value types of the settings sections, each with its bounds on its annotation: pydantic
reads them where it is installed (a section's model or dataclass is validated, every problem
named by its dotted key); on a machine with torch alone the same classes are built without
it, and the marks are read by nothing.

Strict: `1.5` is not a count, `true` is not 1, a string is not a number.
"""

from __future__ import annotations

from typing import Annotated

from pipeline.core.errors import is_slug

try:  # the bounds pydantic reads; on a torch-only machine, marks nothing reads
    from annotated_types import Interval, Len
    from pydantic import AfterValidator, AllowInfNan, BeforeValidator, ConfigDict, Strict, model_validator
except ImportError:  # pragma: no cover (the standalone bench's machine)

    def model_validator(**_: str):  # a rule between fields that only the params check applies
        return lambda method: method

    def AfterValidator(_: object) -> None:  # noqa: N802 (the library's name): a check only the params check runs
        return None

    BeforeValidator = AfterValidator

    def Interval(**_: float) -> None:  # noqa: N802
        return None

    def Len(*_: int) -> None:  # noqa: N802
        return None

    def Strict(*_: bool) -> None:  # noqa: N802
        return None

    AllowInfNan = Strict

    def ConfigDict(**_: object) -> dict:  # noqa: N802
        return {}


def Int(low: int, high: int) -> object:  # noqa: N802 (a type, as pydantic's own)
    """An integer in [low, high]: `1.5` is not a count, `true` is not 1."""
    return Annotated[int, Strict(), Interval(ge=low, le=high)]


def Num(**bounds: float) -> object:  # noqa: N802
    """A finite number (int or float, never a string or a bool) within `bounds` (gt, ge, lt, le)."""
    return Annotated[float, Strict(), AllowInfNan(False), Interval(**bounds)]


def _slug(value: str) -> str:
    if not is_slug(value):
        raise ValueError("not a plain name (a-z, 0-9, '-' and '_', at most 64), as a folder takes it")
    return value


Bool = Annotated[bool, Strict()]
Text = Annotated[str, Strict()]
Line = Annotated[str, Strict(), Len(0, 2000)]  # free text read from a file: bounded, escaped where rendered
Name = Annotated[str, Strict(), AfterValidator(_slug)]  # a folder name: `is_slug`'s rule
EPOCHS = Int(1, 100)  # a CPU epoch of the slowest rung takes minutes, so 100 is days
BATCH = Int(1, 1 << 16)
RATE = Num(gt=0, le=10)
# numpy's and torch's generators take any 32-bit value, and a shuffle's seed (seed x 1,000,003
# + epoch) must stay within torch's 64 bits
SEED = Int(0, (1 << 32) - 1)
SEEDS = Int(0, 100)
STRICT = ConfigDict(extra="forbid")  # an unknown key is refused, by name
LOOSE = ConfigDict(extra="ignore")  # a document's reader: keys a later writer added are passed over
