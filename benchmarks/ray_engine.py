"""The data stages' two engines on one machine: convert (CSV -> Parquet) and shard (Parquet ->
safetensors) of an N-times-MNIST data set, local and Ray, with throughput and peak memory
per process, and the parts a cluster's time would rest on.

    python benchmarks/ray_engine.py --scale 10             # 600,000 train rows, 100,000 test
    python benchmarks/ray_engine.py --scale 100            # 6 million train rows (the issue's)

The data set is MNIST's train and test splits repeated `--scale` times (real images, so the
codecs compress as they would), written as the csv stage writes them. Each stage runs in its
own process (`python benchmarks/ray_engine.py run ...`), the Ray engine on a local cluster
that process starts (every CPU of the machine), as the stage does without RAY_ADDRESS. While
it runs, every process of its tree is sampled from /proc/<pid>/smaps_rollup: the peak of
`Pss_Anon` (anonymous pages, what the kernel cannot drop), with `Pss_File` (page cache
mapped) and `Pss_Shmem` (Ray's object store is shared memory) beside it, per role (the
stage's own process, Ray's workers, Ray's daemons). The two engines' outputs are compared
byte for byte. Then, in the stage's process alone, the parts that set the time on more
nodes: one task's work (parse a CSV block, write a block of shards) and the work that stays
serial (the driver's Parquet encoding, the split's digest pass).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MIRROR_ENV = "PIPELINE_MIRROR"  # the fetch stage's local mirror: a folder holding mnist/
IDX = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
CODEC, ROW_GROUP, SHARD = "zstd-3", 65536, 32768  # params.yaml's values


def read_idx(mirror: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(images [n, 28, 28], labels [n]) uint8 of one MNIST split from its gzip IDX files."""
    images_file, labels_file = (mirror / name for name in IDX[split])
    images = np.frombuffer(gzip.decompress(images_file.read_bytes()), np.uint8, offset=16).reshape(-1, 28, 28)
    labels = np.frombuffer(gzip.decompress(labels_file.read_bytes()), np.uint8, offset=8)
    return images, labels


def make_csv(mirror: Path, folder: Path, scale: int) -> dict[str, int]:
    """train.csv and test.csv holding MNIST's rows `scale` times over; {split: rows}."""
    from pipeline.stages.csvdata import write_csv

    rows = {}
    for split in IDX:
        images, labels = read_idx(mirror, split)
        once = folder / f"{split}.once.csv"
        write_csv(images, labels, once)
        text = once.read_bytes()
        header = text.index(b"\n") + 1
        with open(folder / f"{split}.csv", "wb") as out:
            out.write(text[:header])
            for _ in range(scale):
                out.write(memoryview(text)[header:])
        once.unlink()
        rows[split] = len(labels) * scale
    return rows


# ---------------------------------------------------------------- peak memory per process


ROLES = ("stage process", "ray workers", "ray daemons")


def _children() -> dict[int, list[int]]:
    """{pid: its children's pids}, from /proc."""
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parent = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(parent, []).append(int(entry))
    return kids


def _tree(root: int) -> list[int]:
    kids, todo, found = _children(), [root], []
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += kids.get(pid, [])
    return found


def _pss(pid: int) -> dict[str, int] | None:
    """{anon, file, shmem} PSS in KiB of one process, None once it is gone."""
    keys = {"Pss_Anon:": "anon", "Pss_File:": "file", "Pss_Shmem:": "shmem"}
    try:
        lines = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
    except OSError:
        return None
    return {
        keys[line.split()[0]]: int(line.split()[1]) for line in lines if line.split()[:1] and line.split()[0] in keys
    }


def _role(pid: int, root: int) -> str:
    if pid == root:
        return ROLES[0]
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ROLES[2]
    return ROLES[1] if ("ray::" in command or "default_worker.py" in command) else ROLES[2]


