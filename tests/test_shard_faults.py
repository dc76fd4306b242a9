"""Faults under a reader become one line naming the file (a shard truncated while mapped, a
shard it may not read, a shard replaced since it was verified), a split of more shards than
the descriptor limit reads, and every process reads through the same bounded maps."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from pipeline.shards import Field, Sample, ShardDataset, ShardError, write_split
from pipeline.shards.mapped import MappedSplit

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = Sample((Field("x", "float32", (64,)), Field("y", "int64", ())))


def write(folder: Path, n: int, per_shard: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    data = {"x": rng.standard_normal((n, 64), dtype=np.float32), "y": np.arange(n, dtype=np.int64) + seed * n}
    write_split(data, folder, sample=SAMPLE, dataset="d", split="train", samples_per_shard=per_shard)
    return data


def _run(code: str, *args: str, **options) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter (a fault that kills a process must not kill pytest),
    InputErrors printed as the CLI prints them: one line, exit status 2."""
    wrapped = (
        "import sys\nfrom pipeline.core.errors import InputError\ntry:\n"
        + "".join(f"    {line}\n" for line in code.strip().splitlines())
        + "except InputError as err:\n    print(err, file=sys.stderr)\n    sys.exit(2)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", wrapped, *args], cwd=ROOT, capture_output=True, text=True, timeout=300, **options
    )


TRUNCATE = """
import os
from pathlib import Path
from pipeline.shards import ShardDataset
data = ShardDataset(sys.argv[1])
data.batch([0, 1])                                   # shard 0 mapped, its first block verified
os.truncate(Path(sys.argv[1]) / "shard-00000.safetensors", 4096)
data.batch([1, 2])                                   # through the map: SIGBUS, unless checked first
print("read")
"""


def test_a_shard_truncated_while_mapped_is_one_line_not_sigbus(tmp_path):
    write(tmp_path / "s", 64, 32)
    run = _run(TRUNCATE, str(tmp_path / "s"))
    assert run.returncode == 2, (run.returncode, run.stderr[-2000:])
    assert run.stderr.count("\n") == 1 and "shard-00000.safetensors: 4,096 bytes now, manifest says" in run.stderr


def test_a_shard_replaced_after_its_map_was_closed_is_refused(tmp_path):
    """With one map open at a time, shard 0's map is closed when shard 1 is read; a file put
    in shard 0's place since is another file than the one verified: refused by name."""
    data = write(tmp_path / "s", 64, 32)
    write(tmp_path / "t", 64, 32, seed=1)
    split = MappedSplit(tmp_path / "s", max_open=1, verify="none")
    assert split.take([0])["y"].tolist() == [0]
    assert split.take([40])["y"].tolist() == [40]
    assert split.shards[0].mapped is None  # closed: one map open
    assert split.take([1])["y"].tolist() == [1]  # mapped again: the same file
    split.take([40])
    os.replace(tmp_path / "t" / "shard-00000.safetensors", tmp_path / "s" / "shard-00000.safetensors")
    with pytest.raises(
        ShardError,
        match=r"shard-00000.safetensors: another file than the one this process "
        r"verified",
    ):
        split.take([2])
    np.testing.assert_array_equal(split.take([41])["x"], data["x"][[41]])


def _nobody() -> int | None:
    import pwd

    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        return None


UNREADABLE = """
import os
from pipeline.shards import ShardDataset
if len(sys.argv) > 2:
    os.setgid(int(sys.argv[2]))
    os.setuid(int(sys.argv[2]))
data = ShardDataset(sys.argv[1])
data.batch([0])
data.batch([40])
"""


def test_a_shard_this_process_may_not_read_is_one_line(tmp_path):
    """Mode 000 on a shard: a ShardError naming it (root reads anything: there the reading
    process becomes `nobody` once its imports are done)."""
    as_root = os.geteuid() == 0
    uid = _nobody() if as_root else None
    if as_root and uid is None:
        pytest.skip("running as root with no user 'nobody' to read as")
    folder = Path(tempfile.mkdtemp(dir="/tmp" if as_root else tmp_path)) / "s"
    try:
        write(folder, 64, 32)
        for path in (folder.parent, folder, *folder.iterdir()):
            path.chmod(0o755 if path.is_dir() else 0o644)
        (folder / "shard-00001.safetensors").chmod(0)
        run = _run(UNREADABLE, str(folder), *([str(uid)] if as_root else []))
    finally:
        import shutil

        shutil.rmtree(folder.parent)
    assert run.returncode == 2, run.stderr[-2000:]
    assert run.stderr.count("\n") == 1, run.stderr
    assert "shard-00001.safetensors: cannot be opened (Permission denied)" in run.stderr, run.stderr


MANY = """
import resource
import numpy as np
from torch.utils.data import DataLoader
from pipeline.shards import ShardDataset
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
data = ShardDataset(sys.argv[1])
seen = [int(i) for _, y in data.loader(100, shuffle=True, seed=0) for i in y]
assert sorted(seen) == list(range(len(data))), "the loader's epoch"
seen = [int(i) for _, y in DataLoader(data, batch_size=100, shuffle=True, num_workers=2) for i in y]
assert sorted(seen) == list(range(len(data))), "a DataLoader's epoch, 2 workers"
print("epochs", len(seen))
"""


@pytest.mark.slow
def test_a_thousand_shard_split_reads_an_epoch_under_256_descriptors(tmp_path):
    """Every shard touched by every batch (a per-sample shuffle) of a 1,000-shard split, with
    at most 256 descriptors: the maps past the bound are closed, least recently used first."""
    write(tmp_path / "s", 2000, 2)
    run = _run(MANY, str(tmp_path / "s"))
    assert run.returncode == 0 and run.stdout == "epochs 2000\n", run.stderr[-2000:]


