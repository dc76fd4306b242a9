"""CSV -> Parquet: the write-up's path (pandas read_csv + to_parquet) against the convert stage.

    python benchmarks/convert_speed.py data/csv/mnist/train.csv [--scale 10]

Side by side in one run on the same file, each in its own child process so that its peak
RSS is its own: the write-up's path (pandas, default snappy, one int64 column per value), then
the stage's writer for each layout alone (snappy) and the whole stage step (both layouts);
each runs --repeats times in its process and the best time is the figure (the first,
cold, run is shown beside it).
With --scale N it also writes a synthetic CSV N times larger (the rows repeated) and
converts it, to show the stage's memory stays roughly flat as the CSV grows.
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing as mp
import resource
import tempfile
import time
from pathlib import Path


def _seed(csv: str, out: str) -> dict:
    import pandas as pd

    frame = pd.read_csv(csv)
    frame.to_parquet(Path(out) / "seed.parquet")  # pandas' defaults: pyarrow engine, snappy
    return {"bytes": (Path(out) / "seed.parquet").stat().st_size}


def _layout(name: str):
    def run(csv: str, out: str) -> dict:
        from pipeline.core.codec import Codec
        from pipeline.stages.convert.stage import write_compact, write_wide

        dest = Path(out) / f"{name}.parquet"
        (write_compact if name == "compact" else write_wide)(Path(csv), dest, Codec("snappy"), 65536)
        return {"bytes": dest.stat().st_size}

    return run


def _both(csv: str, out: str) -> dict:
    from pipeline.core.codec import Codec
    from pipeline.stages.convert.stage import convert_split

    paths = {layout: Path(out) / f"{layout}.parquet" for layout in ("wide", "compact")}
    convert_split(Path(csv), paths, Codec("snappy"), 65536)
    return {"bytes": sum(path.stat().st_size for path in paths.values())}


TARGETS = {
    "seed pandas read_csv + to_parquet": _seed,
    "stage compact layout": _layout("compact"),
    "stage wide layout": _layout("wide"),
    "stage both layouts": _both,
}


def _child(name: str, csv: str, out: str, repeats: int, queue) -> None:
    importlib.import_module("pandas" if name.startswith("seed") else "pipeline.stages.convert.stage")  # not timed
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = TARGETS[name](csv, out)
        times.append(time.perf_counter() - start)
    result["seconds"], result["first_s"] = min(times), times[0]
    result["peak_rss_MB"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    queue.put(result)


def measure(name: str, csv: Path, out: Path, repeats: int) -> dict:
    context = mp.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_child, args=(name, str(csv), str(out), repeats, queue))
    process.start()
    result = queue.get()
    process.join()
    return result


def _report(csv: Path, names: list[str], repeats: int) -> dict:
    results = {}
    with tempfile.TemporaryDirectory(dir=csv.parent) as out:
        print(f"{csv} ({csv.stat().st_size / 1e6:.0f} MB)")
        for name in names:
            results[name] = result = measure(name, csv, Path(out), repeats)
            seed = results.get(next(iter(TARGETS)))
            ratio = (
                (
                    f" ({seed['seconds'] / result['seconds']:4.1f}x; first run {result['first_s']:5.2f} s, "
                    f"{seed['first_s'] / result['first_s']:4.1f}x)"
                )
                if seed
                else ""
            )
            print(
                f"  {name:36s}: {result['seconds']:6.2f} s{ratio}, "
                f"peak RSS {result['peak_rss_MB']:5.0f} MB, {result['bytes'] / 1e6:6.2f} MB written"
            )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("csv", type=Path)
    parser.add_argument("--scale", type=int, default=0, help="also convert a CSV this many times larger")
    parser.add_argument("--repeats", type=int, default=3, help="runs per path; the best is reported")
    parser.add_argument("--json", action="store_true", help="also print every figure as one JSON line")
    args = parser.parse_args()
    results = {"real": _report(args.csv, list(TARGETS), args.repeats)}
    if args.scale:
        with tempfile.TemporaryDirectory(dir=args.csv.parent) as tmp:
            big = Path(tmp) / f"x{args.scale}.csv"
            with args.csv.open("rb") as src, big.open("wb") as out:
                out.write(src.readline())
                body = src.read()
                for _ in range(args.scale):
                    out.write(body)
            del body
            results[f"x{args.scale}"] = _report(big, list(TARGETS)[1:3], 1)
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
