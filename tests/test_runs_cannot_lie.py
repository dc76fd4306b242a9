"""Runs cannot lie: hostile arguments, params, outputs, checkpoints and ranks, each refused with
one line (exit status 2, no traceback) or handled correctly, and nothing written outside the
case's own folder.

Every case runs with its own tmp folder as the current folder; processes get TMPDIR inside it
(torchrun's scratch files too), no GPU (CUDA_VISIBLE_DEVICES empty: gloo on the CPU, as on the
machines that run the suite) and a timeout. `confined` checks after each case that the
repository and the other cases' folders hold the same entries as before it.

The single-rank training runs start the rank process itself (RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT set as torchrun sets them), so that its own exit status is seen (torchrun reports
any failed rank as 1); the two-node and the stopped-rank cases run under torchrun.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml
from conftest import PARAMS, free_port, make_split, tiny_dataset, write_shards

ROOT = Path(__file__).resolve().parents[1]
PIPELINE_FRAME = f'File "{ROOT / "pipeline"}'  # a traceback through the project's code
SCRATCH = ".scratch"  # TMPDIR of the case's processes, inside its folder
SKIP = {".git", ".venv", ".venv-peers", "__pycache__", ".hypothesis", ".pytest_cache", "mutants"}
DIST_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
)


# ---------------------------------------------------------------- helpers


def tree(root: Path) -> set[str]:
    """Every path under `root` but the virtual environments, git and caches."""
    found = set()
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP]
        rel = Path(folder).relative_to(root)
        found |= {str(rel / name) for name in dirs + files}
    return found


@pytest.fixture(autouse=True)
def confined(tmp_path, monkeypatch):
    """The case runs in its own folder and writes nowhere else: not in the repository, not
    beside its folder (the other cases' and the module fixtures' folders)."""
    repo, base = tree(ROOT), set(os.listdir(tmp_path.parent))
    monkeypatch.chdir(tmp_path)
    yield
    assert tree(ROOT) ^ repo == set(), "the case wrote in (or removed from) the repository"
    assert set(os.listdir(tmp_path.parent)) - base - {tmp_path.name} == set(), "the case wrote beside its folder"


def env_for(folder: Path, **extra: str) -> dict[str, str]:
    scratch = folder / SCRATCH
    scratch.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in DIST_VARS}
    return {
        **env,
        "PYTHONPATH": str(ROOT),
        "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "TMPDIR": str(scratch),
        **extra,
    }


def cli(args: list, cwd: Path, timeout: float = 90, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *map(str, args)],
        cwd=cwd,
        env=env or env_for(cwd),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def rank_process(args: list, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m pipeline train ...` as the only rank of a torchrun job would run it."""
    env = env_for(
        cwd,
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        LOCAL_WORLD_SIZE="1",
        GROUP_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
    )
    return cli(args, cwd, timeout, env)


def one_line(result: subprocess.CompletedProcess, alone: bool = True) -> str:
    """Exit status 2, exactly one `Error:` line on stderr, no traceback (`alone`: and nothing
    else on stderr); returns the line."""
    everything = result.stdout + result.stderr
    assert result.returncode == 2, everything[-3000:]
    assert "Traceback" not in everything, everything[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, everything[-3000:]
    if alone:
        assert result.stderr.splitlines() == errors, everything[-3000:]
    return errors[0]


def snapshot(path: Path):
    """What `path` is, byte for byte: a link's target, a file's bytes, a folder's entries."""
    if path.is_symlink():
        return "link", os.readlink(path)
    if path.is_file():
        return "file", path.read_bytes()
    return "folder", {
        str(p.relative_to(path)): (os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else "folder")
        for p in sorted(path.rglob("*"))
        if SCRATCH not in p.relative_to(path).parts
    }


def params_file(path: Path, **train) -> Path:
    """The repository's params.yaml with `train` overrides."""
    params = yaml.safe_load(PARAMS.read_text())
    params["train"].update(train)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(params))
    return path


