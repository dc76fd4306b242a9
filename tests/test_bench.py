import math

import numpy as np
import pytest
import torch

from pipeline.bench import (VARIANTS, BenchSettings, DataPath, NaiveDataset, PreprocessedDataset, data_path,
                            run_bench, run_variant)
from pipeline.convert import convert_dataset
from pipeline.csvdata import write_csv
from pipeline.model import SimpleCNN, parameter_count
from pipeline.shards import shard_dataset
from conftest import make_split


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """Parquet (wide) and shards of an easy synthetic task: 600 train, 200 test images."""
    root = tmp_path_factory.mktemp("bench")
    (train_x, train_y), (test_x, test_y) = make_split(600, 0), make_split(200, 1)
    write_csv(train_x, train_y, root / "csv" / "train.csv")
    write_csv(test_x, test_y, root / "csv" / "test.csv")
    convert_dataset(root / "csv", root / "pq", root / "fig.json", "snappy")
    shard_dataset(root / "pq" / "compact", root / "shards", "tiny", 256, "none", 3)
    return root, (train_x, train_y)


def test_model_is_the_seeds():
    assert parameter_count(SimpleCNN()) == 206_922
    assert SimpleCNN()(torch.zeros(2, 1, 28, 28)).shape == (2, 10)


def test_dataset_v1_items_match_the_seed(prepared):
    root, (images, labels) = prepared
    v1 = NaiveDataset(root / "pq" / "wide" / "train.parquet")
    item = v1[7]
    assert set(item) == {"image", "label"}
    assert item["image"].shape == (1, 28, 28) and item["image"].dtype == torch.float32
    assert item["label"].dtype == torch.long and item["label"].item() == labels[7]
    torch.testing.assert_close(item["image"][0], torch.from_numpy(images[7]).float() / 255)
    assert 0.0 <= item["image"].min() and item["image"].max() <= 1.0
    v2 = PreprocessedDataset(root / "pq" / "wide" / "train.parquet")
    for index in (0, 7, 599):
        torch.testing.assert_close(v2[index]["image"], v1[index]["image"])
        assert v2[index]["label"] == v1[index]["label"]


def test_every_variant_runs_and_schema(prepared):
    root, _ = prepared
    settings = BenchSettings(epochs=1, batch_size=64, num_workers=1, sample=("naive_bs16", "naive"),
                             sample_steps=3, sample_epochs=2)
    doc = run_bench("tiny", root / "pq" / "wide", root / "shards", "cpu", settings)
    assert list(doc["variants"]) == list(VARIANTS)
    assert doc["params"]["train_samples"] == 600 and doc["params"]["parameters"] == 206_922
    assert {"device", "torch", "cpu_count", "threads"} <= set(doc["env"])
    for name, entry in doc["variants"].items():
        assert entry["extrapolated"] == (name in ("naive_bs16", "naive"))
        assert entry["train_s"] > 0 and math.isfinite(entry["total_s"]) and entry["speedup"] > 0
        assert (entry["accuracy"] is None) == entry["extrapolated"]
    assert doc["variants"]["naive"]["speedup"] == 1.0
    assert doc["floor"]["train_s"] > 0 and doc["floor"]["compiled_train_s"] > 0


def test_sampled_timing_is_scaled_to_the_full_epoch(prepared):
    root, _ = prepared
    settings = BenchSettings(epochs=1, batch_size=16, variants=("naive_bs16",), sample=("naive_bs16",),
                             sample_steps=4, sample_epochs=2, floor=False)
    doc = run_bench("tiny", root / "pq" / "wide", root / "shards", "cpu", settings)
    entry = doc["variants"]["naive_bs16"]
    assert entry["first_epoch_train_s"] > 0 and entry["extrapolated"] and entry["accuracy"] is None


