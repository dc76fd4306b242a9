"""The Ray cluster the data stages' `engine: ray` runs on, and what its task failures become.

Ray is an extra (`pip install 'trainpath[ray]'`), never in the base install, so it is
imported here only, when a stage asks for it; without it the stage stops with one line. The
cluster is the one `RAY_ADDRESS` names (`ray start --head` on a real one), else a local one
started for this run and shut down after it. A task's own error (bad input) comes back as
its one line; a task whose worker died more often than Ray retries it becomes `PartLost`,
one line naming the part, and the stage writes nothing.

Every wait on Ray has a deadline. Ray's own join retries for many minutes where nothing (or
no Ray) answers at `RAY_ADDRESS`, in native code that holds off Ctrl-C and SIGTERM; so the
address is first tried with a plain TCP connect (a closed port or an unknown host: one line
at once), then Ray joins on a thread of its own while this one waits in short slices, at
most `PIPELINE_RAY_CONNECT_S` seconds (Ctrl-C and SIGTERM end the wait at once). A task's
result is waited for at most `TASK_S` seconds after the one before it.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pipeline.core.errors import InputError, reason

RETRIES = 3  # Ray reruns a task whose worker or node died this many times (its own errors: never)
CONNECT_ENV = "PIPELINE_RAY_CONNECT_S"
CONNECT_S = 60.0  # the most joining RAY_ADDRESS's cluster may take (a live one answers within seconds)
PROBE_S = 10.0  # the TCP connect that first tries RAY_ADDRESS's host and port
TASK_S = 600.0  # the most one task's result may take after the one before it (a task is seconds of work)


class PartLost(InputError):
    """A part of the output that never arrived: its task's worker died on every try, or the
    cluster went away. One line naming the part; nothing is merged or published."""


def ray_module() -> Any:
    """`ray`, or one line saying how to install it."""
    try:
        import ray
    except ImportError:
        raise InputError(
            "engine: ray needs Ray, which is not installed: pip install 'trainpath[ray]' (or set "
            "the stage's engine back to local in params.yaml)"
        ) from None
    return ray


@contextmanager
def cluster() -> Iterator[Any]:
    """`ray`, connected: to the cluster already joined by this process, to `RAY_ADDRESS`'s
    (within `connect_deadline()` seconds), or to a local one started here (and shut down on
    the way out). SIGTERM ends the stage as Ctrl-C does, its outputs untouched."""
    ray = ray_module()
    if ray.is_initialized():
        yield ray
        return
    address = os.environ.get("RAY_ADDRESS") or "local"
    with _sigterm_exits():
        if address == "local":  # (never the cluster a `ray start` last recorded here: it may be long gone)
            try:
                ray.init(address="local", logging_level=logging.WARNING, log_to_driver=False, include_dashboard=False)
            except (ConnectionError, RuntimeError, ValueError) as err:
                raise InputError(
                    f"no local Ray cluster could be started here ({reason(err)}); set RAY_ADDRESS "
                    f"to a running cluster's, or the stage's engine back to local"
                ) from None
        else:
            join_cluster(ray, address, connect_deadline())
        try:
            yield ray
        finally:
            ray.shutdown()


def connect_deadline() -> float:
    """`PIPELINE_RAY_CONNECT_S` (seconds, a number in (0, 3600]), else CONNECT_S."""
    raw = os.environ.get(CONNECT_ENV)
    if raw is None:
        return CONNECT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value <= 3600:
        raise InputError(
            f"{CONNECT_ENV}={raw!r:.40}: expected the seconds joining a Ray cluster may take, a number in (0, 3600]"
        )
    return value


def join_cluster(ray: Any, address: str, deadline_s: float) -> None:
    """Join the cluster at `address` within `deadline_s` seconds, else one line. The address
    is first tried with a TCP connect; then `ray.init` runs on a thread of its own (Ray's join
    retries for minutes in native code, where no signal reaches Python) while this thread
    waits in short slices. An attempt given up on cannot be stopped: its thread keeps
    retrying until the process ends, its writes to file descriptor 2 sent to /dev/null so
    that the stage's own line is the last on stderr (Python's `sys.stderr` writes on)."""
    probe(address)
    print(f"RAY_ADDRESS={address}: joining its Ray cluster (at most {deadline_s:g} s)", file=sys.stderr, flush=True)
    outcome: list[BaseException | None] = []

    def attempt() -> None:
        try:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
            outcome.append(None)
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread as it is
            outcome.append(err)

    quiet = _NotMainThreadWarning()
    worker_log = logging.getLogger("ray._private.worker")
    worker_log.addFilter(quiet)  # "SIGTERM handler is not set ...": the stage sets its own
    thread = threading.Thread(target=attempt, name="ray-join", daemon=True)
    try:
        thread.start()
        end = time.monotonic() + deadline_s
        while thread.is_alive() and time.monotonic() < end:
            thread.join(0.1)
        if thread.is_alive():
            raise InputError(
                f"RAY_ADDRESS={address}: no Ray cluster to join there (no answer within {deadline_s:g} "
                f"s, {CONNECT_ENV}); is a Ray head listening at that address?"
            )
    except BaseException:
        if thread.is_alive():
            _mute_descriptor_2()
        raise
    finally:
        worker_log.removeFilter(quiet)
    err = outcome[0] if outcome else None
    if isinstance(err, (ConnectionError, RuntimeError, ValueError, TimeoutError)):
        raise InputError(f"RAY_ADDRESS={address}: no Ray cluster to join there ({reason(err)})") from None
    if err is not None:
        raise err


def probe(address: str) -> None:
    """RAY_ADDRESS's `[scheme://]host:port` accepts a TCP connection within PROBE_S, else one
    line (a closed port, an unknown host, a host that does not answer). Ray's own words
    (`auto`) and forms it parses itself are left to Ray."""
    rest = address.split("://", 1)[-1].rstrip("/")
    host, colon, port = rest.rpartition(":")
    if not colon or not port.isdigit() or not 0 < int(port) < 65536:
        return
    try:
        socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=PROBE_S).close()
    except OSError as err:
        raise InputError(f"RAY_ADDRESS={address}: no Ray cluster to join there ({reason(err)})") from None


class _NotMainThreadWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("SIGTERM handler is not set")


def _mute_descriptor_2() -> None:
    """Send what is still written to file descriptor 2 (Ray's native client, retrying on an
    abandoned thread) to /dev/null, and give Python's `sys.stderr` a descriptor of its own on
    the same destination as before."""
    try:
        sys.stderr.flush()
        own = os.dup(2)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)
        sys.stderr = open(
            own, "w", buffering=1, encoding=getattr(sys.stderr, "encoding", None) or "utf-8", errors="backslashreplace"
        )
    except (OSError, ValueError):  # no descriptor 2, or a stderr replaced by the caller: leave it
        pass


@contextmanager
def _sigterm_exits() -> Iterator[None]:
    """On the main thread, SIGTERM raises SystemExit (143) for as long as the stage waits on
    Ray, as Ctrl-C raises KeyboardInterrupt: the wait ends at once and no output changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def exit_now(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    before = signal.signal(signal.SIGTERM, exit_now)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def gather(ray: Any, refs: list[Any], names: list[str]) -> list[Any]:
    """Every task's result, in order. The first that failed stops the rest (cancelled, and
    waited for, so that none writes after this returns) and is raised as one line: its own
    InputError as it is, a lost worker or node as `PartLost` naming the task."""
    results = []
    try:
        for ref, name in zip(refs, names):
            results.append(result(ray, ref, name))
    except BaseException:
        stop(ray, refs)
        raise
    return results


def result(ray: Any, ref: Any, name: str) -> Any:
    """One task's result, within TASK_S seconds; its failure as one line."""
    try:
        return ray.get(ref, timeout=TASK_S)
    except ray.exceptions.GetTimeoutError:
        raise PartLost(
            f"{name} never arrived: no result within {TASK_S:g} s (the task is stuck, or the cluster "
            f"answers no more); nothing was merged or published"
        ) from None
    except ray.exceptions.RayTaskError as err:
        cause = getattr(err, "cause", None)
        if isinstance(cause, InputError):
            raise cause from None
        raise  # a bug in the task: its traceback is wanted
    except ray.exceptions.RayError as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise PartLost(
            f"{name} never arrived: {type(err).__name__} after {RETRIES} retries ({first[:160]}); "
            f"nothing was merged or published"
        ) from None


def stop(ray: Any, refs: list[Any]) -> None:
    """Cancel the tasks still running and wait until each has ended."""
    for ref in refs:
        try:
            ray.cancel(ref, force=True)
        except Exception:  # noqa: BLE001 - a task that already ended cannot be cancelled
            pass
    ray.wait(refs, num_returns=len(refs), timeout=60)
