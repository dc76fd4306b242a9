"""Past one machine: shards read from object storage into a bounded node-local cache, two
torchrun launches as two nodes against an S3 server on 127.0.0.1 (moto), and a run killed
mid-epoch that resumes exactly where it was, with the same or another number of ranks."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import PARAMS, free_port, make_split, write_shards

from pipeline.shards import DeviceBatches, ShardDataset, ShardError, ShardSampler
from pipeline.shards.remote import RemoteShards

ROOT = Path(__file__).resolve().parents[1]
fsspec = pytest.importorskip("fsspec")


def upload(local: Path, url: str) -> None:
    """Copy a local shard folder to `url`, file by file."""
    fs, root = fsspec.core.url_to_fs(url)
    for file in sorted(local.iterdir()):
        fs.pipe_file(f"{root}/{file.name}", file.read_bytes())


@pytest.fixture
def remote_split(tmp_path):
    """A split of 230 samples in shards of 25 (the last of 5), locally and at a memory:// URL."""
    images, labels = make_split(230, 4)
    write_shards(images, labels, tmp_path / "local", dataset="t", split="train", samples_per_shard=25)
    url = f"memory://scale-{uuid.uuid4().hex}/train"
    upload(tmp_path / "local", url)
    yield tmp_path / "local", url, images, labels
    fs, root = fsspec.core.url_to_fs(url)
    fs.rm(root, recursive=True)


def cached(cache: Path) -> list[str]:
    """Every file under the cache but the per-shard lock files: the verified copies."""
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file() and not p.name.endswith(".lock"))


def shards_of(ids, counts) -> set[int]:
    """The shards the sample ids lie in."""
    return set(np.searchsorted(np.cumsum(counts), np.asarray(ids, dtype=np.int64), side="right").tolist())


def test_a_rank_fetches_only_the_shards_its_run_covers(remote_split, tmp_path):
    local, url, images, labels = remote_split
    manifest = json.loads((local / "manifest.json").read_text())
    counts = [e["count"] for e in manifest["shards"]]

    def epoch(data, rank):
        loader = data.loader(20, shuffle="shards", seed=7, rank=rank, world_size=3)
        return [(loader.indices.clone(), x, y) for x, y in loader]

    for rank in range(3):
        cache = tmp_path / f"cache{rank}"
        ours = ShardDataset(url, dataset="t", split="train", cache=cache)
        part, want = epoch(ours, rank), epoch(ShardDataset(local), rank)
        assert len(part) == len(want) == 4  # runs of 77, 77, 76: 4 batches of 20
        for (ids, x, y), (ids_want, x_want, y_want) in zip(part, want, strict=True):
            assert torch.equal(ids, ids_want) and torch.equal(x, x_want) and torch.equal(y, y_want)
            assert (y.numpy() == labels[ids.numpy()]).all() and (x.numpy() == images[ids.numpy()]).all()
        order = ShardSampler(
            230, 20, shuffle="shards", seed=7, rank=rank, world_size=3, shard_counts=counts
        ).rank_order(0)
        assert torch.cat([ids for ids, _, _ in part]).tolist() == order.tolist()
        needed = sorted(shards_of(order, counts))
        assert len(needed) < len(counts)
        remote = ours.split.remote
        assert sorted(remote.counts.shards) == sorted(manifest["shards"][s]["file"] for s in needed)
        assert remote.counts.bytes == sum(manifest["shards"][s]["bytes"] for s in needed)
        # the cache holds exactly those shards, named by content, and nothing else
        assert cached(cache) == sorted(f"objects/{manifest['shards'][s]['xxh3_128']}.safetensors" for s in needed)
        warm = ShardDataset(url, cache=cache)
        assert torch.cat([ids for ids, _, _ in epoch(warm, rank)]).tolist() == order.tolist()
        assert warm.split.remote.counts.bytes == 0 and warm.split.remote.counts.hits == len(needed)
    with pytest.raises(ShardError, match=rf"^{url}/manifest.json: manifest is for dataset 't', expected 'mnist'$"):
        ShardDataset(url, dataset="mnist", cache=tmp_path / "cache0")


