"""tools/readme_walk.py reads the README's commands as a newcomer types them (CI runs the walk
itself: `make readme-walk`); here, what it would run, without running it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import readme_walk  # noqa: E402

README = """# x
```sh
make repro     # the main job
make test      # the suite
```
```python sketch
budget = TimeBudget("cuda")
```
```python
print("a program")
```
```
$ not a command block
```
<!-- embed: results/dvc/one.txt -->
"""


def test_the_walk_runs_sh_and_program_blocks_in_order_and_the_recorded_commands(tmp_path):
    (tmp_path / "results" / "dvc").mkdir(parents=True)
    (tmp_path / "results" / "dvc" / "one.txt").write_text("$ dvc exp show --drop 'A|B'   # a note\nout\n")
    text = readme_walk.script(README, tmp_path)
    runs = [line for line in text.splitlines() if not line.startswith(("echo ", "set ", "export "))]
    assert runs == [
        "make repro",
        "python - <<'README_PYTHON'",
        'print("a program")',
        "README_PYTHON",
        "dvc exp show --drop 'A|B'",
    ]
    assert "TimeBudget" not in text and "not a command block" not in text
    assert "make test: left to CI" in text
    dry = subprocess.run(["bash", "-n", "-c", text], capture_output=True, text=True)  # bash parses it
    assert dry.returncode == 0, dry.stderr


def test_the_repository_readme_has_its_quick_start_and_environment_lines():
    text = readme_walk.script((ROOT / "README.md").read_text(), ROOT)
    for command in ("make repro", ". .venv/bin/activate", "dvc metrics show", "make bench-quick"):
        assert f"\n{command}\n" in text, command


def test_a_new_terminal_has_no_virtual_environment(monkeypatch, tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    monkeypatch.setenv("VIRTUAL_ENV", str(venv))
    monkeypatch.setenv("PATH", f"{venv / 'bin'}:/usr/bin:/bin")
    env = readme_walk.clean_environment()
    assert "VIRTUAL_ENV" not in env and env["PATH"] == "/usr/bin:/bin"
