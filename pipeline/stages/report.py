"""Stage `report`: the tables a person reads, regenerated from the metrics files.

Writes the ladder's plot data (seconds per epoch per variant and data set), replaces the
README's "Results" section between its markers, and refreshes every block of the form

    <!-- embed: results/benchmarks/<machine>/scale.txt -->
    ```
    (the file's text)
    ```
    <!-- /embed -->

with the file it names (benchmark outputs, metrics), so the figures there are never typed by
hand and always match what the commands printed. A test fails when the README and these
files disagree.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from pipeline.core.atomic import write_text
from pipeline.core.errors import InputError

START, END = "<!-- results:start -->", "<!-- results:end -->"
EMBED = re.compile(r"<!-- embed: (?P<path>\S+) -->\n```(?P<lang>\w*)\n.*?```\n<!-- /embed -->", re.DOTALL)
INCLUDE = re.compile(r"<!-- include: (?P<path>\S+) -->\n.*?<!-- /include -->", re.DOTALL)  # markdown, unfenced
EMBED_ROOTS = ("results", "metrics")


class ReportError(InputError):
    """A README embed that names a file outside results/ or metrics/, or one that is missing."""


def embed(text: str, root: Path) -> str:
    """`text` with every embed block (fenced) and include block (markdown as is) refreshed
    from its file under `root` (the repository)."""
    def read(name: str) -> str:
        path = (root / name).resolve()
        if not any(path.is_relative_to((root / top).resolve()) for top in EMBED_ROOTS):
            raise ReportError(f"README embed {name!r}: only files under {' or '.join(EMBED_ROOTS)}/ may be embedded")
        if not path.is_file():
            raise ReportError(f"README embed {name!r}: no such file")
        return path.read_text().rstrip("\n")

    text = EMBED.sub(lambda m: f"<!-- embed: {m['path']} -->\n```{m['lang']}\n{read(m['path'])}\n```\n<!-- /embed -->",
                     text)
    return INCLUDE.sub(lambda m: f"<!-- include: {m['path']} -->\n{read(m['path'])}\n<!-- /include -->", text)


def _fmt(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _speedups(v: dict) -> str:
    steady = f"{v['speedup']}x" if "speedup" in v else "n/a"
    return f"{steady} / {v['wall_speedup']}x" if "wall_speedup" in v else steady


def ladder_table(doc: dict) -> str:
    """One data set's ladder: steady per-epoch figures beside what a user pays in all.

    Reads older documents too (no setup_s / wall_s: shown as n/a)."""
    env, params = doc["env"], doc["params"]
    floor = doc.get("floor", {})
    origin = f", commit {env['commit']}, {env['date']}" if "commit" in env else ""
    lines = [
        f"**{doc['dataset']}** on {env['device']} ({env['device_type']}, torch {env['torch']}, "
        f"{env['cpu_count']} CPUs{origin}), {params['epochs']} epochs, batch {params['batch_size']}:",
        "",
        "| variant | train s/epoch | test s/epoch | first epoch s | setup s | wall s | accuracy "
        "| vs naive: steady / wall |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, v in doc["variants"].items():
        mark = " *" if v["extrapolated"] else ""
        mark += " (graph)" if v.get("cuda_graph") else ""
        flag = "" if v.get("accuracy_ok", True) else " (outside tolerance)"
        lines.append(f"| {name}{mark} | {_fmt(v['train_s'])} | {_fmt(v['test_s'])} | "
                     f"{_fmt(v.get('first_epoch_train_s'))} | {_fmt(v.get('setup_s'), 2)} | "
                     f"{_fmt(v.get('wall_s'), 2)} | {_fmt(v['accuracy'], 4)}{flag} | {_speedups(v)} |")
    if floor:
        lines += ["", f"Compute floor (same steps on one fixed batch): {_fmt(floor['train_s'])} s/epoch"
                  + (f"; with `compiled`'s options {_fmt(floor['compiled_train_s'])} s/epoch"
                     if "compiled_train_s" in floor else "") + "."]
    return "\n".join(lines)


def codec_summary(codecs: dict) -> str:
    lines = ["| data set | layout | " + " | ".join(next(iter(next(iter(codecs.values())).values()))) + " |"]
    lines.append("|---|---|" + "---:|" * (lines[0].count("|") - 3))
    for dataset, layouts in codecs.items():
        for layout, by_codec in layouts.items():
            cells = [f"{e['train']['MB']:.2f} MB / {e['train']['read_s']:.3g} s" for e in by_codec.values()]
            lines.append(f"| {dataset} | {layout} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def results_docs(results_dir: Path | None) -> list[tuple[str, list[dict]]]:
    """(folder name, its bench documents) for every machine folder under results/."""
    if results_dir is None or not Path(results_dir).is_dir():
        return []
    folders = sorted(p for p in Path(results_dir).iterdir() if p.is_dir())
    return [(f.name, [json.loads(p.read_text()) for p in sorted(f.glob("*.json"))]) for f in folders
            if any(f.glob("*.json"))]


def render(bench_docs: list[dict], codecs: dict | None, machines: list[tuple[str, list[dict]]] = ()) -> str:
    parts = ["Regenerated by `dvc repro report` from `metrics/` and `results/`; do not edit by hand.", ""]
    if codecs:
        parts += ["Train split: Parquet size / seconds to read it back into a uint8 array.", "",
                  codec_summary(codecs), ""]
    if bench_docs:
        parts += ["### This machine (`dvc repro`)", ""]
    for doc in bench_docs:
        parts += [ladder_table(doc), ""]
    for name, docs in machines:
        parts += [f"### `results/{name}/`", ""]
        parts += [part for doc in docs for part in (ladder_table(doc), "")]
    parts.append("`*` extrapolated: timed over a fixed number of steps per epoch and scaled to the "
                 "full epoch; accuracy not measured for these. `(graph)`: each epoch replayed one CUDA "
                 "graph. setup s: everything before the first timed step (building the data path, "
                 "compiling, warm-up, graph capture); wall s: setup plus every epoch, train and test.")
    return "\n".join(parts)


def splice(readme: str, body: str) -> str:
    if START not in readme or END not in readme:
        raise ValueError(f"README has no {START} ... {END} markers")
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{body}\n{END}{tail}"


def ladder_rows(bench_docs: list[dict]) -> str:
    names = list(dict.fromkeys(n for d in bench_docs for n in d["variants"]))
    lines = ["variant," + ",".join(d["dataset"] for d in bench_docs)]
    for name in names:
        cells = [str(d["variants"].get(name, {}).get("train_s", "")) for d in bench_docs]
        lines.append(f"{name}," + ",".join(cells))
    return "\n".join(lines) + "\n"


def write_report(bench_paths: list[Path], codecs_path: Path | None, readme: Path, plot: Path,
                 results_dir: Path | None = None) -> None:
    docs = [json.loads(Path(p).read_text()) for p in bench_paths]
    codecs = json.loads(Path(codecs_path).read_text()) if codecs_path and Path(codecs_path).exists() else None
    write_text(Path(plot), ladder_rows(docs))
    text = splice(Path(readme).read_text(), render(docs, codecs, results_docs(results_dir)))
    write_text(Path(readme), embed(text, Path(readme).resolve().parent))
