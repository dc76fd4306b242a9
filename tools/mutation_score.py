"""The mutation score per module, from mutmut's results (mutants/pipeline/*.py.meta).

    python tools/mutation_score.py --seconds 1234 > results/mutation/score.md

`make mutants` runs mutmut and then this; docs/results.md embeds the table it writes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from collections import Counter
from pathlib import Path

from mutmut.stats import status_by_exit_code

COLUMNS = ("killed", "survived", "timeout", "no tests", "suspicious", "not checked")


def scores(meta_dir: Path) -> dict[str, Counter]:
    """Per module (its path under the package, e.g. `shards/mapped`), how many mutants ended how."""
    table: dict[str, Counter] = {}
    for meta in sorted(meta_dir.rglob("*.py.meta")):
        codes = json.loads(meta.read_text())["exit_code_by_key"].values()
        name = meta.relative_to(meta_dir).as_posix().removesuffix(".py.meta")
        table[name] = Counter(status_by_exit_code[code] for code in codes)
    return table


def render(table: dict[str, Counter], seconds: float | None, note: str = "") -> str:
    """The table of the modules whose mutants were run; the others are named below it."""
    lines = ["| module | mutants | " + " | ".join(COLUMNS) + " | score |",
             "|---|---:|" + "---:|" * len(COLUMNS) + "---:|"]
    total: Counter = Counter()
    skipped = []
    for module, counts in table.items():
        if counts["not checked"] == sum(counts.values()):
            skipped.append(f"`{module}`")
            continue
        total.update(counts)
        lines.append(_row(f"`{module}`", counts))
    lines.append(_row("**all**", total))
    ran = f"a fresh run took {_minutes(seconds)} on {os.cpu_count()} cores" if seconds else "results"
    footer = (f"\nmutmut {ran}, commit {_commit()}; score = (killed + timeout) / (mutants - not checked)."
              + (f" Not run this time: {', '.join(skipped)}." if skipped else "")
              + (f" {note}" if note else ""))
    return "\n".join(lines) + "\n" + footer + "\n"


def _row(name: str, counts: Counter) -> str:
    mutants = sum(counts.values())
    checked = mutants - counts["not checked"]
    score = f"{100 * (counts['killed'] + counts['timeout']) / checked:.0f}%" if checked else "n/a"
    return f"| {name} | {mutants} | " + " | ".join(str(counts[c]) for c in COLUMNS) + f" | {score} |"


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
    args = parser.parse_args()
    print(render(scores(args.meta), args.seconds, args.note), end="")


if __name__ == "__main__":
    main()
