"""Where the convert stage's memory goes as the data set grows: each layout's write and
read-back alone, at two or more sizes, with the peak anonymous memory and the row groups.

    python benchmarks/convert_memory.py --scales 10 30

For each `--scales` value, MNIST's train split repeated that many times is written as the
csv stage writes it; then, each in a fresh process, the convert stage's own functions run
on it one at a time: `write_compact` (our block reader, one preallocated row group, pyarrow's
writer), `write_wide` (polars' streaming CSV reader and Parquet sink, the write-up's 785
columns) and the read-back of each file a row group at a time (`iter_parquet_arrays`). Each
reports its seconds, the process's peak `Pss_Anon` (anonymous pages, what the kernel cannot
drop; sampled every 50 ms from /proc/self/smaps_rollup) and the file's row groups. A peak
that stays level from one size to the next is bounded by the row group; one that grows
with the row groups holds something per row group until the file is closed (a Parquet
writer keeps every column chunk's metadata for the footer it writes last; a reader holds the
footer it read first).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

CODEC, ROW_GROUP = "zstd-3", 65536  # params.yaml's values
STEPS = ("write_compact", "write_wide", "read_compact", "read_wide")


def anon_mb() -> float:
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss_Anon:"):
            return int(line.split()[1]) / 1024
    raise SystemExit("no Pss_Anon in /proc/self/smaps_rollup (Linux 5.0 or later is needed)")


def step(name: str, work: Path) -> dict:
    """One step in this process: its seconds, peak Pss_Anon and the file's row groups."""
    import pyarrow.parquet as pq

    from pipeline.core.codec import Codec
    from pipeline.core.parquet import iter_parquet_arrays
    from pipeline.stages.convert.stage import write_compact, write_wide

    peak, stop = [anon_mb()], threading.Event()

    def watch() -> None:
        while not stop.wait(0.05):
            peak[0] = max(peak[0], anon_mb())

    base = peak[0]
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    csv, codec = work / "train.csv", Codec.parse(CODEC)
    layout = name.split("_")[1]
    out = work / f"{layout}.parquet"
    start = time.perf_counter()
    if name == "write_compact":
        write_compact(csv, out, codec, ROW_GROUP)
    elif name == "write_wide":
        write_wide(csv, out, codec, ROW_GROUP)
    else:
        for _ in iter_parquet_arrays(out):
            pass
    seconds = time.perf_counter() - start
    stop.set()
    watcher.join()
    peak[0] = max(peak[0], anon_mb())
    return {
        "seconds": round(seconds, 2),
        "base_mb": round(base),
        "peak_mb": round(peak[0]),
        "row_groups": pq.ParquetFile(out).num_row_groups,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scales", type=int, nargs="+", default=[10, 30], help="MNIST's train rows this many times")
    parser.add_argument(
        "--mirror",
        type=Path,
        default=Path(os.environ.get("PIPELINE_MIRROR", "")),
        help="a folder holding mnist/ (default: $PIPELINE_MIRROR)",
    )
    parser.add_argument("--step", nargs=2, metavar=("STEP", "WORK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step:
        print(json.dumps(step(args.step[0], Path(args.step[1]))))
        return
    if not (args.mirror / "mnist").is_dir():
        parser.error("--mirror: give a folder holding mnist/ (MNIST's IDX files), or set PIPELINE_MIRROR")
    from child import child_figures
    from ray_engine import make_csv

    print(
        f"convert's steps alone, MNIST train repeated; codec {CODEC}, row groups of {ROW_GROUP:,} rows; "
        f"{os.cpu_count()} CPUs\n"
    )
    print("| train rows | step | row groups | seconds | base Pss_Anon MB | peak Pss_Anon MB |")
    print("|---:|---|---:|---:|---:|---:|")
    for scale in args.scales:
        with tempfile.TemporaryDirectory(prefix=f"convert-memory-x{scale}-") as tmp:
            work = Path(tmp)
            rows = make_csv(args.mirror / "mnist", work, scale)["train"]
            (work / "test.csv").unlink()
            for name in STEPS:
                got = child_figures(__file__, ["--step", name, str(work)], ROOT, f"{name} at x{scale}")
                print(
                    f"| {rows:,} | {name} | {got['row_groups']} | {got['seconds']:.1f} | {got['base_mb']} "
                    f"| {got['peak_mb']} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
