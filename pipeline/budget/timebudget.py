"""`TimeBudget`, where any training loop's step time goes, and `Budget`, what it found.

The wrapper takes a loop's batches and marks its step; a window of steps runs under the
profiler (`trace`, `intervals`), and on the CPU a few more steps are re-timed on one thread
(`threads`). The budget then holds the parts per step with the evidence a verdict needs: the
ops or kernels per step, the FLOPs the profiler counted against this device's measured peak
(`peak`), the thread check, and the machine's name.
"""

from __future__ import annotations

import contextlib
import os
import textwrap
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from pipeline.budget.intervals import PARTS
from pipeline.budget.machine import fingerprint
from pipeline.budget.peak import Peak, device_peak
from pipeline.budget.threads import ThreadCheck, plan, thread_check
from pipeline.budget.trace import RANGE, QuietProfiler, export_trace, sync, window_parts
from pipeline.budget.units import duration
from pipeline.budget.verdict import LoaderSeen, loader_seen
from pipeline.core.errors import InputError

if TYPE_CHECKING:
    from pipeline.budget.verdict import LadderQuote


def _check_trace_path(path: str) -> None:
    """A trace can be written at `path`: its folder exists and it is not itself a folder,
    said when the budget is made, not after the window it would hold."""
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        raise BudgetError(f"trace {path}: the folder {folder} does not exist")
    if os.path.isdir(path):
        raise BudgetError(f"trace {path}: is a folder; give the trace file's path")


def checked_device(device: str | torch.device, what: str = "device", auto: bool = False) -> torch.device:
    """`device` as a torch.device this machine has; one line (InputError) otherwise, before
    anything runs: a device that is not here fails at construction, never after warm-up.
    `what` names the setting in the message (`--device` for a command whose `auto` exists)."""
    try:
        chosen = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise InputError(
            f"{what} {str(device)[:40]!r}: not a torch device; use {'auto, ' if auto else ''}cpu, cuda or cuda:N"
        ) from None
    if chosen.type == "cuda":
        if not torch.cuda.is_available():
            build = f"torch {torch.__version__}" + ("" if torch.version.cuda else ", a build without CUDA")
            fix = f"{what} cpu, or auto" if auto else "cpu"
            raise InputError(f"{what} {device}: no CUDA device is usable here ({build}); use {fix}")
        if chosen.index is not None and chosen.index >= torch.cuda.device_count():
            raise InputError(
                f"{what} {device}: this machine has {torch.cuda.device_count()} CUDA device(s), numbered from 0"
            )
    elif chosen.type != "cpu":
        raise InputError(f"{what} {device}: only cpu and cuda devices are supported")
    return chosen


class BudgetError(InputError):
    """The own-loop API used in a way it cannot measure (a nested step, two windows at once,
    a loader that is not iterable), or `result` read before anything was measured: one line
    that says what the loop did and what to change."""


