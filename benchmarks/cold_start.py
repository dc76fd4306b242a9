"""The `tuned` rung's time to accuracy, warm and cold, over many seeds, judged on their mean.

Public records time a run warm: the data already on the device, compile and capture done by an
untimed warm-up, the clock from the model's build to the test pass that reaches the target
(tuomaso/train_mnist_fast, airbench). A user waits cold: a fresh process, from its start
to that test pass, reading the shards, compiling and capturing included. Per seed, this runs
both, interleaved: *cold* a new Python process (timed from its spawn, and from its first read
of the shards), *warm* in this process after one untimed run. The target is judged the
anchors' way: the mean final accuracy over the seeds, with the worst seed beside it.

    python benchmarks/cold_start.py --shards data/shards/mnist --seeds 30
    python benchmarks/cold_start.py --shards data/shards/mnist --seeds 30 --epochs 1 --batch-size 128 --max-lr 0.005

Recipe flags override params.yaml's `bench.tuned`; nothing here is written but what it prints.
Where the rung compiles (CUDA), the first fresh process starts with an empty Inductor cache
(`TORCHINDUCTOR_CACHE_DIR`, a new folder: a miss) and the others share the folder it filled
(hits); each line says which. `--mirror` builds the shards from the IDX files first.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuned_recipe import add_recipe_flags, checked_settings, recipe_flags, with_recipe_flags  # noqa: E402 (this folder's)

from pipeline.bench.datapaths import Resident  # noqa: E402
from pipeline.bench.figures import seconds_spread, time_to_accuracy  # noqa: E402
from pipeline.bench.hostmem import reuse_host_memory  # noqa: E402
from pipeline.bench.ladder import run_variant  # noqa: E402
from pipeline.bench.recipe import execution_of, recipe_config  # noqa: E402
from pipeline.bench.runners import train_static  # noqa: E402
from pipeline.bench.settings import BenchSettings  # noqa: E402

CHILD_DEADLINE_S = 1800  # one fresh run: minutes on a 2-core CPU; past this, the benchmark stops


def settings_of(args: argparse.Namespace) -> BenchSettings:
    """params.yaml's bench block, the tuned recipe overridden by the flags, no profiled pass."""
    settings = checked_settings(Path(args.params))
    if settings.tuned is None:
        sys.exit(f"{args.params}: bench.tuned is not set: no recipe to time")
    return dataclasses.replace(with_recipe_flags(settings, args), budget=False)


def child(args: argparse.Namespace) -> None:
    """One cold run (in its own process): the rung as the bench runs it, its whole schedule;
    prints one JSON line whose times are on the system's monotonic clock, as the parent's."""
    settings = settings_of(args)
    device = torch.device(args.device)
    seeded = dataclasses.replace(settings, seed=args.child)
    read_at = time.perf_counter()  # CLOCK_MONOTONIC on Linux: the same clock in every process
    with reuse_host_memory(settings.reuse_host_memory):  # as the bench runs its rungs
        timing, _, _ = run_variant("tuned", args.dataset, Path(), args.shards, device, seeded)
    reached = time_to_accuracy(timing, args.target)
    done = None if reached.seconds is None else read_at + reached.seconds
    print(json.dumps({"read_at": read_at, "done": done, "accuracy": timing.accuracy, "epoch": reached.epoch}))


def cold(args: argparse.Namespace, seed: int, compile_cache: Path) -> dict:
    """A fresh process's run: seconds from spawn and from its first read to the target, with
    `compile_cache` as its Inductor cache folder."""
    recipe = recipe_flags(args)
    command = [sys.executable, __file__, f"--child={seed}", f"--shards={args.shards}", f"--dataset={args.dataset}"]
    command += [f"--target={args.target}", f"--params={args.params}", f"--device={args.device}", *recipe]
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(compile_cache)}
    spawned = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_DEADLINE_S, env=env)
    if result.returncode:
        sys.exit(f"seed {seed}: the fresh process failed (exit {result.returncode}): {result.stderr.strip()[-500:]}")
    found = json.loads(result.stdout.strip().splitlines()[-1])
    reached = found["done"] is not None
    return {
        "accuracy": found["accuracy"],
        "from_spawn": found["done"] - spawned if reached else None,
        "from_read": found["done"] - found["read_at"] if reached else None,
    }


def warm(data: Resident, device: torch.device, settings: BenchSettings, seed: int, target: float) -> dict:
    """A run in this warm process, the data resident: seconds from the model's build to the
    target, warm-up and capture left out (as the records time it)."""
    config = recipe_config(settings.tuned, seed)
    execution = execution_of(settings, "tuned", device)
    timing = train_static(data, device, config, execution, epochs=settings.tuned.epochs)
    return {"accuracy": timing.accuracy, "warm": time_to_accuracy(timing, target).warm_seconds}


