"""The Ray cluster the data stages' `engine: ray` runs on, and what its task failures become.

Ray is an extra (`pip install 'trainpath[ray]'`), never in the base install, so it is
imported here only, when a stage asks for it; without it the stage stops with one line. The
cluster is the one `RAY_ADDRESS` names (`ray start --head` on a real one), else a local one
started for this run and shut down after it. A task's own error (bad input) comes back as
its one line; a task whose worker died more often than Ray retries it becomes `PartLost`,
one line naming the part, and the stage writes nothing.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pipeline.core.errors import InputError, reason

RETRIES = 3   # Ray reruns a task whose worker or node died this many times (its own errors: never)


class PartLost(InputError):
    """A part of the output that never arrived: its task's worker died on every try, or the
    cluster went away. One line naming the part; nothing is merged or published."""


def ray_module() -> Any:
    """`ray`, or one line saying how to install it."""
    try:
        import ray
    except ImportError:
        raise InputError("engine: ray needs Ray, which is not installed: pip install 'trainpath[ray]' (or set "
                         "the stage's engine back to local in params.yaml)") from None
    return ray


@contextmanager
def cluster() -> Iterator[Any]:
    """`ray`, connected: to the cluster already joined by this process, to `RAY_ADDRESS`'s, or
    to a local one started here (and shut down on the way out)."""
    ray = ray_module()
    if ray.is_initialized():
        yield ray
        return
    address = os.environ.get("RAY_ADDRESS") or None
    local = {} if address else {"include_dashboard": False}
    try:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False, **local)
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise InputError(f"RAY_ADDRESS={address}: no Ray cluster to join there ({reason(err)})") from None
    try:
        yield ray
    finally:
        ray.shutdown()


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
    """One task's result; its failure as one line."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as err:
        cause = getattr(err, "cause", None)
        if isinstance(cause, InputError):
            raise cause from None
        raise  # a bug in the task: its traceback is wanted
    except ray.exceptions.RayError as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise PartLost(f"{name} never arrived: {type(err).__name__} after {RETRIES} retries ({first[:160]}); "
                       f"nothing was merged or published") from None


def stop(ray: Any, refs: list[Any]) -> None:
    """Cancel the tasks still running and wait until each has ended."""
    for ref in refs:
        try:
            ray.cancel(ref, force=True)
        except Exception:  # noqa: BLE001 - a task that already ended cannot be cancelled
            pass
    ray.wait(refs, num_returns=len(refs), timeout=60)
