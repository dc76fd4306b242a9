"""The report stage on tiny fake metrics: what it writes, and what it refuses to embed."""

from __future__ import annotations

import csv
import json
import math
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pipeline.stages.report.blocks import embed, splice
from pipeline.stages.report.charts import BUDGET_LABELS
from pipeline.stages.report.data import ReportError
from pipeline.stages.report.render import render_all, write_report
from pipeline.stages.report.tables import num, text

README = (
    "# t\n\n<!-- generated: ladder-chart -->\nold\n<!-- /generated -->\n\n"
    "<!-- generated: headline -->\n<!-- /generated -->\n\n<!-- generated: budget-chart -->\n<!-- /generated -->\n"
    "tail\n"
)


def variant(train_s, *, extrapolated=False, budget=None, **extra):
    v = {
        "train_s": train_s,
        "test_s": train_s / 10,
        "setup_s": 0.1,
        "wall_s": 5 * train_s,
        "accuracy": None if extrapolated else 0.97,
        "extrapolated": extrapolated,
        "speedup": 1.0,
        "wall_speedup": 1.0,
    }
    if budget:
        step = sum(budget)
        v["budget"] = dict(zip(("data_wait_s", "copy_s", "compute_s", "overhead_s", "other_s"), budget), step_s=step)
    return {**v, **extra}


def new_doc(dataset="tiny", name="box-a", day="2026-11-20", **variants):
    return {
        "dataset": dataset,
        "date": day,
        "machine": {
            "name": name,
            "cpu": "Some CPU <b>",
            "cores": 2,
            "memory_gb": 8.0,
            "gpu": None,
            "gpu_count": 0,
            "torch": "2.13.0+cpu",
            "cuda": None,
            "device": "cpu",
        },
        "params": {"epochs": 3, "batch_size": 32},
        "floor": {"train_s": 1.0, "compiled_train_s": 0.9},
        "variants": variants
        or {
            "naive": variant(40.0, extrapolated=True, budget=(0.03, 0.0, 0.01, 0.001, 0.0)),
            "preprocessed": variant(
                10.0,
                spread={"min": 9.5, "median": 10.0, "max": 14.0},
                unstable=True,
                unstable_reason="epochs spread 47% > 20% | <script>x</script>",
            ),
            "device": variant(2.0, budget=(0.0001, 0.0, 0.004, 0.0005, 0.0001)),
        },
    }


def old_doc(dataset="tiny", device="Old GPU", commit=None):
    env = {"device": device, "device_type": "cuda", "torch": "2.11", "cpu_count": 16}
    if commit:
        env.update(commit=commit, date="2026-11-01")
    return {
        "dataset": dataset,
        "env": env,
        "params": {"epochs": 5, "batch_size": 512},
        "variants": {"naive": variant(70.0, extrapolated=True), "compiled": variant(0.05)},
    }


def tree(tmp_path: Path, local: dict | None = None, results: dict | None = None) -> Path:
    """A repository folder: README, metrics/bench, metrics/codecs.json, results/<machine>/."""
    root = tmp_path / "repo"
    (root / "metrics" / "bench").mkdir(parents=True)
    (root / "README.md").write_text(README)
    for name, doc in (local or {"tiny.json": new_doc()}).items():
        (root / "metrics" / "bench" / name).write_text(json.dumps(doc))
    codecs = {
        "tiny": {"compact": {c: {"train": {"MB": mb, "read_s": 0.01}} for c, mb in (("none", 4.7), ("zstd-3", 1.2))}}
    }
    (root / "metrics" / "codecs.json").write_text(json.dumps(codecs))
    for path, doc in (results or {}).items():
        (root / "results" / path).parent.mkdir(parents=True, exist_ok=True)
        (root / "results" / path).write_text(json.dumps(doc) if isinstance(doc, dict) else doc)
    return root


