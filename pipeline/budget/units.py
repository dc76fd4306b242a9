"""Durations and rates in the unit that reads best: no figure printed in powers of ten."""

from __future__ import annotations


def duration(seconds: float) -> str:
    """Microseconds below a millisecond, milliseconds below a second, seconds below a hundred,
    then minutes, then hours; three significant digits at most."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.3g} us"
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    if seconds < 100:
        return f"{seconds:.3g} s"
    return f"{seconds / 60:.3g} min" if seconds < 6000 else f"{seconds / 3600:.3g} h"


def rate(flop_s: float) -> str:
    """FLOP/s with the largest SI prefix that keeps the figure at one or more."""
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if flop_s >= scale:
            return f"{flop_s / scale:.3g} {unit}FLOP/s"
    return f"{flop_s:.3g} FLOP/s"
