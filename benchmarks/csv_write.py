"""CSV writing speed: numpy.savetxt (the obvious script) vs the csv stage (polars).

    python benchmarks/csv_write.py [data/raw/mnist]

Both write the same train split to a temporary folder, side by side in one run; the
bytes are compared so the speed is not bought with a different output.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from pipeline.stages.csvdata import HEADER, write_csv
from pipeline.stages.mnist import read_raw_split


def main(raw: Path) -> None:
    images, labels = read_raw_split(raw, "train")
    rows = np.concatenate([labels[:, None], images.reshape(len(images), -1)], axis=1)
    with tempfile.TemporaryDirectory() as tmp:
        results = {}
        for name, write in {
            "numpy.savetxt": lambda p: np.savetxt(p, rows, fmt="%d", delimiter=",", header=HEADER.strip(), comments=""),
            "pipeline (polars)": lambda p: write_csv(images, labels, p),
        }.items():
            path = Path(tmp) / f"{len(results)}.csv"
            start = time.perf_counter()
            write(path)
            seconds = time.perf_counter() - start
            results[name] = (path, seconds)
            size = path.stat().st_size
            print(f"{name:18s} {size / 1e6:8.1f} MB in {seconds:6.2f} s = {size / 1e6 / seconds:6.1f} MB/s")
        (a, ta), (b, tb) = results.values()
        assert a.read_bytes() == b.read_bytes(), "outputs differ"
        print(f"identical bytes; speed-up {ta / tb:.1f}x")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "data/raw/mnist"))