def test_the_cache_stays_within_its_bound(remote_split, tmp_path):
    local, url, _, _ = remote_split
    sizes = [e["bytes"] for e in json.loads((local / "manifest.json").read_text())["shards"]]
    bound = 2 * max(sizes) + 100
    split = RemoteShards(url, tmp_path / "cache", bound)
    for shard in (0, 1, 2, 3, 0):
        folder, entry = split.local(shard)
        assert (folder / entry["file"]).stat().st_size == sizes[shard]
        assert sum((tmp_path / "cache" / p).stat().st_size for p in cached(tmp_path / "cache")) <= bound
    assert len(cached(tmp_path / "cache")) == 2
    assert split.counts.shards[-1] == "shard-00000.safetensors"  # shard 0 was evicted (least recently used)
    with pytest.raises(
        ShardError, match=r"/train/shard-00000.safetensors: [\d,]+ bytes do not fit the cache bound of 100 bytes"
    ):
        RemoteShards(url, tmp_path / "small", 100)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda b: b[:-1] + bytes([b[-1] ^ 1]), "checksum mismatch: manifest xxh3_128"),
        (lambda b: b[: len(b) // 2], r"only [\d,]+ of the manifest's [\d,]+ bytes \(partial download\)"),
        (lambda b: b + b"x", r"longer than the manifest's [\d,]+ bytes \(not this shard\)"),
    ],
)
def test_a_damaged_download_is_refused_naming_the_shard(remote_split, tmp_path, damage, message):
    local, url, _, _ = remote_split
    fs, root = fsspec.core.url_to_fs(url)
    fs.pipe_file(f"{root}/shard-00002.safetensors", damage((local / "shard-00002.safetensors").read_bytes()))
    split = RemoteShards(url, tmp_path / "cache", 1 << 30)
    with pytest.raises(
        ShardError,
        match=rf"^{url}/shard-00002.safetensors: {message}.* \(after 3 tries\); "
        "nothing cached$",
    ) as caught:
        split.local(2)
    assert "\n" not in str(caught.value)
    assert cached(tmp_path / "cache") == []  # no copy, no temporary
    split.local(1)  # the other shards are fine


def test_ranks_sharing_a_cache_fetch_each_shard_once(remote_split, tmp_path):
    """Two ranks of one node, one cache folder: the per-shard lock makes one fetch, the other hit."""
    import threading

    _, url, _, _ = remote_split
    splits = [RemoteShards(url, tmp_path / "cache", 1 << 30) for _ in range(2)]
    threads = [threading.Thread(target=lambda s=s: [s.local(i) for i in range(4)]) for s in splits]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(splits[0].counts.shards + splits[1].counts.shards) == sorted(
        f"shard-0000{i}.safetensors" for i in range(4)
    )
    assert splits[0].counts.hits + splits[1].counts.hits == 4 and len(cached(tmp_path / "cache")) == 4


def test_a_failed_try_is_retried_and_a_damaged_copy_fetched_anew(remote_split, tmp_path, monkeypatch):
    local, url, _, _ = remote_split
    split = RemoteShards(url, tmp_path / "cache", 1 << 30)
    real, calls = RemoteShards._download, []

    def flaky(self, path, out, size):
        calls.append(path)
        if len(calls) == 1:
            out.write(b"half")
            raise ConnectionResetError("connection reset by peer")
        return real(self, path, out, size)

    monkeypatch.setattr(RemoteShards, "_download", flaky)
    folder, entry = split.local(3)
    assert len(calls) == 2 and (folder / entry["file"]).read_bytes() == (local / "shard-00003.safetensors").read_bytes()
    copy = folder / entry["file"]
    copy.write_bytes(copy.read_bytes()[:-1] + b"\x07")  # the disk rots
    split.local(3)
    assert len(calls) == 3 and copy.read_bytes() == (local / "shard-00003.safetensors").read_bytes()


def test_a_missing_or_foreign_location_is_one_line(tmp_path):
    with pytest.raises(ShardError, match=r"^memory://nowhere-\w+/train/manifest.json: missing"):
        RemoteShards(f"memory://nowhere-{uuid.uuid4().hex}/train", tmp_path / "c", 1 << 20)
    url = f"memory://junk-{uuid.uuid4().hex}"
    fsspec.filesystem("memory").pipe_file(url[len("memory://") :] + "/manifest.json", b'{"format_version": 2}')
    with pytest.raises(ShardError, match=r"junk-\w+/manifest.json: \(keys\): missing"):
        RemoteShards(url, tmp_path / "c", 1 << 20)
    with pytest.raises(ShardError, match=r"^memory://junk-\w+: a split at a URL needs a cache folder \(cache=...\)$"):
        ShardDataset(url)
    with pytest.raises(ShardError, match=r"^nosuch://bucket/train: cannot open \(Protocol not known: nosuch\)$"):
        RemoteShards("nosuch://bucket/train", tmp_path / "c", 1 << 20)