def torchrun(args: list, cwd: Path, log: Path) -> subprocess.Popen:
    """torchrun, its output (and its ranks') into `log`."""
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", *map(str, args)],
            cwd=cwd,
            env=env_for(cwd),
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def stop(process: subprocess.Popen, ranks: tuple[int, ...] = ()) -> None:
    """End what is left of a torchrun launch: its rank processes (torchrun starts each in a
    session of its own), continued first should one be stopped, then torchrun."""
    pids = set(ranks) | (set(children(process.pid)) if process.poll() is None else set())
    for pid in pids:
        if is_rank(pid):
            for sig in (signal.SIGCONT, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
    if process.poll() is None:
        process.kill()
    process.wait(timeout=30)


def is_rank(pid: int) -> bool:
    """A live process of ours running `-m pipeline train` (not a pid reused since)."""
    try:
        return b"pipeline\0train\0" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _stat(pid: int) -> tuple[str, int, int]:
    """(state, ppid, pgid) of a process, or ("", -1, -1) once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "", -1, -1
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[2])


def children(pid: int) -> list[int]:
    return [child for child in _pids() if _stat(child)[1] == pid]


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


# ---------------------------------------------------------------- 1. the CODEC argument


@pytest.mark.slow
@pytest.mark.parametrize(
    "codec, named",
    [("gzip-10", "'gzip-10': gzip levels are 1..9"), ("zstd-³", "³"), ("", "unknown codec ''")],
    ids=["gzip-10", "zstd-superscript-3", "empty"],
)
def test_a_bad_codec_argument_is_one_line(tmp_path, codec, named):
    (tmp_path / "csv").mkdir()
    line = one_line(cli(["convert", "mnist", codec, "--csv", "csv", "--out", "pq", "--figures", "f.json"], tmp_path))
    assert line.startswith("Error: CODEC: ") and named in line, line
    assert sorted(os.listdir(tmp_path)) == sorted([SCRATCH, "csv"]) and os.listdir(tmp_path / "csv") == []


@pytest.mark.parametrize(
    "spec",
    ["zstd-³", "zstd-١", "gzip-５", "zstd-", "zstd-03", "gzip-+5"],
    ids=["superscript", "arabic-indic", "fullwidth", "no-level", "leading-zero", "plus"],
)
def test_a_level_of_non_ascii_digits_or_another_spelling_is_refused_naming_the_codec(spec):
    """One spelling per codec: the spec names the codec's folder and figures, so 'zstd-03'
    (a second name for zstd-3) and 'zstd-' (none) are refused, as are digits that are not ASCII."""
    from pipeline.core.codec import Codec

    with pytest.raises(ValueError, match=re.escape(f"codec {spec!r}: the level after '-' must be an integer")):
        Codec.parse(spec)


# ---------------------------------------------------------------- 2-3. params.yaml


@pytest.fixture
def params():
    return yaml.safe_load(PARAMS.read_text())


@pytest.mark.slow
@pytest.mark.parametrize(
    "command",
    [["check-params", "--out", "out"], ["codecs", "--figures", "pq", "--metrics", "out", "--plot", "plot.csv"]],
    ids=["check-params", "codecs"],
)
def test_a_data_set_name_with_a_newline_stops_a_stage_in_one_line(tmp_path, params, command):
    """The params check, and a stage that reads `datasets` itself."""
    params["datasets"] = ["mnist\n"]
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(params))
    (tmp_path / "pq").mkdir()
    line = one_line(cli([*command, "--params", "p.yaml"], tmp_path))
    assert line == (
        "Error: p.yaml: 1 problem(s): datasets: data set names must be plain slugs (a-z, 0-9, '-', '_'): ['mnist\\n']"
    ), line
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def newline_entry(tmp_path_factory):
    """A tiny data set that sources.yaml lists as 'mnist\\n' (and as 'mnist'), its mirror under
    both names, and every stage's input made from it: each command below ran to its end with
    DATASET 'mnist\\n' (exit status 0, its output written) before DATASET was checked."""
    from pipeline.stages.convert.stage import convert_dataset
    from pipeline.stages.csvdata import write_csv
    from pipeline.stages.fetch.stage import fetch_dataset
    from pipeline.stages.shard.settings import ShardSettings
    from pipeline.stages.shard.stage import shard_dataset

    root = tmp_path_factory.mktemp("newline")
    tiny = tiny_dataset()
    entry = {"rows": {"train": 64, "test": 32}, "files": tiny.files, "mirrors": []}
    copy = json.loads(json.dumps(entry))  # (one object twice would be written as a YAML alias, refused)
    (root / "sources.yaml").write_text(yaml.safe_dump({"mnist": entry, "mnist\n": copy}))
    for name in ("mnist", "mnist\n"):
        tiny.write_mirror(root / "mirror" / name)
    for split in ("train", "test"):
        write_csv(tiny.arrays[f"{split}_images"], tiny.arrays[f"{split}_labels"], root / "csv" / f"{split}.csv")
    convert_dataset(root / "csv", root / "pq", root / "figures.json", "zstd-3", row_group_rows=1024)
    shard_dataset(root / "pq" / "compact", root / "shards", "mnist", ShardSettings(64, "none", 3))
    fetch_dataset("mnist", tiny.files, [], root / "raw", env={"PIPELINE_MIRROR": str(root / "mirror")})
    params_file(root / "params.yaml", epochs=1, batch_size=32)
    return root


@pytest.mark.slow
@pytest.mark.parametrize(
    "command",
    [
        ["fetch", "--out", "out"],
        ["csv", "--raw", "{root}/raw", "--out", "out"],
        ["convert", "zstd-3", "--csv", "{root}/csv", "--out", "out", "--figures", "figures.json"],
        ["shard", "--parquet", "{root}/pq/compact", "--out", "out"],
        ["bench", "--parquet", "{root}/pq/wide", "--shards", "{root}/shards", "--out", "out", "--machine", "m.json"],
        ["train", "--shards", "{root}/shards", "--out", "out"],
    ],
    ids=lambda command: command[0],
)
def test_a_dataset_argument_with_a_newline_is_refused_before_anything_is_written(tmp_path, newline_entry, command):
    """Even where sources.yaml has an entry of that name (fetch, csv and convert exited 0 with
    it, and wrote their output): one line naming it, exit status 2, nothing written."""
    root = newline_entry
    args = [command[0], "mnist\n", *(arg.format(root=root) for arg in command[1:])]
    args += [] if command[0] in ("bench", "train") else ["--sources", root / "sources.yaml"]
    args += [] if command[0] == "csv" else ["--params", root / "params.yaml"]
    if command[0] == "train":
        result = rank_process(args, tmp_path)
    else:
        result = cli(args, tmp_path, env=env_for(tmp_path, PIPELINE_MIRROR=str(root / "mirror")))
    line = one_line(result)
    assert line == "Error: data set names must be plain slugs (a-z, 0-9, '-', '_'): ['mnist\\n']", line
    assert sorted(os.listdir(tmp_path)) == [SCRATCH]


def test_a_megabyte_of_repeated_codecs_is_one_error_in_bounded_time(tmp_path, params):
    """~1 MiB of params.yaml (just under its cap), 200,000 codecs listed: validation ends
    with one problem, quickly (linear in the list). The bound is generous: nothing else
    measures this."""
    from pipeline.core.params import PARAMS_CAP, ParamsError
    from pipeline.stages.params import validate_params

    params["convert"]["codecs"] = "@codecs@"
    text = yaml.safe_dump(params).replace("'@codecs@'", "[" + ",".join(["none"] * 200_000) + "]")
    assert 0.9 * PARAMS_CAP < len(text.encode()) <= PARAMS_CAP
    loaded = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    assert len(loaded["convert"]["codecs"]) == 200_000
    start = time.perf_counter()
    with pytest.raises(ParamsError) as caught:
        validate_params(loaded)
    elapsed = time.perf_counter() - start
    assert str(caught.value) == "params.yaml: 1 problem(s): convert.codecs: codecs listed twice: ['none']"
    assert elapsed < 10, f"{elapsed:.1f} s"


def test_a_list_of_200000_wrong_values_is_a_bounded_message(params):
    from pipeline.core.params import ParamsError
    from pipeline.stages.params import validate_params

    params["convert"]["codecs"] = [1] * 200_000
    with pytest.raises(ParamsError) as caught:
        validate_params(params)
    message = str(caught.value)
    assert "\n" not in message and "convert.codecs.0: Input should be a valid string" in message
    assert len(message) < 64 << 10, f"{len(message):,} characters"


# ---------------------------------------------------------------- 4-5. outputs that are not ours


@pytest.fixture(scope="module")
def parquet_input(tmp_path_factory):
    """The tiny data set as the project's stages write it: CSV, then Parquet (compact
    layout), and a sources file with its rows."""
    from pipeline.stages.convert.stage import convert_dataset
    from pipeline.stages.csvdata import write_csv

    root = tmp_path_factory.mktemp("parquet")
    tiny = tiny_dataset()
    for split in ("train", "test"):
        write_csv(tiny.arrays[f"{split}_images"], tiny.arrays[f"{split}_labels"], root / "csv" / f"{split}.csv")
    convert_dataset(root / "csv", root / "pq", root / "f.json", "snappy")
    (root / "sources.yaml").write_text("tiny: {rows: {train: 64, test: 32}, files: {}}\n")
    return root


def shard_args(parquet_input: Path, out: str, params: Path = PARAMS) -> list:
    return [
        "shard",
        "tiny",
        "--parquet",
        parquet_input / "pq" / "compact",
        "--out",
        out,
        "--params",
        params,
        "--sources",
        parquet_input / "sources.yaml",
    ]


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind, out, message",
    [
        ("file", "out", "out: exists and is not a folder; refusing to replace it"),
        ("user folder", "out", "out: a folder this project did not write (no .pipeline-output inside); refusing"),
        ("link to a folder", "out", "out: exists and is not a folder; refusing to replace it"),
        ("current folder", ".", ".: is the current folder or one above it; refusing to replace it"),
        ("folder above", "..", "..: is the current folder or one above it; refusing to replace it"),
    ],
    ids=["file", "user folder", "link to a folder", "current folder", "folder above"],
)
def test_shard_refuses_an_output_it_did_not_write(tmp_path, parquet_input, kind, out, message):
    work = tmp_path / "work"
    work.mkdir()
    (work / "keep.txt").write_text("the user's\n")
    if kind == "file":
        (work / "out").write_bytes(b"the user's data\n")
    elif kind == "user folder":
        (work / "out").mkdir()
        (work / "out" / "notes.txt").write_text("the user's notes\n")
    elif kind == "link to a folder":
        (tmp_path / "elsewhere").mkdir()
        (tmp_path / "elsewhere" / "a.txt").write_text("the user's\n")
        (work / "out").symlink_to(tmp_path / "elsewhere")
    before = snapshot(tmp_path)
    line = one_line(cli(shard_args(parquet_input, out), work, env=env_for(tmp_path)))
    assert line.startswith(f"Error: {message}"), line
    assert snapshot(tmp_path) == before  # the file, the folder, the link and what it points to: untouched


@pytest.mark.slow
def test_shard_replaces_its_own_earlier_output(tmp_path, parquet_input):
    work = tmp_path / "work"
    work.mkdir()
    first = cli(shard_args(parquet_input, "out"), work, env=env_for(tmp_path))
    assert first.returncode == 0, first.stderr[-3000:]
    assert json.loads((work / "out" / "train" / "manifest.json").read_text())["count"] == 64
    (work / "out" / "train" / "leftover.txt").write_text("from before\n")
    smaller = yaml.safe_load(PARAMS.read_text())
    smaller["shard"]["samples_per_shard"] = 16
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(smaller))
    again = cli(shard_args(parquet_input, "out", tmp_path / "p.yaml"), work, env=env_for(tmp_path))
    assert again.returncode == 0 and "Error" not in again.stderr, again.stderr[-3000:]
    assert sorted(os.listdir(work / "out")) == [".pipeline-output", "test", "train"]
    assert sorted(os.listdir(work / "out" / "train")) == ["manifest.json"] + [
        f"shard-0000{i}.safetensors" for i in range(4)
    ]  # the new folder whole: 4 shards of 16, no leftover
    assert sorted(os.listdir(work)) == ["out"]  # no lock, no temporary left beside it


def _pinned_sources(root: Path) -> Path:
    """A sources file pinning the tiny data set's IDX files and those of another data set."""
    other = tiny_dataset(seed=7)
    path = root / "pinned.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "tiny": {"rows": {"train": 64, "test": 32}, "files": tiny_dataset().files},
                "other": {"rows": {"train": 64, "test": 32}, "files": other.files},
            }
        )
    )
    return path


