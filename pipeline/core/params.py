"""Read params.yaml, the one place every knob lives (as in DVC's example-get-started), and
check it whole against its schema before any stage does work.

The schema (`pipeline.core.schema`, pydantic) is imported only when a file is checked, so
reading params needs nothing beyond PyYAML.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.core.bounded import load_yaml, short
from pipeline.core.errors import InputError


class ParamsError(InputError):
    """params.yaml lacks a key a command needs, or holds a value of the wrong kind."""


PARAMS_CAP = 1 << 20  # bytes: the file is a few KiB


def load_params(path: Path) -> dict[str, Any]:
    """params.yaml read strictly (pipeline.core.bounded.load_yaml): at most 1 MiB of UTF-8,
    no alias, no key given twice, each refused with one line naming the file."""
    try:
        data = load_yaml(Path(path), PARAMS_CAP, "params file")
    except FileNotFoundError:
        raise ParamsError(f"{path}: no such params file") from None
    except InputError as err:
        raise ParamsError(str(err)) from None
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


def validate_params(params: dict[str, Any], path: Path = Path("params.yaml")) -> dict[str, Any]:
    """`params` unchanged if it fits the schema; else ParamsError listing every problem."""
    from pydantic import ValidationError

    from pipeline.core.schema import Params

    try:
        Params.model_validate(params)
    except ValidationError as err:
        problems, shown = [], 10   # the first ten, and how many more: one readable line however many there are
        for error in err.errors()[:shown]:
            key = ".".join(str(part) for part in error["loc"]) or "(top level)"
            message = error["msg"].removeprefix("Value error, ")
            got = "" if error["type"] in ("missing", "value_error") else f" (got {short(error.get('input'))})"
            problems.append(f"{key}: {message}{got}")
        count = err.error_count()
        more = f"; and {count - shown:,} more" if count > shown else ""
        raise ParamsError(f"{path}: {count:,} problem(s): " + "; ".join(problems) + more) from None
    return params
