"""Hostile and damaged inputs, table-driven: each case gets one clear message naming the
file (and key, line or shard), and leaves the outputs as they were."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import PARAMS, write_shards

from pipeline.core.atomic import BusyError, atomic_dir, locked
from pipeline.core.errors import DataError
from pipeline.core.params import ParamsError
from pipeline.core.parquet import read_parquet_arrays
from pipeline.shards import ShardDataset, ShardError, read_manifest, read_split
from pipeline.stages.convert.csvread import iter_csv
from pipeline.stages.convert.stage import convert_dataset
from pipeline.stages.csvdata import write_csv
from pipeline.stages.params import validate_params
from pipeline.stages.shard.settings import ShardSettings
from pipeline.stages.shard.stage import shard_dataset

ROOT = Path(__file__).resolve().parents[1]


def tree_digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


# ---------------------------------------------------------------- manifests


@pytest.fixture
def shard_dir(tmp_path, tiny):
    write_shards(
        tiny.arrays["train_images"],
        tiny.arrays["train_labels"],
        tmp_path / "split",
        dataset="tiny",
        split="train",
        samples_per_shard=24,
    )
    return tmp_path / "split"


def _set(path: list, value):
    def edit(m):
        node = m
        for key in path[:-1]:
            node = node[key]
        if value is KeyError:
            del node[path[-1]]
        else:
            node[path[-1]] = value

    return edit


MANIFEST_CASES = {
    "parent path": (
        _set(["shards", 0, "file"], "../../outside/evil.safetensors"),
        r"shards\[0\]\.file: .* not a plain",
    ),
    "absolute path": (_set(["shards", 0, "file"], "/etc/passwd"), r"shards\[0\]\.file: '/etc/passwd' is not a plain"),
    "separator inside": (_set(["shards", 0, "file"], "shard-a/b.safetensors"), r"not a plain shard file name"),
    "dot dot alone": (_set(["shards", 0, "file"], ".."), r"not a plain shard file name"),
    "not a string": (_set(["shards", 0, "file"], 7), r"shards\[0\]\.file: expected a file name, got 7"),
    "listed twice": (
        lambda m: m["shards"].__setitem__(1, copy.deepcopy(m["shards"][0])),
        r"shards\[1\]\.file: 'shard-00000.safetensors' where 'shard-00001.safetensors' belongs: shards are numbered",
    ),
    "out of place": (  # every hash would still match; the samples' order would not
        lambda m: m["shards"].reverse(),
        r"shards\[0\]\.file: 'shard-00002.safetensors' where 'shard-00000.safetensors' belongs",
    ),
    "absurd count": (_set(["count"], 10**18), r"count: 1000000000000000000 is outside 0\.\.2147483648"),
    "count a string": (_set(["count"], "64"), r"count: expected an integer, got '64'"),
    "count a bool": (_set(["shards", 0, "count"], True), r"shards\[0\]\.count: expected an integer, got True"),
    "negative bytes": (_set(["shards", 0, "bytes"], -5), r"shards\[0\]\.bytes: -5 is outside 1\.\."),
    "counts do not add up": (_set(["count"], 65), r"json: shards: shard counts add up to 64, count says 65$"),
    "size cannot hold count": (_set(["shards", 0, "count"], 2000), r"cannot hold 2,000 samples"),
    "missing key": (_set(["shards"], KeyError), r"\(keys\): missing \['shards'\]"),
    "unknown key": (_set(["extra"], 1), r"\(keys\): missing \[\], unknown \['extra'\]"),
    "bad sha256": (_set(["shards", 0, "sha256"], "zz"), r"shards\[0\]\.sha256: expected 64 lowercase hex"),
    "bad dtype": (
        _set(["fields", 0, "dtype"], "float65"),
        r"fields\[0\]: field 'images': dtype 'float65' is not one of",
    ),
    "bad codec": (_set(["compression", "codec"], "lzma"), r"compression\.codec: 'lzma', expected"),
    "shards not a list": (_set(["shards"], {"a": 1}), r"shards: expected a list"),
    "wrong version": (_set(["format_version"], 1), r"format_version: 1, expected one of \[2, 3, 4\]"),
    "block size not a power of two": (_set(["block_bytes"], 65535), r"block_bytes: 65535 is not a power of two$"),
    "block size tiny": (_set(["block_bytes"], 512), r"block_bytes: 512 is outside 4096\.\."),
    "block size huge": (_set(["block_bytes"], 1 << 31), r"block_bytes: 2147483648 is outside 4096\.\.1073741824$"),
    "field not an object": (_set(["fields", 0], 5), r"fields\[0\]: expected an object, got 5$"),
    "header digest short": (
        _set(["shards", 0, "header_xxh3_64"], "ab"),
        r"shards\[0\]\.header_xxh3_64: expected 16 lowercase hex digits, got 'ab'",
    ),
    "header digest missing": (
        _set(["shards", 1, "header_xxh3_64"], KeyError),
        r"shards\[1\]\.header_xxh3_64: expected 16 hex digits, got None$",
    ),
    "dataset not a string": (_set(["dataset"], 3), r"dataset: expected a string, got 3$"),
    "compression not an object": (_set(["compression"], []), r"compression: expected an object, got \[\]$"),
    "shard entry not an object": (_set(["shards", 0], 5), r"shards\[0\]: expected an object, got 5$"),
    "sha256 not a string": (_set(["shards", 0, "sha256"], 5), r"shards\[0\]\.sha256: expected 64 hex digits, got 5$"),
    "sha256 one digit short": (_set(["shards", 0, "sha256"], "a" * 63), r"shards\[0\]\.sha256: expected 64 lowercase"),
    "xxh3 upper case": (_set(["shards", 0, "xxh3_128"], "A" * 32), r"shards\[0\]\.xxh3_128: expected 32 lowercase"),
    "backslash in name": (_set(["shards", 0, "file"], "shard-a\\b.safetensors"), r"not a plain shard file name"),
    "NUL in name": (_set(["shards", 0, "file"], "shard-a\0b.safetensors"), r"not a plain shard file name"),
    "name of 256 chars": (_set(["shards", 0, "file"], "shard-" + "a" * 238 + ".safetensors"), r"not a plain shard"),
    "not a shard name": (_set(["shards", 0, "file"], "evil.safetensors"), r"'evil.safetensors' is not a plain"),
    "top level a list": (lambda m: None, None),  # replaced below
}


def _manifest(count: int, shard_counts: list[int], codec: str = "none") -> dict:
    from pipeline.shards.format import BLOCK_BYTES, V2_SAMPLE, new_manifest, shard_file

    SAMPLE_BYTES = V2_SAMPLE.row_bytes
    shards = [
        {
            "file": shard_file(i, codec),
            "count": n,
            "bytes": n * SAMPLE_BYTES + 100,
            "sha256": "a" * 64,
            "xxh3_128": "b" * 32,
        }
        for i, n in enumerate(shard_counts)
    ]
    for entry in shards if codec == "none" else []:
        entry["header_xxh3_64"] = "c" * 16
    return new_manifest(
        sample=V2_SAMPLE,
        dataset="d",
        split="train",
        count=count,
        codec=codec,
        level=3,
        source={},
        shards=shards,
        block=BLOCK_BYTES if codec == "none" else None,
    )


def test_manifest_boundaries_accepted():
    """The edges of what the schema allows are allowed: an empty split, a one-sample shard,
    the largest count, a 255-character name, no `source` key."""
    from pipeline.shards.format import MAX_BYTES, MAX_COUNT, check_manifest, shard_name

    file = Path("/split/manifest.json")
    for manifest in (_manifest(0, []), _manifest(1, [1]), _manifest(MAX_COUNT, [MAX_COUNT], "zstd")):
        assert check_manifest(manifest, file) is manifest
    largest = _manifest(MAX_COUNT, [MAX_COUNT], "zstd")
    largest["shards"][0]["bytes"] = MAX_BYTES  # 16 TiB: a shard of 2**31 samples of 8 KiB
    assert check_manifest(largest, file) is largest
    largest["shards"][0]["bytes"] = MAX_BYTES + 1
    with pytest.raises(ShardError, match=rf"shards\[0\]\.bytes: {MAX_BYTES + 1} is outside 1\.\.{MAX_BYTES}$"):
        check_manifest(largest, file)
    sourceless = _manifest(1, [1])
    del sourceless["source"]
    assert check_manifest(sourceless, file) is sourceless
    with pytest.raises(ShardError, match=r"count: 2147483649 is outside 0\.\.2147483648"):
        check_manifest(_manifest(MAX_COUNT + 1, [MAX_COUNT + 1], "zstd"), file)
    with pytest.raises(ShardError, match=r"shards\[0\]\.count: 0 is outside 1\.\."):
        check_manifest(_manifest(0, [0]), file)
    # An uncompressed shard is its samples plus an 8-byte length and a header of 1..MAX_HEADER bytes
    from pipeline.shards.format import MAX_HEADER, V2_SAMPLE

    SAMPLE_BYTES = V2_SAMPLE.row_bytes
    for size, ok in (
        (3 * SAMPLE_BYTES, False),
        (3 * SAMPLE_BYTES + 1, True),
        (3 * SAMPLE_BYTES + 8 + MAX_HEADER, True),
        (3 * SAMPLE_BYTES + 9 + MAX_HEADER, False),
    ):
        manifest = _manifest(3, [3])
        manifest["shards"][0]["bytes"] = size
        if ok:
            assert check_manifest(manifest, file) is manifest
        else:
            with pytest.raises(ShardError, match=rf"shards\[0\]\.bytes: {size:,} bytes cannot hold 3 samples of 785"):
                check_manifest(manifest, file)
    longest = "shard-" + "a" * 237 + ".safetensors"
    assert len(longest) == 255 and shard_name(file, "k", longest) == longest


@pytest.mark.parametrize("case", [c for c in MANIFEST_CASES if c != "top level a list"])
def test_hostile_manifest(shard_dir, case):
    edit, message = MANIFEST_CASES[case]
    manifest = json.loads((shard_dir / "manifest.json").read_text())
    edit(manifest)
    (shard_dir / "manifest.json").write_text(json.dumps(manifest))
    for reader in (read_split, read_manifest, ShardDataset):
        with pytest.raises(ShardError, match=message) as err:
            reader(shard_dir)
        assert str(err.value).startswith(str(shard_dir / "manifest.json")) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "text, message",
    [
        ("[1, 2]", r"\(top level\): expected a JSON object"),
        ("{", r"not valid JSON"),
        ("[" * 100000, r"not valid JSON"),
    ],
)
def test_unreadable_manifest(shard_dir, text, message):
    (shard_dir / "manifest.json").write_text(text)
    for reader in (read_split, ShardDataset):
        with pytest.raises(ShardError, match=message) as err:
            reader(shard_dir)
        assert str(err.value).startswith(f"{shard_dir / 'manifest.json'}: ")


def test_symlinked_shard_is_refused(shard_dir, tmp_path):
    outside = tmp_path / "outside.safetensors"
    first = shard_dir / "shard-00000.safetensors"
    outside.write_bytes(first.read_bytes())
    first.unlink()
    first.symlink_to(outside)
    for read in (read_split, lambda folder: ShardDataset(folder).batch([0])):
        with pytest.raises(
            ShardError, match=r"shard-00000.safetensors: a link, not a plain file; shards must be plain"
        ):
            read(shard_dir)


def test_a_fifo_as_a_shard_is_refused_without_waiting(shard_dir):
    from test_bounds import within

    first = shard_dir / "shard-00000.safetensors"
    first.unlink()
    os.mkfifo(first)
    for read in (read_split, lambda folder: ShardDataset(folder).batch([0])):  # (a ShardDataset maps on first use)
        with (
            within(5),
            pytest.raises(
                ShardError,
                match=r"shard-00000.safetensors: a FIFO \(named pipe\), not a "
                r"regular file; expected a file here; shards must be plain",
            ),
        ):
            read(shard_dir)


def test_zstd_frame_that_claims_too_much(tmp_path, tiny):
    import zstandard

    write_shards(
        tiny.arrays["train_images"],
        tiny.arrays["train_labels"],
        tmp_path / "z",
        dataset="tiny",
        split="train",
        samples_per_shard=64,
        compression="zstd",
    )
    bomb = zstandard.ZstdCompressor().compress(bytes(64 * 785 * 50))  # 50x the data, tiny on disk
    shard = tmp_path / "z" / "shard-00000.safetensors.zst"
    shard.write_bytes(bomb)
    manifest = json.loads((tmp_path / "z" / "manifest.json").read_text())
    manifest["shards"][0].update(bytes=len(bomb))
    (tmp_path / "z" / "manifest.json").write_text(json.dumps(manifest))
    for read in (read_split, ShardDataset):  # (a ShardDataset decompresses zstd shards when opened)
        with pytest.raises(
            ShardError,
            match=r"shard-00000.safetensors.zst: zstd frame holds 2,512,000 bytes, not 64 "
            r"samples",
        ):
            read(tmp_path / "z", verify="none")


# ---------------------------------------------------------------- params


@pytest.fixture
def params():
    return yaml.safe_load((PARAMS).read_text())


PARAMS_CASES = {
    "fractional shard size": (
        ["shard", "samples_per_shard"],
        1.5,
        r"shard\.samples_per_shard: Input should be a valid integer",
    ),
    "zstd level absurd": (["shard", "level"], -200000, r"shard\.level: Input should be greater than or equal to 1"),
    "zero epochs": (["bench", "epochs"], 0, r"bench\.epochs: Input should be greater than or equal to 1"),
    "label smoothing of 1": (
        ["bench", "tuned", "label_smoothing"],
        1.0,
        r"bench\.tuned\.label_smoothing: Input should be less than 1",
    ),
    "zero sample steps": (["bench", "sample_steps"], 0, r"bench\.sample_steps: Input should be greater"),
    "unknown bench key": (["bench", "speed"], "max", r"bench\.speed: Extra inputs are not permitted"),
    "null param": (["fetch", "retries"], None, r"fetch\.retries: Input should be a valid integer \(got None\)"),
    "escaping data set": (
        ["datasets"],
        ["mnist", "../evil"],
        r"datasets: data set names must be plain slugs.*\.\./evil",
    ),
    "gzip level 10": (
        ["convert", "codecs"],
        ["gzip-10", "snappy"],
        r"convert\.codecs: codec 'gzip-10': gzip levels are 1\.\.9",
    ),
    "zstd level 99": (["convert", "codecs"], ["zstd-99", "snappy"], r"codec 'zstd-99': zstd levels are 1\.\.22"),
    "brotli level 12": (
        ["convert", "codecs"],
        ["brotli-12", "snappy"],
        r"codec 'brotli-12': brotli levels are 0\.\.11",
    ),
    "empty codec list": (["convert", "codecs"], [], r"convert\.codecs: List should have at least 1 item"),
    "unknown codec": (["convert", "codecs"], ["lzma", "snappy"], r"unknown codec 'lzma'"),
    "codec not listed": (["convert", "codec"], "brotli-3", r"convert: codec 'brotli-3' is not one of codecs"),
    "unknown variant": (["bench", "variants"], ["device", "fastest"], r"bench\.variants\.1: Input should be"),
    "sampled graph": (["bench", "sample"], ["graphed"], r"bench: sample: \['graphed'\] .* cannot be sampled"),
    "autocast a string": (["bench", "compiled", "cuda", "autocast"], "yes", r"bench\.compiled\.cuda\.autocast"),
    "negative lr": (["bench", "lr"], -1.0, r"bench\.lr: Input should be greater than 0"),
    "layout unknown": (["convert", "layout"], "tall", r"convert\.layout: Input should be 'wide' or 'compact'"),
}


@pytest.mark.parametrize("case", list(PARAMS_CASES))
def test_hostile_params(params, case):
    path, value, message = PARAMS_CASES[case]
    node = params
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(ParamsError, match=message) as err:
        validate_params(params)
    assert str(err.value).startswith("params.yaml: ") and "\n" not in str(err.value)


def test_every_params_problem_is_listed_at_once(params):
    params["shard"]["samples_per_shard"], params["bench"]["epochs"], params["fetch"]["bogus"] = 1.5, 0, 1
    with pytest.raises(
        ParamsError,
        match=r"3 problem\(s\): .*samples_per_shard.*bench\.epochs.*fetch\.bogus|"
        r"3 problem\(s\)",
    ):
        validate_params(params)


# ---------------------------------------------------------------- CSV and Parquet


@pytest.fixture
def csv_dir(tmp_path, tiny):
    for split in ("train", "test"):
        write_csv(tiny.arrays[f"{split}_images"], tiny.arrays[f"{split}_labels"], tmp_path / "csv" / f"{split}.csv")
    return tmp_path / "csv"


@pytest.mark.parametrize("cut", [-1, -2, -3])
def test_csv_cut_in_its_last_line(csv_dir, cut):
    path = csv_dir / "train.csv"
    path.write_bytes(path.read_bytes()[:cut])  # "...,255\n" -> "...,255" / "...,25" / "...,2"
    with pytest.raises(DataError, match=r"train.csv: the file does not end with a newline"):
        list(iter_csv(path))


@pytest.mark.parametrize("tail", [b"   ", b"\r", b"\t \r"])
def test_blanks_after_the_last_newline_are_refused_naming_the_csv(csv_dir, tmp_path, tail):
    # they passed the compact pass; polars then read them as a row of nulls for the wide
    # layout, refused by the read-back naming a temporary Parquet file instead of the CSV
    path = csv_dir / "train.csv"
    path.write_bytes(path.read_bytes() + tail)
    with pytest.raises(DataError, match=r"train.csv: the file does not end with a newline"):
        convert_dataset(csv_dir, tmp_path / "pq", tmp_path / "f.json", "snappy")
    assert not (tmp_path / "pq").exists()


def test_bad_test_csv_leaves_the_old_parquet_whole(csv_dir, tmp_path):
    out = tmp_path / "pq"
    convert_dataset(csv_dir, out, tmp_path / "f.json", "snappy")
    before = tree_digest(out)
    (csv_dir / "train.csv").write_bytes(
        (csv_dir / "train.csv")
        .read_bytes()
        .replace(b"\n3,", b"\n3,x", 1)
        .replace(b"\n1,", b"\n1,x", 1)
        .replace(b"\n7,", b"\n7,x", 1)
    )
    (csv_dir / "test.csv").write_bytes((csv_dir / "test.csv").read_bytes()[:-1])
    with pytest.raises(DataError):
        convert_dataset(csv_dir, out, tmp_path / "f.json", "snappy")
    assert tree_digest(out) == before  # nothing of the target changed
    assert not list(tmp_path.glob(".pq.*.tmp"))


@pytest.fixture
def parquet(csv_dir, tmp_path):
    convert_dataset(csv_dir, tmp_path / "pq", tmp_path / "f.json", "snappy")
    return tmp_path / "pq" / "compact"


@pytest.mark.parametrize(
    "where, message",
    [
        (lambda n: n // 2, r"checksum mismatch: SHA256SUMS says"),  # a byte in a data page
        (lambda n: n - 20, r"checksum mismatch: SHA256SUMS says"),  # the footer
        (lambda n: None, r"checksum mismatch: SHA256SUMS says"),  # cut in half
    ],
)
def test_damaged_parquet_stops_the_shard_stage(parquet, tmp_path, where, message):
    path = parquet / "train.parquet"
    data = bytearray(path.read_bytes())
    at = where(len(data))
    if at is None:
        data = data[: len(data) // 2]
    else:
        data[at] ^= 0xFF
    path.write_bytes(bytes(data))
    out = tmp_path / "shards"
    with pytest.raises(DataError, match=rf"train.parquet: {message}"):
        shard_dataset(parquet, out, "tiny", ShardSettings(20, "none", 3))
    assert not out.exists()


def test_bad_test_parquet_leaves_no_new_train_shards(parquet, tmp_path):
    out = tmp_path / "shards"
    shard_dataset(parquet, out, "tiny", ShardSettings(20, "none", 3))
    before = tree_digest(out)
    (parquet / "test.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(DataError, match="test.parquet"):
        shard_dataset(parquet, out, "tiny", ShardSettings(30, "none", 3))  # other params: train shards would differ
    assert tree_digest(out) == before


@pytest.mark.parametrize("where", [lambda n: n // 2, lambda n: None])
def test_damaged_parquet_is_refused_by_the_reader_itself(parquet, where):
    """Without the checksum file, the reader still refuses: page CRCs (compact) and structure."""
    path = parquet / "train.parquet"
    data = bytearray(path.read_bytes())
    at = where(len(data))
    data = data[: len(data) // 2] if at is None else data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]
    path.write_bytes(bytes(data))
    with pytest.raises(
        DataError,
        match=r"train.parquet: (not a readable Parquet file|row group \d+ unreadable), "
        r"damaged or cut\?",
    ):
        read_parquet_arrays(path)


@pytest.mark.slow
def test_checksum_file_is_sha256sum_compatible(parquet):
    folder = parquet.parent
    result = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=folder, capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.count(": OK") == 4


def test_missing_parquet_is_named(tmp_path):
    with pytest.raises(DataError, match=r"nothing\.parquet: missing"):
        read_parquet_arrays(tmp_path / "nothing.parquet")


def test_parquet_listed_but_missing_is_named(parquet):
    from pipeline.core.parquet import verify_checksum

    train = parquet / "train.parquet"
    verify_checksum(train)  # as written: fine
    train.unlink()
    with pytest.raises(DataError, match=rf"^{train}: missing \(SHA256SUMS lists it"):
        verify_checksum(train)


# ---------------------------------------------------------------- runs that collide or die


def test_second_writer_is_refused_while_the_first_holds_the_lock(tmp_path):
    dest = tmp_path / "out"
    with locked(dest):
        with pytest.raises(BusyError, match=r"out: another run is writing it right now"):
            with atomic_dir(dest):
                pass
    with atomic_dir(dest) as tmp:  # released: the next run goes ahead
        (tmp / "x").write_text("ok")
    assert (dest / "x").read_text() == "ok" and not list(tmp_path.glob(".out.*"))


@pytest.mark.slow
def test_a_concurrent_process_is_refused(tmp_path):
    dest = tmp_path / "out"
    code = (
        "import sys, time; from pipeline.core.atomic import atomic_dir\n"
        "with atomic_dir(sys.argv[1]) as t:\n print('in', flush=True); time.sleep(3)\n"
    )
    first = subprocess.Popen([sys.executable, "-c", code, str(dest)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert first.stdout.readline().strip() == "in"
    with pytest.raises(BusyError):
        with atomic_dir(dest):
            pass
    assert first.wait() == 0


@pytest.mark.slow
def test_stale_temporaries_of_a_killed_run_are_removed(tmp_path):
    dest = tmp_path / "out.parquet"
    code = (
        "import os, sys; from pipeline.core.atomic import atomic_path\n"
        "with atomic_path(sys.argv[1]) as t:\n open(t, 'w').write('half'); os._exit(9)\n"
    )
    killed = subprocess.run([sys.executable, "-c", code, str(dest)], cwd=ROOT)
    assert killed.returncode == 9 and list(tmp_path.glob(".out.parquet.*.tmp")) and not dest.exists()
    from pipeline.core.atomic import write_text

    write_text(dest, "whole")
    assert dest.read_text() == "whole" and not list(tmp_path.glob(".out.parquet.*"))


def test_an_output_that_is_a_device_a_pipe_or_a_folder_is_not_replaced(tmp_path):
    """Renaming onto `dest` replaces the node itself: as root, `--out /dev/full` turned the
    device into a regular file. Anything but a regular file is refused, untouched."""
    from pipeline.core.atomic import write_text
    from pipeline.core.errors import InputError

    pipe, folder = tmp_path / "pipe", tmp_path / "folder"
    os.mkfifo(pipe)
    folder.mkdir()
    for dest in (pipe, folder):  # (a device node: not tried here, a failure would replace it)
        with pytest.raises(InputError, match=r"exists and is not a regular file; refusing to replace it"):
            write_text(dest, "x")
    assert pipe.is_fifo() and folder.is_dir() and set(tmp_path.iterdir()) == {pipe, folder}


# ---------------------------------------------------------------- the CLI contract


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "pipeline", *args], capture_output=True, text=True, cwd=cwd, env=env)


@pytest.mark.slow
def test_cli_bad_params_is_one_line_and_exit_2(tmp_path, params, csv_dir):
    params["shard"]["samples_per_shard"] = 1.5
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(params))
    result = cli(
        "shard", "tiny", "--parquet", str(csv_dir), "--out", str(tmp_path / "s"), "--params", str(tmp_path / "p.yaml")
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and "shard.samples_per_shard" in result.stderr
    assert not (tmp_path / "s").exists()
    debug = cli(
        "--debug",
        "shard",
        "tiny",
        "--parquet",
        str(csv_dir),
        "--out",
        str(tmp_path / "s"),
        "--params",
        str(tmp_path / "p.yaml"),
    )
    assert debug.returncode != 0 and "Traceback" in debug.stderr


@pytest.mark.slow
def test_cli_missing_test_csv_is_named(tmp_path, csv_dir):
    (csv_dir / "test.csv").unlink()
    (tmp_path / "sources.yaml").write_text("tiny: {rows: {train: 64, test: 32}, files: {}}\n")
    result = cli(
        "convert",
        "tiny",
        "snappy",
        "--csv",
        str(csv_dir),
        "--out",
        str(tmp_path / "pq"),
        "--figures",
        str(tmp_path / "f.json"),
        "--sources",
        str(tmp_path / "sources.yaml"),
        "--params",
        str(PARAMS),
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "test.csv" in result.stderr and not (tmp_path / "pq").exists()


@pytest.mark.slow
def test_cli_hostile_manifest_in_bench(tmp_path, shard_dir):
    manifest = json.loads((shard_dir / "manifest.json").read_text())
    manifest["shards"][0]["file"] = "/etc/passwd"
    (shard_dir / "manifest.json").write_text(json.dumps(manifest))
    code = f"from pipeline.shards import read_split; read_split({str(shard_dir)!r})"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert "is not a plain shard file name" in result.stderr and "passwd: " not in result.stderr.split("file name")[-1]


def test_streamed_shard_writer_checks_page_crcs_itself(csv_dir, tmp_path):
    """Uncompressed pages: one flipped pixel byte decodes fine, only the page CRC sees it.
    stream_split (called without the stage's SHA256SUMS check) must refuse the file."""
    from pipeline.stages.shard.stage import stream_split

    convert_dataset(csv_dir, tmp_path / "pq", tmp_path / "f.json", "none")
    path = tmp_path / "pq" / "compact" / "train.parquet"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"train.parquet: not a readable Parquet split"):
        stream_split(path, tmp_path / "out", dataset="tiny", split="train", layout=ShardSettings(20))


