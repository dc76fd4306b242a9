"""The `engine` setting of the data stages (convert, shard): `local` or `ray`.

`ray` is refused up front where Ray is not installed, so the params check stops a run (or
`dvc exp run -S shard.engine=ray`) with one line before DVC removes any output.
"""

from __future__ import annotations

import importlib.util
from typing import Annotated, Literal

from pipeline.core.bounds import AfterValidator


def _installed(engine: str) -> str:
    if engine == "ray" and not _importable("ray"):
        raise ValueError("engine ray needs Ray, which is not installed: pip install 'trainpath[ray]'")
    return engine


def _importable(name: str) -> bool:
    """`name` can be imported (a module set to None in sys.modules cannot)."""
    try:
        return importlib.util.find_spec(name) is not None
    except ValueError:  # in sys.modules without a spec: None, or a stand-in
        return False


Engine = Annotated[Literal["local", "ray"], AfterValidator(_installed)]
