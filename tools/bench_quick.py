"""`make bench-quick`: the ladder in quick mode, as a DVC experiment in a scratch copy, within
a time budget.

The budget (minutes, every data set together) is shared evenly by the data sets: each one's
bench gets `bench.quick_minutes` of it and re-plans its rungs as it runs to end within that
(pipeline/bench/quickplan.py). The workspace and the committed figures stay as they are;
`dvc exp show` lists the run beside them and `dvc exp apply bench-quick` puts it in the
tables. Stopped (Ctrl-C) or failed, the data sets whose quick bench had finished are kept in
data/bench-quick/<dataset>.json and named in one line, and the scratch copy this run made is
removed (no other).

    python tools/bench_quick.py --budget-min 10
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
EXPS = ROOT / ".dvc" / "tmp" / "exps"
KEPT = ROOT / "data" / "bench-quick"
SHOW = ["exp", "show", "--only-changed", "--drop", "Created|State|Executor|.*/", "--no-pager"]


def scratch_copies() -> set[Path]:
    return set(EXPS.glob("tmp*")) if EXPS.is_dir() else set()


def finished(copy: Path) -> dict[str, Path]:
    """The data sets whose quick bench finished in `copy`: its bench metrics that are quick
    runs and differ from the workspace's (which the copy started from)."""
    found = {}
    for path in sorted((copy / "metrics" / "bench").glob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        ours = ROOT / "metrics" / "bench" / path.name
        if (
            isinstance(doc, dict)
            and (doc.get("params") or {}).get("quick") is True
            and (not ours.is_file() or ours.read_bytes() != path.read_bytes())
        ):
            found[path.stem] = path
    return found


def stopped(new: set[Path], datasets: list[str], why: str) -> str:
    """Keep what finished, remove the scratch copies, and say so in one line."""
    kept: dict[str, Path] = {}
    for copy in sorted(new):
        kept.update(finished(copy))
    if kept:
        KEPT.mkdir(parents=True, exist_ok=True)
        for name, path in kept.items():
            shutil.copyfile(path, KEPT / f"{name}.json")
    for copy in new:
        shutil.rmtree(copy, ignore_errors=True)
    done = ", ".join(kept) or "no data set"
    rest = [d for d in datasets if d not in kept]
    where = f" (kept in {KEPT.relative_to(ROOT)}/)" if kept else ""
    left = f"; {', '.join(rest)} not finished" if rest else ""
    return f"bench-quick {why}: {done} finished{where}{left}; its scratch copy removed"


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
    per = round(args.budget_min / max(1, len(datasets)), 2)
    print(
        f"bench-quick: {args.budget_min:g} min for {', '.join(datasets)}: {per:g} min each", file=sys.stderr, flush=True
    )
    before = scratch_copies()
    command = [
        args.dvc,
        "exp",
        "run",
        "--temp",
        "-n",
        "bench-quick",
        "-S",
        "bench.quick=true",
        "-S",
        f"bench.quick_minutes={per:g}",
    ]
    child = subprocess.Popen(command, cwd=ROOT)
    try:
        status = child.wait()
    except KeyboardInterrupt:  # the terminal sent SIGINT to dvc and its stage too: let them end
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        print(stopped(scratch_copies() - before, datasets, "stopped"), file=sys.stderr)
        return 130
    if status != 0:
        print(stopped(scratch_copies() - before, datasets, "failed"), file=sys.stderr)
        return status
    return subprocess.run([args.dvc, *SHOW], cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main())
