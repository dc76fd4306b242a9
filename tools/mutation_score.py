"""The mutation score per module, from mutmut's results (mutants/pipeline/*.py.meta).

    python tools/mutation_score.py --seconds 1234 --keep results/mutation/score.md > score.md.new
    python tools/mutation_score.py --recheck-survivors     # after writing tests for survivors
    python tools/mutation_score.py --remark results/mutation/score.md > score.md.new   # no run: marks as of now

`make mutants` runs mutmut and then this; docs/results.md embeds the table it writes. With
`--keep`, the rows of an earlier table for modules this run left out are carried over, each
marked with the commit of the run that measured it and whether the module's source has
changed since (git), so that partial runs add up to one table that says which rows are current.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from mutmut.stats import status_by_exit_code

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
COLUMNS = ("killed", "survived", "timeout", "no tests", "suspicious", "not checked")


def scores(meta_dir: Path) -> dict[str, Counter]:
    """Per module (its path under the package, e.g. `shards/mapped`), how many mutants ended how."""
    table: dict[str, Counter] = {}
    for meta in sorted(meta_dir.rglob("*.py.meta")):
        codes = json.loads(meta.read_text())["exit_code_by_key"].values()
        name = meta.relative_to(meta_dir).as_posix().removesuffix(".py.meta")
        table[name] = Counter(status_by_exit_code[code] for code in codes)
    return table


def recheck_survivors(meta_dir: Path) -> int:
    """Mark every surviving mutant as not checked, so that the next `mutmut run` runs it again;
    returns how many. mutmut keeps a verdict until its function changes, so tests written for
    survivors are counted only after this."""
    count = 0
    for meta in sorted(meta_dir.rglob("*.py.meta")):
        doc = json.loads(meta.read_text())
        survived = [key for key, code in doc["exit_code_by_key"].items() if status_by_exit_code[code] == "survived"]
        doc["exit_code_by_key"].update(dict.fromkeys(survived))
        if survived:
            meta.write_text(json.dumps(doc))
        count += len(survived)
    return count


def earlier_rows(text: str) -> dict[str, tuple[Counter, str]]:
    """Per module, the counts and the commit of an earlier table (`render`'s output); rows it
    had carried over keep the commit they were marked with."""
    found = re.search(r"^mutmut .*?, commit ([\w.-]+);", text, re.MULTILINE)  # the footer's
    commit = found.group(1) if found else "unknown"
    rows: dict[str, tuple[Counter, str]] = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        named = (
            re.fullmatch(r"`([\w/]+)`(?: \(commit ([\w.-]+)(?:, [\w ]+)?\))?", cells[0])
            if line.startswith("| `")
            else None
        )
        if named and len(cells) == len(COLUMNS) + 3:
            counts = Counter({column: int(cells[2 + i]) for i, column in enumerate(COLUMNS)})
            rows[named.group(1)] = (counts, named.group(2) or commit)
    return rows


def render(
    table: dict[str, Counter],
    seconds: float | None,
    note: str = "",
    earlier: dict[str, tuple[Counter, str]] | None = None,
    commit: str | None = None,
    same_code: Callable[[str, str], bool | str | None] | None = None,
    configured: list[str] | None = None,
) -> str:
    """The table of the modules whose mutants were run, then those an earlier table measured
    (`earlier_rows`) marked with its commit and whether `same_code(module, at)` (default: git
    finds no change to the module's file between `at` and this run's `commit`, or the working
    tree; None where git cannot tell); the modules neither measured are named below, and so
    are the `configured` ones (pyproject's only_mutate) that no row stands for."""
    same_code = same_code or (lambda module, at: _same_code(module, at, commit))
    lines = [
        "| module | mutants | " + " | ".join(COLUMNS) + " | score |",
        "|---|---:|" + "---:|" * len(COLUMNS) + "---:|",
    ]
    total: Counter = Counter()
    skipped, carried = [], []
    for module, counts in table.items():
        if counts["not checked"] == sum(counts.values()):
            if module in (earlier or {}):
                carried.append(module)
            else:
                skipped.append(f"`{module}`")
            continue
        total.update(counts)
        lines.append(_row(f"`{module}`", counts))
    for module in carried:
        counts, measured_at = earlier[module]
        total.update(counts)
        same = same_code(module, measured_at)
        since = {
            None: "",
            True: ", same code",
            False: ", code changed since",
            "gone": ", module moved or removed since",
        }
        lines.append(_row(f"`{module}` (commit {measured_at}{since[same]})", counts))
    lines.append(_row("**all**", total))
    rowed = {module for module, counts in table.items() if counts["not checked"] != sum(counts.values())}
    unmeasured = [f"`{m}`" for m in configured or [] if m not in rowed and m not in carried]
    ran = f"a fresh run took {_minutes(seconds)} on {os.cpu_count()} cores" if seconds else "results"
    footer = (
        f"\nmutmut {ran}, commit {commit or _commit()}; score = (killed + timeout) / (mutants - not checked)."
        + (
            " A row marked with a commit was measured by the run at that commit (its module was not in this run);"
            " 'same code': the module's source is unchanged since (its tests may have changed), 'code changed"
            " since': it is not."
            if carried
            else ""
        )
        + (f" Not run this time: {', '.join(skipped)}." if skipped else "")
        + (
            f" Measured by no run kept here (the score says nothing of them): {', '.join(unmeasured)}."
            if unmeasured
            else ""
        )
        + (f" {note}" if note else "")
    )
    return "\n".join(lines) + "\n" + footer + "\n"


def configured_modules(pyproject: Path) -> list[str]:
    """The modules `make mutants` mutates (pyproject's [tool.mutmut] only_mutate), named as
    the table names them (`shards/mapped`)."""
    import tomllib

    paths = tomllib.loads(pyproject.read_text(encoding="utf-8"))["tool"]["mutmut"]["only_mutate"]
    return [p.removeprefix("pipeline/").removesuffix(".py") for p in paths]


def _row(name: str, counts: Counter) -> str:
    mutants = sum(counts.values())
    checked = mutants - counts["not checked"]
    score = f"{100 * (counts['killed'] + counts['timeout']) / checked:.0f}%" if checked else "n/a"
    return f"| {name} | {mutants} | " + " | ".join(str(counts[c]) for c in COLUMNS) + f" | {score} |"


def _same_code(module: str, at: str, now: str | None = None) -> bool | str | None:
    """Whether pipeline/<module>.py is the same at commit `at` as at `now` (a commit; None:
    the working tree); "gone" where the working tree has no such module (moved or removed).
    None where git cannot say: no git, no repository, an unknown commit."""
    if now is None and not (Path(__file__).resolve().parents[1] / "pipeline" / f"{module}.py").exists():
        return "gone"
    command = ["git", "diff", "--quiet", at, *([now] if now else []), "--", f"pipeline/{module}.py"]
    try:
        result = subprocess.run(command, cwd=Path(__file__).resolve().parents[1], capture_output=True)
    except OSError:
        return None
    return {0: True, 1: False}.get(result.returncode)


def _commit() -> str:
    result = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return result.stdout.strip() or "unknown"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--meta", type=Path, default=Path("mutants/pipeline"))
    parser.add_argument("--seconds", type=float, help="how long the mutmut run took")
    parser.add_argument("--note", default="", help="a sentence on how the run went (stopped, resumed, ...)")
    parser.add_argument("--keep", type=Path, help="an earlier table whose rows stand for the modules not run")
    parser.add_argument("--commit", help="the commit the run tested, where it is no longer HEAD")
    parser.add_argument(
        "--recheck-survivors",
        action="store_true",
        help="mark the survivors not checked (after new tests), print how many, write no table",
    )
    parser.add_argument(
        "--remark",
        type=Path,
        help="an earlier table, every row carried and marked against the working tree (no mutmut run)",
    )
    args = parser.parse_args()
    if args.remark:  # each row keeps its counts and commit; 'same code' is said as of now
        earlier = earlier_rows(args.remark.read_text(encoding="utf-8"))
        carried = {module: Counter({"not checked": sum(counts.values())}) for module, (counts, _) in earlier.items()}
        print(render(carried, None, args.note, earlier, None, configured=configured_modules(PYPROJECT)), end="")
        return
    if args.recheck_survivors:
        print(f"{recheck_survivors(args.meta)} surviving mutants will be run again by the next `mutmut run`")
        return
    earlier = earlier_rows(args.keep.read_text(encoding="utf-8")) if args.keep and args.keep.is_file() else None
    configured = configured_modules(PYPROJECT)
    print(render(scores(args.meta), args.seconds, args.note, earlier, args.commit, configured=configured), end="")


if __name__ == "__main__":
    main()
