"""DDP under torchrun on the CPU (gloo): two ranks over shards streamed per rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import torch

from pipeline.shards.ranks import RankShards, pieces
from pipeline.shards import write_shards
from conftest import make_split, write_unchecked_split
from pipeline.shards import ShardError

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("counts, world", [([50] * 11 + [30], 2), ([50] * 11 + [31], 3), ([32768, 27232], 2),
                                           ([7], 4), ([3, 1, 4, 1, 5, 9, 2, 6], 5),
                                           ([4, 4], 2), ([10, 10, 10, 10], 2)])  # rank ends on shard ends
def test_pieces_give_every_rank_an_equal_disjoint_range(counts, world):
    total = sum(counts)
    ranks = pieces(counts, world, seed=1, epoch=0)
    rows = [[(shard, row) for shard, a, b in rank for row in range(a, b)] for rank in ranks]
    assert [len(r) for r in rows] == [total // world] * world                # equal counts
    every = [item for r in rows for item in r]
    assert len(set(every)) == len(every) == total - total % world           # disjoint, all but < world
    for rank in ranks:                                                      # a shard's rows, each once
        assert all(0 <= a < b <= counts[shard] for shard, a, b in rank)
    assert pieces(counts, world, seed=1, epoch=0) == ranks                  # seeded
    if len(counts) > 4:  # (few shards have few orders: two seeds may give the same one)
        assert pieces(counts, world, seed=1, epoch=1) != ranks              # a new order each epoch
        assert pieces(counts, world, seed=2, epoch=0) != ranks


def test_few_large_shards_drop_nothing():
    """MNIST's two shards of the default size, two ranks: 30,000 samples each, none dropped,
    where dealing whole shards would drop 5,536 (the reason for cutting ranges)."""
    ranks = pieces([32768, 27232], 2, seed=42, epoch=0)
    assert [sum(b - a for _, a, b in rank) for rank in ranks] == [30000, 30000]


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_rank_epochs_are_disjoint_and_equal(tmp_path, compression):
    images, labels = make_split(581, 0)
    write_shards(images, labels, tmp_path / "train", dataset="t", split="train", samples_per_shard=50,
                 compression=compression)
    parts = [RankShards(tmp_path / "train", rank, 2, seed=3).epoch(0) for rank in range(2)]
    seen = [part.seen() for part in parts]
    assert len(seen[0]) == len(seen[1]) == 290
    assert not set(seen[0].tolist()) & set(seen[1].tolist())
    assert parts[0].dropped == parts[1].dropped == 1 and len(set(seen[0].tolist()) | set(seen[1].tolist())) == 580
    for part in parts:  # each sample arrives with its own label and pixels, and is shuffled
        assert (part.labels.numpy() == labels[part.ids.numpy()]).all()
        assert (part.images.numpy() == images[part.ids.numpy()]).all()
        assert sorted(part.order.tolist()) == list(range(290)) and part.order.tolist() != list(range(290))
    again = RankShards(tmp_path / "train", 0, 2, seed=3)
    assert torch.equal(again.epoch(0).seen(), seen[0]) and not torch.equal(again.epoch(1).seen(), seen[0])
    assert not torch.equal(RankShards(tmp_path / "train", 0, 2, seed=4).epoch(0).seen(), seen[0])


def test_rank_shards_check_their_arguments_and_labels(tmp_path):
    images, labels = make_split(40, 2)
    write_shards(images, labels, tmp_path / "ok", dataset="t", split="train", samples_per_shard=10)
    with pytest.raises(ValueError, match="rank 2 is outside 0..1"):
        RankShards(tmp_path / "ok", 2, 2, seed=0)
    with pytest.raises(ValueError, match="verify must be one of"):
        RankShards(tmp_path / "ok", 0, 2, seed=0, verify="md5")
    with pytest.raises(ValueError, match="40 samples cannot feed 41 ranks"):
        RankShards(tmp_path / "ok", 0, 41, seed=0)
    assert len(RankShards(tmp_path / "ok", 39, 40, seed=0).epoch(0).seen()) == 1  # one sample each: enough
    labels[3] = 10
    write_unchecked_split(tmp_path / "bad", images, labels)
    with pytest.raises(ShardError, match="bad: field 'labels': value 10 at sample 3 is outside 0..9"):
        RankShards(tmp_path / "bad", 0, 1, seed=0).epoch(0)


def test_rank_shards_verify_what_they_read(tmp_path):
    images, labels = make_split(40, 2)
    write_shards(images, labels, tmp_path / "s", dataset="t", split="train", samples_per_shard=10)
    shard = tmp_path / "s" / "shard-00001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1  # one label bit, still 0..9 or not: the checksum must catch it
    shard.write_bytes(bytes(data))
    with pytest.raises(ShardError, match="shard-00001.safetensors: checksum mismatch"):
        for epoch in range(4):  # whichever rank and range reads shard 1
            for rank in range(2):
                RankShards(tmp_path / "s", rank, 2, seed=0).epoch(epoch)


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


@pytest.mark.slow
def test_two_ranks_step_together_and_end_identical(ddp_runs):
    doc, ranks = ddp_runs[2]
    assert doc["world_size"] == 2 and doc["backend"] == "gloo" and doc["local_batch"] == 30
    assert ranks[0]["steps"] == ranks[1]["steps"] and ranks[0]["steps"][0] > 0
    assert ranks[0]["params_sum"] == ranks[1]["params_sum"] and ranks[0]["params_head"] == ranks[1]["params_head"]


@pytest.mark.slow
def test_ranks_saw_disjoint_samples_covering_the_split(ddp_runs):
    doc, ranks = ddp_runs[2]
    a, b = set(ranks[0]["ids"]), set(ranks[1]["ids"])
    assert not a & b
    # 600 samples, two ranks: 300 each, 10 steps of 30: all covered, none dropped
    assert doc["epochs"][0]["dropped"] == 0 and len(a | b) == 600 and len(ranks[0]["ids"]) == 300


@pytest.mark.slow
def test_loss_curve_matches_one_process(ddp_runs):
    """Same global batch, same learning rate: the 2-rank curve follows the 1-process one
    (the sample order differs, so within 25% per epoch, and both learn the easy task)."""
    one, two = ddp_runs[1][0]["epochs"], ddp_runs[2][0]["epochs"]
    for a, b in zip(one, two):
        assert abs(a["loss"] - b["loss"]) <= 0.25 * max(a["loss"], b["loss"]) + 0.02, (one, two)
    assert one[-1]["accuracy"] > 0.9 and two[-1]["accuracy"] > 0.9
