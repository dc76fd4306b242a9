"""Bounded by design: every class of hostile input gets one line of error within a bound on
time and memory, and leaves the outputs as they were.

One section per class of the hostile-input review: (1) what an input can make a stage
allocate or write, (2) how long it can make a stage wait, (3) inputs no stage checked,
(4) numbers that reach generated files, (5) operating-system failures and shapes that were
tracebacks, (6) the smaller ones. Then property tests (hypothesis) for the three parsers
of bytes from outside: the CSV block parser, the IDX reader and the manifest check.

Peak memory is measured in a child process (`ru_maxrss` of a wrapper's one child), time
with a wall clock; each case takes a few seconds at most.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import http.server
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import zlib
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from conftest import PARAMS, tiny_dataset
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.core.atomic import atomic_dir, atomic_path
from pipeline.core.bounded import open_regular, read_json
from pipeline.core.dataset import CSV_LINE_MAX, CSV_ROW_MAX
from pipeline.core.errors import DataError, InputError
from pipeline.core.params import ParamsError, load_params
from pipeline.core.sources import SourcesError, known_rows
from pipeline.stages.convert.csvread import _parse_block as _REAL_PARSE_BLOCK  # taken before any test patches it
from pipeline.stages.convert.csvread import iter_csv
from pipeline.stages.convert.stage import convert_dataset
from pipeline.stages.csvdata import render_csvs, write_csv
from pipeline.stages.fetch.settings import FetchSettings
from pipeline.stages.fetch.stage import FetchError, fetch_dataset, load_sources
from pipeline.stages.mnist import IdxError, parse_idx, read_idx, read_raw_split, write_idx
from pipeline.stages.params import validate_params
from pipeline.stages.shard.settings import ShardSettings

ROOT = Path(__file__).resolve().parents[1]
ROWS = {"train": 64, "test": 32}  # tiny_dataset's splits
FAST = FetchSettings(timeout_s=1.0, retries=0, backoff_s=0.0, deadline_s=5.0)


def tree_digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


# A wrapper process runs the command as its one child and reports that child's peak RSS.
_WRAPPER = """
import json, resource, subprocess, sys
limits = json.loads(sys.argv[1])
def apply():
    for name, value in limits.items():
        resource.setrlimit(getattr(resource, name), (value, value))
