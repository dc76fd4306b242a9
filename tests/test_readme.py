"""The README's figures against the files they come from: generated blocks must be current,
and the figures quoted in prose must be the ones the metrics and results files hold."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pipeline.stages.report import ReportError, embed, render, results_docs, splice

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
FLAT = " ".join(README.split())  # prose claims are checked whatever the line wrapping


def shown(cell: str, value: float) -> bool:
    """`cell` is `value` rounded to the decimals the cell shows."""
    decimals = len(cell.split(".")[1]) if "." in cell else 0
    return abs(float(cell) - value) <= 0.5 * 10**-decimals + 1e-9


def load(path: str) -> dict:
    return json.loads((ROOT / path).read_text())


def test_generated_blocks_are_current():
    """What `dvc repro report` would write is what the README says: the Results section
    from metrics/ and results/, and every embedded benchmark output and metrics file."""
    bench = [json.loads(p.read_text()) for p in sorted((ROOT / "metrics/bench").glob("*.json"))]  # as the stage
    expected = embed(splice(README, render(bench, load("metrics/codecs.json"), results_docs(ROOT / "results"))), ROOT)
    stale = [line for line in expected.splitlines() if line not in README.splitlines()]
    assert expected == README, f"README is stale (run `dvc repro report`); first differing lines: {stale[:5]}"


def test_every_embed_names_a_recorded_file():
    names = re.findall(r"<!-- (?:embed|include): (\S+) -->", README)
    assert len(names) >= 4
    for name in names:
        assert (ROOT / name).is_file(), name


def test_embed_refreshes_and_refuses(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "a.txt").write_text("new figures\n")
    text = "x\n<!-- embed: results/a.txt -->\n```\nold\n```\n<!-- /embed -->\ny\n"
    assert embed(text, tmp_path) == "x\n<!-- embed: results/a.txt -->\n```\nnew figures\n```\n<!-- /embed -->\ny\n"
    for name, message in (("../outside.txt", "only files under"), ("results/none.txt", "no such file"),
                          ("README.md", "only files under")):
        with pytest.raises(ReportError, match=message):
            embed(text.replace("results/a.txt", name), tmp_path)
    table = "<!-- include: results/a.txt -->\n| old |\n<!-- /include -->\n"
    assert embed(table, tmp_path) == "<!-- include: results/a.txt -->\nnew figures\n<!-- /include -->\n"


def test_metrics_show_transcript_matches_summary():
    summary = load("metrics/summary.json")
    row = next(line for line in README.splitlines() if line.startswith("metrics/summary.json  "))
    assert row.split()[1:] == [str(summary["fashion-mnist"]["MB"]), str(summary["fashion-mnist"]["epoch_s"]),
                               str(summary["mnist"]["MB"]), str(summary["mnist"]["epoch_s"])]


def test_exp_show_transcript_matches_the_codec_table():
    """Each experiment row's sizes are the codec table's train compact MB for that codec."""
    codecs = load("metrics/codecs.json")
    rows = [line for line in README.splitlines() if re.search(r"\[codec-[\w-]+\]", line)]
    assert len(rows) == 6
    for line in rows:
        codec = re.search(r"\[codec-([\w-]+)\]", line)[1]
        mnist, fashion = (float(x) for x in re.findall(r"\s(\d+\.\d+)\s", line)[:2])
        assert mnist == pytest.approx(codecs["mnist"]["compact"][codec]["train"]["MB"], abs=0.001), codec
        assert fashion == pytest.approx(codecs["fashion-mnist"]["compact"][codec]["train"]["MB"], abs=0.001), codec


def test_codec_prose_figures():
    codecs = load("metrics/codecs.json")
    mb = lambda ds, codec: codecs[ds]["compact"][codec]["train"]["MB"]  # noqa: E731
    best = {ds: min(codecs[ds]["compact"], key=lambda c: mb(ds, c)) for ds in ("mnist", "fashion-mnist")}
    assert best == {"mnist": "zstd-19", "fashion-mnist": "brotli"}
    assert f"zstd-19 is the smallest for MNIST ({mb('mnist', 'zstd-19'):.2f} MB)" in FLAT
    assert f"brotli for Fashion-MNIST ({mb('fashion-mnist', 'brotli'):.2f} MB)" in FLAT
    assert f"`none` is the raw {mb('mnist', 'none'):.1f} MB" in FLAT
    assert f"MNIST {mb('mnist', 'zstd-19'):.2f} MB (zstd-19; goal <= 9.0)" in FLAT
    assert f"Fashion-MNIST {mb('fashion-mnist', 'brotli'):.2f} MB (brotli; goal <= 25.0)" in FLAT


def test_h100_table_matches_its_results_file():
    variants = load("results/h100-80gb-hbm3/mnist.json")["variants"]
    for name in ("device", "graphed", "compiled"):
        v = variants[name]
        row = next(line for line in README.splitlines() if line.startswith(f"| `{name}`"))
        cells = [c.strip().strip("*") for c in row.split("|")[2:6]]
        values = [1000 * v["train_s"], 1000 * v["test_s"], v["setup_s"], v["wall_s"]]
        assert all(shown(c, x) for c, x in zip(cells, values)), (name, cells, values)


def test_cpu_prose_figures_match_the_fashion_mnist_bench():
    doc = load("metrics/bench/fashion-mnist.json")
    v = doc["variants"]
    claims = {
        r"costs most of a (\S+) s epoch": v["naive"]["train_s"],
        r"\(`preprocessed`\) brings it to (\S+) s": v["preprocessed"]["train_s"],
        r"at the compute floor \((\S+) s\)": doc["floor"]["train_s"],
        r"is the fastest at (\S+) s,": v["compiled"]["train_s"],
        r"is the fastest at \S+ s, (\S+)x naive": v["compiled"]["speedup"],
    }
    for pattern, value in claims.items():
        match = re.search(pattern, FLAT)
        assert match and shown(match[1], value), (pattern, match and match[1], value)


def test_storage_prose_matches_the_recorded_benchmarks():
    convert = (ROOT / "results/benchmarks/amd-epyc-2core/convert_speed.txt").read_text()
    ratio = {name: re.search(rf"stage {name}\s*:\s*\S+ s \(\s*(\S+)x", convert)[1]
             for name in ("compact layout", "wide layout", "both layouts")}
    assert (f"the compact layout alone is {ratio['compact layout']}x the pandas path, the wide "
            f"{ratio['wide layout']}x, both together {ratio['both layouts']}x") in FLAT
    load = (ROOT / "results/benchmarks/amd-epyc-2core/shard_load.txt").read_text()
    ms = {name: float(re.search(rf"{re.escape(name)}\s+(\S+) ms", load)[1])
          for name in ("memory copy (the ceiling)", "shards, none, xxh3 verified", "shards, none, unverified")}
    copy = ms["memory copy (the ceiling)"]
    match = re.search(r"verified with xxh3 take about (\S+)x a plain memory copy .* unverified about (\S+)x", FLAT)
    assert shown(match[1], ms["shards, none, xxh3 verified"] / copy), (match[1], ms)
    assert shown(match[2], ms["shards, none, unverified"] / copy), (match[2], ms)
