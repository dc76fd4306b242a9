"""Stage `params`: the whole params.yaml checked, before any other stage runs.

DVC removes a stage's outputs before it runs the stage's command, so a stage that finds a bad
value in its own section has already lost what it made last time. Every other stage depends
on this stage's one small file, so `dvc repro` and `dvc exp run` stop here, at the first
stage, with one line, and remove no other output.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.core.atomic import write_text
from pipeline.core.params import load_params, validate_params

# What the stage writes: the same text whatever the values, so a valid change of one key
# reruns this check and then only the stages that read that key.
CHECKED = "params.yaml: every section and the rules between sections checked\n"


def check_params(path: Path, out: Path) -> None:
    """Validate the params file whole, then write `out`; a bad value raises ParamsError."""
    validate_params(load_params(path), path)
    write_text(Path(out), CHECKED)
