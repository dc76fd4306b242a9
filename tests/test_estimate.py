"""The bench's estimate: scaled from an earlier run of the same device type and mode (this
machine's first), by the ratio of two calibrations; the time left follows this run's pace;
a busy host is named with what runs on it."""

from __future__ import annotations

import json
import multiprocessing
import time

import pytest
import torch
from conftest import bench_settings

from pipeline.bench.estimate import (
    Calibration,
    Pace,
    announce,
    busy_processes,
    calibrate,
    find_reference,
    host_report,
    pace_for,
    parts,
    predict,
    reference_step_s,
    settings_of,
)

# What the `document` below ran: two rungs, `naive` sampled, 5 epochs, 20 sampled steps over 4 epochs.
RAN = bench_settings(
    variants=["naive", "device"], sample=["naive"], epochs=5, sample_steps=20, sample_epochs=4, quick=False
)


def document(
    machine: str, wall_s: float = 600.0, quick: bool = False, device_type: str = "cpu", recorded: bool = True
) -> dict:
    """A bench document of two variants, `device` fully run, `naive` sampled."""
    variants = {
        "naive": {"train_s": 60.0, "wall_s": 300.0, "extrapolated": True},
        "device": {"train_s": 11.8, "wall_s": 70.0, "extrapolated": False},
    }
    doc = {
        "dataset": "mnist",
        "wall_s": wall_s,
        "machine": {"name": machine},
        "env": {"device_type": device_type},
        "params": {
            "quick": quick,
            "train_samples": 60000,
            "batch_size": 512,
            "epochs": 5,
            "sample_steps": 20,
            "sample_epochs": 4,
        },
        "variants": variants,
    }
    if recorded:
        variants["naive"]["bench_s"], variants["device"]["bench_s"] = 200.0, 300.0
        doc.update(floor_s=40.0, seeds_s=60.0, calibration={"step_s": 0.1, "spread": 0.02})
    return doc


def test_an_earlier_runs_parts_are_its_recorded_times_or_its_wall_time_spread_over_its_rungs():
    assert parts(document("a")) == {"naive": 200.0, "device": 300.0, "floor": 40.0, "seeds": 60.0}
    old = parts(document("a", recorded=False))
    assert sum(old.values()) == pytest.approx(600.0) and old["device"] > old["naive"]  # naive ran 80 of 590 steps
    assert reference_step_s(document("a")) == 0.1
    assert reference_step_s(document("a", recorded=False)) == pytest.approx(11.8 / 118)  # its `device` rung's step


def test_the_estimate_scales_by_the_calibrations_and_the_time_left_follows_the_pace():
    pace = pace_for(document("a"), Calibration(step_s=0.2, spread=0.0), RAN)
    assert pace.total() == pytest.approx(2 * 600)  # twice as slow a step here: twice the time
    assert pace.left({"floor": 80.0, "naive": 400.0}) == pytest.approx(600 + 120)  # on pace: the rest as planned
    # the sampled rung ran twice as slow as planned: the full rungs keep the calibration's pace
    assert pace.left({"floor": 80.0, "naive": 800.0}) == pytest.approx(600 + 120)
    assert pace.left({"floor": 160.0, "naive": 400.0}) == pytest.approx(2 * 720)  # the full kind twice as slow


def test_another_kind_of_run_is_predicted_from_the_references_per_epoch_figures():
    """A quick run (2 epochs, 5 sampled steps) from a full one: each rung from the full run's
    setup and per-epoch figures, corrected by how far the prediction missed the full run."""
    doc = document("a", recorded=False)
    for entry in doc["variants"].values():
        entry.update(setup_s=1.0, first_epoch_train_s=entry["train_s"], test_s=1.0)
    quick = bench_settings(
        variants=["naive", "device", "compiled"],
        sample=["naive"],
        epochs=2,
        sample_steps=5,
        sample_epochs=2,
        quick=True,
        floor=False,
        budget=False,
        accuracy_seeds=0,
    )
    parts_ = predict(doc, quick)
    assert parts_["device"] == pytest.approx(1.0 + 2 * (11.8 + 1.0))
    assert parts_["naive"] == pytest.approx(1.0 + 2 * 5 / 118 * (60.0 + 1.0))
    assert parts_["compiled"] == pytest.approx((parts_["device"] + parts_["naive"]) / 2)  # a rung it never ran
    own = sum(predict(doc, settings_of(doc, quick)).values())  # the reference predicted as it ran
    pace = pace_for(doc, Calibration(step_s=11.8 / 118, spread=0.0), quick)
    assert 600 / own > 2 and pace.total() == pytest.approx(sum(parts_.values()) * 2)  # a miss past 2x is capped
    doc["wall_s"] = 1.5 * own
    assert pace_for(doc, Calibration(step_s=11.8 / 118, spread=0.0), quick).total() == pytest.approx(
        sum(parts_.values()) * 1.5
    )