result = subprocess.run(sys.argv[2:], capture_output=True, text=True, preexec_fn=apply)
sys.stderr.write(result.stderr)
print(json.dumps({"stdout": result.stdout, "peak_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
sys.exit(result.returncode)
"""


def cli(*args: str, limits: dict | None = None, env: dict | None = None, timeout: float = 60):
    """`python -m pipeline ARGS` in a child: (returncode, stderr, peak MiB, seconds)."""
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-c", _WRAPPER, json.dumps(limits or {}), sys.executable, "-m", "pipeline", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )
    seconds = time.perf_counter() - start
    report = json.loads(result.stdout.splitlines()[-1])
    return result.returncode, result.stderr, report["peak_kib"] / 1024, seconds


def one_line_error(stderr: str, *parts: str) -> None:
    """stderr ends with one line `Error: ...` holding `parts` (after any progress lines)."""
    assert "Traceback" not in stderr, stderr
    error = stderr[stderr.index("Error: ") :] if "Error: " in stderr else ""
    assert error.count("\n") == 1 and error.endswith("\n"), stderr
    for part in parts:
        assert part in error, stderr


@contextmanager
def within(seconds: float):
    """Fail (instead of hanging the suite) if the block takes longer: a FIFO opened for
    reading blocks until a writer comes, /dev/zero never ends."""

    def expire(*_):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    start = time.perf_counter()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert time.perf_counter() - start < seconds


@pytest.fixture
def tiny():
    return tiny_dataset()


@pytest.fixture
def files(tmp_path, tiny):
    """A params file (the repository's), a sources file pinning the tiny data set with its
    rows, and a mirror folder holding it: what the CLI commands below run on."""
    (tmp_path / "sources.yaml").write_text(yaml.safe_dump({"tiny": {"rows": ROWS, "files": tiny.files}}))
    (tmp_path / "params.yaml").write_text((PARAMS).read_text())
    tiny.write_mirror(tmp_path / "mirror" / "tiny")
    return tmp_path


def idx_header(*shape: int, code: int = 0x08) -> bytes:
    return bytes([0, 0, code, len(shape)]) + b"".join(d.to_bytes(4, "big") for d in shape)


def gzip_bomb(header: bytes, zeros: int) -> bytes:
    """`header` then `zeros` zero bytes, gzip -9: about a thousandth of the size."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    parts, block = [packer.compress(header)], bytes(1 << 22)
    for _ in range(zeros // len(block)):
        parts.append(packer.compress(block))
    return b"".join(parts) + packer.flush()


@pytest.fixture
def csv_dir(tmp_path, tiny):
    for split in ("train", "test"):
        write_csv(tiny.arrays[f"{split}_images"], tiny.arrays[f"{split}_labels"], tmp_path / "csv" / f"{split}.csv")
    return tmp_path / "csv"


@pytest.fixture
def parquet(csv_dir, tmp_path):
    convert_dataset(csv_dir, tmp_path / "pq", tmp_path / "f.json", "snappy", rows=ROWS)
    return tmp_path / "pq" / "compact"


@pytest.fixture
def shard_dir(tmp_path, tiny):
    from conftest import write_shards

    write_shards(
        tiny.arrays["train_images"],
        tiny.arrays["train_labels"],
        tmp_path / "split",
        dataset="tiny",
        split="train",
        samples_per_shard=24,
    )
    return tmp_path / "split"


# ---------------------------------------------------------------- 1. allocation and disk


def test_gzip_bomb_from_a_folder_mirror_stops_at_the_files_size(files, tiny):
    """64 MiB of zeros behind a valid header (65 KiB gzipped): decompressed only up to the
    size the rows fix (64 images: 50,192 bytes), in a few MiB of memory, and nothing written.
    (Sent as a larger file, it is refused by its size alone: at most the content's size plus
    gzip's overhead may arrive.)"""
    bomb = gzip_bomb(idx_header(64, 28, 28), 64 << 20)
    (files / "mirror" / "tiny" / "train-images-idx3-ubyte.gz").write_bytes(bomb)
    rc, err, peak_mib, seconds = cli(
        "fetch",
        "tiny",
        "--out",
        str(files / "raw"),
        "--sources",
        str(files / "sources.yaml"),
        "--params",
        str(files / "params.yaml"),
        env={"PIPELINE_MIRROR": str(files / "mirror")},
    )
    assert rc == 2 and "Traceback" not in err
    assert (
        err[err.index("Error: ") :].startswith(
            "Error: could not fetch train-images-idx3-ubyte.gz from any of 1 mirrors:\n  - "
        )
        and "content runs past 50,192 bytes" in err
    )
    assert peak_mib < 200 and seconds < 30, (peak_mib, seconds)
    assert not (files / "raw").exists() and not list(files.glob(".raw*"))


@pytest.mark.parametrize("pinned", [True, False])
def test_gzip_bomb_over_http_then_the_next_mirror(tmp_path, tiny, http_server, pinned):
    """Over HTTP too, and with no pin and no rows the IDX header's own size bounds it."""
    bomb = gzip_bomb(idx_header(64, 28, 28), 64 << 20)
    for name, blob in tiny.blobs.items():
        http_server.routes[f"/bomb/{name}"] = bomb if name.startswith("train-images") else blob
        http_server.routes[f"/good/{name}"] = blob
    files = {
        role: {**entry, "bytes": 16 + 64 * 784} if pinned and role == "train_images" else entry
        for role, entry in tiny.files.items()
    }
    with pytest.raises(FetchError, match=r"/bomb/train-images-idx3-ubyte.gz: content runs past 50,192 bytes"):
        fetch_dataset("tiny", files, [http_server.url + "/bomb"], tmp_path / "raw", FAST, env={})
    fetch_dataset("tiny", files, [http_server.url + "/bomb", http_server.url + "/good"], tmp_path / "raw", FAST, env={})
    assert http_server.hits["/bomb/train-images-idx3-ubyte.gz"] == 2  # once per run: not retried
    np.testing.assert_array_equal(read_idx(tmp_path / "raw" / "train-images.idx"), tiny.arrays["train_images"])


@pytest.mark.parametrize(
    "header, message",
    [
        (
            idx_header(3_000_000, 28, 28),
            r"IDX header says 3,000,000 samples \(shape \(3000000, 28, 28\)\); the data "
            r"set's train split has 64",
        ),
        (
            idx_header(64, 28, 28, 1 << 20),
            r"IDX header says shape \(64, 28, 28, 1048576\) \(52,613,349,396 bytes\), more "
            r"than this file has \(50,192 bytes\)",
        ),
        (bytes(16), r"not an IDX file: bad magic number 0x00000000"),
    ],
)
def test_idx_header_is_checked_as_soon_as_it_arrives(tmp_path, tiny, header, message):
    tiny.blobs["train-images-idx3-ubyte.gz"] = gzip.compress(header + bytes(1 << 20))
    tiny.write_mirror(tmp_path / "m")
    with pytest.raises(FetchError, match=message):
        fetch_dataset("tiny", tiny.files, [str(tmp_path / "m")], tmp_path / "raw", FAST, env={}, rows=ROWS)


def test_parquet_with_more_rows_than_the_data_set_is_refused_before_a_page(parquet, tmp_path, monkeypatch):
    """300,000 all-zero rows (a few hundred KB) with a matching SHA256SUMS: the shard stage
    refuses at the footer, without writing a shard (it wrote 93 shards, 2.3 GB, for 3M)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.core.parquet import IMAGE_TYPE, compact_table, write_checksums

    zeros = np.zeros((50_000, 784), np.uint8)
    path = parquet / "train.parquet"
    with pq.ParquetWriter(path, pa.schema([("label", pa.uint8()), ("image", IMAGE_TYPE)]), compression="zstd") as w:
        for _ in range(6):
            w.write_table(compact_table(zeros[:, 0], zeros))
    write_checksums(parquet.parent)
    from pipeline.stages.shard.stage import shard_dataset

    read = []  # refused from the footer's row count, before a single row is read
    monkeypatch.setattr(pq.ParquetFile, "iter_batches", lambda self, *a, **k: read.append(1) or iter(()))
    with pytest.raises(
        DataError,
        match=r"train.parquet: 300,000 rows, but the data set's split has 64 "
        r"\(sources.yaml rows\)",
    ):
        shard_dataset(parquet, tmp_path / "shards", "tiny", ShardSettings(20, "none", 3), rows=ROWS)
    assert read == [] and not (tmp_path / "shards").exists()


def test_nothing_is_said_of_a_split_that_a_later_failure_throws_away(parquet, tmp_path, capsys):
    """The shard stage writes train, then finds test wrong: neither is published, and no line
    claims train's shards; a whole run says both, once they are in place."""
    from pipeline.stages.shard.stage import shard_dataset

    with pytest.raises(DataError, match=r"test.parquet: 32 rows, but the data set's split has 33"):
        shard_dataset(parquet, tmp_path / "shards", "tiny", ShardSettings(20, "none", 3), rows={**ROWS, "test": 33})
    assert not (tmp_path / "shards").exists() and "shards," not in capsys.readouterr().err
    shard_dataset(parquet, tmp_path / "shards", "tiny", ShardSettings(20, "none", 3), rows=ROWS)
    said = capsys.readouterr().err.splitlines()
    assert [line.split(":")[0] for line in said] == [f"{tmp_path / 'shards'}/{split}" for split in ("train", "test")]


def test_csv_line_of_40_mb_is_refused_before_it_is_parsed(files, csv_dir):
    """One 40 MB line of `10,10,...`: refused by its length, in one block's memory (the
    parser given it took 4.85 GB)."""
    lines = (csv_dir / "train.csv").read_bytes().split(b"\n")
    lines[5] = b"10," * (40_000_000 // 3) + b"10"
    (csv_dir / "train.csv").write_bytes(b"\n".join(lines))
    rc, err, peak_mib, seconds = cli(
        "convert",
        "tiny",
        "snappy",
        "--csv",
        str(csv_dir),
        "--out",
        str(files / "pq"),
        "--figures",
        str(files / "f.json"),
        "--sources",
        str(files / "sources.yaml"),
        "--params",
        str(files / "params.yaml"),
    )
    assert rc == 2
    one_line_error(err, "train.csv: line 6: more than 3,141 bytes, longer than any row can be")
    assert peak_mib < 400 and seconds < 30, (peak_mib, seconds)
    assert not (files / "pq").exists() and not (files / "f.json").exists()


def test_line_without_a_newline_is_refused_past_a_rows_length(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes(write_header() + b"1," * (20 << 20))  # 40 MB, no line end at all
    with pytest.raises(DataError, match=r"t.csv: line 2: more than 3,141 bytes"):
        list(iter_csv(path, block_bytes=1 << 16))


def write_header() -> bytes:
    from pipeline.stages.csvdata import HEADER

    return HEADER.encode()


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda lines: lines + lines[1:3], r"more than 64 data rows \(line 66 is one too many\)"),
        (lambda lines: lines + [b""], r"more than 64 data rows \(line 66 is one too many, and blank\)"),
        (lambda lines: lines[:-3], r"61 data rows, but the data set's split has 64"),
        (lambda lines: lines[:5] + [b"1"] + lines[6:], r"line 6: 1 columns, expected 785"),
        (lambda lines: lines[:5] + [b""] + lines[6:], r"line 6: 1 columns, expected 785"),
    ],
)
def test_csv_rows_are_counted_against_the_data_set(csv_dir, tmp_path, edit, message):
    path = csv_dir / "train.csv"
    lines = path.read_bytes().split(b"\n")[:-1]
    path.write_bytes(b"\n".join(edit(lines)) + b"\n")
    with pytest.raises(DataError, match=message):
        convert_dataset(csv_dir, tmp_path / "pq2", tmp_path / "f2.json", "snappy", rows=ROWS)
    assert not (tmp_path / "pq2").exists()


def test_raw_idx_with_more_samples_than_the_data_set(tmp_path, tiny):
    raw = tmp_path / "raw"
    for split in ("train", "test"):
        write_idx(raw / f"{split}-images.idx", tiny.arrays[f"{split}_images"])
        write_idx(raw / f"{split}-labels.idx", tiny.arrays[f"{split}_labels"])
    with pytest.raises(
        IdxError,
        match=r"train-images.idx: header says shape \(64, 28, 28\) \(50,192 bytes\), more "
        r"than the 39,216 bytes this file can have",
    ):
        render_csvs(raw, tmp_path / "csv", rows={"train": 50, "test": 32})
    with pytest.raises(DataError, match=r"test-images.idx: 32 samples, but the data set's test split has 40"):
        read_raw_split(raw, "test", rows=40)
    assert not (tmp_path / "csv").exists()


@pytest.mark.parametrize(
    "value, ok", [(1, False), (1023, False), (1024, True), (1 << 20, True), ((1 << 20) + 1, False)]
)
def test_row_group_rows_has_a_floor_and_a_ceiling(value, ok):
    params = load_params(PARAMS)
    params["convert"]["row_group_rows"] = value
    if ok:
        validate_params(params)
    else:
        with pytest.raises(
            ParamsError,
            match=r"convert\.row_group_rows: Input should be (greater|less) than or "
            r"equal to (1024|1048576)",
        ):
            validate_params(params)


def _fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def _zero_link(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.symlink_to("/dev/zero")


SPECIAL = {
    "FIFO": (_fifo, r"a FIFO \(named pipe\), not a regular file"),
    "link to /dev/zero": (_zero_link, r"a link to /dev/zero, outside "),
}


@pytest.mark.parametrize("kind", list(SPECIAL))
def test_special_files_where_files_are_expected(kind, shard_dir, parquet, csv_dir, tmp_path, tiny):
    """A FIFO or a link to /dev/zero as manifest.json, SHA256SUMS, a raw IDX file or a CSV:
    refused at once, naming it (it hung, or read without end)."""
    from pipeline.core.parquet import verify_checksum
    from pipeline.shards import read_manifest

    make, message = SPECIAL[kind]
    raw = tmp_path / "raw"
    write_idx(raw / "train-images.idx", tiny.arrays["train_images"])
    write_idx(raw / "train-labels.idx", tiny.arrays["train_labels"])
    cases = [
        (shard_dir / "manifest.json", lambda: read_manifest(shard_dir)),
        (parquet.parent / "SHA256SUMS", lambda: verify_checksum(parquet / "train.parquet")),
        (raw / "train-images.idx", lambda: read_raw_split(raw, "train")),
        (csv_dir / "train.csv", lambda: list(iter_csv(csv_dir / "train.csv"))),
    ]
    for path, read in cases:
        make(path)
        with within(5), pytest.raises(InputError, match=rf"^{path}: {message}"):
            read()


@pytest.mark.parametrize(
    "kind, message",
    [
        ("FIFO", r"a FIFO \(named pipe\), not a regular file"),
        ("link to /dev/zero", r"a character device, not a regular file"),
    ],
)
def test_special_files_on_a_mirror(tmp_path, tiny, kind, message):
    """A mirror may link its files anywhere (their content is verified), but never to a
    device or a FIFO: that mirror is passed over, naming why."""
    tiny.write_mirror(tmp_path / "m")
    SPECIAL[kind][0](tmp_path / "m" / "train-labels-idx1-ubyte.gz")
    tiny.write_mirror(tmp_path / "good")
    with within(10):
        with pytest.raises(FetchError, match=rf"train-labels-idx1-ubyte.gz: {message}"):
            fetch_dataset("tiny", tiny.files, [str(tmp_path / "m")], tmp_path / "raw", FAST, env={})
        fetch_dataset("tiny", tiny.files, [str(tmp_path / "m"), str(tmp_path / "good")], tmp_path / "raw", FAST, env={})


def test_a_link_inside_its_folder_is_fine(shard_dir):
    from pipeline.shards import read_manifest

    (shard_dir / "manifest.json").rename(shard_dir / "manifest.real")
    (shard_dir / "manifest.json").symlink_to("manifest.real")
    assert read_manifest(shard_dir)["count"] == 64


def test_a_manifest_past_its_cap_is_refused_by_what_it_is(tmp_path):
    """A manifest.json larger than any manifest can be (a sparse file: nothing is written)
    is refused by name and kind, from its first MAX_MANIFEST + 1 bytes."""
    from pipeline.shards import read_manifest
    from pipeline.shards.format import MAX_MANIFEST

    with open(tmp_path / "manifest.json", "wb") as f:
        f.truncate(MAX_MANIFEST + 1)
    with pytest.raises(
        InputError,
        match=rf"^{re.escape(str(tmp_path / 'manifest.json'))}: {MAX_MANIFEST + 1:,} bytes or more, "
        rf"larger than any manifest can be \(at most {MAX_MANIFEST:,} bytes\)",
    ):
        read_manifest(tmp_path)


def test_read_capped_reads_no_more_than_its_cap(tmp_path):
    from pipeline.core.bounded import UnsafeFileError, read_capped

    (tmp_path / "big").write_bytes(bytes(1000))
    assert read_capped(tmp_path / "big", 1000) == bytes(1000)
    with pytest.raises(
        UnsafeFileError,
        match=r"big: 1,000 bytes or more, larger than any manifest can be \(at most "
        r"999 bytes\)",
    ):
        read_capped(tmp_path / "big", 999, "manifest")
    with pytest.raises(UnsafeFileError, match=r": a folder, not a regular file"):
        open_regular(tmp_path)


# ---------------------------------------------------------------- 2. time


class _Drip(http.server.BaseHTTPRequestHandler):
    """/drip/<name>: the train images one byte per 0.2 s, far below any read timeout (the
    other files whole); /split/<name>: the first byte alone, then the rest (a first read of
    one byte)."""

    blobs: dict[str, bytes] = {}

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        kind, name = self.path.strip("/").split("/", 1)
        body = self.blobs[name]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            if kind == "drip" and name.startswith("train-images"):
                for byte in body:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(0.2)
            elif kind == "drip":
                self.wfile.write(body)
            else:
                self.wfile.write(body[:1])
                self.wfile.flush()
                time.sleep(0.2)
                self.wfile.write(body[1:])
        except OSError:  # the client gave up
            pass


@pytest.fixture
def drip_server(tiny):
    _Drip.blobs = tiny.blobs
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Drip)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.slow  # several seconds: a deadline waited out
def test_slow_drip_mirror_is_given_up_at_the_deadline(tmp_path, tiny, drip_server):
    """One byte every 0.2 s never trips a 1 s read timeout; the deadline (1.5 s) ends it, and
    the next mirror serves the file."""
    tiny.write_mirror(tmp_path / "good")
    drip = FetchSettings(timeout_s=1.0, retries=2, backoff_s=0.1, deadline_s=1.5)
    start = time.perf_counter()
    with pytest.raises(
        FetchError,
        match=r"/drip/train-images-idx3-ubyte.gz: incomplete when its deadline passed "
        r"\(\d+ bytes received\): too slow \(fetch.deadline_s\)",
    ):
        fetch_dataset("tiny", tiny.files, [drip_server + "/drip"], tmp_path / "raw", drip, env={})
    assert time.perf_counter() - start < 1.5 + 1.0 + 5.0  # deadline + one read timeout + slack for a loaded host
    fetch_dataset("tiny", tiny.files, [drip_server + "/drip", str(tmp_path / "good")], tmp_path / "raw", drip, env={})
    np.testing.assert_array_equal(read_idx(tmp_path / "raw" / "train-images.idx"), tiny.arrays["train_images"])


@pytest.mark.parametrize(
    "change, message",
    [
        ({"retries": 20, "backoff_s": 600}, r"fetch\.retries: Input should be less than or equal to 10"),
        (
            {"retries": 10, "backoff_s": 600},
            r"fetch: the pauses between retries \(backoff_s x \(2\^retries - 1\) = "
            r"613800 s\) exceed deadline_s \(600 s\)",
        ),
        ({"retries": 3, "backoff_s": 100, "deadline_s": 600}, r"= 700 s\) exceed deadline_s \(600 s\)"),
        ({"timeout_s": 60, "deadline_s": 30}, r"fetch: timeout_s \(60 s\) exceeds deadline_s \(30 s\)"),
        ({"deadline_s": 7200}, r"fetch\.deadline_s: Input should be less than or equal to 3600"),
        ({"retries": 11}, r"fetch\.retries: Input should be less than or equal to 10"),
    ],
)
def test_fetch_time_knobs_are_bounded_together(change, message):
    params = load_params(PARAMS)
    params["fetch"].update(change)
    with pytest.raises(ParamsError, match=message):
        validate_params(params)


@pytest.mark.parametrize(
    "section, key, value, message",
    [
        ("bench", "seed", 1 << 32, r"bench\.seed: Input should be less than or equal to 4294967295"),
        ("train", "seed", -1, r"train\.seed: Input should be greater than or equal to 0"),
        ("bench", "epochs", 101, r"bench\.epochs: Input should be less than or equal to 100"),
        ("train", "epochs", 1000, r"train\.epochs: Input should be less than or equal to 100"),
        ("bench", "sample_epochs", 101, r"bench\.sample_epochs: Input should be less than or equal to 100"),
        # one sampled epoch would be the warm-up alone, its start-up scaled with the steps
        ("bench", "sample_epochs", 1, r"bench\.sample_epochs: Input should be greater than or equal to 2"),
        ("bench", "sample_steps", 10_001, r"bench\.sample_steps: Input should be less than or equal to 10000"),
    ],
)
def test_seeds_and_epochs_are_bounded(section, key, value, message):
    params = load_params(PARAMS)
    params[section][key] = value
    with pytest.raises(ParamsError, match=message):
        validate_params(params)


def test_a_retry_pause_past_the_deadline_is_not_taken(tmp_path, tiny, http_server, pauses):
    for name, blob in tiny.blobs.items():
        http_server.routes[f"/m/{name}"] = blob
    http_server.fail_first["/m/train-images-idx3-ubyte.gz"] = 99
    with pytest.raises(FetchError, match=r"HTTP 503 .* \(gave up after 3 tries, its deadline \(5 s\) near\)"):
        fetch_dataset(
            "tiny",
            tiny.files,
            [http_server.url + "/m"],
            tmp_path / "raw",
            FetchSettings(timeout_s=1, retries=5, backoff_s=1.5, deadline_s=5),
            env={},
        )
    assert pauses == [1.5, 3.0]  # the third (6 s) would pass the deadline


ALIAS_BOMB = "\n".join(
    ["a: &a [x, x, x, x, x, x, x, x, x]"]
    + [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]" for i in range(8)]
)


def test_yaml_alias_bomb_in_params_fails_at_once(files):
    """Nine levels of nine aliases: 387 million items from 400 bytes. Refused at the first
    alias, with a short message (it once formatted the whole value)."""
    (files / "params.yaml").write_text(ALIAS_BOMB + "\n")
    rc, err, peak_mib, seconds = cli(
        "fetch",
        "tiny",
        "--out",
        str(files / "raw"),
        "--params",
        str(files / "params.yaml"),
        "--sources",
        str(files / "sources.yaml"),
    )
    assert rc == 2 and seconds < 15 and peak_mib < 200, (seconds, peak_mib)
    one_line_error(
        err, "params.yaml: not valid YAML: alias *a is not allowed here (write the value out) (line 2, column 8)"
    )
    assert len(err) < 300


# ---------------------------------------------------------------- 3. inputs nobody checked


def test_train_refuses_another_data_sets_shards_and_too_many_ranks(tmp_path, tiny, monkeypatch):
    from conftest import write_shards

    from pipeline.cli import check_world
    from pipeline.shards import ShardError

    for split in ("train", "test"):
        write_shards(
            tiny.arrays[f"{split}_images"],
            tiny.arrays[f"{split}_labels"],
            tmp_path / "s" / split,
            dataset="tiny",
            split=split,
            samples_per_shard=40,
        )
    with pytest.raises(
        ShardError,
        match=rf"^{re.escape(str(tmp_path / 's' / 'train' / 'manifest.json'))}: manifest is for dataset "
        r"'tiny', expected 'mnist'$",
    ):
        check_world(tmp_path / "s", "mnist")
    monkeypatch.setenv("WORLD_SIZE", "33")
    with pytest.raises(InputError, match=r"s/test: 32 samples, fewer than the 33 ranks \(WORLD_SIZE\)"):
        check_world(tmp_path / "s", "tiny")
    monkeypatch.setenv("WORLD_SIZE", "32")
    check_world(tmp_path / "s", "tiny")


# ---------------------------------------------------------------- 4. numbers in generated files


@pytest.fixture
def metrics(tmp_path):
    figures = {"codec": "zstd-3"}
    for split in ("train", "test"):
        figures[split] = {
            "csv_bytes": 1000,
            "rows": 10,
            **{layout: {"bytes": 100, "write_s": 0.5, "read_s": 0.1} for layout in ("wide", "compact")},
        }
    bench = {
        "dataset": "tiny",
        "params": {"epochs": 2, "batch_size": 64},
        "variants": {
            "naive": {"train_s": 3.0, "test_s": 0.5, "extrapolated": True},
            "device": {"train_s": 0.25, "test_s": 0.05, "extrapolated": False},
        },
    }
    (tmp_path / "fig" / "tiny").mkdir(parents=True)
    (tmp_path / "bench").mkdir()
    return tmp_path, figures, bench


def _write_metrics(root: Path, figures: dict, bench: dict) -> None:
    (root / "fig" / "tiny" / "zstd-3.json").write_text(json.dumps(figures))
    (root / "bench" / "tiny.json").write_text(json.dumps(bench))


@pytest.mark.parametrize(
    "where, value, message",
    [
        ("bench", float("nan"), r"tiny.json: variants.device.train_s: Input should be a finite number \(got nan\)"),
        ("bench", float("inf"), r"tiny.json: variants.device.train_s: Input should be a finite number \(got inf\)"),
        ("bench", 1e308, r"tiny.json: variants.device.train_s: Input should be less than or equal to 10000000"),
        ("bench", -0.5, r"tiny.json: variants.device.train_s: Input should be greater than or equal to 0"),
        ("bench", "fast", r"tiny.json: variants.device.train_s: Input should be a valid number \(got 'fast'\)"),
        ("figures", 0, r"zstd-3.json: train.compact.bytes: 0 is outside 1..1\.09951e\+12"),
        ("figures", 1.5, r"zstd-3.json: train.compact.bytes: expected an integer, got 1.5"),
    ],
)
def test_summary_refuses_numbers_no_run_gives(metrics, where, value, message):
    from pipeline.stages.summary import write_summary

    root, figures, bench = metrics
    _write_metrics(root, figures, bench)
    assert write_summary(root / "fig", root / "bench", ["tiny"], "zstd-3", "compact", root / "s.json") == {
        "machine": "unnamed",
        "tiny": {"MB": 0.0, "epoch_s": 0.25},
    }
    before = (root / "s.json").read_bytes()
    if where == "bench":
        bench["variants"]["device"]["train_s"] = value
    else:
        figures["train"]["compact"]["bytes"] = value
    _write_metrics(root, figures, bench)
    with pytest.raises(DataError, match=message):
        write_summary(root / "fig", root / "bench", ["tiny"], "zstd-3", "compact", root / "s.json")
    assert (root / "s.json").read_bytes() == before


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("write_s", float("nan"), r"zstd-3.json: train.wide.write_s: nan is outside 0..86400"),
        ("read_s", -1, r"zstd-3.json: train.wide.read_s: -1 is outside"),
        ("bytes", "12", r"zstd-3.json: train.wide.bytes: expected an integer, got '12'"),
    ],
)
def test_codecs_refuse_numbers_no_run_gives(metrics, key, value, message):
    from pipeline.stages.codecs import write_codecs

    root, figures, bench = metrics
    figures["train"]["wide"][key] = value
    _write_metrics(root, figures, bench)
    with pytest.raises(DataError, match=message):
        write_codecs(root / "fig", ["tiny"], ["zstd-3"], root / "c.json", root / "c.csv")
    assert not (root / "c.json").exists()


def test_the_summary_names_the_machine_of_each_figure(metrics):
    """Two data sets measured on two machines (an interrupted run on a new one): each named."""
    from pipeline.budget.machine import fingerprint
    from pipeline.core.atomic import as_json
    from pipeline.stages.summary import write_summary

    root, figures, bench = metrics
    (root / "fig" / "other").mkdir()
    (root / "fig" / "other" / "zstd-3.json").write_text(json.dumps(figures))
    machine = as_json(fingerprint("cpu"))
    _write_metrics(root, figures, {**bench, "machine": {**machine, "name": "amd-epyc-2c"}})
    (root / "bench" / "other.json").write_text(
        json.dumps({**bench, "dataset": "other", "machine": {**machine, "name": "intel-xeon-2c"}})
    )
    out = write_summary(root / "fig", root / "bench", ["tiny", "other"], "zstd-3", "compact", root / "s.json")
    assert out["machine"] == "amd-epyc-2c (tiny), intel-xeon-2c (other)"
    out = write_summary(root / "fig", root / "bench", ["tiny"], "zstd-3", "compact", root / "s.json")
    assert out["machine"] == "amd-epyc-2c"


def test_a_bench_file_under_another_data_sets_name_is_refused(metrics):
    """tiny's document copied to other.json: the summary (which finds a data set's bench by its
    file name) and the report (which goes by the document) both refuse it in one line, rather
    than credit tiny's figures to other or drop a row."""
    from pipeline.stages.report.data import ReportError, load_run
    from pipeline.stages.summary import write_summary

    root, figures, bench = metrics
    (root / "fig" / "other").mkdir()
    (root / "fig" / "other" / "zstd-3.json").write_text(json.dumps(figures))
    _write_metrics(root, figures, bench)
    (root / "bench" / "other.json").write_text(json.dumps(bench))  # dataset: tiny
    said = r"other.json: holds the bench of 'tiny', but its name says 'other' \(a bench file is named for its data set"
    with pytest.raises(DataError, match=said):
        write_summary(root / "fig", root / "bench", ["tiny", "other"], "zstd-3", "compact", root / "s.json")
    with pytest.raises(ReportError, match=said):
        load_run(root / "bench" / "other.json", "here", True)


def test_summary_with_no_fully_run_variant(metrics):
    from pipeline.stages.summary import write_summary

    root, figures, bench = metrics
    bench["variants"]["device"]["extrapolated"] = True
    _write_metrics(root, figures, bench)
    with pytest.raises(DataError, match=r"tiny.json: variants: none was run in full"):
        write_summary(root / "fig", root / "bench", ["tiny"], "zstd-3", "compact", root / "s.json")


def test_duplicate_keys_in_a_metrics_file(metrics):
    root, _, _ = metrics
    (root / "x.json").write_text('{"a": 1, "a": 2}')
    with pytest.raises(InputError, match=r"x.json: not valid JSON \(key 'a' is given twice\)"):
        read_json(root / "x.json")


@pytest.mark.parametrize(
    ("encoding", "found"), [("utf-16", "can't decode byte 0xff in position 0"), ("utf-8-sig", "Unexpected UTF-8 BOM")]
)
def test_a_json_file_is_utf8_only(tmp_path, encoding, found):
    """JSON is read as UTF-8 (RFC 8259), with no byte-order mark: json.loads would guess
    another encoding from the bytes and read it."""
    (tmp_path / "x.json").write_text('{"a": 1}', encoding=encoding)
    with pytest.raises(InputError, match=rf"x.json: not valid JSON \(.*{found}"):
        read_json(tmp_path / "x.json")
    (tmp_path / "x.json").write_text('{"a": "\u00e9"}', encoding="utf-8")
    assert read_json(tmp_path / "x.json") == {"a": "\u00e9"}


# ---------------------------------------------------------------- 5. messages, not tracebacks


def _fail_with(number: int):
    def fail(*args, **kwargs):
        raise OSError(number, os.strerror(number))

    return fail


def test_an_output_in_a_folder_that_takes_no_new_file_names_the_output(tmp_path):
    """/proc refuses any new file with ENOENT, which no advice covers: the one line names the
    output asked for, not the lock file beside it that could not be made."""
    from pipeline.core.atomic import atomic_dir, atomic_path
    from pipeline.core.errors import SystemFailure

    for writer in (atomic_dir, atomic_path):
        with pytest.raises(SystemFailure) as caught:
            with writer(Path("/proc/pipeline-out")):
                pass
        assert str(caught.value) == (
            "/proc/pipeline-out: cannot be written: No such file or directory creating a file in /proc"
        )


OS_FAILURES = {
    errno.ENOSPC: "the disk is full",
    errno.EFBIG: "the file is larger than this system or `ulimit -f` allows",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
}


@pytest.mark.parametrize("number", list(OS_FAILURES))
@pytest.mark.parametrize("stage", ["fetch", "convert", "shard"])
def test_os_failures_are_one_line_naming_the_output(files, csv_dir, parquet, monkeypatch, stage, number):
    """A write that fails with ENOSPC, EFBIG, EROFS or EACCES: one line naming the file
    being written and what to do, exit status 2, and the previous output untouched."""
    from pipeline.cli import main
    from pipeline.core.atomic import MARKER

    out = files / "out"
    out.mkdir()
    (out / "previous").write_text("kept")
    (out / MARKER).write_text("an earlier run's\n")  # the stage's own earlier output, which it may replace
    common = ["--sources", str(files / "sources.yaml"), "--params", str(files / "params.yaml")]
    if stage == "fetch":
        monkeypatch.setattr("pipeline.stages.fetch.stage._Content._emit", _fail_with(number))
        args, written = ["fetch", "tiny", "--out", str(out), *common], out / "test-images.idx"  # the first file
        monkeypatch.setenv("PIPELINE_MIRROR", str(files / "mirror"))
    elif stage == "convert":
        monkeypatch.setattr("pyarrow.parquet.ParquetWriter.write_table", _fail_with(number))
        args = [
            "convert",
            "tiny",
            "snappy",
            "--csv",
            str(csv_dir),
            "--out",
            str(out),
            "--figures",
            str(files / "f.json"),
            *common,
        ]
        written = out / "compact" / "train.parquet"
    else:
        monkeypatch.setattr("pipeline.shards.writer.ShardWriter._write", _fail_with(number))
        args, written = ["shard", "tiny", "--parquet", str(parquet), "--out", str(out), *common], out / "train"
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    one_line_error(
        result.stderr,
        f"Error: {written}: {os.strerror(number)} ({errno.errorcode[number]}); {OS_FAILURES[number]}",
        "the outputs are unchanged",
    )
    assert tree_digest(out) == {
        "previous": hashlib.sha256(b"kept").hexdigest(),
        MARKER: hashlib.sha256(b"an earlier run's\n").hexdigest(),
    }
    assert [p.name for p in files.iterdir() if p.name.startswith(".out")] == []


@pytest.mark.parametrize("stage", ["fetch", "convert", "shard"])
def test_a_real_file_size_limit_is_a_message(files, csv_dir, parquet, stage):
    """`ulimit -f` for real (RLIMIT_FSIZE: the kernel's EFBIG, through polars, pyarrow and
    Python's own writes): one line, exit 2, no output."""
    common = ["--sources", str(files / "sources.yaml"), "--params", str(files / "params.yaml")]
    out = files / "out"
    args = {
        "fetch": ["fetch", "tiny", "--out", str(out), *common],
        "convert": [
            "convert",
            "tiny",
            "none",
            "--csv",
            str(csv_dir),
            "--out",
            str(out),
            "--figures",
            str(files / "f.json"),
            *common,
        ],
        "shard": ["shard", "tiny", "--parquet", str(parquet), "--out", str(out), *common],
    }[stage]
    rc, err, _, _ = cli(*args, limits={"RLIMIT_FSIZE": 20_000}, env={"PIPELINE_MIRROR": str(files / "mirror")})
    assert rc == 2
    one_line_error(err, "File too large (EFBIG); the file is larger than this system or `ulimit -f` allows")
    assert str(out) in err and ".tmp" not in err and not out.exists()


def test_mirror_urls_that_do_not_parse_are_passed_over(tmp_path, tiny):
    tiny.write_mirror(tmp_path / "good")
    bad = ["http://[::1", "http://127.0.0.1:port/x", "ftp://example.org/x"]
    with pytest.raises(FetchError) as err:
        fetch_dataset("tiny", tiny.files, bad, tmp_path / "raw", FAST, env={})
    lines = str(err.value).splitlines()
    assert lines[1].startswith("  - http://[::1/train-images-idx3-ubyte.gz: not a usable URL (Invalid IPv6 URL)")
    assert "http://127.0.0.1:port/x/train-images-idx3-ubyte.gz: not a usable URL or answer (nonnumeric port" in lines[2]
    assert lines[3].endswith("unsupported URL scheme 'ftp': expected http(s)://, file:// or a folder")
    fetch_dataset("tiny", tiny.files, [*bad, str(tmp_path / "good")], tmp_path / "raw", FAST, env={})


SOURCES_CASES = {
    "entry a string": ({"train_images": "x"}, r"tiny.files: file train_images: expected \{name: ..., sha256: ...\}"),
    "digest of 63": ({"train_images": {"name": "a", "sha256": "a" * 63}}, r"sha256 must be 64 hex digits"),
    "digest a number": ({"train_images": {"name": "a", "sha256": 5}}, r"sha256 must be 64 hex digits, got 5"),
    "name a path": ({"train_images": {"name": "../x", "sha256": "a" * 64}}, r"name must be a plain file name"),
    "bytes negative": ({"train_images": {"name": "a", "sha256": "a" * 64, "bytes": -1}}, r"bytes must be an integer"),
    "files a list": (["a"], r"no data set 'tiny' with a `files` mapping"),
}


@pytest.mark.parametrize("case", list(SOURCES_CASES))
def test_sources_of_the_wrong_shape(tmp_path, tiny, case):
    files, message = SOURCES_CASES[case]
    if isinstance(files, dict):
        files = {**tiny.files, **files}
    (tmp_path / "sources.yaml").write_text(yaml.safe_dump({"tiny": {"files": files, "rows": ROWS}}))
    with pytest.raises(FetchError, match=message) as err:
        load_sources(tmp_path / "sources.yaml", "tiny")
    assert str(err.value).startswith(f"{tmp_path / 'sources.yaml'}: ") and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "rows, message",
    [
        (None, r"tiny.rows must map each of \['train', 'test'\] to its number of samples \(got None\)"),
        ({"train": 64}, r"tiny.rows must map each of"),
        ({"train": 64, "test": "32"}, r"tiny.rows.test: expected an integer in 1..16,777,216, got '32'"),
        ({"train": 0, "test": 32}, r"tiny.rows.train: expected an integer in 1..16,777,216, got 0"),
        ({"train": True, "test": 32}, r"tiny.rows.train: expected an integer"),
    ],
)
def test_rows_of_the_wrong_shape(tmp_path, tiny, rows, message):
    (tmp_path / "sources.yaml").write_text(yaml.safe_dump({"tiny": {"files": tiny.files, "rows": rows}}))
    with pytest.raises(SourcesError, match=message):
        known_rows(tmp_path / "sources.yaml", "tiny")


def test_cli_sources_of_the_wrong_shape_is_one_line(files, tiny):
    (files / "sources.yaml").write_text(
        yaml.safe_dump({"tiny": {"rows": ROWS, "files": {**tiny.files, "test_labels": {"name": "x", "sha256": "ab"}}}})
    )
    rc, err, _, _ = cli(
        "fetch",
        "tiny",
        "--out",
        str(files / "raw"),
        "--sources",
        str(files / "sources.yaml"),
        "--params",
        str(files / "params.yaml"),
    )
    assert rc == 2
    one_line_error(err, "sources.yaml: tiny.files: file test_labels: sha256 must be 64 hex digits, got 'ab'")


@pytest.mark.parametrize(
    "content, message",
    [
        (b"fetch: [unclosed\n", r"params.yaml: not valid YAML: .* \(line 2, column 1\)"),
        (b"fetch: caf\xe9\n", r"params.yaml: not UTF-8 text \(byte 0xe9 at offset 10\)"),
        (b"- a list\n", r"params.yaml: expected a mapping at the top level"),
        (b"[" * 20_000, r"params.yaml: not valid YAML"),
        (b"a: 1\n" + b"#" * (1 << 20), r"params.yaml: 1,048,\d+ bytes or more, larger than any params file can be"),
    ],
)
def test_params_that_are_not_yaml(tmp_path, content, message):
    (tmp_path / "params.yaml").write_bytes(content)
    with within(10), pytest.raises(ParamsError, match=message):
        load_params(tmp_path / "params.yaml")


def test_cli_params_not_utf8_is_one_line(files):
    (files / "params.yaml").write_bytes(b"\xff\xfe" + (PARAMS).read_bytes())
    rc, err, _, _ = cli("fetch", "tiny", "--out", str(files / "raw"), "--params", str(files / "params.yaml"))
    assert rc == 2
    one_line_error(err, "params.yaml: not UTF-8 text (byte 0xff at offset 0)")


@pytest.mark.parametrize(
    "data, message",
    [
        (
            idx_header(*[(1 << 32) - 1] * 4) + bytes(16),
            r"truncated: header says shape \(4294967295, 4294967295, 4294967295, 4294967295\) "
            r"\(340,282,366,604,025,813,516,997,721,482,669,850,645 bytes\), file has 36 bytes",
        ),
        (idx_header(0, (1 << 32) - 1, (1 << 32) - 1, (1 << 32) - 1), r"which no array can have"),
        (idx_header(*[1] * 9) + bytes(1), r"header declares 9 dimensions, more than the 8"),
    ],
)
def test_idx_dimensions_whose_product_wraps(tmp_path, data, message):
    """A product computed in 64 bits wraps (4 x (2^32 - 1) is 2^128): here it is exact."""
    with pytest.raises(IdxError, match=message):
        parse_idx(data, "x.idx")
    (tmp_path / "x.idx").write_bytes(data)
    with pytest.raises(IdxError, match=message):
        read_idx(tmp_path / "x.idx")


def test_manifest_count_that_cannot_be_allocated(tmp_path):
    """A zstd split's count is not bounded by its file sizes: 2^31 samples (1.7 TB) is
    refused as a message when the tensor cannot be had, not a torch traceback."""
    from pipeline.shards import ShardError
    from pipeline.shards import read_split as read_shard_split  # (read_raw_split here is the IDX reader's)
    from pipeline.shards.format import MAX_COUNT, new_manifest, write_manifest

    entry = {
        "file": "shard-00000.safetensors.zst",
        "count": MAX_COUNT,
        "bytes": 100,
        "sha256": "a" * 64,
        "xxh3_128": "b" * 32,
    }
    (tmp_path / "s").mkdir()
    from pipeline.stages.mnist import MNIST

    write_manifest(
        tmp_path / "s",
        new_manifest(
            sample=MNIST,
            dataset="d",
            split="train",
            count=MAX_COUNT,
            codec="zstd",
            level=3,
            source={},
            shards=[entry],
            block=None,
        ),
    )
    with pytest.raises(
        ShardError,
        match=r"manifest.json: count 2,147,483,648 needs 1,685.8 GB, which cannot be "
        r"allocated here",
    ):
        read_shard_split(tmp_path / "s")


def test_compact_parquet_without_label(parquet, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.core.parquet import IMAGE_TYPE, write_checksums
    from pipeline.stages.shard.stage import shard_dataset

    table = pq.read_table(parquet / "train.parquet")
    pq.write_table(pa.table({"image": table.column("image").cast(IMAGE_TYPE)}), parquet / "train.parquet")
    write_checksums(parquet.parent)
    with pytest.raises(DataError, match=r"train.parquet: no 'label' column \(1 missing\): neither layout"):
        shard_dataset(parquet, tmp_path / "shards", "tiny", ShardSettings(20, "none", 3))


def test_device_this_machine_lacks_is_one_line(monkeypatch):
    import torch

    from pipeline.cli import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(
        InputError,
        match=r"--device cuda: no CUDA device is usable here \(torch .*\); use --device "
        r"cpu, or auto",
    ):
        resolve_device("cuda")
    with pytest.raises(InputError, match=r"--device 'banana': not a torch device"):
        resolve_device("banana")
    assert resolve_device("auto") == "cpu" and resolve_device("cpu") == "cpu"


def test_standalone_data_set_names_are_slugs():
    from pipeline.cli import check_datasets

    check_datasets(["mnist", "fashion-mnist"])
    with pytest.raises(InputError, match=r"must be plain slugs .*'\.\./x'"):
        check_datasets(["mnist", "../x"])


# ---------------------------------------------------------------- 6. smaller ones


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "fetch: {retries: 1}\nfetch: {retries: 2}\n",
            r"params.yaml: not valid YAML: key 'fetch' is given twice "
            r"\(line 2, column 1\)",
        ),
        ("fetch:\n  retries: 1\n  retries: 2\n", r"key 'retries' is given twice \(line 3, column 3\)"),
    ],
)
def test_duplicate_keys_in_params(tmp_path, text, message):
    (tmp_path / "params.yaml").write_text(text)
    with pytest.raises(ParamsError, match=message):
        load_params(tmp_path / "params.yaml")


