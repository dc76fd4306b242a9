"""Read params.yaml: the one place every knob lives (as in DVC's example-get-started)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class ParamsError(ValueError):
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
