"""Two nodes reading their shards from S3: what each node downloads, and a cold against a warm epoch.

    python benchmarks/two_nodes.py --shards data/shards/mnist [--reshard 4096] [--epochs 1]

Starts moto's S3 server on 127.0.0.1 (a real HTTP endpoint, in this process), uploads the
shard folder's train/ and test/ to s3://scale/<layout>/, and runs `python -m pipeline train`
as two torchrun launches (`--nnodes 2`, c10d rendezvous on 127.0.0.1, one gloo rank each),
each node with its own empty cache folder: the cold run. Then the same launches again on the
now warm caches. With --reshard N the same samples are also written as shards of N samples
(`write_split`) and run the same way: finer shards let each node fetch less (each node
fetches the shards its rank's run of each epoch's shard order touches).

Per layout, run and node: the bytes and shards fetched (train and test), the seconds to read
the epoch's shards before its first step (fetching included) and the whole epoch's seconds,
from the ranks' `--record` files. Writes results/scale/mnist/two_nodes.json and its table,
two_nodes.md, which docs/scale.md includes (refresh the page with `python
tools/record_commands.py --refill`; tests/test_scale.py checks they agree).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# One folder further down than results/<machine>/*.json, which the report stage reads as bench results.
RESULTS = ROOT / "results" / "scale" / "mnist" / "two_nodes.json"
TABLE = RESULTS.with_suffix(".md")
KEY = "test"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_s3():
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": KEY,
        "AWS_SECRET_ACCESS_KEY": KEY,
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    return server, env


def upload(env: dict, folder: Path, prefix: str) -> None:
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        region_name="us-east-1",
        aws_access_key_id=KEY,
        aws_secret_access_key=KEY,
    )
    if "scale" not in [b["Name"] for b in client.list_buckets().get("Buckets", [])]:
        client.create_bucket(Bucket="scale")
    for split in ("train", "test"):
        for file in sorted((folder / split).iterdir()):
            client.upload_file(str(file), "scale", f"{prefix}/{split}/{file.name}")


def reshard(source: Path, dest: Path, samples_per_shard: int) -> None:
    from pipeline.shards import read_manifest, read_split, write_split
    from pipeline.shards.format import manifest_sample

    for split in ("train", "test"):
        manifest = read_manifest(source / split)
        columns = read_split(source / split)
        write_split(
            {name: values.numpy() for name, values in columns.items()},
            dest / split,
            sample=manifest_sample(manifest),
            dataset=manifest["dataset"],
            split=split,
            samples_per_shard=samples_per_shard,
        )


def run_nodes(env: dict, url: str, work: Path, name: str, params: Path, dataset: str = "mnist") -> list[dict]:
    """One two-node launch (`train DATASET`: the shards' manifests must name it); per node, its
    rank's record."""
    port = free_port()
    launches = []
    for node in range(2):
        out = work / name / f"node{node}"
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
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
            name,
            "-m",
            "pipeline",
            "train",
            dataset,
            "--shards",
            url,
            "--cache",
            str(work / f"cache{node}"),
            "--out",
            str(out / "train.json"),
            "--record",
            "--params",
            str(params),
        ]
        launches.append(
            subprocess.Popen(
                cmd,
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **env},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    nodes = []
    for node, launch in enumerate(launches):
        output, _ = launch.communicate()
        if launch.returncode:
            sys.exit(f"node {node} failed:\n{output[-3000:]}")
        (record,) = (work / name / f"node{node}").glob("train.rank*.json")
        doc = json.loads(record.read_text())
        nodes.append(
            {
                "node": node,
                "rank": doc["rank"],
                "train_bytes": doc["fetched"]["train"]["bytes"],
                "train_shards": len(doc["fetched"]["train"]["shards"]),
                "test_bytes": doc["fetched"]["test"]["bytes"],
                "test_shards": len(doc["fetched"]["test"]["shards"]),
                "epochs": [
                    {
                        "epoch": e["epoch"],
                        "read_seconds": e["read_seconds"],
                        "seconds": e["seconds"],
                        "fetched_bytes": e["fetched_bytes"],
                    }
                    for e in doc["epochs"]
                ],
                "params_sha256": doc["params_sha256"],
            }
        )
    return nodes


def measure(shards: Path, epochs: int, samples: list[int]) -> dict:
    import yaml

    work = Path(tempfile.mkdtemp(prefix="two-nodes-"))
    server, env = start_s3()
    try:
        params = yaml.safe_load((ROOT / "params.yaml").read_text())
        params["train"].update(epochs=epochs, checkpoint_every=0)
        (work / "params.yaml").write_text(yaml.safe_dump(params))
        layouts = []
        for per_shard in samples:
            folder, name = shards, "as-committed"
            if per_shard:
                folder, name = work / f"shards-{per_shard}", f"shards-of-{per_shard}"
                reshard(shards, folder, per_shard)
            upload(env, folder, name)
            for cache in work.glob("cache*"):
                shutil.rmtree(cache)
            manifest = json.loads((folder / "train" / "manifest.json").read_text())
            total = sum(e["bytes"] for e in manifest["shards"])
            test = json.loads((folder / "test" / "manifest.json").read_text())
            runs = {}
            for run in ("cold", "warm"):
                runs[run] = run_nodes(
                    env, f"s3://scale/{name}", work, f"{name}-{run}", work / "params.yaml", manifest["dataset"]
                )
            layouts.append(
                {
                    "layout": name,
                    "train_shards": len(manifest["shards"]),
                    "train_bytes": total,
                    "test_shards": len(test["shards"]),
                    "test_bytes": sum(e["bytes"] for e in test["shards"]),
                    "runs": runs,
                }
            )
        return {
            "what": "two torchrun nodes (one gloo rank each, CPU) reading MNIST shards from moto S3 on 127.0.0.1",
            "command": " ".join(["python", "benchmarks/two_nodes.py", *sys.argv[1:]]),
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "epochs": epochs,
            "global_batch": params["train"]["batch_size"],
            "seed": params["train"]["seed"],
            "layouts": layouts,
        }
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def fetched(n: int, shards: int) -> str:
    return f"{n:,} B ({n / (1 << 20):.1f} MiB) in {shards} shard{'' if shards == 1 else 's'}"


def render(results: dict) -> str:
    """The docs block: one row per layout, run and node."""
    lines = [
        f"Measured by `{results['command']}` ({results['what']}; {results['machine']['cpus']} CPUs, "
        f"{results['epochs']} epoch per run, global batch {results['global_batch']}). The epoch's time is mostly "
        f'the model\'s compute, on a machine shared with other jobs; the fetch is in "read before step 1".',
        "",
        "| shards | run | node (rank) | train fetched | test fetched | read before step 1 | epoch |",
        "|---|---|---|---|---|---|---|",
    ]
    for layout in results["layouts"]:
        label = f"{layout['layout']}: {layout['train_shards']} train shards, {layout['test_shards']} test"
        for run, nodes in layout["runs"].items():
            for node in nodes:
                first = node["epochs"][0]
                lines.append(
                    f"| {label} | {run} | {node['node']} ({node['rank']}) | "
                    f"{fetched(node['train_bytes'], node['train_shards'])} | "
                    f"{fetched(node['test_bytes'], node['test_shards'])} | {first['read_seconds']:.2f} s | "
                    f"{first['seconds']:.1f} s |"
                )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=Path, required=True, help="A shard stage folder (train/, test/).")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--reshard", type=int, default=0, help="Also run with shards of this many samples.")
    args = parser.parse_args()
    started = time.perf_counter()
    results = measure(args.shards, args.epochs, [0] + ([args.reshard] if args.reshard else []))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    TABLE.write_text(render(results) + "\n")
    print(render(results))
    print(f"({time.perf_counter() - started:.0f} s)", file=sys.stderr)


if __name__ == "__main__":
    main()
