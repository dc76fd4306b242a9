"""The report rendered from files, and written: the stage's own module.

Inputs: this workspace's bench metrics (`metrics/bench/<dataset>.json`), the runs committed
from other machines (`results/<machine>/<dataset>.json`), the codec table
(`metrics/codecs.json`) and the recorded benchmark outputs under `results/`. Outputs: the
results page, written whole (results.md under data/report/ in the pipeline; `docs/results.md`
with `make publish`), its charts (SVG and the Vega-Lite spec of each), the plot data `dvc
plots show` draws, and, with `make publish`, the README's generated and embedded blocks
(the prose around them stays).

Every metrics file is untrusted: read with a byte cap and checked against a schema before
anything is rendered; a bad one stops the stage with one line naming the file and the key.
Nothing rendered can contain a block marker, so a run never makes the README grow.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pipeline.bench.document import CodecTable
from pipeline.core.atomic import atomic_dir, write_text
from pipeline.stages.report import charts
from pipeline.stages.report.blocks import embed, splice
from pipeline.stages.report.charts import budget_csv, chart_specs, ladder_csv, race_rows
from pipeline.stages.report.data import Run, as_model, collect_runs, newest, race_docs, read_metrics
from pipeline.stages.report.tables import NOTE, bench_time, budget_table, codec_markdown, headline_table, ladder_table


def image(name: str, alt: str, prefix: str) -> str:
    return f"![{alt}]({prefix}img/{name}.svg)"


README_MACHINES = 2


def on_readme(machines: dict[str, dict[str, Run]]) -> dict[str, dict[str, Run]]:
    """The machines the README shows: this machine first, then the committed ones, at most
    `README_MACHINES`, so the README stays the same length however many machines commit
    their results (docs/results.md shows every one)."""
    return dict(list(machines.items())[:README_MACHINES])


def blocks(machines: dict[str, dict[str, Run]], codecs: dict | None, images: set[str]) -> dict[str, str]:
    """The README's generated blocks, by name."""
    shown = on_readme(machines)
    more = len(machines) - len(shown)
    rest = (
        f" {more} more machine{'s' if more > 1 else ''}: [docs/results.md](docs/results.md#headline)." if more else ""
    )
    out = {
        "headline": headline_table(shown) + rest if machines else "No bench results yet: run `dvc repro`.",
        "bench-time": bench_time(shown),
    }
    out["ladder-chart"] = (
        image("ladder", "Seconds per train epoch per rung, per machine (log scale)", "docs/")
        if "ladder" in images
        else "No bench results yet."
    )
    out["codec-chart"] = (
        image("codecs", "Train split size by Parquet codec", "docs/")
        if "codecs" in images
        else "No codec table yet: run `dvc repro codecs`."
    )
    out["budget-chart"] = (
        image("budget", "Where a train step's time goes, per rung", "docs/")
        if "budget" in images
        else "The bench metrics on hand carry no time budget yet: run `dvc repro bench@mnist`."
    )
    return out


def benchmark_outputs(root: Path, folders: set[Path]) -> list[Path]:
    """Recorded benchmark outputs: results/benchmarks/<machine>/<name>.txt, and the text
    outputs kept beside a machine's bench results (`folders`: results/<machine>/)."""
    base = root.resolve() / "results"
    recorded = set(base.glob("benchmarks/*/*.txt")) if base.is_dir() else set()
    return sorted(recorded | {t for folder in folders for t in folder.glob("*.txt")})