@pytest.mark.slow  # (starts the CLI in a process)
def test_shard_refuses_parquet_of_another_data_set_naming_what_it_holds(tmp_path, parquet_input):
    """`shard other --parquet <tiny's Parquet>`: the labels, hashed as the published IDX file
    would be, are tiny's, not other's: refused before a shard is written, rc 2, one line."""
    sources = _pinned_sources(tmp_path)
    args = [
        "shard",
        "other",
        "--parquet",
        parquet_input / "pq" / "compact",
        "--out",
        "out",
        "--params",
        PARAMS,
        "--sources",
        sources,
    ]
    line = one_line(cli(args, tmp_path, env=env_for(tmp_path)))
    assert re.fullmatch(
        r"Error: \S+/compact/train\.parquet: holds tiny's train labels, not other's train labels "
        r"\(sha256 of the labels as an IDX file: [0-9a-f]{16}\.\.\., sources\.yaml pins "
        r"[0-9a-f]{16}\.\.\.\)",
        line,
    ), line
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # (starts the CLI in a process)
def test_shard_records_the_published_digests_it_checked(tmp_path, parquet_input):
    """The data set the Parquet is named for: sharded, and each manifest's source carries the
    sha256 of the published IDX files its samples are (equal to sources.yaml's pins)."""
    sources = _pinned_sources(tmp_path)
    args = [
        "shard",
        "tiny",
        "--parquet",
        parquet_input / "pq" / "compact",
        "--out",
        "out",
        "--params",
        PARAMS,
        "--sources",
        sources,
    ]
    result = cli(args, tmp_path, env=env_for(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    files = tiny_dataset().files
    for split in ("train", "test"):
        source = json.loads((tmp_path / "out" / split / "manifest.json").read_text())["source"]
        assert source["idx_sha256"] == {
            "images": files[f"{split}_images"]["sha256"],
            "labels": files[f"{split}_labels"]["sha256"],
        }


@pytest.mark.parametrize(
    "level, hint",
    [
        ("codec", "holds no train.parquet (folders: compact, wide): pass a layout folder: {pq}/compact"),
        (
            "data set",
            "holds no train.parquet (folders: zstd-3): pass the convert stage's <codec>/<layout> folder, "
            "e.g. data/parquet/<dataset>/zstd-3/compact",
        ),
    ],
)
def test_shard_names_a_folder_one_level_too_high(tmp_path, parquet_input, level, hint):
    """`--parquet` naming the codec folder (the layout forgotten), or one above: one line that
    says which folder is expected, not a SHA256SUMS missing one level up."""
    from pipeline.core.errors import DataError
    from pipeline.stages.shard.settings import ShardSettings
    from pipeline.stages.shard.stage import shard_dataset

    folder = parquet_input / "pq" if level == "codec" else tmp_path / "tiny"
    (tmp_path / "tiny" / "zstd-3").mkdir(parents=True)
    with pytest.raises(DataError) as caught:
        shard_dataset(folder, tmp_path / "out", "tiny", ShardSettings(16, "none", 3))
    assert str(caught.value) == f"{folder}: " + hint.format(pq=parquet_input / "pq")
    assert not (tmp_path / "out").exists()


def test_shard_refuses_the_other_split_and_images_nobody_published(tmp_path, parquet_input):
    """The test split offered as the train split is named as such; right labels with other
    images (one pixel changed) are refused once the images have streamed, naming no data set."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.core.errors import DataError
    from pipeline.core.parquet import IMAGE_TYPE
    from pipeline.stages.shard.settings import ShardSettings
    from pipeline.stages.shard.source import published_pins
    from pipeline.stages.shard.stage import stream_split

    pins = published_pins(_pinned_sources(tmp_path), "tiny")
    test_file = parquet_input / "pq" / "compact" / "test.parquet"
    with pytest.raises(DataError, match=r"test\.parquet: holds tiny's test labels, not tiny's train labels"):
        stream_split(
            test_file, tmp_path / "a", dataset="tiny", split="train", layout=ShardSettings(16), pins=pins["train"]
        )
    table = pq.read_table(test_file)
    images = bytearray(table.column("image")[5].as_py())
    images[100] ^= 1
    column = table.column("image").to_pylist()
    column[5] = bytes(images)
    changed = table.set_column(1, "image", pa.array(column, IMAGE_TYPE))
    pq.write_table(changed, tmp_path / "test.parquet")
    with pytest.raises(
        DataError,
        match=rf"^{re.escape(str(tmp_path / 'test.parquet'))}: holds samples no data set in sources\.yaml "
        r"has, not tiny's test images",
    ):
        stream_split(
            tmp_path / "test.parquet",
            tmp_path / "b",
            dataset="tiny",
            split="test",
            layout=ShardSettings(16),
            pins=pins["test"],
        )


def test_the_shard_stage_checks_each_split_against_its_own_pins(tmp_path, parquet_input):
    """The stage function as the CLI calls it, in process: another data set's pins stop it at
    the first split, nothing written; its own pins pass, each split checked against its own
    (the test split's samples are not the train split's) and recorded in its manifest."""
    from pipeline.core.errors import DataError
    from pipeline.stages.shard.settings import ShardSettings
    from pipeline.stages.shard.source import published_pins
    from pipeline.stages.shard.stage import shard_dataset

    sources, compact = _pinned_sources(tmp_path), parquet_input / "pq" / "compact"
    rows = {"train": 64, "test": 32}
    with pytest.raises(
        DataError, match=rf"^{re.escape(str(compact / 'train.parquet'))}: holds tiny's train labels, not other's"
    ):
        shard_dataset(
            compact,
            tmp_path / "out",
            "other",
            ShardSettings(16, "none", 3),
            rows=rows,
            pins=published_pins(sources, "other"),
        )
    assert not (tmp_path / "out").exists()
    shard_dataset(
        compact, tmp_path / "out", "tiny", ShardSettings(16, "none", 3), rows=rows, pins=published_pins(sources, "tiny")
    )
    files = tiny_dataset().files
    for split in ("train", "test"):
        source = json.loads((tmp_path / "out" / split / "manifest.json").read_text())["source"]
        assert source["idx_sha256"]["labels"] == files[f"{split}_labels"]["sha256"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (1, r"more rows than its footer states \(64\)"),
        (-1, r"63 rows, but its footer states 64"),
    ],
)
def test_rows_streamed_must_be_the_footers_count(tmp_path, parquet_input, monkeypatch, extra, message):
    """Pages holding more rows than the footer states are refused as they stream, before the
    extra rows are written; fewer, once the last batch is in. pyarrow reads by the footer, so
    a reader that yields one row more or less stands in for such a file."""
    import numpy as np

    from pipeline.core.errors import DataError
    from pipeline.stages.shard import stage as shard
    from pipeline.stages.shard.settings import ShardSettings

    real = shard.iter_samples

    def miscounted(path, batch_rows, rows):
        labels, images = (np.concatenate(arrays) for arrays in zip(*real(path, batch_rows, rows)))
        kept = len(labels) + min(extra, 0)  # every row, or all but the last
        yield labels[:kept], images[:kept]
        if extra > 0:  # then rows past the footer's count
            yield labels[:extra], images[:extra]

    monkeypatch.setattr(shard, "iter_samples", miscounted)
    source = parquet_input / "pq" / "compact" / "train.parquet"
    with pytest.raises(DataError, match=rf"^{re.escape(str(source))}: {message}$"):
        shard.stream_split(source, tmp_path / "out", dataset="tiny", split="train", layout=ShardSettings(16))
    assert not (tmp_path / "out" / "manifest.json").exists()
    # the writer works in a folder of its own and swaps it in only whole: nothing half-written is left
    assert not list((tmp_path / "out").glob("shard-*")) and sorted(p.name for p in tmp_path.iterdir()) in ([], ["out"])


def test_write_split_refuses_a_users_folder_and_replaces_its_own(tmp_path):
    from pipeline.core.errors import InputError

    images, labels = make_split(40, 0)
    user = tmp_path / "user"
    user.mkdir()
    (user / "notes.txt").write_text("the user's notes\n")
    before = snapshot(tmp_path)
    with pytest.raises(InputError) as caught:
        write_shards(images, labels, user, dataset="t", split="train", samples_per_shard=16)
    assert str(caught.value) == (
        f"{user}: a folder this project did not write (not only what it writes, a "
        f"manifest.json and its files); refusing to replace it (remove it yourself, or "
        f"choose another output)"
    )
    assert snapshot(tmp_path) == before
    own = tmp_path / "own"
    write_shards(images, labels, own, dataset="t", split="train", samples_per_shard=16)
    assert sorted(os.listdir(own)) == ["manifest.json"] + [f"shard-0000{i}.safetensors" for i in range(3)]
    write_shards(images, labels, own, dataset="t", split="train", samples_per_shard=40)  # its own output: replaced
    assert sorted(os.listdir(own)) == ["manifest.json", "shard-00000.safetensors"]
    (own / "leftover.txt").write_text("a file of the user's, put in beside\n")  # then it holds the user's too
    with pytest.raises(InputError, match="a folder this project did not write"):
        write_shards(images, labels, own, dataset="t", split="train", samples_per_shard=16)
    assert (own / "leftover.txt").read_text() == "a file of the user's, put in beside\n"
    (own / "leftover.txt").unlink()
    assert json.loads((own / "manifest.json").read_text())["shards"][0]["count"] == 40
    assert sorted(os.listdir(tmp_path)) == ["own", "user"]  # no lock, no temporary


def test_write_split_refuses_a_users_folder_that_holds_some_manifest_json(tmp_path):
    from pipeline.core.errors import InputError

    user = tmp_path / "webapp"
    user.mkdir()
    (user / "manifest.json").write_text('{"name": "my web app", "start_url": "/"}\n')
    (user / "index.html").write_text("<html></html>\n")
    before = snapshot(user)
    try:
        with pytest.raises(InputError, match="refusing to replace it"):
            write_shards(*make_split(40, 0), user, dataset="t", split="train", samples_per_shard=16)
    finally:
        assert snapshot(user) == before


def test_only_a_manifest_of_the_shard_format_inside_the_folder_makes_a_folder_ours(tmp_path):
    """A manifest.json without the format's version (an int) and its shard list, or one that
    is a link to a manifest elsewhere, is not ours: refused, untouched. Our own folder with the
    writer's leftover temporary beside it is ours: replaced."""
    from pipeline.core.errors import InputError

    images, labels = make_split(40, 0)
    own = tmp_path / "own"
    write_shards(images, labels, own, dataset="t", split="train", samples_per_shard=40)
    manifest = json.loads((own / "manifest.json").read_text())
    for i, text in enumerate(
        [
            json.dumps({k: v for k, v in manifest.items() if k != "format_version"}),
            json.dumps({**manifest, "format_version": str(manifest["format_version"])}),
            json.dumps({k: v for k, v in manifest.items() if k != "shards"}),
            "[1, 2]",
        ]
    ):
        other = tmp_path / f"other{i}"
        other.mkdir()
        (other / "manifest.json").write_text(text)
        (other / "shard-00000.safetensors").write_bytes(b"the user's")
        before = snapshot(other)
        with pytest.raises(InputError, match="refusing to replace it"):
            write_shards(images, labels, other, dataset="t", split="train", samples_per_shard=40)
        assert snapshot(other) == before
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "manifest.json").symlink_to(own / "manifest.json")
    with pytest.raises(InputError, match="refusing to replace it"):
        write_shards(images, labels, linked, dataset="t", split="train", samples_per_shard=40)
    assert (linked / "manifest.json").is_symlink()
    (own / ".manifest.json.tmp").write_text("{")  # a writer stopped mid-manifest
    write_shards(images, labels, own, dataset="t", split="train", samples_per_shard=20)
    assert sorted(os.listdir(own)) == ["manifest.json", "shard-00000.safetensors", "shard-00001.safetensors"]


# ---------------------------------------------------------------- 6. two nodes that disagree


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Shard folders of 600 train and 100 test samples in shards of 50: data set "a", data
    set "b" (other samples, as many), and "a" again with other samples; a params file for
    1 epoch of 10 steps; and a checkpoint saved at the end of a run on "a"."""
    root = tmp_path_factory.mktemp("data")
    for folder, dataset, seed in (("a", "a", 0), ("b", "b", 10), ("a-other", "a", 20)):
        for split, n, offset in (("train", 600, 0), ("test", 100, 1)):
            write_shards(
                *make_split(n, seed + offset), root / folder / split, dataset=dataset, split=split, samples_per_shard=50
            )
    params = params_file(root / "params.yaml", epochs=1, batch_size=60, checkpoint_every=0, timeout_s=20)
    run = rank_process(
        [
            "train",
            "a",
            "--shards",
            root / "a",
            "--out",
            root / "run" / "train.json",
            "--checkpoint",
            root / "a.pt",
            "--params",
            params,
        ],
        root,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    shutil.rmtree(root / SCRATCH)
    return root, params


def two_nodes(tmp_path: Path, shards: Path, params: list[Path], extra: list[list]) -> list[str]:
    """Train data set "a" as two nodes of one rank each (node N with `params[N]` and
    `extra[N]`), both waited for; their outputs."""
    port, run_id = free_port(), uuid.uuid4().hex[:8]
    launches = []
    for node in (0, 1):
        launches.append(
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
                    run_id,
                    "-m",
                    "pipeline",
                    "train",
                    "a",
                    "--shards",
                    shards / "a",
                    "--out",
                    tmp_path / f"node{node}" / "train.json",
                    "--params",
                    params[node],
                    *extra[node],
                ],
                tmp_path,
                tmp_path / f"node{node}.log",
            )
        )
    try:
        for launch in launches:
            launch.wait(timeout=150)
    finally:
        for launch in launches:
            stop(launch)
    for node, launch in enumerate(launches):
        output = (tmp_path / f"node{node}.log").read_text()
        assert launch.returncode != 0, output[-3000:]
        assert PIPELINE_FRAME not in output, output[-3000:]
        assert not (tmp_path / f"node{node}" / "train.json").exists()
    return [(tmp_path / f"node{node}.log").read_text() for node in (0, 1)]


def node_params(tmp_path: Path, node: int, **settings) -> Path:
    defaults = {"epochs": 1, "batch_size": 60, "timeout_s": 20, "checkpoint_every": 0}
    return params_file(tmp_path / f"node{node}" / "params.yaml", **{**defaults, **settings})


@pytest.mark.slow
@pytest.mark.parametrize("key, values", [("seed", (42, 44)), ("lr", (0.001, 0.002))], ids=["seed", "lr"])
def test_two_nodes_that_run_other_settings_both_stop(tmp_path, data, key, values):
    shards, _ = data
    params = [node_params(tmp_path, node, **{key: value}) for node, value in enumerate(values)]
    outputs = two_nodes(tmp_path, shards, params, [[], []])
    a, b = (re.escape(str(v)) for v in values)
    line = re.compile(
        rf"Error: rank 1 runs with {key} = ({a}|{b}), rank 0 with ({a}|{b}); every rank must run the "
        rf"same settings"
    )
    for output in outputs:
        ours = [m for m in map(line.fullmatch, output.splitlines()) if m]
        assert len(ours) == 1 and ours[0][1] != ours[0][2], output[-3000:]  # one line, naming both values
        assert re.search(r"exitcode\s*:\s*2 ", output), output[-3000:]  # torchrun's report: the rank's own status


@pytest.mark.slow
def test_two_nodes_that_restore_other_positions_both_stop(tmp_path, data):
    """Node 1 cannot see node 0's checkpoint (each names its own path): node 0 resumed from
    it, node 1 started afresh. Their collectives no longer matched (gloo aborted); now both
    stop with one line naming the positions."""
    shards, _ = data
    shutil.copy(shards / "a.pt", tmp_path / "ck0.pt")
    params = [node_params(tmp_path, node, epochs=2) for node in (0, 1)]
    extra = [["--checkpoint", tmp_path / f"ck{node}.pt", "--resume"] for node in (0, 1)]
    for output in two_nodes(tmp_path, shards, params, extra):
        line = re.compile(
            r"Error: rank 1 runs with checkpoint position = None, rank 0 with \{'epoch': 2, .*; every rank must"
        )
        assert sum(1 for text in output.splitlines() if line.fullmatch(text) or line.match(text)) == 1, output[-3000:]


# ---------------------------------------------------------------- 7-8. the data and the checkpoint


@pytest.mark.slow
def test_train_on_a_split_of_another_data_set_is_one_line(tmp_path, data):
    shards, params = data
    line = one_line(
        rank_process(
            ["train", "fashion-mnist", "--shards", shards / "b", "--out", "o/train.json", "--params", params], tmp_path
        ),
        alone=False,
    )
    assert line == (
        f"Error: {shards / 'b' / 'train' / 'manifest.json'}: manifest is for dataset 'b', expected 'fashion-mnist'"
    ), line
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    "folder, dataset, difference",
    [
        ("b", "b", r"dataset = 'a', this run has 'b'"),
        (
            "a-other",
            "a",
            r"test = \{'dataset': 'a', 'split': 'test', 'count': 100, 'shards': '([0-9a-f]{16})'\}, this run "
            r"has \{'dataset': 'a', 'split': 'test', 'count': 100, 'shards': '(?!\1)[0-9a-f]{16}'\}",
        ),
    ],
    ids=["another data set", "other samples of the same name"],
)
def test_resuming_on_other_data_is_refused_naming_the_difference(tmp_path, data, folder, dataset, difference):
    shards, params = data
    shutil.copy(shards / "a.pt", tmp_path / "ck.pt")
    before = (tmp_path / "ck.pt").read_bytes()
    line = one_line(
        rank_process(
            [
                "train",
                dataset,
                "--shards",
                shards / folder,
                "--out",
                "o/train.json",
                "--checkpoint",
                "ck.pt",
                "--resume",
                "--params",
                params,
            ],
            tmp_path,
        ),
        alone=False,
    )
    assert re.fullmatch(rf"Error: ck.pt: saved by a run with {difference}; resume only the run that saved it", line), (
        line
    )
    assert not (tmp_path / "o").exists() and (tmp_path / "ck.pt").read_bytes() == before


def _edit(state: dict, key: str, value) -> None:
    if key == "data.epoch":
        state["data"]["epoch"] = value
    elif key == "optimizer.lr":  # the run's lr kept in its record, the optimizer's changed
        state["optimizer"]["param_groups"][0]["lr"] = value
    elif key.startswith("history."):  # history.<epoch index>.<figure>
        _, index, figure = key.split(".")
        state["history"][int(index)][figure] = value
    else:
        state[key] = value


@pytest.mark.slow
@pytest.mark.parametrize(
    "key, value, message",
    [
        ("loss_so_far", float("nan"), "ck.pt: loss_so_far nan is not a finite non-negative number"),
        ("data", [1, 2], "ck.pt: data position is not a dict"),
        (
            "data.epoch",
            2**62,
            "ck.pt: data position is in epoch 4611686018427387904, but its history holds 1 finished epochs",
        ),
        ("global_step", -1, "ck.pt: global_step -1 is out of range"),
        # the history a resumed run copies into its out.json: checked as any input is
        ("history.0.loss", -4.25, "ck.pt: history epoch 1: loss -4.25 is not a finite number >= 0"),
        ("history.0.accuracy", 3.5, "ck.pt: history epoch 1: accuracy 3.5 is not in [0, 1]"),
        ("history.0.epoch", 2, "ck.pt: history epoch 1: is numbered 2: a history holds epochs 1, 2, ... in order"),
        ("history.0.steps", True, "ck.pt: history epoch 1: steps True is not a whole number >= 0"),
        (
            "history.0.extra",
            1.0,
            "ck.pt: history epoch 1: holds ['accuracy', 'epoch', 'extra', 'fetched_bytes', 'loss', "
            "'read_seconds', 'resumed_at_sample', 'seconds', 'steps', 'world_size'], not an epoch's figures "
            "['accuracy', 'epoch', 'fetched_bytes', 'loss', 'read_seconds', 'resumed_at_sample', 'seconds', "
            "'steps', 'world_size']",
        ),
        ("history.0.world_size", -2, "ck.pt: history epoch 1: world_size -2 is not a whole number >= 0"),
        ("loss_so_far", True, "ck.pt: loss_so_far True is not a finite non-negative number"),
        (
            "optimizer.lr",
            0.5,
            "ck.pt: its optimizer was saved with [{'lr': 0.5, ",
        ),
    ],
    ids=[
        "loss_so_far NaN",
        "data a list",
        "data epoch 2**62",
        "global_step -1",
        "history loss -4.25",
        "history accuracy 3.5",
        "history epoch out of order",
        "history steps a bool",
        "history an unknown figure",
        "history world_size -2",
        "loss_so_far a bool",
        "optimizer another lr",
    ],
)
def test_a_checkpoint_with_numbers_out_of_range_is_one_line(tmp_path, data, key, value, message):
    """Refused on resume, before any step: one line, exit status 2, no out.json, the
    checkpoint as it was."""
    import torch

    shards, params = data
    state = torch.load(shards / "a.pt", weights_only=True)
    _edit(state, key, value)
    torch.save(state, tmp_path / "ck.pt")
    before = (tmp_path / "ck.pt").read_bytes()
    line = one_line(
        rank_process(
            [
                "train",
                "a",
                "--shards",
                shards / "a",
                "--out",
                "o/train.json",
                "--checkpoint",
                "ck.pt",
                "--resume",
                "--params",
                params,
            ],
            tmp_path,
        ),
        alone=False,
    )
    assert line.startswith(f"Error: {message}") if key == "optimizer.lr" else line == f"Error: {message}", line
    assert not (tmp_path / "o").exists() and (tmp_path / "ck.pt").read_bytes() == before


@pytest.mark.slow
@pytest.mark.parametrize(
    "out, checkpoint, said",
    [
        ("ck.pt", "ck.pt", "Error: --out ck.pt is the --checkpoint file: give the metrics a file of their own"),
        ("SHARDS/train/manifest.json", None, "Error: --out SHARDS/train/manifest.json is inside the data"),
        ("o/train.json", "SHARDS/ck.pt", "Error: --checkpoint SHARDS/ck.pt is inside the data"),
        ("params.yaml", None, "Error: params.yaml: exists and is not what --out writes; refusing to replace it"),
        ("o/train.json", "params.yaml", "Error: params.yaml: exists and is not what --checkpoint writes; refusing"),
        (
            "p.txt/train.json",
            None,
            "Error: --out p.txt/train.json: a file stands where its folder goes",
        ),  # a file where a folder goes
    ],
    ids=[
        "out is the checkpoint",
        "out in the shards",
        "checkpoint in the shards",
        "out someone's file",
        "checkpoint someone's file",
        "out under a file",
    ],
)
def test_an_output_that_would_replace_an_input_is_refused_before_training(tmp_path, data, out, checkpoint, said):
    """Refused in one line before the first step: it replaced the split's manifest, the
    checkpoint or any file named, after a whole run, or failed with a traceback after it."""
    shards, params = data
    (tmp_path / "params.yaml").write_bytes(Path(params).read_bytes())
    (tmp_path / "p.txt").write_text("a file\n")
    (tmp_path / "ck.pt").write_bytes((shards / "a.pt").read_bytes())
    before = {p: p.read_bytes() for p in [*(shards / "a").rglob("*"), tmp_path / "params.yaml"] if p.is_file()}
    paths = [str(p).replace("SHARDS", str(shards / "a")) for p in (out, checkpoint) if p is not None]
    args = ["train", "a", "--shards", shards / "a", "--out", paths[0], "--params", "params.yaml"]
    result = rank_process([*args, "--checkpoint", paths[1]] if checkpoint else args, tmp_path)
    line = one_line(result, alone=False)
    assert line.startswith(said.replace("SHARDS", str(shards / "a"))), line
    assert "train epoch" not in result.stderr, result.stderr[-2000:]
    assert {p: p.read_bytes() for p in before} == before


@pytest.mark.slow
def test_a_finished_checkpoint_of_an_older_version_resumes_its_unknown_figures_as_null(tmp_path, data):
    """Saved before the epochs said their ranks: resumed, the run trains nothing more (its
    epochs are done) and its metrics say so: `resumed` at the end, the old epoch's ranks
    unknown (null), not this run's world size."""
    import torch

    shards, params = data
    state = torch.load(shards / "a.pt", weights_only=True)
    for epoch in state["history"]:
        del epoch["world_size"], epoch["resumed_at_sample"]
    torch.save(state, tmp_path / "ck.pt")
    args = ["train", "a", "--shards", shards / "a", "--out", "o/train.json", "--checkpoint", "ck.pt", "--resume"]
    done = rank_process([*args, "--params", params], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((tmp_path / "o" / "train.json").read_text())
    assert metrics["resumed"] == {"epoch": 2, "sample": 0, "global_step": state["global_step"]}
    assert [(e["world_size"], e["resumed_at_sample"]) for e in metrics["epochs"]] == [(None, None)]


@pytest.mark.slow
def test_a_checkpoint_whose_data_position_disagrees_with_its_history_is_refused(tmp_path, data):
    import torch

    shards, params = data
    state = torch.load(shards / "a.pt", weights_only=True)
    assert state["data"]["epoch"] == len(state["history"]) == 1  # saved at the end of epoch 1
    state["data"]["epoch"] = 0
    torch.save(state, tmp_path / "ck.pt")
    result = rank_process(
        [
            "train",
            "a",
            "--shards",
            shards / "a",
            "--out",
            "o/train.json",
            "--checkpoint",
            "ck.pt",
            "--resume",
            "--params",
            params,
        ],
        tmp_path,
    )
    try:
        line = one_line(result, alone=False)
        assert line.startswith("Error: ck.pt: ") and "history" in line, line
    finally:
        assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_a_fifo_as_the_checkpoint_is_one_line_without_waiting(tmp_path, data):
    shards, params = data
    os.mkfifo(tmp_path / "ck.pt")
    start = time.monotonic()
    line = one_line(
        rank_process(
            [
                "train",
                "a",
                "--shards",
                shards / "a",
                "--out",
                "o/train.json",
                "--checkpoint",
                "ck.pt",
                "--resume",
                "--params",
                params,
            ],
            tmp_path,
            timeout=60,
        ),
        alone=False,
    )
    assert line == "Error: ck.pt: exists and is not a regular file; refusing to replace it (choose another output)", (
        line
    )
    assert time.monotonic() - start < 60
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------- 9. a rank stopped


@pytest.mark.slow
def test_a_stopped_rank_ends_the_other_within_the_timeout(tmp_path, data):
    """Rank 1 is stopped (SIGSTOP) once training has begun (the first checkpoint is written,
    after step 1): rank 0 waits at most train.timeout_s in its next collective, then ends
    with one line and exit status 2."""
    shards, _ = data
    timeout_s = 15
    params = params_file(tmp_path / "params.yaml", epochs=100, batch_size=60, checkpoint_every=1, timeout_s=timeout_s)
    launch = torchrun(
        [
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "pipeline",
            "train",
            "a",
            "--shards",
            shards / "a",
            "--out",
            tmp_path / "o" / "train.json",
            "--checkpoint",
            tmp_path / "ck.pt",
            "--params",
            params,
        ],
        tmp_path,
        tmp_path / "torchrun.log",
    )
    ranks: dict[int, int] = {}
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "ck.pt").exists():
            assert launch.poll() is None and time.monotonic() < deadline, (tmp_path / "torchrun.log").read_text()
            time.sleep(0.05)
        ranks = {int(environ(pid)["RANK"]): pid for pid in children(launch.pid) if is_rank(pid)}
        assert sorted(ranks) == [0, 1]
        os.kill(ranks[1], signal.SIGSTOP)
        stopped = time.monotonic()
        while _stat(ranks[0])[0] not in ("", "Z"):  # rank 0 still running
            assert time.monotonic() - stopped < timeout_s + 60, "rank 0 still waits"
            time.sleep(0.2)
        ended = time.monotonic() - stopped
        os.kill(ranks[1], signal.SIGCONT)  # (torchrun has sent it SIGTERM: it ends now)
        launch.wait(timeout=60)
    finally:
        stop(launch, tuple(ranks.values()))
    output = (tmp_path / "torchrun.log").read_text()
    ended_line = re.compile(
        r"Error: rank (\d): (a collective did not complete within train\.timeout_s \(15 s\): "
        r"another rank stopped or failed|a collective waited past train\.timeout_s \(15 s\): "
        r"another rank stopped or failed|another rank's connection closed: it stopped or failed "
        r"\(its own line says why\))"
    )
    errors = [line for line in output.splitlines() if line.startswith("Error:")]
    ours = [ended_line.fullmatch(line) for line in errors]
    # rank 0's one line; rank 1, continued once rank 0 has ended, may find its collective timed out too
    assert all(ours) and [m[1] for m in ours if m[1] == "0"] == ["0"] and len(errors) <= 2, output[-3000:]
    assert PIPELINE_FRAME not in output, output[-3000:]
    # torchrun's report names rank 0's own exit status
    assert re.search(r"rank\s*:\s*0 \(local_rank: 0\)\s*\n\s*exitcode\s*:\s*2 ", output), output[-3000:]
    # it waited (not ended at once); rank 0 may have entered its collective before rank 1 stopped
    assert timeout_s - 5 <= ended < timeout_s + 60, ended
    assert not (tmp_path / "o" / "train.json").exists()


# ---------------------------------------------------------------- 10. the node cache


@pytest.fixture
def remote_split(tmp_path):
    """A split of 100 samples in shards of 25, at a memory:// URL."""
    fsspec = pytest.importorskip("fsspec")
    local = tmp_path / "local"
    write_shards(*make_split(100, 3), local, dataset="t", split="train", samples_per_shard=25)
    url = f"memory://cannot-lie-{uuid.uuid4().hex}/train"
    fs, root = fsspec.core.url_to_fs(url)
    for file in sorted(local.iterdir()):
        fs.pipe_file(f"{root}/{file.name}", file.read_bytes())
    yield local, url
    fs.rm(root, recursive=True)


def test_a_cache_whose_objects_folder_is_a_link_is_refused(tmp_path, remote_split):
    from pipeline.shards import ShardError
    from pipeline.shards.remote import RemoteShards

    _, url = remote_split
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "objects").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ShardError) as caught:
        RemoteShards(url, tmp_path / "cache", 1 << 30)
    assert str(caught.value) == (
        f"{tmp_path / 'cache' / 'objects'}: a link; the cache writes only inside a folder of its own"
    )
    assert os.listdir(tmp_path / "elsewhere") == [] and os.listdir(tmp_path / "cache") == ["objects"]