def seconds(value: float | None) -> str:
    return "not reached" if value is None else f"{value:.3f} s"


def spread(values: list[float | None]) -> str:
    """The bench's rule (`figures.seconds_spread`): a seed that missed counts as slower than all."""
    found = seconds_spread(values)
    if not found["reached"]:
        return f"reached by 0/{len(values)}"
    worst = "inf (a seed missed)" if found["max"] is None else f"{found['max']:.3f}"
    return f"median {seconds(found['median'])}, min {found['min']:.3f}, max {worst} ({found['reached']}/{len(values)} reached)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--shards", type=Path, help="a shard folder the pipeline wrote (train/ and test/)")
    source.add_argument("--mirror", type=Path, help="a folder with <dataset>/ IDX files: shards built here")
    parser.add_argument("--work", type=Path, default=Path("/tmp/pipeline-cold-start"))
    parser.add_argument("--dataset", default="mnist")
    parser.add_argument("--seeds", type=int, default=30)
    parser.add_argument("--target", type=float, help="default: the data set's highest bench target")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add_recipe_flags(parser)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    settings = settings_of(args)
    if args.target is None:
        args.target = max(settings.targets(args.dataset), default=0.99)
    if args.child is not None:
        return child(args)
    if args.shards is None:
        from pipeline.standalone import build_inputs

        _, args.shards = build_inputs(args.dataset, args.mirror, args.work, Path("sources.yaml"), 32768, None)
    device = torch.device(args.device)
    compiles = execution_of(settings, "tuned", device).compile_mode != "none"
    seeds = list(range(settings.seed + 1, settings.seed + 1 + args.seeds))
    with reuse_host_memory(settings.reuse_host_memory):  # as the bench runs its rungs
        data = Resident.load(args.shards, device, args.dataset)
        warm(data, device, settings, settings.seed, args.target)  # the untimed warm-up run
        recipe = settings.tuned
        print(
            f"{args.dataset} on {device.type} ({torch.get_num_threads()} threads), tuned recipe: {recipe.epochs} epoch(s), "
            f"batch {recipe.batch_size}, one-cycle max_lr {recipe.max_lr:g} (pct_start {recipe.pct_start:g}), "
            f"betas {tuple(recipe.betas)}, label smoothing {recipe.label_smoothing:g}; target {args.target:.2%}; seeds {seeds[0]}-{seeds[-1]}",
            flush=True,
        )
        compile_cache = Path(tempfile.mkdtemp(prefix="cold-start-inductor-"))  # empty: the first process fills it
        rows = []
        for n, seed in enumerate(seeds):
            row = cold(args, seed, compile_cache) | {"cache": "none" if not compiles else "miss" if n == 0 else "hit"}
            row |= {f"warm_{k}": v for k, v in warm(data, device, settings, seed, args.target).items()}
            rows.append(row)
            print(
                f"seed {seed}: accuracy {row['accuracy']:.4f} (warm run {row['warm_accuracy']:.4f}); to target: "
                f"cold {seconds(row['from_spawn'])} from spawn (compile cache: {row['cache']}), "
                f"{seconds(row['from_read'])} from reading; warm {seconds(row['warm_warm'])}",
                file=sys.stderr,
                flush=True,
            )
        accuracies = [r["accuracy"] for r in rows]
        mean = statistics.mean(accuracies)
        target = f"{args.target:.2%}"
        print(
            f"final accuracy over {len(seeds)} fresh processes: mean {mean:.4%} (std {statistics.pstdev(accuracies):.4%}), "
            f"worst {min(accuracies):.4%}, best {max(accuracies):.4%}: the mean "
            f"{'reaches' if mean >= args.target else 'misses'} {target}"
        )
        if compiles:
            print(f"cold, from spawn, compile cache empty (seed {seeds[0]}): {spread([rows[0]['from_spawn']])}")
            print(f"cold, from spawn, compile cache filled by it:  {spread([r['from_spawn'] for r in rows[1:]])}")
        else:
            print(
                f"cold, from the process's spawn to the test pass at {target} (no compile): "
                f"{spread([r['from_spawn'] for r in rows])}"
            )
        print(f"cold, from its first read of the shards: {spread([r['from_read'] for r in rows])}")
        print(f"warm, data resident, warm-up and capture untimed: {spread([r['warm_warm'] for r in rows])}")
        shutil.rmtree(compile_cache, ignore_errors=True)


if __name__ == "__main__":
    main()
