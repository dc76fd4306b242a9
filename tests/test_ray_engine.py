"""`engine: ray` for the convert and shard stages, on a real Ray cluster of two nodes on
127.0.0.1 (ray.cluster_utils.Cluster: a head and a second node, one CPU each) and, for the
shard stage, input from S3 on a local moto server: the same bytes as the local engine, a
worker killed mid-task retried to the same output, a part that never arrives one line."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import PARAMS, ROOT, make_split, tiny_dataset

from pipeline.core.errors import DataError, InputError
from pipeline.stages.convert.stage import convert_dataset
from pipeline.stages.csvdata import write_csv
from pipeline.stages.ray_cluster import PartLost
from pipeline.stages.shard.ray import check_reads, shard_dataset_ray
from pipeline.stages.shard.settings import ShardSettings
from pipeline.stages.shard.source import label_digests, plan_blocks, split_digests, write_block
from pipeline.stages.shard.stage import shard_dataset, stream_split

ROWS = {"train": 601, "test": 130}
NODE = {"num_cpus": 1, "object_store_memory": 200 << 20}


def tree(folder: Path) -> dict[str, str]:
    """{relative path: sha256} of every file under `folder`."""
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def s3():
    """moto's S3 in server mode on 127.0.0.1, one bucket; its environment is set in this
    process before the cluster starts, so every Ray worker reads the same store."""
    moto_server = pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    import boto3

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{server.get_host_and_port()[1]}",
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"]).create_bucket(Bucket="data")
    yield env
    for key, value in saved.items():
        os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)
    server.stop()


@pytest.fixture(scope="module")
def cluster(s3):
    """A head and a second node on 127.0.0.1, one CPU each; this process joined to it. The
    test module is pickled by value, so the hooks below run in the workers."""
    ray = pytest.importorskip(
        "ray",
        reason="Ray is not installed (the [ray] extra: pip install -e '.[ray]'); the Ray engine's cluster tests skip",
    )
    from ray.cluster_utils import Cluster

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    nodes = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False})
    nodes.add_node(**NODE)
    nodes.wait_for_nodes()
    ray.init(address=nodes.address, log_to_driver=False, logging_level="WARNING")
    yield nodes
    ray.shutdown()
    nodes.shutdown()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A tiny data set's CSVs and its local engine's Parquet (zstd-3, row groups of 100),
    and a sources file pinning it."""
    root = tmp_path_factory.mktemp("data")
    tiny = tiny_dataset(ROWS["train"], ROWS["test"], seed=3)
    for split in ROWS:
        write_csv(tiny.arrays[f"{split}_images"], tiny.arrays[f"{split}_labels"], root / "csv" / f"{split}.csv")
    convert_dataset(root / "csv", root / "pq", root / "fig.json", "zstd-3", row_group_rows=100)
    (root / "sources.yaml").write_text(yaml.safe_dump({"tiny": {"rows": ROWS, "files": tiny.files}}))
    return root


def inverted(data: Path, out: Path) -> Path:
    """The data set's train split again with the same labels and every image inverted
    (255 - x): what a source replaced between two reads holds."""
    tiny = tiny_dataset(ROWS["train"], ROWS["test"], seed=3)
    for split in ROWS:
        images = tiny.arrays[f"{split}_images"]
        write_csv(
            255 - images if split == "train" else images, tiny.arrays[f"{split}_labels"], out / "csv" / f"{split}.csv"
        )
    convert_dataset(out / "csv", out / "pq", out / "fig.json", "zstd-3", row_group_rows=100)
    return out / "pq" / "compact" / "train.parquet"


def test_writers_that_read_other_samples_than_the_digest_pass_are_refused(data, tmp_path):
    """The Ray engine's check, run without Ray: each writer's digest of the samples it wrote
    against the digest pass's of the same block. Equal on one file; a source replaced with
    other images (the same labels) between the reads is refused, naming the first block."""
    source = data / "pq" / "compact" / "train.parquet"
    total, blocks = plan_blocks(source, 25)
    layout = ShardSettings(25, "none", 3)
    common = {"total": total, "dataset": "tiny", "split": "train", "layout": layout}
    written = [write_block(source, tmp_path / "parts", block, **common) for block in blocks]
    labels = label_digests(source)[1].hexdigest()
    same = split_digests(source, blocks=blocks)
    check_reads(source, blocks, written, same.pop("blocks"), labels, same)
    other = split_digests(inverted(data, tmp_path / "other"), blocks=blocks)
    with pytest.raises(DataError, match=r"train.parquet: changed while it was read \(samples 0.. differ between two"):
        check_reads(source, blocks, written, other.pop("blocks"), labels, other)
    with pytest.raises(DataError, match=r"changed while it was read \(its labels differ"):
        check_reads(source, blocks, written, written, "0" * 64, same)