@dataclass
class Budget:
    """A profiled window's budget: seconds per step by part (`per_step`, as
    `intervals.per_step` returns it) and the evidence beside it."""

    per_step: dict
    device: str
    kernels_per_step: float | None = None  # device kernels launched per step (CUDA)
    flop_per_step: float | None = None  # what the profiler counts for matmuls, convolutions, ...
    peak_device_bytes: int | None = None  # the device memory's high-water mark in the window (CUDA)
    partial: bool = False  # the loader ended, or the loop left, before the window's end
    ops_per_step: float | None = None  # top-level torch ops the step called
    peak: Peak | None = None  # this device's measured matmul rates
    threads: ThreadCheck | None = None  # the same loop re-timed on one thread (CPU)
    machine: str | None = None  # the name of the machine measured
    intra_threads: int | None = None  # torch's intra-op threads during the window
    convolutions: bool | None = None  # a convolution op ran inside a step (trace.step_convolutions)
    loader: LoaderSeen | None = None  # the DataLoader batches() was given (verdict.loader_seen)
    graphs_per_step: float | None = None  # CUDA graphs the step replayed (trace.step_graph_launches)
    other_loaders_s: float = 0.0  # seconds per step waiting on other DataLoaders than the one wrapped
    low_precision: float | None = None  # the share of the counted FLOPs in bfloat16 / float16 ops
    compiled: bool = False  # the step ran torch.compile'd code: no thread check (it would recompile)

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
        """The part that takes the most of the step (the verdict weighs it with the evidence)."""
        shares = self.shares()
        return max(PARTS, key=shares.__getitem__)

    def achieved_flop_s(self) -> float | None:
        """The step's FLOPs (as counted) over its wall time; None where none were counted."""
        step = self.per_step["step_s"]
        return self.flop_per_step / step if self.flop_per_step and step > 0 else None

    def to_json(self) -> dict:
        """The figures, the shares, the evidence and the verdict: what a metrics file holds."""
        from pipeline.budget.verdict import diagnose

        peak = self.peak
        found = diagnose(self)
        return {
            "device": self.device,
            "machine": self.machine,
            **self.per_step,
            "share": {k: round(v, 4) for k, v in self.shares().items()},
            "bound": found.bounds[0],
            "largest_part": self.bound(),
            "verdict": found.label,
            "partial": self.partial,
            "intra_threads": self.intra_threads,
            "ops_per_step": self.ops_per_step,
            "kernels_per_step": self.kernels_per_step,
            "graphs_per_step": self.graphs_per_step,
            "flop_per_step": self.flop_per_step,
            "achieved_flop_s": self.achieved_flop_s(),
            "peak_flop_s": None if peak is None else peak.rates,
            "threads": None if self.threads is None else {**vars(self.threads), "contended": self.threads.contended},
            "peak_device_bytes": self.peak_device_bytes,
            "other_loaders_s": self.other_loaders_s,
            "low_precision": self.low_precision,
            "compiled": self.compiled,
        }

    def report(self, ladder: dict | LadderQuote | None = None, width: int = 100) -> str:
        """The step, its parts and the verdict (quoting `ladder`, a bench metrics document as
        read from its JSON or its `LadderQuote`, when given), wrapped at `width` columns."""
        from pipeline.budget.verdict import LABELS, LadderQuote, verdict

        if isinstance(ladder, dict) and isinstance(ladder.get("variants"), dict) and ladder["variants"]:
            ladder = LadderQuote.of(ladder)
        elif ladder is not None and not isinstance(ladder, LadderQuote):
            raise BudgetError(
                f"report(ladder): expected a bench metrics document (metrics/bench/<dataset>.json, read as a "
                f"dict with its 'variants'), got {type(ladder).__name__} {ladder!r:.40}"
            )
        parts = " | ".join(f"{LABELS[p]} {share:.0%}" for p, share in self.shares().items())
        extra = ""
        if self.device.startswith("cpu") and self.intra_threads is not None:
            extra += f", {self.intra_threads} thread{'s' if self.intra_threads != 1 else ''}"
        if self.kernels_per_step is not None:
            extra += f", {self.kernels_per_step:.0f} kernels"
        if self.graphs_per_step:
            extra += f" from {self.graphs_per_step:g} CUDA graph replay{'s' if self.graphs_per_step != 1 else ''}"
        if self.peak_device_bytes is not None:
            extra += f", peak device memory {self.peak_device_bytes / 2**20:.0f} MiB"
        cut = ", partial: the loop ended or stopped first" if self.partial else ""
        where = f"; {self.machine}" if self.machine else ""
        head = (
            f"step {duration(self.per_step['step_s'])} ({self.per_step['steps']} steps on {self.device}{extra}{cut}"
            f"{where}): {parts}"
        )
        # whole words only: a machine name (amd-epyc-2c-avx512bf16) or a path never split at a hyphen
        wrap = textwrap.TextWrapper(width, break_on_hyphens=False, break_long_words=False)
        lines = [wrap.wrap(head)] + [wrap.wrap(paragraph) for paragraph in verdict(self, ladder).split("\n")]
        return "\n".join(line for block in lines for line in block)

    def __str__(self) -> str:
        return self.report()


class _Windows:
    """The budget whose window is open in this process, if any: one at a time."""

    open: TimeBudget | None = None


