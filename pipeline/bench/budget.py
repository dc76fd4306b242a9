"""Where a train step's time goes: exclusive parts that add up to the step's wall time.

A profiled pass, outside the timed epochs (steps of one more epoch), runs a variant's own train steps under
`torch.profiler`, each step cut into three marked ranges: `data_wait` (blocked on the next
batch: the `next()` of its loader, as Lightning's profiler counts it), `copy` (moving the
batch to the device) and `step` (forward, backward, optimizer). The profiler also records
every torch op on the host and, on CUDA, every kernel and memcpy on the device. Each instant
of the pass is then counted once, in priority order, as PyTorch's TensorBoard plugin does for
its step-time breakdown, so the parts sum to the span of the pass's events by construction;
a plain clock around the pass (`wall_s`) checks that the span is the pass, nothing lost:

- on CUDA: `compute` (a kernel runs) > `copy` (a memcpy runs, or the host is copying) >
  `data_wait` > `overhead` (the host is inside a step while the device is idle: Python,
  kernel launches; Holistic Trace Analysis calls it host wait) > `other` (between steps);
- on the CPU, where the host does the work itself: `data_wait` > `copy` > `compute` (inside
  a torch op that the step called) > `overhead` (inside the step, outside every op: Python
  and dispatch) > `other`.

Why the profiler rather than timers alone: only its op and kernel events separate computing
from issuing work. Its own cost (a few microseconds per recorded op) lands mostly in the
naive rungs' per-item work, which it can only make look slower, never faster; the stage
records the pass's step time beside the timed epochs' so the difference is visible.

On CUDA the overhead is split once more, as Holistic Trace Analysis splits GPU idle time,
but by instant rather than by gap: each device kernel or memcpy is matched to the host call that
launched it (the CUDA runtime event with the same correlation id); an idle instant of the device
inside a step is `launch_gap` when work was already queued (launched, not started: the device
itself is slow to start the next of many small kernels) and `host_wait` when nothing was (the
host had not issued the next kernel yet). The two add up to `overhead`.

The interval arithmetic below is plain code over (start, end) pairs, so it is tested on the
CPU with synthetic event lists, CUDA categories included.
"""

from __future__ import annotations

import bisect
import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

Interval = tuple[float, float]
PARTS = ("data_wait", "copy", "compute", "overhead", "other")
RANGE = "budget:"  # the prefix of the profiler ranges this module marks


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


def _window_and_layers(ranges: dict[str, list[Interval]], kernels: list[Interval], memcpy: list[Interval],
                       cuda: bool, ops: list[Interval] = ()) -> tuple[Interval, list[tuple[str, list[Interval]]]]:
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
        layers = [("compute", kernels), ("copy", memcpy + ranges.get("copy", [])),
                  ("data_wait", ranges.get("data_wait", [])), ("overhead", steps)]
    else:
        layers = [("data_wait", ranges.get("data_wait", [])), ("copy", ranges.get("copy", [])),
                  ("compute", intersect(ops, steps)), ("overhead", steps)]
    return window, layers


def split(ranges: dict[str, list[Interval]], ops: list[Interval], kernels: list[Interval],
          memcpy: list[Interval], cuda: bool) -> dict[str, float]:
    """The parts of a profiled pass, in seconds, from its marked ranges (`data_wait`, `copy`,
    `step`), the host's top-level op intervals and, on CUDA, the device's kernel and memcpy
    intervals (all in seconds on one clock)."""
    parts = exclusive(*_window_and_layers(ranges, kernels, memcpy, cuda, ops))
    return {name: parts[name] for name in PARTS}


def idle_split(ranges: dict[str, list[Interval]], kernels: list[Interval], memcpy: list[Interval],
               queued: list[Interval]) -> dict[str, float]:
    """CUDA's `overhead` (the device idle inside a step) in two, in seconds: `launch_gap`
    while launched work waited to start (`queued`: from each launch call to its kernel's
    start), `host_wait` while nothing was queued. They sum to `split`'s overhead exactly."""
    overhead = claims(*_window_and_layers(ranges, kernels, memcpy, cuda=True))["overhead"]
    gap = length(intersect(overhead, queued))
    return {"host_wait": length(overhead) - gap, "launch_gap": gap}


# ---------------------------------------------------------------- reading a torch.profiler trace


def _annotation(event: Any) -> bool:
    """A range someone marked (ours, `Optimizer.step#...`, DDP's, the user's), not an op."""
    return bool(getattr(event, "is_user_annotation", False)) or event.name.startswith(RANGE)


