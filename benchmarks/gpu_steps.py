"""How fast can the same training step run? Every `runners.Execution` worth trying, side by side.

Runs the static-step runner (one batch shape, last batch padded and weighted) over a data
set resident on the device, for each execution: eager or torch.compile (modes), fp32 or
bf16 autocast, channels_last, with or without CUDA graphs (of an epoch, or of a step). Prints per
execution the fastest and median train epoch, the test pass, the setup it costs (warm-up
with compiling and autotuning, graph capture) and the accuracy reached; then the top
kernels of one compiled step (torch.profiler), to show where the step's GPU time goes.

    python benchmarks/gpu_steps.py --mirror <folder with mnist/> [--dataset mnist] [--epochs 5]

Builds its inputs with `pipeline.standalone` (IDX files, checked against sources.yaml), so
it runs on a machine with torch alone. Chooses `bench.compiled.cuda` in params.yaml.
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
from pipeline.bench.runners import Execution, StaticSteps, Timing, TrainConfig, train_static  # noqa: E402
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
    from torch.profiler import ProfilerActivity, profile

    run = StaticSteps(data, device, config, execution)
    run.prepare(Timing())
    run.before_epoch(0)
    for step in range(5):
        run.train_step(step)
    torch.cuda.synchronize()
    steps = 20
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for step in range(steps):
            run.train_step(step)
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    total = sum(e.self_device_time_total for e in events)
    print(f"\nkernels of one step ({execution}), {total / steps / 1000:.3f} ms GPU time per step:")
    for e in sorted(events, key=lambda e: -e.self_device_time_total)[:top]:
        print(
            f"  {e.self_device_time_total / steps:8.1f} us  {100 * e.self_device_time_total / total:5.1f}%  "
            f"{e.count // steps:3d}x  {e.key[:90]}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mirror", type=Path, required=True)
    parser.add_argument("--dataset", default="mnist")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--work", type=Path, default=Path("/tmp/pipeline-gpu-steps"))
    parser.add_argument("--only", nargs="*", help="substrings of the candidates to run")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    _, shards = build_inputs(args.dataset, args.mirror, args.work, Path("sources.yaml"), 32768, None)
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
    if device.type == "cuda":
        profile_step(data, device, config, Execution(compile_mode="default", autocast=True, channels_last=True), 15)
        profile_step(data, device, config, Execution(autocast=True, channels_last=True), 10)


if __name__ == "__main__":
    main()
