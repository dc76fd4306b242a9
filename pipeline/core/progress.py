"""Progress bars on a terminal, silence in logs and tests."""

from __future__ import annotations

import sys
from typing import Any

from tqdm import tqdm


def _interactive() -> bool:
    return sys.stderr.isatty()


def byte_bar(total: int | None, desc: str) -> tqdm:
    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                disable=not _interactive(), leave=False)


def bar(total: int | None, desc: str, **kwargs: Any) -> tqdm:
    return tqdm(total=total, desc=desc, disable=not _interactive(), leave=False, **kwargs)
