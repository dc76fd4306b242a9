"""Whether torch's intra-op threads fight for cores: a few steps re-timed on one thread.

On a host whose cores are busy (other jobs, DataLoader workers, a second training run),
torch's intra-op threads wait for each other at every parallel op, and the profiler counts
that wait as time inside the op: the step looks compute-bound while it mostly waits. The
direct test is to time the same loop on one thread: after the profiled window, blocks of
steps alternate between the loop's own thread count and one thread (interleaved, so a
change of load hits both), each timed on a plain clock from the request for its batch to
the end of its step. When one thread is clearly faster, the threads contend.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass

from pipeline.budget.peak import usable_cores

CONTENDED = 1.5  # one thread this many times faster than the loop's own count: contention


@dataclass(frozen=True)
class ThreadCheck:
    """Median seconds per loop iteration at the loop's intra-op threads and on one thread."""

    threads: int
    step_s: float
    one_thread_s: float
    steps: int  # iterations timed on each side
    cores: int  # cores this process may use
    load: float | None  # the host's one-minute load average at the end
    fastest_s: float | None = None  # the fastest step at the loop's threads
    one_fastest_s: float | None = None  # the fastest step on one thread
    mean_s: float | None = None  # the mean step at the loop's threads (set beside a window's mean)

    @property
    def contended(self) -> bool:
        """One thread runs the loop CONTENDED times faster than its own thread count, by the
        medians and by the fastest steps alike: a heavier step some iterations take (a
        validation pass, a checkpoint) that lands on one side moves its median, never both."""
        fastest = self.fastest_s is None or self.one_fastest_s * CONTENDED < self.fastest_s
        return fastest and self.one_thread_s * CONTENDED < self.step_s

    @property
    def slowdown(self) -> float:
        """The loop's own thread count against one thread (2.0: twice as slow)."""
        return self.step_s / self.one_thread_s if self.one_thread_s > 0 else 1.0


def plan(threads: int, block: int, rounds: int = 2) -> list[int]:
    """The thread count of each re-timed step: `rounds` times a block at `threads` then a
    block on one thread; empty where the loop already runs on one thread."""
    if threads <= 1 or block < 1:
        return []
    return ([threads] * block + [1] * block) * rounds


def thread_check(timed: list[tuple[int, float]], threads: int) -> ThreadCheck | None:
    """The check from (thread count, seconds) pairs; None unless both sides were timed."""
    own = [s for n, s in timed if n == threads]
    one = [s for n, s in timed if n == 1]
    if not own or not one:
        return None
    try:
        load: float | None = round(os.getloadavg()[0], 2)
    except OSError:
        load = None
    return ThreadCheck(
        threads=threads,
        step_s=round(statistics.median(own), 6),
        one_thread_s=round(statistics.median(one), 6),
        steps=min(len(own), len(one)),
        cores=usable_cores(),
        load=load,
        fastest_s=round(min(own), 6),
        one_fastest_s=round(min(one), 6),
        mean_s=round(statistics.fmean(own), 6),
    )