class Probe(ShardDataset):
    """A ShardDataset whose samples carry whether the reading process read them through maps
    (no shard of its holds a pread descriptor, every shard it touched has a map)."""

    def __getitems__(self, indices):
        samples = super().__getitems__(indices)
        shards = [shard for shard in self.split.shards if shard is not None]
        mapped = all(shard.fd is None for shard in shards) and any(shard.mapped is not None for shard in shards)
        return [(*sample, torch.tensor(mapped)) for sample in samples]


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_workers_read_through_maps_and_give_the_same_values_under_every_start_method(tmp_path, method):
    data = write(tmp_path / "s", 96, 32)
    dataset = Probe(tmp_path / "s")
    dataset.batch([0, 95])  # the parent has maps before its workers start
    loader = DataLoader(dataset, batch_size=16, num_workers=2, multiprocessing_context=method)
    xs, ys, through_maps = zip(*loader)
    assert all(bool(flag.all()) for flag in through_maps)
    np.testing.assert_array_equal(torch.cat(xs).numpy(), data["x"])
    np.testing.assert_array_equal(torch.cat(ys).numpy(), data["y"])
    batches = ShardDataset(tmp_path / "s").loader(
        16, shuffle=True, seed=2, num_workers=2, multiprocessing_context=method
    )
    got = torch.cat([y for _, y in batches])
    assert sorted(got.tolist()) == data["y"].tolist()


def test_pread_is_used_only_when_named(tmp_path):
    data = write(tmp_path / "s", 64, 32)
    named = MappedSplit(tmp_path / "s", pread=True)
    np.testing.assert_array_equal(named.take([5, 40])["x"], data["x"][[5, 40]])
    assert all(shard.fd is not None for shard in named.shards)
    plain = MappedSplit(tmp_path / "s", max_resident=0)
    np.testing.assert_array_equal(plain.take([5, 40])["x"], data["x"][[5, 40]])
    assert all(shard.fd is None and shard.mapped is None for shard in plain.shards)  # bounded: maps closed


@pytest.mark.parametrize("option, value", [("max_open", 0), ("max_open", 1.5), ("pread", "yes")])
def test_bad_bounds_are_refused(tmp_path, option, value):
    write(tmp_path / "s", 8, 8)
    with pytest.raises(ValueError, match=rf"{option} must be"):
        MappedSplit(tmp_path / "s", **{option: value})


def test_a_split_at_a_url_reads_past_its_bounds_after_its_cache_evicts(tmp_path):
    """At a URL, with one map open and a cache of two shards: a shard whose map was closed and
    whose copy the cache evicted is fetched (verified) again and read, not refused as a
    replaced file."""
    import uuid

    import fsspec

    data = write(tmp_path / "local", 96, 32)
    url = f"memory://faults-{uuid.uuid4().hex}/train"
    fs, root = fsspec.core.url_to_fs(url)
    for file in sorted((tmp_path / "local").iterdir()):
        fs.pipe_file(f"{root}/{file.name}", file.read_bytes())
    try:
        size = max(p.stat().st_size for p in (tmp_path / "local").glob("shard-*"))
        split = MappedSplit(url, cache=tmp_path / "cache", cache_bytes=2 * size + 100, max_open=1)
        for indices in ([0, 40, 70], [71, 1, 41], [2, 72, 42]):
            np.testing.assert_array_equal(split.take(indices)["y"], data["y"][indices])
    finally:
        fs.rm(root, recursive=True)


def test_a_folder_swapped_while_opened_closes_its_descriptor_once(tmp_path, monkeypatch):
    """The open is refused in one line, and the descriptor it took is closed then and only
    then: collecting the half-built object must not close a number another file now holds."""
    import gc
    import shutil

    from pipeline.shards import mapped

    write(tmp_path / "s", 64, 32)
    real = mapped.read_manifest

    def swapped(folder, *args, **kwargs):
        manifest = real(folder, *args, **kwargs)
        os.rename(folder, tmp_path / "old")
        shutil.copytree(tmp_path / "old", folder)  # a writer's new folder under the same name
        return manifest

    monkeypatch.setattr(mapped, "read_manifest", swapped)
    with pytest.raises(ShardError, match="replaced by a writer while being opened") as caught:
        MappedSplit(tmp_path / "s", verify="none")
    # the half-built object lives on in the traceback; the number it closed goes to another file
    victim = os.open(tmp_path / "old" / "manifest.json", os.O_RDONLY)
    try:
        del caught
        gc.collect()
        os.fstat(victim)  # still this file's: raises EBADF where the number was closed a second time
    finally:
        os.close(victim)


def test_a_store_that_refuses_the_connection_is_not_called_a_missing_split(tmp_path):
    """fsspec's HTTP store answers any failure with FileNotFoundError: a refused connection is
    said as one (its cause named), a missing manifest as missing; read_split, which reads a
    local folder, names the reader of a URL instead of mangling the URL as a path."""
    import socket

    from pipeline.shards import read_split

    with socket.socket() as probe:  # a port nothing listens on: bound, never listening
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}/train"
        with pytest.raises(ShardError, match=r"/train/manifest.json: cannot read \(ClientConnectorError: "):
            ShardDataset(url, cache=tmp_path / "cache")
    with pytest.raises(ShardError, match=r"^http://127.0.0.1:9/x: read_split reads a local folder; a split at a URL"):
        read_split("http://127.0.0.1:9/x")
