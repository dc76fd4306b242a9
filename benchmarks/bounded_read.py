"""A split larger than the memory bound it is read with: peak resident memory and throughput.

    python benchmarks/bounded_read.py --gib 5 --bound-gib 1 --out results/peers/bounded.json

Writes a split of `--gib` GiB (uint8 [3, 32, 32] images and int64 labels, shards of 64 MiB)
into a scratch folder, then reads one shuffled epoch in batches of 512 with
`ShardDataset(max_resident=bound)`, in a fresh process each, for the shuffles "shards" and
"samples", with 0 and with 2 DataLoader workers. Each read reports its samples per second,
the peak RSS of the process and of each worker (VmHWM: file pages mapped in count), and the
same process's RSS before the epoch (the baseline: the interpreter, torch, numpy). The
bound holds per process: with workers, each keeps at most `bound` of the split mapped.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SAMPLE_BYTES = 3 * 32 * 32 + 8


def status_kib(pid: str, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def write(folder: Path, gib: float) -> int:
    import numpy as np

    from pipeline.shards import Field, Sample, ShardWriter

    n = int(gib * (1 << 30) // SAMPLE_BYTES)
    sample = Sample((Field("image", "uint8", (3, 32, 32)), Field("label", "int64", (), classes=100)))
    writer = ShardWriter(
        folder, sample=sample, dataset="bounded", split="train", samples_per_shard=(64 << 20) // SAMPLE_BYTES
    )
    rng = np.random.default_rng(0)
    for start in range(0, n, 65536):
        b = min(65536, n - start)
        writer.add({"image": rng.integers(0, 256, (b, 3, 32, 32), dtype=np.uint8), "label": rng.integers(0, 100, b)})
    writer.finish()
    return n


def child(folder: Path, bound: int, shuffle: str, workers: int) -> dict:
    import threading

    import torch

    from pipeline.shards import ShardDataset

    torch.set_num_threads(1)
    data = ShardDataset(folder, max_resident=bound)
    loader = data.loader(512, shuffle=shuffle, seed=0, num_workers=workers)
    base = status_kib("self", "VmRSS")
    peaks: dict[str, int] = {}
    stop = threading.Event()

    def watch() -> None:  # the workers' peaks, read while they live
        while not stop.wait(0.2):
            for entry in Path("/proc").iterdir():
                try:
                    if (
                        entry.name.isdigit()
                        and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == os.getpid()
                    ):
                        peaks[entry.name] = max(peaks.get(entry.name, 0), status_kib(entry.name, "VmHWM"))
                except (OSError, ValueError, IndexError):
                    continue

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    count, start = 0, time.perf_counter()
    for image, _ in loader:
        count += len(image)
    seconds = time.perf_counter() - start
    stop.set()
    watcher.join()
    return {
        "shuffle": shuffle,
        "workers": workers,
        "samples": count,
        "seconds": seconds,
        "samples_per_s": count / seconds,
        "baseline_rss_mib": base / 1024,
        "peak_rss_mib": status_kib("self", "VmHWM") / 1024,
        "worker_peak_rss_mib": sorted(v / 1024 for v in peaks.values()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gib", type=float, default=5.0)
    parser.add_argument("--bound-gib", type=float, default=1.0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--child", nargs=4, metavar=("FOLDER", "BOUND", "SHUFFLE", "WORKERS"))
    args = parser.parse_args()
    if args.child:
        folder, bound, shuffle, workers = args.child
        print(json.dumps(child(Path(folder), int(bound), shuffle, int(workers))))
        return
    bound = int(args.bound_gib * (1 << 30))
    with tempfile.TemporaryDirectory(dir=ROOT / "data" if (ROOT / "data").is_dir() else None) as scratch:
        folder = Path(scratch) / "split"
        start = time.perf_counter()
        n = write(folder, args.gib)
        written = time.perf_counter() - start
        print(f"wrote {n:,} samples ({n * SAMPLE_BYTES / (1 << 30):.2f} GiB) in {written:.1f} s", file=sys.stderr)
        runs = []
        for shuffle, workers in (("shards", 0), ("samples", 0), ("shards", 2)):
            done = subprocess.run(
                [sys.executable, __file__, "--child", str(folder), str(bound), shuffle, str(workers)],
                capture_output=True,
                text=True,
                check=True,
            )
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(json.dumps(runs[-1]), file=sys.stderr)
    result = {
        "command": " ".join(["python", "benchmarks/bounded_read.py", *sys.argv[1:]]),
        "samples": n,
        "split_gib": n * SAMPLE_BYTES / (1 << 30),
        "bound_mib": bound / (1 << 20),
        "write_s": written,
        "cpus": os.cpu_count(),
        "runs": runs,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
