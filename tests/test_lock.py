"""dvc.lock against the committed files: the lock records every committed file and param a
stage depends on as committed, so a fresh clone's `make repro` reruns no stage for code or
settings the lock has not seen (only the machine fingerprint, always run, and stages whose
outputs the clone lacks). A check of the project's own files: `make check-docs`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.docs

ROOT = Path(__file__).resolve().parents[1]


def test_the_committed_lock_records_the_committed_code_and_params():
    tracked = set(
        subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    )
    done = subprocess.run(
        [sys.executable, "-m", "dvc", "status", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    stale = {}
    for stage, changes in json.loads(done.stdout or "{}").items():
        for change in changes:
            if not isinstance(change, dict):
                continue
            for dep, how in change.get("changed deps", {}).items():  # a params file: {key: how}
                committed = dep in tracked or any(path.startswith(dep.rstrip("/") + "/") for path in tracked)
                if committed and (how == "modified" or isinstance(how, dict) and how):
                    stale.setdefault(stage, []).append(dep if isinstance(how, str) else f"{dep} {sorted(how)}")
    assert not stale, f"dvc.lock does not record these as committed (run the stages or `dvc commit` them): {stale}"


def test_the_committed_code_lists_are_the_committed_codes():
    """deps/ is the `code` stage's output, kept by git: a list that lags the code it names
    would leave a stage that runs an edited file up to date in `dvc status`."""
    sys.path.insert(0, str(ROOT / "tools"))
    from stage_deps import code_lists, differing

    assert differing(ROOT / "deps", code_lists()) == [], "run python tools/stage_deps.py --out deps (the code stage)"