def trace_intervals(events: Iterable[Any]) -> tuple[dict[str, list[Interval]], list[Interval], list[Interval],
                                                    list[Interval]]:
    """(marked ranges by name, host top-level ops, device kernels, device memcpys) from
    `profile.events()`, in seconds. A top-level op is one the step called itself: no op
    above it, annotations (ours, `Optimizer.step#...`, the user's ranges) looked through, on
    the thread that marked the ranges (a pin-memory or prefetch thread's ops are not the
    step's). On the device only kernels, memcpys and memsets count, never annotations."""
    events = list(events)
    ranges: dict[str, list[Interval]] = {}
    threads = set()
    for event in events:
        if event.name.startswith(RANGE) and event.device_type == torch.autograd.DeviceType.CPU:
            ranges.setdefault(event.name[len(RANGE):], []).append(_seconds(event))
            threads.add(event.thread)
    ops: list[Interval] = []
    kernels: list[Interval] = []
    memcpy: list[Interval] = []
    for event in events:
        if _annotation(event):
            continue
        if event.device_type != torch.autograd.DeviceType.CPU:
            (memcpy if "memcpy" in event.name.lower() else kernels).append(_seconds(event))
            continue
        parent = event.cpu_parent
        while parent is not None and _annotation(parent):
            parent = parent.cpu_parent
        if parent is None and event.thread in threads:
            ops.append(_seconds(event))
    return ranges, ops, kernels, memcpy


# CUDA runtime and driver calls that put work on the device: a kernel, graph or memcpy.
LAUNCHES = ("cudaLaunch", "cuLaunch", "cudaGraphLaunch", "cuGraphLaunch", "cudaMemcpy", "cuMemcpy",
            "cudaMemset", "cuMemset")


def queued_intervals(events: Iterable[Any]) -> tuple[list[Interval], int]:
    """(From each device kernel's or memcpy's launch call to its start, in seconds; how many
    device events had no launch call in the trace.) The device event and the host call that
    launched it share a correlation id (`event.id`); a CUDA graph's kernels share its launch's.
    Host ops have ids of their own, which may coincide, so only launch calls are looked up."""
    events = list(events)
    launched: dict[int, float] = {}
    for event in events:
        if event.device_type == torch.autograd.DeviceType.CPU and event.name.startswith(LAUNCHES):
            start = event.time_range.start / 1e6
            launched[event.id] = min(start, launched.get(event.id, start))
    queued: list[Interval] = []
    unmatched = 0
    for event in events:
        if event.device_type == torch.autograd.DeviceType.CPU or _annotation(event):
            continue
        start = event.time_range.start / 1e6
        if event.id in launched:
            queued.append((launched[event.id], start))
        else:
            unmatched += 1
    return queued, unmatched


NO_SPLIT = {"host_wait_s": None, "launch_gap_s": None}  # off CUDA: no device to idle


def device_idle(events: list[Any], ranges: dict[str, list[Interval]], kernels: list[Interval],
                memcpy: list[Interval], steps: int) -> dict[str, float | None]:
    """`host_wait_s` and `launch_gap_s` per step (`idle_split`), rounded so that they sum to
    the rounded `overhead_s`; both None when a device event's launch is not in the trace (the
    split would guess)."""
    queued, unmatched = queued_intervals(events)
    if unmatched or not (kernels or memcpy):
        return dict(NO_SPLIT)
    idle = idle_split(ranges, kernels, memcpy, queued)
    overhead = round((idle["host_wait"] + idle["launch_gap"]) / steps, 6)
    gap = min(round(idle["launch_gap"] / steps, 6), overhead)
    return {"host_wait_s": round(overhead - gap, 6), "launch_gap_s": gap}


def _seconds(event: Any) -> Interval:
    return event.time_range.start / 1e6, event.time_range.end / 1e6


def step_flops(events: Iterable[Any], steps: list[Interval]) -> float:
    """The FLOPs torch.profiler counts (by op name: matmuls, forward convolutions, ...) for
    the host ops that start inside a marked step: not those of a compiled or graph-replayed
    step, whose work is not dispatched op by op."""
    spans = union(steps)
    starts = [start for start, _ in spans]
    total = 0.0
    for event in events:
        flops = getattr(event, "flops", 0) or 0
        if flops and event.device_type == torch.autograd.DeviceType.CPU:
            at = event.time_range.start / 1e6
            i = bisect.bisect_right(starts, at) - 1
            if i >= 0 and at <= spans[i][1]:
                total += flops
    return total