def test_a_cache_folder_that_is_a_link_is_refused_writing_nothing(tmp_path, remote_split):
    from pipeline.shards import ShardError
    from pipeline.shards.remote import RemoteShards

    _, url = remote_split
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "cache").symlink_to(tmp_path / "elsewhere")
    try:
        with pytest.raises(ShardError, match="a link; the cache writes only inside a folder of its own"):
            RemoteShards(url, tmp_path / "cache", 1 << 30)
    finally:
        assert os.listdir(tmp_path / "elsewhere") == []


def test_a_cache_whose_objects_is_a_dangling_link_is_refused(tmp_path, remote_split):
    from pipeline.shards import ShardError
    from pipeline.shards.remote import RemoteShards

    _, url = remote_split
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "objects").symlink_to(tmp_path / "nowhere")
    with pytest.raises(ShardError, match="a link; the cache writes only inside a folder of its own"):
        RemoteShards(url, tmp_path / "cache", 1 << 30)
    assert not (tmp_path / "nowhere").exists()


def test_a_stale_temporary_counts_against_the_bound_and_goes_first(tmp_path, remote_split):
    """A killed fetch's temporary (of shard 2) is as large as shard 1: with it, shards 0 and 1
    do not both fit the bound; fetching shard 1 removes the temporary, not shard 0 (the least
    recently used copy)."""
    from pipeline.shards.remote import RemoteShards

    local, url = remote_split
    entries = json.loads((local / "manifest.json").read_text())["shards"]
    sizes = [entry["bytes"] for entry in entries]
    split = RemoteShards(url, tmp_path / "cache", sizes[0] + sizes[1] + 10)
    objects = tmp_path / "cache" / "objects"
    stale = objects / f".{entries[2]['xxh3_128']}.safetensors.k1ll3d00.tmp"
    stale.write_bytes(b"x" * sizes[1])
    old = time.time() - 3600
    os.utime(stale, (old, old))
    split.local(0)
    assert stale.exists()  # shard 0 and the temporary fit: nothing removed
    split.local(1)
    copies = sorted(p.name for p in objects.iterdir() if not p.name.endswith(".lock"))
    assert copies == sorted(f"{entries[i]['xxh3_128']}.safetensors" for i in (0, 1))  # the temporary went first
    assert sum((objects / name).stat().st_size for name in copies) <= split.max_bytes
    assert split.counts.shards == ["shard-00000.safetensors", "shard-00001.safetensors"]


# ---------------------------------------------------------------- 11. a JSON output with NaN


@pytest.mark.parametrize(
    "document",
    [{"x": float("nan")}, {"epochs": [{"loss": float("inf")}]}, [1.0, -math.inf]],
    ids=["nan", "inf nested", "-inf in a list"],
)
def test_write_json_refuses_a_value_that_is_not_a_finite_number(tmp_path, document):
    from pipeline.core.atomic import write_json
    from pipeline.core.errors import InputError

    with pytest.raises(InputError) as caught:
        write_json(tmp_path / "metrics.json", document)
    assert str(caught.value) == (
        f"{tmp_path / 'metrics.json'}: refusing to write a value that is not a finite number (NaN or inf)"
    )
    assert os.listdir(tmp_path) == []  # no file, no temporary, no lock
    (tmp_path / "metrics.json").write_text("{}\n")
    with pytest.raises(InputError):
        write_json(tmp_path / "metrics.json", document)
    assert os.listdir(tmp_path) == ["metrics.json"] and (tmp_path / "metrics.json").read_text() == "{}\n"
