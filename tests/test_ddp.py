"""DDP under torchrun on the CPU (gloo): two ranks over shards streamed per rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.ranks import RankShards, deal
from pipeline.shards import write_shards
from conftest import make_split

ROOT = Path(__file__).resolve().parents[1]


def test_deal_is_seeded_balanced_and_complete():
    counts = [50] * 11 + [30]
    a, b = deal(counts, 2, seed=1, epoch=0), deal(counts, 2, seed=1, epoch=0)
    assert a == b and deal(counts, 2, seed=1, epoch=1) != a  # seeded, different per epoch
    assert sorted(a[0] + a[1]) == list(range(12))            # every shard, once
    totals = [sum(counts[s] for s in rank) for rank in a]
    assert abs(totals[0] - totals[1]) <= max(counts)


def test_rank_epochs_are_disjoint_and_equal(tmp_path):
    images, labels = make_split(580, 0)
    write_shards(images, labels, tmp_path / "train", dataset="t", split="train", samples_per_shard=50)
    parts = [RankShards(tmp_path / "train", rank, 2, seed=3).epoch(0) for rank in range(2)]
    assert len(parts[0].ids) == len(parts[1].ids)
    assert not set(parts[0].ids.tolist()) & set(parts[1].ids.tolist())
    covered = len(parts[0].ids) * 2 + parts[0].dropped + parts[1].dropped
    assert covered == 580 and parts[0].dropped + parts[1].dropped <= 50
    for part in parts:  # each sample arrives with its own label and pixels
        assert (part.labels.numpy() == labels[part.ids.numpy()]).all()
        assert (part.images.numpy() == images[part.ids.numpy()]).all()


@pytest.fixture(scope="module")
def ddp_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ddp")
    (train_x, train_y), (test_x, test_y) = make_split(600, 0), make_split(100, 1)
    write_shards(train_x, train_y, root / "shards" / "train", dataset="t", split="train", samples_per_shard=50)
    write_shards(test_x, test_y, root / "shards" / "test", dataset="t", split="test", samples_per_shard=50)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["train"].update(epochs=3, batch_size=60)
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    docs = {}
    for world in (1, 2):
        out = root / f"w{world}" / "train.json"
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                        str(world), "-m", "pipeline", "train", "t", "--shards", str(root / "shards"), "--out",
                        str(out), "--record", "--params", str(root / "params.yaml")],
                       cwd=ROOT, env=env, check=True, capture_output=True, text=True, timeout=300)
        docs[world] = (json.loads(out.read_text()),
                       [json.loads((out.parent / f"train.rank{r}.json").read_text()) for r in range(world)])
    return docs


def test_two_ranks_step_together_and_end_identical(ddp_runs):
    doc, ranks = ddp_runs[2]
    assert doc["world_size"] == 2 and doc["backend"] == "gloo" and doc["local_batch"] == 30
    assert ranks[0]["steps"] == ranks[1]["steps"] and ranks[0]["steps"][0] > 0
    assert ranks[0]["params_sum"] == ranks[1]["params_sum"] and ranks[0]["params_head"] == ranks[1]["params_head"]


def test_ranks_saw_disjoint_samples_covering_the_split(ddp_runs):
    doc, ranks = ddp_runs[2]
    a, b = set(ranks[0]["ids"]), set(ranks[1]["ids"])
    assert not a & b
    # 600 samples in 12 shards of 50: dealt 6 and 6, 300 each, 10 steps of 30: all covered
    assert len(a | b) == 600 - doc["epochs"][0]["dropped"] * 2 and doc["epochs"][0]["dropped"] == 0


def test_loss_curve_matches_one_process(ddp_runs):
    """Same global batch, same learning rate: the 2-rank curve follows the 1-process one
    (the sample order differs, so within 25% per epoch, and both learn the easy task)."""
    one, two = ddp_runs[1][0]["epochs"], ddp_runs[2][0]["epochs"]
    for a, b in zip(one, two):
        assert abs(a["loss"] - b["loss"]) <= 0.25 * max(a["loss"], b["loss"]) + 0.02, (one, two)
    assert one[-1]["accuracy"] > 0.9 and two[-1]["accuracy"] > 0.9