def _activities(device: torch.device) -> list:
    """What the profiler records: the host's ops, and the device's work on CUDA."""
    return [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA]
                                                    if device.type == "cuda" else [])


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile_steps(batches: Iterator, to_device: Callable[[Any], Any], step: Callable[[Any], None], steps: int,
                  device: torch.device, warmup: int = 2) -> dict:
    """Run `steps` train steps (after `warmup` unprofiled ones) under the profiler and
    return the parts per step, in seconds, with the pass's step time (`step_s`) and, on
    CUDA, the kernels launched per step: the ladder's use of `TimeBudget`, the API any loop
    uses.

    `batches` yields what the variant's loader yields; `to_device` moves one to the device;
    `step` trains on it."""
    budget = TimeBudget(device, steps=steps, skip=warmup, flops=False)
    for item in budget.batches(batches):
        with budget.copy():
            batch = to_device(item)
        with budget.step():
            step(batch)
        if budget.done:
            break
    if budget.result is None or budget.result.partial:
        raise ValueError(f"the loader gave {budget.seen} batches, fewer than the {warmup} + {steps} to profile")
    return {**budget.result.per_step, "kernels_per_step": budget.result.kernels_per_step}


@dataclass
class Budget:
    """A profiled window's budget: seconds per step by part (`per_step`, as `per_step()`
    returns it), with what the device did where one was watched."""

    per_step: dict
    device: str
    kernels_per_step: float | None = None    # device kernels launched per step (CUDA)
    flop_per_step: float | None = None       # what the profiler counts for matmuls, convolutions, ...
    peak_device_bytes: int | None = None     # the device memory's high-water mark in the window (CUDA)
    partial: bool = False                    # the loader ended, or the loop left, before the window's end

    def _of_step(self, seconds: float) -> float:
        total = self.per_step["step_s"]
        return seconds / total if total > 0 else 0.0

    def shares(self) -> dict[str, float]:
        """Each part's fraction of the step."""
        return {part: self._of_step(self.per_step[f"{part}_s"]) for part in PARTS}

    def idle_shares(self) -> dict[str, float] | None:
        """The overhead's two halves (host wait, launch gaps) as fractions of the step; None
        where the budget did not split it (off CUDA, a launch missing) or the step is empty."""
        wait, gap = self.per_step.get("host_wait_s"), self.per_step.get("launch_gap_s")
        if wait is None or gap is None or self.per_step["step_s"] <= 0:
            return None
        return {"host_wait": self._of_step(wait), "launch_gap": self._of_step(gap)}

    def bound(self) -> str:
        """The part that takes the most of the step."""
        shares = self.shares()
        return max(PARTS, key=shares.__getitem__)

    def to_json(self) -> dict:
        """The figures, the shares and the verdict's bound: what a metrics file holds."""
        achieved = (self.flop_per_step / self.per_step["step_s"]
                    if self.flop_per_step and self.per_step["step_s"] > 0 else None)
        return {"device": self.device, **self.per_step, "share": {k: round(v, 4) for k, v in self.shares().items()},
                "bound": self.bound(), "partial": self.partial, "kernels_per_step": self.kernels_per_step,
                "flop_per_step": self.flop_per_step, "achieved_flop_s": achieved,
                "peak_device_bytes": self.peak_device_bytes}

    def report(self, ladder: dict | None = None, width: int = 100) -> str:
        """The step, its parts and the verdict (quoting `ladder`, a bench metrics document,
        when given), wrapped at `width` columns."""
        import textwrap

        from pipeline.bench.verdict import LABELS, verdict

        ms = self.per_step
        parts = " | ".join(f"{LABELS[p]} {share:.0%}" for p, share in self.shares().items())
        extra = ""
        if self.kernels_per_step is not None:
            extra += f", {self.kernels_per_step:.0f} kernels"
        if self.peak_device_bytes is not None:
            extra += f", peak device memory {self.peak_device_bytes / 2**20:.0f} MiB"
        cut = ", partial: the loop ended first" if self.partial else ""
        head = f"step {1000 * ms['step_s']:.3g} ms ({ms['steps']} steps on {self.device}{extra}{cut}): {parts}"
        return "\n".join([*textwrap.wrap(head, width), *textwrap.wrap(verdict(self, ladder), width)])

    def __str__(self) -> str:
        return self.report()