def test_the_local_engine_refuses_labels_that_changed_between_its_two_reads(data, tmp_path, monkeypatch):
    """stream_split reads the labels first (the pins, the digest's start), then the samples it
    writes; labels of another file in the first read stand for a source replaced between."""
    import pipeline.stages.shard.stage as stage

    other = tiny_dataset(ROWS["train"], ROWS["test"], seed=4)
    write_csv(other.arrays["train_images"], other.arrays["train_labels"], tmp_path / "csv" / "train.csv")
    write_csv(other.arrays["test_images"], other.arrays["test_labels"], tmp_path / "csv" / "test.csv")
    convert_dataset(tmp_path / "csv", tmp_path / "pq", tmp_path / "fig.json", "zstd-3", row_group_rows=100)
    first_read = label_digests(tmp_path / "pq" / "compact" / "train.parquet")
    monkeypatch.setattr(stage, "label_digests", lambda source, rows=None: first_read)
    source = data / "pq" / "compact" / "train.parquet"
    with pytest.raises(DataError, match=r"train.parquet: changed while it was read \(its labels differ"):
        stream_split(source, tmp_path / "out", dataset="tiny", split="train", layout=ShardSettings(25, "none", 3))


def local_shards(data: Path, out: Path, layout: str = "compact", **settings) -> dict[str, str]:
    options = {"samples_per_shard": 25, "compression": "none", "level": 3, **settings}
    shard_dataset(data / "pq" / layout, out, "tiny", ShardSettings(**options), rows=ROWS)
    return tree(out)


@pytest.mark.slow
@pytest.mark.parametrize("layout, compression", [("compact", "none"), ("wide", "zstd")])
def test_ray_shards_are_the_local_engines_bytes(cluster, data, tmp_path, layout, compression):
    """Both splits, shards and manifests, byte for byte, from blocks written on two nodes."""
    expected = local_shards(data, tmp_path / "local", layout, compression=compression)
    shard_dataset(data / "pq" / layout, tmp_path / "ray", "tiny", ShardSettings(25, compression, 3, "ray"), rows=ROWS)
    assert tree(tmp_path / "ray") == expected
    assert len([name for name in expected if name.startswith("train/shard-")]) == 25


@pytest.mark.slow
def test_ray_reads_the_split_from_s3(cluster, data, s3, tmp_path):
    """The Parquet folder on S3 (moto): every task reads its blocks from the store."""
    import boto3

    client = boto3.client("s3", endpoint_url=s3["AWS_ENDPOINT_URL"])
    folder = data / "pq"
    for path in [folder / "SHA256SUMS", *sorted((folder / "compact").glob("*.parquet"))]:
        client.put_object(Bucket="data", Key=f"pq/{path.relative_to(folder).as_posix()}", Body=path.read_bytes())
    expected = local_shards(data, tmp_path / "local")
    shard_dataset_ray("s3://data/pq/compact", tmp_path / "ray", "tiny", ShardSettings(25, "none", 3), rows=ROWS)
    assert tree(tmp_path / "ray") == expected
    # One byte changed in the store: refused against SHA256SUMS before any task runs.
    damaged = bytearray((folder / "compact" / "train.parquet").read_bytes())
    damaged[len(damaged) // 2] ^= 1
    client.put_object(Bucket="data", Key="pq/compact/train.parquet", Body=bytes(damaged))
    with pytest.raises(DataError, match=r"^s3://data/pq/compact/train.parquet: checksum mismatch: SHA256SUMS says "):
        shard_dataset_ray("s3://data/pq/compact", tmp_path / "again", "tiny", ShardSettings(25, "none", 3), rows=ROWS)
    assert not (tmp_path / "again").exists()


def kill_once(marker: str):
    """A hook that kills its own worker (SIGKILL) the first time any task has written a shard."""

    def hook(first: int, written: int) -> None:
        if written >= 25:
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


def kill_always(first: int, written: int) -> None:
    """A hook that kills the worker writing the part from sample 200 on every try."""
    if first == 200:
        os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.slow
def test_a_worker_killed_mid_task_is_retried_to_the_same_shards(cluster, data, tmp_path):
    expected = local_shards(data, tmp_path / "local")
    marker = tmp_path / "killed"
    shard_dataset_ray(
        data / "pq" / "compact",
        tmp_path / "ray",
        "tiny",
        ShardSettings(25, "none", 3),
        rows=ROWS,
        hook=kill_once(str(marker)),
    )
    assert marker.exists(), "no worker was killed"
    assert tree(tmp_path / "ray") == expected


@pytest.mark.slow
def test_a_part_that_never_arrives_is_one_line_and_no_split(cluster, data, tmp_path):
    out = tmp_path / "ray"
    with pytest.raises(PartLost) as err:
        shard_dataset_ray(
            data / "pq" / "compact", out, "tiny", ShardSettings(25, "none", 3), rows=ROWS, hook=kill_always
        )
    message = str(err.value)
    assert "\n" not in message
    assert "the part from sample 200 (100 samples) never arrived" in message
    assert "nothing was merged or published" in message
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == []  # no temporary folder left beside it


def params_with(folder: Path, **engines: str) -> Path:
    params = yaml.safe_load(PARAMS.read_text())
    for stage, engine in engines.items():
        params[stage]["engine"] = engine
    params["shard"]["samples_per_shard"] = 25
    path = folder / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        timeout=300,
    )