def test_duplicate_keys_in_sources(tmp_path, tiny):
    text = yaml.safe_dump({"tiny": {"rows": ROWS, "files": tiny.files}})
    (tmp_path / "sources.yaml").write_text(text + text)
    with pytest.raises(FetchError, match=r"sources.yaml: not valid YAML: key 'tiny' is given twice"):
        load_sources(tmp_path / "sources.yaml", "tiny")
    with pytest.raises(SourcesError, match=r"key 'tiny' is given twice"):
        known_rows(tmp_path / "sources.yaml", "tiny")


def test_a_first_read_of_one_byte_is_still_gzip(tmp_path, tiny, drip_server):
    fetch_dataset("tiny", tiny.files, [drip_server + "/split"], tmp_path / "raw", FAST, env={})
    np.testing.assert_array_equal(read_idx(tmp_path / "raw" / "test-labels.idx"), tiny.arrays["test_labels"])


def test_the_stale_sweep_spares_a_siblings_temporary(tmp_path):
    """`train`'s sweep removes `train`'s own leftovers only; `.train.parquet.<random>.tmp`
    belongs to a sibling target, perhaps being written by another run right now."""
    sibling = tmp_path / ".train.parquet.a1b2c3d4.tmp"
    sibling.mkdir()
    (sibling / "half").write_text("in progress")
    own = tmp_path / ".train.zz9_yy8x.tmp"
    own.mkdir()
    with atomic_dir(tmp_path / "train") as tmp:
        (tmp / "x").write_text("new")
    assert sibling.is_dir() and not own.exists() and (tmp_path / "train" / "x").read_text() == "new"
    with atomic_path(tmp_path / "train.parquet") as tmp:  # and the sibling's own run clears its own
        tmp.write_text("whole")
    assert not sibling.exists()


