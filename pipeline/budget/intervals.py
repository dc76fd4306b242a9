"""A profiled window cut into exclusive parts that add up to its wall time: plain interval arithmetic.

Each instant of the window is counted once, in priority order (data wait, copy, compute,
overhead, other; on CUDA the overhead split into launch gap and host wait), as PyTorch's
TensorBoard plugin and Holistic Trace Analysis count them: docs/budget.md, "What it reports".
Plain code over (start, end) pairs in seconds, so it is tested on the CPU with synthetic
event lists, CUDA categories included; `trace` turns a torch.profiler trace into them.
"""

from __future__ import annotations

from collections.abc import Iterable

Interval = tuple[float, float]
PARTS = ("data_wait", "copy", "compute", "overhead", "other")


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, merged, non-empty intervals covering exactly what `intervals` cover."""
    merged: list[Interval] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def intersect(a: Iterable[Interval], b: Iterable[Interval]) -> list[Interval]:
    """What both cover."""
    a, b = union(a), union(b)
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: Iterable[Interval], b: Iterable[Interval]) -> list[Interval]:
    """What `a` covers and `b` does not."""
    out: list[Interval] = []
    cuts = union(b)
    for start, end in union(a):
        for cut_start, cut_end in cuts:
            if cut_end <= start or cut_start >= end:
                continue
            if cut_start > start:
                out.append((start, cut_start))
            start = max(start, cut_end)
            if start >= end:
                break
        if start < end:
            out.append((start, end))
    return out


def length(intervals: Iterable[Interval]) -> float:
    return sum(end - start for start, end in union(intervals))


def claims(window: Interval, layers: list[tuple[str, list[Interval]]]) -> dict[str, list[Interval]]:
    """Each layer's intervals inside `window` not already claimed by an earlier layer, and
    `other` for what no layer covers: together they tile the window exactly once."""
    claimed: list[Interval] = []
    out: dict[str, list[Interval]] = {}
    for name, intervals in layers:
        free = subtract(intersect(intervals, [window]), claimed)
        out[name] = union(out.get(name, []) + free)
        claimed = union(claimed + free)
    out["other"] = subtract([window], claimed)
    return out


def exclusive(window: Interval, layers: list[tuple[str, list[Interval]]]) -> dict[str, float]:
    """Each layer's time inside `window` not already claimed by an earlier layer, and
    `other` for what no layer covers: the parts sum to the window's length exactly."""
    return {name: length(intervals) for name, intervals in claims(window, layers).items()}


def window_and_layers(
    ranges: dict[str, list[Interval]],
    kernels: list[Interval],
    memcpy: list[Interval],
    cuda: bool,
    ops: list[Interval] = (),
) -> tuple[Interval, list[tuple[str, list[Interval]]]]:
    """The pass's window and its parts' layers in priority order (see the module); the host's
    ops count only on the CPU."""
    marked = [i for name in ("data_wait", "copy", "step") for i in ranges.get(name, [])]
    if not marked:
        raise ValueError("a profiled pass with no marked range")
    # The window ends with its last step (or copy): a wait for a batch that never came (the
    # loader's end) or for one the loop never took is not part of any step.
    ends = [end for name in ("copy", "step") for _, end in ranges.get(name, [])] or [end for _, end in marked]
    window = (min(s for s, _ in marked), max(ends))
    steps = ranges.get("step", [])
    if cuda:
        layers = [
            ("compute", kernels),
            ("copy", memcpy + ranges.get("copy", [])),
            ("data_wait", ranges.get("data_wait", [])),
            ("overhead", steps),
        ]
    else:
        layers = [
            ("data_wait", ranges.get("data_wait", [])),
            ("copy", ranges.get("copy", [])),
            ("compute", intersect(ops, steps)),
            ("overhead", steps),
        ]
    return window, layers


def split(
    ranges: dict[str, list[Interval]], ops: list[Interval], kernels: list[Interval], memcpy: list[Interval], cuda: bool
) -> dict[str, float]:
    """The parts of a profiled pass, in seconds, from its marked ranges (`data_wait`, `copy`,
    `step`), the host's top-level op intervals and, on CUDA, the device's kernel and memcpy
    intervals (all in seconds on one clock)."""
    parts = exclusive(*window_and_layers(ranges, kernels, memcpy, cuda, ops))
    return {name: parts[name] for name in PARTS}


def idle_split(
    ranges: dict[str, list[Interval]], kernels: list[Interval], memcpy: list[Interval], queued: list[Interval]
) -> dict[str, float]:
    """CUDA's `overhead` (the device idle inside a step) in two, in seconds: `launch_gap`
    while launched work waited to start (`queued`: from each launch call to its kernel's
    start), `host_wait` while nothing was queued. They sum to `split`'s overhead exactly."""
    overhead = claims(*window_and_layers(ranges, kernels, memcpy, cuda=True))["overhead"]
    gap = length(intersect(overhead, queued))
    return {"host_wait": length(overhead) - gap, "launch_gap": gap}


def per_step(parts: dict[str, float], steps: int, wall: float | None = None) -> dict:
    """Seconds per step, rounded to a microsecond, with `step_s` their exact sum and, given
    the pass's wall time on a plain clock, `wall_s` per step and `vs_wall` (`step_s` over it:
    how much of the pass the profiler's events account for)."""
    out = {f"{name}_s": round(seconds / steps, 6) for name, seconds in parts.items()}
    out["step_s"] = round(sum(out[f"{name}_s"] for name in PARTS), 6)
    out["steps"] = steps
    if wall is not None:
        out["wall_s"] = round(wall / steps, 6)
        out["vs_wall"] = round(out["step_s"] / out["wall_s"], 3) if out["wall_s"] > 0 else None
    return out
