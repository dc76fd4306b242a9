"""DDP under torchrun on the CPU (gloo): two ranks, each reading its run of the epoch's order
(`pipeline.shards.order.ShardSampler`, shuffle "shards")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import PARAMS, make_split, write_shards, write_unchecked_split

from pipeline.shards import ShardDataset, ShardError, ShardSampler

ROOT = Path(__file__).resolve().parents[1]


def owners(ids, counts) -> np.ndarray:
    """The shard each sample id lies in."""
    return np.searchsorted(np.cumsum(counts), np.asarray(ids), side="right")


@pytest.mark.parametrize(
    "counts, world",
    [
        ([50] * 11 + [30], 2),
        ([50] * 11 + [31], 3),
        ([32768, 27232], 2),
        ([7], 4),
        ([3, 1, 4, 1, 5, 9, 2, 6], 5),
        ([4, 4], 2),
        ([10, 10, 10, 10], 2),
    ],
)  # rank ends on shard ends
def test_ranks_take_near_equal_disjoint_runs_of_one_order(counts, world):
    total, batch = sum(counts), 7

    def sampler(rank=0, world_size=world, seed=1):
        return ShardSampler(
            total, batch, shuffle="shards", seed=seed, rank=rank, world_size=world_size, shard_counts=counts
        )

    ranks = [sampler(rank).rank_order(0) for rank in range(world)]
    base, extra = divmod(total, world)
    assert [len(r) for r in ranks] == [base + (r < extra) for r in range(world)]  # lengths differ by at most one
    assert len({len(sampler(rank)) for rank in range(world)}) == 1  # every rank: the same steps
    every = np.concatenate(ranks)
    assert sorted(every.tolist()) == list(range(total))  # each sample once, none dropped
    order = sampler().order(0)
    assert every.tolist() == order.tolist()  # contiguous runs of the epoch's order ...
    assert sampler(world_size=1).rank_order(0).tolist() == order.tolist()  # ... which does not depend on the ranks
    # shuffle "shards": the order visits whole shards one after another, each shard's samples permuted
    shard_of = owners(order, counts)
    blocks = [shard_of[0], *shard_of[1:][np.diff(shard_of) != 0]]
    assert sorted(blocks) == list(range(len(counts)))
    for r in ranks:  # a rank's run covers a contiguous stretch of that shard sequence
        touched = list(dict.fromkeys(owners(r, counts).tolist()))
        start = blocks.index(touched[0]) if touched else 0
        assert touched == blocks[start : start + len(touched)]
    assert all(np.array_equal(sampler(rank).rank_order(0), ranks[rank]) for rank in range(world))  # seeded
    if len(counts) > 4:  # (few shards have few orders: two seeds may give the same one)
        assert not np.array_equal(sampler().order(1), order)  # a new order each epoch
        assert not np.array_equal(sampler(seed=2).order(0), order)


def test_few_large_shards_drop_nothing():
    """MNIST's two shards of the default size: 30,000 samples each on two ranks; on seven, runs
    of 8,572 and 8,571, all 60,000 taken, each rank the same number of steps."""
    counts = [32768, 27232]

    def runs(world):
        samplers = [
            ShardSampler(60000, 256, shuffle="shards", seed=42, rank=rank, world_size=world, shard_counts=counts)
            for rank in range(world)
        ]
        assert len({len(s) for s in samplers}) == 1
        return [s.rank_order(0) for s in samplers]

    assert [len(r) for r in runs(2)] == [30000, 30000]
    seven = runs(7)
    assert [len(r) for r in seven] == [8572] * 3 + [8571] * 4
    assert len(np.unique(np.concatenate(seven))) == 60000


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_rank_epochs_are_disjoint_and_cover_the_split(tmp_path, compression):
    images, labels = make_split(581, 0)
    write_shards(
        images, labels, tmp_path / "train", dataset="t", split="train", samples_per_shard=50, compression=compression
    )
    data = ShardDataset(tmp_path / "train", dataset="t", split="train")

    def epoch(rank, seed=3, number=0):
        loader = data.loader(30, shuffle="shards", seed=seed, rank=rank, world_size=2)
        loader.set_epoch(number)
        batches = []
        for x, y in loader:
            batches.append((loader.indices.clone(), x, y))
        return batches

    parts = [epoch(rank) for rank in range(2)]
    # 581 samples: runs of 291 and 290, 10 steps each (the last batches 21 and 20)
    assert [[len(ids) for ids, _, _ in part] for part in parts] == [[30] * 9 + [21], [30] * 9 + [20]]
    seen = [torch.cat([ids for ids, _, _ in part]).tolist() for part in parts]
    assert not set(seen[0]) & set(seen[1]) and sorted(seen[0] + seen[1]) == list(range(581))
    for part in parts:  # each sample arrives with its own label and pixels
        for ids, x, y in part:
            assert (y.numpy() == labels[ids.numpy()]).all() and (x.numpy() == images[ids.numpy()]).all()
    for ids in seen:  # shuffled within its shards
        assert ids != sorted(ids)
    expected = [
        ShardSampler(581, 30, shuffle="shards", seed=3, rank=rank, world_size=2, shard_counts=[50] * 11 + [31])
        .rank_order(0)
        .tolist()
        for rank in range(2)
    ]
    assert seen == expected
    again = [ids for ids, _, _ in epoch(0)]
    assert torch.cat(again).tolist() == seen[0]  # seeded
    assert torch.cat([ids for ids, _, _ in epoch(0, number=1)]).tolist() != seen[0]  # a new order each epoch
    assert torch.cat([ids for ids, _, _ in epoch(0, seed=4)]).tolist() != seen[0]


def test_rank_loaders_check_their_arguments_and_labels(tmp_path):
    images, labels = make_split(40, 2)
    write_shards(images, labels, tmp_path / "ok", dataset="t", split="train", samples_per_shard=10)
    data = ShardDataset(tmp_path / "ok")
    with pytest.raises(ValueError, match="rank 2 is outside 0..1"):
        data.loader(10, shuffle="shards", rank=2, world_size=2)
    with pytest.raises(ValueError, match="verify must be one of"):
        ShardDataset(tmp_path / "ok", verify="md5")
    with pytest.raises(ValueError, match="shuffle must be True, False or one of"):
        data.loader(10, shuffle="shard")
    # one sample per rank is enough; with more ranks than samples a rank steps on an empty batch
    forty = [data.loader(10, shuffle="shards", rank=rank, world_size=40) for rank in range(40)]
    assert [[len(y) for _, y in loader] for loader in forty] == [[1]] * 40
    many = [data.loader(10, shuffle="shards", rank=rank, world_size=41) for rank in range(41)]
    assert [[len(y) for _, y in loader] for loader in many] == [[1]] * 40 + [[0]]
    labels[3] = 10
    write_unchecked_split(tmp_path / "bad", images, labels)
    with pytest.raises(ShardError, match="bad: field 'labels': value 10 at sample 3 is outside 0..9"):
        for _ in ShardDataset(tmp_path / "bad").loader(10, shuffle="shards", world_size=1):
            pass


def test_rank_loaders_verify_what_they_read(tmp_path):
    images, labels = make_split(40, 2)
    write_shards(images, labels, tmp_path / "s", dataset="t", split="train", samples_per_shard=10)
    shard = tmp_path / "s" / "shard-00001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1  # one label bit, still 0..9 or not: the checksum must catch it
    shard.write_bytes(bytes(data))
    # 4 shards of 10, runs of 20: each rank's run is two whole shards, so one rank reads shard 1
    readers = []
    for rank in range(2):
        loader = ShardDataset(tmp_path / "s").loader(10, shuffle="shards", seed=0, rank=rank, world_size=2)
        touched = set(owners(loader.sampler.rank_order(0), [10] * 4).tolist())
        assert len(touched) == 2
        if 1 in touched:
            readers.append(rank)
            with pytest.raises(ShardError, match="shard-00001.safetensors: checksum mismatch"):
                for _ in loader:
                    pass
        else:  # the other reads its shards without complaint
            assert sum(len(y) for _, y in loader) == 20
    assert len(readers) == 1


@pytest.fixture(scope="module")
def ddp_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ddp")
    (train_x, train_y), (test_x, test_y) = make_split(600, 0), make_split(100, 1)
    write_shards(train_x, train_y, root / "shards" / "train", dataset="t", split="train", samples_per_shard=50)
    write_shards(test_x, test_y, root / "shards" / "test", dataset="t", split="test", samples_per_shard=50)
    params = yaml.safe_load((PARAMS).read_text())
    params["train"].update(epochs=3, batch_size=60)
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    docs = {}
    for world in (1, 2):
        out = root / f"w{world}" / "train.json"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node",
                str(world),
                "-m",
                "pipeline",
                "train",
                "t",
                "--shards",
                str(root / "shards"),
                "--out",
                str(out),
                "--record",
                "--params",
                str(root / "params.yaml"),
            ],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
            text=True,
            timeout=300,
        )
        docs[world] = (
            json.loads(out.read_text()),
            [json.loads((out.parent / f"train.rank{r}.json").read_text()) for r in range(world)],
        )
    return docs, params["train"]["seed"]


@pytest.mark.slow
def test_two_ranks_step_together_and_end_identical(ddp_runs):
    doc, ranks = ddp_runs[0][2]
    assert doc["world_size"] == 2 and doc["backend"] == "gloo" and doc["local_batch"] == 30
    assert ranks[0]["steps"] == ranks[1]["steps"] == [10, 10, 10]
    assert [b[0] for b in ranks[0]["batches"]] == [b[0] for b in ranks[1]["batches"]] == list(range(1, 31))
    assert ranks[0]["params_sum"] == ranks[1]["params_sum"] and ranks[0]["params_head"] == ranks[1]["params_head"]
    assert ranks[0]["params_sha256"] == ranks[1]["params_sha256"]


@pytest.mark.slow
def test_ranks_saw_disjoint_samples_covering_the_split(ddp_runs):
    docs, seed = ddp_runs
    doc, ranks = docs[2]
    a, b = set(ranks[0]["ids"]), set(ranks[1]["ids"])
    # 600 samples, two ranks: 300 each, 10 steps of 30: all covered, none dropped
    assert not a & b and len(a | b) == 600 and len(ranks[0]["ids"]) == len(ranks[1]["ids"]) == 300
    assert "dropped" not in doc["epochs"][0]
    for rank in range(2):  # each rank's run of the order the library's rule gives, every epoch
        sampler = ShardSampler(600, 30, shuffle="shards", seed=seed, rank=rank, world_size=2, shard_counts=[50] * 12)
        assert ranks[rank]["ids"] == sampler.rank_order(0).tolist()
        taken = [i for batch in ranks[rank]["batches"] for i in batch[1:]]
        assert taken == [i for e in range(3) for i in sampler.rank_order(e).tolist()]
    # the epoch's order does not depend on the world size: one process takes both runs, one after the other
    (single,) = docs[1][1]
    assert single["ids"] == ranks[0]["ids"] + ranks[1]["ids"]


@pytest.mark.slow
def test_loss_curve_matches_one_process(ddp_runs):
    """Same global batch, same learning rate: the 2-rank curve follows the 1-process one
    (the global batches differ, so within 25% per epoch, and both learn the easy task)."""
    docs, _ = ddp_runs
    one, two = docs[1][0]["epochs"], docs[2][0]["epochs"]
    for a, b in zip(one, two, strict=True):
        assert abs(a["loss"] - b["loss"]) <= 0.25 * max(a["loss"], b["loss"]) + 0.02, (one, two)
    assert one[-1]["accuracy"] > 0.9 and two[-1]["accuracy"] > 0.9