@pytest.mark.slow
def test_an_unreachable_store_is_one_line(tmp_path, monkeypatch):
    """(s3fs and botocore retry the connection a few times first: seconds.)"""
    pytest.importorskip("s3fs")
    for name, value in (
        ("AWS_ENDPOINT_URL", "http://127.0.0.1:9"),
        ("AWS_ACCESS_KEY_ID", "a"),
        ("AWS_SECRET_ACCESS_KEY", "a"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        monkeypatch.setenv(name, value)
    with pytest.raises(
        ShardError,
        match=r"^s3://bucket/train/manifest.json: cannot read \(EndpointConnectionError: "
        r"[^\n]*127.0.0.1:9[^\n]*\)$",
    ):
        RemoteShards("s3://bucket/train", tmp_path / "cache", 1 << 20)
    assert cached(tmp_path / "cache") == []


def test_a_shard_loader_resumes_mid_epoch_with_the_same_or_another_world_size(tmp_path):
    images, labels = make_split(230, 4)
    write_shards(images, labels, tmp_path / "s", dataset="t", split="train", samples_per_shard=25)
    data = ShardDataset(tmp_path / "s")
    counts = [25] * 9 + [5]

    def loader(world=2, rank=1, batch=20):
        return data.loader(batch, shuffle="shards", seed=3, rank=rank, world_size=world)

    def batches(source, epochs=1):
        return [source.indices.tolist() for _ in range(epochs) for _ in source]

    whole = loader()
    full = batches(whole, 3)
    assert len(full) == 3 * 6 and whole.state_dict()["epoch"] == 3  # 115 per rank: 6 batches, the last of 15
    assert whole.state_dict()["due"] == [[0, 230]]
    firsts, taken = [loader(rank=rank) for rank in range(2)], [[], []]
    for rank, first in enumerate(firsts):
        while len(taken[rank]) < 8:  # to epoch 1, step 2
            for _ in first:
                taken[rank].append(first.indices.tolist())
                if len(taken[rank]) == 8:
                    break
    state = firsts[1].state_dict()
    # the same on every rank: runs [0, 115) and [115, 230), 40 taken of each
    assert (
        state
        == firsts[0].state_dict()
        == {
            "epoch": 1,
            "due": [[40, 115], [155, 230]],
            "seed": 3,
            "shuffle": "shards",
            "count": 230,
            "shard_counts": counts,
            "drop_last": False,
        }
    )
    resumed = loader()
    resumed.load_state_dict(state)
    assert taken[1] + batches(resumed, 2) == full
    # another world size (and local batch) finishes epoch 1 with exactly the samples still due
    order = ShardSampler(230, 20, shuffle="shards", seed=3, shard_counts=counts).order(1)
    before = [i for rank in range(2) for batch in taken[rank][6:] for i in batch]
    due = order[40:115].tolist() + order[155:230].tolist()
    for world, batch in ((1, 40), (3, 20), (4, 10), (2, 7)):
        ranks = [loader(world, rank, batch) for rank in range(world)]
        for rank in ranks:
            rank.load_state_dict(state)
            assert rank.epoch == 1
        rest = [batches(rank) for rank in ranks]
        assert len({len(r) for r in rest}) == 1, world  # every rank the same number of steps
        after = [i for r in rest for b in r for i in b]
        assert after == due, world  # the due positions, cut into contiguous runs again
        assert sorted(before + after) == list(range(230)), world  # epoch 1: each sample exactly once
        fresh = loader(world, 0, batch)
        fresh.set_epoch(2)
        assert batches(ranks[0]) == batches(fresh), world  # then epoch 2 from its start, this world's way
    for key, value in (("seed", 4), ("count", 231), ("shuffle", "samples"), ("shard_counts", [23] * 10)):
        with pytest.raises(ShardError, match=re.escape(f"saved with {key} {value!r}")):
            loader().load_state_dict({**state, key: value})
    with pytest.raises(
        ShardError, match=re.escape("due interval [115, 40] is not ordered, disjoint and inside 0..230")
    ):
        loader().load_state_dict({**state, "due": [[115, 40]]})
    with pytest.raises(ShardError, match="due interval .* inside 0..230"):
        loader().load_state_dict({**state, "due": [[40, 115], [100, 231]]})
    with pytest.raises(ShardError, match="epoch must be an integer in 0..1000002, got -1"):
        loader().load_state_dict({**state, "epoch": -1})


def test_device_batches_resume_mid_epoch_exactly():
    images, labels = (torch.from_numpy(a) for a in make_split(103, 1))
    columns = {"images": images, "labels": labels}

    def loader(rank=1, world_size=2, batch=10):
        return DeviceBatches(columns, batch, shuffle="samples", seed=5, rank=rank, world_size=world_size)

    whole = loader()
    full = [whole.indices.tolist() for _ in range(2) for _ in whole]
    assert len(full) == 2 * 6 and [len(b) for b in full[:6]] == [10] * 5 + [1]  # runs of 52 and 51
    assert whole.state_dict()["epoch"] == 2 and whole.state_dict()["due"] == [[0, 103]]
    firsts, taken = [loader(rank) for rank in range(2)], [[], []]
    for rank, first in enumerate(firsts):
        for _, y in first:
            assert (y == labels[first.indices]).all()
            taken[rank].append(first.indices.tolist())
            if len(taken[rank]) == 3:
                break
    state = firsts[1].state_dict()
    assert state == firsts[0].state_dict() and (state["epoch"], state["due"]) == (0, [[30, 52], [82, 103]])
    resumed = loader()
    resumed.load_state_dict(state)
    assert taken[1] + [resumed.indices.tolist() for _ in range(2) for _ in resumed] == full
    one = loader(0, 1)  # one process finishes the epoch: the due samples, in the epoch's order
    one.load_state_dict(state)
    after = [i for _ in one for i in one.indices.tolist()]
    order = ShardSampler(103, 10, shuffle="samples", seed=5).order(0)
    assert after == order[30:52].tolist() + order[82:103].tolist()
    assert sorted(after + [i for rank in taken for batch in rank for i in batch]) == list(range(103))
    assert one.epoch == 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["--shards", "s3://bucket/shards"], "Error: --shards s3://bucket/shards: a URL needs --cache"),
        (["--shards", ".", "--resume"], "--resume needs --checkpoint"),
        (["--shards", "no/such/folder"], "no/such/folder is neither a folder nor a URL"),
        (["--shards", ".", "--out", "."], "Invalid value for '--out': File '.' is a directory"),
    ],
)
def test_train_arguments_are_checked_in_one_line(args, message, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from pipeline.cli import main

    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    result = CliRunner().invoke(main, ["train", "t", "--out", str(tmp_path / "o.json"), *args, "--params", str(PARAMS)])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output, result.output


@pytest.mark.parametrize("checkpoint", [False, True])
def test_ctrl_c_in_train_says_what_it_left(checkpoint, tmp_path, monkeypatch):
    """The line every command says, true of train too: its checkpoint, replaced as it goes,
    is replaced whole at each save (it said nothing was replaced)."""
    from click.testing import CliRunner

    import pipeline.stages.train.stage as stage
    from pipeline.cli import main

    for split, n in (("train", 40), ("test", 20)):
        write_shards(*make_split(n, 0), tmp_path / "s" / split, dataset="t", split=split, samples_per_shard=25)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(stage, "train_ddp", interrupted)
    extra = ["--checkpoint", str(tmp_path / "ck.pt")] if checkpoint else []
    args = ["train", "t", "--shards", str(tmp_path / "s"), "--out", str(tmp_path / "o.json"), *extra]
    result = CliRunner().invoke(main, [*args, "--params", str(PARAMS)])
    said = "every output holds its last whole version, none half-written"
    assert result.exit_code == 130 and result.output == f"Stopped (Ctrl-C): {said}\n", result.output


# --- two nodes and a resumed run, under torchrun -------------------------------------------------


@pytest.fixture(scope="module")
def s3():
    """moto's S3 in server mode on 127.0.0.1 (as tests/test_dvc_pipeline.py starts it), one
    bucket; yields the environment that points s3fs (and boto) at it."""
    moto_server = pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    import urllib.request

    import boto3

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)  # the system's free port
    server.start()
    port = server.get_host_and_port()[1]
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    # Authentication off whatever an earlier test in this process set (moto's switch is global).
    urllib.request.urlopen(
        urllib.request.Request(
            f"{env['AWS_ENDPOINT_URL']}/moto-api/reset-auth",
            data=b"inf",
            method="POST",
            headers={"Content-Type": "text/plain"},
        )
    )
    boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    ).create_bucket(Bucket="scale")
    yield env
    server.stop()


