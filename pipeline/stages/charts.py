"""The report's pictures: Vega-Lite specs built from checked metrics, rendered to SVG offline.

Each spec carries its data inline, so the committed `docs/img/<name>.vl.json` says exactly
what `docs/img/<name>.svg` draws, and a test can rebuild the spec from the committed metrics
and compare. vl-convert (Rust, the Vega and Vega-Lite builds bundled) renders them without a
browser or a network. Only slugs and finite numbers reach a spec: `report` checks both before
calling anything here.
"""

from __future__ import annotations

import json
import math
from typing import Any

VEGA_LITE = "https://vega.github.io/schema/vega-lite/v5.json"
# The parts of a train step, in the order the bench counts them (each a key of "budget").
BUDGET_PARTS = ("data_wait_s", "copy_s", "compute_s", "overhead_s", "other_s")
BUDGET_LABELS = {"data_wait_s": "data wait", "copy_s": "host-to-device copy", "compute_s": "compute",
                 "overhead_s": "overhead (Python, launches)", "other_s": "other"}

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


def bar_panels(title: str, rows: list[dict[str, Any]], panel: str, encoding: dict[str, Any], *, width: int = 420,
               step: int = 9, facet: str = "row") -> Spec:
    """Bars in panels, one per value of `panel` in the rows' order: the frame every chart here
    shares. Row panels get their own y scale (each lists only its own bars)."""
    spec: Spec = {
        "$schema": VEGA_LITE,
        "title": title,
        "data": {"values": rows},
        "facet": {facet: {"field": panel, "type": "nominal", "title": None, "header": PANEL_HEADER,
                          "sort": panels(rows, panel)}},
        "spec": {"width": width, "height": {"step": step}, "mark": {"type": "bar"}, "encoding": encoding},
    }
    if facet == "row":
        spec["resolve"] = {"scale": {"y": "independent"}}
    return spec


def log_x(field: str, title: str, base: float, axis: dict[str, Any]) -> dict[str, Any]:
    """An x encoding on a log scale whose bars start at `base` (see `log_base`)."""
    return {"x": {"field": field, "type": "quantitative", "title": title, "axis": axis,
                  "scale": {"type": "log", "domainMin": base}},
            "x2": {"datum": base}}


def ladder_spec(rows: list[dict[str, Any]]) -> Spec:
    """Seconds per train epoch per rung, log scale, one panel per machine, a bar per data set.

    `rows`: {"machine", "dataset", "variant", "rank", "train_s"}; `rank` is the rung's place
    in the ladder, so the bars keep the ladder's order rather than the alphabet's."""
    base = log_base([r["train_s"] for r in rows])
    top = max([r["train_s"] for r in rows], default=base)
    decades = [round(base * 10**k, 12) for k in range(0, max(1, math.ceil(math.log10(top / base))) + 1)]
    return bar_panels("Seconds per train epoch, per rung (log scale, lower is better)", rows, "machine", {
        "y": {"field": "variant", "type": "nominal", "title": None, "sort": {"field": "rank", "order": "ascending"}},
        "yOffset": {"field": "dataset", "type": "nominal"},
        **log_x("train_s", "seconds per train epoch", base, {"values": decades, "format": "~g"}),
        "color": {"field": "dataset", "type": "nominal", "title": "data set"},
        "tooltip": [{"field": "machine"}, {"field": "dataset"}, {"field": "variant"},
                    {"field": "train_s", "type": "quantitative", "title": "s/epoch"}],
    })


def codec_spec(rows: list[dict[str, Any]]) -> Spec:
    """Train split MB per codec, one panel per data set, a bar per layout.

    `rows`: {"dataset", "layout", "codec", "rank", "MB"}."""
    return bar_panels("Train split size by Parquet codec (MB, smaller is better)", rows, "dataset", {
        "y": {"field": "codec", "type": "nominal", "title": None, "sort": {"field": "rank", "order": "ascending"}},
        "yOffset": {"field": "layout", "type": "nominal"},
        "x": {"field": "MB", "type": "quantitative", "title": "MB"},
        "color": {"field": "layout", "type": "nominal"},
    }, width=260, facet="column")


def budget_spec(rows: list[dict[str, Any]]) -> Spec:
    """Where a train step's time goes, per rung: one stacked bar per rung, each part's share
    of the step (the rungs' steps differ a thousandfold, so shares, not seconds, compare).

    `rows`: {"panel" ("<machine> / <dataset>"), "variant", "rank", "part", "order", "seconds"}."""
    return bar_panels("Where a train step's time goes, per rung (share of the step)", rows, "panel", {
        "y": {"field": "variant", "type": "nominal", "title": None, "sort": {"field": "rank", "order": "ascending"}},
        "x": {"field": "seconds", "type": "quantitative", "stack": "normalize", "title": "share of a train step",
              "axis": {"format": "%"}},
        "color": {"field": "part", "type": "nominal", "title": "part of the step",
                  "sort": [BUDGET_LABELS[p] for p in BUDGET_PARTS]},
        "order": {"field": "order", "type": "quantitative"},
        "tooltip": [{"field": "variant"}, {"field": "part"},
                    {"field": "seconds", "type": "quantitative", "title": "s per step"}],
    }, step=16)


def race_spec(rows: list[dict[str, Any]]) -> Spec:
    """The loader race: median seconds per system, log scale, one panel per measure and scale,
    the project's bar set apart.

    `rows`: {"panel" ("<measure>, <n> samples"), "system", "project" (bool), "seconds"}."""
    base = log_base([r["seconds"] for r in rows])
    return bar_panels("The loader race: median seconds (log scale, lower is better)", rows, "panel", {
        "y": {"field": "system", "type": "nominal", "title": None, "sort": {"field": "seconds"}},
        **log_x("seconds", "seconds (median)", base, {"format": "~g"}),
        "color": {"field": "project", "type": "nominal", "legend": None,
                  "scale": {"domain": [True, False], "range": ["#d62728", "#7f7f7f"]}},
        "tooltip": [{"field": "panel"}, {"field": "system"},
                    {"field": "seconds", "type": "quantitative", "title": "s (median)"}],
    }, step=14)


def spec_text(spec: Spec) -> str:
    """The committed form of a spec: stable key order and layout, so it diffs and compares."""
    return json.dumps(spec, indent=1, sort_keys=True, ensure_ascii=True) + "\n"


def to_svg(spec: Spec) -> str:
    """The chart as SVG text, rendered by vl-convert: no browser, no network."""
    import vl_convert

    return vl_convert.vegalite_to_svg(spec, allowed_base_urls=[])
