"""One measurement in a fresh process: a benchmark runs itself again with hidden arguments,
and the child prints its figures as one JSON line, read here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def child_figures(script: str, args: list[str], cwd: Path, what: str) -> dict:
    """The JSON figures `python script *args` printed last; its failure ends the benchmark
    with one line naming `what` and the child's last error line."""
    done = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, cwd=cwd)
    if done.returncode:
        raise SystemExit(f"{what}: {(done.stderr.strip().splitlines() or ['failed'])[-1]}")
    return json.loads(done.stdout.splitlines()[-1])