def put_s3(local: Path, key: str, env: dict) -> None:
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )
    for file in sorted(local.iterdir()):
        client.put_object(Bucket="scale", Key=f"{key}/{file.name}", Body=file.read_bytes())


def params_file(folder: Path, **train) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    params = yaml.safe_load((PARAMS).read_text())
    params["train"].update(train)
    path = folder / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def torchrun(args: list[str], env: dict, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", *args],
        cwd=ROOT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        **kw,
    )


def train_command(
    nproc: int, shards: Path, out: Path, params: Path, *extra: str, entry=("-m", "pipeline", "train")
) -> list[str]:
    """torchrun's arguments for a one-node training of data set `t` on `nproc` ranks."""
    return ["--standalone", "--nproc-per-node", str(nproc), *entry, "t", "--shards", str(shards), "--out", str(out),
            "--params", str(params), *extra]  # fmt: skip


def finish(process: subprocess.Popen, code: int = 0) -> str:
    output, _ = process.communicate(timeout=240)
    assert process.returncode == code, output[-3000:]
    return output


def ranks_of(folder: Path) -> dict[int, dict]:
    return {doc["rank"]: doc for doc in (json.loads(p.read_text()) for p in folder.glob("train.rank*.json"))}


@pytest.fixture(scope="module")
def two_nodes(s3, tmp_path_factory):
    """601 train samples in shards of 25, 100 test samples, on S3; two launches of one rank
    each, node N caching in cache<N>; run twice (cold, then warm caches)."""
    root = tmp_path_factory.mktemp("nodes")
    for split, n, seed in (("train", 601, 0), ("test", 100, 1)):
        images, labels = make_split(n, seed)
        write_shards(images, labels, root / "shards" / split, dataset="t", split=split, samples_per_shard=25)
        put_s3(root / "shards" / split, f"t/{split}", s3)
    params = params_file(root, epochs=2, batch_size=60, checkpoint_every=0)
    runs = []
    for run in ("cold", "warm"):
        port = free_port()
        launches = [
            torchrun(
                [
                    "--nnodes",
                    "2",
                    "--node-rank",
                    str(node),
                    "--nproc-per-node",
                    "1",
                    "--rdzv-backend",
                    "c10d",
                    "--rdzv-endpoint",
                    f"127.0.0.1:{port}",
                    "--rdzv-id",
                    run,
                    "-m",
                    "pipeline",
                    "train",
                    "t",
                    "--shards",
                    "s3://scale/t",
                    "--cache",
                    str(root / f"cache{node}"),
                    "--out",
                    str(root / run / f"node{node}" / "train.json"),
                    "--record",
                    "--params",
                    str(params),
                ],
                s3,
            )
            for node in range(2)
        ]
        for launch in launches:
            finish(launch)
        runs.append([ranks_of(root / run / f"node{node}") for node in range(2)])
    return root, runs, yaml.safe_load(params.read_text())["train"]["seed"]


