"""Run the README's commands as a newcomer types them: a fresh clone, a new shell, no venv.

In order, in one bash session started in a fresh clone of the last commit, with this
environment less any virtual environment (no VIRTUAL_ENV, no venv's bin on PATH):

1. every ```sh block of README.md, line by line (`set -e`); `make test` is left to CI's own
   step, which runs it on a fresh clone already;
2. every ```python block that is a program (a block marked `python sketch` is a sketch),
   with the `python` the blocks before left on PATH;
3. the DVC commands whose recorded output the README embeds (results/dvc/*.txt, their `$ `
   lines; test_recorded.py compares what they print);

then it checks the workspace: no tracked page (README.md, docs/) changed, and after
`git checkout -- . && dvc checkout` a repro of the data stages runs no stage.

    python tools/readme_walk.py                     # in a temporary folder, removed after
    python tools/readme_walk.py --keep /tmp/walk    # keep the clone there
    BUDGET_MIN=3 python tools/readme_walk.py        # the environment reaches make (CI: a shorter quick bench)
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
EMBED = re.compile(r"<!-- embed: (results/dvc/[\w.-]+\.txt) -->")
DATA_STAGES = "shard@mnist shard@fashion-mnist"
LEFT_TO_CI = re.compile(r"^make test\b")


def blocks(readme: str) -> list[tuple[str, str]]:
    """(language, body) of the README's runnable blocks, in order: `sh` and `python` ones,
    a block whose info string says `sketch` left out."""
    return [
        (lang, body) for lang, info, body in FENCE.findall(readme) if lang in ("sh", "python") and "sketch" not in info
    ]


def recorded(readme: str, root: Path) -> list[str]:
    """The `$ ` commands of the recordings the README embeds, in the README's order."""
    out = []
    for name in EMBED.findall(readme):
        out += [line[2:] for line in (root / name).read_text().splitlines() if line.startswith("$ ")]
    return out


def script(readme: str, root: Path) -> str:
    """The bash script a newcomer's terminal session amounts to."""
    lines = ["set -eo pipefail", "export COLUMNS=120 DVC_NO_ANALYTICS=1"]
    for lang, body in blocks(readme):
        if lang == "python":
            lines += [
                "echo '+ python - (a README block)'",
                "python - <<'README_PYTHON'",
                body.rstrip("\n"),
                "README_PYTHON",
            ]
            continue
        for line in body.splitlines():
            command = line.split("  #")[0].strip()
            if not command:
                continue
            if LEFT_TO_CI.match(command):
                lines.append(f"echo {shlex.quote(f'+ {command}: left to CI, which runs it on a fresh clone')}")
                continue
            lines += [f"echo {shlex.quote(f'+ {command}')}", command]
    for command in recorded(readme, root):
        command = command.split("  #")[0].strip()
        lines += [f"echo {shlex.quote(f'+ {command} (recorded in the README)')}", command]
    return "\n".join(lines) + "\n"


def clean_environment() -> dict[str, str]:
    """This environment as a new terminal has it: no virtual environment active, and none of
    the variables an outer `make` passes down (`make readme-walk`)."""
    outer = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEFILES")
    env = {k: v for k, v in os.environ.items() if k not in outer}
    venvs = {str(Path(os.environ["VIRTUAL_ENV"]) / "bin")} if "VIRTUAL_ENV" in os.environ else set()
    env["PATH"] = os.pathsep.join(
        p
        for p in os.environ.get("PATH", "").split(os.pathsep)
        if p not in venvs and not (Path(p).parent / "pyvenv.cfg").is_file()
    )
    return env


def bash(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", command], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def walk(clone: Path, env: dict[str, str]) -> list[str]:
    """Run the README in `clone`; the problems found, none when every command passed and the
    workspace stayed as the README says."""
    readme = (clone / "README.md").read_text()
    started = time.monotonic()
    session = subprocess.run(["bash", "-c", script(readme, clone)], cwd=clone, env=env)
    print(f"readme-walk: the README's commands took {(time.monotonic() - started) / 60:.1f} min", file=sys.stderr)
    if session.returncode != 0:
        return [f"a README command failed (exit {session.returncode}): see the last '+ ' line above"]
    problems = []
    pages = bash("git status --porcelain -- README.md docs", clone, env).stdout.strip()
    if pages:
        problems.append(f"the README's commands changed tracked pages:\n{pages}")
    back = bash(f"git checkout -- . && . .venv/bin/activate && dvc checkout -q && dvc repro {DATA_STAGES}", clone, env)
    if back.returncode != 0:
        problems.append(
            f"git checkout -- . && dvc checkout, then the data stages' repro failed:\n{back.stdout[-2000:]}"
        )
    elif "Running stage" in back.stdout:
        ran = [line for line in back.stdout.splitlines() if line.startswith("Running stage")]
        problems.append("after git checkout -- . && dvc checkout, the data stages' repro ran: " + "; ".join(ran))
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", type=Path, help="make the clone here and keep it (an empty or new folder)")
    args = parser.parse_args(argv)
    base = args.keep or Path(tempfile.mkdtemp(prefix="readme-walk-"))
    clone = base / "clone"
    try:
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        problems = walk(clone, clean_environment())
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)
    for problem in problems:
        print(f"readme-walk: {problem}", file=sys.stderr)
    if not problems:
        print(
            "readme-walk: every README command ran as written; no tracked page changed; the data stages "
            "came back with no rerun",
            file=sys.stderr,
        )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