class TimeBudget:
    """Where any training loop's step time goes: wrap its loader, mark its step.

        budget = TimeBudget("cuda")                 # or "cpu"; steps to profile, steps to skip
        for x, y in budget.batches(loader):         # the wait for each batch is timed
            with budget.step():                     # forward, backward, optimizer (copies too)
                ...
        print(budget.result)                        # parts per step, the bound and what to try

    The first `skip` steps run untouched (warm-up, compilation, workers starting); the next
    `steps` run under `torch.profiler`, and the window's parts (see the module) add up to
    its span; after them the wrapper only counts. `copy()` marks a host-to-device copy the
    profiler cannot see as one (on CUDA, memcpys are found without it). With `trace`, the
    window is written as a Chrome/Perfetto trace with the ranges marked (`budget:step`, ...).
    """

    def __init__(self, device: str | torch.device = "cpu", steps: int = 20, skip: int = 5,
                 trace: str | None = None, flops: bool = True) -> None:
        if type(steps) is not int or steps < 1 or type(skip) is not int or skip < 0:
            raise ValueError(f"steps must be an int >= 1 and skip an int >= 0, got steps={steps!r}, skip={skip!r}")
        self.device = torch.device(device)
        self.steps, self.skip, self.trace, self.flops = steps, skip, trace, flops
        self.seen = 0                       # batches handed out so far
        self.result: Budget | None = None
        self._profiler: torch.profiler.profile | None = None
        self._started = 0.0
        self._stepped = 0                   # steps finished inside the window
        self._ended = 0.0                   # when the last of them ended

    @property
    def profiling(self) -> bool:
        return self._profiler is not None

    @property
    def done(self) -> bool:
        """The window is profiled and `result` holds its budget."""
        return self.result is not None

    def batches(self, loader: Iterable) -> Iterator:
        """`loader`'s items, unchanged; inside the window each wait for one is marked. The
        generator that opened the window closes it if the loader ends or the loop leaves
        first: the budget then covers the steps finished, marked `partial`."""
        items = iter(loader)
        opened = False
        try:
            while True:
                if self.seen == self.skip and self.result is None and self._profiler is None:
                    self._start()
                    opened = True
                try:
                    if self._profiler is None:
                        item = next(items)
                    else:
                        with torch.profiler.record_function(RANGE + "data_wait"):
                            item = next(items)
                except StopIteration:
                    return
                self.seen += 1
                yield item
        finally:
            if opened and self._profiler is not None:
                if self.device.type == "cuda" and self._stepped:
                    with torch.profiler.record_function(RANGE + "step"):  # the last step's queued work
                        _sync(self.device)
                    self._ended = time.perf_counter()
                self._stop(self._stepped, partial=True)

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """Marks one train step; the window's last one waits for the device inside it."""
        if self._profiler is None:
            yield
            return
        last = self._stepped + 1 == self.steps
        with torch.profiler.record_function(RANGE + "step"):
            yield
            if last:
                _sync(self.device)
        self._stepped += 1
        self._ended = time.perf_counter()
        if last:
            self._stop(self.steps)

    @contextlib.contextmanager
    def copy(self) -> Iterator[None]:
        """Marks a copy of a batch to the device (outside or inside the step)."""
        if self._profiler is None:
            yield
            return
        with torch.profiler.record_function(RANGE + "copy"):
            yield

    def _start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        _sync(self.device)
        self._profiler = torch.profiler.profile(activities=_activities(self.device), with_flops=self.flops)
        self._profiler.__enter__()
        self._started = time.perf_counter()

    def _stop(self, steps: int, partial: bool = False) -> None:
        wall = self._ended - self._started  # to the end of the last step finished
        profiler, self._profiler = self._profiler, None
        profiler.__exit__(None, None, None)
        if steps < 1:
            return
        events = list(profiler.events())
        ranges, ops, kernels, memcpy = trace_intervals(events)
        parts = split(ranges, ops, kernels, memcpy, cuda=self.device.type == "cuda")
        flop = step_flops(events, ranges.get("step", [])) if self.flops else 0
        peak = torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else None
        idle = device_idle(events, ranges, kernels, memcpy, steps) if self.device.type == "cuda" else NO_SPLIT
        self.result = Budget(per_step={**per_step(parts, steps, wall), **idle}, device=str(self.device),
                             kernels_per_step=len(kernels) / steps if self.device.type == "cuda" else None,
                             flop_per_step=flop / steps if flop else None, peak_device_bytes=peak,
                             partial=partial)
        if self.trace:
            profiler.export_chrome_trace(str(self.trace))


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


def timed_window(run: Callable[[], None], device: torch.device, steps: int) -> dict:
    """The parts of a whole replayed epoch (one CUDA graph), where no step can be marked:
    kernels are compute, memcpys copy, the rest of the host's wait overhead; with the
    kernels launched per step (None off CUDA)."""
    _sync(device)
    with torch.profiler.profile(activities=_activities(device)) as prof:
        start = time.perf_counter()
        with torch.profiler.record_function(RANGE + "step"):
            run()
            _sync(device)
        wall = time.perf_counter() - start
    events = list(prof.events())
    ranges, ops, kernels, memcpy = trace_intervals(events)
    parts = split(ranges, ops, kernels, memcpy, cuda=device.type == "cuda")
    idle = device_idle(events, ranges, kernels, memcpy, steps) if device.type == "cuda" else NO_SPLIT
    return {**per_step(parts, steps, wall), **idle,
            "kernels_per_step": round(len(kernels) / steps, 1) if device.type == "cuda" else None}