def test_the_reference_is_this_machines_run_of_this_device_type_and_mode(tmp_path):
    paths = []
    for folder, doc in (
        ("a", document("a")),
        ("b", document("b")),
        ("c", document("c", quick=True)),
        ("d", document("d", device_type="cuda")),
    ):
        (tmp_path / folder).mkdir()
        paths.append(tmp_path / folder / "mnist.json")
        paths[-1].write_text(json.dumps(doc))
    (tmp_path / "broken.json").write_text("{")
    paths.append(tmp_path / "broken.json")
    assert find_reference("mnist", paths, "cpu", False, "b")["machine"]["name"] == "b"  # this machine's
    assert find_reference("mnist", paths, "cpu", False, "elsewhere")["machine"]["name"] == "a"  # same mode
    assert find_reference("mnist", paths, "cpu", True, "elsewhere")["machine"]["name"] == "c"
    assert find_reference("mnist", paths, "cpu", True, "b")["machine"]["name"] == "b"  # this machine's, other mode
    assert find_reference("mnist", paths, "cuda", False, "b")["machine"]["name"] == "d"  # never another device type
    assert find_reference("fashion-mnist", paths, "cpu", False, "b") is None
    # a file counts by the data set it records: a copy named otherwise is no other data set's run
    for name in ("bench", "fashion-mnist"):
        (tmp_path / f"{name}.json").write_text(json.dumps(document("a")))
        assert find_reference(name, [*paths, tmp_path / f"{name}.json"], "cpu", False, "a") is None


def test_the_announcement_names_what_the_estimate_rests_on():
    calibration = Calibration(step_s=0.2, spread=0.0)
    pace = pace_for(document("amd-epyc-2c"), calibration, RAN)
    said = announce("mnist", document("amd-epyc-2c"), calibration, pace, {"fashion-mnist": 900.0})
    assert said.startswith("bench mnist: about 20 min here; the whole bench, with fashion-mnist, about 35 min")
    assert "200 ms here, 100 ms on amd-epyc-2c, whose bench of mnist took 10 min" in said
    assert "no earlier bench" in announce("mnist", None, calibration, None, {})


def test_a_busy_host_is_named_with_what_runs_on_it():
    quiet = Calibration(step_s=0.1, spread=0.05)
    assert host_report(quiet, 0.2, []) is None or "load average" in host_report(quiet, 0.2, [])
    said = host_report(quiet, 0.2, [(4242, "stress", 0.98), (4343, "python", 0.95)])
    assert said.startswith("warning: this host is busy: other processes use 1.9 of its")
    assert "stress (pid 4242) 98% of a core" in said and "marked unstable" in said
    shaky = host_report(Calibration(step_s=0.1, spread=0.45), 0.2, [])
    assert "took 45% apart (over 2x bench.max_spread, 20%)" in shaky
    # blocks a quarter of a second long spread by a quarter on a quiet host: no warning for that
    assert host_report(Calibration(step_s=0.1, spread=0.28), 0.2, []) is None or "load average" in host_report(
        Calibration(step_s=0.1, spread=0.28), 0.2, []
    )


def _spin(seconds: float) -> None:
    end = time.time() + seconds
    while time.time() < end:
        pass


