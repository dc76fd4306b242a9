"""A user re-measures on their own machine: the bench runs (here on tiny data), `report`
rewrites the generated blocks, and the README checks still pass, with the committed
machines' tables kept beside the new one."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess

import pytest
from conftest import ROOT, bench_settings, make_split

pytestmark = pytest.mark.slow


def test_a_new_machine_gets_its_own_table_and_the_suite_still_passes(tmp_path, monkeypatch):
    import test_readme

    from pipeline.bench.stage import bench_dataset
    from pipeline.budget.machine import fingerprint
    from pipeline.stages.convert.stage import convert_dataset
    from pipeline.stages.csvdata import write_csv
    from pipeline.stages.report.render import write_report
    from pipeline.stages.shard.settings import ShardSettings
    from pipeline.stages.shard.stage import shard_dataset

    repo = tmp_path / "repo"  # a clone: every tracked file
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, tracked.decode().split("\0")):
        if (ROOT / name).is_file():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / name, repo / name)
    for old in (repo / "metrics" / "bench").glob("*.json"):
        old.unlink()  # a fresh clone's metrics are replaced by this machine's run
    data = tmp_path / "data"
    for split, (n, seed) in {"train": (192, 0), "test": (64, 1)}.items():
        write_csv(*make_split(n, seed), data / "csv" / f"{split}.csv")
    convert_dataset(data / "csv", data / "pq", data / "fig.json", "snappy", 65536)
    shard_dataset(data / "pq" / "compact", data / "shards", "tiny", ShardSettings(128, "none", 3))
    machine = dataclasses.replace(fingerprint("cpu"), name="a-laptop-8c", cpu="A Laptop CPU", cores=8)
    settings = bench_settings(
        epochs=2,
        batch_size=64,
        num_workers=1,
        variants=["naive", "device", "compiled"],
        sample=["naive"],
        sample_steps=2,
        sample_epochs=2,
        budget=True,
    )
    doc = bench_dataset(
        "tiny",
        data / "pq" / "wide",
        data / "shards",
        repo / "metrics" / "bench" / "tiny.json",
        "cpu",
        settings,
        machine,
    )
    assert doc.machine.name == "a-laptop-8c" and doc.date
    write_report(
        sorted((repo / "metrics" / "bench").glob("*.json")),
        repo / "metrics" / "codecs.json",
        repo / "README.md",
        repo / "results",
        repo / "docs" / "results.md",
        repo / "docs" / "img",
        repo / "metrics" / "ladder.csv",
        repo / "metrics" / "budget.csv",
    )
    results = (repo / "docs" / "results.md").read_text()
    assert "a-laptop-8c" in results and "a-laptop-8c" in (repo / "README.md").read_text()
    for committed in (ROOT / "results").iterdir():  # every committed machine's table is still there
        if any("variants" in json.loads(p.read_text()) for p in committed.glob("*.json")):
            assert committed.name in results
    # The README checks, pointed at the re-measured copy, pass.
    monkeypatch.setattr(test_readme, "ROOT", repo)
    monkeypatch.setattr(test_readme, "README", repo / "README.md")
    test_readme.test_readme_is_short_and_shows_a_generated_chart_early()
    test_readme.test_generated_blocks_are_current()
    for page in [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]:
        test_readme.test_links_and_images_resolve_inside_the_repository(page)