def test_summarise_scales_sampled_steps_to_whole_epochs():
    from types import SimpleNamespace

    from pipeline.bench import Timing, summarise

    settings = BenchSettings(epochs=5, sample_steps=4)
    path = SimpleNamespace(train_steps=38, test_steps=3)
    timing = Timing(train_s=[3.0, 1.0, 2.0], test_s=[0.5, 0.3, 0.4], accuracy=0.5)
    entry = summarise(timing, path, settings, sampled=True, compile_s=0.0)
    # median 2.0 s over 4 steps -> 38 steps: x 9.5; the test split has only 3 steps: x 1.
    assert entry["train_s"] == pytest.approx(19.0) and entry["test_s"] == pytest.approx(0.4)
    assert entry["first_epoch_train_s"] == pytest.approx(28.5)
    assert entry["total_s"] == pytest.approx((19.0 + 0.4) * 5)
    assert entry["accuracy"] is None and entry["extrapolated"]
    whole = summarise(timing, path, settings, sampled=False, compile_s=0.0)
    assert whole["train_s"] == pytest.approx(2.0) and whole["accuracy"] == 0.5 and not whole["extrapolated"]


@pytest.mark.parametrize("variant", ["preprocessed", "batched", "device", "compiled"])
def test_accuracy_rises_on_an_easy_task(prepared, variant):
    root, _ = prepared
    settings = BenchSettings(batch_size=32)
    path = data_path(variant, root / "pq" / "wide", root / "shards", torch.device("cpu"), settings, {})
    options = {"channels_last": True, "autocast": True} if variant == "compiled" else {}
    timing, _ = run_variant(path, torch.device("cpu"), settings, steps=None, epochs=3, **options)
    assert np.isfinite(timing.loss)
    assert timing.accuracy > 0.9  # ten well-separated classes: chance is 0.1


def test_same_batches_same_training(prepared):
    """batched (shards) and preprocessed (the seed's v2) see identical batches in identical order."""
    root, _ = prepared
    settings = BenchSettings(batch_size=64)
    results = []
    for variant in ("preprocessed", "batched"):
        path = data_path(variant, root / "pq" / "wide", root / "shards", torch.device("cpu"),
                         settings.__class__(batch_size=64, num_workers=1), {})
        timing, _ = run_variant(path, torch.device("cpu"), settings, steps=None, epochs=1)
        results.append((timing.accuracy, timing.loss))
    assert results[0][0] == results[1][0]
    assert results[0][1] == pytest.approx(results[1][1], rel=1e-5)


def test_compiled_path_warms_up_outside_timed_epochs():
    x, y = torch.rand(8, 1, 28, 28), torch.randint(0, 10, (8,))
    path = DataPath(lambda: [(x, y)] * 3, lambda: [(x, y)], 3, 1)
    timing, compile_s = run_variant(path, torch.device("cpu"), BenchSettings(), steps=None, epochs=1,
                                    compile_mode="default")
    eager, zero = run_variant(path, torch.device("cpu"), BenchSettings(), steps=None, epochs=1)
    assert compile_s > 0 and zero == 0.0
    assert timing.loss == pytest.approx(eager.loss, rel=1e-3)  # warm-up left no trace in training


def test_compute_floor_is_the_fastest_epoch(monkeypatch):
    import pipeline.bench as bench

    seen = {}

    def fake_run_variant(path, device, settings, *, steps, epochs, progress, **options):
        seen.update(steps=path.train_steps, epochs=epochs, batches=len(list(path.train())), options=options)
        return bench.Timing(train_s=[3.0, 1.0, 2.0]), 0.0

    monkeypatch.setattr(bench, "run_variant", fake_run_variant)
    floor = bench.compute_floor(torch.device("cpu"), BenchSettings(batch_size=8), 5, autocast=True)
    assert floor == 1.0  # a neighbour's burst only slows an epoch: the minimum is the floor
    assert seen == {"steps": 5, "epochs": 3, "batches": 5, "options": {"autocast": True}}
