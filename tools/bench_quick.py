"""`make bench-quick`: the ladder in quick mode, as a DVC experiment in a scratch copy, within
a time budget.

The budget (minutes, every data set together) is shared evenly by the data sets: each one's
bench gets `bench.quick_minutes` of it, and plans to end by the whole run's end too (passed as
PIPELINE_QUICK_DEADLINE), re-planning its rungs as it runs (pipeline/bench/quickplan.py). The
workspace and the committed figures stay as they are; `dvc exp show` lists the run beside
them and `dvc exp apply bench-quick` puts it in the tables. Each data set's finished document
is also kept in data/bench-quick/<dataset>.json (the bench stage writes it there as it ends,
PIPELINE_QUICK_KEEP), so a run stopped (Ctrl-C) or failed says in one line what finished and
keeps it; the scratch copy this run made is removed (no other).

    python tools/bench_quick.py --budget-min 10
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
EXPS = ROOT / ".dvc" / "tmp" / "exps"
KEPT = ROOT / "data" / "bench-quick"
AFTER_S = 20  # the summary and report stages and DVC's own end, after the last bench
SHOW = ["exp", "show", "--only-changed", "--drop", "Created|State|Executor|.*/", "--no-pager"]


def scratch_copies() -> set[Path]:
    return set(EXPS.glob("tmp*")) if EXPS.is_dir() else set()


def finished(since: float) -> list[str]:
    """The data sets whose quick bench finished in this run (their documents kept since)."""
    return [path.stem for path in sorted(KEPT.glob("*.json")) if path.stat().st_mtime >= since]


def stopped(new: set[Path], datasets: list[str], why: str, since: float) -> str:
    """Remove the scratch copies this run made, and say in one line what finished."""
    for copy in new:
        shutil.rmtree(copy, ignore_errors=True)
    kept = finished(since)
    done = ", ".join(kept) or "no data set"
    rest = [d for d in datasets if d not in kept]
    where = f" (kept in {KEPT.relative_to(ROOT)}/)" if kept else ""
    left = f"; {', '.join(rest)} not finished" if rest else ""
    return f"bench-quick {why}: {done} finished{where}{left}; its scratch copy removed"


def interrupted(*_: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--budget-min", type=float, default=10.0, help="minutes the whole quick bench may take, every data set together"
    )
    parser.add_argument("--dvc", default="dvc", help="the dvc command")
    args = parser.parse_args(argv)
    if not 0 < args.budget_min <= 24 * 60:
        print(f"bench-quick: --budget-min {args.budget_min:g}: expected minutes in (0, 1440]", file=sys.stderr)
        return 2
    datasets = list(yaml.safe_load((ROOT / "params.yaml").read_text())["datasets"])
    per = math.ceil(args.budget_min / max(1, len(datasets)) * 100) / 100  # never 0: params.yaml's rule
    print(
        f"bench-quick: {args.budget_min:g} min for {', '.join(datasets)}: {per:g} min each", file=sys.stderr, flush=True
    )
    before = scratch_copies()
    started = time.time()
    KEPT.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PIPELINE_QUICK_KEEP": str(KEPT),
        "PIPELINE_QUICK_DEADLINE": f"{started + args.budget_min * 60 - AFTER_S:.0f}",
    }
    command = [
        args.dvc, "exp", "run", "--temp", "-n", "bench-quick",
        "-S", "bench.quick=true", "-S", f"bench.quick_minutes={per:g}",
    ]  # fmt: skip
    child = subprocess.Popen(command, cwd=ROOT, env=env)
    signal.signal(signal.SIGTERM, interrupted)  # a SIGTERM stops the run as Ctrl-C does
    try:
        status = child.wait()
    except KeyboardInterrupt:  # Ctrl-C reached dvc and its stage too; a SIGTERM only this process
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if child.poll() is None:
            child.send_signal(signal.SIGINT)
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        print(stopped(scratch_copies() - before, datasets, "stopped", started), file=sys.stderr)
        return 130
    if status != 0:
        print(stopped(scratch_copies() - before, datasets, "failed", started), file=sys.stderr)
        return status
    return subprocess.run([args.dvc, *SHOW], cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main())
