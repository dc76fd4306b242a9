"""tools/mutation_score.py: the table of a mutmut run, from its meta files (per module, in
the package's sub-folders), naming the modules whose mutants were not run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("mutmut")
sys.path.insert(0, str(ROOT / "tools"))
try:
    import mutation_score
finally:
    sys.path.pop(0)


def meta(path: Path, codes: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"exit_code_by_key": codes}))


def test_the_table_has_a_row_per_module_run_and_names_the_rest(tmp_path):
    meta(tmp_path / "shards" / "mapped.py.meta", {"a": 1, "b": 1, "c": 0, "d": 36})  # 2 killed, 1 survived, 1 timeout
    meta(tmp_path / "stages" / "fetch.py.meta", {"a": None, "b": None})  # never run
    table = mutation_score.scores(tmp_path)
    assert set(table) == {"shards/mapped", "stages/fetch"}
    text = mutation_score.render(table, 125.0)
    rows = [line for line in text.splitlines() if line.startswith("| `") or line.startswith("| **")]
    assert rows == [
        "| `shards/mapped` | 4 | 2 | 1 | 1 | 0 | 0 | 0 | 75% |",
        "| **all** | 4 | 2 | 1 | 1 | 0 | 0 | 0 | 75% |",
    ]
    assert "took 2 min on" in text and "Not run this time: `stages/fetch`." in text


def test_rows_of_an_earlier_run_stand_for_the_modules_not_run_marked_with_its_commit(tmp_path):
    """A partial run keeps the earlier table's rows for the modules it left out, each marked
    with the commit that measured it (carried over again with that same commit) and whether
    the module's code changed since, and counts them in the total; a module neither run
    measured is named below the table."""
    earlier = (
        "| module | mutants | killed | survived | timeout | no tests | suspicious | not checked | score |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"
        "| `shards/order` | 10 | 8 | 2 | 0 | 0 | 0 | 0 | 80% |\n"
        "| `bench/verdict` (commit 0123abc, same code) | 4 | 4 | 0 | 0 | 0 | 0 | 0 | 100% |\n"
        "| **all** | 14 | 12 | 2 | 0 | 0 | 0 | 0 | 86% |\n\n"
        "mutmut a fresh run took 35 min on 2 cores, commit 8c08e9a; score = ...\n"
    )
    rows = mutation_score.earlier_rows(earlier)
    assert rows["shards/order"] == (mutation_score.Counter(killed=8, survived=2), "8c08e9a")
    assert rows["bench/verdict"][1] == "0123abc" and "**all**" not in str(rows)
    meta(tmp_path / "shards" / "mapped.py.meta", {"a": 1, "b": 0})
    meta(tmp_path / "shards" / "order.py.meta", {"a": None})
    meta(tmp_path / "bench" / "verdict.py.meta", {"a": None})
    meta(tmp_path / "stages" / "fetch.py.meta", {"a": None})
    asked = []
    text = mutation_score.render(
        mutation_score.scores(tmp_path),
        None,
        earlier=rows,
        commit="fedcba9",
        same_code=lambda module, at: asked.append((module, at)) or module == "bench/verdict",
    )
    assert sorted(asked) == [("bench/verdict", "0123abc"), ("shards/order", "8c08e9a")]
    assert "mutmut results, commit fedcba9;" in text  # the run's own commit, not a carried row's
    lines = text.splitlines()
    assert "| `shards/order` (commit 8c08e9a, code changed since) | 10 | 8 | 2 | 0 | 0 | 0 | 0 | 80% |" in lines
    assert "| `bench/verdict` (commit 0123abc, same code) | 4 | 4 | 0 | 0 | 0 | 0 | 0 | 100% |" in lines
    assert "| **all** | 16 | 13 | 3 | 0 | 0 | 0 | 0 | 81% |" in lines
    assert "Not run this time: `stages/fetch`." in text and "measured by the run at that commit" in text
    again = mutation_score.earlier_rows(text)
    assert again["shards/order"][1] == "8c08e9a" and again["shards/mapped"][1] != "8c08e9a"
    assert again["bench/verdict"] == (mutation_score.Counter(killed=4), "0123abc")


def test_survivors_are_marked_to_run_again_and_nothing_else(tmp_path):
    """After tests are written for survivors, only the survivors are run again: killed,
    timed-out and never-run mutants keep what they have."""
    meta(tmp_path / "shards" / "order.py.meta", {"a": 1, "b": 0, "c": 36, "d": None, "e": 0})
    meta(tmp_path / "bench" / "ladder.py.meta", {"a": 1})
    assert mutation_score.recheck_survivors(tmp_path) == 2
    after = json.loads((tmp_path / "shards" / "order.py.meta").read_text())["exit_code_by_key"]
    assert after == {"a": 1, "b": None, "c": 36, "d": None, "e": None}
    assert mutation_score.scores(tmp_path)["shards/order"]["not checked"] == 3
    assert mutation_score.recheck_survivors(tmp_path) == 0


def test_a_carried_row_says_whether_its_module_changed_since_its_commit():
    """The default check asks git about the module's file: unchanged between the last commit
    that touched it and the working tree (when that is clean) or HEAD, changed since the
    commit that added it, and unknown for a commit git does not know."""
    import subprocess

    def git(*args: str) -> str:
        result = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        if result.returncode:
            pytest.skip(f"git {args[0]} fails here: not a checkout with history")
        return result.stdout

    path = "pipeline/shards/writer.py"
    touched = git("log", "--format=%h", "--", path).split()
    if len(touched) < 2:
        pytest.skip("a shallow clone: the file's history is not here")
    last, added = touched[0], touched[-1]
    if not git("status", "--porcelain", "--", path):
        assert mutation_score._same_code("shards/writer", last) is True
    assert mutation_score._same_code("shards/writer", last, "HEAD") is True
    assert mutation_score._same_code("shards/writer", added) is False
    assert mutation_score._same_code("shards/writer", added, last) is False
    assert mutation_score._same_code("shards/writer", "0" * 40) is None
    rows = {"shards/writer": (mutation_score.Counter(killed=1), "0" * 40)}
    text = mutation_score.render({"shards/writer": mutation_score.Counter({"not checked": 1})}, None, earlier=rows)
    assert f"| `shards/writer` (commit {'0' * 40}) | 1 | 1 |" in text


def test_a_table_reads_back_whatever_its_commit_is_called():
    """A table written where git could not name the commit ("unknown"), or for a named one,
    reads back with every row and the commit each was measured at."""
    for commit in ("unknown", "v1.2", "fedcba9"):
        rows = {"bench/verdict": (mutation_score.Counter(killed=4), "0123abc")}
        table = {
            "shards/order": mutation_score.Counter(killed=2, survived=1),
            "bench/verdict": mutation_score.Counter({"not checked": 4}),
        }
        text = mutation_score.render(table, None, earlier=rows, commit=commit, same_code=lambda module, at: True)
        again = mutation_score.earlier_rows(text)
        assert again == {
            "shards/order": (mutation_score.Counter(killed=2, survived=1), commit),
            "bench/verdict": (mutation_score.Counter(killed=4), "0123abc"),
        }, commit


def test_a_module_no_longer_in_the_tree_is_said_to_be_gone_not_changed():
    """Against the working tree, a row's module that moved (bench/verdict is budget/verdict now)
    is 'gone', one still there is compared by git."""
    assert mutation_score._same_code("bench/verdict", "HEAD") == "gone"
    assert mutation_score._same_code("shards/order", "HEAD") in (True, False)


def test_configured_modules_no_row_stands_for_are_named_as_unmeasured():
    table = {"shards/writer": mutation_score.Counter({"killed": 3})}
    text = mutation_score.render(table, None, configured=["shards/writer", "budget/verdict", "stages/mnist"])
    assert "Measured by no run kept here (the score says nothing of them): `budget/verdict`, `stages/mnist`." in text
    configured = mutation_score.configured_modules(mutation_score.PYPROJECT)
    assert "shards/mapped" in configured and all("/" in m and not m.endswith(".py") for m in configured)