@pytest.mark.slow
def test_the_shard_command_joins_the_cluster_of_ray_address(cluster, data, tmp_path):
    expected = local_shards(data, tmp_path / "local")
    params = params_with(tmp_path, shard="ray")
    common = ["--sources", str(data / "sources.yaml"), "--params", str(params)]
    done = cli(
        ["shard", "tiny", "--parquet", str(data / "pq" / "compact"), "--out", str(tmp_path / "ray"), *common],
        {"RAY_ADDRESS": cluster.address},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "(engine: ray)" in done.stderr
    assert tree(tmp_path / "ray") == expected
    # A split of another data set's samples: one line, exit 2, as the local engine says it.
    other = tiny_dataset(ROWS["train"], ROWS["test"], seed=4).files
    (tmp_path / "other.yaml").write_text(yaml.safe_dump({"tiny": {"rows": ROWS, "files": other}}))
    done = cli(
        [
            "shard",
            "tiny",
            "--parquet",
            str(data / "pq" / "compact"),
            "--out",
            str(tmp_path / "bad"),
            "--sources",
            str(tmp_path / "other.yaml"),
            "--params",
            str(params),
        ],
        {"RAY_ADDRESS": cluster.address},
    )
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "not tiny's train labels" in errors[0], done.stderr[-3000:]
    assert "Traceback" not in done.stderr and not (tmp_path / "bad").exists()


def test_a_url_with_the_local_engine_is_one_line(data, tmp_path):
    params = params_with(tmp_path)
    done = cli(
        [
            "shard",
            "tiny",
            "--parquet",
            "s3://data/pq/compact",
            "--out",
            str(tmp_path / "o"),
            "--sources",
            str(data / "sources.yaml"),
            "--params",
            str(params),
        ],
        {},
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "Error: s3://data/pq/compact: a URL is read by shard.engine ray only; copy it to a folder, or set "
        "shard.engine: ray"
    ]


def test_without_ray_the_engine_is_refused_in_one_line(monkeypatch):
    """Where the extra is not installed: the settings and the stage each say how to get it."""
    from pipeline.core.params import ParamsError, validated
    from pipeline.stages.ray_cluster import ray_module

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(
        InputError,
        match=r"engine: ray needs Ray, which is not installed: pip install "
        r"'trainpath\[ray\]'",
    ):
        ray_module()
    section = {"samples_per_shard": 25, "compression": "none", "level": 3}
    with pytest.raises(ParamsError, match="shard.engine: engine ray needs Ray"):
        validated(ShardSettings, {**section, "engine": "ray"}, "shard", Path("params.yaml"))
    assert validated(ShardSettings, section, "shard", Path("params.yaml")).engine == "local"


# --- convert ----------------------------------------------------------------------------------


def column_chunks(path: Path) -> list[tuple]:
    """(row group, column, codec, rows, encodings) of every column chunk of a Parquet file."""
    meta = pq.ParquetFile(path).metadata
    return [
        (
            g,
            meta.row_group(g).column(c).path_in_schema,
            meta.row_group(g).column(c).compression,
            meta.row_group(g).column(c).num_values,
            meta.row_group(g).column(c).encodings,
        )
        for g in range(meta.num_row_groups)
        for c in range(meta.num_columns)
    ]


@pytest.mark.slow
@pytest.mark.parametrize("codec", ["zstd-3", "snappy"])
def test_ray_convert_writes_the_local_engines_parquet(cluster, data, tmp_path, monkeypatch, codec):
    """Blocks of a few lines each (so that many tasks on both nodes parse the split): the
    same schema, rows, values and codec of every column chunk, and for the compact layout the
    same bytes; SHA256SUMS as locally."""
    monkeypatch.setattr("pipeline.stages.convert.ray.BLOCK_BYTES", 20_000)
    from pipeline.stages.convert.ray import plan_ranges

    assert len(plan_ranges(data / "csv" / "train.csv", 20_000)) > 40
    convert_dataset(data / "csv", tmp_path / "local", tmp_path / "local.json", codec, row_group_rows=100)
    figures = convert_dataset(
        data / "csv", tmp_path / "ray", tmp_path / "ray.json", codec, row_group_rows=100, rows=ROWS, engine="ray"
    )
    assert figures["train"]["rows"] == ROWS["train"]
    for layout in ("compact", "wide"):
        for split in ROWS:
            local, remote = (tmp_path / side / layout / f"{split}.parquet" for side in ("local", "ray"))
            assert pq.read_schema(remote) == pq.read_schema(local)
            assert pq.read_table(remote).equals(pq.read_table(local))
            assert column_chunks(remote) == column_chunks(local)
            assert {chunk[2] for chunk in column_chunks(remote)} == {codec.split("-")[0].upper()}
    assert (tmp_path / "ray" / "SHA256SUMS").read_text() == (tmp_path / "local" / "SHA256SUMS").read_text()
    images, labels = make_split(ROWS["train"], 3)
    table = pq.read_table(tmp_path / "ray" / "compact" / "train.parquet")
    assert np.array_equal(table.column("label").to_numpy(), labels)
    assert table.column("image").combine_chunks().buffers()[1].to_pybytes()[: images.size] == images.tobytes()


@pytest.mark.slow
def test_ray_convert_names_a_bad_line_as_the_local_engine(cluster, data, tmp_path, monkeypatch):
    """A value out of range deep in the file: the local engine's one line (file, line,
    column), and no Parquet."""
    monkeypatch.setattr("pipeline.stages.convert.ray.BLOCK_BYTES", 20_000)
    csv = tmp_path / "csv"
    csv.mkdir()
    for split in ROWS:
        (csv / f"{split}.csv").write_bytes((data / "csv" / f"{split}.csv").read_bytes())
    lines = (csv / "train.csv").read_bytes().split(b"\n")
    lines[400] = lines[400].rsplit(b",", 1)[0] + b",256"  # line 401's last pixel
    (csv / "train.csv").write_bytes(b"\n".join(lines))
    with pytest.raises(DataError) as local:
        convert_dataset(csv, tmp_path / "local", tmp_path / "l.json", "zstd-3", row_group_rows=100)
    with pytest.raises(DataError) as remote:
        convert_dataset(csv, tmp_path / "ray", tmp_path / "r.json", "zstd-3", row_group_rows=100, engine="ray")
    assert str(remote.value) == str(local.value)
    assert "line 401, column 'pixel784': 256 is outside 0..255" in str(remote.value)
    assert not (tmp_path / "ray").exists()


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["link out of the folder", "blanks after the last newline"])
def test_ray_convert_refuses_what_the_local_engine_refuses(cluster, data, tmp_path, fault):
    """The engines read the same files: a link leading out of the CSV folder (the Ray tasks
    opened it with a plain open) and a file ending in blanks give the local engine's line."""
    csv = tmp_path / "csv"
    csv.mkdir()
    (csv / "test.csv").write_bytes((data / "csv" / "test.csv").read_bytes())
    if fault.startswith("link"):
        (csv / "train.csv").symlink_to(data / "csv" / "train.csv")
    else:
        (csv / "train.csv").write_bytes((data / "csv" / "train.csv").read_bytes() + b"  ")
    with pytest.raises(InputError) as local:
        convert_dataset(csv, tmp_path / "local", tmp_path / "l.json", "zstd-3", row_group_rows=100)
    with pytest.raises(InputError) as remote:
        convert_dataset(csv, tmp_path / "ray", tmp_path / "r.json", "zstd-3", row_group_rows=100, engine="ray")
    assert str(remote.value) == str(local.value)
    assert str(local.value).startswith(str(csv / "train.csv"))
    assert not (tmp_path / "ray").exists()


