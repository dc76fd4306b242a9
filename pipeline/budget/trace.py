"""A torch.profiler trace read as intervals, and the profiler started without its log lines.

`trace_intervals` finds the marked ranges, the step's own ops and the device's kernels and
copies; `window_parts` turns a finished window into seconds per step by part
(`intervals`), with the device's idle time split and what the profiler counted (ops,
kernels, FLOPs, whether a convolution ran). Kineto writes a line to the process's stderr each time a profiler starts
or stops; `quiet_profiler` keeps those lines out of the user's output and passes every
other line through.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from pipeline.budget.intervals import Interval, idle_split, intersect, length, per_step, split, subtract, union

RANGE = "budget:"  # the prefix of the profiler ranges the budget marks


# The range a DataLoader's iterator marks around each batch it hands out:
# "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__" (or _MultiProcessing...).
LOADER_NEXT = re.compile(r"^enumerate\(DataLoader\)#\w+\.__next__$")


def annotation(event: Any) -> bool:
    """A range someone marked (ours, `Optimizer.step#...`, DDP's, the user's), not an op."""
    return bool(getattr(event, "is_user_annotation", False)) or event.name.startswith(RANGE)


def trace_intervals(
    events: Iterable[Any],
) -> tuple[dict[str, list[Interval]], list[Interval], list[Interval], list[Interval]]:
    """(marked ranges by name, host top-level ops, device kernels, device memcpys) from
    `profile.events()`, in seconds. A top-level op is one the step called itself: no op
    above it, annotations (ours, `Optimizer.step#...`, the user's ranges) looked through, on
    the thread that marked the ranges (a pin-memory or prefetch thread's ops are not the
    step's). Any DataLoader's wait for a batch on that thread joins `data_wait`. On the
    device only kernels, memcpys and memsets count, never annotations."""
    events = list(events)
    ranges: dict[str, list[Interval]] = {}
    threads = set()
    for event in events:
        if event.name.startswith(RANGE) and event.device_type == torch.autograd.DeviceType.CPU:
            ranges.setdefault(event.name[len(RANGE) :], []).append(seconds(event))
            threads.add(event.thread)
    # Another DataLoader's wait on the loop's thread (a second loader zipped with the first, a
    # validation loader inside the step) is a wait for data too, not the step's own work.
    waits = [
        seconds(event)
        for event in events
        if LOADER_NEXT.match(event.name)
        and event.thread in threads
        and event.device_type == torch.autograd.DeviceType.CPU
    ]
    if waits and "data_wait" in ranges:
        ranges["other_loaders"] = subtract(union(waits), ranges["data_wait"])
        ranges["data_wait"] = union(ranges["data_wait"] + waits)
    ops: list[Interval] = []
    kernels: list[Interval] = []
    memcpy: list[Interval] = []
    for event in events:
        if annotation(event):
            continue
        if event.device_type != torch.autograd.DeviceType.CPU:
            (memcpy if "memcpy" in event.name.lower() else kernels).append(seconds(event))
            continue
        parent = event.cpu_parent
        while parent is not None and annotation(parent):
            parent = parent.cpu_parent
        if parent is None and event.thread in threads:
            ops.append(seconds(event))
    return ranges, ops, kernels, memcpy


# CUDA runtime and driver calls that put work on the device: a kernel, graph or memcpy.
LAUNCHES = (
    "cudaLaunch",
    "cuLaunch",
    "cudaGraphLaunch",
    "cuGraphLaunch",
    "cudaMemcpy",
    "cuMemcpy",
    "cudaMemset",
    "cuMemset",
)


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
        if event.device_type == torch.autograd.DeviceType.CPU or annotation(event):
            continue
        start = event.time_range.start / 1e6
        if event.id in launched:
            queued.append((launched[event.id], start))
        else:
            unmatched += 1
    return queued, unmatched


NO_SPLIT = {"host_wait_s": None, "launch_gap_s": None}  # off CUDA: no device to idle


def device_idle(
    events: list[Any], ranges: dict[str, list[Interval]], kernels: list[Interval], memcpy: list[Interval], steps: int
) -> dict[str, float | None]:
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


def seconds(event: Any) -> Interval:
    return event.time_range.start / 1e6, event.time_range.end / 1e6


def inside(steps: list[Interval]) -> Callable[[float], bool]:
    """A test of whether an instant (seconds) falls inside one of `steps`."""
    spans = union(steps)
    starts = [start for start, _ in spans]

    def test(at: float) -> bool:
        i = bisect.bisect_right(starts, at) - 1
        return i >= 0 and at <= spans[i][1]

    return test


def step_flops(events: Iterable[Any], steps: list[Interval]) -> tuple[float, float]:
    """(all, low precision) FLOPs torch.profiler counts (by op name: matmuls, forward
    convolutions, ...) for the host ops that start inside a marked step: not those of a
    compiled or graph-replayed step, whose work is not dispatched op by op. Low precision:
    an op whose inputs are bfloat16 or float16 (what autocast already made of it)."""
    in_step = inside(steps)
    total = low = 0.0
    for event in events:
        flops = getattr(event, "flops", 0) or 0
        if flops and event.device_type == torch.autograd.DeviceType.CPU and in_step(event.time_range.start / 1e6):
            total += flops
            if LOW_PRECISION & set(getattr(event, "input_dtypes", None) or ()):
                low += flops
    return total, low


LOW_PRECISION = {"c10::BFloat16", "c10::Half"}  # how the profiler names those input dtypes


GRAPH_LAUNCHES = ("cudaGraphLaunch", "cuGraphLaunch")  # a CUDA graph replayed: its kernels, no op each


def step_graph_launches(events: Iterable[Any], steps: list[Interval]) -> int:
    """The CUDA graphs replayed inside a marked step (the host's graph launch calls): a
    replayed graph runs its kernels with no op dispatched and no launch call per kernel. The
    runtime's call and the driver's are counted apart and the larger count kept, so a replay
    traced at both levels counts once."""
    in_step = inside(steps)
    counts = dict.fromkeys(GRAPH_LAUNCHES, 0)
    for event in events:
        if event.device_type == torch.autograd.DeviceType.CPU and in_step(event.time_range.start / 1e6):
            level = next((name for name in GRAPH_LAUNCHES if event.name.startswith(name)), None)
            if level is not None:
                counts[level] += 1
    return max(counts.values())


# The ATen ops a convolution runs as, whatever the backend: conv1d/2d/3d, convolution,
# _convolution, mkldnn_convolution, cudnn_convolution, slow_conv2d_forward, conv_transpose2d,
# convolution_backward, ... (not `_convert_*`: "conv" must be followed by what names a convolution).
CONVOLUTION = re.compile(r"^aten::\w*conv(olution|\d?d|_transpose|_depthwise|_tbc)")


def step_convolutions(events: Iterable[Any], steps: list[Interval]) -> bool:
    """Whether a host op that starts inside a marked step is a convolution (CONVOLUTION):
    evidence that the model has convolution layers, read from the trace rather than asked."""
    in_step = inside(steps)
    return any(
        CONVOLUTION.match(event.name)
        and event.device_type == torch.autograd.DeviceType.CPU
        and in_step(event.time_range.start / 1e6)
        for event in events
    )


COMPILED = "Torch-Compiled Region"  # the range torch.compile'd code runs in ("...: 0/0")


def step_compiled(events: Iterable[Any], steps: list[Interval]) -> bool:
    """Whether the step ran torch.compile'd code (a COMPILED range starts inside a step)."""
    in_step = inside(steps)
    return any(event.name.startswith(COMPILED) and in_step(event.time_range.start / 1e6) for event in events)


def activities(device: torch.device) -> list:
    """What the profiler records: the host's ops, and the device's work on CUDA."""
    return [torch.profiler.ProfilerActivity.CPU] + (
        [torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else []
    )


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA), so that a clock read after it is honest."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_window(run: Callable[[], None], device: torch.device, steps: int) -> dict:
    """The parts per step of a window with no step to mark (a whole epoch replayed as one CUDA
    graph, `steps` steps): kernels are compute, memcpys copy, the rest of the host's wait
    overhead; with the kernels launched per step (None off CUDA)."""
    import time

    sync(device)
    with QuietProfiler(device) as prof:
        start = time.perf_counter()
        with torch.profiler.record_function(RANGE + "step"):
            run()
            sync(device)
        wall = time.perf_counter() - start
    window = window_parts(list(prof.events()), steps, wall, device, flops=False)
    return {**window.per_step, "kernels_per_step": window.kernels_per_step}


@dataclass(frozen=True)
class Window:
    """A profiled window read: seconds per step by part (`intervals.per_step`, with the
    device's idle split) and what the profiler counted per step."""

    per_step: dict
    ops_per_step: float  # top-level torch ops the step called
    kernels_per_step: float | None  # device kernels launched (CUDA; None elsewhere)
    flop_per_step: float | None  # what the profiler counts for matmuls, convolutions, ... (None: not counted)
    convolutions: bool = False  # a convolution op ran inside a step (`step_convolutions`)
    graphs_per_step: float | None = None  # CUDA graphs replayed (CUDA; None elsewhere)
    other_loaders_s: float = 0.0  # of the data wait per step: other DataLoaders' (`trace_intervals`)
    low_precision: float | None = None  # of the counted FLOPs: in bfloat16 / float16 ops (`step_flops`)
    compiled: bool = False  # the step ran torch.compile'd code (`step_compiled`)


def window_parts(events: list[Any], steps: int, wall: float | None, device: torch.device, flops: bool) -> Window:
    """The budget of a finished window of `steps` steps from its events: the one way from a
    trace to its parts, for a marked loop and for a replayed graph alike."""
    cuda = device.type == "cuda"
    ranges, ops, kernels, memcpy = trace_intervals(events)
    parts = split(ranges, ops, kernels, memcpy, cuda=cuda)
    idle = device_idle(events, ranges, kernels, memcpy, steps) if cuda else dict(NO_SPLIT)
    flop, low = step_flops(events, ranges.get("step", [])) if flops else (0.0, 0.0)
    return Window(
        per_step={**per_step(parts, steps, wall), **idle},
        ops_per_step=round(sum(map(inside(ranges.get("step", [])), (start for start, _ in ops))) / steps, 1),
        kernels_per_step=round(len(kernels) / steps, 1) if cuda else None,
        flop_per_step=flop / steps if flop else None,
        low_precision=round(low / flop, 4) if flop else None,
        compiled=step_compiled(events, ranges.get("step", [])),
        convolutions=step_convolutions(events, ranges.get("step", [])),
        graphs_per_step=round(step_graph_launches(events, ranges.get("step", [])) / steps, 1) if cuda else None,
        other_loaders_s=round(length(intersect(ranges.get("other_loaders", []), ranges.get("step", []))) / steps, 6),
    )


# Kineto's own log lines: "USDT:2026-01-01 10:00:00 123:123 File.cpp:52] profiler_start".
KINETO_LINE = re.compile(rb"^[A-Z]+:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ \S+\.cpp:\d+\] ")


@contextlib.contextmanager
def kineto_lines_dropped() -> Iterator[None]:
    """Within the block, the process's stderr (file descriptor 2) goes to a temporary file;
    afterwards every line of it but Kineto's own log lines is written to stderr. Only the
    profiler's start and stop run inside: a user's line written meanwhile comes out late,
    never lost. Where no descriptor or file can be had, the block runs as it is."""
    sys.stderr.flush()
    saved = capture = None
    try:
        saved = os.dup(2)
        capture = tempfile.TemporaryFile()
    except OSError:
        if saved is not None:
            os.close(saved)
        saved = None
    if saved is None or capture is None:
        yield
        return
    try:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            capture.seek(0)
            for line in iter(capture.readline, b""):
                if not KINETO_LINE.match(line):
                    os.write(2, line)
    finally:
        os.close(saved)
        capture.close()


class QuietProfiler:
    """`torch.profiler.profile` whose start and stop print nothing of Kineto's own."""

    def __init__(self, device: torch.device, flops: bool = False) -> None:
        self.profiler = torch.profiler.profile(activities=activities(device), with_flops=flops)

    def __enter__(self) -> torch.profiler.profile:
        with kineto_lines_dropped():
            self.profiler.__enter__()
        return self.profiler

    def __exit__(self, *exc: object) -> None:
        with kineto_lines_dropped():
            self.profiler.__exit__(*exc)


def export_trace(profiler: torch.profiler.profile, path: str | os.PathLike) -> None:
    """The window as a Chrome/Perfetto trace at `path`, whole, or an error naming it. Torch's
    exporter logs a failed write (a full disk, a read-only or missing folder) and returns as
    if it had written, leaving its temporary `<path>.tmp` behind: so the file is checked
    afterwards, the exporter's temporary removed, and what was at `path` before is kept."""
    from pipeline.core.errors import SystemFailure

    dest = os.fspath(path)
    spare = dest + ".tmp"
    before = _identity(dest)
    spare_before = os.path.lexists(spare)
    profiler.export_chrome_trace(dest)
    after = _identity(dest)
    if after is not None and after != before and _ends_whole(dest):
        return
    if after is not None and after != before:  # written in place, but not whole
        os.unlink(dest)
    if not spare_before and os.path.lexists(spare):
        os.unlink(spare)
    free = _free_bytes(os.path.dirname(dest) or ".")
    raise SystemFailure(
        f"{dest}: the trace could not be written (torch's exporter says why above{free}); "
        f"{'the trace there before is kept' if before else 'nothing was written'}"
    )


def _identity(path: str) -> tuple[int, int, int] | None:
    """(inode, size, modification ns) of a regular file at `path`, or None."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns) if os.path.isfile(path) else None


def _ends_whole(path: str) -> bool:
    """The JSON document at `path` ends where a whole trace does (its closing brace)."""
    with open(path, "rb") as file:
        file.seek(max(0, os.path.getsize(path) - 64))
        return file.read().rstrip().endswith(b"}")


def _free_bytes(folder: str) -> str:
    """'; N bytes free in FOLDER', or '' where the folder cannot be asked."""
    import shutil

    try:
        return f"; {shutil.disk_usage(folder).free:,} bytes free in {folder}"
    except OSError:
        return ""
