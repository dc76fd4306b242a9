"""Reads from a store under deadlines: a read that stalls or trickles is abandoned with one
line naming what was slow, so that a slow store cannot hold a training job indefinitely.

    got = watched(read, "s3://bucket/shards/train/manifest.json", size, Deadlines())

`read(progress)` runs on a thread and counts the bytes it receives; the caller waits by the
deadlines (`Deadlines`: connect and first byte, a minimum rate over a window, a total by the
object's size), and an expired one abandons the try. The deadlines are checked on the
caller's clock, outside the store's client, so they bound the whole read whatever that
client's own timeouts cover. Retrying an abandoned try is the caller's.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.shards.format import ShardError


@dataclass(frozen=True)
class Deadlines:
    """How long a read from the store may take: no first byte within `connect_s` +
    `first_byte_s` of asking, fewer than `min_rate` bytes a second over any `window_s`
    seconds after that, or more than `total(size)` seconds for the whole object, and the try
    is abandoned (then retried, then refused with one line naming the URL and what was slow)."""

    connect_s: float = 10.0
    first_byte_s: float = 30.0
    min_rate: int = 64 << 10
    window_s: float = 30.0

    def __post_init__(self) -> None:
        for name in ("connect_s", "first_byte_s", "min_rate", "window_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e12:
                raise ShardError(f"Deadlines.{name} must be a positive number, got {value!r:.40}")

    def total(self, size: int) -> float:
        """The most one object of `size` bytes may take, tries apart."""
        return self.connect_s + self.first_byte_s + self.window_s + size / self.min_rate


def watched(read, what: str | None, size: int, deadlines: Deadlines):
    """Run `read(progress)` on a thread (it adds each byte count it receives to
    `progress[0]`, and stops when `progress[1]` is set), waiting by `deadlines`; returns what it
    returns, raises what it raises, or a ShardError naming `what` (when given) and the
    deadline that expired. Progress is seen when `read` reports it: after each read() of a
    bounded size, so that a deadline is checked that often. An abandoned read is told to stop
    at its next chunk; its connection is the store's to close."""
    import threading
    import time
    from collections import deque

    progress: list = [0, False]
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["value"] = read(progress)
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread
            outcome["error"] = err

    thread = threading.Thread(target=run, name="shards-fetch", daemon=True)
    start = time.monotonic()
    thread.start()
    seen = deque([(start, 0)])
    first_byte = deadlines.connect_s + deadlines.first_byte_s
    total = deadlines.total(size)
    while thread.is_alive():
        thread.join(0.1)
        now, got = time.monotonic(), progress[0]
        elapsed = now - start
        problem = None
        if not got and elapsed > first_byte:
            problem = f"no data within {first_byte:g} s of asking (connect + first byte)"
        elif elapsed > total:
            problem = f"{got:,} of {size:,} bytes after {elapsed:.0f} s, over the {total:.0f} s allowed for its size"
        else:
            seen.append((now, got))
            while len(seen) > 1 and seen[1][0] <= now - deadlines.window_s:
                seen.popleft()
            since, then = seen[0]
            if got and now - since >= deadlines.window_s and (got - then) / (now - since) < deadlines.min_rate:
                problem = (
                    f"{(got - then) / (now - since):,.0f} bytes/s over the last {now - since:.0f} s, under "
                    f"the minimum of {deadlines.min_rate:,}"
                )
        if problem:
            progress[1] = True
            raise ShardError(f"{what}: {problem}" if what else problem)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
