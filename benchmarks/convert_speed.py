"""CSV -> Parquet: the seed's path (pandas read_csv + to_parquet) against the convert stage.

    python benchmarks/convert_speed.py data/csv/mnist/train.csv [--scale 10]

Side by side in one run on the same file, each in its own child process so that its peak
RSS is its own: the seed path (pandas, default snappy, one int64 column per value), and
the convert stage (both layouts, snappy). With --scale N it also writes a synthetic CSV N
times larger (the rows repeated) and converts it, to show the stage's memory stays flat.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import shutil
import tempfile
import time
from pathlib import Path


def _seed_path(csv: str, out: str) -> dict:
    import pandas as pd

    start = time.perf_counter()
    frame = pd.read_csv(csv)
    frame.to_parquet(out)  # pandas' defaults: pyarrow engine, snappy
    return {"seconds": time.perf_counter() - start, "bytes": Path(out).stat().st_size}


def _stage_path(csv: str, out: str) -> dict:
    from pipeline.convert import Codec, convert_split

    start = time.perf_counter()
    paths = {layout: Path(out) / f"{layout}.parquet" for layout in ("wide", "compact")}
    figures = convert_split(Path(csv), paths, Codec("snappy"), 65536)
    return {"seconds": time.perf_counter() - start,
            "bytes": {layout: figures[layout]["bytes"] for layout in paths}}


def _child(target, csv: str, out: str, queue) -> None:
    result = target(csv, out)
    result["peak_rss_MB"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    queue.put(result)


def measure(target, csv: Path, out: Path) -> dict:
    queue = mp.get_context("spawn").Queue()
    process = mp.get_context("spawn").Process(target=_child, args=(target, str(csv), str(out), queue))
    process.start()
    result = queue.get()
    process.join()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("csv", type=Path)
    parser.add_argument("--scale", type=int, default=0, help="also convert a CSV this many times larger")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.csv.parent) as tmp:
        tmp = Path(tmp)
        (tmp / "stage").mkdir()
        size = args.csv.stat().st_size / 1e6
        seed = measure(_seed_path, args.csv, tmp / "seed.parquet")
        stage = measure(_stage_path, args.csv, tmp / "stage")
        print(f"{args.csv} ({size:.1f} MB)")
        print(f"  seed  pandas read_csv + to_parquet : {seed['seconds']:6.2f} s, "
              f"peak RSS {seed['peak_rss_MB']:6.0f} MB, {seed['bytes'] / 1e6:.2f} MB")
        print(f"  stage convert (wide + compact)     : {stage['seconds']:6.2f} s, "
              f"peak RSS {stage['peak_rss_MB']:6.0f} MB, wide {stage['bytes']['wide'] / 1e6:.2f} MB, "
              f"compact {stage['bytes']['compact'] / 1e6:.2f} MB")
        print(f"  speed-up {seed['seconds'] / stage['seconds']:.1f}x")
        if args.scale:
            big = tmp / "big.csv"
            with args.csv.open("rb") as src, big.open("wb") as out:
                header = src.readline()
                body = src.read()
                out.write(header)
                for _ in range(args.scale):
                    out.write(body)
            (tmp / "big").mkdir()
            result = measure(_stage_path, big, tmp / "big")
            print(f"  stage on a {args.scale}x CSV ({big.stat().st_size / 1e6:.0f} MB): "
                  f"{result['seconds']:6.2f} s, peak RSS {result['peak_rss_MB']:6.0f} MB")
            print(json.dumps({"seed": seed, "stage": stage, f"stage_x{args.scale}": result}))


if __name__ == "__main__":
    main()