class TimeBudget:
    """Where any training loop's step time goes: wrap its loader, mark its step.

        budget = TimeBudget("cuda")                 # or "cpu"; steps to profile, steps to skip
        for x, y in budget.batches(loader):         # the wait for each batch is timed
            with budget.step():                     # forward, backward, optimizer (copies too)
                ...
            if budget.done:
                break
        print(budget.result)                        # parts per step, the bound and what to try

    `result` is the budget once `done`; read before it (nothing measured yet, or a loop that
    ended before its window's first step) it raises `BudgetError`, one line saying how many
    batches and steps it saw and how many a budget needs. A loop that ends inside the window
    gives the steps it finished, marked `partial`. One step at a time (a `step()` inside a
    `step()` is refused), and one window at a time in a process (a window that would open
    while another budget's is open is refused where it starts).

    The first `skip` steps run untouched (warm-up, compilation, workers starting); the next
    `steps` run under `torch.profiler`, and the window's parts (see `intervals`) add up to
    its span. On the CPU, `threads_check` steps at the loop's intra-op thread count and as many
    on one thread follow, on a plain clock (0: none). After them the wrapper only counts.
    `copy()` marks a host-to-device copy the profiler cannot see as one (on CUDA, memcpys
    are found without it). With `trace`, the window is written as a Chrome/Perfetto trace
    with the ranges marked (`budget:step`, ...). `peak`: "measure" (this device's matmul
    peak, probed once per machine and cached: `peak.device_peak`), a `Peak`, or None (no
    peak: the verdict says its evidence is weaker).
    """

    def __init__(
        self,
        device: str | torch.device = "cpu",
        steps: int = 20,
        skip: int = 5,
        trace: str | None = None,
        flops: bool = True,
        threads_check: int = 6,
        peak: str | Peak | None = "measure",
    ) -> None:
        ints = all(type(n) is int for n in (steps, skip, threads_check))
        if not ints or steps < 1 or skip < 0 or threads_check < 0:
            raise InputError(
                f"steps must be an int >= 1 and skip and threads_check ints >= 0, got steps={steps!r}, "
                f"skip={skip!r}, threads_check={threads_check!r}"
            )
        if not (peak is None or peak == "measure" or isinstance(peak, Peak)):
            raise InputError(f"peak must be 'measure', a Peak or None, got {peak!r:.40}")
        if not (trace is None or (isinstance(trace, (str, os.PathLike)) and str(trace))):
            raise BudgetError(
                f"trace must be a file path (a str or a Path) or None, got {type(trace).__name__} {trace!r:.40}"
            )
        if trace is not None:
            _check_trace_path(os.fspath(trace))
        self.device = checked_device(device)
        self.steps, self.skip, self.trace, self.flops, self.peak = steps, skip, trace, flops, peak
        self.seen = 0  # batches handed out so far
        self._result: Budget | None = None
        self._steps_run = 0  # steps entered, inside the window or not
        self._in_step = False  # inside a step now (a step inside it is refused)
        self._loops = 0  # iterations of batches() started
        self._iterating = 0  # iterations of batches() under way
        self._profiler: QuietProfiler | None = None
        self._started = 0.0
        self._stepped = 0  # steps finished inside the window
        self._ended = 0.0  # when the last of them ended
        self._measured: Budget | None = None  # the window's budget, before the thread check
        self._threads = 0  # torch's intra-op threads when the window opened
        self._changed = False  # whether the thread check set another count since
        self._plan: list[int] = []  # thread counts of the steps still to re-time
        self._timed: list[tuple[int, float]] = []
        self._pending: tuple[int, float] | None = None  # (threads, start) of the step being re-timed
        self._threads_check = threads_check if self.device.type == "cpu" else 0
        self._loader: LoaderSeen | None = None  # what batches() was given, when a DataLoader

    @property
    def profiling(self) -> bool:
        return self._profiler is not None

    @property
    def done(self) -> bool:
        """The window is profiled, the thread check run, and `result` holds the budget."""
        return self._result is not None

    @property
    def result(self) -> Budget:
        """The budget, once `done` (partial where the loop ended inside the window); before
        that, BudgetError: what the loop did so far and what a budget needs. Never None."""
        if self._result is None:
            raise BudgetError(self._missing())
        return self._result

    def _missing(self) -> str:
        """Why there is no budget (yet): what the loop did, and what it needs to do."""
        if self.profiling:
            return (
                f"no budget yet: the profiled window has {self._stepped} of its {self.steps} steps; read "
                "`result` once `budget.done` is true or the loop has ended"
            )
        if self._measured is not None:
            planned = len(self._timed) + len(self._plan)
            return (
                f"no budget yet: the window is profiled and the thread check has re-timed {len(self._timed)} of "
                f"its {planned} steps; read `result` once `budget.done` is true or the loop has ended"
            )
        needs = (
            f"a budget needs at least skip + 1 = {self.skip + 1} batches with a step each "
            f"(skip + steps = {self.skip + self.steps} for a full window)"
        )
        if not self._loops:
            if self._steps_run:
                return (
                    f"no budget: budget.step() ran {self._steps_run} time(s) but no batch came through "
                    "budget.batches(), where the window opens; wrap the loader: "
                    "`for batch in budget.batches(loader):`"
                )
            return (
                "no budget: nothing ran through this budget; wrap the loader (`for batch in "
                "budget.batches(loader):`) and mark the step (`with budget.step():`)"
            )
        if self._iterating and self.seen <= self.skip:
            return (
                f"no budget yet: {self.seen} of the {self.skip} warm-up batches taken; the window of "
                f"{self.steps} steps opens after them"
            )
        if not self.seen:
            return f"no budget: the loader gave no batch; {needs}"
        if not self._steps_run:
            return (
                f"no budget: the loop took {self.seen} batch(es) from budget.batches() but never entered "
                "budget.step(); mark the step: `with budget.step():` around forward, backward and the "
                "optimizer's step"
            )
        if self.seen <= self.skip:
            return (
                f"no budget: the loader ended after {self.seen} batch(es) and {self._steps_run} step(s), all "
                f"in the warm-up (skip={self.skip}); {needs}: give a longer loader or a lower skip"
            )
        return (
            f"no budget: the loop took {self.seen} batches and ran {self._steps_run} steps, none of them "
            f"finished inside the profiled window (it opens at batch {self.skip + 1}); end each step before "
            "taking the next batch"
        )

    def batches(self, loader: Iterable) -> Iterator:
        """`loader`'s items, unchanged; inside the window each wait for one is marked. The
        generator that opened the window closes it if the loader ends or the loop leaves
        first: the budget then covers the steps finished, marked `partial`. A `loader` that
        cannot be iterated is refused here, before the loop starts."""
        if not isinstance(loader, Iterable) and not hasattr(type(loader), "__getitem__"):
            raise BudgetError(
                f"budget.batches(loader): loader must be iterable (a DataLoader, a list of batches, a "
                f"generator), got {type(loader).__name__} {loader!r:.40}"
            )
        return self._batches(loader)

    def _batches(self, loader: Iterable) -> Iterator:
        self._loader = loader_seen(loader) or self._loader
        items = iter(loader)
        opened = False
        self._loops += 1
        self._iterating += 1
        try:
            while True:
                self._retimed()
                if self.seen == self.skip and self._result is None and self._measured is None and not self.profiling:
                    self._start()
                    opened = True
                if self._plan:
                    self._set_threads(self._plan[0])
                    self._pending = (self._plan[0], time.perf_counter())
                try:
                    if self._profiler is None:
                        item = next(items)
                    else:
                        with torch.profiler.record_function(RANGE + "data_wait"):
                            item = next(items)
                except StopIteration:
                    self._pending = None
                    return
                self.seen += 1
                yield item
        finally:
            self._iterating -= 1
            if opened and self._profiler is not None:
                if self.device.type == "cuda" and self._stepped:
                    with torch.profiler.record_function(RANGE + "step"):  # the last step's queued work
                        sync(self.device)
                    self._ended = time.perf_counter()
                self._stop(self._stepped, partial=True)
            self._retimed()
            self._finish()

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """Marks one train step; the window's last one waits for the device inside it. A
        step inside a step is refused where the inner one starts (BudgetError)."""
        if self._in_step:
            raise BudgetError(
                "budget.step() inside budget.step(): one step at a time; mark each step once, "
                "around forward, backward and the optimizer's step (budget.copy() marks a copy "
                "inside it)"
            )
        self._in_step = True
        self._steps_run += 1
        try:
            with self._marked_step():
                yield
        finally:
            self._in_step = False

    @contextlib.contextmanager
    def _marked_step(self) -> Iterator[None]:
        if self._profiler is None:
            try:
                yield
            finally:
                self._retimed()
            if self._measured is not None and not self._plan:
                self._finish()
            return
        last = self._stepped + 1 == self.steps
        with torch.profiler.record_function(RANGE + "step"):
            yield
            if last:
                sync(self.device)
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
        """Opens the window; refused (BudgetError) while another budget's window is open in
        this process: torch runs one profiler at a time, and each would lose the other's events."""
        other = _Windows.open
        if other is not None and other is not self:
            raise BudgetError(
                f"another TimeBudget's window is open (a window of {other.steps} steps on "
                f"{other.device}): one window at a time; let it finish (its `done`) before this "
                "budget's window opens, or give this one a larger skip"
            )
        self._threads = torch.get_num_threads()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        sync(self.device)
        self._profiler = QuietProfiler(self.device, flops=self.flops)
        self._profiler.__enter__()
        _Windows.open = self
        self._started = time.perf_counter()

    def _stop(self, steps: int, partial: bool = False) -> None:
        wall = self._ended - self._started  # to the end of the last step finished
        quiet, self._profiler = self._profiler, None
        if _Windows.open is self:
            _Windows.open = None
        quiet.__exit__(None, None, None)
        if steps < 1:
            return
        window = window_parts(list(quiet.profiler.events()), steps, wall, self.device, self.flops)
        cuda = self.device.type == "cuda"
        self._measured = Budget(  # every figure the window read, as the budget's own
            device=str(self.device),
            peak_device_bytes=torch.cuda.max_memory_allocated(self.device) if cuda else None,
            partial=partial,
            **vars(window),
        )
        if self.trace:
            export_trace(quiet.profiler, self.trace)
        # A compiled step's graph is guarded on the thread count: changing it would recompile
        # inside the re-timed steps (seconds against milliseconds) and cost the loop a recompile.
        if not partial and not window.compiled:
            self._plan = plan(self._threads, self._threads_check // 2 or 0) if self._threads_check else []
        if not self._plan:
            self._finish()

    def _set_threads(self, count: int) -> None:
        if count != torch.get_num_threads():
            torch.set_num_threads(count)
            self._changed = True

    def _restore_threads(self) -> None:
        """The loop's own thread count back, if the check changed it (and only then)."""
        if self._changed:
            torch.set_num_threads(self._threads)
            self._changed = False

    def _retimed(self) -> None:
        """Records the step being re-timed, if any, and puts the loop's own thread count back."""
        if self._pending is None:
            return
        threads, start = self._pending
        self._pending = None
        self._timed.append((threads, time.perf_counter() - start))
        if self._plan:
            self._plan.pop(0)
        self._restore_threads()

    def _finish(self) -> None:
        """The budget, with its evidence, once the window and the thread check are over."""
        if self._result is not None or self._measured is None:
            return
        self._plan = []
        self._restore_threads()
        budget = self._measured
        budget.threads = thread_check(self._timed, self._threads)
        budget.intra_threads = self._threads if self.device.type == "cpu" else None
        budget.machine = fingerprint(self.device.type).name
        budget.loader = self._loader
        if isinstance(self.peak, Peak):
            budget.peak = self.peak
        elif self.peak == "measure" and budget.flop_per_step:
            try:
                budget.peak = device_peak(self.device)
            except (RuntimeError, MemoryError):  # no room to probe (a full GPU): no peak, and the verdict says so
                budget.peak = None
        self._result = budget