def results_page(
    machines: dict[str, dict[str, Run]],
    codecs: dict | None,
    images: set[str],
    root: Path,
    folders: set[Path],
    docs: str = "",
) -> str:
    """The results page, whole: docs/results.md, or this machine's report (`docs`: the path from
    the page's folder to docs/, for its links)."""
    parts = [
        "# Results",
        "",
        "<!-- Written by `python -m pipeline report` from metrics/ and results/; edits here are overwritten. -->",
        "",
        "Every figure on this page comes from a file: `metrics/bench/<dataset>.json` (this machine's "
        "`dvc repro`) and `results/<machine>/<dataset>.json` (runs committed from other machines; the "
        f"newest run of each machine is shown). How they are measured: [the bench]({docs}bench.md).",
        "",
    ]
    if machines:
        parts += ["## Headline", "", headline_table(machines), ""]
    if "ladder" in images:
        parts += [image("ladder", "Seconds per train epoch per rung, per machine (log scale)", ""), ""]
    for machine, runs in machines.items():
        parts += [f"## `{machine}`", ""]
        parts += [p for r in runs.values() for p in (ladder_table(r), "")]
    if machines:
        parts += [NOTE, ""]
    budgets = [t for runs in machines.values() for r in runs.values() if (t := budget_table(r))]
    if budgets:
        parts += [
            "## Where a train step's time goes",
            "",
            "A profiled pass outside the timed epochs splits each train step into parts that add up to "
            f"the step ([how]({docs}bench.md#the-time-budget)).",
            "",
        ]
        if "budget" in images:
            parts += [image("budget", "Where a train step's time goes, per rung", ""), ""]
        parts += [p for t in budgets for p in (t, "")]
    if codecs:
        parts += [
            "## Parquet codecs",
            "",
            "Train split: Parquet size / seconds to read it back into uint8 "
            "arrays, a row group at a time (`metrics/codecs.json`).",
            "",
            codec_markdown(codecs),
            "",
        ]
        if "codecs" in images:
            parts += [image("codecs", "Train split size by Parquet codec", ""), ""]
    if "race" in images:
        parts += [
            "## The loader race",
            "",
            "The project's shards against the loaders users pick, from "
            f"`results/peers/` ([every measure, and how]({docs}shards.md#the-race)).",
            "",
            image("race", "The loader race: median seconds per system", ""),
            "",
        ]
    outputs = benchmark_outputs(root, folders)
    clocks = [path for path in outputs if path.name.startswith("cold_start")]  # shown beside the records
    outputs = [path for path in outputs if path not in clocks]
    if (root / "results" / "anchors.md").is_file():
        parts += [
            "## Against the public records",
            "",
            f"How each record is timed, and this project's two clocks ([warm and cold]({docs}bench.md#warm-and-cold)).",
            "",
            "<!-- include: results/anchors.md -->",
            "<!-- /include -->",
            "",
        ]
        for path in clocks:
            name = path.relative_to(root.resolve()).as_posix()
            parts += [f"<!-- embed: {name} -->", "```", "```", "<!-- /embed -->", ""]
    if outputs:
        parts += [
            "## Storage and loading benchmarks",
            "",
            "Each block is a benchmark's own output, recorded with `python benchmarks/record.py NAME -- "
            "COMMAND` (the command is its first line). Re-run them on your machine the same way: the "
            "figures depend on its cores, memory bandwidth and disk cache.",
            "",
        ]
        for path in outputs:
            name = path.relative_to(root.resolve()).as_posix()
            parts += [f"### `{name}`", "", f"<!-- embed: {name} -->", "```", "```", "<!-- /embed -->", ""]
    train = sorted((root / "metrics" / "train").glob("*.json")) if (root / "metrics" / "train").is_dir() else []
    if train:
        parts += ["## Training under torchrun (`train@<dataset>`)", ""]
        for path in train:
            name = path.relative_to(root).as_posix()
            parts += [f"<!-- embed: {name} -->", "```json", "```", "<!-- /embed -->", ""]
    if (root / "results" / "mutation" / "score.md").is_file():
        parts += [
            "## Mutation score",
            "",
            f"What it means: [testing]({docs}testing.md#mutation-testing).",
            "",
            "<!-- include: results/mutation/score.md -->",
            "<!-- /include -->",
            "",
        ]
    return embed("\n".join(parts).rstrip("\n") + "\n", root)


# --- the stage ----------------------------------------------------------------------------


@dataclass
class Rendered:
    """Everything the stage writes, as text, keyed by what it is."""

    readme: str | None
    results: str
    ladder_csv: str
    budget_csv: str
    specs: dict[str, str]  # image name -> spec text


def render_all(
    bench_paths: list[Path],
    codecs_path: Path | None,
    results_dir: Path | None,
    readme_text: str | None,
    root: Path,
    docs: str = "",
) -> tuple[Rendered, dict[str, charts.Spec]]:
    """What the stage writes, but the SVGs (see `write_report`), computed from the inputs alone
    (`readme_text` None: no README; `docs`: the path from the results page's folder to docs/)."""
    runs = collect_runs(bench_paths, results_dir)
    machines = newest(runs)
    codecs = None
    if codecs_path is not None and Path(codecs_path).exists():
        codecs = {
            d: {lay: dict(by) for lay, by in layouts.items()}
            for d, layouts in as_model(codecs_path, read_metrics(codecs_path), CodecTable).items()
        }
    specs = chart_specs(machines, codecs, race_rows(race_docs(results_dir)))
    local = [r for r in runs if r.local]
    readme = None if readme_text is None else embed(splice(readme_text, blocks(machines, codecs, set(specs))), root)
    inside = root.resolve()
    folders = {r.path.parent.resolve() for r in runs if not r.local and r.path.resolve().is_relative_to(inside)}
    rendered = Rendered(
        readme=readme,
        results=results_page(machines, codecs, set(specs), root, folders, docs),
        ladder_csv=ladder_csv(local),
        budget_csv=budget_csv(local),
        specs={name: charts.spec_text(s) for name, s in specs.items()},
    )
    return rendered, specs


def write_report(
    bench_paths: list[Path],
    codecs_path: Path | None,
    readme: Path | None,
    results_dir: Path | None,
    results_page_path: Path,
    images: Path,
    ladder_plot: Path,
    budget_plot: Path,
    root: Path | None = None,
) -> None:
    """Render everything from the inputs, then write it; a bad input changes no output.

    Without `readme`, the README is left alone: the pipeline's own run writes this machine's
    report beside its data, and only `make publish` (a maintainer's step) rewrites the pages
    under docs/ and the README's blocks."""
    root = (Path(readme).resolve().parent if readme is not None else Path.cwd()) if root is None else Path(root)
    page = Path(results_page_path)
    docs = Path(os.path.relpath(root.resolve() / "docs", page.resolve().parent)).as_posix() + "/"
    rendered, specs = render_all(
        bench_paths,
        codecs_path,
        results_dir,
        None if readme is None else Path(readme).read_text(),
        root,
        "" if docs == "./" else docs,
    )
    svgs = {name: charts.to_svg(spec) for name, spec in specs.items()}
    write_text(Path(ladder_plot), rendered.ladder_csv)
    write_text(Path(budget_plot), rendered.budget_csv)
    with atomic_dir(Path(images)) as tmp:
        for name, spec in rendered.specs.items():
            (tmp / f"{name}.vl.json").write_text(spec)
            (tmp / f"{name}.svg").write_text(svgs[name])
    write_text(page, rendered.results)
    if readme is not None and rendered.readme is not None:
        write_text(Path(readme), rendered.readme)