def run_report(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "report",
            "--bench",
            "metrics/bench",
            "--codecs",
            "metrics/codecs.json",
            "--results",
            "results",
            "--readme",
            "README.md",
            "--page",
            "docs/results.md",
            "--images",
            "docs/img",
            "--ladder-plot",
            "metrics/ladder.csv",
            "--budget-plot",
            "metrics/budget.csv",
        ],
        cwd=root,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(Path(__file__).resolve().parents[1]), "PATH": "/usr/bin:/bin"},
    )


def outputs(root: Path) -> dict[str, bytes]:
    names = ["README.md", "docs/results.md", "metrics/ladder.csv", "metrics/budget.csv"]
    files = {n: (root / n).read_bytes() for n in names if (root / n).exists()}
    if (root / "docs/img").is_dir():
        files.update({f"docs/img/{p.name}": p.read_bytes() for p in sorted((root / "docs/img").iterdir())})
    return files


def test_report_writes_every_output_from_tiny_metrics(tmp_path):
    sampled = old_doc(commit="abc1234")
    sampled["params"].update(sample_steps=16, sample_epochs=4)  # how the sampled rungs were timed: said
    root = tree(
        tmp_path,
        results={
            "box-b/tiny.json": sampled,
            "benchmarks/box-a/load.txt": "$ python load.py\n12.5 ms\n",
            "benchmarks/box-a/cold_start.txt": "$ python cold_start.py\nwarm 1 s\n",
            "anchors.md": "| record | time |\n|---|---|\n| fast | 1 s |\n",
            "scale/two_nodes.json": {"nodes": 2},  # not a bench result: left alone
            "scale/notes.txt": "not embedded",
            "box-b/steps.txt": "kernel table\n",
        },
    )  # beside a machine's results: shown
    result = run_report(root)
    assert result.returncode == 0, result.stderr
    readme = (root / "README.md").read_text()
    assert readme.startswith("# t\n\n<!-- generated: ladder-chart -->\n![") and readme.endswith("tail\n")
    assert "](docs/img/ladder.svg)" in readme and "](docs/img/budget.svg)" in readme
    headline = readme.split("<!-- generated: headline -->\n")[1].split("<!-- /generated -->")[0]
    # the unstable best-of-the-seed is marked; the project's best is the fastest full run
    assert "| `box-a` | tiny | 40.0* | 10.0 (unstable) | 2.00 (`device`) | 20.0x |" in headline
    assert "| `box-b` | tiny | 70.0* | n/a | 0.0500 (`compiled`) | 1400x |" in headline

    page = (root / "docs/results.md").read_text()
    assert page.index("## `box-a`") < page.index("## `box-b`")  # this machine first
    assert "| preprocessed **unstable** | 10.0 | 45% |" in page  # (max - min) / median
    assert "&lt;script&gt;x&lt;/script&gt;" in page and "<script>" not in page and "<b>" not in page
    assert "spread 47% &gt; 20% \\| &lt;script" in page  # a pipe cannot open a column
    assert "commit abc1234, 2026-11-01; 5 epochs, batch 512; sampled rungs: 16 steps x 4 epochs (" in page
    assert "; 3 epochs, batch 32 (`dvc repro` on this machine)" in page  # not recorded: not claimed
    assert "Compute floor" in page
    assert "| device | 4.70 | 0.100 | 0 | 4.00 | 0.500 | 0.100 |" in page  # ms per step
    assert "<!-- embed: results/benchmarks/box-a/load.txt -->\n```\n$ python load.py\n12.5 ms\n```" in page
    # the public records, and beside them (not among the other benchmarks) the warm/cold recordings
    records = page.split("## Against the public records")[1].split("\n## ")[0]
    assert "<!-- include: results/anchors.md -->\n| record | time |" in records
    assert "<!-- embed: results/benchmarks/box-a/cold_start.txt -->\n```\n$ python cold_start.py" in records
    assert page.count("cold_start.txt -->") == 1 and page.index("## Against") < page.index("## Storage")
    assert "| tiny | compact | 4.70 MB / 0.0100 s | 1.20 MB / 0.0100 s |" in page
    assert "<!-- embed: results/box-b/steps.txt -->\n```\nkernel table\n```" in page
    assert "scale/" not in page and "two_nodes" not in page and "not embedded" not in page

    with open(root / "metrics/ladder.csv", newline="") as f:
        assert list(csv.reader(f)) == [
            ["variant", "tiny"],
            ["naive", "40.0"],
            ["preprocessed", "10.0"],
            ["device", "2.0"],
        ]
    with open(root / "metrics/budget.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["variant", "part", "tiny"] and len(rows) == 1 + 2 * 5
    assert math.isclose(sum(float(r[2]) for r in rows[1:] if r[0] == "device"), 0.0047)

    for name in ("ladder", "codecs", "budget"):
        svg = ET.fromstring((root / f"docs/img/{name}.svg").read_text())  # well-formed XML
        assert svg.tag.endswith("svg")
        spec = json.loads((root / f"docs/img/{name}.vl.json").read_text())
        assert spec["data"]["values"]
    ladder = (root / "docs/img/ladder.svg").read_text()
    assert "box-a" in ladder and "preprocessed" in ladder

    before = outputs(root)
    assert run_report(root).returncode == 0
    assert outputs(root) == before  # deterministic, and the README does not grow


def test_a_quick_run_is_marked_in_every_table(tmp_path):
    """`bench.quick` figures say so: in the headline's machine cell and the ladder's line,
    never passing for a full run; vs naive is one ratio, the shown train s/epoch's."""
    quick = new_doc()
    quick["params"].update(quick=True, sample_steps=5, sample_epochs=2, epochs=2)
    root = tree(tmp_path, local={"tiny.json": quick})
    assert run_report(root).returncode == 0
    headline = (root / "README.md").read_text().split("<!-- generated: headline -->\n")[1]
    assert "| `box-a` (quick) | tiny | 40.0* | 10.0 (unstable) | 2.00 (`device`) | 20.0x |" in headline
    page = (root / "docs/results.md").read_text()
    assert "**tiny**: **quick run** (`bench.quick`: fewer epochs and steps, no spread): Some CPU" in page
    assert "| naive * | 40.0 | n/a | 4.00 | 0.100 | 200 | n/a | n/a | 1.00x | 1.00x |" in page
    assert "| device | 2.00 | n/a | 0.200 | 0.100 | 10.0 | 0.9700 | n/a | 20.0x | 20.0x |" in page


def test_time_to_accuracy_is_shown_reached_or_not(tmp_path):
    doc = new_doc()
    doc["variants"]["device"]["time_to_accuracy"] = {"target": 0.98, "seconds": 12.34, "epoch": 2}
    doc["variants"]["preprocessed"]["time_to_accuracy"] = {"target": 0.98, "seconds": None, "epoch": None}
    root = tree(tmp_path, local={"tiny.json": doc})
    assert run_report(root).returncode == 0
    page = (root / "docs/results.md").read_text()
    assert "| device | 2.00 | n/a | 0.200 | 0.100 | 10.0 | 0.9700 | 12.3 s to 98% (epoch 2) | 20.0x | 20.0x |" in page
    assert "| 0.9700 | not reached (98%) |" in page and "| naive * | 40.0 |" in page
    assert "| 12.3 s to 98% (`device`) |" in page  # no seeds taken: the headline's cell is the least


@pytest.mark.slow  # several seconds: four report runs, each a process
def test_the_time_to_accuracy_over_seeds_is_shown_under_its_ladder(tmp_path):
    doc = new_doc()
    doc["seeds"] = {
        "variant": "device",
        "target": 0.98,
        "seeds": [43, 44, 45],
        "seconds": [12.34, 11.0, None],
        "epochs": [2, 2, None],
        "reached": 2,
        "min": 11.0,
        "median": 12.34,
        "max": None,
    }
    root = tree(tmp_path, local={"tiny.json": doc})
    assert run_report(root).returncode == 0
    page = (root / "docs/results.md").read_text()
    assert (
        "Time to 98% of `device` (the first rung to reach it) from seeds 43-45: median 12.3 s, fastest "
        "11.0 s; 1 of 3 did not reach it."
    ) in page
    assert "| 12.3 s to 98% (`device`, median of 3 seeds) |" in page  # the headline's cell
    doc["seeds"].update(seconds=[None, None, 11.0], reached=1, median=None)
    root = tree(tmp_path / "missed", local={"tiny.json": doc})
    assert run_report(root).returncode == 0
    page = (root / "docs/results.md").read_text()
    assert "from seeds 43-45: not reached by half or more, fastest 11.0 s; 2 of 3 did not reach it." in page
    doc["seeds"].update(seconds=[0.8, 0.75, 0.9], reached=3, min=0.75, median=0.8, max=0.9)
    root = tree(tmp_path / "all", local={"tiny.json": doc})
    assert run_report(root).returncode == 0
    assert "from seeds 43-45: median 0.800 s (0.750-0.900 s)." in (root / "docs/results.md").read_text()
    assert "| not reached to 98% (`device`, median of 3 seeds) |" in page
    doc["seeds"]["min"] = -1.0
    root = tree(tmp_path / "bad", local={"tiny.json": doc})
    failed = run_report(root)
    assert failed.returncode == 2 and "seeds.min" in failed.stderr


def test_newest_run_of_each_machine(tmp_path):
    """A machine both measured here and committed shows its later run; undated runs lose."""
    committed_newer = new_doc(day="2026-11-25", **{"naive": variant(30.0), "device": variant(3.0)})
    root = tree(tmp_path, results={"box-a/tiny.json": committed_newer, "old/tiny.json": old_doc()})
    rendered, _ = render_all(
        sorted((root / "metrics/bench").glob("*.json")), root / "metrics/codecs.json", root / "results", README, root
    )
    assert "| `box-a` | tiny | 30.0 | n/a | 3.00 (`device`) | 10.0x |" in rendered.readme
    assert "`box-a/tiny.json`" in rendered.results and "on this machine" not in rendered.results
    assert "| `old` | tiny |" in rendered.readme  # an older document: named by its folder
    # ladder.csv stays this machine's own figures, for `dvc plots show`
    assert rendered.ladder_csv.splitlines()[1] == "naive,40.0"


@pytest.mark.parametrize(
    "key, value, message",
    [
        (("variants", "device", "train_s"), float("nan"), "NaN"),
        (("variants", "device", "train_s"), float("inf"), "Infinity"),
        (("variants", "device", "train_s"), 1e308, "variants.device.train_s: Input should be less than or equal to"),
        (("variants", "device", "test_s"), -1.0, "variants.device.test_s: Input should be greater than or equal to 0"),
        (("variants", "device", "accuracy"), 1.5, "variants.device.accuracy"),
        (
            ("variants", "device", "budget", "copy_s"),
            "1",
            "variants.device.budget.copy_s: Input should be a valid number",
        ),
        (("dataset",), "a,b\nc", "dataset: Value error, not a plain name"),
        (("machine", "name"), "x <!-- /generated --> y", "machine.name: Value error, not a plain name"),
        (("machine", "cores"), True, "machine.cores: Input should be a valid integer"),
        # the run's params within params.yaml's own bounds (`bench.settings`), not looser ones
        (("params", "batch_size"), 1 << 20, "params.batch_size: Input should be less than or equal to 65536"),
        (("params", "epochs"), 101, "params.epochs: Input should be less than or equal to 100"),
        (("compiled_options", "autocast"), "true", "compiled_options.autocast: Input should be a valid boolean"),
        (("compiled_options", "graph_scope"), "all", "compiled_options.graph_scope: Input should be 'epoch' or 'step'"),
        (("compiled_options", "compile_mod"), "default", "compiled_options.compile_mod: Unexpected keyword argument"),
    ],
)
def test_bad_numbers_and_names_are_refused(tmp_path, key, value, message):
    doc = new_doc()
    # the bench's own record of `compiled`: the runners' Execution, validated as that type
    doc["compiled_options"] = {"compile_mode": "none", "autocast": False, "channels_last": False, "cuda_graph": False}
    target = doc
    for part in key[:-1]:
        target = target[part]
    target[key[-1]] = value
    root = tree(tmp_path, {"tiny.json": doc})
    before = outputs(root)
    result = run_report(root)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "metrics/bench/tiny.json" in result.stderr and message in result.stderr, result.stderr
    assert outputs(root) == before  # nothing written


def test_a_variant_name_must_be_a_slug(tmp_path):
    doc = new_doc(**{"naive": variant(1.0), "</script><script>alert(1)</script>": variant(0.5)})
    root = tree(tmp_path, {"tiny.json": doc})
    result = run_report(root)
    assert result.returncode == 2 and "variants.</script>" in result.stderr and "not a plain name" in result.stderr


def test_bad_files_are_one_line_errors(tmp_path):
    for content, message in (
        ("{", "not valid JSON"),
        ("[1, 2]", "(top level): Input should be a dictionary or an instance of BenchDoc"),
        ("[" * 100_000, "nested too deeply"),
        ('{"dataset": NaN}', "NaN is not a number JSON"),
        ('{"dataset": "a", "dataset": "b"}', "key 'dataset' is given twice"),
        (
            json.dumps({"dataset": "tiny", "params": {"epochs": 1, "batch_size": 1}, "variants": {"a": variant(1.0)}}),
            "neither 'machine' nor",
        ),
    ):
        root = tree(tmp_path / str(len(message)), {"tiny.json": {}})
        (root / "metrics/bench/tiny.json").write_text(content)
        result = run_report(root)
        assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr, result.stderr
    root = tree(tmp_path / "machine", results={"Bad Name/tiny.json": old_doc(), "Notes/readme.txt": "x"})
    result = run_report(root)
    assert result.returncode == 2 and "plain slug" in result.stderr


def test_free_text_is_escaped():
    assert text("a|b <x> &\n  c") == "a\\|b &lt;x&gt; &amp; c"
    assert "<!--" not in text("<!-- /generated -->")


def test_numbers_have_three_significant_figures():
    assert [num(x) for x in (0, 0.05352, 1.349, 68.76, 1494.05)] == ["0", "0.0535", "1.35", "68.8", "1494"]


def test_splice_is_stable_and_refuses_markers():
    out = splice(README, {"ladder-chart": "A", "headline": "B", "budget-chart": "C"})
    assert "old" not in out and splice(out, {"ladder-chart": "A", "headline": "B", "budget-chart": "C"}) == out
    with pytest.raises(ReportError, match="block marker"):
        splice(README, {"ladder-chart": "x <!-- /generated -->", "headline": "", "budget-chart": ""})
    with pytest.raises(ReportError, match="unknown generated block 'nope'"):
        splice("<!-- generated: nope -->\n<!-- /generated -->", {})


def test_embed_refreshes_and_refuses(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "a.txt").write_text("new figures\n")
    block = "x\n<!-- embed: results/a.txt -->\n```\nold\n```\n<!-- /embed -->\ny\n"
    assert embed(block, tmp_path) == "x\n<!-- embed: results/a.txt -->\n```\nnew figures\n```\n<!-- /embed -->\ny\n"
    for name, message in (
        ("../outside.txt", "only files under"),
        ("results/none.txt", "no such file"),
        ("README.md", "only files under"),
    ):
        with pytest.raises(ReportError, match=message):
            embed(block.replace("results/a.txt", name), tmp_path)
    for hostile, message in (("a <!-- /embed --> b\n", "block marker"), ("```\nrm -rf /\n", "code fence")):
        (tmp_path / "results" / "a.txt").write_text(hostile)
        with pytest.raises(ReportError, match=message):
            embed(block, tmp_path)
    (tmp_path / "results" / "a.txt").write_text("| new |\n")
    table = "<!-- include: results/a.txt -->\n| old |\n<!-- /include -->\n"
    assert embed(table, tmp_path) == "<!-- include: results/a.txt -->\n| new |\n<!-- /include -->\n"
    # a marker whose block is malformed would be left as written, silently empty: refused
    for broken, message in (
        ("<!-- embed: results/a.txt -->\n<!-- /embed -->\n", "expected a fenced block"),
        ("<!-- include: results/a.txt -->\n| old |\n", "expected <!-- /include -->"),
    ):
        with pytest.raises(ReportError, match=message):
            embed(table + broken, tmp_path)
    assert embed("`<!-- embed: ... -->` in prose\n", tmp_path) == "`<!-- embed: ... -->` in prose\n"


def test_write_report_changes_nothing_on_bad_input(tmp_path):
    root = tree(tmp_path)
    (root / "README.md").write_text(README.replace("headline", "unknown-block"))
    before = outputs(root)
    with pytest.raises(ReportError, match="unknown generated block"):
        write_report(
            [root / "metrics/bench/tiny.json"],
            root / "metrics/codecs.json",
            root / "README.md",
            root / "results",
            root / "docs/results.md",
            root / "docs/img",
            root / "metrics/ladder.csv",
            root / "metrics/budget.csv",
        )
    assert outputs(root) == before


def test_plot_data_goes_through_the_csv_writer():
    from pipeline.stages.report.charts import csv_text

    tricky = ["a,b", "line\nbreak", 'quote "q"']
    assert list(csv.reader(csv_text(["name"], [[t] for t in tricky]).splitlines(keepends=True))) == [
        ["name"],
        *[[t] for t in tricky],
    ]


def test_charts_carry_only_slugs_and_numbers(tmp_path):
    """Free text (CPU and GPU names, reasons) never reaches a chart: only checked names."""
    root = tree(tmp_path)
    _, specs = render_all([root / "metrics/bench/tiny.json"], root / "metrics/codecs.json", None, README, root)
    for spec in specs.values():
        for row in spec["data"]["values"]:
            for value in row.values():
                assert (
                    isinstance(value, (int, float))
                    or value in BUDGET_LABELS.values()
                    or re.fullmatch(r"[a-z0-9][a-z0-9_-]*( / [a-z0-9][a-z0-9_-]*)?", value)
                ), value


def race_file(path: Path, samples: int, results: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": {"samples": samples, "command": "x"}, "results": results}))


def test_the_race_chart_shows_each_systems_median_per_measure_and_scale(tmp_path):
    from pipeline.stages.report.charts import race_rows
    from pipeline.stages.report.data import race_docs

    peers = tmp_path / "results" / "peers"
    race_file(
        peers / "scale-10.json",
        600,
        {"project": {"write-none": [{"seconds": 3.0}, {"seconds": 1.0}, {"seconds": 2.0}]}},
    )
    race_file(
        peers / "scale-1.json",
        60,
        {
            "project": {"first": [{"seconds": 0.5}, {"error": "boom"}], "random": [{"samples_per_s": 9.0}]},
            "lance": {"first": [{"seconds": 0.25}, {"seconds": 0.75}]},
            "litdata": {"first": [{"error": "failed"}]},
        },
    )
    rows = race_rows(race_docs(tmp_path / "results"))
    assert rows == [  # smallest scale first; failed runs left out; a measure the chart does not show, too
        {"panel": "time to first batch, 60 samples", "system": "project", "project": True, "seconds": 0.5},
        {"panel": "time to first batch, 60 samples", "system": "Lance", "project": False, "seconds": 0.5},
        {"panel": "write, uncompressed, 600 samples", "system": "project", "project": True, "seconds": 2.0},
    ]
    race_file(peers / "scale-1.json", 60, {"lance": {"first": [{"seconds": -1}]}})
    with pytest.raises(ReportError, match=r"scale-1.json: results.lance.first.0.seconds"):
        race_docs(tmp_path / "results")
    assert race_docs(tmp_path / "nowhere") == []


def bench_block(root: Path) -> str:
    readme = README + "<!-- generated: bench-time -->\n<!-- /generated -->\n"
    rendered, _ = render_all(
        sorted((root / "metrics/bench").glob("*.json")), root / "metrics/codecs.json", root / "results", readme, root
    )
    return rendered.readme.split("<!-- generated: bench-time -->\n")[1].split("\n<!-- /generated -->")[0]


def test_the_bench_time_is_the_whole_stages_wall_time_where_recorded(tmp_path):
    """The README's bench-time line: the sum of the data sets' recorded `wall_s` (the whole
    bench), else what the variants record of their setup and timed epochs, said as such."""
    a, b = new_doc(dataset="tiny"), new_doc(dataset="other")
    a["wall_s"], b["wall_s"] = 600.0, 300.0
    root = tree(tmp_path, local={"tiny.json": a, "other.json": b})
    assert bench_block(root) == (
        "- `box-a` (2 cores): 15.0 minutes for other, tiny (5.00 + 10.0; the whole "
        "stage: floor, every variant, profiled passes, seeds)"
    )
    del b["wall_s"]
    for doc in (a, b):
        for v in doc["variants"].values():
            v["measured"] = {"train_s": [1.0, 2.0], "test_s": [0.5]}  # 3 variants x 2: (0.1 + 3.5) x 6 s
    root = tree(tmp_path / "older", local={"tiny.json": a, "other.json": b})
    assert bench_block(root) == (
        "- `box-a` (2 cores): 0.360 minutes for other, tiny (setup and timed epochs of every variant only: "
        "its run recorded no stage time, so whatever else it ran is left out)"
    )


def test_the_readme_shows_this_machine_and_one_more_however_many_commit(tmp_path):
    """Each machine that commits its results adds nothing to the README past the second:
    the rest are named by count and shown on docs/results.md."""
    root = tree(tmp_path, results={f"box-{c}/tiny.json": new_doc(name=f"box-{c}", day="2026-11-01") for c in "bcd"})
    result = run_report(root)
    assert result.returncode == 0, result.stderr
    headline = (root / "README.md").read_text().split("<!-- generated: headline -->\n")[1].split("<!-- /generated")[0]
    assert "| `box-a` |" in headline and "| `box-b` |" in headline
    assert "box-c" not in headline and "box-d" not in headline
    assert "2 more machines: [docs/results.md](docs/results.md#headline)." in headline
    page = (root / "docs/results.md").read_text()
    assert all(f"## `box-{c}`" in page for c in "abcd")


def test_the_tuned_recipe_over_its_seeds_and_each_target_are_shown(tmp_path):
    """Two targets per rung, one cell each; the tuned recipe's accuracy over its seeds under
    the ladder, and its median to the last target in the headline beside the first's."""
    doc = new_doc()
    doc["variants"]["device"]["time_to_accuracy"] = [
        {"target": 0.98, "seconds": 12.34, "epoch": 2},
        {"target": 0.99, "seconds": None, "epoch": None},
    ]
    doc["variants"]["tuned"] = variant(
        3.0,
        time_to_accuracy=[{"target": 0.98, "seconds": 5.0, "epoch": 1}, {"target": 0.99, "seconds": 8.5, "epoch": 2}],
    )
    doc["tuned"] = {
        "recipe": {"epochs": 2, "batch_size": 256, "max_lr": 0.01, "pct_start": 0.25, "betas": [0.9, 0.99], "seeds": 3},
        "seeds": [43, 44, 45],
        "accuracy": [0.9912, 0.9899, 0.9921],
        "accuracy_mean": 0.9911,
        "accuracy_min": 0.9899,
        "accuracy_max": 0.9921,
        "targets": [
            {"target": 0.98, "seconds": [5.0, 5.2, 4.9], "reached": 3, "min": 4.9, "median": 5.0, "max": 5.2},
            {"target": 0.99, "seconds": [8.5, None, 8.1], "reached": 2, "min": 8.1, "median": 8.5, "max": None},
        ],
    }
    root = tree(tmp_path, local={"tiny.json": doc})
    result = run_report(root)
    assert result.returncode == 0, result.stderr
    page = (root / "docs/results.md").read_text()
    assert "| 12.3 s to 98% (epoch 2); not reached (99%) |" in page
    assert "| 5.00 s to 98% (epoch 1); 8.50 s to 99% (epoch 2) |" in page
    assert (
        "`tuned` from seeds 43-45, each its whole schedule: test accuracy mean 99.11% (98.99-99.21%); to 98%: "
        "median 5.00 s (4.90-5.20 s); to 99%: median 8.50 s, fastest 8.10 s; 1 of 3 did not reach it."
    ) in page
    readme = (root / "README.md").read_text()
    assert "| 12.3 s to 98% (`device`); 8.50 s to 99% (`tuned`, median of 3 seeds) |" in readme
    doc["tuned"]["accuracy_mean"] = 1.5  # out of range: the report stops with the key
    root = tree(tmp_path / "bad", local={"tiny.json": doc})
    failed = run_report(root)
    assert failed.returncode == 2 and "tuned.accuracy_mean" in failed.stderr


def test_another_recipe_is_never_the_best_here_nor_compared_by_its_wall_time(tmp_path):
    """`tuned` at its own batch and epochs: not "best here" (the write-up's recipe is), and
    its wall time is not set against naive's."""
    doc = new_doc()
    doc["variants"]["tuned"] = variant(1.0)  # faster per epoch than every other rung
    root = tree(tmp_path, local={"tiny.json": doc})
    assert run_report(root).returncode == 0
    readme = (root / "README.md").read_text()
    assert "| 2.00 (`device`) |" in readme and "(`tuned`)" not in readme.split("<!-- generated: headline -->")[1]
    assert (
        "| tuned | 1.00 | n/a | 0.100 | 0.100 | 5.00 | 0.9700 | n/a | 40.0x | n/a |"
        in (root / "docs/results.md").read_text()
    )


def test_a_quick_runs_line_says_what_its_budget_cut(tmp_path):
    """A quick run whose plan cut steps or left rungs out says so in its ladder's line, and
    does not state the settings' sampled steps as the steps every rung ran."""
    import json

    from pipeline.stages.report.data import collect_runs
    from pipeline.stages.report.tables import machine_line

    doc = json.loads((Path(__file__).resolve().parents[1] / "metrics/bench/mnist.json").read_text())
    doc["params"]["quick"] = True
    doc["quick_plan"] = {"budget_s": 90.0, "cuts": ["2 sampled steps an epoch"], "skipped": ["graphed", "tuned"]}
    (tmp_path / "mnist.json").write_text(json.dumps(doc))
    line = machine_line(collect_runs([tmp_path / "mnist.json"], None)[0])
    assert "within its 1.50 min: 2 sampled steps an epoch; graphed, tuned left out" in line
    assert "steps or fewer" in line
    doc["quick_plan"] = {"budget_s": 90.0, "cuts": [], "skipped": []}  # nothing cut: nothing said
    (tmp_path / "mnist.json").write_text(json.dumps(doc))
    assert "within its" not in machine_line(collect_runs([tmp_path / "mnist.json"], None)[0])


def test_the_time_to_accuracy_cell_gives_the_warm_time_beside_where_setup_took_part_of_it():
    """Records time a run with compile and capture done beforehand: the cell says both, the
    setup-included time first; a document without the warm figure (older runs) says one."""
    from pipeline.bench.document import TimeToAccuracy
    from pipeline.stages.report.tables import num, reached

    both = TimeToAccuracy(target=0.99, seconds=7.0, warm_seconds=5.5, epoch=2)
    assert reached([both]) == f"{num(7.0)} s to 99% (epoch 2; warm {num(5.5)} s)"
    older = TimeToAccuracy(target=0.99, seconds=7.0, epoch=2)
    same = TimeToAccuracy(target=0.98, seconds=3.0, warm_seconds=3.0, epoch=1)
    assert reached([same, older]) == f"{num(3.0)} s to 98% (epoch 1); {num(7.0)} s to 99% (epoch 2)"
    assert reached([TimeToAccuracy(target=0.995)]) == "not reached (99.5%)"
