"""A split of more shards than the process may open: one shuffled epoch under descriptor
limits below and above the shard count, with what the bounded maps cost.

    python benchmarks/many_shards.py --shards 1000 --limits 256 4096

Writes a split of `--shards` shards of MNIST-shaped random samples (uint8 [28, 28] images,
uint8 labels, int64 ids) into a scratch folder, then reads it in a fresh process per limit
(`RLIMIT_NOFILE` set first, as `ulimit -n` does): one shuffled epoch in batches of 512
through `ShardDataset.loader`, with 0 workers, checking that every sample came once; once
shuffled per sample (`shuffle="samples"`: every batch touches shards all over the split, the
worst case for a bound on open maps) and once per shard (`shuffle="shards"`: a few shards at a
time). Each run reports its seconds, samples per second and the most shards it held mapped
at once. Under a limit below the shard count, the least recently used maps are closed and
shards mapped again when touched: the gap between the rows is that cost.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

BATCH = 512


def write(folder: Path, shards: int, per_shard: int) -> int:
    from pipeline.shards import Field, Sample, write_split

    n = shards * per_shard
    rng = np.random.default_rng(0)
    columns = {
        "images": rng.integers(0, 256, (n, 28, 28), dtype=np.uint8),
        "labels": rng.integers(0, 10, n, dtype=np.uint8),
        "ids": np.arange(n, dtype=np.int64),
    }
    sample = Sample(
        (Field("images", "uint8", (28, 28)), Field("labels", "uint8", (), classes=10), Field("ids", "int64"))
    )
    write_split(columns, folder, sample=sample, dataset="many", split="train", samples_per_shard=per_shard)
    return n


def read(folder: Path, limit: int, shuffle: str) -> dict:
    """One epoch shuffled by `shuffle` under `limit` descriptors, in this process."""
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    from pipeline.shards import ShardDataset

    data = ShardDataset(folder)
    seen = np.zeros(len(data), np.int64)
    most = 0
    start = time.perf_counter()
    for _, _, ids in data.loader(BATCH, shuffle=shuffle, seed=0):
        seen[ids.numpy()] += 1
        most = max(most, sum(shard is not None and shard.is_open for shard in data.split.shards))
    seconds = time.perf_counter() - start
    if not (seen == 1).all():
        raise SystemExit(f"limit {limit}: {int((seen != 1).sum())} samples not read exactly once")
    return {"seconds": round(seconds, 2), "samples_per_s": round(len(data) / seconds), "most_mapped": most}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=1000)
    parser.add_argument("--per-shard", type=int, default=600, help="samples per shard")
    parser.add_argument("--limits", type=int, nargs="+", default=[256, 4096], help="RLIMIT_NOFILE of each run")
    parser.add_argument("--read", nargs=3, metavar=("FOLDER", "LIMIT", "SHUFFLE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.read:
        print(json.dumps(read(Path(args.read[0]), int(args.read[1]), args.read[2])))
        return
    from child import child_figures

    with tempfile.TemporaryDirectory(prefix="many-shards-") as tmp:
        folder = Path(tmp) / "split"
        n = write(folder, args.shards, args.per_shard)
        print(
            f"{args.shards:,} shards of {args.per_shard:,} samples ({n:,} samples), one shuffled epoch, "
            f"batches of {BATCH}, 0 workers\n"
        )
        print("| shuffle | descriptor limit | seconds | samples/s | most shards mapped at once |")
        print("|---|---:|---:|---:|---:|")
        for shuffle in ("samples", "shards"):
            for limit in args.limits:
                got = child_figures(__file__, ["--read", str(folder), str(limit), shuffle], ROOT, f"limit {limit}")
                print(
                    f"| {shuffle} | {limit:,} | {got['seconds']:.2f} | {got['samples_per_s']:,} "
                    f"| {got['most_mapped']} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
