"""What only a CUDA device can show: a captured epoch trains as the eager loop does, a
compiled model compiles nothing after its warm-up, and the time budget's parts add up with
the device's kernels in them, and the verdict names the bound of loops it never saw (a
replayed CUDA graph said as such). Marked `gpu`: skipped where torch sees no CUDA device (the
CPU forms of these checks run everywhere: tests/test_bench.py, tests/test_timebudget.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import device_path, resident

from pipeline.bench.model import SimpleCNN
from pipeline.bench.runners import TrainConfig, train_eager, train_static
from pipeline.bench.variants import Execution
from pipeline.budget import TimeBudget

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


def test_a_captured_epoch_trains_as_the_eager_loop():
    """One CUDA graph per epoch (padded, weighted last batch) against the `device` loop."""
    data, config = resident(device="cuda"), TrainConfig(batch_size=32)
    eager = train_eager(device_path(data, 32, config.seed), CUDA, config, epochs=2)
    static = train_static(data, CUDA, config, Execution(cuda_graph=True), epochs=2)
    assert static.cuda_graph is True
    assert static.loss == pytest.approx(eager.loss, rel=1e-3)
    assert abs(static.accuracy - eager.accuracy) <= 0.02


def test_compiled_inside_the_graph_compiles_nothing_after_warm_up():
    data, config = resident(n_train=70, n_test=40, device="cuda"), TrainConfig(batch_size=32)
    timing = train_static(data, CUDA, config, Execution(compile_mode="default", cuda_graph=True), epochs=3)
    assert timing.warmup_s > 0 and len(timing.train_s) == 3  # under fail_on_recompile: a recompile stops it


def test_the_budget_on_cuda_counts_kernels_and_adds_up():
    model = SimpleCNN().to(CUDA)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = [(torch.rand(256, 1, 28, 28), torch.randint(0, 10, (256,))) for _ in range(12)]
    budget = TimeBudget("cuda", steps=6, skip=3)
    for x, y in budget.batches(batches):
        with budget.step():
            x, y = x.to(CUDA, non_blocking=True), y.to(CUDA, non_blocking=True)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    result = budget.result
    step = result.per_step
    assert 0 < step["step_s"] <= step["wall_s"] + 1e-5, step  # the events lie inside the plain clock's window
    assert result.kernels_per_step > 10 and result.peak_device_bytes > 0
    assert step["compute_s"] > 0 and step["copy_s"] > 0, step  # the kernels, and the memcpys found in the trace
    # every kernel matched to its launch call, and the overhead split into its two halves
    assert step["host_wait_s"] is not None and step["launch_gap_s"] is not None, step
    assert step["host_wait_s"] + step["launch_gap_s"] == pytest.approx(step["overhead_s"], abs=2e-6), step


def test_a_graphed_epochs_budget_matches_its_kernels_to_the_graphs_launch():
    """A replayed epoch: every kernel carries its graph launch's correlation id, so the
    device's idle time splits into host wait and launch gaps that sum to the overhead."""
    data, config = resident(device="cuda"), TrainConfig(batch_size=32)
    step = train_static(data, CUDA, config, Execution(cuda_graph=True), epochs=2, budget=4).budget
    assert step["kernels_per_step"] > 10 and 0 < step["step_s"] <= step["wall_s"] + 1e-5, step
    assert step["host_wait_s"] is not None and step["launch_gap_s"] is not None, step
    assert step["host_wait_s"] + step["launch_gap_s"] == pytest.approx(step["overhead_s"], abs=2e-6), step


def test_a_captured_epoch_follows_the_one_cycle_schedule_step_by_step():
    """The tuned recipe's rate is a device tensor the captured step reads, refilled per epoch:
    the graph replays train as the same schedule run step by step without a graph."""
    from pipeline.bench.runners import OneCycle

    data = resident(device="cuda")
    config = TrainConfig(batch_size=32, lr=0.01, betas=(0.9, 0.99), schedule=OneCycle(max_lr=0.01))
    plain = train_static(data, CUDA, config, Execution(), epochs=3)
    graphed = train_static(data, CUDA, config, Execution(cuda_graph=True), epochs=3)
    assert graphed.cuda_graph is True and plain.cuda_graph is False
    assert graphed.loss == pytest.approx(plain.loss, rel=1e-3)
    assert graphed.accuracies == pytest.approx(plain.accuracies, abs=0.02)


