import dataclasses
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import PARAMS, bench_settings, device_path, make_split, resident

from pipeline.bench.datapaths import Resident, _loader, data_path, sampled_steps
from pipeline.bench.document import (
    BenchDoc,
    BudgetDoc,
    Seeds,
    TimeToAccuracy,
    TunedSeeds,
    Variant,
    validate,
)
from pipeline.bench.figures import (
    finish,
    flag_unstable,
    steady_epochs,
    steady_step,
    summarise,
    time_to_accuracy,
    with_epoch_step,
)
from pipeline.bench.ladder import floor_after, run_bench, run_variant
from pipeline.bench.model import SimpleCNN, parameter_count
from pipeline.bench.recipe import bf16_pays, execution_of, train_config
from pipeline.bench.runners import (
    Floor,
    StaticSteps,
    Timing,
    TrainConfig,
    _limited,
    no_recompiles,
    train_eager,
    train_static,
)
from pipeline.bench.seed import NaiveDataset, PreprocessedDataset
from pipeline.bench.stage import write_bench
from pipeline.bench.variants import VARIANTS, Execution
from pipeline.core.atomic import as_json
from pipeline.core.params import ParamsError
from pipeline.shards import DeviceBatches
from pipeline.stages.convert.stage import convert_dataset
from pipeline.stages.csvdata import write_csv
from pipeline.stages.shard.settings import ShardSettings
from pipeline.stages.shard.stage import shard_dataset

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """Parquet (wide) and shards of an easy synthetic task: 600 train, 200 test images."""
    root = tmp_path_factory.mktemp("bench")
    (train_x, train_y), (test_x, test_y) = make_split(600, 0), make_split(200, 1)
    write_csv(train_x, train_y, root / "csv" / "train.csv")
    write_csv(test_x, test_y, root / "csv" / "test.csv")
    convert_dataset(root / "csv", root / "pq", root / "fig.json", "snappy")
    shard_dataset(root / "pq" / "compact", root / "shards", "tiny", ShardSettings(256, "none", 3))
    return root, (train_x, train_y)


def test_model_is_the_seeds():
    assert parameter_count(SimpleCNN()) == 206_922
    assert SimpleCNN()(torch.zeros(2, 1, 28, 28)).shape == (2, 10)


@pytest.mark.slow
def test_dataset_v1_items_match_the_seed(prepared):
    root, (images, labels) = prepared
    v1 = NaiveDataset(root / "pq" / "wide" / "train.parquet")
    item = v1[7]
    assert set(item) == {"image", "label"}
    assert item["image"].shape == (1, 28, 28) and item["image"].dtype == torch.float32
    assert item["label"].dtype == torch.long and item["label"].item() == labels[7]
    torch.testing.assert_close(item["image"][0], torch.from_numpy(images[7]).float() / 255)
    v2 = PreprocessedDataset(root / "pq" / "wide" / "train.parquet")
    for index in (0, 7, 599):
        torch.testing.assert_close(v2[index]["image"], v1[index]["image"])
        assert v2[index]["label"] == v1[index]["label"]


TINY_RECIPE = {"epochs": 3, "batch_size": 64, "max_lr": 0.01, "pct_start": 0.25, "betas": [0.9, 0.99], "seeds": 2}


@pytest.mark.slow
def test_every_variant_runs_with_its_costs(prepared, capsys):
    root, _ = prepared
    settings = bench_settings(
        epochs=2,
        batch_size=64,
        num_workers=1,
        sample=["naive_bs16", "naive"],
        sample_steps=3,
        sample_epochs=2,
        budget=True,
        target_accuracy={"tiny": [0.2, 0.3]},
        accuracy_seeds=2,
        tuned=TINY_RECIPE,
    )
    built = run_bench("tiny", root / "pq" / "wide", root / "shards", "cpu", settings)
    doc = as_json(built)
    assert list(doc["variants"]) == list(VARIANTS)
    assert validate("doc", doc, BenchDoc) == built  # what its readers read back is what the bench built
    assert doc["params"]["train_samples"] == 600 and doc["params"]["parameters"] == 206_922
    assert {"device", "torch", "cpu_count", "threads", "cuda"} <= set(doc["env"])
    for name, entry in doc["variants"].items():
        assert entry["extrapolated"] == (name in ("naive_bs16", "naive"))
        assert (entry["accuracy"] is None) == entry["extrapolated"]
        assert 0 < entry["setup_s"] < entry["wall_s"] and entry["speedup"] > 0
        assert (entry["wall_speedup"] is not None) == (name != "tuned")  # another recipe, other epochs: no wall ratio
        assert entry["cuda_graph"] is False  # no CUDA here: recorded as such
        measured = entry["measured"]
        if not entry["extrapolated"]:  # wall = setup + every timed epoch's train and test pass, exactly
            epochs = TINY_RECIPE["epochs"] if name == "tuned" else 2
            assert len(measured["train_s"]) == len(measured["test_s"]) == epochs
            assert entry["wall_s"] == pytest.approx(
                entry["setup_s"] + sum(measured["train_s"]) + sum(measured["test_s"]), abs=2e-3
            )
            assert [r["target"] for r in entry["time_to_accuracy"]] == [0.2, 0.3]  # one per target, in order
            for reached in entry["time_to_accuracy"]:
                if reached["epoch"] is not None:  # the wall time up to the end of that epoch's test pass
                    n = reached["epoch"]
                    assert reached["seconds"] == pytest.approx(
                        entry["setup_s"] + sum(measured["train_s"][:n]) + sum(measured["test_s"][:n]), abs=2e-3
                    )
                    assert (
                        entry["accuracy_by_epoch"][n - 1]
                        >= reached["target"]
                        > max([0, *entry["accuracy_by_epoch"][: n - 1]])
                    )
    assert doc["variants"]["naive"]["speedup"] == 1.0 == doc["variants"]["naive"]["wall_speedup"]
    # what the next run's estimate scales from: the calibration and the time of each part
    assert doc["calibration"]["step_s"] > 0 and all(v["bench_s"] > 0 for v in doc["variants"].values())
    assert sum(v["bench_s"] for v in doc["variants"].values()) + doc["floor_s"] + doc["seeds_s"] <= doc["wall_s"]
    said = capsys.readouterr().err
    assert said.startswith("bench tiny: ")  # the estimate (or why there is none) before the first rung
    assert (
        "naive: sampled: 2 epochs of 3 steps, extrapolated" in said and "(the epoch's figures are extrapolated" in said
    )
    assert doc["floor"]["train_s"] > 0 and doc["floor"]["compiled_train_s"] > 0
    # one floor epoch after every fully run variant: the fastest is the floor
    assert doc["floor"]["epochs"] == len(VARIANTS) - 2
    assert doc["env"]["host_memory"] == "kept"  # glibc here: freed blocks stay in the heap for the next step
    assert doc["compiled_options"]["autocast"] == bf16_pays(CPU)
    for name, entry in doc["variants"].items():
        budget = entry["budget"]
        parts = [budget[f"{part}_s"] for part in ("data_wait", "copy", "compute", "overhead", "other")]
        # one more epoch: a sampled one whole (3 steps' samples at 64), a full one's first 3 steps
        assert budget["steps"] == {"naive_bs16": 12}.get(name, 3)
        assert min(parts) >= 0 and budget["compute_s"] > 0
        assert sum(parts) == pytest.approx(budget["step_s"], abs=1e-5)  # the parts add up to the step
        # ... and the profiler's events lie inside the pass as a plain clock saw it (how much of
        # it they cover is a measurement that load moves; up to the figures' microsecond rounding)
        assert 0 < budget["step_s"] <= budget["wall_s"] + 1e-5 and budget["vs_wall"] > 0
        assert budget["epoch_step_s"] > 0
        assert budget["vs_epoch"] == pytest.approx(budget["step_s"] / budget["epoch_step_s"], abs=2e-3)
        assert entry["spread"]["min"] <= entry["spread"]["median"] <= entry["spread"]["max"]
        assert isinstance(entry["unstable"], bool) and (entry["unstable_reason"] is None) != entry["unstable"]
    assert doc["variants"]["naive"]["budget"]["data_wait_s"] > 0  # per-item pandas work, in the main process
    seeds = doc["seeds"]  # the first rung to 20% (an easy task: epoch 1), again from two fresh seeds
    reached = {
        n: v["time_to_accuracy"][0]["seconds"]
        for n, v in doc["variants"].items()
        if v["time_to_accuracy"] and v["time_to_accuracy"][0]["seconds"] is not None and n != "tuned"
    }
    assert seeds["variant"] == min(reached, key=reached.get) and seeds["seeds"] == [43, 44]
    assert seeds["reached"] == 2 and seeds["epochs"] == [1, 1] and seeds["min"] <= seeds["median"] <= seeds["max"]
    # the tuned recipe: its own batch and schedule length, then whole runs from two fresh seeds
    tuned = doc["variants"]["tuned"]
    assert len(tuned["measured"]["train_s"]) == TINY_RECIPE["epochs"] and tuned["accuracy_ok"] is None
    over = doc["tuned"]
    assert over["seeds"] == [43, 44] and len(over["accuracy"]) == 2 and over["recipe"]["max_lr"] == 0.01
    # the recipe as it ran: params.yaml's fields, and no label smoothing where none is set
    assert doc["params"]["tuned"] == over["recipe"] == {**TINY_RECIPE, "label_smoothing": 0.0}
    assert over["accuracy_min"] <= over["accuracy_mean"] <= over["accuracy_max"]
    assert [t["target"] for t in over["targets"]] == [0.2, 0.3] and all(len(t["seconds"]) == 2 for t in over["targets"])