class Peaks:
    """Per process of a tree, its peak PSS parts, sampled every `every` seconds on a thread."""

    def __init__(self, root: int, every: float = 0.2) -> None:
        self.root, self.every, self.peaks, self.roles = root, every, {}, {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.is_set():
            for pid in _tree(self.root):
                sample = _pss(pid)
                if sample is None:
                    continue
                if self.roles.get(pid) != ROLES[1]:  # a worker renames itself `ray::...` once it runs
                    self.roles[pid] = _role(pid, self.root)
                peak = self.peaks.setdefault(pid, {"anon": 0, "file": 0, "shmem": 0})
                for key, value in sample.items():
                    peak[key] = max(peak[key], value)
            self.done.wait(self.every)

    def stop(self) -> dict[str, dict]:
        """{role: {processes, anon_mb, file_mb, shmem_mb}}: the largest peak of any one process."""
        self.done.set()
        self.thread.join()
        out = {}
        for role in ROLES:
            peaks = [self.peaks[pid] for pid, r in self.roles.items() if r == role]
            if peaks:
                out[role] = {
                    "processes": len(peaks),
                    **{f"{key}_mb": max(p[key] for p in peaks) / 1024 for key in ("anon", "file", "shmem")},
                }
        return out


# ---------------------------------------------------------------- the stages, one process each


def sizes_only(out_paths: dict[str, Path], figures: dict) -> None:
    """The convert stage's read-back measurement left out: sizes only, no file read again."""
    for layout, path in out_paths.items():
        figures[layout].update(bytes=path.stat().st_size, read_s=0.0)


def run_stage(stage: str, engine: str, work: Path) -> None:
    """The stage's function as its command calls it (no sources pins: the data set is made here);
    `convert-writes`: the same without the stage's read-back measurement (each file read again,
    a row group at a time), so that what the writing itself takes and holds shows."""
    if stage.startswith("convert"):
        import pipeline.stages.convert.stage as convert

        if stage == "convert-writes":
            convert.measure_reads = sizes_only
        out = work / (f"pq-{engine}" if stage == "convert" else f"pq-{engine}-writes")
        convert.convert_dataset(
            work / "csv", out, work / f"figures-{stage}-{engine}.json", CODEC, ROW_GROUP, engine=engine
        )
    else:
        from pipeline.stages.shard.settings import ShardSettings
        from pipeline.stages.shard.stage import shard_dataset

        shard_dataset(
            work / "pq-local-writes" / "compact",
            work / f"shards-{engine}",
            "bench",
            ShardSettings(SHARD, engine=engine),
        )


def measure(stage: str, engine: str, work: Path) -> dict:
    """Seconds and peak memory per process of one stage run in its own process."""
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, __file__, "run", stage, engine, str(work)], cwd=ROOT)
    peaks = Peaks(process.pid)
    code = process.wait()
    seconds = time.perf_counter() - start
    memory = peaks.stop()
    if code:
        raise SystemExit(f"{stage} ({engine}) exited with {code}")
    return {"seconds": seconds, "memory": memory}


def tree_digest(folder: Path) -> dict[str, str]:
    out = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            digest = hashlib.sha256()
            with open(path, "rb") as f:
                while chunk := f.read(1 << 24):
                    digest.update(chunk)
            out[path.relative_to(folder).as_posix()] = digest.hexdigest()
    return out


# ---------------------------------------------------------------- the parts a cluster rests on


def parts(work: Path, rows: dict[str, int]) -> dict:
    """Seconds, in this one process, of one task's work and of the serial work of each stage."""
    from pipeline.core.codec import Codec
    from pipeline.stages.convert.ray import BLOCK_BYTES, parse_range, plan_ranges
    from pipeline.stages.convert.stage import write_compact
    from pipeline.stages.shard.settings import ShardSettings
    from pipeline.stages.shard.source import plan_blocks, split_digests, write_block

    csv = work / "csv" / "train.csv"
    ranges = plan_ranges(csv, BLOCK_BYTES)
    start = time.perf_counter()
    for begin, end in ranges[:4]:
        parse_range(str(csv), begin, end)
    parse_s = (time.perf_counter() - start) / min(4, len(ranges))
    parsed = [parse_range(str(csv), begin, end) for begin, end in ranges[:8]]
    parsed_rows = sum(len(labels) for labels, _ in parsed)
    start = time.perf_counter()
    write_compact(csv, work / "encode.parquet", Codec.parse(CODEC), ROW_GROUP, blocks=iter(parsed))
    encode_s = time.perf_counter() - start
    (work / "encode.parquet").unlink()
    source = work / "pq-local-writes" / "compact" / "train.parquet"
    total, blocks = plan_blocks(source, SHARD)
    scratch = work / "one-block"
    shutil.rmtree(scratch, ignore_errors=True)
    start = time.perf_counter()
    write_block(
        source,
        scratch,
        blocks[0],
        total=total,
        dataset="bench",
        split="train",
        layout=ShardSettings(SHARD),
    )
    block_s = time.perf_counter() - start
    shutil.rmtree(scratch)
    start = time.perf_counter()
    split_digests(source)
    digest_s = time.perf_counter() - start
    return {
        "csv_block_bytes": BLOCK_BYTES,
        "csv_blocks_train": len(ranges),
        "parse_rows_per_s": parsed_rows / len(parsed) / parse_s,
        "encode_rows_per_s": parsed_rows / encode_s,
        "shard_block_rows": blocks[0].count,
        "write_block_rows_per_s": blocks[0].count / block_s,
        "digest_rows_per_s": rows["train"] / digest_s,
        "train_rows": rows["train"],
    }