def manifest_of(root: Path, split: str) -> dict:
    return json.loads((root / "shards" / split / "manifest.json").read_text())


def rank_ids(root: Path, split: str, epoch: int, rank: int, seed: int) -> list[int]:
    """The sample ids rank `rank` of two takes in `epoch` (local batch 30), by the library's rule:
    the train split in shard order ("shards"), the test split in order."""
    counts = [e["count"] for e in manifest_of(root, split)["shards"]]
    shuffle = "shards" if split == "train" else "none"
    return (
        ShardSampler(sum(counts), 30, shuffle=shuffle, seed=seed, rank=rank, world_size=2, shard_counts=counts)
        .rank_order(epoch)
        .tolist()
    )


@pytest.mark.slow
def test_two_nodes_step_together_on_disjoint_samples_and_end_identical(two_nodes):
    root, (cold, warm), seed = two_nodes
    ranks = {rank: doc for node in cold for rank, doc in node.items()}
    assert sorted(ranks) == [0, 1] and all(len(node) == 1 for node in cold)
    # 601 samples: runs of 301 and 300, 11 steps of 30 for both ranks (the last batches of 1 and 0)
    assert ranks[0]["steps"] == ranks[1]["steps"] == [11, 11]
    for rank, last in ((0, 1), (1, 0)):
        sizes = [len(batch) - 1 for batch in ranks[rank]["batches"]]
        assert sizes == ([30] * 10 + [last]) * 2 and [b[0] for b in ranks[rank]["batches"]] == list(range(1, 23))
        assert ranks[rank]["ids"] == rank_ids(root, "train", 0, rank, seed)
        taken = [i for batch in ranks[rank]["batches"][11:] for i in batch[1:]]
        assert taken == rank_ids(root, "train", 1, rank, seed)
    a, b = set(ranks[0]["ids"]), set(ranks[1]["ids"])
    assert not a & b and len(a) == 301 and len(b) == 300 and a | b == set(range(601))  # none dropped
    assert all("dropped" not in epoch and np.isfinite(epoch["loss"]) for epoch in ranks[0]["epochs"])
    assert ranks[0]["params_sha256"] == ranks[1]["params_sha256"]
    again = {rank: doc for node in warm for rank, doc in node.items()}
    assert again[0]["params_sha256"] == ranks[0]["params_sha256"]  # the cache changes nothing learnt
    assert again[0]["batches"] == ranks[0]["batches"] and again[1]["batches"] == ranks[1]["batches"]


