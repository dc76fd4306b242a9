"""Past one machine: shards read from object storage into a bounded node-local cache, two
torchrun launches as two nodes against an S3 server on 127.0.0.1 (moto), and a run killed
mid-epoch that resumes exactly where it was."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch
import yaml

from conftest import make_split
from pipeline.shards import DeviceBatches, ShardError, write_shards
from pipeline.shards.ranks import RankShards, RankStream, pieces
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


def test_a_rank_fetches_only_the_shards_its_range_covers(remote_split, tmp_path):
    local, url, images, labels = remote_split
    manifest = json.loads((local / "manifest.json").read_text())
    counts = [e["count"] for e in manifest["shards"]]
    for rank in range(3):
        cache = tmp_path / f"cache{rank}"
        ours = RankShards(url, rank, 3, seed=7, cache=cache)
        part = ours.epoch(0)
        want = RankShards(local, rank, 3, seed=7).epoch(0)
        assert torch.equal(part.seen(), want.seen()) and torch.equal(part.images, want.images)
        assert (part.labels.numpy() == labels[part.ids.numpy()]).all()
        needed = sorted({shard for shard, _, _ in pieces(counts, 3, 7, 0)[rank]})
        assert len(needed) < len(counts)
        files = [manifest["shards"][s]["file"] for s in needed]
        assert sorted(ours.remote.counts.shards) == sorted(files)
        assert ours.remote.counts.bytes == sum(manifest["shards"][s]["bytes"] for s in needed)
        # the cache holds exactly those shards, named by content, and nothing else
        assert cached(cache) == sorted(f"objects/{manifest['shards'][s]['xxh3_128']}.safetensors" for s in needed)
        warm = RankShards(url, rank, 3, seed=7, cache=cache)
        assert torch.equal(warm.epoch(0).seen(), want.seen())
        assert warm.remote.counts.bytes == 0 and warm.remote.counts.hits == len(needed)


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
    with pytest.raises(ShardError, match=r"/train/shard-00000.safetensors: [\d,]+ bytes do not fit the cache bound of 100 bytes"):
        RemoteShards(url, tmp_path / "small", 100)


@pytest.mark.parametrize("damage, message", [
    (lambda b: b[:-1] + bytes([b[-1] ^ 1]), "checksum mismatch: manifest xxh3_128"),
    (lambda b: b[: len(b) // 2], r"only [\d,]+ of the manifest's [\d,]+ bytes \(partial download\)"),
    (lambda b: b + b"x", r"longer than the manifest's [\d,]+ bytes \(not this shard\)"),
])
def test_a_damaged_download_is_refused_naming_the_shard(remote_split, tmp_path, damage, message):
    local, url, _, _ = remote_split
    fs, root = fsspec.core.url_to_fs(url)
    fs.pipe_file(f"{root}/shard-00002.safetensors", damage((local / "shard-00002.safetensors").read_bytes()))
    split = RemoteShards(url, tmp_path / "cache", 1 << 30)
    with pytest.raises(ShardError, match=rf"^{url}/shard-00002.safetensors: {message}.* \(after 3 tries\); "
                                         "nothing cached$") as caught:
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
        f"shard-0000{i}.safetensors" for i in range(4))
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
    fsspec.filesystem("memory").pipe_file(url[len("memory://"):] + "/manifest.json", b'{"format_version": 2}')
    with pytest.raises(ShardError, match=r"junk-\w+/manifest.json: \(keys\): missing"):
        RemoteShards(url, tmp_path / "c", 1 << 20)
    with pytest.raises(ValueError, match="needs a cache folder"):
        RankShards(url, 0, 1, seed=0)
    with pytest.raises(ShardError, match=r"^nosuch://bucket/train: cannot open \(Protocol not known: nosuch\)$"):
        RemoteShards("nosuch://bucket/train", tmp_path / "c", 1 << 20)


@pytest.mark.slow
def test_an_unreachable_store_is_one_line(tmp_path, monkeypatch):
    """(s3fs and botocore retry the connection a few times first: seconds.)"""
    pytest.importorskip("s3fs")
    for name, value in (("AWS_ENDPOINT_URL", "http://127.0.0.1:9"), ("AWS_ACCESS_KEY_ID", "a"),
                        ("AWS_SECRET_ACCESS_KEY", "a"), ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    with pytest.raises(ShardError, match=r"^s3://bucket/train/manifest.json: cannot read \(EndpointConnectionError: "
                                         r"[^\n]*127.0.0.1:9[^\n]*\)$"):
        RemoteShards("s3://bucket/train", tmp_path / "cache", 1 << 20)
    assert cached(tmp_path / "cache") == []


def test_a_rank_stream_resumes_mid_epoch_exactly(tmp_path):
    images, labels = make_split(230, 4)
    write_shards(images, labels, tmp_path / "s", dataset="t", split="train", samples_per_shard=25)

    def stream(world=2, rank=1, batch=20):
        return RankStream(RankShards(tmp_path / "s", rank, world, seed=3), batch_size=batch)

    whole = stream()
    full = [ids.tolist() for _ in range(3) for _, _, ids in whole]
    assert len(full) == 3 * 6 and whole.state_dict()["epoch"] == 3  # 115 per rank: 6 batches, the last of 15
    first = stream()
    taken = []
    while len(taken) < 8:  # to epoch 1, step 2
        for _, _, ids in first:
            taken.append(ids.tolist())
            if len(taken) == 8:
                break
    state = first.state_dict()
    assert (state["epoch"], state["step"]) == (1, 2)
    resumed = stream()
    resumed.load_state_dict(state)
    rest = [ids.tolist() for _ in range(2) for _, _, ids in resumed]
    assert taken + rest == full
    with pytest.raises(ShardError, match="saved by 2 ranks at step 2 of epoch 1, this job has 3; resume mid-epoch "
                                         "with the same world size"):
        stream(world=3, rank=0).load_state_dict(state)
    for key, value in (("seed", 4), ("global_batch", 20), ("count", 231)):
        with pytest.raises(ShardError, match=f"saved with {key} {value}"):
            stream().load_state_dict({**state, key: value})
    with pytest.raises(ShardError, match="step 7 is not a position"):
        stream().load_state_dict({**state, "step": 7})
    # at an epoch's start a new world size cuts the epoch its own way (same global batch: 40)
    other, fresh = stream(world=4, rank=0, batch=10), stream(world=4, rank=0, batch=10)
    other.load_state_dict({**state, "step": 0})
    fresh.epoch = 1
    assert [ids.tolist() for _, _, ids in other] == [ids.tolist() for _, _, ids in fresh]


def test_device_batches_resume_mid_epoch_exactly():
    images, labels = (torch.from_numpy(a) for a in make_split(103, 1))

    def loader(**kw):
        return DeviceBatches(images, labels, batch_size=10, seed=5, rank=1, world_size=2, **kw)

    whole = loader()
    full = [y.tolist() for _ in range(2) for _, y in whole]
    assert whole.state_dict()["epoch"] == 2 and whole.state_dict()["position"] == 0
    first, taken = loader(), []
    for _, y in first:
        taken.append(y.tolist())
        if len(taken) == 3:
            break
    state = first.state_dict()
    assert (state["epoch"], state["position"]) == (0, 3)
    resumed = loader()
    resumed.load_state_dict(state)
    rest = [y.tolist() for _ in range(2) for _, y in resumed][:len(full) - 3]
    assert taken + rest == full
    with pytest.raises(ShardError, match="world_size 2, this loader has 1"):
        DeviceBatches(images, labels, batch_size=10, seed=5).load_state_dict(state)


@pytest.mark.parametrize("args, message", [
    (["--shards", "s3://bucket/shards"], "Error: --shards s3://bucket/shards: a URL needs --cache"),
    (["--shards", ".", "--resume"], "--resume needs --checkpoint"),
    (["--shards", "no/such/folder"], "no/such/folder is neither a folder nor a URL"),
])
def test_train_arguments_are_checked_in_one_line(args, message, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from pipeline.cli import main

    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    result = CliRunner().invoke(main, ["train", "t", "--out", str(tmp_path / "o.json"), *args,
                                       "--params", str(ROOT / "params.yaml")])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output, result.output


# --- two nodes and a resumed run, under torchrun -------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def s3():
    """moto's S3 in server mode on 127.0.0.1 (as tests/test_dvc_pipeline.py starts it), one
    bucket; yields the environment that points s3fs (and boto) at it."""
    moto_server = pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    import urllib.request

    import boto3

    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "test",
           "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
    # Authentication off whatever an earlier test in this process set (moto's switch is global).
    urllib.request.urlopen(urllib.request.Request(f"{env['AWS_ENDPOINT_URL']}/moto-api/reset-auth", data=b"inf",
                                                  method="POST", headers={"Content-Type": "text/plain"}))
    boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1", aws_access_key_id="test",
                 aws_secret_access_key="test").create_bucket(Bucket="scale")
    yield env
    server.stop()


def put_s3(local: Path, key: str, env: dict) -> None:
    import boto3

    client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                          aws_access_key_id="test", aws_secret_access_key="test")
    for file in sorted(local.iterdir()):
        client.put_object(Bucket="scale", Key=f"{key}/{file.name}", Body=file.read_bytes())


def params_file(folder: Path, **train) -> Path:
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["train"].update(train)
    path = folder / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def torchrun(args: list[str], env: dict, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *args], cwd=ROOT, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **env},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kw)


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
        launches = [torchrun(["--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1",
                              "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run,
                              "-m", "pipeline", "train", "t", "--shards", "s3://scale/t",
                              "--cache", str(root / f"cache{node}"), "--out", str(root / run / f"node{node}" /
                                                                                 "train.json"),
                              "--record", "--params", str(params)], s3) for node in range(2)]
        for launch in launches:
            finish(launch)
        runs.append([ranks_of(root / run / f"node{node}") for node in range(2)])
    return root, runs


def manifest_of(root: Path, split: str) -> dict:
    return json.loads((root / "shards" / split / "manifest.json").read_text())


@pytest.mark.slow
def test_two_nodes_step_together_on_disjoint_samples_and_end_identical(two_nodes):
    root, (cold, warm) = two_nodes
    ranks = {rank: doc for node in cold for rank, doc in node.items()}
    assert sorted(ranks) == [0, 1] and all(len(node) == 1 for node in cold)
    assert ranks[0]["steps"] == ranks[1]["steps"] == [10, 10]  # 300 samples each, local batch 30
    a, b = set(ranks[0]["ids"]), set(ranks[1]["ids"])
    dropped = ranks[0]["epochs"][0]["dropped"]
    assert not a & b and dropped == 1 and len(a | b) == 601 - dropped
    assert ranks[0]["params_sha256"] == ranks[1]["params_sha256"]
    again = {rank: doc for node in warm for rank, doc in node.items()}
    assert again[0]["params_sha256"] == ranks[0]["params_sha256"]  # the cache changes nothing learnt


@pytest.mark.slow
def test_each_node_downloads_only_its_ranks_shards_and_nothing_when_warm(two_nodes):
    root, (cold, warm) = two_nodes
    for node, docs in enumerate(cold):
        (rank, doc), = docs.items()
        files = set()
        for split, epochs in (("train", range(2)), ("test", range(1))):
            manifest = manifest_of(root, split)
            counts = [e["count"] for e in manifest["shards"]]
            needed = sorted({s for e in epochs for s, _, _ in pieces(counts, 2, 42, e)[rank]})
            assert len(needed) < len(counts)
            fetched = doc["fetched"][split]
            assert sorted(fetched["shards"]) == sorted(manifest["shards"][s]["file"] for s in needed), (node, split)
            assert fetched["bytes"] == sum(manifest["shards"][s]["bytes"] for s in needed)
            files |= {manifest["shards"][s]["xxh3_128"] + ".safetensors" for s in needed}
        assert cached(root / f"cache{node}") == sorted(f"objects/{name}" for name in files)
        assert sum(e["fetched_bytes"] for e in doc["epochs"]) == doc["fetched"]["train"]["bytes"]
    for docs in warm:
        (doc,) = docs.values()
        assert doc["fetched"]["train"]["bytes"] == doc["fetched"]["test"]["bytes"] == 0
        assert doc["fetched"]["train"]["hits"] > 0


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    """Two ranks, 600 samples, 2 epochs of 10 steps, a checkpoint every 4 steps: one run
    uninterrupted, one whose rank 1 is SIGKILLed after step 14 (epoch 2, step 4; the last
    checkpoint is step 12), then resumed with --resume."""
    root = tmp_path_factory.mktemp("resume")
    for split, n, seed in (("train", 600, 0), ("test", 100, 1)):
        images, labels = make_split(n, seed)
        write_shards(images, labels, root / "shards" / split, dataset="t", split=split, samples_per_shard=50)
    params = params_file(root, epochs=2, batch_size=60, checkpoint_every=4)

    def launch(name: str, *extra: str, env: dict | None = None, nproc: int = 2, code: int = 0) -> str:
        return finish(torchrun(["--standalone", "--nproc-per-node", str(nproc), "-m", "pipeline", "train", "t",
                                "--shards", str(root / "shards"), "--out", str(root / name / "train.json"),
                                "--record", "--params", str(params), *extra], env or {}), code)

    launch("full", "--checkpoint", str(root / "full.pt"))
    killed = launch("killed", "--checkpoint", str(root / "run.pt"), code=1,
                    env={"PIPELINE_TRAIN_KILL_RANK": "1", "PIPELINE_TRAIN_KILL_AFTER_STEP": "14"})
    saved = torch.load(root / "run.pt", weights_only=True)
    refused = launch("elastic", "--checkpoint", str(root / "run.pt"), "--resume", nproc=1, code=1)
    again = launch("resumed", "--checkpoint", str(root / "run.pt"), "--resume")
    return root, killed, saved, refused, again


@pytest.mark.slow
def test_a_killed_run_resumes_with_the_same_samples_and_weights(resumed):
    root, killed, saved, _, output = resumed
    assert not (root / "killed" / "train.json").exists()
    assert saved["global_step"] == 12 and (saved["data"]["epoch"], saved["data"]["step"]) == (1, 2)
    assert "resumed from" in output and "at epoch 2, step 2" in output
    full, again = ranks_of(root / "full"), ranks_of(root / "resumed")
    for rank in (0, 1):
        tail = [batch for batch in full[rank]["batches"] if batch[0] > 12]
        assert again[rank]["batches"] == tail and len(tail) == 8
        assert again[rank]["params_sha256"] == full[rank]["params_sha256"]
    assert full[0]["params_sha256"] == full[1]["params_sha256"]
    doc, whole = json.loads((root / "resumed" / "train.json").read_text()), json.loads((root / "full" /
                                                                                         "train.json").read_text())
    timing = {"seconds", "read_seconds"}
    assert [e["epoch"] for e in doc["epochs"]] == [1, 2]
    assert {k: v for k, v in doc["epochs"][0].items() if k not in timing} == \
        {k: v for k, v in whole["epochs"][0].items() if k not in timing}
    assert doc["epochs"][1]["accuracy"] == whole["epochs"][1]["accuracy"]


@pytest.mark.slow
def test_resuming_mid_epoch_with_another_world_size_is_refused(resumed):
    _, _, _, refused, _ = resumed
    line = ("run.pt: data position: saved by 2 ranks at step 2 of epoch 1, this job has 1; resume mid-epoch with "
            "the same world size (a new world size can start at an epoch's start)")
    assert sum(line in text for text in refused.splitlines()) == 1, refused[-2000:]


def test_the_docs_show_the_measured_results():
    """docs/scale.md's block is benchmarks/two_nodes.py's rendering of results/scale/mnist/two_nodes.json."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("two_nodes", ROOT / "benchmarks" / "two_nodes.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    results = json.loads(bench.RESULTS.read_text())
    text = bench.DOC.read_text()
    assert f"{bench.BEGIN}\n{bench.render(results)}\n{bench.END}" in text
    for layout in results["layouts"]:  # what the page says of them holds
        assert all(node["train_bytes"] == 0 and node["test_bytes"] == 0 for node in layout["runs"]["warm"])
        cold = layout["runs"]["cold"]
        assert len({node["params_sha256"] for run in layout["runs"].values() for node in run}) == 1
        assert all(0 < node["train_bytes"] <= layout["train_bytes"] for node in cold)


@pytest.mark.parametrize("content, message", [
    (b"not a checkpoint", "not a readable checkpoint"),
    (None, "not a train checkpoint (expected keys"),
])
def test_a_bad_checkpoint_is_one_line(tmp_path, content, message):
    from pipeline.core.errors import InputError
    from pipeline.stages.train import Checkpoints

    path = tmp_path / "c.pt"
    if content is None:
        torch.save({"model": {}}, path)
    else:
        path.write_bytes(content)
    with pytest.raises(InputError, match=re.escape(f"c.pt: {message}")) as caught:
        Checkpoints(path, 1, resume=True).load(torch.device("cpu"))
    assert "\n" not in str(caught.value)
    assert Checkpoints(tmp_path / "none.pt", 1, resume=True).load(torch.device("cpu")) is None  # a fresh start