def test_zstd_frame_size_bounds():
    """The decompressed size a frame declares must fit `count` samples exactly: more than
    count x 785 bytes, at most that plus the 8-byte length and the largest header."""
    import zstandard

    from pipeline.shards.format import MAX_HEADER, V2_SAMPLE
    from pipeline.shards.reader import _check_frame

    SAMPLE_BYTES = V2_SAMPLE.row_bytes

    frame = lambda size: zstandard.ZstdCompressor().compress(bytes(size))  # noqa: E731
    low, high = 2 * SAMPLE_BYTES, 2 * SAMPLE_BYTES + 8 + MAX_HEADER
    for size in (low + 1, high):
        _check_frame(Path("s.zst"), frame(size), 2, SAMPLE_BYTES)
    for size in (low, high + 1, 0):
        with pytest.raises(ShardError, match=rf"s.zst: zstd frame holds {size:,} bytes, not 2 samples"):
            _check_frame(Path("s.zst"), frame(size), 2, SAMPLE_BYTES)
    unsized = zstandard.ZstdCompressor(write_content_size=False).compress(bytes(low + 1))
    with pytest.raises(ShardError, match=r"s.zst: zstd frame does not state its decompressed size"):
        _check_frame(Path("s.zst"), unsized, 2, SAMPLE_BYTES)