@pytest.mark.slow
def test_each_node_downloads_only_its_ranks_shards_and_nothing_when_warm(two_nodes):
    root, (cold, warm), seed = two_nodes
    needed = {}
    for node, docs in enumerate(cold):
        ((rank, doc),) = docs.items()
        files = set()
        for split, epochs in (("train", range(2)), ("test", range(1))):
            manifest = manifest_of(root, split)
            counts = [e["count"] for e in manifest["shards"]]
            per_epoch = [shards_of(rank_ids(root, split, e, rank, seed), counts) for e in epochs]
            # an epoch's run covers about half the shards; two epochs' shard orders differ
            assert all(len(shards) <= len(counts) // 2 + 2 for shards in per_epoch), (split, per_epoch)
            needed[node, split] = sorted(set().union(*per_epoch))
            fetched = doc["fetched"][split]
            # each shard fetched once, the first time a batch touched it; no other
            assert sorted(fetched["shards"]) == sorted(manifest["shards"][s]["file"] for s in needed[node, split])
            assert fetched["bytes"] == sum(manifest["shards"][s]["bytes"] for s in needed[node, split]), (node, split)
            files |= {manifest["shards"][s]["xxh3_128"] + ".safetensors" for s in needed[node, split]}
        assert needed[node, "test"] == [[0, 1], [2, 3]][rank]  # the test split in order: 50 samples each
        assert cached(root / f"cache{node}") == sorted(f"objects/{name}" for name in files)
        epoch_bytes = [e["fetched_bytes"] for e in doc["epochs"]]
        assert sum(epoch_bytes) == doc["fetched"]["train"]["bytes"] and epoch_bytes[0] > 0
    for node, docs in enumerate(warm):
        (doc,) = docs.values()
        assert doc["fetched"]["train"]["bytes"] == doc["fetched"]["test"]["bytes"] == 0
        assert doc["fetched"]["train"]["shards"] == doc["fetched"]["test"]["shards"] == []
        assert doc["fetched"]["train"]["hits"] == len(needed[node, "train"])
        assert doc["fetched"]["test"]["hits"] == len(needed[node, "test"])


@pytest.mark.slow
def test_a_split_of_another_data_set_is_refused_in_one_line(s3, tmp_path):
    """The train command checks that a URL's (and a folder's) splits are DATASET's."""
    for split, n in (("train", 40), ("test", 20)):
        write_shards(*make_split(n, 0), tmp_path / "shards" / split, dataset="t", split=split, samples_per_shard=25)
        put_s3(tmp_path / "shards" / split, f"other/{split}", s3)
    for where, extra, line in (
        (
            "s3://scale/other",
            ["--cache", str(tmp_path / "cache")],
            "Error: s3://scale/other/train/manifest.json: manifest is for dataset 't', expected 'mnist'",
        ),
        (
            str(tmp_path / "shards"),
            [],
            f"Error: {tmp_path / 'shards' / 'train' / 'manifest.json'}: manifest is for dataset 't', expected 'mnist'",
        ),
    ):
        output = finish(
            torchrun(
                [
                    "--standalone",
                    "--nproc-per-node",
                    "1",
                    "-m",
                    "pipeline",
                    "train",
                    "mnist",
                    "--shards",
                    where,
                    *extra,
                    "--out",
                    str(tmp_path / "o" / "train.json"),
                    "--params",
                    str(params_file(tmp_path, epochs=1, batch_size=10)),
                ],
                s3,
            ),
            1,
        )
        assert sum(text == line for text in output.splitlines()) == 1, output[-3000:]
        assert f'File "{ROOT / "pipeline"}' not in output, output[-3000:]  # no traceback through the pipeline
    assert not (tmp_path / "o" / "train.json").exists() and cached(tmp_path / "cache") == []


@pytest.mark.slow
def test_a_url_whose_test_split_is_empty_is_refused_before_training(s3, tmp_path):
    """A folder's counts are checked before the ranks start (check_world); a URL's were not,
    and an empty test split ended a whole epoch of training with a division by zero."""
    for split, n in (("train", 40), ("test", 0)):
        write_shards(*make_split(n, 0), tmp_path / "shards" / split, dataset="mnist", split=split, samples_per_shard=25)
        put_s3(tmp_path / "shards" / split, f"empty/{split}", s3)
    command = ["--standalone", "--nproc-per-node", "1", "-m", "pipeline", "train", "mnist", "--shards"]
    output = finish(
        torchrun(
            [
                *command,
                "s3://scale/empty",
                "--cache",
                str(tmp_path / "cache"),
                "--out",
                str(tmp_path / "o" / "train.json"),
                "--params",
                str(params_file(tmp_path, epochs=1, batch_size=10)),
            ],
            s3,
        ),
        1,
    )
    line = (
        "Error: s3://scale/empty/test: 0 samples, fewer than the 1 ranks (WORLD_SIZE); run fewer ranks "
        "(torchrun --nproc-per-node)"
    )
    assert sum(text == line for text in output.splitlines()) == 1, output[-3000:]
    assert "train epoch" not in output and "ZeroDivisionError" not in output, output[-3000:]
    assert not (tmp_path / "o" / "train.json").exists()


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    """Two ranks, 600 samples, 2 epochs of 10 steps, a checkpoint every 4 steps: one run
    uninterrupted, one whose rank 1 is SIGKILLed after step 14 (epoch 2, step 4; the last
    checkpoint is step 12), then resumed with --resume from copies of its checkpoint: on 2
    ranks, on 1 and on 3."""
    root = tmp_path_factory.mktemp("resume")
    for split, n, seed in (("train", 600, 0), ("test", 100, 1)):
        images, labels = make_split(n, seed)
        write_shards(images, labels, root / "shards" / split, dataset="t", split=split, samples_per_shard=50)
    params = params_file(root, epochs=2, batch_size=60, checkpoint_every=4)

    def launch(
        name: str, *extra: str, entry: tuple[str, ...] = ("-m", "pipeline", "train"), nproc: int = 2, code: int = 0
    ) -> str:
        command = train_command(
            nproc, root / "shards", root / name / "train.json", params, "--record", *extra, entry=entry
        )
        return finish(torchrun(command, {}), code)

    launch("full", "--checkpoint", str(root / "full.pt"))
    # the same training entry, with a hook that SIGKILLs rank 1 after step 14
    killed = launch(
        "killed",
        "--checkpoint",
        str(root / "run.pt"),
        code=1,
        entry=(str(ROOT / "tests" / "train_killing_rank.py"), "--kill-rank", "1", "--after-step", "14"),
    )
    saved = torch.load(root / "run.pt", weights_only=True)
    outputs = {}
    for nproc in (2, 1, 3):  # each from its own copy: a resumed run saves checkpoints of its own
        shutil.copy(root / "run.pt", root / f"on{nproc}.pt")
        outputs[nproc] = launch(f"on{nproc}", "--checkpoint", str(root / f"on{nproc}.pt"), "--resume", nproc=nproc)
    return root, killed, saved, outputs, yaml.safe_load(params.read_text())["train"]["seed"]


def metrics(root: Path, name: str) -> dict:
    return json.loads((root / name / "train.json").read_text())


def history(root: Path, name: str) -> list[dict]:
    return metrics(root, name)["epochs"]


def untimed(epoch: dict) -> dict:
    """An epoch's figures but its timings."""
    return {k: v for k, v in epoch.items() if k not in ("seconds", "read_seconds")}


@pytest.mark.slow
def test_a_killed_run_resumes_with_the_same_samples_and_weights(resumed):
    root, killed, saved, outputs, seed = resumed
    # torchrun's report: rank 1 ended by SIGKILL (the hook), not by an error of its own
    assert re.search(r"rank\s*:\s*1 \(local_rank: 1\)\s*exitcode\s*:\s*-9 ", killed), killed[-3000:]
    assert not (root / "killed" / "train.json").exists()
    assert saved["global_step"] == 12 and saved["data"] == {
        "epoch": 1,
        "due": [[60, 300], [360, 600]],
        "seed": seed,
        "shuffle": "shards",
        "count": 600,
        "shard_counts": [50] * 12,
        "drop_last": False,
    }  # runs [0, 300) and [300, 600), 2 steps of 30 taken of each
    line = f"train: resumed from {root / 'on2.pt'} at epoch 2, sample 120 of the epoch, on 2 ranks"
    assert sum(text == line for text in outputs[2].splitlines()) == 1, outputs[2][-2000:]
    full, again = ranks_of(root / "full"), ranks_of(root / "on2")
    for rank in (0, 1):
        tail = [batch for batch in full[rank]["batches"] if batch[0] > 12]
        assert again[rank]["batches"] == tail and len(tail) == 8
        assert again[rank]["params_sha256"] == full[rank]["params_sha256"]
    assert full[0]["params_sha256"] == full[1]["params_sha256"]
    doc, whole = history(root, "on2"), history(root, "full")
    assert [e["epoch"] for e in doc] == [1, 2]
    # the same figures, and the metrics say which samples of epoch 2 the resumed run trained
    assert [untimed(e) for e in doc] == [{**untimed(e), "resumed_at_sample": at} for e, at in zip(whole, (0, 120))]
    assert metrics(root, "on2")["resumed"] == {"epoch": 2, "sample": 120, "global_step": 12}
    assert metrics(root, "full")["resumed"] is None and [e["resumed_at_sample"] for e in whole] == [0, 0]


@pytest.mark.parametrize("nproc", [1, 3])
@pytest.mark.slow
def test_a_killed_run_resumes_on_another_number_of_ranks(resumed, nproc):
    """Killed mid-epoch on 2 ranks, resumed on 1 (or 3): the samples still due that epoch are
    cut among the new ranks; across the old run and the new, every sample of the interrupted
    epoch is trained on exactly once, and training completes."""
    root, _, _, outputs, seed = resumed
    line = f"train: resumed from {root / f'on{nproc}.pt'} at epoch 2, sample 120 of the epoch, on {nproc} rank{'s' if nproc > 1 else ''}"
    assert sum(text == line for text in outputs[nproc].splitlines()) == 1, outputs[nproc][-2000:]
    # The killed run took the full run's first 12 steps (the same seed and order: the 2-rank
    # resume above proves it); its checkpoint holds what came after.
    full, new = ranks_of(root / "full"), ranks_of(root / f"on{nproc}")
    assert sorted(new) == list(range(nproc))
    before = [i for doc in full.values() for batch in doc["batches"] if 10 < batch[0] <= 12 for i in batch[1:]]
    assert len(before) == 120
    local = 60 // nproc
    steps = [[batch[0] for batch in new[rank]["batches"]] for rank in range(nproc)]
    assert steps == [list(range(13, 21))] * nproc  # 480 due: 8 steps on every rank
    after = [i for rank in range(nproc) for batch in new[rank]["batches"] for i in batch[1:]]
    assert sorted(before + after) == list(range(600))  # the epoch: each sample exactly once
    # the due positions of epoch 2's order, cut into nproc contiguous runs of 480 / nproc
    order = ShardSampler(600, local, shuffle="shards", seed=seed, shard_counts=[50] * 12).order(1).tolist()
    assert after == order[60:300] + order[360:600]
    for rank in range(nproc):
        assert all(len(batch) - 1 == local for batch in new[rank]["batches"])
        assert new[rank]["params_sha256"] == new[0]["params_sha256"]
    # training completed: epoch 1 as the checkpoint recorded it, epoch 2 finished on the new ranks
    doc, whole = history(root, f"on{nproc}"), history(root, "full")
    assert [e["epoch"] for e in doc] == [1, 2] and doc[1]["steps"] == 10
    # each epoch says the ranks that trained it: the run's own world size is not the first epoch's
    assert metrics(root, f"on{nproc}")["world_size"] == nproc
    assert [(e["world_size"], e["resumed_at_sample"]) for e in doc] == [(2, 0), (nproc, 120)]
    assert untimed(doc[0]) == untimed(whole[0])
    # other global batches in epoch 2 than the uninterrupted run's (the same samples, grouped
    # otherwise): close, not equal
    assert abs(doc[1]["loss"] - whole[1]["loss"]) <= 0.05 * whole[1]["loss"], (doc, whole)
    assert doc[1]["accuracy"] >= whole[1]["accuracy"] - 0.05, (doc, whole)


@pytest.mark.slow
def test_a_run_the_ranks_or_the_checkpoint_do_not_fit_is_one_line(resumed, tmp_path):
    """Under torchrun, a global batch the ranks started cannot split evenly (the params check
    knows only train.world_size), and a checkpoint already past train.epochs (its metrics would
    hold more epochs than the run asks for): each rank says one line, no traceback through the
    pipeline, and no metrics are written."""
    root = resumed[0]
    shutil.copy(root / "full.pt", tmp_path / "full.pt")  # 2 epochs done
    cases = (
        (
            params_file(tmp_path / "a", batch_size=61, world_size=1),
            [],
            "does not split evenly across the 2 ranks torchrun started",
        ),
        (
            params_file(tmp_path / "b", epochs=1, batch_size=60),
            ["--checkpoint", str(tmp_path / "full.pt"), "--resume"],
            "already 2 epochs in, past train.epochs (1)",
        ),
    )
    for params, extra, said in cases:
        out = params.parent / "train.json"
        output = finish(torchrun(train_command(2, root / "shards", out, params, *extra), {}), 1)  # 1: torchrun's own
        assert sum(line.startswith("Error: ") and said in line for line in output.splitlines()) == 2, output[-3000:]
        assert f'File "{ROOT / "pipeline"}' not in output and not out.exists(), output[-3000:]


def test_the_docs_show_the_measured_results():
    """docs/scale.md includes benchmarks/two_nodes.py's rendering of results/scale/mnist/two_nodes.json."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("two_nodes", ROOT / "benchmarks" / "two_nodes.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    results = json.loads(bench.RESULTS.read_text())
    assert bench.TABLE.read_text() == bench.render(results) + "\n"
    name = bench.TABLE.relative_to(ROOT).as_posix()
    text = (ROOT / "docs" / "scale.md").read_text()
    assert f"<!-- include: {name} -->\n{bench.render(results)}\n<!-- /include -->" in text
    for layout in results["layouts"]:  # what the page says of them holds
        assert all(node["train_bytes"] == 0 and node["test_bytes"] == 0 for node in layout["runs"]["warm"])
        cold = layout["runs"]["cold"]
        assert len({node["params_sha256"] for run in layout["runs"].values() for node in run}) == 1
        assert all(0 < node["train_bytes"] <= layout["train_bytes"] for node in cold)


@pytest.mark.parametrize(
    "content, message",
    [
        # torch's own text goes on to advise an unsafe load (weights_only=False): not repeated
        (b"not a checkpoint", "not a train checkpoint: it does not load as data (weights_only)"),
        (b"\x80\x02}q\x00.", "not a readable checkpoint (Invalid magic number; corrupt file?)"),
        (None, "not a train checkpoint (expected keys"),
    ],
)
def test_a_bad_checkpoint_is_one_line(tmp_path, content, message):
    from pipeline.core.errors import InputError
    from pipeline.stages.train.checkpoints import Checkpoints

    path = tmp_path / "c.pt"
    if content is None:
        torch.save({"model": {}}, path)
    else:
        path.write_bytes(content)
    with pytest.raises(InputError, match=re.escape(f"c.pt: {message}")) as caught:
        Checkpoints(path, 1, resume=True).load(torch.device("cpu"))
    assert "\n" not in str(caught.value) and "False" not in str(caught.value)
    assert Checkpoints(tmp_path / "none.pt", 1, resume=True).load(torch.device("cpu")) is None  # a fresh start


def test_an_endpoint_changed_in_the_environment_is_the_one_read(tmp_path, monkeypatch):
    """fsspec caches file systems by their arguments, not the environment: a RemoteShards
    made after AWS_ENDPOINT_URL changed must reach the new endpoint, not a cached old one."""
    pytest.importorskip("s3fs")
    import fsspec

    for name, value in (
        ("AWS_ENDPOINT_URL", "http://127.0.0.1:1"),
        ("AWS_ACCESS_KEY_ID", "a"),
        ("AWS_SECRET_ACCESS_KEY", "a"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        monkeypatch.setenv(name, value)
    earlier = fsspec.filesystem("s3")  # an instance cached and connected for port 1, as an earlier user leaves it
    with pytest.raises(Exception):
        earlier.ls("bucket")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    with pytest.raises(ShardError, match=r"127.0.0.1:9/"):
        RemoteShards("s3://bucket/train", tmp_path / "cache", 1 << 20)


def test_a_run_removes_the_rank_records_it_did_not_write(tmp_path):
    """A 3-rank run with --record, then a 1-rank run with the same --out: the old run's
    rank 1 and 2 records read as this run's. They go; a file of that name that is not a
    record stays."""
    from pipeline.stages.train.stage import _remove_other_records

    out = tmp_path / "train.json"
    for rank in range(3):
        (tmp_path / f"train.rank{rank}.json").write_text(json.dumps({"rank": rank, "params_sha256": "x"}))
    (tmp_path / "train.rank7.json").write_text('{"mine": true}')
    (tmp_path / "train.rankX.json").write_text("{}")
    _remove_other_records(out, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.rank0.json", "train.rank7.json", "train.rankX.json"]
    _remove_other_records(out, 0)  # a run without --record: none of them is its own
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.rank7.json", "train.rankX.json"]
