"""The one rule for which samples a rank takes, in which order, and where a run resumes.

Every reader of the library draws its batches from a `ShardSampler`. An epoch's order
depends on the seed, the epoch and the shuffle only ("none", "samples", "shards"), never on
the number of ranks; the positions still due are cut into `world_size` contiguous runs whose
lengths differ by at most one, and every rank takes the same number of steps (DDP needs it).
The resume state is those runs minus what was taken: at most `world_size` intervals, cut
anew for another world size, so an interrupted epoch ends with every sample taken once
(docs/shards.md, "Shuffles, ranks and resuming").
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import TypedDict

import numpy as np
import torch
from torch.utils.data import Sampler

from pipeline.shards.format import ShardError

SHUFFLES = ("none", "samples", "shards")
MAX_INTERVALS = 1 << 16  # intervals in a resume state: far above any world size
# numpy's seed range, which params.yaml's seeds take too (core.bounds.SEED: not imported here,
# it loads pydantic, which the shard library does not need)
SEED_MAX = (1 << 32) - 1
EPOCHS = 1_000_003  # epochs 0..EPOCHS-1 per seed: below it no two (seed, epoch) share a shuffle

Interval = tuple[int, int]


def epoch_seed(seed: int, epoch: int) -> int:
    """The one mix of (seed, epoch) behind every shuffle (`ShardSampler`): runs repeat
    exactly and epochs differ."""
    return seed * EPOCHS + epoch


def check_epoch(epoch: object, what: str) -> None:
    """Refuse an epoch number outside 0..EPOCHS-1 (a ShardError naming `what`)."""
    if type(epoch) is not int or not 0 <= epoch < EPOCHS:
        raise ShardError(f"{what} must be an integer in 0..{EPOCHS - 1}, got {epoch!r:.40}")


def shuffle_mode(shuffle: bool | str) -> str:
    """`shuffle` as one of SHUFFLES: True means "samples", False "none"."""
    if shuffle is True:
        return "samples"
    if shuffle is False:
        return "none"
    if shuffle not in SHUFFLES:
        raise ShardError(f"shuffle must be True, False or one of {SHUFFLES}, got {shuffle!r:.40}")
    return shuffle


def epoch_order(
    count: int, epoch: int, *, shuffle: str, seed: int, shard_counts: Sequence[int] | None = None
) -> np.ndarray:
    """Every sample index of a split of `count` samples, once, in `epoch`'s order (int64)."""
    if shuffle == "none":
        return np.arange(count, dtype=np.int64)
    generator = torch.Generator().manual_seed(epoch_seed(seed, epoch))
    if shuffle == "samples":
        return torch.randperm(count, generator=generator).numpy()
    counts = list(shard_counts or [count])
    starts = np.concatenate(([0], np.cumsum(counts, dtype=np.int64)))
    parts = [
        starts[shard] + torch.randperm(counts[shard], generator=generator).numpy()
        for shard in torch.randperm(len(counts), generator=generator).tolist()
    ]
    return np.concatenate(parts)  # never empty: an empty split is one shard of 0 samples


def cut(due: Sequence[Interval], world_size: int) -> list[list[Interval]]:
    """The positions in `due` (ordered, disjoint intervals), cut into `world_size` contiguous
    runs, the first (total % world_size) one position longer; each run as intervals."""
    total = sum(b - a for a, b in due)
    base, extra = divmod(total, world_size)
    runs: list[list[Interval]] = []
    pieces = iter(due)
    current = next(pieces, (0, 0))
    for rank in range(world_size):
        want, run = base + (rank < extra), []
        while want:
            a, b = current
            take = min(want, b - a)
            if take:
                run.append((a, a + take))
                current, want = (a + take, b), want - take
            if current[0] == current[1]:
                current = next(pieces, (0, 0))
        runs.append(run)
    return runs


def _positions(run: list[Interval]) -> np.ndarray:
    if not run:
        return np.zeros(0, np.int64)
    return np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in run])


def _merge_intervals(intervals: list[Interval]) -> list[Interval]:
    """Sorted, with empty intervals gone and touching ones joined."""
    merged: list[Interval] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if merged and merged[-1][1] == a:
            merged[-1] = (merged[-1][0], b)
        else:
            merged.append((a, b))
    return merged