def test_summarise_scales_sampled_steps_and_adds_setup():
    settings = bench_settings(epochs=5, sample_steps=4)
    timing = Timing(train_s=[3.0, 1.0, 2.0], test_s=[0.5, 0.3, 0.4], accuracy=0.5, setup_s=1.5, sampled_steps=4)
    entry = as_json(summarise(timing, 38, 3, settings))
    # steady: the median of the epochs after the first, 1.5 s over 4 steps -> 38 steps: x 9.5;
    # the test split has only 3 steps (x 1). The first epoch's extra 1.5 s is a one-time cost.
    assert entry["train_s"] == pytest.approx(14.25) and entry["test_s"] == pytest.approx(0.35)
    assert entry["first_epoch_train_s"] == pytest.approx(14.25 + 1.5)
    assert entry["wall_s"] == pytest.approx(1.5 + (14.25 + 1.5) + 4 * 14.25 + (0.35 + 0.15) + 4 * 0.35)
    assert entry["accuracy"] is None and entry["extrapolated"]
    assert entry["measured"] == {"train_s": [3.0, 1.0, 2.0], "test_s": [0.5, 0.3, 0.4]}
    whole = as_json(summarise(dataclasses.replace(timing, sampled_steps=None), 38, 3, settings))
    assert whole["train_s"] == pytest.approx(2.0) and whole["accuracy"] == 0.5 and not whole["extrapolated"]
    assert whole["first_epoch_train_s"] == 3.0
    assert whole["wall_s"] == pytest.approx(1.5 + 6.0 + 1.2)


def test_summarise_sets_the_budget_beside_the_timed_step_and_keeps_each_epochs_accuracy():
    """The profiled pass's step beside the timed epochs' (their steady median over the steps
    of an epoch); the accuracy after every timed epoch, to 4 places; none for sampled ones."""
    timing = Timing(
        train_s=[9.0, 4.0, 6.0],
        test_s=[1.0, 1.0, 1.0],
        accuracy=0.91,
        accuracies=[0.81234, 0.9, 0.91],
        budget=_parts(step_s=0.06, compute_s=0.06),
    )
    entry = summarise(timing, 100, 10, bench_settings(epochs=3))
    assert as_json(entry.budget) == {
        **as_json(BudgetDoc(**_parts(step_s=0.06, compute_s=0.06))),
        "epoch_step_s": 0.05,
        "vs_epoch": 1.2,
    }
    assert entry.accuracy_by_epoch == [0.8123, 0.9, 0.91]
    sampled = summarise(dataclasses.replace(timing, sampled_steps=20), 100, 10, bench_settings(epochs=3))
    assert sampled.accuracy_by_epoch is None and sampled.budget.epoch_step_s == pytest.approx(0.25)
    assert summarise(dataclasses.replace(timing, budget=None), 100, 10, bench_settings(epochs=3)).budget is None


def test_steady_epochs_leave_out_the_first_only_when_two_remain():
    assert steady_epochs([5.0, 1.0, 2.0]) == [1.0, 2.0] and steady_epochs([5.0, 1.0, 2.0, 3.0]) == [1.0, 2.0, 3.0]
    assert steady_epochs([5.0, 1.0]) == [5.0, 1.0] and steady_epochs([5.0]) == [5.0]


def test_time_to_accuracy_counts_a_pass_at_the_target_exactly():
    timing = Timing(train_s=[1.0, 1.0, 1.0], test_s=[0.1, 0.1, 0.1], accuracies=[0.5, 0.98, 0.99], setup_s=0.12345)
    assert time_to_accuracy(timing, 0.98) == TimeToAccuracy(target=0.98, seconds=2.323, warm_seconds=2.323, epoch=2)
    assert time_to_accuracy(timing, 0.995) == TimeToAccuracy(target=0.995)


def _parts(**given: float) -> dict:
    """A profiled pass's parts per step: those given, the others 0."""
    return {**dict.fromkeys(("data_wait_s", "copy_s", "compute_s", "overhead_s", "other_s", "step_s"), 0.0), **given}


def _doc(document: dict) -> BenchDoc:
    """A bench document from the parts a test names (the rest: a run of 1 epoch at batch 1)."""
    params = {"epochs": 1, "batch_size": 1, **document.get("params", {})}
    env = {"env": {"device": "test", "torch": "test", "cpu_count": 1, **document["env"]}} if "env" in document else {}
    return validate("test", {"dataset": "d", **document, "params": params, **env}, BenchDoc)


def _variants(**train_s):
    return {
        name: {"train_s": t, "test_s": 0.0, "spread": {"min": t, "median": t, "max": t}} for name, t in train_s.items()
    }


def _unstable(document: dict, max_spread: float) -> tuple[list[str], dict]:
    """flag_unstable over `document`: the names it marked, and the marked variants as JSON."""
    variants = as_json(flag_unstable(_doc(document), max_spread))["variants"]
    return [name for name, entry in variants.items() if entry["unstable"]], variants


def test_unstable_at_the_bounds_of_each_rule():
    """Each rule flags strictly past `max_spread`: epochs spread over their median, twins apart
    over the faster one, a rung under its floor by more; each reason said exactly."""
    variants = _variants(naive=10.0, preprocessed=0.5, batched=0.0)
    variants["naive"]["spread"] = {"min": 9.0, "median": 10.0, "max": 11.0}  # 20%: not past it
    variants["preprocessed"]["spread"] = {"min": 0.4, "median": 0.5, "max": 0.65}  # 50%, under a second
    marked, variants = _unstable({"variants": variants}, 0.2)
    assert marked == ["preprocessed"]  # batched: nothing timed
    assert variants["preprocessed"]["unstable_reason"] == "epochs spread 50% of their median"
    assert variants["naive"]["unstable_reason"] is None
    marked, floored = _unstable({"variants": _variants(device=8.0, workers=7.9), "floor": {"train_s": 10.0}}, 0.2)
    assert marked == ["workers"] and floored["workers"]["below_floor"]
    assert floored["workers"]["unstable_reason"] == "7.9 s/epoch is below its floor 10 s"
    assert floored["device"]["unstable"] is False  # 8.0 is the floor less 20% exactly


