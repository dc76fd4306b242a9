"""A loader on a busy host: one shuffled epoch of float batches of 512 from a split held on
the CPU, made with torch's ops (what `DeviceBatches` did before: uint8 -> float on torch's
default intra-op threads) and with numpy on one thread (what its `UnitFloat` transform does
on the CPU), with the host as it is and with `--spinners` extra processes spinning on the
cores.

    python benchmarks/busy_host.py data/shards/mnist/train --out results/peers

Each figure: min / median of `--repeat` epochs, in a fresh process per configuration.
Writes <out>/busy.json and <out>/busy.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def spin(stop) -> None:
    while not stop.is_set():
        sum(range(10_000))


def epochs(split: Path, path: str, repeat: int) -> list[float]:
    import torch

    from pipeline.bench.model import MODEL_INPUT
    from pipeline.shards import DeviceBatches, read_split

    columns = read_split(split)
    images, labels = columns["images"], columns["labels"]
    batches = DeviceBatches(columns, 512, shuffle=True, seed=0, transform=list(MODEL_INPUT))
    times = []
    for epoch in range(repeat):
        start = time.perf_counter()
        if path == "numpy":
            for _ in batches:
                pass
        else:
            order = batches.rank_order(epoch)
            for first in range(0, len(order), 512):
                index = order[first : first + 512]
                images[index].unsqueeze(1).to(torch.float32).div_(255), labels[index].long()
        times.append(time.perf_counter() - start)
    del torch
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("split", type=Path)
    parser.add_argument("--child", choices=["torch", "numpy"])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--spinners", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "peers")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(epochs(args.split, args.child, args.repeat)))
        return
    results = {}
    for load in ("as is", f"+{args.spinners} spinning processes"):
        stop = multiprocessing.Event()
        spinners = [
            multiprocessing.Process(target=spin, args=(stop,)) for _ in range(args.spinners if "+" in load else 0)
        ]
        for p in spinners:
            p.start()
        try:
            for path in ("torch", "numpy"):
                out = subprocess.run(
                    [sys.executable, __file__, str(args.split), "--child", path, "--repeat", str(args.repeat)],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                results[f"{path}, host {load}"] = {
                    "seconds": json.loads(out.stdout.splitlines()[-1]),
                    "load_average": os.getloadavg()[0],
                }
        finally:
            stop.set()
            for p in spinners:
                p.join()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "busy.json").write_text(json.dumps(results, indent=1) + "\n")
    lines = [
        "<!-- written by benchmarks/busy_host.py -->",
        "",
        f"One shuffled epoch of float batches of 512 from {args.split.name} on the CPU ({os.cpu_count()} cores), "
        f"min / median of {args.repeat} epochs; the load average when each finished.",
        "",
        "| batches made with | host | epoch (s) | load average |",
        "|---|---|---|---|",
    ]
    for name, figure in results.items():
        path, host = name.split(", host ")
        label = "torch ops, default threads (before)" if path == "torch" else "numpy, one thread (now)"
        seconds = figure["seconds"]
        lines.append(
            f"| {label} | {host} | {min(seconds):.2f} / {statistics.median(seconds):.2f} | "
            f"{figure['load_average']:.1f} |"
        )
    (args.out / "busy.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
