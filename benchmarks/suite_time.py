"""How long the test suite takes here, and whether it passes on a loaded host: `make test`
and `make test-fast`, each run `--runs` times in a row, on the host as it is or beside
`--busy` CPU-spinning processes; per run, the target, its minutes, pytest's own summary line
and whether it passed.

    python benchmarks/suite_time.py [--busy 2] [--only fast|full] [--runs 1] [--log DIR]
    python benchmarks/suite_time.py --busy 4 --only full --runs 3     # the loaded check (hours)

The spinners (`while True: pass`, each in its own process) are ended when the runs end, on
Ctrl-C and on SIGTERM (the run under way with them); one whose parent is gone (this script
killed) ends by itself. The exit status is 1 if any run failed, 130 after Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {"fast": "test-fast", "full": "test"}  # make's targets: "not docs and not slow", "not docs"
# A spinner: the loop checks, every few million iterations, that the process that started it
# is still its parent, so that none outlives a killed script.
SPIN = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    for _ in range(2_000_000):\n        pass\n"


def spinners(count: int) -> list[subprocess.Popen]:
    """`count` CPU-spinning processes, each in its own session: a Ctrl-C at the terminal
    reaches this script, which ends them."""
    return [
        subprocess.Popen([sys.executable, "-c", SPIN], stdin=subprocess.DEVNULL, start_new_session=True)
        for _ in range(count)
    ]


def stop(processes: list[subprocess.Popen]) -> None:
    """Ends the spinners this script started, each by its own process id."""
    for process in processes:
        if process.poll() is None:
            process.kill()
    for process in processes:
        process.wait()


def run(target: str, log: Path | None) -> tuple[str, float, int]:
    """pytest's summary line, the seconds `make <target>` took and its exit status; its whole
    output to `log` if given."""
    start = time.perf_counter()
    # make, and the pytest under it, in a process group of their own: stopped here, all of it ends
    make = subprocess.Popen(
        ["make", "--no-print-directory", target, "PYTEST_ARGS=-rfE -p no:cacheprovider"],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = make.communicate()
    except BaseException:
        os.killpg(make.pid, signal.SIGTERM)
        make.wait()
        raise
    seconds = time.perf_counter() - start
    if log is not None:
        log.write_text(out + err)
    lines = [line for line in out.strip().splitlines() if line.strip()] or ["(no output)"]
    return lines[-1].strip("= "), seconds, make.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--busy", type=int, default=0, help="CPU-spinning processes beside the suite")
    parser.add_argument(
        "--only", choices=sorted(TARGETS), help="one of the two targets (fast: make test-fast, full: make test)"
    )
    parser.add_argument("--runs", type=int, default=1, help="runs of each target, in a row")
    parser.add_argument("--log", type=Path, help="a folder for each run's whole output (<target>-<run>.log)")
    args = parser.parse_args()
    if args.busy < 0 or args.runs < 1:
        parser.error("--busy must be 0 or more and --runs 1 or more")
    if args.log is not None:
        args.log.mkdir(parents=True, exist_ok=True)

    def terminated(*_: object) -> None:
        raise SystemExit(143)

    signal.signal(signal.SIGTERM, terminated)
    started = spinners(args.busy)
    failed = 0
    try:
        print(
            f"# {args.busy} CPU-spinning processes beside the suite"
            + (f", {args.runs} runs of each target in a row" if args.runs > 1 else ""),
            flush=True,
        )
        for name in [args.only] if args.only else ["fast", "full"]:
            target = TARGETS[name]
            for number in range(1, args.runs + 1):
                log = args.log / f"{target}-{number}.log" if args.log else None
                summary, seconds, status = run(target, log)
                verdict = "pass" if status == 0 else f"FAIL (exit {status})"
                failed += status != 0
                print(f"make {target:10} {seconds / 60:5.1f} min   {summary}   {verdict}", flush=True)
    except KeyboardInterrupt:
        print("stopped: the run under way and the spinners ended", file=sys.stderr)
        return 130
    finally:
        stop(started)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