def test_twins_apart_past_the_spread_are_both_marked_on_the_cpu():
    """No `env`: the CPU's twins apply. 20% apart is not past the bound; 25% is, and both
    twins say so; a rung with no twin in the run and a twin timed at zero are left alone."""
    assert _unstable({"variants": _variants(persistent=10.0, pinned=12.0)}, 0.2)[0] == []
    marked, variants = _unstable({"variants": _variants(persistent=10.0, pinned=12.5)}, 0.2)
    assert marked == ["persistent", "pinned"]
    assert variants["pinned"]["unstable_reason"] == "25% apart from persistent, which does the same work here"
    assert _unstable({"variants": _variants(persistent=10.0)}, 0.2)[0] == []
    assert _unstable({"variants": _variants(persistent=0.0, pinned=5.0)}, 0.2)[0] == []
    assert _unstable({"variants": _variants(persistent=0.5, pinned=0.8)}, 0.2)[0] == ["persistent", "pinned"]
    both = {"variants": _variants(persistent=10.0, pinned=12.5)}
    both["variants"]["pinned"]["spread"] = {"min": 10.0, "median": 12.5, "max": 15.0}
    assert _unstable(both, 0.2)[1]["pinned"]["unstable_reason"] == (
        "epochs spread 40% of their median; 25% apart from persistent, which does the same work here"
    )


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["preprocessed", "batched", "device", "graphed", "compiled"])
def test_accuracy_rises_on_an_easy_task(prepared, variant):
    root, _ = prepared
    settings = bench_settings(batch_size=32, epochs=3, num_workers=1, sample=[])
    timing, _, _ = run_variant(variant, "tiny", root / "pq" / "wide", root / "shards", CPU, settings)
    assert np.isfinite(timing.loss)
    assert timing.accuracy > 0.9  # ten well-separated classes: chance is 0.1


@pytest.mark.slow
def test_same_batches_same_training(prepared):
    """batched (mapped shards) and device (the split resident) draw their batches by the shard
    library's one order rule: identical batches in identical order, so identical training."""
    root, _ = prepared
    results = []
    for variant in ("device", "batched"):
        path = data_path(
            variant, root / "pq" / "wide", root / "shards", CPU, dataset="tiny", batch_size=64, seed=42, workers=1
        )
        timing = train_eager(path, CPU, TrainConfig(batch_size=64), epochs=1)
        results.append((timing.accuracy, timing.loss))
    assert results[0][0] == results[1][0]
    assert results[0][1] == pytest.approx(results[1][1], rel=1e-5)


@pytest.mark.slow
def test_graphed_trains_exactly_as_device():
    """Static steps (padded, weighted last batch) give the `device` loop's loss and accuracy:
    100 samples at batch 32 leave a last batch of 4, padded to 32 with weight 0."""
    data, config = resident(), TrainConfig(batch_size=32)
    eager = train_eager(device_path(data, 32, config.seed), CPU, config, epochs=2)
    static = train_static(data, CPU, config, Execution(cuda_graph=True), epochs=2)
    assert static.cuda_graph is False  # asked for, but this is a CPU: run eagerly and say so
    assert static.loss == pytest.approx(eager.loss, rel=1e-5)
    assert static.accuracy == eager.accuracy


@pytest.mark.slow
def test_padded_step_has_the_mean_loss_gradient():
    """The weighted sum over a padded batch has the gradient of the mean over its real samples."""
    data, config = resident(n_train=36), TrainConfig(batch_size=32)
    run = StaticSteps(data, CPU, config, Execution())
    run.order[:36].copy_(torch.arange(36))
    last = run.order[32:64]
    assert run.weights[32:36].tolist() == [0.25] * 4 and run.weights[36:].abs().sum() == 0
    x = data.train_images[last].unsqueeze(1).float() / 255
    loss = (F.cross_entropy(run.model(x), data.train_labels[last].long(), reduction="none") * run.weights[32:]).sum()
    padded = torch.autograd.grad(loss, list(run.model.parameters()))
    real = F.cross_entropy(run.model(x[:4]), data.train_labels[32:36].long())
    expected = torch.autograd.grad(real, list(run.model.parameters()))
    for a, b in zip(padded, expected):
        torch.testing.assert_close(a, b)


@pytest.mark.slow
def test_no_compilation_after_warm_up():
    """Every shape is warmed up: the timed epochs run under torch.compiler's fail_on_recompile
    stance (the cheap 'eager' backend) and finish. The control shows the stance does stop a
    recompile when a partial last batch reaches a compiled model."""
    data, config = resident(n_train=70, n_test=40), TrainConfig(batch_size=32)
    timing = train_static(data, CPU, config, Execution(compile_mode="default", backend="eager"), epochs=3)
    assert timing.warmup_s > 0 and len(timing.train_s) == 3

    torch.compiler.reset()
    model = torch.compile(SimpleCNN(), backend="eager")
    model(torch.zeros(32, 1, 28, 28))
    with pytest.raises(RuntimeError, match="(?i)recompil"):
        with no_recompiles(Execution(compile_mode="default", backend="eager")):
            model(torch.zeros(6, 1, 28, 28))  # 70 = 2 x 32 + 6: the write-up's last batch


@pytest.mark.slow
def test_warm_up_leaves_no_trace_in_training():
    data, config = resident(), TrainConfig(batch_size=32)
    compiled = train_static(data, CPU, config, Execution(compile_mode="default", backend="eager"), epochs=1)
    plain = train_static(data, CPU, config, Execution(), epochs=1)
    assert compiled.loss == pytest.approx(plain.loss, rel=1e-5)


@pytest.mark.slow
def test_the_floor_is_the_same_training_without_a_data_path(monkeypatch):
    """Pregathered steps train exactly as `graphed` does (same batches, same order, same
    gradients): only the gather and conversion have left the clock."""
    data, config = resident(), TrainConfig(batch_size=32)
    plain = train_static(data, CPU, config, Execution(), epochs=2)
    pregathered = train_static(data, CPU, config, Execution(), epochs=2, pregathered=True)
    assert pregathered.loss == pytest.approx(plain.loss, rel=1e-6)
    assert pregathered.accuracy == plain.accuracy
    floor = Floor(data, CPU, config, Execution())
    seconds = [floor.epoch() for _ in range(3)]
    assert floor.seconds == min(seconds) and floor.train_s == seconds  # a burst only ever slows an epoch
    again = Floor(data, CPU, config, Execution())
    for _ in range(2):
        again.epoch()
    # epoch by epoch, the floor trains as the pregathered run does: same permutations, same steps
    assert again.run.total_loss.item() / again.run.train_steps == pytest.approx(pregathered.loss, rel=1e-6)


