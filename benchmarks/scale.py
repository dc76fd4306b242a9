"""How the costs grow with the data: MNIST at 1x and at 10x, each step in its own process.

    python benchmarks/scale.py data/csv/mnist/train.csv [--scale 10] [--work /tmp/pipeline-scale]

The 10x split is derived deterministically from the real one: its data lines, ten times
over, under one header (600,000 samples, 1.1 GB of CSV). Per size: convert (CSV -> compact
Parquet, zstd-3, the streaming block reader), shard (the streaming writer, and the
in-memory one, `write_split`, beside it), load (the whole split with `read_split`, and one
rank's epoch of two: `ShardDataset.loader(512, shuffle="shards", rank=0, world_size=2)`
gathering its run of the epoch's order from the mapped shards, batch by batch), each in its
own process, timed after its imports, with the process's peak RSS. Goal: time within 1.2x of
linear (the ratio column divides the 10x time by 10 times the 1x time), and peak RSS flat for
the streaming steps; the whole-split load must grow (it returns the data).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

STEPS = {
    "convert (CSV -> compact Parquet)": "from pipeline.core.codec import Codec\nfrom pipeline.stages.convert.stage import write_compact\nfrom pipeline.core.parquet import write_checksums\n"
    "from pathlib import Path\nimport shutil\n"
    "d = Path(W) / 'pq' / 'compact'; d.mkdir(parents=True, exist_ok=True)\n"
    "write_compact(Path(W) / 'train.csv', d / 'train.parquet', Codec.parse('zstd-3'), 65536)\n"
    "shutil.copy(d / 'train.parquet', d / 'test.parquet'); (Path(W) / 'pq' / 'wide').mkdir(exist_ok=True)\n"
    "for s in ('train', 'test'): shutil.copy(d / 'train.parquet', Path(W) / 'pq' / 'wide' / f'{s}.parquet')\n"
    "write_checksums(Path(W) / 'pq')",
    "shard, streaming writer": "from pipeline.stages.shard.stage import stream_split\nfrom pathlib import Path\n"
    "from pipeline.stages.shard.settings import ShardSettings\n"
    "stream_split(Path(W) / 'pq/compact/train.parquet', Path(W) / 'shards/train', dataset='x', split='train',"
    " layout=ShardSettings(32768))",
    "shard, in-memory writer": "from pipeline.core.parquet import read_parquet_arrays\nfrom pipeline.shards import write_split\n"
    "from pipeline.shards.format import V2_SAMPLE\n"
    "from pathlib import Path\nl, i = read_parquet_arrays(Path(W) / 'pq/compact/train.parquet')\n"
    "write_split({'images': i, 'labels': l}, Path(W) / 'shards-mem/train', sample=V2_SAMPLE, dataset='x',"
    " split='train', samples_per_shard=32768)",
    "load, whole split": "from pipeline.shards import read_split\nfrom pathlib import Path\ncolumns = read_split(Path(W) / 'shards/train')",
    "load, one rank of two": "from pipeline.shards import ShardDataset\nfrom pathlib import Path\n"
    "loader = ShardDataset(Path(W) / 'shards/train').loader(512, shuffle='shards', seed=42, rank=0, world_size=2)\n"
    "n = sum(len(y) for _, y in loader)",
}


def build(csv: Path, scale: int, work: Path) -> None:
    work.mkdir(parents=True, exist_ok=True)
    with csv.open("rb") as src, (work / "train.csv").open("wb") as out:
        header, body = src.readline(), src.read()
        out.write(header)
        for _ in range(scale):
            out.write(body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", type=Path)
    parser.add_argument("--scale", type=int, default=10)
    parser.add_argument("--work", type=Path, default=Path("/tmp/pipeline-scale"))
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: measure one size in a fresh process
    args = parser.parse_args()
    if args.one:
        scale = int(args.one)
        work = args.work / f"x{scale}"
        shutil.rmtree(work, ignore_errors=True)
        build(args.csv, scale, work)
        for name, code in STEPS.items():
            seconds, rss = measure_fresh(code, work)
            print(f"{name}\t{seconds:.3f}\t{rss:.0f}", flush=True)
        shutil.rmtree(work, ignore_errors=True)
        return
    results = {}
    for scale in (1, args.scale):
        out = subprocess.run(
            [sys.executable, __file__, str(args.csv), "--work", str(args.work), "--one", str(scale)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        results[scale] = {line.split("\t")[0]: tuple(map(float, line.split("\t")[1:])) for line in out.splitlines()}
    n = args.scale
    print(f"{args.csv}: 1x and {n}x ({n} copies of its data lines); each step its own process")
    print(f"{'step':34s} {'1x s':>8s} {f'{n}x s':>8s} {'vs linear':>9s} {'1x RSS MB':>10s} {f'{n}x RSS MB':>10s}")
    for name in STEPS:
        (t1, r1), (tn, rn) = results[1][name], results[n][name]
        print(f"{name:34s} {t1:8.2f} {tn:8.2f} {tn / (n * t1):8.2f}x {r1:10.0f} {rn:10.0f}")


def measure_fresh(code: str, work: Path) -> tuple[float, float]:
    """(seconds of the step itself, after its imports; peak RSS MB of its process)."""
    lines = code.splitlines()
    imports = [line for line in lines if line.startswith(("from ", "import "))]
    body = [line for line in lines if not line.startswith(("from ", "import "))]
    child = "\n".join(
        [
            f"W = {str(work)!r}",
            *imports,
            "import time as _time",
            "_t = _time.perf_counter()",
            *body,
            "print(_time.perf_counter() - _t)",
        ]
    )
    wrapper = (
        "import resource, subprocess, sys\n"
        "out = subprocess.run([sys.executable, '-c', sys.argv[1]], check=True, capture_output=True, text=True)\n"
        "print(out.stdout.split()[-1], resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    out = subprocess.run(
        [sys.executable, "-c", wrapper, child], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split()
    return float(out[0]), float(out[1]) / 1024


if __name__ == "__main__":
    main()
