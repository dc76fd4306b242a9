"""The params check, DVC's first stage: a bad value stops `dvc repro` and `dvc exp run` before
DVC removes any output, with one line from the check (exit status 2)."""

from __future__ import annotations

import difflib
import hashlib
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import PARAMS, dvc_repo, run

ROOT = Path(__file__).resolve().parents[1]

# What the check says of each bad value: one line naming the key.
BAD = {
    ("shard", "samples_per_shard", -5): "shard.samples_per_shard: Input should be greater than or equal to 1 (got -5)",
    ("train", "world_size", 0): "train.world_size: Input should be greater than or equal to 1 (got 0)",
    ("train", "world_size", 3): "batch_size 512 does not split evenly across 3 ranks",
    ("bench", "lr", float("nan")): "bench.lr: Input should be a finite number (got nan)",
    ("bench", "variants", ("naive", "device", "naive")): "bench: variants: ['naive'] listed twice; each rung runs once",
}


def check(params: dict, folder: Path) -> subprocess.CompletedProcess:
    """`python -m pipeline check-params` on `params` written to `folder`."""
    path = folder / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "check-params", "--params", str(path), "--out", str(folder / "params.ok")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )


def test_the_committed_params_pass_the_check(tmp_path):
    result = check(yaml.safe_load(PARAMS.read_text()), tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "params.ok").is_file()


def test_a_data_set_sources_yaml_does_not_know_stops_at_the_check(tmp_path):
    """`datasets: [mnist, cifar]` with no `cifar` in sources.yaml: said by the params check,
    the first stage, not by the fetch stage after others ran."""
    params = yaml.safe_load(PARAMS.read_text())
    params["datasets"] = ["mnist", "cifar"]
    result = check(params, tmp_path)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "datasets: ['cifar'] not in sources.yaml (it has ['fashion-mnist', 'mnist'])" in result.stderr
    assert not (tmp_path / "params.ok").exists()


@pytest.mark.parametrize("bad", sorted(BAD), ids=lambda bad: f"{bad[0]}.{bad[1]}={bad[2]}")
def test_a_bad_value_is_one_line_and_exit_status_2(tmp_path, bad):
    params = yaml.safe_load(PARAMS.read_text())
    section, key, value = bad
    params[section][key] = list(value) if isinstance(value, tuple) else value
    result = check(params, tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("Error: "), result.stderr
    assert BAD[bad] in result.stderr
    assert not (tmp_path / "params.ok").exists()


@pytest.mark.parametrize(
    "text, said",
    [
        (None, r"params.yaml: no such params file$"),
        ("bench: [1, 2\n", r"params.yaml: not valid YAML: .* \(line 2, column 1\)$"),
        ("a: 1\na: 2\n", r"params.yaml: .*key 'a' is given twice"),
    ],
    ids=["missing", "unclosed", "key-twice"],
)
def test_an_unreadable_params_file_is_one_line_naming_it(tmp_path, text, said):
    """A missing or malformed params.yaml is refused as the check's own error, with the file's
    name (and the line and column of a YAML error): exit status 2, one line, nothing written."""
    path = tmp_path / "params.yaml"
    if text is not None:
        path.write_text(text)
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", "check-params", "--params", str(path), "--out", str(tmp_path / "params.ok")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert re.search(said, result.stderr.strip()), result.stderr
    assert not (tmp_path / "params.ok").exists()


# ------------------------------------------------------------ in a real DVC repository (slow)


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """A DVC repository whose shards of `tiny` are built and committed."""
    root, env = dvc_repo(tmp_path_factory.mktemp("repo"), ["tiny"])
    run([sys.executable, "-m", "dvc", "repro", "shard@tiny"], root, env)
    run(["git", "add", "-A"], root, env)
    run(["git", "commit", "-qm", "shards"], root, env)
    return root, env


def outputs(root: Path) -> dict[str, str]:
    """Every file under data/ but the check's own, by its sha256."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted((root / "data").rglob("*"))
        if p.is_file() and p.name != "params.ok"
    }


def restore(repo) -> None:
    """The committed params back, and the check's file with them. Written out, not `git
    checkout`: a failed `dvc exp run -S` may leave a value of the same length in the file,
    whose size and time git's index takes for unchanged."""
    root, env = repo
    for name in ("params.yaml", "dvc.lock"):
        (root / name).write_text(run(["git", "show", f"HEAD:{name}"], root, env).stdout)
    run([sys.executable, "-m", "dvc", "repro", "params"], root, env)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["repro", "exp run -S"])
@pytest.mark.parametrize(
    "bad",
    [bad for bad in sorted(BAD) if not isinstance(bad[2], tuple)][:2],
    ids=lambda bad: f"{bad[0]}.{bad[1]}={bad[2]}",
)  # scalars: what `-S key=value` spells
def test_a_bad_value_removes_no_output(repo, how, bad):
    """`dvc repro shard@tiny` after a bad edit, and `dvc exp run -S <bad> shard@tiny`: the check
    stage stops the run with its one line; the shards (and every other output) are as they were."""
    root, env = repo
    before = outputs(root)
    assert any(name.startswith("data/shards/tiny/") for name in before)
    section, key, value = bad
    try:
        if how == "repro":
            params = yaml.safe_load((root / "params.yaml").read_text())
            params[section][key] = value
            (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
            command = ["repro", "shard@tiny"]
        else:
            command = ["exp", "run", "-S", f"{section}.{key}={value}", "shard@tiny"]
        result = run([sys.executable, "-m", "dvc", *command], root, env, check=False)
        said = result.stdout + result.stderr
        assert outputs(root) == before, said
        assert result.returncode != 0, said
        assert BAD[bad] in said and "Traceback" not in said, said
        assert "Running stage 'shard@tiny'" not in said, said
    finally:
        restore(repo)


def leaves(node: object, prefix: tuple[str, ...] = ()) -> list[tuple[str, object]]:
    """Every scalar of a params tree, by its dotted key (lists left out)."""
    if isinstance(node, dict):
        return [leaf for key, value in node.items() for leaf in leaves(value, prefix + (key,))]
    return [] if isinstance(node, list) else [(".".join(prefix), node)]


def another(value: object) -> str:
    """A different value of the same kind, as `-S key=value` spells it."""
    if isinstance(value, bool):
        return str(not value).lower()
    if isinstance(value, int):
        return str(value + 1)
    if isinstance(value, float):
        return str(value / 2 if value else 0.5)  # half of 0.0 is 0.0: no change at all
    return f"x{value}"


def test_an_experiment_on_any_one_key_is_a_one_line_diff_of_params_yaml(tmp_path):
    """What `dvc exp run -S key=value` writes back (DVC's own writer): the one line of that
    key changed, nothing else (flow lists rewritten as block lists, long flow mappings
    wrapped, comments after a list dropped: each once made a one-key experiment a 40-line diff)."""
    from dvc.utils.hydra import apply_overrides

    text = PARAMS.read_text()
    wider = {}
    for key, value in leaves(yaml.safe_load(text)):
        path = tmp_path / "params.yaml"
        path.write_text(text)
        apply_overrides(path, [f"{key}={another(value)}"])
        changed = [
            line
            for line in difflib.unified_diff(text.splitlines(), path.read_text().splitlines(), n=0, lineterm="")
            if line[:1] in "+-" and line[:3] not in ("+++", "---")
        ]
        if len(changed) != 2:
            wider[key] = changed
    assert not wider, wider
