"""Run a benchmark and keep what it printed, for the docs to embed.

    python benchmarks/record.py scale -- python benchmarks/scale.py data/csv/mnist/train.csv --scale 10

writes results/benchmarks/<machine>/scale.txt: the command, the machine (CPU model, cores,
memory) and the benchmark's output, exactly as printed. `make publish` copies each such
file into docs/results.md (and into any README block that names it), and a test fails while
they differ, so such a figure is always one a command printed, on the machine it names.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def machine() -> tuple[str, str]:
    """(folder slug, one-line description) of this machine. The folder is named by the CPU
    model and cores alone (hosts sold under one name share it); the description names the
    fingerprint too (`amd-epyc-2c-avx512bf16`: the instruction sets that change the figures),
    the name the bench's own figures carry, so a recording says which of them it is."""
    from pipeline.budget.machine import cpu_model, fingerprint, memory_gb, slug

    cores = os.cpu_count() or 1
    named = fingerprint("cpu").name
    return f"{slug(cpu_model())}-{cores}c", f"{cpu_model()}, {cores} cores, {memory_gb():.0f} GiB ({named})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name", help="file name under results/benchmarks/<machine>/ (without .txt)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the benchmark command")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or not re.fullmatch(r"[a-z0-9_-]+", args.name):
        parser.error("usage: record.py NAME -- COMMAND ...  (NAME: lowercase letters, digits, - and _)")
    slug, description = machine()
    result = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    sys.stdout.write(result.stdout)
    if result.returncode:
        sys.exit(f"{shlex.join(command)} failed (exit {result.returncode}); nothing recorded")
    out = ROOT / "results" / "benchmarks" / slug / f"{args.name}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(f"$ {shlex.join(command)}\n# {description}\n{result.stdout}")
    print(f"recorded {out.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