@pytest.mark.slow
def test_the_convert_command_runs_on_the_cluster_of_ray_address(cluster, data, tmp_path):
    params = params_with(tmp_path, convert="ray")
    done = cli(
        [
            "convert",
            "tiny",
            "zstd-3",
            "--csv",
            str(data / "csv"),
            "--out",
            str(tmp_path / "ray"),
            "--figures",
            str(tmp_path / "f.json"),
            "--sources",
            str(data / "sources.yaml"),
            "--params",
            str(params),
        ],
        {"RAY_ADDRESS": cluster.address},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    convert_dataset(
        data / "csv",
        tmp_path / "local",
        tmp_path / "l.json",
        "zstd-3",
        row_group_rows=yaml.safe_load(params.read_text())["convert"]["row_group_rows"],
    )
    assert tree(tmp_path / "ray") == tree(tmp_path / "local")  # compact and wide: the same bytes


@pytest.mark.slow
def test_an_engine_switch_reruns_nothing_and_a_forced_ray_run_keeps_the_outputs(cluster, tmp_path):
    """Under DVC: switching both stages to Ray reruns the params check alone; forcing the shard
    and convert stages to run on the cluster leaves their outputs' hashes in dvc.lock as the
    local engine wrote them."""
    from conftest import dvc_repo, run

    root, env = dvc_repo(tmp_path / "repo", ["tiny"])
    dvc = [sys.executable, "-m", "dvc"]
    run([*dvc, "repro", "shard@tiny"], root, env)

    def outs() -> dict:
        lock = yaml.safe_load((root / "dvc.lock").read_text())["stages"]
        return {
            name: [
                (o["path"], o["md5"]) for o in lock[name]["outs"] if not o["path"].startswith("metrics/")
            ]  # (this run's timings: git metrics)
            for name in ("shard@tiny", "convert@tiny-zstd-3")
        }

    before = outs()
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["shard"]["engine"] = params["convert"]["engine"] = "ray"
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    said = run([*dvc, "repro", "shard@tiny"], root, env).stdout
    assert [line for line in said.splitlines() if line.startswith("Running stage")] == ["Running stage 'params':"]
    done = run(
        [*dvc, "repro", "-f", "-s", "shard@tiny", "convert@tiny-zstd-3"], root, {**env, "RAY_ADDRESS": cluster.address}
    )
    said = done.stdout + done.stderr
    assert said.count("(engine: ray)") == 4 and "train.csv: parsed by Ray tasks on 2 CPUs" in said, said
    assert outs() == before


# --- joining a cluster: every wait bounded -------------------------------------------------------


def convert_and_shard(data: Path, tmp_path: Path) -> list[list[str]]:
    """The convert and shard commands on the Ray engine, writing under `tmp_path`."""
    params = params_with(tmp_path, convert="ray", shard="ray")
    common = ["--sources", str(data / "sources.yaml"), "--params", str(params)]
    return [
        [
            "convert",
            "tiny",
            "zstd-3",
            "--csv",
            str(data / "csv"),
            "--out",
            str(tmp_path / "pq"),
            "--figures",
            str(tmp_path / "f.json"),
            *common,
        ],
        ["shard", "tiny", "--parquet", str(data / "pq" / "compact"), "--out", str(tmp_path / "shards"), *common],
    ]


def written(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir() if p.name != "params.yaml")


def test_a_ray_address_where_nothing_listens_is_one_line_at_once(data, tmp_path):
    """A closed port (Ray's own join retried for minutes there, holding off Ctrl-C and
    SIGTERM, and never said the project's line): one line, exit status 2, nothing written,
    before any deadline."""
    pytest.importorskip("ray")
    from conftest import free_port

    from pipeline.stages.ray_cluster import CONNECT_S

    address = f"127.0.0.1:{free_port()}"
    for args in convert_and_shard(data, tmp_path):
        start = time.monotonic()
        done = cli(args, {"RAY_ADDRESS": address})
        waited = time.monotonic() - start
        assert done.returncode == 2, done.stderr[-3000:]
        assert done.stderr.splitlines() == [
            f"Error: RAY_ADDRESS={address}: no Ray cluster to join there ([Errno 111] Connection refused)"
        ], done.stderr[-3000:]
        assert waited < CONNECT_S + 30, waited  # a bound on the wait, not a speed: no deadline was reached
        assert written(tmp_path) == []


@pytest.fixture
def silent_port():
    """A port on 127.0.0.1 that accepts TCP connections and never says a word: no Ray there."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held = []

    def accept() -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield server.getsockname()[1]
    server.close()
    for connection in held:
        connection.close()


@pytest.mark.slow
def test_a_ray_address_that_never_answers_ends_at_the_deadline(data, tmp_path, silent_port):
    """Something listens, but no Ray: the join is given up at PIPELINE_RAY_CONNECT_S with the
    project's one line, the last on stderr (Ray's native retries before it are Ray's)."""
    pytest.importorskip("ray")
    address, deadline = f"127.0.0.1:{silent_port}", 5
    for args in convert_and_shard(data, tmp_path):
        start = time.monotonic()
        done = cli(args, {"RAY_ADDRESS": address, "PIPELINE_RAY_CONNECT_S": str(deadline)})
        waited = time.monotonic() - start
        assert done.returncode == 2, done.stderr[-3000:]
        errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
        assert errors == [
            f"Error: RAY_ADDRESS={address}: no Ray cluster to join there (no answer within {deadline} "
            f"s, PIPELINE_RAY_CONNECT_S); is a Ray head listening at that address?"
        ], done.stderr[-3000:]
        assert done.stderr.splitlines()[-1] == errors[0] and "Traceback" not in done.stderr, done.stderr[-3000:]
        assert waited < deadline + 30, waited  # a bound on the wait: the deadline held
        assert written(tmp_path) == []


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_and_sigterm_end_the_wait_for_a_cluster_at_once(data, tmp_path, silent_port, sig):
    """While Ray tries to join (for minutes, in native code: SIGINT and SIGTERM waited about
    42 s), either signal ends the command at once, nothing written."""
    pytest.importorskip("ray")
    args = convert_and_shard(data, tmp_path)[0]
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", *args],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "RAY_ADDRESS": f"127.0.0.1:{silent_port}"},
    )
    try:
        said = ""
        while "joining its Ray cluster" not in said and (line := proc.stderr.readline()):
            said += line  # until the join has begun
        assert "joining its Ray cluster" in said, said
        time.sleep(1)  # inside Ray's join
        proc.send_signal(sig)
        proc.wait(timeout=10)  # a bound on the wait (the join alone retries for minutes)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr.read()
    assert written(tmp_path) == []


