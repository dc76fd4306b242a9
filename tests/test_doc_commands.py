"""Every shell command the README and docs/ show is one the project has: each `make` target
exists, each script and module exists, and every option given to it is one its `--help`
lists (`python -m pipeline ...`, the benchmarks and examples, `dvc ...`). A check of the
project's own documents: `make check-docs`."""

from __future__ import annotations

import functools
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.docs, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
STARTS = ("make ", "python ", "python3 ", ".venv/bin/", "dvc ", "torchrun ", "PIPELINE_MIRROR=", "RAY_ADDRESS=")


def blocks(text: str) -> list[list[str]]:
    """The lines of each fenced block of no language or a shell's, and of each block indented
    four spaces (outside fences), with continuation lines (ending in a backslash) joined."""
    found = [
        body.splitlines()
        for language, body in FENCE.findall(text)
        if language in ("", "sh", "bash", "console", "shell")
    ]
    outside = FENCE.sub("", text)
    found += [
        [line[4:] for line in block.group(0).splitlines()]
        for block in re.finditer(r"(?:^    .*\S.*\n)+", outside, re.MULTILINE)
    ]
    joined = []
    for lines in found:
        out: list[str] = []
        for line in lines:
            if out and out[-1].endswith("\\"):
                out[-1] = out[-1][:-1] + " " + line.strip()
            else:
                out.append(line)
        joined.append(out)
    return joined


def commands(page: Path) -> list[str]:
    """The shell commands in a page's blocks: a recorded block's `$ ` lines, or every line
    that starts as a command does; comments dropped, placeholders (`<...>`, `...`) left out."""
    found = []
    for lines in blocks(page.read_text()):
        recorded = [line[2:] for line in lines if line.startswith("$ ")]
        for line in recorded or [line.strip() for line in lines]:
            line = re.split(r"\s+#\s", line, maxsplit=1)[0].strip()
            if line.startswith(STARTS) and "..." not in line and "<" not in line:
                found.append(line)
    return found


CASES = sorted({(page.relative_to(ROOT).as_posix(), command) for page in PAGES for command in commands(page)})


@functools.lru_cache(maxsize=None)
def help_text(*argv: str) -> str:
    done = subprocess.run([*argv, "--help"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, f"{' '.join(argv)} --help: exit {done.returncode}: {done.stderr[-500:]}"
    return done.stdout


@functools.lru_cache(maxsize=None)
def make_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.MULTILINE))


def options(words: list[str]) -> list[str]:
    """The long options among `words`, without their `=value`."""
    return [word.split("=", 1)[0] for word in words if word.startswith("--") and len(word) > 2]


def check(command: str) -> None:
    words = [w for w in shlex.split(command) if not re.match(r"^[A-Z_]+=", w)]  # VAR=value before a command
    head = words[0]
    if head == "make":
        missing = [t for t in words[1:] if "=" not in t and t not in make_targets()]
        assert not missing, f"no make target {missing}"
        return
    if head == "dvc":
        sub = [w for w in words[1:3] if not w.startswith("-")][:2]
        text = (
            help_text(sys.executable, "-m", "dvc", *sub[:1])
            if len(sub) < 2 or sub[0] not in ("exp", "experiments", "plots", "metrics", "params", "cache", "remote")
            else help_text(sys.executable, "-m", "dvc", *sub)
        )
        unknown = [o for o in options(words) if o not in text]
        assert not unknown, f"dvc {' '.join(sub)}: no option {unknown}"
        return
    if head == "torchrun":
        words = [sys.executable, "-m", "torch.distributed.run", *words[1:]]
        head = sys.executable
    if head.endswith(("python", "python3")):
        rest = words[1:]
        at = next((i + 2 for i, w in enumerate(rest[:-1]) if w == "-m" and rest[i + 1] == "pipeline"), None)
        if at is not None:
            sub = rest[at]
            text = help_text(sys.executable, "-m", "pipeline", sub)
            unknown = [o for o in options(rest[at + 1 :]) if o not in text and not _script_args(rest[at + 1 :], o)]
            assert not unknown, f"pipeline {sub}: no option {unknown}"
        elif rest and rest[0].endswith(".py"):
            script = ROOT / rest[0]
            assert script.is_file(), f"{rest[0]}: no such script"
            if script.parent.name in ("benchmarks", "examples", "tools"):
                text = help_text(sys.executable, str(script))
                unknown = [o for o in options(rest[1:]) if o not in text]
                assert not unknown, f"{rest[0]}: no option {unknown}"
        return


def _script_args(words: list[str], option: str) -> bool:
    """Whether `option` comes after a script path (`profile SCRIPT ARGS`: the script's own)."""
    scripts = [i for i, w in enumerate(words) if w.endswith(".py")]
    return bool(scripts) and words.index(option) > scripts[0] if option in words else False


def test_the_pages_show_commands():
    assert len(CASES) > 20, CASES  # the extraction finds them


@pytest.mark.parametrize(("page", "command"), CASES, ids=[f"{p}: {c[:60]}" for p, c in CASES])
def test_every_command_in_the_docs_is_one_the_project_has(page, command):
    check(command)


@pytest.mark.parametrize(
    ("command", "said"),
    [
        ("make no-such-target", "no make target"),
        (".venv/bin/python benchmarks/peers.py --docs docs/shards.md", "no option ['--docs']"),
        ("python benchmarks/no_such.py", "no such script"),
        ("python -m pipeline profile --no-such-option train.py --epochs 2", "no option ['--no-such-option']"),
        ("dvc exp show --no-such-flag", "no option ['--no-such-flag']"),
    ],
)
def test_the_check_refuses_a_command_the_project_does_not_have(command, said):
    with pytest.raises(AssertionError, match=re.escape(said)):
        check(command)
