"""The verdict of `python -m pipeline profile` on five loops built to be bound by one thing
each (benchmarks/verdict_loops.py), on the host as it is and beside two CPU-spinning
processes: per loop and load, the step and its parts, the bound, and the evidence.

    python benchmarks/verdicts.py [--loops data compute tiny threads launch] [--busy 2] [--full]
"""

from __future__ import annotations

import argparse
import multiprocessing
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def spin(stop_at: float) -> None:
    while time.time() < stop_at:
        pass


def profile(kind: str) -> str:
    """The command's output for one loop."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "profile",
            "--steps",
            "20",
            "--skip",
            "5",
            str(ROOT / "benchmarks" / "verdict_loops.py"),
            kind,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    return done.stdout if done.returncode == 0 else f"exit {done.returncode}: {done.stderr.strip()[-300:]}"


def brief(out: str) -> str:
    """The report's first line (the step and its parts), the bound, and the `Why:` paragraph."""
    lines = out.rstrip().splitlines()
    at = next((i for i, line in enumerate(lines) if "-BOUND" in line), None)
    why = next((i for i, line in enumerate(lines) if line.startswith("Why: ")), None)
    if at is None or why is None:
        return out.rstrip()
    head = " ".join(lines[:at])
    verdict = " ".join(lines[at:why])
    bound = verdict[: verdict.index("-BOUND") + len("-BOUND")]
    rest = verdict[len(bound) :]
    if rest.startswith(" ("):  # its caveat, whole
        bound += rest[: rest.index(")") + 1]
    return "\n".join([head, bound, " ".join(lines[why:])])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--loops", nargs="+", default=["data", "compute", "tiny", "threads", "launch"])
    parser.add_argument("--busy", type=int, default=2, help="CPU-spinning processes for the busy runs")
    parser.add_argument("--full", action="store_true", help="print each whole report, not its summary")
    args = parser.parse_args()
    for kind in args.loops:
        for busy in (0, args.busy):
            spinners = [multiprocessing.Process(target=spin, args=(time.time() + 600,)) for _ in range(busy)]
            for process in spinners:
                process.start()
            try:
                out = profile(kind)
            finally:
                for process in spinners:
                    process.terminate()
                    process.join()
            print(f"== {kind}, {busy} spinning processes beside it")
            print(out.rstrip() if args.full else brief(out))


if __name__ == "__main__":
    main()
