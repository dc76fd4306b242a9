"""The time budget of a training script left as it is: `python -m pipeline profile examples/plain_train.py ARGS`.

The script runs as `__main__`, unchanged. Two public hooks find its loop: every DataLoader
it iterates is watched, and torch.optim's global step hook says when an optimizer stepped;
the first loader with a step between its batches is the training loop's, and `TimeBudget`
takes its batches from then on. What it cannot see (no optimizer step inside a DataLoader's
iteration) ends with one line naming what the command needs (docs/budget.md, "A script
left as it is").
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import DataLoader

from pipeline.budget.timebudget import Budget, TimeBudget
from pipeline.budget.verdict import loader_seen
from pipeline.core.errors import InputError


class ProfileError(InputError):
    """The script gave the command nothing it can profile, or (with `budget`) failed after
    its window was profiled whole: the budget stands, the failure is said after it."""

    def __init__(self, message: str, budget: Budget | None = None) -> None:
        super().__init__(message)
        self.budget = budget


class WindowDone(BaseException):
    """Raised inside the script's loop once the window is profiled, to stop the script: a
    BaseException, so the script's own `except Exception` does not swallow it."""


class Refused(BaseException):
    """The command's own refusal (a ProfileError) raised inside the script's loop, carried
    past the script's `except Exception` and re-raised as it is."""

    def __init__(self, error: ProfileError) -> None:
        super().__init__(str(error))
        self.error = error


class TimedOut(BaseException):
    """Raised inside the script when `timeout_s` has passed (SIGALRM): a BaseException, for
    the same reason as WindowDone."""


def script_traceback(err: BaseException, script: Path) -> str:
    """The traceback of an exception the script raised, its own frames only (and the
    modules it called), without the command's and runpy's frames above them."""
    import traceback

    inside = str(Path(__file__).resolve().parents[1])  # the pipeline package
    shown = traceback.TracebackException.from_exception(err)
    shown.stack = traceback.StackSummary.from_list(
        [f for f in shown.stack if not f.filename.startswith(inside) and "runpy" not in Path(f.filename).name]
    )
    return "".join(shown.format())