NODES, CORES = (10, 100), 8  # the clusters on paper: nodes of 8 cores
SHARED_FS_BYTES_S = 1e9  # assumption: the file system every node mounts, 1 GB/s
NODE_HOUR_USD = 0.40  # assumption: an on-demand 8-vCPU general-purpose instance


def on_paper(rows: dict[str, int], sizes: dict, rest: dict) -> list[str]:
    """The same job on 10 and 100 nodes, from this run's rates per core (`parts`) and the
    local convert's own figures: what stays in one process (convert: the compact encoding,
    the wide layout by polars, both read-backs; shard: the split's digest pass) plus what
    spreads over the cores (CSV parsing; one wave of shard blocks per round of cores), and the
    shards copied onto the shared file system."""
    total = rows["train"] + rows["test"]
    wide_s = rest.get("convert local: wide write s (both splits)")
    if wide_s is None:
        return []
    convert_serial = (
        total / rest["encode_rows_per_s"]
        + wide_s
        + rest["convert local: compact read-back s (both splits)"]
        + rest["convert local: wide read-back s (both splits)"]
    )
    parse_core_s = total / rest["parse_rows_per_s"]
    blocks = sum(-(-rows[split] // rest["shard_block_rows"]) for split in ("train", "test"))
    block_s = rest["shard_block_rows"] / rest["write_block_rows_per_s"]
    shard_serial = total / rest["digest_rows_per_s"]
    copy_s = sizes["shards"] / SHARED_FS_BYTES_S
    lines = [
        "",
        f"On paper: the same job on nodes of {CORES} cores, at this run's rates per core; the shared file "
        f"system at {SHARED_FS_BYTES_S / 1e9:g} GB/s and ${NODE_HOUR_USD:.2f} per node-hour are assumptions; "
        "cluster start-up not counted. convert: its own process encodes the compact file, writes the wide one "
        f"and reads both back (this run's local figures, on {os.cpu_count()} CPUs: polars' wide write would use "
        "a larger node's cores), while the CSV's parsing spreads over the cores; "
        f"shard: one task digests the split, {blocks} blocks are written in waves of one per core, and "
        f"{sizes['shards'] / 1e9:.1f} GB of shards go onto the shared file system.",
        "",
        "| stage | nodes | seconds | of which in one process | node-hours | cost |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for stage, serial, spread in (
        ("convert", convert_serial, lambda cores: parse_core_s / cores),
        ("shard", shard_serial, lambda cores: -(-blocks // cores) * block_s + copy_s),
    ):
        for nodes in NODES:
            seconds = serial + spread(nodes * CORES)
            hours = nodes * seconds / 3600
            lines.append(
                f"| {stage} | {nodes} | {seconds:,.0f} | {serial:,.0f} | {hours:.2f} | ${hours * NODE_HOUR_USD:.2f} |"
            )
    return lines


def report(scale: int, rows: dict[str, int], sizes: dict, runs: dict, rest: dict, same: dict) -> str:
    lines = [
        f"# convert and shard, local vs ray: MNIST x{scale} ({rows['train']:,} train + {rows['test']:,} test "
        f"rows), {os.cpu_count()} CPUs",
        "",
        "| stage | engine | seconds | rows/s | MB/s | process | n | peak Pss_Anon MB | Pss_File MB | Pss_Shmem MB |",
        "|---|---|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    total_rows = rows["train"] + rows["test"]
    for (stage, engine), run in runs.items():
        megabytes = sizes["csv" if stage.startswith("convert") else "parquet"] / 1e6
        first = True
        for role, mem in run["memory"].items():
            head = (
                (
                    f"| {stage} | {engine} | {run['seconds']:.1f} | {total_rows / run['seconds']:,.0f} | "
                    f"{megabytes / run['seconds']:.1f} |"
                )
                if first
                else "| | | | | |"
            )
            lines.append(
                f"{head} {role} | {mem['processes']} | {mem['anon_mb']:.0f} | {mem['file_mb']:.0f} | "
                f"{mem['shmem_mb']:.0f} |"
            )
            first = False
    lines += [
        "",
        "convert-writes: the convert stage without its read-back measurement (each file read again, "
        "a row group at a time, to time it), so that what the writing takes and holds shows.",
        "",
        f"MB/s: of the stage's input (convert: the CSVs, {sizes['csv'] / 1e6:,.0f} MB; shard: the compact "
        f"Parquet, {sizes['parquet'] / 1e6:,.0f} MB). Outputs identical between the engines: {same}.",
        "",
        "One process, one core each (what the estimate for more nodes rests on), and where the "
        "convert stage's time goes:",
        "",
    ]
    lines += [
        f"- {key}: {value:,.1f}" if isinstance(value, float) and value < 1000 else f"- {key}: {value:,.0f}"
        for key, value in rest.items()
    ]
    lines += on_paper(rows, sizes, rest)
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "run":
        run_stage(sys.argv[2], sys.argv[3], Path(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=int, default=100, help="MNIST's rows this many times (default 100)")
    parser.add_argument("--work", type=Path, help="scratch folder (default /tmp/ray-engine-x<scale>)")
    parser.add_argument(
        "--mirror", type=Path, help="folder of MNIST's gzip IDX files (default: $PIPELINE_MIRROR/mnist)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    parser.add_argument(
        "--no-read-back",
        action="store_true",
        help="leave out the whole convert stage (its read-back, a row group at a time, reads "
        "every file once more); convert-writes and shard still run",
    )
    args = parser.parse_args()
    if args.mirror is None:
        if not os.environ.get(MIRROR_ENV):
            parser.error(f"--mirror: give MNIST's IDX folder, or set {MIRROR_ENV} to a folder holding mnist/")
        args.mirror = Path(os.environ[MIRROR_ENV]) / "mnist"
    work = args.work or Path(f"/tmp/ray-engine-x{args.scale}")
    shutil.rmtree(work, ignore_errors=True)
    (work / "csv").mkdir(parents=True)
    rows = make_csv(args.mirror, work / "csv", args.scale)
    runs = {}
    for stage in ("convert-writes", "shard") if args.no_read_back else ("convert", "convert-writes", "shard"):
        for engine in ("local", "ray"):
            runs[stage, engine] = measure(stage, engine, work)
            print(f"{stage} {engine}: {runs[stage, engine]['seconds']:.1f} s", file=sys.stderr, flush=True)
    same = {
        "parquet": tree_digest(work / "pq-local-writes") == tree_digest(work / "pq-ray-writes"),
        "shards": tree_digest(work / "shards-local") == tree_digest(work / "shards-ray"),
    }
    sizes = {
        "csv": sum(p.stat().st_size for p in (work / "csv").glob("*.csv")),
        "parquet": sum(p.stat().st_size for p in (work / "pq-local-writes" / "compact").glob("*.parquet")),
        "shards": sum(p.stat().st_size for p in (work / "shards-local").rglob("*") if p.is_file()),
    }
    rest = parts(work, rows)
    for engine in ("local", "ray") if not args.no_read_back else ():
        figures = json.loads((work / f"figures-convert-{engine}.json").read_text())
        for key, name in (("write_s", "write"), ("read_s", "read-back")):
            for layout in ("compact", "wide"):
                rest[f"convert {engine}: {layout} {name} s (both splits)"] = sum(
                    figures[split][layout][key] for split in IDX
                )
    text = report(args.scale, rows, sizes, runs, rest, same)
    print(text)
    (work / "report.json").write_text(
        json.dumps(
            {
                "scale": args.scale,
                "rows": rows,
                "sizes": sizes,
                "same": same,
                "runs": {f"{s}/{e}": r for (s, e), r in runs.items()},
                "parts": rest,
            },
            indent=2,
        )
    )
    if not args.keep:
        shutil.rmtree(work / "csv")
        for name in ("pq-local", "pq-ray", "pq-local-writes", "pq-ray-writes", "shards-local", "shards-ray"):
            shutil.rmtree(work / name, ignore_errors=True)


if __name__ == "__main__":
    main()
