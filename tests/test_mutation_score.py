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
    meta(tmp_path / "stages" / "fetch.py.meta", {"a": None, "b": None})               # never run
    table = mutation_score.scores(tmp_path)
    assert set(table) == {"shards/mapped", "stages/fetch"}
    text = mutation_score.render(table, 125.0)
    rows = [line for line in text.splitlines() if line.startswith("| `") or line.startswith("| **")]
    assert rows == ["| `shards/mapped` | 4 | 2 | 1 | 1 | 0 | 0 | 0 | 75% |",
                    "| **all** | 4 | 2 | 1 | 1 | 0 | 0 | 0 | 75% |"]
    assert "took 2 min on" in text and "Not run this time: `stages/fetch`." in text