def test_a_spinning_process_is_seen():
    spinner = multiprocessing.get_context("spawn").Process(target=_spin, args=(4.0,))
    spinner.start()
    try:
        time.sleep(1.0)  # past the interpreter's start
        # on a busy host a spinner gets less than its core, never nothing
        assert spinner.pid in {pid for pid, _, _ in busy_processes(window_s=1.5, share=0.02)}
    finally:
        spinner.terminate()
        spinner.join()


def test_the_calibration_times_the_models_step():
    calibration = calibrate(torch.device("cpu"), batch_size=32, blocks=3, block_s=0.05)
    assert calibration.step_s > 0 and calibration.spread >= 0
    written = calibration.written()  # as the document holds it; the bench reckons with the exact one
    assert (written.step_s, written.spread) == (round(calibration.step_s, 6), round(calibration.spread, 3))


def test_pace_with_nothing_done_is_the_whole_estimate():
    pace = Pace({"a": 10.0, "b": 30.0}, {"a": "sampled"})
    assert pace.left({}) == 40.0 and pace.total() == 40.0
    assert pace.left({"a": 20.0}) == 30.0  # a sampled part's pace says nothing of the full ones


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d.update(env=[1]),
        lambda d: d.update(machine="amd"),
        lambda d: d["variants"].update(naive=None),
        lambda d: d["params"].update(epochs=None),
        lambda d: d.update(floor=3),
        lambda d: d.update(seeds={"seeds": 4}),
        lambda d: d.update(calibration={"step_s": -1.0}),
        lambda d: d.update(calibration={"step_s": float("nan")}),
        lambda d: d.pop("wall_s"),
    ],
)
def test_a_malformed_earlier_run_gives_no_estimate_or_a_sound_one_never_an_error(tmp_path, change):
    doc = document("a")
    change(doc)
    (tmp_path / "mnist.json").write_text(json.dumps(doc))
    found = find_reference("mnist", [tmp_path / "mnist.json"], "cpu", False, "a")
    if found is not None:
        pace = pace_for(found, Calibration(step_s=0.1, spread=0.0), RAN)
        assert pace.total() > 0 and all(v >= 0 for v in pace.expected.values())
        assert announce("mnist", found, Calibration(step_s=0.1, spread=0.0), pace, {}).startswith("bench mnist: about")


def test_a_committed_results_file_without_its_wall_time_still_scales(tmp_path):
    """results/<machine>/<dataset>.json keeps the variants, not the stage's wall time."""
    doc = document("a", recorded=False)
    del doc["wall_s"]
    (tmp_path / "mnist.json").write_text(json.dumps(doc))
    found = find_reference("mnist", [tmp_path / "mnist.json"], "cpu", False, "a")
    assert found is not None and pace_for(found, Calibration(step_s=0.1, spread=0.0), RAN).total() > 0


def test_the_tuned_rung_is_predicted_over_its_own_epochs_and_each_of_its_seeds():
    """`tuned` runs its recipe's epochs, then its whole schedule once per seed: both parts of
    the estimate, from the earlier run's setup and per-epoch figures."""
    doc = document("a", recorded=False)
    doc["variants"]["tuned"] = {
        "train_s": 3.0,
        "test_s": 0.5,
        "setup_s": 2.0,
        "first_epoch_train_s": 3.0,
        "wall_s": 12.5,
        "extrapolated": False,
    }
    recipe = {"epochs": 3, "batch_size": 256, "max_lr": 0.01, "pct_start": 0.25, "betas": [0.9, 0.99], "seeds": 10}
    settings = bench_settings(
        variants=["naive", "device", "tuned"],
        sample=["naive"],
        epochs=5,
        floor=False,
        budget=False,
        accuracy_seeds=0,
        tuned=recipe,
    )
    parts_ = predict(doc, settings)
    assert parts_["tuned"] == pytest.approx(2.0 + 3 * 3.5)  # its 3 epochs, not the bench's 5
    assert parts_["tuned_seeds"] == pytest.approx(10 * (2.0 + 3 * 3.5))
    assert "tuned_seeds" not in predict(
        doc, bench_settings(variants=["naive", "device", "tuned"], sample=["naive"], tuned={**recipe, "seeds": 0})
    )
