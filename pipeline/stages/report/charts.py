"""The report's pictures: Vega-Lite specs built from checked metrics, rendered to SVG offline.

Each spec carries its data inline, so the committed `docs/img/<name>.vl.json` says exactly
what `docs/img/<name>.svg` draws, and a test can rebuild the spec from the committed metrics
and compare. vl-convert (Rust, the Vega and Vega-Lite builds bundled) renders them without a
browser or a network. Only slugs and finite numbers reach a spec: `report` checks both before
calling anything here.
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from typing import Any

from pipeline.bench.document import CodecEntry, RaceDoc
from pipeline.stages.report.data import Run

VEGA_LITE = "https://vega.github.io/schema/vega-lite/v5.json"
# The parts of a train step, in the order the bench counts them (each a key of "budget").
BUDGET_PARTS = ("data_wait_s", "copy_s", "compute_s", "overhead_s", "other_s")
BUDGET_LABELS = {
    "data_wait_s": "data wait",
    "copy_s": "host-to-device copy",
    "compute_s": "compute",
    "overhead_s": "overhead (Python, launches)",
    "other_s": "other",
}

Spec = dict[str, Any]
PANEL_HEADER = {"labelOrient": "top", "labelAnchor": "start", "labelFontWeight": "bold", "labelFontSize": 12}


def log_base(values: list[float]) -> float:
    """Where log-scale bars start: the power of ten at or below the smallest positive value
    (a log axis has no 0, and a bar drawn from 0 does not show)."""
    positive = [v for v in values if v > 0]
    return 10.0 ** math.floor(math.log10(min(positive))) if positive else 1.0


def panels(rows: list[dict[str, Any]], field: str) -> list[str]:
    """The panels in the order the rows give them (not the alphabet's)."""
    return list(dict.fromkeys(r[field] for r in rows))


def bar_panels(
    title: str,
    rows: list[dict[str, Any]],
    panel: str,
    encoding: dict[str, Any],
    *,
    width: int = 420,
    step: int = 9,
    facet: str = "row",
) -> Spec:
    """Bars in panels, one per value of `panel` in the rows' order: the frame every chart here
    shares. Row panels get their own y scale (each lists only its own bars)."""
    spec: Spec = {
        "$schema": VEGA_LITE,
        "title": title,
        "data": {"values": rows},
        "facet": {
            facet: {
                "field": panel,
                "type": "nominal",
                "title": None,
                "header": PANEL_HEADER,
                "sort": panels(rows, panel),
            }
        },
        "spec": {"width": width, "height": {"step": step}, "mark": {"type": "bar"}, "encoding": encoding},
    }
    if facet == "row":
        spec["resolve"] = {"scale": {"y": "independent"}}
    return spec


def log_x(field: str, title: str, base: float, axis: dict[str, Any]) -> dict[str, Any]:
    """An x encoding on a log scale whose bars start at `base` (see `log_base`)."""
    return {
        "x": {
            "field": field,
            "type": "quantitative",
            "title": title,
            "axis": axis,
            "scale": {"type": "log", "domainMin": base},
        },
        "x2": {"datum": base},
    }


def ladder_spec(rows: list[dict[str, Any]]) -> Spec:
    """Seconds per train epoch per rung, log scale, one panel per machine, a bar per data set.

    `rows`: {"machine", "dataset", "variant", "rank", "train_s"}; `rank` is the rung's place
    in the ladder, so the bars keep the ladder's order rather than the alphabet's."""
    base = log_base([r["train_s"] for r in rows])
    top = max([r["train_s"] for r in rows], default=base)
    decades = [round(base * 10**k, 12) for k in range(0, max(1, math.ceil(math.log10(top / base))) + 1)]
    return bar_panels(
        "Seconds per train epoch, per rung (log scale, lower is better)",
        rows,
        "machine",
        {
            "y": {
                "field": "variant",
                "type": "nominal",
                "title": None,
                "sort": {"field": "rank", "order": "ascending"},
            },
            "yOffset": {"field": "dataset", "type": "nominal"},
            **log_x("train_s", "seconds per train epoch", base, {"values": decades, "format": "~g"}),
            "color": {"field": "dataset", "type": "nominal", "title": "data set"},
            "tooltip": [
                {"field": "machine"},
                {"field": "dataset"},
                {"field": "variant"},
                {"field": "train_s", "type": "quantitative", "title": "s/epoch"},
            ],
        },
    )


def codec_spec(rows: list[dict[str, Any]]) -> Spec:
    """Train split MB per codec, one panel per data set, a bar per layout.

    `rows`: {"dataset", "layout", "codec", "rank", "MB"}."""
    return bar_panels(
        "Train split size by Parquet codec (MB, smaller is better)",
        rows,
        "dataset",
        {
            "y": {"field": "codec", "type": "nominal", "title": None, "sort": {"field": "rank", "order": "ascending"}},
            "yOffset": {"field": "layout", "type": "nominal"},
            "x": {"field": "MB", "type": "quantitative", "title": "MB"},
            "color": {"field": "layout", "type": "nominal"},
        },
        width=260,
        facet="column",
    )


def budget_spec(rows: list[dict[str, Any]]) -> Spec:
    """Where a train step's time goes, per rung: one stacked bar per rung, each part's share
    of the step (the rungs' steps differ a thousandfold, so shares, not seconds, compare).

    `rows`: {"panel" ("<machine> / <dataset>"), "variant", "rank", "part", "order", "seconds"}."""
    return bar_panels(
        "Where a train step's time goes, per rung (share of the step)",
        rows,
        "panel",
        {
            "y": {
                "field": "variant",
                "type": "nominal",
                "title": None,
                "sort": {"field": "rank", "order": "ascending"},
            },
            "x": {
                "field": "seconds",
                "type": "quantitative",
                "stack": "normalize",
                "title": "share of a train step",
                "axis": {"format": "%"},
            },
            "color": {
                "field": "part",
                "type": "nominal",
                "title": "part of the step",
                "sort": [BUDGET_LABELS[p] for p in BUDGET_PARTS],
            },
            "order": {"field": "order", "type": "quantitative"},
            "tooltip": [
                {"field": "variant"},
                {"field": "part"},
                {"field": "seconds", "type": "quantitative", "title": "s per step"},
            ],
        },
        step=16,
    )


def race_spec(rows: list[dict[str, Any]]) -> Spec:
    """The loader race: median seconds per system, log scale, one panel per measure and scale,
    the project's bar set apart.

    `rows`: {"panel" ("<measure>, <n> samples"), "system", "project" (bool), "seconds"}."""
    base = log_base([r["seconds"] for r in rows])
    return bar_panels(
        "The loader race: median seconds (log scale, lower is better)",
        rows,
        "panel",
        {
            "y": {"field": "system", "type": "nominal", "title": None, "sort": {"field": "seconds"}},
            **log_x("seconds", "seconds (median)", base, {"format": "~g"}),
            "color": {
                "field": "project",
                "type": "nominal",
                "legend": None,
                "scale": {"domain": [True, False], "range": ["#d62728", "#7f7f7f"]},
            },
            "tooltip": [
                {"field": "panel"},
                {"field": "system"},
                {"field": "seconds", "type": "quantitative", "title": "s (median)"},
            ],
        },
        step=14,
    )


def spec_text(spec: Spec) -> str:
    """The committed form of a spec: stable key order and layout, so it diffs and compares."""
    return json.dumps(spec, indent=1, sort_keys=True, ensure_ascii=True) + "\n"


def to_svg(spec: Spec) -> str:
    """The chart as SVG text, rendered by vl-convert (no browser, no network), one element a
    line so that a re-render reads as a diff; the charts hold no text beside an element, so
    the line breaks are whitespace the renderer ignores."""
    import vl_convert

    return vl_convert.vegalite_to_svg(spec, allowed_base_urls=[]).replace("><", ">\n<") + "\n"


# --- plot data ----------------------------------------------------------------------------


def csv_text(header: list[str], rows: list[list[Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue()


def ladder_csv(runs: list[Run]) -> str:
    """This machine's ladder for `dvc plots show`: a row per variant, a column per data set."""
    names = list(dict.fromkeys(n for r in runs for n in r.doc.variants))
    rows = [[n] + [r.doc.variants[n].train_s if n in r.doc.variants else "" for r in runs] for n in names]
    return csv_text(["variant"] + [r.doc.dataset for r in runs], rows)


def budget_csv(runs: list[Run]) -> str:
    """This machine's budget for the stacked bars: a row per variant and part, seconds per step."""
    names = list(dict.fromkeys(n for r in runs for n, v in r.doc.variants.items() if v.budget))
    rows = []
    for n in names:
        for part in BUDGET_PARTS:
            cells = []
            for r in runs:
                b = r.doc.variants.get(n) and r.doc.variants[n].budget
                cells.append(getattr(b, part) if b else "")
            rows.append([n, BUDGET_LABELS[part]] + cells)
    return csv_text(["variant", "part"] + [r.doc.dataset for r in runs], rows)


# --- chart data ---------------------------------------------------------------------------


def ladder_rows(machines: dict[str, dict[str, Run]]) -> list[dict[str, Any]]:
    return [
        {"machine": m, "dataset": d, "variant": n, "rank": i, "train_s": v.train_s}
        for m, runs in machines.items()
        for d, r in runs.items()
        for i, (n, v) in enumerate(r.doc.variants.items())
    ]


def codec_rows(codecs: dict[str, dict[str, dict[str, CodecEntry]]]) -> list[dict[str, Any]]:
    return [
        {"dataset": d, "layout": layout, "codec": c, "rank": i, "MB": e.train.MB}
        for d, layouts in codecs.items()
        for layout, by in layouts.items()
        for i, (c, e) in enumerate(by.items())
    ]


def budget_rows(machines: dict[str, dict[str, Run]]) -> list[dict[str, Any]]:
    return [
        {
            "panel": f"{m} / {d}",
            "variant": n,
            "rank": i,
            "part": BUDGET_LABELS[p],
            "order": k,
            "seconds": getattr(v.budget, p),
        }
        for m, runs in machines.items()
        for d, r in runs.items()
        for i, (n, v) in enumerate(r.doc.variants.items())
        if v.budget
        for k, p in enumerate(BUDGET_PARTS)
    ]


# The race's measures the chart shows (benchmarks/peers.py task -> label); docs/shards.md has them all.
RACE_TASKS = {
    "write-none": "write, uncompressed",
    "epoch-0": "shuffled epoch, batch 512, workers 0",
    "first": "time to first batch",
}
SYSTEM_LABELS = {"litdata": "LitData", "streaming": "MosaicML Streaming", "webdataset": "WebDataset", "lance": "Lance"}


def race_rows(docs: list[RaceDoc]) -> list[dict[str, Any]]:
    """The median seconds of each system's runs of each charted measure, per scale."""
    rows = []
    for doc in docs:
        for task, label in RACE_TASKS.items():
            for system, tasks in doc.results.items():
                seconds = [r.seconds for r in tasks.get(task, []) if r.seconds is not None]
                if seconds:
                    rows.append(
                        {
                            "panel": f"{label}, {doc.meta.samples:,} samples",
                            "system": SYSTEM_LABELS.get(system, system),
                            "project": system == "project",
                            "seconds": statistics.median(seconds),
                        }
                    )
    return rows


def chart_specs(
    machines: dict[str, dict[str, Run]], codecs: dict | None, race: list[dict[str, Any]] | None = None
) -> dict[str, Spec]:
    """{image name: spec} of every chart the inputs support."""
    specs = {"ladder": ladder_spec(ladder_rows(machines))} if machines else {}
    if codecs:
        specs["codecs"] = codec_spec(codec_rows(codecs))
    budget = budget_rows(machines)
    if budget:
        specs["budget"] = budget_spec(budget)
    if race:
        specs["race"] = race_spec(race)
    return specs