@pytest.mark.parametrize(
    ("damage", "line"),
    [
        (lambda text: text.replace("  ", " ", 1), 1),  # one space, not two
        (lambda text: text.replace(text[:1], "G", 1), 1),  # not hex
        (lambda text: text[1:], 1),  # 63 digits
        (lambda text: text + "\n", 5),  # an empty line after the four
        (lambda text: text + text.splitlines()[0] + "\n", 5),  # a file listed twice
        (lambda text: text.splitlines()[0][:66] + "\n" + text, 1),  # no file name
        (lambda text: "\n".join(text.splitlines()[:2] + [text.splitlines()[2][:64]] + text.splitlines()[3:]), 3),
    ],
)
def test_damaged_checksum_list_is_refused_not_read_around(parquet, damage, line):
    """Each damage is named by the line it is on, counted from 1 as editors do."""
    from pipeline.core.parquet import verify_checksum

    sums = parquet.parent / "SHA256SUMS"
    assert len(sums.read_text().splitlines()) == 4
    sums.write_text(damage(sums.read_text()))
    with pytest.raises(DataError, match=rf"^{re.escape(str(sums))}: line {line} is not '<64 hex digits>  <file>'"):
        verify_checksum(parquet / "train.parquet")


def test_a_parquet_file_that_links_out_of_its_codec_folder_is_refused(parquet, tmp_path):
    """verify_checksum hashes only files inside the folder its SHA256SUMS describes: a link
    that leads out of it is refused, one inside it followed."""
    from pipeline.core.bounded import UnsafeFileError
    from pipeline.core.parquet import verify_checksum

    train = parquet / "train.parquet"
    inside, outside = parquet.parent / "kept.parquet", tmp_path / "elsewhere.parquet"
    train.rename(inside)
    train.symlink_to(inside)
    verify_checksum(train)
    outside.write_bytes(inside.read_bytes())
    train.unlink()
    train.symlink_to(outside)
    with pytest.raises(
        UnsafeFileError,
        match=rf"^{re.escape(str(train))}: a link to {re.escape(str(outside.resolve()))}, outside "
        rf"{re.escape(str(parquet.parent.resolve()))}",
    ):
        verify_checksum(train)


