"""Small generated data sets and a real HTTP server on 127.0.0.1 for the tests."""

from __future__ import annotations

import gzip
import hashlib
import http.server
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from pipeline.stages.mnist import idx_bytes

ROOT = Path(__file__).resolve().parents[1]


def _committed_params() -> Path:
    """params.yaml as the repository commits it (`git show HEAD:params.yaml`), copied to a
    folder of the suite's own: an experiment (`dvc exp run -S ...`) changes the workspace's
    file, and the suite must not depend on what the workspace holds. Outside git, the
    workspace's file."""
    import atexit
    import shutil
    import subprocess
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="pipeline-tests-"))
    atexit.register(shutil.rmtree, folder, True)
    try:
        text = subprocess.run(
            ["git", "show", "HEAD:params.yaml"], cwd=ROOT, capture_output=True, text=True, check=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        text = (ROOT / "params.yaml").read_text()
    (folder / "params.yaml").write_text(text)
    return folder / "params.yaml"


PARAMS = _committed_params()  # every test's params, never the workspace's


@pytest.fixture(autouse=True, scope="session")
def _own_cache_folder(tmp_path_factory) -> Iterator[None]:
    """The budget's probe cache (`pipeline.budget.peak`) of this session, never the user's."""
    saved = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("cache"))
    yield
    if saved is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = saved


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` are skipped where torch sees no CUDA device, saying so."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (marked gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def bench_settings(**overrides):
    """The repository's params.yaml `bench` block, schema-checked, with `overrides`: tests
    state only what they change, and no default is written twice."""
    from pipeline.bench.settings import settings_from_params
    from pipeline.core.params import load_params

    return settings_from_params({**load_params(PARAMS)["bench"], **overrides})


IDX_NAMES = {
    "train_images": "train-images-idx3-ubyte.gz",
    "train_labels": "train-labels-idx1-ubyte.gz",
    "test_images": "t10k-images-idx3-ubyte.gz",
    "test_labels": "t10k-labels-idx1-ubyte.gz",
}


def make_split(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Images whose class is learnable: label k lights up a bright 7x7 block at place k."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n).astype(np.uint8)
    images = rng.integers(0, 60, (n, 28, 28)).astype(np.uint8)
    for i, k in enumerate(labels):
        r, c = divmod(int(k), 4)
        images[i, r * 7 : r * 7 + 7, c * 7 : c * 7 + 7] = 200 + (k * 5)
    images[:, 0, 0] = 255  # make sure the widest value occurs
    images[:, 0, 1] = 0
    return images, labels


@dataclass
class TinyDataset:
    """A generated data set as a mirror would publish it (gzip IDX) plus the params block."""

    arrays: dict[str, np.ndarray]
    blobs: dict[str, bytes]
    files: dict[str, dict[str, str]] = field(default_factory=dict)

    def write_mirror(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        for name, blob in self.blobs.items():
            (folder / name).write_bytes(blob)
        return folder


def tiny_dataset(n_train: int = 64, n_test: int = 32, seed: int = 0) -> TinyDataset:
    train, test = make_split(n_train, seed), make_split(n_test, seed + 1)
    arrays = {"train_images": train[0], "train_labels": train[1], "test_images": test[0], "test_labels": test[1]}
    blobs, files = {}, {}
    for role, array in arrays.items():
        raw = idx_bytes(array)
        name = IDX_NAMES[role]
        blobs[name] = gzip.compress(raw, mtime=0)
        files[role] = {"name": name, "sha256": hashlib.sha256(raw).hexdigest()}
    return TinyDataset(arrays=arrays, blobs=blobs, files=files)


@pytest.fixture
def tiny() -> TinyDataset:
    return tiny_dataset()


class FixtureServer(http.server.ThreadingHTTPServer):
    """Serves `routes`: path -> bytes, or -> (behaviour, bytes): 'stall', 'mute', 'no length',
    'truncate', 'cut once, no length' (half the body the first time), 'redirect loop'."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.routes: dict[str, bytes | str] = {}
        self.hits: dict[str, int] = {}
        self.agents: set[str] = set()
        self.fail_first: dict[str, int] = {}
        self.fail_status = 503  # what the first `fail_first[path]` requests get

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(http.server.BaseHTTPRequestHandler):
    server: FixtureServer

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        srv = self.server
        srv.hits[self.path] = srv.hits.get(self.path, 0) + 1
        srv.agents.add(self.headers.get("User-Agent", ""))
        if srv.fail_first.get(self.path, 0) >= srv.hits[self.path]:
            self.send_error(srv.fail_status, "try later")
            return
        body = srv.routes.get(self.path)
        if body is None:
            self.send_error(404, "Not Found")
            return
        if isinstance(body, tuple):  # (behaviour, payload)
            behaviour, payload = body
            if behaviour == "stall":
                self.send_response(200)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload[:10])
                self.wfile.flush()
                time.sleep(3)  # then the rest: a client without a timeout gets the whole file
                try:
                    self.wfile.write(payload[10:])
                except OSError:  # the client gave up
                    pass
                return
            if behaviour == "mute":  # accepts the connection, answers nothing for 3 s
                time.sleep(3)
                return
            if behaviour == "no length":  # HTTP/1.0 style: the body ends when the connection does
                self.send_response(200)
                self.end_headers()
                self.wfile.write(payload)
                self.close_connection = True
                return
            if behaviour == "cut once, no length":  # the connection closed early, once
                self.send_response(200)
                self.end_headers()
                self.wfile.write(payload[: len(payload) // 2] if srv.hits[self.path] == 1 else payload)
                self.close_connection = True
                return
            if behaviour == "redirect loop":
                self.send_response(302)
                self.send_header("Location", self.path)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if behaviour == "truncate":
                self.send_response(200)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload[: len(payload) // 2])
                self.wfile.flush()
                self.close_connection = True
                return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def pauses(monkeypatch) -> list[float]:
    """The retry pauses the fetch takes on this thread, recorded instead of slept. `time.sleep`
    is one function for the whole process: another thread's sleeps (a server's, a test
    runner's) still sleep and are not recorded."""
    taken: list[float] = []
    sleep, caller = time.sleep, threading.get_ident()

    def record(seconds: float) -> None:
        if threading.get_ident() == caller:
            taken.append(seconds)
        else:
            sleep(seconds)

    monkeypatch.setattr("pipeline.stages.fetch.stage.time.sleep", record)
    return taken


@pytest.fixture
def http_server() -> Iterator[FixtureServer]:
    server = FixtureServer()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def write_unchecked_split(folder: Path, images: np.ndarray, labels: np.ndarray) -> None:
    """One uncompressed shard and its manifest, written without ShardWriter's label check:
    what a foreign or hostile writer could produce."""
    import xxhash

    from pipeline.shards.format import BLOCK_BYTES, V2_SAMPLE, new_manifest, write_manifest
    from pipeline.shards.writer import shard_entry, shard_parts

    parts = shard_parts({"images": images, "labels": labels}, "none", 0, BLOCK_BYTES)
    blob = b"".join(parts)
    folder.mkdir(parents=True)
    (folder / "shard-00000.safetensors").write_bytes(blob)
    entry = shard_entry(
        "shard-00000.safetensors",
        len(labels),
        parts,
        hashlib.sha256(blob).hexdigest(),
        xxhash.xxh3_128_hexdigest(blob),
        BLOCK_BYTES,
    )
    write_manifest(
        folder,
        new_manifest(
            sample=V2_SAMPLE,
            dataset="tiny",
            split="train",
            count=len(labels),
            codec="none",
            level=0,
            source={},
            shards=[entry],
            block=BLOCK_BYTES,
        ),
    )


def write_shards(images, labels, folder: Path, **options) -> dict:
    """An image-classification split (images uint8 [n, 28, 28], labels 0..9) written by the
    library's `write_split` under MNIST's sample schema."""
    from pipeline.shards import write_split
    from pipeline.shards.format import V2_SAMPLE

    return write_split({"images": images, "labels": labels}, folder, sample=options.pop("sample", V2_SAMPLE), **options)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the system picks it): for torchrun's
    rendezvous and the test servers."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# ---------------------------------------------------------------- a real DVC repository


def run(cmd: list[str], cwd: Path, env: dict[str, str], check: bool = True):
    """A command's CompletedProcess (text); with `check`, a failure is an AssertionError
    that shows what it printed."""
    import subprocess

    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise AssertionError(f"{cmd} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def tiny_params(datasets: list[str]) -> dict:
    """The project's params.yaml with tiny data sets and settings small enough for a test."""
    import yaml

    params = yaml.safe_load(PARAMS.read_text())
    params["datasets"] = datasets
    params["convert"]["codecs"] = ["snappy", "zstd-3", "gzip", "none"]
    # the wiring, not the ladder: a sampled per-item rung, a full eager one, a static one
    # (tests/test_bench.py runs every rung)
    params["bench"].update(
        epochs=1,
        batch_size=32,
        num_workers=1,
        sample_steps=2,
        sample_epochs=2,
        variants=["naive", "device", "graphed"],
        sample=["naive"],
    )
    return params


def dvc_repo(root: Path, names: list[str]) -> tuple[Path, dict[str, str]]:
    """A git + DVC repository in `root` holding the project's pipeline on tiny generated data
    sets called `names` (served by a mirror folder beside it), committed; and an environment
    to run it in."""
    import os
    import shutil
    import sys

    import yaml

    shutil.copytree(ROOT / "pipeline", root / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "results", root / "results")
    shutil.copytree(ROOT / "tools", root / "tools", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("dvc.yaml", ".dvcignore", ".gitignore"):
        shutil.copy(ROOT / name, root / name)
    # The project's README embeds this repository's own outputs (results/dvc/...); the test
    # repository has other data sets, so it gets a README with one of the report's blocks.
    (root / "README.md").write_text("# test\n\n<!-- generated: headline -->\n<!-- /generated -->\n")
    mirror = root.parent / f"{root.name}-mirror"
    sources = {}
    for name, seed in zip(names, (0, 7)):
        data = tiny_dataset(seed=seed)
        data.write_mirror(mirror / name)
        sources[name] = {"rows": {"train": 64, "test": 32}, "files": data.files, "mirrors": []}
    (root / "sources.yaml").write_text(yaml.safe_dump(sources, sort_keys=False))
    (root / "params.yaml").write_text(yaml.safe_dump(tiny_params(list(sources)), sort_keys=False))
    env = {
        **os.environ,
        "PIPELINE_MIRROR": str(mirror),
        "DVC_NO_ANALYTICS": "1",
        "DVC_SITE_CACHE_DIR": str(root.parent / f"{root.name}-site-cache"),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    run(["git", "init", "-q", "-b", "main"], root, env)
    # .dvc without its cache, its temporaries and the user's config.local (their remotes)
    shutil.copytree(ROOT / ".dvc", root / ".dvc", ignore=shutil.ignore_patterns("tmp", "cache", "config.local"))
    # Its own cache, whatever cache the user's config names (`dvc cache dir` writes it into the
    # project's .dvc/config, or the global one): the local config outranks both.
    run([sys.executable, "-m", "dvc", "cache", "dir", "--local", str(root / ".dvc" / "cache")], root, env)
    run(["git", "add", "-A"], root, env)
    run(["git", "commit", "-qm", "init"], root, env)
    return root, env


# ---------------------------------------------------------------- the ladder's data on a device


def resident(n_train: int = 100, n_test: int = 50, seed: int = 0, device: str = "cpu"):
    """Both splits of a small learnable data set, resident on `device` (the bench's `Resident`)."""
    import torch

    from pipeline.bench.datapaths import Resident

    (x, y), (xt, yt) = make_split(n_train, seed), make_split(n_test, seed + 1)
    return Resident(*(torch.from_numpy(a).to(device) for a in (x, y, xt, yt)))


def device_path(data, batch: int, seed: int):
    """The `device` rung's data path over resident data: batches gathered where the data lie."""
    from pipeline.bench.datapaths import DataPath
    from pipeline.bench.model import MODEL_INPUT
    from pipeline.shards import DeviceBatches

    train = DeviceBatches(
        {"images": data.train_images, "labels": data.train_labels},
        batch,
        shuffle=True,
        seed=seed,
        transform=list(MODEL_INPUT),
    )
    test = DeviceBatches({"images": data.test_images, "labels": data.test_labels}, batch, transform=list(MODEL_INPUT))
    return DataPath(lambda: train, lambda: test, len(train), len(test), batch)