@pytest.mark.parametrize("pregathered", [False, True])
def test_a_step_chosen_by_the_counter_on_the_device_trains_as_the_epochs_own_step(pregathered):
    """`graph_scope="step"`: each step reads its batch, loss weights and rate where a counter on
    the device points, so one captured step replayed per step is the epoch. Run eagerly here
    (a CPU), the counter's steps train exactly as the epoch's own: the same batches in the same
    order, the padded last one included, and the one-cycle rate of each step."""
    from pipeline.bench.runners import OneCycle, StaticSteps

    data = resident(n_train=100)  # batch 32: 4 steps, the last padded from 4 samples
    config = TrainConfig(batch_size=32, lr=0.01, betas=(0.9, 0.99), schedule=OneCycle(max_lr=0.01))
    runs = {
        scope: StaticSteps(data, CPU, config, Execution(graph_scope=scope), pregathered=pregathered, epochs=2)
        for scope in ("epoch", "step")
    }
    losses = {scope: [] for scope in runs}
    for scope, run in runs.items():
        for epoch in range(2):
            run.before_epoch(epoch)
            run.train_epoch(epoch)
            losses[scope].append(run.total_loss.item())
    assert runs["step"].step_index.item() == runs["step"].train_steps == 4  # the counter walked the epoch
    assert losses["step"] == losses["epoch"]
    for a, b in zip(runs["step"].model.parameters(), runs["epoch"].model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # a step run on its own (a benchmark's) is the step it names, whatever the counter held
    by_counter, by_slice = runs["step"], runs["epoch"]
    for step in (2, 0, 3):
        by_counter._seek(step)
        for mine, theirs in zip(by_counter._gather(step), by_slice._gather(step)):
            assert torch.equal(mine, theirs)
    by_counter.train_step(1)
    assert by_counter.step_index.item() == 2


def test_bench_settings_are_checked_once_by_the_params_schema():
    settings = bench_settings(epochs=2, variants=["device", "graphed"], sample=[])
    assert settings.variants == ("device", "graphed") and settings.epochs == 2 and settings.sample == ()
    for overrides, message in (
        ({"epoch": 2}, "bench.epoch: Extra inputs"),
        ({"variants": ["fast"]}, "bench.variants.0: Input should be"),
        ({"sample": ["graphed"]}, "cannot be sampled"),
        (
            {
                "compiled": {
                    "cpu": {"compile_mode": "turbo", "autocast": False, "channels_last": False, "cuda_graph": False}
                }
            },
            "bench.compiled.cpu.compile_mode",
        ),
        ({"graph": "batch"}, "bench.graph: Input should be 'epoch' or 'step'"),
        ({"variants": "naive"}, r"bench.variants: Input should be a valid list \(got 'naive'\)"),  # as YAML says it
        ({"variants": []}, "bench.variants: List should have at least 1 item"),
    ):
        with pytest.raises(ParamsError, match=message):
            bench_settings(**overrides)
    with pytest.raises(ValueError, match="graph_scope 'batch' is not one of epoch, step"):
        Execution(graph_scope="batch")


@pytest.mark.slow
def test_standalone_bench_from_idx_files(tmp_path, tiny, monkeypatch):
    """The GPU-machine path: IDX mirror -> checked files -> Parquet + shards -> results/<slug>/."""
    import yaml

    from pipeline.budget.machine import fingerprint
    from pipeline.standalone import run_standalone

    tiny.write_mirror(tmp_path / "mirror" / "tiny")
    (tmp_path / "sources.yaml").write_text(yaml.safe_dump({"tiny": {"files": tiny.files}}))
    params = yaml.safe_load((PARAMS).read_text())
    params["datasets"], params["shard"]["samples_per_shard"] = ["tiny"], 40
    params["bench"].update(
        epochs=1,
        batch_size=16,
        num_workers=1,
        variants=["naive", "device", "graphed"],
        sample=["naive"],
        sample_steps=2,
        sample_epochs=2,
        floor=False,
        budget=True,
    )
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    written = run_standalone(
        tmp_path / "mirror",
        tmp_path / "results",
        tmp_path / "work",
        ["tiny"],
        tmp_path / "params.yaml",
        tmp_path / "sources.yaml",
        "cpu",
        "abc1234",
        {},
    )
    assert written == [tmp_path / "results" / fingerprint("cpu").name / "tiny.json"]
    doc = json.loads(written[0].read_text())
    assert doc["env"]["commit"] == "abc1234" and doc["date"] and doc["machine"] == as_json(fingerprint("cpu"))
    assert doc["params"]["train_samples"] == 64 and list(doc["variants"]) == ["naive", "device", "graphed"]
    assert math.isfinite(doc["variants"]["graphed"]["wall_s"])
    import pyarrow.parquet as pq  # the naive rungs read the codec the pipeline's bench reads

    wide = pq.ParquetFile(tmp_path / "work" / "tiny" / "parquet" / "wide" / "train.parquet").metadata
    assert wide.row_group(0).column(0).compression.lower() == params["bench"]["parquet_codec"]


def test_inputs_for_a_benchmark_that_reads_no_parquet_are_the_shards_alone(tmp_path, tiny):
    import yaml

    from pipeline.shards import ShardDataset
    from pipeline.standalone import build_inputs

    tiny.write_mirror(tmp_path / "mirror" / "tiny")
    (tmp_path / "sources.yaml").write_text(yaml.safe_dump({"tiny": {"files": tiny.files}}))
    parquet, shards = build_inputs("tiny", tmp_path / "mirror", tmp_path / "work", tmp_path / "sources.yaml", 40, None)
    assert parquet is None and not (tmp_path / "work" / "tiny" / "parquet").exists()
    assert len(ShardDataset(shards / "train")) == 64


def test_a_standalone_run_estimates_from_the_projects_results_as_well_as_its_out_folder(tmp_path):
    from pipeline.standalone import documents_under

    project, out = tmp_path / "project", tmp_path / "out"
    for doc in (
        project / "results" / "h100" / "mnist.json",
        out / "a100" / "mnist.json",
        project / "results" / "benchmarks" / "x" / "y" / "deep.json",
    ):
        doc.parent.mkdir(parents=True, exist_ok=True)
        doc.write_text("{}")
    (project / "params.yaml").write_text("")
    assert documents_under(out, project / "params.yaml") == sorted(
        [project / "results" / "h100" / "mnist.json", out / "a100" / "mnist.json"]
    )
    assert documents_under(project / "results", project / "params.yaml") == [
        project / "results" / "h100" / "mnist.json"
    ]


def test_machine_fingerprint_names_the_gpu_and_is_stable(monkeypatch, tmp_path):
    from pipeline.stages.machine import fingerprint, write_machine

    write_machine(tmp_path / "a.json")
    write_machine(tmp_path / "b.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()  # DVC sees no change
    assert json.loads((tmp_path / "a.json").read_text())["device"] in ("cpu", "cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    gpu = fingerprint()
    assert (gpu.name, gpu.gpu, gpu.gpu_count, gpu.device) == (
        "h100-80gb-hbm3",
        "NVIDIA H100 80GB HBM3",
        8,
        "cuda",
    )
    cpu = fingerprint("cpu")  # the same box benched on its CPU: cores, then its best instruction set
    assert cpu.name.split("-")[-1] in ("", "amx", "avx512bf16", "avx512", "avx2", "sve2", "sve", "neon")
    assert f"-{gpu.cores}c" in cpu.name


AVX2_ONLY = "model name\t: AMD EPYC\nflags\t\t: fpu sse2 avx fma avx2 bmi2\n"
BF16 = "model name\t: AMD EPYC\nflags\t\t: fpu sse2 avx fma avx2 avx512f avx512_vnni avx512_bf16 bmi2\n"


def test_two_cpus_sold_under_one_name_whose_peaks_differ_are_two_machines(monkeypatch):
    """'AMD EPYC' with AVX2 alone and with AVX-512 BF16 compute bf16 a hundred times apart: the
    fingerprint (and so DVC, which reruns the bench on a changed fingerprint) and the name
    (the label of every figure) tell them apart; the bench's bf16 choice follows the flags."""
    from pipeline.bench.recipe import bf16_pays
    from pipeline.budget import machine

    seen = {}
    for label, text in (("avx2", AVX2_ONLY), ("bf16", BF16)):
        monkeypatch.setattr(machine, "cpu_info", lambda text=text: text)
        seen[label] = machine.fingerprint("cpu")
        seen[label + "_native"] = bf16_pays(torch.device("cpu"))
    assert seen["avx2"].cpu == seen["bf16"].cpu == "AMD EPYC"
    assert seen["avx2"].isa == ("avx2", "fma")
    assert seen["bf16"].isa == ("avx2", "avx512_bf16", "avx512_vnni", "avx512f", "fma")
    cores = seen["avx2"].cores
    assert (seen["avx2"].name, seen["bf16"].name) == (f"amd-epyc-{cores}c-avx2", f"amd-epyc-{cores}c-avx512bf16")
    assert (seen["avx2_native"], seen["bf16_native"]) == (False, True)
    monkeypatch.setattr(machine, "cpu_info", lambda: "")  # no /proc/cpuinfo: no tier, no flags
    assert machine.fingerprint("cpu").isa == () and machine.fingerprint("cpu").name.endswith(f"-{cores}c")


def _finished(document: dict, settings) -> dict:
    """`finish` over `document`: its variants as JSON."""
    return as_json(finish(_doc(document), settings))["variants"]


def _entry(train_s: float, test_s: float, wall_s: float, accuracy: float | None, spread: float = 0.0) -> dict:
    return {
        "train_s": train_s,
        "test_s": test_s,
        "wall_s": wall_s,
        "accuracy": accuracy,
        "spread": {"min": train_s * (1 - spread / 2), "median": train_s, "max": train_s * (1 + spread / 2)},
    }


def test_unstable_variants_are_marked_with_why():
    document = {
        "params": {"train_samples": 100},
        "env": {"device_type": "cpu"},
        "floor": {"train_s": 10.0},
        "variants": {
            "persistent": _entry(20.0, 1.0, 50.0, None),
            "pinned": _entry(30.0, 1.0, 70.0, None),
            "preprocessed": _entry(12.0, 1.0, 60.0, 0.9, spread=0.5),
            "device": _entry(11.0, 1.0, 60.0, 0.9, spread=0.1),
            "graphed": _entry(7.0, 1.0, 40.0, 0.9),
        },
    }
    v = _finished(document, bench_settings(max_spread=0.2))
    assert "50% apart from pinned" in v["persistent"]["unstable_reason"] and v["pinned"]["unstable"]
    assert v["preprocessed"]["unstable_reason"] == "epochs spread 50% of their median"
    assert v["device"]["unstable"] is False and v["device"]["unstable_reason"] is None
    assert v["graphed"]["unstable"] is False  # no floor of its own options was timed: nothing to compare
    document["floor"]["graphed_train_s"] = 10.0
    v = _finished(document, bench_settings(max_spread=0.2))
    assert v["graphed"]["below_floor"] and "below its floor 10 s" in v["graphed"]["unstable_reason"]
    document["env"]["device_type"] = "cuda"  # pinned pins there: different work, no twin
    assert not _finished(document, bench_settings(max_spread=0.2))["persistent"]["unstable"]


def test_stage_warns_once_naming_the_unstable(capsys):
    import io

    from pipeline.bench.stage import warn_unstable

    stream = io.StringIO()
    shaky = {"train_s": 1.0, "test_s": 0.1, "unstable": True, "unstable_reason": "x"}
    warn_unstable(_doc({"variants": {"a": {"train_s": 1.0, "test_s": 0.1}, "b": shaky}}), stream)
    assert stream.getvalue() == (
        "warning: d: unstable on this machine: b (x). Re-run on a quiet machine: dvc repro -f -s bench@d\n"
    )
    stream = io.StringIO()
    warn_unstable(_doc({"variants": {"a": {"train_s": 1.0, "test_s": 0.1}}}), stream)
    assert stream.getvalue() == ""


def test_finish_speedups_throughput_and_accuracy_check():
    document = {
        "params": {"train_samples": 60_000},
        "variants": {
            "naive": _entry(90.0, 10.0, 520.0, None),
            "preprocessed": _entry(18.0, 2.0, 110.0, 0.9800),
            "device": _entry(4.0, 1.0, 26.0, 0.9900),  # exactly at the tolerance: ok
            "compiled": _entry(1.5, 0.5, 40.0, 0.9699),  # just outside it
        },
    }
    finished = as_json(finish(_doc(document), bench_settings(accuracy_tolerance=0.01)))
    v = finished["variants"]
    assert v["naive"]["speedup"] == 1.0 and v["naive"]["wall_speedup"] == 1.0
    assert v["preprocessed"]["speedup"] == 5.0 and v["device"]["speedup"] == 20.0 and v["compiled"]["speedup"] == 50.0
    assert v["preprocessed"]["wall_speedup"] == pytest.approx(4.73) and v["compiled"]["wall_speedup"] == 13.0
    assert v["device"]["samples_per_s"] == 15_000 and v["compiled"]["samples_per_s"] == 40_000
    assert v["preprocessed"]["accuracy_ok"] is True and v["device"]["accuracy_ok"] is True
    assert v["compiled"]["accuracy_ok"] is False and v["naive"]["accuracy_ok"] is None  # sampled: not checked
    assert finished["accuracy_tolerance"] == 0.01


def test_finish_without_naive_or_preprocessed():
    document = {
        "params": {"train_samples": 100},
        "variants": {"batched": _entry(2.0, 1.0, 5.0, 0.5), "device": _entry(1.0, 1.0, 4.0, 0.52)},
    }
    v = _finished(document, bench_settings(accuracy_tolerance=0.01))
    assert v["device"]["speedup"] is None  # nothing to compare against
    assert v["batched"]["accuracy_ok"] is True and v["device"]["accuracy_ok"] is False  # anchored on the first


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["device", "graphed"])
def test_resident_variants_train_shuffled(prepared, variant):
    """`device` (and `graphed`/`compiled`, which take its order) see a fresh seeded
    permutation each epoch, the same for the same seed."""
    root, _ = prepared
    data = Resident.load(root / "shards", CPU, "tiny")
    if variant == "device":
        path = data_path(
            "device", root / "pq" / "wide", root / "shards", CPU, dataset="tiny", batch_size=64, seed=42, workers=1
        )
        epoch = lambda: torch.cat([y for _, y in path.train()])  # noqa: E731
        first, second = epoch(), epoch()
    else:
        steps = StaticSteps(data, CPU, TrainConfig(batch_size=64, seed=42), Execution())
        orders = []
        for e in (0, 1):
            steps.before_epoch(e)
            steps.train_epoch(e)
            orders.append(data.train_labels[steps.order[:600]].clone())
        first, second = orders
    unshuffled = data.train_labels.long()
    assert not torch.equal(first.long(), unshuffled) and not torch.equal(first, second)
    assert torch.equal(first.sort().values.long(), unshuffled.sort().values)
    expected = DeviceBatches({"labels": data.train_labels}, 64, shuffle=True, seed=42).rank_order(0)
    assert torch.equal(first.long(), data.train_labels[expected].long())


def test_bench_document_is_written_readable_and_whole(tmp_path):
    """Indented JSON with a final newline: the bench file is reviewed in diffs."""
    document = _doc({"variants": {"naive": {"train_s": 1.5, "test_s": 0.5}}})
    write_bench(document, tmp_path / "out" / "d.json")
    assert (tmp_path / "out" / "d.json").read_text() == json.dumps(as_json(document), indent=2) + "\n"


def test_a_key_its_readers_do_not_declare_cannot_be_built():
    """A misspelt key is refused where the document is built, long before a file is written."""
    with pytest.raises(TypeError, match="trian_s"):
        Variant(train_s=1.5, test_s=0.5, trian_s=1.0)


@pytest.mark.parametrize(
    "change, said",
    [
        (lambda d: dataclasses.replace(d, params=dataclasses.replace(d.params, epochs=0)), "params.epochs"),
        (
            lambda d: dataclasses.replace(
                d,
                tuned=TunedSeeds(
                    seeds=[43],
                    accuracy=[0.9],
                    accuracy_mean=0.9,
                    accuracy_min=0.9,
                    accuracy_max=1.5,
                    targets=[],
                ),
            ),
            "tuned.accuracy_max",
        ),
    ],
)
def test_a_bench_document_out_of_its_bounds_is_not_written(tmp_path, change, said):
    """The writer checks the values against the readers' bounds: one line naming the key, no
    file, and the run's document kept elsewhere."""
    from pipeline.core.errors import DataError

    document = change(_doc({"variants": {"naive": {"train_s": 1.5, "test_s": 0.5}}}))
    with pytest.raises(DataError, match=re.escape(said)) as refused:
        write_bench(document, tmp_path / "d.json")
    assert not (tmp_path / "d.json").exists() and list(tmp_path.iterdir()) == []
    kept = Path(re.search(r"the run's document is kept as (\S+)$", str(refused.value)).group(1))
    assert json.loads(kept.read_text()) == as_json(document)  # the run is not lost
    kept.unlink()


def test_summary_keys_and_rounding():
    timing = Timing(
        train_s=[3.123456789, 1.987654321],
        test_s=[0.61234567, 0.3],
        accuracy=0.98765,
        setup_s=1.23486,
        warmup_s=0.5556,
        capture_s=0.1234567,
        cuda_graph=True,
    )
    entry = as_json(summarise(timing, 10, 3, bench_settings(epochs=2)))
    assert entry == {
        **as_json(Variant(train_s=0, test_s=0)),  # what finish() fills in later: its defaults
        "train_s": 2.5556,
        "test_s": 0.4562,
        "first_epoch_train_s": 3.1235,
        "setup_s": 1.235,
        "warmup_s": 0.556,
        "capture_s": 0.123,
        "wall_s": 7.258,
        "accuracy": 0.9877,
        "extrapolated": False,
        "cuda_graph": True,
        "measured": {"train_s": [3.1235, 1.9877], "test_s": [0.6123, 0.3]},
        "spread": {"min": 1.9877, "median": 2.5556, "max": 3.1235},
        "budget": None,
        "accuracy_by_epoch": [],
        "time_to_accuracy": None,
    }  # (no per-epoch accuracies given, no target)
    # No test pass ran: no accuracy (not 0, which would read as a broken model)
    unmeasured = summarise(Timing(train_s=[1.0], test_s=[0.5]), 10, 3, bench_settings(epochs=1))
    assert unmeasured.accuracy is None


def test_execution_per_variant_and_device(monkeypatch):
    settings = bench_settings()
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert execution_of(settings, "graphed", cuda) == Execution(cuda_graph=True)
    assert execution_of(settings, "graphed", cpu) == Execution(cuda_graph=True)  # recorded as not captured off CUDA
    assert execution_of(settings, "compiled", cuda) == Execution(
        compile_mode="default", autocast=True, channels_last=True, cuda_graph=True
    )
    assert execution_of(settings, "compiled", cpu) == Execution(
        compile_mode="none", autocast=bf16_pays(cpu), channels_last=True, cuda_graph=False
    )
    monkeypatch.setattr("pipeline.bench.recipe.bf16_pays", lambda device: True)  # a CPU with native bf16
    assert execution_of(settings, "compiled", cpu) == Execution(
        compile_mode="none", autocast=True, channels_last=True, cuda_graph=False
    )
    by_step = bench_settings(graph="step")  # what one graph holds: graphed, compiled and tuned alike
    assert [execution_of(by_step, v, cuda).graph_scope for v in ("graphed", "compiled", "tuned")] == ["step"] * 3
    assert (
        execution_of(settings, "graphed", cuda).graph_scope
        == execution_of(settings, "tuned", cuda).graph_scope
        == "epoch"
    )
    sparse = bench_settings(
        compiled={
            "cpu": {"compile_mode": "max-autotune", "autocast": False, "channels_last": False, "cuda_graph": False}
        }
    )
    assert execution_of(sparse, "compiled", cpu) == Execution(compile_mode="max-autotune")  # the rest: defaults
    assert execution_of(sparse, "compiled", cuda) == Execution()  # no entry: eager fp32
    assert bench_settings(num_workers=3).workers() == 3
    for cores, workers in ((16, 4), (3, 3), (None, 1)):  # 0: at most 4, one where the count is unknown
        monkeypatch.setattr("pipeline.bench.settings.os.cpu_count", lambda cores=cores: cores)
        assert settings.workers() == workers
    assert train_config(settings) == TrainConfig(batch_size=512, lr=1e-3, seed=42)
    assert train_config(bench_settings(batch_size=64, lr=0.01, seed=7)) == TrainConfig(batch_size=64, lr=0.01, seed=7)


def test_finish_anchors_on_preprocessed_and_rounds_to_hundredths():
    document = {
        "params": {"train_samples": 0},
        "variants": {
            "batched": _entry(2.0, 1.0, 7.0, 0.50),  # first with an accuracy, but not the anchor
            "naive": _entry(90.0, 10.0, 300.0, None),
            "preprocessed": _entry(20.0, 10.0, 21.0, 0.60),
        },
    }
    v = _finished(document, bench_settings(accuracy_tolerance=0.05))
    assert v["batched"]["accuracy_ok"] is False and v["preprocessed"]["accuracy_ok"] is True
    assert v["batched"]["speedup"] == 33.33 and v["preprocessed"]["speedup"] == 3.33
    assert v["batched"]["wall_speedup"] == 42.86 and v["preprocessed"]["wall_speedup"] == 14.29
    assert v["batched"]["samples_per_s"] is None  # no sample count: no throughput
    sampled_only = {"params": {"train_samples": 10}, "variants": {"naive": _entry(1.0, 1.0, 2.0, None)}}
    # nothing measured accuracy: no check, no error
    assert _finished(sampled_only, bench_settings())["naive"]["accuracy_ok"] is None


def test_the_seeds_parquet_is_checked_before_the_seeds_datasets_read_it(tmp_path):
    """A flipped byte (polars writes no page checksums) or columns in another order (the
    seed's Datasets take pixels by position) are refused, naming the file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.bench.datapaths import checked_parquet
    from pipeline.core.dataset import COLUMNS
    from pipeline.core.errors import DataError
    from pipeline.core.parquet import write_checksums

    images, labels = make_split(20, 3)
    flat = images.reshape(20, -1)
    columns = [pa.array(labels)] + [pa.array(flat[:, i].copy()) for i in range(784)]
    for split in ("train", "test"):
        (tmp_path / "wide").mkdir(exist_ok=True)
        pq.write_table(pa.Table.from_arrays(columns, names=COLUMNS), tmp_path / "wide" / f"{split}.parquet")
    write_checksums(tmp_path, layouts=("wide",))
    assert checked_parquet(tmp_path / "wide", "train") == tmp_path / "wide" / "train.parquet"
    reversed_names = ["label"] + COLUMNS[:0:-1]
    pq.write_table(pa.Table.from_arrays(columns, names=reversed_names), tmp_path / "wide" / "test.parquet")
    write_checksums(tmp_path, layouts=("wide",))
    with pytest.raises(
        DataError,
        match=r"test.parquet: columns are not label, pixel1..pixel784 in order "
        r"\(column 2 is 'pixel784'\)",
    ):
        checked_parquet(tmp_path / "wide", "test")
    data = bytearray((tmp_path / "wide" / "train.parquet").read_bytes())
    data[len(data) // 2] ^= 1
    (tmp_path / "wide" / "train.parquet").write_bytes(bytes(data))
    with pytest.raises(DataError, match="train.parquet: checksum mismatch"):
        checked_parquet(tmp_path / "wide", "train")


def test_the_bench_refuses_a_parquet_folder_of_another_data_set_or_split(prepared, tmp_path):
    """The Parquet rungs train on the wide Parquet, the others on the shards: a Parquet folder
    of another data set (or with its splits swapped) is refused before any rung runs, instead
    of being trained on and recorded under the shards' data set."""
    import shutil

    from pipeline.core.errors import DataError
    from pipeline.core.parquet import write_checksums

    root, _ = prepared
    (train_x, train_y), (test_x, test_y) = make_split(600, 7), make_split(200, 8)  # another data set
    write_csv(train_x, train_y, tmp_path / "csv" / "train.csv")
    write_csv(test_x, test_y, tmp_path / "csv" / "test.csv")
    convert_dataset(tmp_path / "csv", tmp_path / "other", tmp_path / "fig.json", "snappy")
    swapped = tmp_path / "swapped"
    (swapped / "wide").mkdir(parents=True)
    for split, other in (("train", "test"), ("test", "train")):
        shutil.copy(root / "pq" / "wide" / f"{other}.parquet", swapped / "wide" / f"{split}.parquet")
    write_checksums(swapped, layouts=("wide",))
    settings = bench_settings(epochs=1, variants=["naive"], sample=[], floor=False)
    for parquet, split in ((tmp_path / "other" / "wide", "train"), (swapped / "wide", "train")):
        with pytest.raises(DataError, match=rf"{split}.parquet: its labels are not those of tiny's {split} split"):
            run_bench("tiny", parquet, root / "shards", "cpu", settings)
    # the shard rungs alone read no Parquet: nothing to check
    run_bench(
        "tiny",
        swapped / "wide",
        root / "shards",
        "cpu",
        bench_settings(epochs=1, variants=["batched"], sample=[], floor=False),
    )


def test_a_sampled_epoch_asks_its_loader_for_no_more_batches_than_it_trains_on():
    asked = []

    def batches():
        for index in range(10):
            asked.append(index)
            yield index

    assert list(_limited(batches(), 3)) == [0, 1, 2] and asked == [0, 1, 2]
    assert list(_limited(range(4), None)) == [0, 1, 2, 3]


class _Counted(torch.utils.data.Dataset):
    """Counts the samples its workers load, across processes."""

    def __init__(self, n: int):
        import multiprocessing

        self.n, self.loaded = n, multiprocessing.get_context("fork").Value("i", 0)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        with self.loaded.get_lock():
            self.loaded.value += 1
        return index


def test_a_sampled_epoch_leaves_persistent_workers_nothing_to_drain():
    """Persistent workers prefetch ahead; a sampled epoch cut short would leave them batches
    the next epoch first waits for. Its sampler ends with the epoch instead, its first epoch
    the first samples of the order a whole first epoch takes."""
    dataset = _Counted(100)
    loader = _loader(
        dataset, 4, True, 7, samples=8, num_workers=1, persistent_workers=True, multiprocessing_context="fork"
    )
    epochs = [torch.cat(list(loader)).tolist() for _ in range(2)]
    assert len(loader) == 2 and dataset.loaded.value == 16  # two epochs of 8: nothing loaded ahead
    whole = _loader(range(100), 4, True, 7, num_workers=1, persistent_workers=True, multiprocessing_context="fork")
    assert epochs[0] == torch.cat(list(whole)).tolist()[:8] and epochs[1] != epochs[0]  # reshuffled per epoch
    assert _loader(range(100), 4, False, 7, samples=8).sampler == range(8)  # test: the first samples, in order


def test_sampled_epochs_take_the_same_samples_whatever_the_batch():
    assert sampled_steps(20 * 512, 512, 118) == 20 and sampled_steps(20 * 512, 16, 3750) == 640
    assert sampled_steps(20 * 512, 512, 10) == 10 and sampled_steps(None, 512, 118) is None


def test_a_sampled_epoch_tests_the_same_share_of_the_test_split():
    from pipeline.bench.datapaths import sampled_test_steps

    assert sampled_test_steps(None, 118, 20) is None  # whole epochs: the whole test split
    assert sampled_test_steps(20, 118, 20) == 4  # 20/118 of train -> ceil(20 * 20/118) of 20 test steps
    assert sampled_test_steps(1, 3750, 625) == 1  # at least one step
    assert sampled_test_steps(118, 118, 20) == 20  # never more than the split


def test_quick_mode_sets_fewer_epochs_and_steps_and_says_so():
    """`bench.quick`: QUICK's settings in place of the block's, whatever the block says, and
    the flag itself carried to the metrics (`params.quick`)."""
    from pipeline.bench.settings import QUICK

    full, quick = bench_settings(), bench_settings(quick=True)
    assert not full.quick and quick.quick
    assert {key: getattr(quick, key) for key in QUICK} == QUICK
    assert quick.epochs < full.epochs and quick.sample_steps < full.sample_steps
    assert (quick.variants, quick.batch_size, quick.seed) == (full.variants, full.batch_size, full.seed)


def test_time_to_accuracy_counts_setup_and_every_epoch_until_the_target():
    """Setup, then each epoch's train and test pass, until the first test pass at or above
    the target; None when no timed epoch reached it. The warm figure leaves the warm-up and
    the capture out (as public records time a run)."""
    from pipeline.bench.figures import time_to_accuracy

    timing = Timing(
        train_s=[2.0, 1.0, 1.0], test_s=[0.5, 0.5, 0.5], accuracies=[0.95, 0.981, 0.99], setup_s=3.0, warmup_s=1.5
    )
    assert time_to_accuracy(timing, 0.98) == TimeToAccuracy(target=0.98, seconds=7.0, warm_seconds=5.5, epoch=2)
    assert time_to_accuracy(timing, 0.9) == TimeToAccuracy(target=0.9, seconds=5.5, warm_seconds=4.0, epoch=1)
    assert time_to_accuracy(timing, 0.995) == TimeToAccuracy(target=0.995)
    # a graphed rung: its capture is set up too, and left out of the warm figure with the warm-up
    captured = dataclasses.replace(timing, capture_s=1.0)
    assert time_to_accuracy(captured, 0.98).warm_seconds == 4.5 and time_to_accuracy(captured, 0.98).seconds == 7.0
    settings = bench_settings(target_accuracy={"tiny": [0.99, 0.98]})
    assert settings.targets("tiny") == (0.98, 0.99) and bench_settings(target_accuracy={"tiny": 0.9}).targets(
        "tiny"
    ) == (0.9,)
    summary = summarise(timing, 100, 20, settings, settings.targets("tiny"))
    assert [t.epoch for t in summary.time_to_accuracy] == [2, 3] and summary.accuracy_by_epoch == [
        0.95,
        0.981,
        0.99,
    ]
    sampled = dataclasses.replace(timing, sampled_steps=5)
    assert summarise(sampled, 100, 20, settings, (0.98,)).time_to_accuracy is None  # no accuracy measured


def test_the_first_rung_to_reach_the_target_is_timed_again_from_fresh_seeds():
    """The rung with the least time to accuracy is rerun from seed + 1, ..., the ladder's own
    run (which chose it) left out; a seed that never reaches the target counts as slower than
    every other, so it sets no figure but the count, the max and, past half, the median."""
    from pipeline.bench.ladder import over_seeds

    def entry(seconds, epoch):
        return Variant(
            train_s=1.0, test_s=0.1, time_to_accuracy=[TimeToAccuracy(target=0.98, seconds=seconds, epoch=epoch)]
        )

    results = {
        "naive": Variant(train_s=1.0, test_s=0.1),
        "device": entry(9.0, 2),
        "compiled": entry(7.0, 2),
        "batched": entry(None, None),
        "tuned": entry(1.0, 1),
    }  # another recipe: not the ladder's to pick
    reach = {
        1: Timing(setup_s=1.0, train_s=[2.0], test_s=[0.5], accuracies=[0.99]),  # 3.5 s
        2: Timing(setup_s=1.0, train_s=[2.0, 2.0], test_s=[0.5, 0.5], accuracies=[0.97, 0.985]),  # 6.0 s
        None: Timing(setup_s=1.0, train_s=[2.0] * 3, test_s=[0.5] * 3, accuracies=[0.9, 0.95, 0.97]),
    }
    asked = []

    def run(order):
        return lambda rung, seed: asked.append((rung, seed)) or reach[order[seed - 43]]

    out = over_seeds(results, bench_settings(seed=42, accuracy_seeds=3), 0.98, run([2, None, 1]))
    assert asked == [("compiled", 43), ("compiled", 44), ("compiled", 45)]
    assert out == Seeds(
        variant="compiled",
        target=0.98,
        seeds=[43, 44, 45],
        seconds=[6.0, None, 3.5],
        epochs=[2, None, 1],
        reached=2,
        min=3.5,
        median=6.0,
        max=None,
    )
    four = over_seeds(results, bench_settings(seed=42, accuracy_seeds=4), 0.98, run([2, 1, 1, 2]))
    assert four.median == 4.75 and four.max == 6.0  # an even count: the middle two's mean
    most_missed = over_seeds(results, bench_settings(seed=42, accuracy_seeds=3), 0.98, run([None, None, 1]))
    assert most_missed.median is None and most_missed.min == 3.5 and most_missed.reached == 1
    assert (
        over_seeds(
            {"naive": Variant(train_s=1.0, test_s=0.1)}, bench_settings(accuracy_seeds=3), 0.98, lambda *a: 1 / 0
        )
        is None
    )


@pytest.mark.slow
def test_a_time_to_accuracy_run_stops_at_its_first_test_pass_at_the_target():
    data, config = resident(), TrainConfig(batch_size=32)
    stopped = train_static(data, CPU, config, Execution(), epochs=3, until=0.0)
    assert len(stopped.train_s) == len(stopped.accuracies) == 1
    assert len(train_static(data, CPU, config, Execution(), epochs=2, until=1.01).train_s) == 2


def test_a_target_accuracy_outside_0_1_is_refused():
    with pytest.raises(ParamsError, match=r"target accuracies are 1 to 4 fractions in \(0, 1\]"):
        bench_settings(target_accuracy={"mnist": 98})
    with pytest.raises(ParamsError, match=r"target accuracies are 1 to 4 fractions"):
        bench_settings(target_accuracy={"mnist": [0.9, 1.5]})


def test_the_floor_takes_an_epoch_after_each_fully_run_variant():
    settings = bench_settings(variants=["naive", "preprocessed", "workers", "device"], sample=["naive", "workers"])
    assert [floor_after(settings, done) for done in range(4)] == [False, True, False, True]
    only_sampled = bench_settings(variants=["naive", "workers"], sample=["naive", "workers"])
    assert [floor_after(only_sampled, done) for done in range(2)] == [False, True]  # the floor still has one


def test_the_budget_beside_the_timed_epochs_step():
    """`with_epoch_step` rounds the epochs' seconds per step to the microsecond and the
    ratio to 3 places; an epoch step of 0 s (nothing timed) gives no ratio, not a division."""
    budget = _parts(step_s=0.0123456)
    assert with_epoch_step(budget, 0.01234567) == BudgetDoc(**budget, epoch_step_s=0.012346, vs_epoch=1.0)
    assert with_epoch_step(budget, 0.00617283).vs_epoch == 2.0
    assert with_epoch_step(budget, 0.0093).vs_epoch == 1.327  # 1.32748...
    assert with_epoch_step(budget, 0.0) == BudgetDoc(**budget, epoch_step_s=0.0, vs_epoch=None)


def test_the_timed_step_is_the_steady_epochs_median_over_the_steps_taken():
    """Seconds per step: the median of the epochs after the first, over the steps per epoch
    (the sampled count when sampled), a one-step epoch divided by 1."""
    assert steady_step(Timing(train_s=[9.0, 2.0, 4.0, 3.0]), 10) == 0.3
    assert steady_step(Timing(train_s=[9.0, 2.0, 4.0], sampled_steps=4), 10) == 0.75
    assert steady_step(Timing(train_s=[5.0]), 1) == 5.0
    assert steady_step(Timing(train_s=[5.0]), 0) == 5.0  # no step counted: not a division by zero


def test_the_tuned_recipe_sets_each_steps_rate_from_the_one_cycle_schedule():
    """Warm-up from max_lr / div_factor to max_lr over pct_start of the run's steps, then down
    to far below it by the last step, across epochs: the rate each step trains with."""
    from pipeline.bench.runners import OneCycle, StaticSteps

    data = resident()
    schedule = OneCycle(max_lr=0.02, pct_start=0.25)
    config = TrainConfig(batch_size=32, lr=0.02, betas=(0.9, 0.99), schedule=schedule)
    run = StaticSteps(data, CPU, config, Execution(), epochs=2)
    seen = []
    for epoch in range(2):
        run.before_epoch(epoch)
        for step in range(run.train_steps):
            run.train_step(step)
            seen.append(run.optimizer.param_groups[0]["lr"])
    total = 2 * run.train_steps
    assert seen == pytest.approx(schedule.rates(total))
    assert seen[0] == pytest.approx(0.02 / 25) and max(seen) == pytest.approx(0.02, rel=1e-3)
    assert seen.index(max(seen)) == pytest.approx(0.25 * total, abs=1)
    assert seen[-1] < 0.02 / 1000 and run.optimizer.param_groups[0]["betas"] == (0.9, 0.99)


def test_the_tuned_recipes_label_smoothing_is_the_train_losss():
    """With smoothing eps over 10 classes the loss cannot fall below the smoothed target's
    entropy (cross-entropy = entropy + KL >= entropy), however well the model fits; without
    it, the same run on learnable data falls far below that floor. The recipe hands it on."""
    from pipeline.bench.recipe import recipe_config
    from pipeline.bench.runners import OneCycle
    from pipeline.bench.settings import Recipe

    eps = 0.1
    target = [1 - eps + eps / 10] + [eps / 10] * 9
    floor = -sum(p * math.log(p) for p in target)
    data = resident()
    losses = {}
    for smoothing in (0.0, eps):
        config = TrainConfig(
            batch_size=25, lr=0.01, betas=(0.9, 0.99), schedule=OneCycle(max_lr=0.01), label_smoothing=smoothing
        )
        losses[smoothing] = train_static(data, CPU, config, Execution(), epochs=6).loss
    assert losses[0.0] < floor / 10 and floor - 1e-4 <= losses[eps] < floor + 0.2
    recipe = Recipe(
        epochs=1, batch_size=64, max_lr=0.01, pct_start=0.25, betas=(0.9, 0.99), seeds=2, label_smoothing=eps
    )
    assert recipe_config(recipe, seed=7).label_smoothing == eps


def test_the_tuned_recipe_is_never_the_accuracy_anchor_nor_held_to_it():
    """With no `preprocessed`, the first fully run rung of the write-up's recipe anchors the
    accuracy check; `tuned`, listed first here, neither anchors it nor is checked."""

    def entry(accuracy):
        return {
            "train_s": 1.0,
            "test_s": 0.1,
            "wall_s": 5.0,
            "accuracy": accuracy,
            "spread": {"min": 1.0, "median": 1.0, "max": 1.0},
        }

    doc = {
        "params": {"train_samples": 100},
        "env": {"device_type": "cpu"},
        "variants": {"tuned": entry(0.995), "device": entry(0.97), "compiled": entry(0.972)},
    }
    v = _finished(doc, bench_settings(accuracy_tolerance=0.01))
    assert v["device"]["accuracy_ok"] and v["compiled"]["accuracy_ok"]
    assert v["tuned"]["accuracy_ok"] is None


def test_a_long_cpu_model_name_still_fits_a_folder_name_with_its_cores_and_tier():
    """A model string of 100 characters on a 1,024-core AVX-512 BF16 host: the name keeps its
    cores and tier and stays a valid 64-character slug (what every reader of a name checks)."""
    import re

    from pipeline.budget.machine import cpu_name
    from pipeline.core.errors import SLUG

    name = cpu_name("Intel(R) Xeon(R) Platinum " + "Extraordinarily Long Model Name " * 3, 1024, "avx512bf16")
    assert re.fullmatch(SLUG, name) and len(name) <= 64
    assert name.endswith("-1024c-avx512bf16") and name.startswith("intel-xeon-platinum-extraordinarily")
    assert cpu_name("AMD EPYC", 2) == "amd-epyc-2c"


def test_settings_built_without_pydantic_are_the_validated_ones_and_keep_their_rules():
    """The standalone bench builds the block where pydantic is missing: the same object as
    the validated one, and the rules between fields (in `__post_init__`) hold there too."""
    from pipeline.bench.settings import BenchSettings, settings_from_params
    from pipeline.core.params import load_params

    block = load_params(PARAMS)["bench"]
    assert BenchSettings.built(block).for_run() == settings_from_params(block)
    with pytest.raises(ValueError, match="cannot be sampled"):
        BenchSettings.built({**block, "sample": ["graphed"]})
    with pytest.raises(ValueError, match="needs its recipe"):
        BenchSettings.built({**block, "variants": ["tuned"], "tuned": None})


def test_the_standalone_wide_parquet_is_written_in_the_codec_and_level_asked(tmp_path):
    """`zstd-3` is zstd at level 3 (parsed as params.yaml spells it), not a codec name
    pyarrow would refuse or read otherwise; the columns are the write-up's."""
    import numpy as np
    import pyarrow.parquet as pq

    from pipeline.core.dataset import COLUMNS
    from pipeline.standalone import write_wide_parquet

    images = np.arange(4 * 28 * 28, dtype=np.uint8).reshape(4, 28, 28)
    labels = np.array([0, 1, 2, 9], dtype=np.uint8)
    write_wide_parquet(images, labels, tmp_path / "train.parquet", "zstd-3")
    meta = pq.ParquetFile(tmp_path / "train.parquet").metadata
    column = meta.row_group(0).column(1)
    assert column.compression == "ZSTD" and meta.num_rows == 4
    table = pq.read_table(tmp_path / "train.parquet")
    assert table.column_names == list(COLUMNS) and table.column("label").to_pylist() == [0, 1, 2, 9]


def test_a_bench_document_is_built_and_written_where_pydantic_is_missing(tmp_path):
    """A machine with torch alone (the standalone bench) builds the same typed document and
    writes it unchecked, saying so; read back where pydantic is installed, it is that document."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "sys.modules['pydantic'] = sys.modules['annotated_types'] = None  # not installed\n"
        "from pathlib import Path\n"
        "from pipeline.bench.document import BenchDoc, RunParams, Variant\n"
        "from pipeline.bench.stage import write_bench\n"
        "doc = BenchDoc(dataset='d', params=RunParams(epochs=1, batch_size=8),"
        " variants={'naive': Variant(train_s=1.0, test_s=0.5)})\n"
        "write_bench(doc, Path(sys.argv[1]))\n"
    )
    out = tmp_path / "d.json"
    done = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"{out}: written unchecked (pydantic is not installed here)" in done.stderr
    read = validate(out, json.loads(out.read_text()), BenchDoc)
    assert read.variants["naive"].train_s == 1.0 and read.params.batch_size == 8 and read.floor.train_s is None
