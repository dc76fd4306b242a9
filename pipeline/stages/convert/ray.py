"""The convert stage on Ray (`convert.engine: ray`): the CSV cut into blocks of whole lines,
each parsed and checked by a Ray task, the blocks written in order by the stage's own writer.

Why the same Parquet as the local engine: the compact writer packs whatever blocks it is
given into row groups of exactly `convert.row_group_rows`, so the file's bytes do not depend
on who parsed the blocks; the wide layout is written from the CSV by polars, as locally.
What runs on the cluster is the parsing and checking; the encoding of the compact file
stays in the stage's process, which holds at most a window of blocks (two per CPU of the
cluster) whatever the file's size. A bad line is named by rereading the file with the local
reader (`iter_csv`), which counts lines; a task knows only its block. The CSV must be where
every node reads it (a shared file system, mounted at the same path on each).
"""

from __future__ import annotations

import os
import sys
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.bounded import open_regular
from pipeline.core.dataset import CSV_LINE_MAX
from pipeline.core.errors import DataError
from pipeline.stages.convert.csvread import iter_csv, parse_lines
from pipeline.stages.csvdata import is_header
from pipeline.stages.ray_cluster import RETRIES, cluster, result, stop

BLOCK_BYTES = 16 << 20  # a task's share of the CSV, as the local reader's blocks

Blocks = Iterator[tuple[np.ndarray, np.ndarray]]


def parse_range(csv_path: str, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
    """Bytes `start`..`end` of the CSV (whole lines), parsed and checked: a Ray task's work."""
    with open_regular(Path(csv_path), Path(csv_path).parent) as f:  # the local reader's rule
        f.seek(start)
        block = f.read(end - start)
    return parse_lines(Path(csv_path), block)


def _next_line(f: Any, at: int) -> int | None:
    """Where the first line starting at or after byte `at` begins (None: no newline within the
    longest line a row can have, a fault the local reader names)."""
    f.seek(at - 1)
    window = f.read(CSV_LINE_MAX + 1)
    newline = window.find(b"\n")
    return None if newline < 0 else at + newline


def plan_ranges(csv_path: Path, block_bytes: int) -> list[tuple[int, int]]:
    """The data lines cut into byte ranges of whole lines, about `block_bytes` each; a fault
    in the file's frame (header, a line too long, no final newline) is a DataError."""
    with open_regular(csv_path, csv_path.parent) as f:  # a link out of the folder: the local reader's refusal
        size = os.fstat(f.fileno()).st_size
        if not is_header(f.readline(64 << 10)):
            raise DataError(f"{csv_path}: header")
        starts = [f.tell()]
        f.seek(size - 1)
        if size <= starts[0] or f.read(1) != b"\n":
            raise DataError(f"{csv_path}: no data, or no final newline")
        while starts[-1] + block_bytes < size:
            begin = _next_line(f, starts[-1] + block_bytes)
            if begin is None:
                raise DataError(f"{csv_path}: a line too long")
            if begin >= size:
                break
            starts.append(begin)
    return list(zip(starts, [*starts[1:], size]))


def _blocks(ray: Any, csv_path: Path, rows: int | None, window: int) -> Blocks:
    """The CSV's blocks in order, parsed by Ray tasks, at most `window` of them in flight."""
    task = ray.remote(parse_range).options(max_retries=RETRIES, num_cpus=1)
    todo, flying = deque(plan_ranges(csv_path, BLOCK_BYTES)), deque()
    count = 0
    try:
        while todo or flying:
            while todo and len(flying) < window:
                start, end = todo.popleft()
                flying.append((task.remote(str(csv_path), start, end), start))
            ref, start = flying.popleft()
            labels, pixels = result(ray, ref, f"{csv_path}: the block from byte {start:,}")
            count += len(labels)
            if rows is not None and count > rows:
                raise DataError(f"{csv_path}: more than {rows:,} data rows")
            yield labels, pixels
    finally:
        stop(ray, [ref for ref, _ in flying])
    if rows is not None and count != rows:
        raise DataError(f"{csv_path}: {count:,} data rows, not {rows:,}")


def blocks_on(ray: Any, csv_path: Path, rows: int | None) -> Blocks:
    """The CSV's blocks parsed on the cluster; a fault named by the local reader, with its line."""
    cpus = int(ray.cluster_resources().get("CPU", 1))
    window = max(2, 2 * cpus)
    print(f"{csv_path}: parsed by Ray tasks on {cpus} CPUs (engine: ray)", file=sys.stderr)
    try:
        yield from _blocks(ray, Path(csv_path).absolute(), rows, window)  # tasks run in other folders
    except DataError:
        for _ in iter_csv(csv_path, rows=rows):  # raises the local engine's own message, naming the line
            pass
        raise


@contextmanager
def ray_blocks() -> Iterator[Callable[[Path, int | None], Blocks]]:
    """Connected to the cluster: a function of (CSV path, rows) giving its blocks."""
    with cluster() as ray:
        yield lambda csv_path, rows: blocks_on(ray, csv_path, rows)
