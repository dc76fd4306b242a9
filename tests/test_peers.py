"""The race harness (benchmarks/peers.py) on tiny data, with whichever systems this
interpreter has (the project's own loader always): it runs, its figures are the ones it
says, and the project's rank split is exact. No timing is asserted."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def peers():
    """benchmarks/peers.py as a module (benchmarks/ is not a package)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import peers
    finally:
        sys.path.pop(0)
    return peers


@pytest.mark.slow
def test_the_race_runs_on_tiny_data(tmp_path, peers):
    systems = [name for name in peers.SYSTEMS if peers.installed(name)]
    assert "project" in systems
    out = tmp_path / "out"
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "peers.py"),
        "--tiny",
        "600",
        "--scales",
        "1",
        "--repeat",
        "1",
        "--systems",
        *systems,
        "--tasks",
        "write-none",
        "first",
        "epoch-0",
        "random",
        "ranks-2",
        "--out",
        str(out),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((out / "scale-1.json").read_text())
    assert report["meta"]["samples"] == 600
    project = report["results"]["project"]
    assert set(project) == {"write-none", "first", "epoch-0", "random", "ranks-2"}
    assert project["write-none"][0]["bytes"] > 600 * (28 * 28 + 1 + 8)  # the samples and their ids
    assert project["epoch-0"][0]["samples"] == 600
    assert project["random"][0]["samples_per_s"] > 0
    ranks = project["ranks-2"][0]
    assert ranks["steps"] == [5, 5] and ranks["dropped"] == 0 and ranks["repeated"] == 0  # 300 each, batches of 64
    assert ranks["same_order_same_seed"] and ranks["new_order_next_epoch"]
    assert ranks["blocks_per_batch"] > 6  # a per-sample shuffle: most of the 12 blocks in every batch
    table = (out / "table.md").read_text()
    assert "| 2 ranks | steps 5; dropped 0, repeated 0;" in table
    header = next(line for line in table.splitlines() if line.startswith("| |"))
    assert header == "| | " + " | ".join(peers.LABELS[s] for s in systems) + " |"


def test_the_tables_cells_say_min_and_median(peers):
    assert peers.spread([{"seconds": 3.0}, {"seconds": 1.0}, {"seconds": 2.0}], "seconds") == "1.00 / 2.00"
    assert peers.spread([{"seconds": 0.5}], "seconds") == "0.50"
    assert peers.spread([{"error": "boom"}], "seconds") == "failed" and peers.spread(None, "seconds") == "-"
    cell = peers.ranks_cell(
        [
            {
                "steps": [79, 157],
                "dropped": 0,
                "repeated": 3,
                "blocks_per_batch": 1.4,
                "blocks": 12,
                "same_order_same_seed": True,
                "new_order_next_epoch": False,
            }
        ]
    )
    assert cell.startswith("steps unequal 79-157; dropped 0, repeated 3; 1.4/12 blocks")
    assert cell.endswith("same order for a seed, same order next epoch")
    meta = {
        "remeasured": [
            {"command": "a", "host": "load 1"},
            {"command": "b", "host": "load 2"},
            {"command": "a", "host": "load 3"},
        ]
    }
    assert peers.remeasures(meta) == [
        "Also measured by (2 runs): `a` (load 1; load 3).",
        "Also measured by: `b` (load 2).",
    ]


def test_the_caption_counts_the_runs_each_timed_cell_holds(peers):
    """A cell re-measured five times, or measured once, is not "of 3 runs"; the ranks rows
    are one-run checks and not counted."""
    three, once, five = [{"seconds": 1.0}] * 3, [{"seconds": 1.0}], [{"seconds": 1.0}] * 5
    results = {"a": {"write-none": three, "epoch-0": five, "ranks-2": once}, "b": {"write-none": three, "first": once}}
    assert peers.runs_said(results) == "3 runs (1 cell of one run, one figure; 1 cell of 5 runs)"
    assert peers.runs_said({"a": {"write-none": three, "ranks-2": once}}) == "3 runs"
    assert peers.runs_said({}) == "no runs"


@pytest.mark.slow
def test_a_merged_run_over_several_scales_names_itself_in_each(tmp_path):
    """Each scale's file lists the command that re-measured it (not another scale's)."""
    out = tmp_path / "out"
    base = [
        sys.executable,
        str(ROOT / "benchmarks" / "peers.py"),
        "--tiny",
        "200",
        "--scales",
        "1",
        "2",
        "--repeat",
        "1",
        "--systems",
        "project",
        "--out",
        str(out),
    ]
    for extra in (["--tasks", "write-none", "first"], ["--tasks", "write-none", "--merge"]):
        done = subprocess.run(base + extra, capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert done.returncode == 0, done.stderr[-2000:]
    for scale in (1, 2):
        meta = json.loads((out / f"scale-{scale}.json").read_text())["meta"]
        assert "--merge" not in meta["command"] and meta["samples"] == 200 * scale
        assert [again["command"].endswith("--tasks write-none --merge") for again in meta["remeasured"]] == [True]


def test_interleaved_runs_take_turns_after_every_write(monkeypatch, tmp_path, peers):
    calls = []
    monkeypatch.setattr(peers, "run_one", lambda system, task, *rest: calls.append((system, task)) or {"seconds": 1.0})
    tasks = ["first", "write-none", "ranks-2"]
    results = peers.race(1, ["project", "lance"], tasks, 2, tmp_path, tmp_path, 1.0, interleave=True)
    assert calls == [("project", "write-none"), ("lance", "write-none")] * 2 + [
        ("project", "first"),
        ("lance", "first"),
    ] * 2 + [("project", "ranks-2"), ("lance", "ranks-2")]
    assert results["lance"] == {
        "write-none": [{"seconds": 1.0}] * 2,
        "first": [{"seconds": 1.0}] * 2,
        "ranks-2": [{"seconds": 1.0}],
    }
    calls.clear()
    peers.race(1, ["project", "lance"], tasks, 2, tmp_path, tmp_path, 1.0)  # system by system
    assert calls == [("project", "write-none")] * 2 + [("project", "first")] * 2 + [("project", "ranks-2")] + [
        ("lance", "write-none")
    ] * 2 + [("lance", "first")] * 2 + [("lance", "ranks-2")]


def test_reads_without_this_runs_write_are_refused_before_any_work():
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "peers.py"), "--tasks", "first", "ranks-2", "--tiny", "10"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 2 and "add write-none to --tasks" in done.stderr.splitlines()[-1]