@contextmanager
def deadline(seconds: float | None, waiting: Callable[[], bool] = lambda: True) -> Iterator[None]:
    """TimedOut raised in the main thread once `seconds` have passed while `waiting()` (the
    window not yet profiled) holds; none: no deadline. Off the main thread, where signals
    cannot be set, there is none either. A timer and handler set before are put back."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(*_: object) -> None:
        if waiting():
            raise TimedOut

    previous = signal.signal(signal.SIGALRM, expired)
    before = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        if previous is not None:
            signal.signal(signal.SIGALRM, previous)
        if before[0] > 0:
            signal.setitimer(signal.ITIMER_REAL, *before)


class Watch:
    """What one profiled script run shares: the optimizer steps seen, the adopted loop, and
    the budget once there is one."""

    def __init__(self, device: torch.device | None, steps: int, skip: int, trace: str | None, keep_going: bool) -> None:
        self.device, self.steps, self.skip, self.trace, self.keep_going = device, steps, skip, trace, keep_going
        self.optimizer_steps = 0
        self.trained_on: torch.device | None = None  # where the optimizer's parameters live
        self.budget: TimeBudget | None = None
        self.loader: DataLoader | None = None  # the training loop's, once found
        self.loaders_seen = 0
        self.found_at = 0  # the loop's batches handed out when it was found

    def stepped(self, optimizer: torch.optim.Optimizer, *_: object) -> None:
        self.optimizer_steps += 1
        if self.trained_on is None:
            self.trained_on = next((p.device for group in optimizer.param_groups for p in group["params"]), None)

    def start(self) -> TimeBudget:
        """The budget, on the device the loop trains on (its optimizer's parameters'); a
        --device that names another type is refused, not measured as the wrong device."""
        device = self.trained_on or torch.device("cpu")
        if self.device is not None and self.device.type != device.type:
            raise Refused(
                ProfileError(
                    f"--device {self.device}: the script's loop trains on {device} (its optimizer's "
                    f"parameters); give --device {device.type} or leave --device out"
                )
            )
        # --skip counts the script's steps from its first, as TimeBudget's skip does; the ones
        # spent finding the loop are among them (the window starts after them at the earliest).
        skip = max(0, self.skip - self.found_at)
        return TimeBudget(self.device or device, steps=self.steps, skip=skip, trace=self.trace)

    def watch(self, loader: DataLoader, batches: Iterator) -> Iterator:
        """A loader's batches, unchanged; the first loader found to train is taken into the
        budget, and its later epochs too until the window is profiled."""
        self.loaders_seen += 1
        if self.budget is not None and loader is self.loader:
            if self.budget.done and not self.keep_going:  # a window the loader's end cut short
                raise WindowDone
            if not self.budget.done:
                yield from self.measured(batches)
                return
        before = None  # optimizer steps when the last batch was handed out
        for before_count, batch in enumerate(batches):
            if self.budget is None and before is not None and self.optimizer_steps > before:
                self.loader, self.found_at = loader, before_count + 1
                self.budget = self.start()
                yield batch
                yield from self.measured(batches)
                return
            before = self.optimizer_steps
            yield batch

    def measured(self, batches: Iterator) -> Iterator:
        """The adopted loop's batches through the budget: a step from each batch handed out to
        the request for the next."""
        budget = self.budget
        step: AbstractContextManager | None = None
        timed = budget.batches(batches)
        try:
            while True:
                if step is not None:  # the loop asks for its next batch: its step has ended
                    step.__exit__(None, None, None)
                    step = None
                if budget.done and not self.keep_going:
                    raise WindowDone
                try:
                    batch = next(timed)
                except StopIteration:
                    return
                step = budget.step()
                step.__enter__()
                yield batch
        finally:
            if step is not None:
                step.__exit__(None, None, None)
            timed.close()


def seen(watch: Watch) -> str:
    """What the script did that the command watches, in words."""
    if watch.budget is not None:
        return (
            f"its loop was found after {watch.found_at} batches and ran {watch.budget.seen} more, "
            f"{watch.budget.skip} more to warm up and {watch.steps} to profile"
        )
    return (
        f"it iterated {watch.loaders_seen} DataLoader(s) and stepped an optimizer {watch.optimizer_steps} "
        "time(s), never between two batches of one loader"
    )


def profile_script(
    script: Path,
    args: list[str],
    device: str | torch.device | None = None,
    steps: int = 20,
    skip: int = 5,
    trace: str | None = None,
    keep_going: bool = False,
    timeout_s: float | None = None,
) -> Budget:
    """Run `script` with `args` as `__main__` and return the budget of its training loop's
    window of `steps` steps after `skip`, on `device` (None: the device its optimizer's
    parameters are on); ProfileError when the script ran no loop the command can see, stopped
    before the window's first step, raised (its traceback, its own frames, on stderr), did not
    compile, or had not finished the window after `timeout_s` seconds (then it is stopped).
    The working directory, sys.argv and sys.path are the caller's again afterwards."""
    script = Path(script)
    entry = script / "__main__.py" if script.is_dir() else script  # a folder runs as `python DIR` runs it
    if not entry.is_file():
        raise ProfileError(f"{script}: no such script (give the path of a Python file)")
    with open(entry, "rb") as head:  # Python raises SyntaxError or ValueError for NULs, by version
        if b"\0" in head.read(1 << 20):
            raise ProfileError(f"{entry}: not Python source (it holds NUL bytes: a binary file?)")
    watch = Watch(None if device is None else torch.device(device), steps, skip, trace, keep_going)
    after: str | None = None  # how the script failed once its window was whole (--keep-going)
    ended = ""  # said of a script that exited with status 0 before any loop
    original = DataLoader.__iter__

    def iterate(loader: DataLoader) -> Iterator:
        return watch.watch(loader, original(loader))

    hook = register_optimizer_step_post_hook(watch.stepped)
    DataLoader.__iter__ = iterate  # type: ignore[method-assign]
    saved_argv, saved_path, saved_cwd = sys.argv, list(sys.path), os.getcwd()
    sys.argv, sys.path[0:0] = [str(script), *args], [str(entry.resolve().parent)]
    try:
        with deadline(timeout_s, lambda: watch.budget is None or not watch.budget.done):
            runpy.run_path(str(script), run_name="__main__")
    except WindowDone:
        pass
    except Refused as refused:
        raise refused.error from None
    except TimedOut:
        if watch.budget is None or not watch.budget.done:
            raise ProfileError(
                f"{script}: stopped after {timeout_s:g} s (--timeout) before its window was profiled: {seen(watch)}"
            ) from None
    except SystemExit as end:  # `sys.exit(main())`: the script's end, after the window or before it
        ended = " it exited (status 0) before training, as after its --help;" if watch.budget is None else ""
        if end.code not in (None, 0):
            if watch.budget is None or not watch.budget.done:
                raise ProfileError(f"{script}: exited with status {end.code} before its loop was profiled") from None
            after = f"{script}: exited with status {end.code} after its window was profiled (--keep-going)"
    except SyntaxError as err:
        if err.filename and Path(err.filename).resolve() != entry.resolve():  # another module's
            print(script_traceback(err, script), end="", file=sys.stderr)
        where = f"{err.filename or script}" + (f":{err.lineno}" if err.lineno else "")
        raise ProfileError(f"{where}: SyntaxError: {err.msg} (the script does not compile)") from None
    except Exception as err:  # the script's own failure: its traceback, then the command's one line
        print(script_traceback(err, script), end="", file=sys.stderr)
        done = watch.budget is not None and watch.budget.done
        if done and not watch.budget.result.partial:  # --keep-going: the window was whole
            after = f"{script}: raised {type(err).__name__} after its window was profiled (above)"
        else:  # a window the exception cut short is done too, marked partial
            when = "inside its profiled window" if done else "before its loop was profiled"
            raise ProfileError(f"{script}: raised {type(err).__name__} {when} (above)") from None
    finally:
        DataLoader.__iter__ = original  # type: ignore[method-assign]
        hook.remove()
        sys.argv, sys.path[:] = saved_argv, saved_path
        os.chdir(saved_cwd)
    if watch.budget is None:
        raise ProfileError(
            f"{script}: found no training loop ({seen(watch)});{ended} the command finds the loop as a "
            "torch.utils.data.DataLoader whose batches a torch.optim optimizer steps between "
            "(a loop that replays a captured CUDA graph steps none per batch). Otherwise wrap the "
            "loop in TimeBudget (docs/budget.md)"
        )
    if not watch.budget.done:
        raise ProfileError(
            f"{script}: its training loop ended after {watch.found_at + watch.budget.seen} batches, "
            f"before the profiled window's first step (skip {skip}); lower --skip"
        )
    result = watch.budget.result
    result.loader = loader_seen(watch.loader)  # the budget took the loader's iterator, not the DataLoader
    if after is not None:
        raise ProfileError(after, budget=result)
    return result
