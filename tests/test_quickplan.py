"""The quick bench's plan: the rungs left re-planned to fit the time left, one lever at a time.

Prices here are made up (seconds per rung as a function of the plan), so every assert is
about the planning rule, never about a measured time.
"""

from __future__ import annotations

import json

import pytest
from conftest import bench_settings

from pipeline.bench.quickplan import FILL, MIN_SAMPLE_STEPS, plan_rest
from pipeline.stages.shard.settings import ShardSettings

RUNGS = ("naive", "preprocessed", "device", "compiled", "tuned")


def pricer(sampled_step_s: float = 1.0, epoch_s: float = 10.0):
    """A sampled rung costs its steps x `sampled_step_s` x 2 epochs; a whole rung 2 epochs."""

    def price(settings, rest):
        return {
            r: (
                settings.sample_epochs * settings.sample_steps * sampled_step_s if r in settings.sample else 2 * epoch_s
            )
            for r in rest
        }

    return price


def settings():
    return bench_settings(quick=True, variants=list(RUNGS), sample=["naive"])


def test_a_plan_that_fits_is_kept_as_it_is():
    plan = plan_rest(settings(), RUNGS, pricer(), left_s=1000)
    assert plan.settings == settings() and plan.skipped == () and plan.cuts == ()


def test_fewer_sampled_steps_come_first_then_eager_rungs_sampled():
    s = settings()
    price = pricer(sampled_step_s=3.0, epoch_s=50.0)  # naive 2 x 5 x 3 = 30 s; a whole rung 100 s: 430 s
    assert sum(price(s, RUNGS).values()) == 430
    assert plan_rest(s, RUNGS, price, left_s=420 / FILL).settings.sample_steps == 3  # naive 18 s: 418 s
    fewer = plan_rest(s, RUNGS, price, left_s=415 / FILL)  # 2 steps: naive 12 s, 412 s in all
    assert fewer.settings.sample_steps == MIN_SAMPLE_STEPS and fewer.skipped == ()
    assert fewer.cuts == (f"{MIN_SAMPLE_STEPS} sampled steps an epoch",)
    tight = plan_rest(s, RUNGS, price, left_s=300 / FILL)  # the eager rungs sampled: 236 s
    assert set(tight.settings.sample) == {"naive", "preprocessed", "device"} and tight.skipped == ()
    assert "compiled" not in tight.settings.sample  # a static rung is never sampled
    assert tight.cuts[-1] == "preprocessed, device timed on sampled steps (no accuracy)"


def test_where_nothing_cheaper_fits_the_dearest_rungs_are_left_out_never_the_next_one_first():
    s = settings()
    price = pricer(sampled_step_s=1.0, epoch_s=50.0)  # compiled and tuned: 100 s each
    plan = plan_rest(s, RUNGS, price, left_s=120 / FILL)
    assert plan.skipped and "naive" not in plan.skipped
    kept = [r for r in RUNGS if r not in plan.skipped]
    assert sum(price(plan.settings, tuple(kept)).values()) <= 120
    assert all("left out" not in cut for cut in plan.cuts)  # said per rung, at its turn
    alone = plan_rest(s, ("tuned",), price, left_s=10)  # the only rung does not fit: it goes too
    assert alone.skipped == ("tuned",)


def test_the_anchors_go_last_and_one_whole_epoch_rung_stays_when_none_ran_yet():
    """Left out first: the rungs no comparison rests on (workers, graphed), dearest first; the
    write-up's baseline and the fast rungs last. With no whole-epoch rung run yet, the cheapest
    one left is kept whatever the time: the summary's steady epoch needs one."""
    from pipeline.bench.quickplan import ANCHORS

    s = bench_settings(
        quick=True,
        variants=["naive_bs16", "naive", "workers", "graphed", "compiled"],
        sample=["naive_bs16", "naive", "workers"],
    )
    rungs = tuple(s.variants)

    def price(settings, rest):  # sampled: 2 epochs x steps x 1 s; graphed 100 s, compiled 60 s
        whole = {"graphed": 100.0, "compiled": 60.0}
        return {r: whole.get(r, settings.sample_epochs * settings.sample_steps * 1.0) for r in rest}

    plan = plan_rest(s, rungs, price, left_s=20 / FILL)
    assert set(ANCHORS) >= {"naive", "compiled"} and "workers" not in ANCHORS and "graphed" not in ANCHORS
    assert plan.skipped == ("workers", "graphed", "compiled")  # the others first, then the dearest anchor
    kept_whole = plan_rest(s, rungs, price, left_s=20 / FILL, need_whole=True)
    assert "compiled" not in kept_whole.skipped and "graphed" in kept_whole.skipped  # the cheaper whole rung stays
    roomier = plan_rest(s, rungs, price, left_s=70 / FILL, need_whole=True)
    assert roomier.skipped == ("workers", "graphed")  # 4 + 4 + 60 s fit: the anchors all run