def test_checksum_list_that_is_not_text_is_refused(parquet):
    from pipeline.core.parquet import verify_checksum

    sums = parquet.parent / "SHA256SUMS"
    sums.write_bytes(b"\xff\xfe" + sums.read_bytes())
    with pytest.raises(DataError, match=rf"^{sums}: not a SHA256SUMS text file"):
        verify_checksum(parquet / "train.parquet")


def test_one_sha256sums_rule_for_both_engines_a_file_named_twice_is_refused():
    """The local reader and the Ray engine's URL reader parse SHA256SUMS with one function: a
    second line for the same file is a damaged list, not a correction that wins."""
    from pipeline.core.errors import DataError
    from pipeline.core.parquet import parse_sums
    from pipeline.stages.shard import ray as ray_shard

    good, bad = "a" * 64, "b" * 64
    assert parse_sums(f"{good}  compact/train.parquet\n", "S") == {"compact/train.parquet": good}
    for text in (f"{good}  compact/train.parquet\n{bad}  compact/train.parquet\n", f"{good} compact/x\n", "zz  x\n"):
        with pytest.raises(DataError, match=r"^S: line \d is not '<64 hex digits>  <file>'"):
            parse_sums(text, "S")
    assert ray_shard.parse_sums is parse_sums  # the URL reader's own copy is gone