def test_the_join_deadline_is_seconds_or_one_line(monkeypatch):
    from pipeline.stages.ray_cluster import CONNECT_S, connect_deadline

    monkeypatch.delenv("PIPELINE_RAY_CONNECT_S", raising=False)
    assert connect_deadline() == CONNECT_S
    monkeypatch.setenv("PIPELINE_RAY_CONNECT_S", "2.5")
    assert connect_deadline() == 2.5
    for bad in ("0", "-1", "nan", "inf", "1e9", "soon"):
        monkeypatch.setenv("PIPELINE_RAY_CONNECT_S", bad)
        with pytest.raises(
            InputError,
            match=r"^PIPELINE_RAY_CONNECT_S='.*': expected the seconds joining a Ray "
            r"cluster may take, a number in \(0, 3600\]$",
        ):
            connect_deadline()


def sleep_at_0(first: int, written: int) -> None:
    """A hook that holds the task writing the first part far past any deadline: the first
    result waited for, so no other part, however slow a busy host makes it, is named instead."""
    if first == 0:
        time.sleep(600)


@pytest.mark.slow
def test_a_task_that_never_answers_is_one_line_at_its_deadline(cluster, data, tmp_path, monkeypatch):
    monkeypatch.setattr("pipeline.stages.ray_cluster.TASK_S", 5)
    out = tmp_path / "ray"
    start = time.monotonic()
    with pytest.raises(PartLost) as err:
        shard_dataset_ray(
            data / "pq" / "compact", out, "tiny", ShardSettings(25, "none", 3), rows=ROWS, hook=sleep_at_0
        )
    assert time.monotonic() - start < 5 + 120  # a bound on the wait: the task's deadline, then its cancel
    assert "\n" not in str(err.value)
    assert str(err.value).endswith(
        ": the part from sample 0 (100 samples) never arrived: no result within 5 s (the "
        "task is stuck, or the cluster answers no more); nothing was merged or published"
    )
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == []  # no temporary folder left beside it