def test_the_whole_runs_deadline_bounds_each_data_sets_share(monkeypatch):
    """`make bench-quick` passes its end: a data set planned after an overrunning one gets what
    is left of the whole run, not its full share."""
    import time

    from pipeline.bench.ladder import QUICK_DEADLINE, quick_left

    s = bench_settings(quick=True, quick_minutes=5)
    monkeypatch.delenv(QUICK_DEADLINE, raising=False)
    assert quick_left(s, 60.0) == 240.0
    monkeypatch.setenv(QUICK_DEADLINE, f"{time.time() + 100:.0f}")
    assert 95 <= quick_left(s, 60.0) <= 101
    monkeypatch.setenv(QUICK_DEADLINE, "not a time")
    assert quick_left(s, 60.0) == 240.0


def test_quick_minutes_is_checked_with_the_bench_block():
    from pipeline.core.errors import InputError

    assert bench_settings(quick=True, quick_minutes=2.5).quick_minutes == 2.5
    for bad in (0, -1, "5", True):
        with pytest.raises((InputError, ValueError)):
            bench_settings(quick_minutes=bad)


@pytest.mark.slow
def test_a_quick_bench_with_too_little_time_cuts_and_records_what_it_cut(tmp_path, capsys):
    """A real (tiny) quick bench given almost no time left: it says what it cut, records it in
    the document, and every rung it ran is in the document."""
    from conftest import make_split

    from pipeline.bench.ladder import run_bench
    from pipeline.core.atomic import as_json
    from pipeline.stages.convert.stage import convert_dataset
    from pipeline.stages.csvdata import write_csv
    from pipeline.stages.shard.stage import shard_dataset

    data = tmp_path / "data"
    for split, (n, seed) in {"train": (192, 0), "test": (64, 1)}.items():
        write_csv(*make_split(n, seed), data / "csv" / f"{split}.csv")
    convert_dataset(data / "csv", data / "pq", data / "fig.json", "snappy", 65536)
    shard_dataset(data / "pq" / "compact", data / "shards", "tiny", ShardSettings(128, "none", 3))
    reference = tmp_path / "results" / "earlier" / "tiny.json"

    def quick(minutes: float):
        return bench_settings(
            quick=True,
            quick_minutes=minutes,
            batch_size=64,
            num_workers=1,
            variants=["naive", "preprocessed", "device", "compiled"],
            sample=["naive"],
        )

    s = quick(0.05)
    first = as_json(run_bench("tiny", data / "pq" / "wide", data / "shards", "cpu", quick(60)))
    reference.parent.mkdir(parents=True)
    reference.write_text(json.dumps(first))
    assert first["quick_plan"]["cuts"] == [] and first["quick_plan"]["skipped"] == []
    capsys.readouterr()
    doc = as_json(run_bench("tiny", data / "pq" / "wide", data / "shards", "cpu", s, [reference]))
    said = capsys.readouterr().err
    plan = doc["quick_plan"]
    assert plan["budget_s"] == 3.0 and plan["cuts"], said
    assert "of the quick budget left" in said or "bench tiny, quick: 0.05 min for it; planned" in said
    assert set(doc["variants"]) | set(plan["skipped"]) == set(s.variants)
    assert all(name not in doc["variants"] for name in plan["skipped"])