class Order(TypedDict, total=False):
    """A `ShardSampler`'s order keywords, for the calls that pass them on (`ShardDataset.sampler`
    and `.loader`): their rules and defaults are the sampler's."""

    shuffle: bool | str
    seed: int
    rank: int
    world_size: int
    drop_last: bool


class ShardSampler(Sampler[np.ndarray]):
    """Batches of sample indices (int64 arrays) for one rank, epoch after epoch, by the rule in
    this module's docstring; `state_dict(steps)` / `load_state_dict` resume mid-epoch, with the
    same or another world size.

    Give it to a plain DataLoader as `batch_sampler=` (the dataset's `__getitems__` then
    receives whole batches), or use `ShardDataset.loader`, which counts the batches your loop
    took for you. A DataLoader fetches ahead of your loop, so the sampler cannot know how many
    batches were used: pass that count to `state_dict`."""

    def __init__(
        self,
        count: int,
        batch_size: int,
        *,
        shuffle: bool | str = False,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = False,
        shard_counts: Sequence[int] | None = None,
    ) -> None:
        for name, value, low in (
            ("count", count, 0),
            ("batch_size", batch_size, 1),
            ("world_size", world_size, 1),
        ):
            if type(value) is not int or value < low:
                raise ShardError(f"{name} must be an integer of at least {low}, got {value!r:.40}")
        if type(seed) is not int or not 0 <= seed <= SEED_MAX:
            raise ShardError(f"seed must be an integer in 0..{SEED_MAX}, got {seed!r:.40}")
        if type(rank) is not int or not 0 <= rank < world_size:
            raise ShardError(f"rank {rank!r:.40} is outside 0..{world_size - 1}")
        if not isinstance(drop_last, bool | np.bool_):
            raise ShardError(f"drop_last must be True or False, got {drop_last!r:.40}")
        self.shuffle = shuffle_mode(shuffle)
        if shard_counts is not None and (
            not isinstance(shard_counts, Sequence | np.ndarray)
            or not all(isinstance(n, int | np.integer) and not isinstance(n, bool) for n in shard_counts)
            or sum(shard_counts) != count
            or min(shard_counts, default=1) < 1
        ):
            raise ShardError(f"shard_counts must be positive and add up to count {count} (integers, one per shard)")
        if self.shuffle == "shards" and shard_counts is None:
            raise ShardError('shuffle "shards" needs the shard_counts of the split')
        self.count, self.batch_size, self.seed = count, batch_size, seed
        self.rank, self.world_size, self.drop_last = rank, world_size, bool(drop_last)
        self.shard_counts = list(shard_counts) if shard_counts is not None else None
        self.epoch = 0
        self.due = self._whole()
        self.plan: tuple[int, list[Interval]] | None = None  # (epoch, due) of the iteration started last

    def _whole(self) -> list[Interval]:
        """A fresh epoch's positions due: the whole split as one interval, none when it is empty
        (an empty interval is not a position a saved state may hold)."""
        return [(0, self.count)] if self.count else []

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` from its beginning at the next iteration."""
        check_epoch(epoch, "epoch")
        self.epoch, self.due, self.plan = epoch, self._whole(), None

    def _runs(self, due: list[Interval]) -> list[list[Interval]]:
        return cut(due, self.world_size)

    def steps(self, due: list[Interval]) -> int:
        """Steps every rank takes over `due`: the longest run's batches (the shortest's, whole
        batches only, with drop_last)."""
        total = sum(b - a for a, b in due)
        shortest, longest = total // self.world_size, -(-total // self.world_size)
        return shortest // self.batch_size if self.drop_last else math.ceil(longest / self.batch_size)

    def batch_total(self, due: list[Interval], step: int) -> int:
        """Samples all ranks together take at `step` of an iteration over `due`: what a loss
        averaged over the global batch divides by (the last step's may be smaller)."""
        total = sum(b - a for a, b in due)
        base, extra = divmod(total, self.world_size)
        done = step * self.batch_size
        return sum(min(self.batch_size, max(0, base + (r < extra) - done)) for r in range(self.world_size))

    def __len__(self) -> int:
        """Batches the next iteration yields (the same on every rank)."""
        return self.steps(self.due)

    def order(self, epoch: int) -> np.ndarray:
        """Epoch `epoch`'s order of the whole split (every rank's)."""
        return epoch_order(self.count, epoch, shuffle=self.shuffle, seed=self.seed, shard_counts=self.shard_counts)

    def rank_order(self, epoch: int | None = None) -> np.ndarray:
        """The sample indices this rank takes in the next iteration (or a fresh `epoch`), in order."""
        due = self.due if epoch is None else self._whole()
        epoch = self.epoch if epoch is None else epoch
        mine = _positions(self._runs(due)[self.rank])[: self.steps(due) * self.batch_size]
        return self.order(epoch)[mine]

    def __iter__(self) -> Iterator[np.ndarray]:
        """The iteration's batches; its plan is set here, so `state_dict(0)` works before the
        first batch is asked for."""
        epoch, due = self.epoch, list(self.due)
        mine = self.rank_order()
        self.plan = (epoch, due)
        return self._batches(epoch, due, mine)

    def _batches(self, epoch: int, due: list[Interval], mine: np.ndarray) -> Iterator[np.ndarray]:
        for step in range(self.steps(due)):
            yield mine[step * self.batch_size : (step + 1) * self.batch_size]
        self.epoch, self.due = epoch + 1, self._whole()

    def after(self, epoch: int, due: list[Interval], steps: int) -> tuple[int, list[Interval]]:
        """(epoch, positions still due) once every rank took `steps` batches of the plan."""
        total = self.steps(due)
        if type(steps) is not int or not 0 <= steps <= total:
            raise ShardError(f"steps must be 0..{total} for this epoch, got {steps!r:.40}")
        if steps == total:
            return epoch + 1, self._whole()
        left = []
        for run in self._runs(due):
            skip = steps * self.batch_size
            for a, b in run:
                take = min(skip, b - a)
                left.append((a + take, b))
                skip -= take
        return epoch, _merge_intervals(left)

    def state_dict(self, steps: int | None = None) -> dict:
        """Where the next batch comes from, with what fixes the order; the same on every rank.
        `steps`: the batches your loop took of the iteration started last (a DataLoader fetches
        ahead, so the sampler cannot count them); None: where the next iteration starts."""
        if steps is None:
            epoch, due = self.epoch, self.due
        elif self.plan is None:
            raise ShardError("no iteration was started: state_dict(steps) counts the batches taken of one")
        else:
            epoch, due = self.after(*self.plan, steps)
        return self.state(epoch, due)

    def state(self, epoch: int, due: list[Interval]) -> dict:
        return {
            "epoch": epoch,
            "due": [list(i) for i in due],
            "seed": self.seed,
            "shuffle": self.shuffle,
            "count": self.count,
            "shard_counts": self.shard_counts,
            "drop_last": self.drop_last,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from `state` (any world size and batch size); refused with a ShardError
        naming the key when it was saved for another order (seed, shuffle, split size, shards)."""
        if not isinstance(state, dict):
            raise ShardError(f"data position: expected a dict, got {type(state).__name__}")
        ours = self.state_dict()
        for key in ("seed", "shuffle", "count", "shard_counts", "drop_last"):
            if state.get(key) != ours[key]:
                raise ShardError(
                    f"data position: saved with {key} {state.get(key)!r:.80}, this loader has "
                    f"{ours[key]!r:.80}; it cannot continue that sample order"
                )
        epoch = state.get("epoch")
        check_epoch(epoch, "data position: epoch")
        self.epoch, self.due, self.plan = epoch, self._checked_due(state.get("due")), None

    def _checked_due(self, due) -> list[Interval]:
        """The state's intervals: at most MAX_INTERVALS pairs of integers, ordered, disjoint,
        inside 0..count (one pass)."""
        if not isinstance(due, list) or len(due) > MAX_INTERVALS:
            raise ShardError(f"data position: due must be a list of at most {MAX_INTERVALS} intervals")
        out, last = [], 0
        for item in due:
            if not (
                isinstance(item, list | tuple)
                and len(item) == 2
                and all(type(v) is int for v in item)
                and last <= item[0] < item[1] <= self.count
            ):
                raise ShardError(
                    f"data position: due interval {item!r:.40} is not ordered, disjoint and inside 0..{self.count}"
                )
            out.append((item[0], item[1]))
            last = item[1]
        return out
