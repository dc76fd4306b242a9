"""Re-record the DVC command outputs the README embeds (results/dvc/*.txt) from a real run,
or check them against one. (A benchmark's output is recorded by benchmarks/record.py.)

Each recording is its own script: a line `$ <command>` is run (bash, COLUMNS=120, the
project's .venv/bin first on PATH) and the lines up to the next `$ ` are what it printed,
stdout and stderr together as a terminal shows them. Recordings run in RECORDINGS' order,
each where it says: in the repository itself (commands that only read), or in a scratch
clone of its last commit whose outputs are pulled from the repository's DVC cache, so
experiments never touch the user's workspace and the clone starts as a fresh clone would
after `make repro`.

    python tools/record_commands.py                  # after `make repro`: rewrite results/dvc/*.txt
    python tools/record_commands.py --check          # compare instead; exit 1 naming every difference
    python tools/record_commands.py --check --repo R --clone C   # R's recordings, run in the ready clone C
    python tools/record_commands.py --refill         # only refill the pages' blocks from results/ as it is

`--check` compares with measurements excepted by pattern (numbers with their units, commit
and experiment ids, runs of spaces and table rules), never by hand. After a rewrite, every
embed block of the README and docs/ is refilled from the files.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (recording, where it runs): "repo" reads the repository as it is; "clone" runs in the
# scratch clone, in this order (the experiments of one are the next one's rows).
RECORDINGS = [
    ("results/dvc/disk.txt", "repo"),
    ("results/dvc/metrics_show.txt", "clone"),
    ("results/dvc/exp_run.txt", "clone"),
    ("results/dvc/exp_show.txt", "clone"),
    ("results/dvc/params_diff.txt", "clone"),
]
TIMEOUT_S = 3600  # one command: an experiment reruns the shard stages of both data sets


def parse(text: str) -> list[tuple[str, str]]:
    """[(command line, recorded output)] of one recording."""
    steps: list[tuple[str, str]] = []
    for line in text.splitlines(keepends=True):
        if line.startswith("$ "):
            steps.append((line[2:].rstrip("\n"), ""))
        elif steps:
            steps[-1] = (steps[-1][0], steps[-1][1] + line)
        elif line.strip():
            raise ValueError(f"output before the first '$ ' line: {line!r}")
    return steps


def render(steps: list[tuple[str, str]]) -> str:
    return "".join(
        f"$ {command}\n{output}" + ("" if not output or output.endswith("\n") else "\n") for command, output in steps
    )


def environment(repo: Path) -> dict[str, str]:
    venv = repo / ".venv" / "bin"
    return {
        **os.environ,
        "COLUMNS": "120",
        "DVC_NO_ANALYTICS": "1",
        "NO_COLOR": "1",
        "PATH": f"{venv}{os.pathsep}{os.environ['PATH']}" if venv.is_dir() else os.environ["PATH"],
    }


def run(command: str, cwd: Path, env: dict[str, str]) -> str:
    """What `command` prints, stdout and stderr in the order written; a failure is an error."""
    result = subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=TIMEOUT_S,
    )
    if result.returncode != 0:
        raise RuntimeError(f"`{command}` in {cwd} exited {result.returncode}:\n{result.stdout[-3000:]}")
    return result.stdout


def make_clone(repo: Path, into: Path, env: dict[str, str]) -> Path:
    """A clone of `repo`'s last commit with its outputs pulled from `repo`'s DVC cache (used
    as a remote) into a cache of its own: as a fresh clone after `make repro`, with no
    run-cache, so the experiments run their stages rather than restoring earlier runs."""
    clone = into / "clone"
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
    for command in (f"dvc remote add --local -d recorder {repo / '.dvc' / 'cache'}", "dvc pull -q"):
        run(command, clone, env)
    return clone


NUMBER = re.compile(r"(?<![\w-])-?\d+(?:[.,]\d+)*\s?(?:[kKMGT]i?B?|B|ms|us|s|x|%)?(?![\w.])")
IDENT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")  # letters and digits: a hash
TREE_ID = re.compile(r"(?<=[├└]── )[0-9a-f]{7,40}\b")  # an experiment row's id, even one of digits only
RULE = re.compile(r"[─━═]+")


def normalized(text: str) -> list[str]:
    """Lines with what a measurement or a run changes replaced: numbers (with units) by '#',
    commit and experiment ids by '@' (an experiment row's id even when its hex holds no
    letter), table rules and runs of spaces by one space; the experiment rows under one
    baseline sorted (two made in the same second tie in `dvc exp show`'s order, and the
    tree's last row has its own glyph)."""
    lines: list[str] = []
    children: list[str] = []
    for line in text.splitlines():
        line = RULE.sub("-", NUMBER.sub("#", IDENT.sub("@", TREE_ID.sub("@", line))))
        line = re.sub(r"\s+", " ", line.replace("├", "+").replace("└", "+")).strip()
        if line.startswith("+-"):
            children.append(line)
            continue
        lines += sorted(children)
        children = []
        if line:
            lines.append(line)
    return lines + sorted(children)


def record(repo: Path, clone: Path, check: bool, env: dict[str, str]) -> list[str]:
    """Run every recording; rewrite it (or, with `check`, compare): the problems found."""
    problems = []
    for name, where in RECORDINGS:
        path = repo / name
        steps = parse(path.read_text())
        cwd = repo if where == "repo" else clone
        fresh = [(command, run(command, cwd, env)) for command, _ in steps]
        if not check:
            path.write_text(render(fresh))
            print(f"recorded {name}", file=sys.stderr)
            continue
        for (command, old), (_, new) in zip(steps, fresh):
            if normalized(old) != normalized(new):
                diff = difflib.unified_diff(normalized(old), normalized(new), "recorded", "now", lineterm="", n=1)
                problems.append(f"{name}: `{command}` prints something else:\n" + "\n".join(diff))
    return problems


def refresh_pages(repo: Path) -> None:
    """Every embed and include block of the README and docs/ refilled from its file."""
    sys.path.insert(0, str(repo))
    from pipeline.stages.report.blocks import embed

    for page in [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]:
        text = page.read_text()
        if embed(text, repo) != text:
            page.write_text(embed(text, repo))
            print(f"refreshed {page.relative_to(repo)}", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repo", type=Path, default=ROOT, help="the repository whose recordings these are")
    parser.add_argument(
        "--clone",
        type=Path,
        help="a ready clone to run the 'clone' recordings in (default: a scratch clone of --repo, removed after)",
    )
    parser.add_argument("--check", action="store_true", help="compare with the recordings instead of rewriting")
    parser.add_argument(
        "--refill",
        action="store_true",
        help="only refill every page's embed and include blocks from the files as they are "
        "(after a benchmark wrote its results)",
    )
    args = parser.parse_args()
    repo = args.repo.resolve()
    if args.refill:
        refresh_pages(repo)
        return 0
    env = environment(repo)
    with tempfile.TemporaryDirectory(prefix="record-") as scratch:
        clone = args.clone.resolve() if args.clone else make_clone(repo, Path(scratch), env)
        problems = record(repo, clone, args.check, env)
    if not args.check:
        refresh_pages(repo)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