def test_one_captured_step_replayed_per_step_trains_as_the_captured_epoch():
    """`graph_scope="step"`: one step's graph, a counter on the device choosing each step's
    batch and rate, replayed once per step: the captured epoch's training (eager and compiled
    steps alike; a compiled one compiles nothing after its warm-up)."""
    from pipeline.bench.runners import OneCycle

    data = resident(n_train=70, n_test=40, device="cuda")
    config = TrainConfig(batch_size=32, lr=0.01, betas=(0.9, 0.99), schedule=OneCycle(max_lr=0.01))
    for options in ({}, {"compile_mode": "default", "autocast": True, "channels_last": True}):
        epoch = train_static(data, CUDA, config, Execution(cuda_graph=True, **options), epochs=3, budget=3)
        step = train_static(
            data, CUDA, config, Execution(cuda_graph=True, graph_scope="step", **options), epochs=3, budget=3
        )
        assert step.cuda_graph is True and step.budget["kernels_per_step"] > 10, options
        assert step.loss == pytest.approx(epoch.loss, rel=1e-2), options
        assert step.accuracies == pytest.approx(epoch.accuracies, abs=0.03), options


ROOT = Path(__file__).resolve().parents[1]
LOOPS = ROOT / "benchmarks" / "verdict_loops.py"


@pytest.mark.parametrize(
    "kind, labels",
    [
        ("data", ("DATA WAIT",)),  # a Dataset that builds each item in Python
        ("launch", ("OVERHEAD", "DISPATCH")),  # 49 tiny layers at batch 64: the host issues, the device waits
        ("compute", ("COMPUTE",)),  # 4096-wide matmuls at batch 2048, the split on the device
    ],
)
def test_profile_names_the_bound_of_three_cuda_loops_it_never_saw(kind, labels):
    """`python -m pipeline profile` on three CUDA loops that are not the bench's own, each
    built to be bound by one thing: the verdict names that bound, with the kernels counted."""
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", "profile", "--steps", "20", "--skip", "5", str(LOOPS), kind, "cuda"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if "-BOUND" in line)  # the step's line(s) come first, wrapped
    head, said = " ".join(lines[:at]), lines[at]
    assert "on cuda" in head and " kernels" in head, head
    assert said.startswith(tuple(f"{label}-BOUND" for label in labels) + tuple(f"{label} +" for label in labels)), (
        done.stdout
    )


def test_a_replayed_step_is_reported_as_a_graph_replay_never_as_idle_time():
    """The three-line API over a loop that replays one captured train step per batch (PyTorch's
    whole-network capture): the report counts one graph replay a step, the graph's kernels are
    compute (not idle time), and the step is never told to capture a CUDA graph."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).to(CUDA)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=True)
    static_x, static_y = torch.randn(512, 256, device=CUDA), torch.randint(0, 10, (512,), device=CUDA)

    def train_step() -> None:
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(static_x), static_y).backward()
        optimizer.step()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graph's docs do
        for _ in range(3):
            train_step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        train_step()
    batches = [(torch.randn(512, 256), torch.randint(0, 10, (512,))) for _ in range(16)]
    budget = TimeBudget("cuda", steps=10, skip=3)
    for x, y in budget.batches(batches):
        with budget.step():
            static_x.copy_(x, non_blocking=True)
            static_y.copy_(y, non_blocking=True)
            graph.replay()
        if budget.done:
            break
    result = budget.result
    assert result.graphs_per_step == 1.0 and result.kernels_per_step > 5, result.to_json()
    assert result.per_step["compute_s"] > 0, result.per_step  # the graph's kernels, seen and counted as compute
    text = result.report()
    assert " from 1 CUDA graph replay" in text.split("\n")[0], text
    assert "capture the step" not in text and "UNSEEN GRAPH" not in text, text


def test_train_under_torchrun_runs_on_the_gpu(tmp_path):
    """nccl takes CUDA tensors only: the ranks' small CPU messages (the settings they agree
    on, the checkpoint lock, the outputs' verdict) go over gloo beside it, or the first of
    them stops a GPU run."""
    import json
    import os

    import yaml
    from conftest import make_split, write_shards

    root = Path(__file__).resolve().parents[1]
    for split, n in (("train", 120), ("test", 40)):
        write_shards(*make_split(n, 0), tmp_path / "s" / split, dataset="t", split=split, samples_per_shard=50)
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["train"].update(epochs=1, batch_size=40, checkpoint_every=2)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    args = ["--standalone", "--nproc-per-node", "1", "-m", "pipeline", "train", "t", "--shards", str(tmp_path / "s")]
    args += ["--out", str(tmp_path / "o.json"), "--checkpoint", str(tmp_path / "ck.pt"), "--params", "params.yaml"]
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", *args],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    metrics = json.loads((tmp_path / "o.json").read_text())
    assert metrics["device"].startswith("cuda") and metrics["epochs"][0]["world_size"] == 1, metrics
