"""End to end: the real dvc.yaml in a temporary git repo, on a tiny generated mirror."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import tiny_dataset

ROOT = Path(__file__).resolve().parents[1]


def run(cmd: list[str], cwd: Path, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise AssertionError(f"{cmd} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def tiny_params(datasets: dict) -> dict:
    """The project's params.yaml with tiny data sets and settings small enough for a test."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["datasets"] = datasets
    params["mirrors"] = {name: [] for name in datasets}
    return params


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """A git + DVC repo holding the project's pipeline, and an environment to run it in."""
    root = tmp_path_factory.mktemp("repo")
    shutil.copytree(ROOT / "pipeline", root / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("dvc.yaml", ".dvcignore", ".gitignore"):
        shutil.copy(ROOT / name, root / name)
    mirror = root.parent / "mirror"
    datasets = {}
    for name, seed in (("tiny", 0), ("tiny-b", 7)):
        data = tiny_dataset(seed=seed)
        data.write_mirror(mirror / name)
        datasets[name] = {"files": data.files}
    (root / "params.yaml").write_text(yaml.safe_dump(tiny_params(datasets), sort_keys=False))
    env = {**os.environ, "PIPELINE_MIRROR": str(mirror), "DVC_NO_ANALYTICS": "1",
           "DVC_SITE_CACHE_DIR": str(root.parent / "site-cache"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    run(["git", "init", "-q"], root, env)
    shutil.copytree(ROOT / ".dvc", root / ".dvc", ignore=shutil.ignore_patterns("tmp", "cache"))
    run(["git", "add", "-A"], root, env)
    run(["git", "commit", "-qm", "init"], root, env)
    return root, env


def dvc(repo, *args, check=True):
    root, env = repo
    return run([sys.executable, "-m", "dvc", *args], root, env, check=check)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_fetch_and_csv_then_noop(repo):
    root, _ = repo
    out = dvc(repo, "repro", "csv@tiny", "csv@tiny-b").stdout
    assert "Running stage 'fetch@tiny'" in out and "Running stage 'csv@tiny-b'" in out
    header = (root / "data/csv/tiny/train.csv").read_text().splitlines()
    assert len(header) == 65 and header[0].startswith("label,pixel1,pixel2")
    assert len((root / "data/csv/tiny/test.csv").read_text().splitlines()) == 33
    again = dvc(repo, "repro", "csv@tiny", "csv@tiny-b").stdout
    assert "Running stage" not in again and "didn't change" in again


def test_corrupt_mirror_fails_cleanly(repo, tmp_path):
    root, env = repo
    mirror = Path(env["PIPELINE_MIRROR"])
    broken = tmp_path / "broken"
    shutil.copytree(mirror, broken)
    blob = broken / "tiny" / "train-images-idx3-ubyte.gz"
    blob.write_bytes(blob.read_bytes()[:-100])
    result = run([sys.executable, "-m", "pipeline", "fetch", "tiny", "--out", str(tmp_path / "raw")],
                 root, {**env, "PIPELINE_MIRROR": str(broken)}, check=False)
    assert result.returncode == 1
    assert "could not fetch train-images-idx3-ubyte.gz" in result.stderr
    assert "truncated gzip" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "raw").exists()