# ---------------------------------------------------------------- properties (hypothesis)


VALID_ROW = st.tuples(st.integers(0, 9), st.lists(st.integers(0, 255), min_size=784, max_size=784)).map(
    lambda row: ",".join(map(str, [row[0], *row[1]])).encode()
)
NOISE = st.binary(max_size=64)


@st.composite
def csv_lines(draw):
    """Lines that are rows, rows with bytes spliced in, short junk, or runs far longer than a row."""
    lines = []
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["row", "row", "spliced", "junk", "long"]))
        if kind == "row":
            lines.append(draw(VALID_ROW))
        elif kind == "spliced":
            row = draw(VALID_ROW)
            at = draw(st.integers(0, len(row)))
            lines.append(row[:at] + draw(NOISE) + row[at:])
        elif kind == "junk":
            lines.append(draw(NOISE))
        else:
            lines.append(b"1," * draw(st.integers(CSV_ROW_MAX // 2, 3 * CSV_ROW_MAX)))
    return lines


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(lines=csv_lines(), end=st.sampled_from([b"\n", b"\r\n"]), block=st.sampled_from([4096, 1 << 16]))
def test_csv_block_parser_never_crashes_and_parses_only_bounded_lines(tmp_path, monkeypatch, lines, end, block):
    """Whatever the lines: rows come back exactly, or a DataError; and the parser is only
    ever handed blocks of at most `block` + one line, whose every line is a row's length."""
    import pipeline.stages.convert.csvread as convert

    real = _REAL_PARSE_BLOCK

    def checked(path, first, data):
        assert len(data) <= block + CSV_LINE_MAX
        assert max(len(line) for line in data.split(b"\n")[:-1]) <= CSV_ROW_MAX + 1
        return real(path, first, data)

    monkeypatch.setattr(convert, "_parse_block", checked)
    path = tmp_path / "p.csv"
    path.write_bytes(write_header() + b"".join(line + end for line in lines))
    reference = []
    for line in lines:
        fields = line.split(b",")
        if (
            len(fields) == 785
            and all(f.isdigit() and len(f) <= 3 and int(f) <= 255 for f in fields)
            and int(fields[0]) <= 9
        ):
            reference.append([int(f) for f in fields])
        else:
            reference = None
            break
    try:
        with within(20):
            parts = list(iter_csv(path, block_bytes=block))
    except DataError:
        assert reference is None or not reference  # refused: some line is not a row (or none is there)
        return
    labels = np.concatenate([p[0] for p in parts])
    pixels = np.concatenate([np.ascontiguousarray(p[1]) for p in parts])
    if reference is not None:
        np.testing.assert_array_equal(np.column_stack([labels, pixels]), np.array(reference, np.uint8))


@st.composite
def idx_files(draw):
    """Headers with any type code, 0..10 dimensions of any 32-bit size, then a short body;
    or bytes of no structure at all."""
    if draw(st.booleans()):
        return draw(st.binary(max_size=80))
    ndim = draw(st.integers(0, 10))
    dims = draw(st.lists(st.one_of(st.integers(0, 4), st.integers(0, (1 << 32) - 1)), min_size=ndim, max_size=ndim))
    code = draw(st.sampled_from([0x08, 0x09, 0x0B, 0x0C, 0x0D, 0x0E, 0x00, 0x0A, 0xFF]))
    return bytes([0, 0, code, ndim]) + b"".join(d.to_bytes(4, "big") for d in dims) + draw(st.binary(max_size=200))


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)  # a loaded host is slow
@given(data=idx_files())
def test_idx_reader_never_crashes_and_never_reads_past_the_file(tmp_path, data):
    """Any bytes: an array holding exactly the body, or an IdxError; from a file, the same,
    and never a read of more bytes than the file has (the header is checked first)."""
    try:
        array = parse_idx(data)
    except IdxError:
        array = None
    else:
        assert array.nbytes == len(data) - (4 + 4 * data[3])
    path = tmp_path / "f.idx"
    path.write_bytes(data)
    try:
        back = read_idx(path, max_bytes=1 << 16)
    except IdxError:
        assert array is None or array.nbytes > (1 << 16)
    else:
        assert array is not None and back.shape == array.shape and back.tobytes() == array.tobytes()


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70) | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


def _child(node, key):
    if isinstance(node, dict):
        return node.get(key)
    if isinstance(node, list) and isinstance(key, int) and key < len(node):
        return node[key]
    return None


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)  # a loaded host is slow
@given(
    path=st.lists(
        st.one_of(
            st.sampled_from(
                [
                    "shards",
                    "count",
                    "file",
                    "bytes",
                    "compression",
                    "codec",
                    "images",
                    "sha256",
                    "xxh3_128",
                    "format_version",
                    "dataset",
                ]
            ),
            st.integers(0, 3),
        ),
        min_size=1,
        max_size=3,
    ),
    value=JSON_VALUES,
    whole=st.booleans(),
)
def test_manifest_check_never_crashes(path, value, whole):
    """A valid manifest with any one value replaced by any JSON value (or any JSON value
    whole): the check returns it or raises a ShardError naming the file, nothing else."""
    from pipeline.shards import ShardError
    from pipeline.shards.format import BLOCK_BYTES, check_manifest, new_manifest, shard_file
    from pipeline.stages.mnist import MNIST

    shards = [
        {
            "file": shard_file(i, "none"),
            "count": n,
            "bytes": n * MNIST.row_bytes + 100,
            "sha256": "a" * 64,
            "xxh3_128": "b" * 32,
            "header_xxh3_64": "c" * 16,
        }
        for i, n in enumerate((3, 2))
    ]
    manifest = new_manifest(
        sample=MNIST,
        dataset="d",
        split="train",
        count=5,
        codec="none",
        level=3,
        source={},
        shards=shards,
        block=BLOCK_BYTES,
    )
    if whole:
        manifest = value
    else:
        node = manifest
        for key in path[:-1]:
            node = _child(node, key)
        if isinstance(node, dict) or isinstance(node, list) and isinstance(path[-1], int) and path[-1] < len(node):
            node[path[-1]] = value
    file = Path("/split/manifest.json")
    try:
        assert check_manifest(manifest, file) is manifest
    except ShardError as err:
        assert str(err).startswith(f"{file}: ") and "\n" not in str(err)


@pytest.mark.parametrize("sizes", [[1 << 20], [1 << 20, 5], [3, 1 << 20, 1 << 20]])
def test_members_ending_on_a_full_inflate_step(tmp_path, sizes):
    """A gzip member whose last inflate call fills a whole step (1 MiB) and ends the stream
    is complete, alone or followed by more members."""
    content = bytes(range(256)) * (sum(sizes) // 256 + 1)
    parts, start = [], 0
    for size in sizes:
        parts.append(gzip.compress(content[start : start + size], mtime=0))
        start += size
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "a.csv").write_bytes(b"".join(parts))
    (tmp_path / "m" / "b.csv").write_bytes(gzip.compress(b"x", mtime=0))
    files = {
        "train_csv": {"name": "a.csv", "sha256": hashlib.sha256(content[:start]).hexdigest()},
        "test_csv": {"name": "b.csv", "sha256": hashlib.sha256(b"x").hexdigest()},
    }
    fetch_dataset("d", files, [str(tmp_path / "m")], tmp_path / "raw", FAST, env={})
    assert (tmp_path / "raw" / "train.csv").read_bytes() == content[:start]
