"""How long the test suite takes here: `make test` and `make test-fast`, each run once, on
the host as it is or beside CPU-spinning processes; pytest's own summary line and the wall
time of each.

    python benchmarks/suite_time.py [--busy 2] [--only fast|full] [--log DIR]
"""

from __future__ import annotations

import argparse
import multiprocessing
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKS = {"fast": "not docs and not slow", "full": "not docs"}   # make test-fast, make test


def spin(stop_at: float) -> None:
    while time.time() < stop_at:
        pass


def run(marks: str, log: Path | None) -> tuple[str, float]:
    """pytest's last line and the seconds the run took; its whole output to `log` if given."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rfE", "-m", marks, "-p", "no:cacheprovider"],
                          cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if log is not None:
        log.write_text(done.stdout + done.stderr)
    last = (done.stdout.strip().splitlines() or ["(no output)"])[-1]
    return last.strip("= "), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--busy", type=int, default=0, help="CPU-spinning processes beside the suite")
    parser.add_argument("--only", choices=sorted(MARKS), help="one of the two runs")
    parser.add_argument("--log", type=Path, help="a folder for each run's whole output (<run>.log)")
    args = parser.parse_args()
    spinners = [multiprocessing.Process(target=spin, args=(time.time() + 4 * 3600,)) for _ in range(args.busy)]
    for process in spinners:
        process.start()
    try:
        print(f"# {args.busy} CPU-spinning processes beside the suite")
        for name in [args.only] if args.only else ["fast", "full"]:
            summary, seconds = run(MARKS[name], args.log / f"{name}.log" if args.log else None)
            target = "make test-fast" if name == "fast" else "make test"
            print(f"{target:15} {seconds / 60:5.1f} min   {summary}")
    finally:
        for process in spinners:
            process.terminate()
            process.join()


if __name__ == "__main__":
    main()
