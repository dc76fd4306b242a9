"""How fast can the same training step run? Every `variants.Execution` worth trying, side by side.

Runs the static-step runner (one batch shape, last batch padded and weighted) over a data
set resident on the device, for each execution: eager or torch.compile (modes), fp32 or
bf16 autocast, channels_last, with or without CUDA graphs (of an epoch, or of a step). Prints per
execution the fastest and median train epoch, the test pass, the setup it costs (warm-up
with compiling and autotuning, graph capture) and the accuracy reached; then where one
compiled and one eager step spend their time (torch.profiler): on CUDA the kernels per step,
on a CPU the operators dispatched per step.

    python benchmarks/gpu_steps.py --mirror <folder with mnist/> [--dataset mnist] [--epochs 5]
    python benchmarks/gpu_steps.py --shards data/shards/mnist --epochs 2 --only "no graph"

Builds its inputs with `pipeline.standalone` (IDX files, checked against sources.yaml), so
it runs on a machine with torch alone, unless `--shards` names a shard folder the pipeline
already wrote. Chooses `bench.compiled.cuda` in params.yaml.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.bench.datapaths import Resident  # noqa: E402
from pipeline.bench.runners import StaticSteps, Timing, TrainConfig, train_static  # noqa: E402
from pipeline.bench.variants import Execution  # noqa: E402
from pipeline.budget import sync  # noqa: E402
from pipeline.standalone import build_inputs  # noqa: E402

CANDIDATES = {
    "eager fp32, no graph": Execution(),
    "eager fp32 + graph (graphed)": Execution(cuda_graph=True),
    "eager bf16 CL + graph": Execution(autocast=True, channels_last=True, cuda_graph=True),
    "compile default bf16 CL, no graph": Execution(compile_mode="default", autocast=True, channels_last=True),
    "compile default fp32 + graph": Execution(compile_mode="default", cuda_graph=True),
    "compile default bf16 + graph": Execution(compile_mode="default", autocast=True, cuda_graph=True),
    "compile default bf16 CL + graph": Execution(
        compile_mode="default", autocast=True, channels_last=True, cuda_graph=True
    ),
    "compile default bf16 CL + step graph": Execution(
        compile_mode="default", autocast=True, channels_last=True, cuda_graph=True, graph_scope="step"
    ),
    "compile max-autotune-no-cg bf16 CL + graph": Execution(
        compile_mode="max-autotune-no-cudagraphs", autocast=True, channels_last=True, cuda_graph=True
    ),
}


def profile_step(data: Resident, device: torch.device, config: TrainConfig, execution: Execution, top: int) -> None:
    """Where one step's time goes, from torch.profiler over 20 warm steps. On CUDA: the
    device's kernels (what a launch-bound step has too many of). On a CPU: the operators
    the step dispatches, top-level (each a trip through the dispatcher from Python, the
    CPU's launch) and in all, by their own time."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    run = StaticSteps(data, device, config, execution)
    run.prepare(Timing())
    run.before_epoch(0)
    for step in range(5):
        run.train_step(step)
    sync(device)
    steps = 20
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for step in range(steps):
            run.train_step(step)
        sync(device)
    if cuda:
        events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
        own = [e.self_device_time_total for e in events]
        total = sum(own)
        print(f"\nkernels of one step ({execution}), {total / steps / 1000:.3f} ms GPU time per step:")
    else:
        events = list(prof.key_averages())
        own = [e.self_cpu_time_total for e in events]
        total = sum(own)
        top_level = sum(1 for e in prof.events() if e.cpu_parent is None)
        calls = sum(e.count for e in events)
        print(
            f"\noperators of one step ({execution}): {top_level / steps:.0f} dispatched from Python, "
            f"{calls / steps:.0f} in all, {total / steps / 1000:.3f} ms of their own time on the calling threads:"
        )
    for e, us in sorted(zip(events, own), key=lambda pair: -pair[1])[:top]:
        print(f"  {us / steps:8.1f} us  {100 * us / total:5.1f}%  {e.count // steps:3d}x  {e.key[:90]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--mirror", type=Path, help="a folder with <dataset>/ IDX files: inputs built here")
    source.add_argument("--shards", type=Path, help="a shard folder the pipeline wrote (train/ and test/)")
    parser.add_argument("--dataset", default="mnist")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--work", type=Path, default=Path("/tmp/pipeline-gpu-steps"))
    parser.add_argument("--only", nargs="*", help="substrings of the candidates to run")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shards = args.shards or build_inputs(args.dataset, args.mirror, args.work, Path("sources.yaml"), 32768, None)[1]
    data = Resident.load(shards, device, args.dataset)
    config = TrainConfig()
    torch.zeros(1, device=device)  # CUDA context outside every row
    rows = []
    for name, execution in CANDIDATES.items():
        if args.only and not any(s in name for s in args.only):
            continue
        started = time.perf_counter()
        try:
            timing = train_static(data, device, config, execution, epochs=args.epochs, started=started, progress=name)
        except Exception as err:  # one failing candidate must not lose the others' figures
            print(f"{name}: FAILED {type(err).__name__}: {err}", file=sys.stderr)
            continue
        rows.append((name, timing))
    print(
        f"\n{args.dataset} on {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, "
        f"torch {torch.__version__}, batch {config.batch_size}, {args.epochs} epochs"
    )
    print(
        f"{'execution':46s} {'best ms':>8s} {'median':>8s} {'test ms':>8s} {'setup s':>8s} {'warm s':>7s} "
        f"{'capt s':>7s} {'wall s':>7s} {'acc':>7s} graph"
    )
    for name, t in rows:
        wall = t.setup_s + sum(t.train_s) + sum(t.test_s)
        print(
            f"{name:46s} {1000 * min(t.train_s):8.1f} {1000 * statistics.median(t.train_s):8.1f} "
            f"{1000 * statistics.median(t.test_s):8.2f} {t.setup_s:8.2f} {t.warmup_s:7.2f} {t.capture_s:7.2f} "
            f"{wall:7.2f} {t.accuracy:7.4f} {t.cuda_graph}"
        )
    profile_step(data, device, config, Execution(compile_mode="default", autocast=True, channels_last=True), 15)
    profile_step(data, device, config, Execution(autocast=True, channels_last=True), 10)


if __name__ == "__main__":
    main()
