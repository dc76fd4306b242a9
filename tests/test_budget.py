"""The time budget's accounting, on synthetic traces (CUDA ones included) and one real
profiled pass on the CPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from pipeline.bench import budget
from pipeline.bench.budget import (device_idle, exclusive, idle_split, intersect, per_step, queued_intervals, split,
                                   subtract, trace_intervals, union)
from pipeline.bench.verdict import verdict

CPU, CUDA = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA


def test_interval_arithmetic():
    assert union([(3, 4), (0, 1), (0.5, 2), (2, 2.5), (5, 5)]) == [(0, 2.5), (3, 4)]
    assert intersect([(0, 2), (3, 6)], [(1, 4), (5, 7)]) == [(1, 2), (3, 4), (5, 6)]
    assert subtract([(0, 10)], [(1, 2), (4, 6), (9, 12)]) == [(0, 1), (2, 4), (6, 9)]
    assert subtract([(0, 1)], []) == [(0, 1)] and subtract([(0, 1)], [(0, 1)]) == []


def test_exclusive_counts_each_instant_once_in_priority_order():
    parts = exclusive((0, 10), [("a", [(0, 4)]), ("b", [(2, 6), (20, 30)]), ("c", [(5, 8)])])
    assert parts == {"a": 4, "b": 2, "c": 2, "other": 2}  # b loses 2..4 to a; c loses 5..6 to b
    assert sum(parts.values()) == 10


def event(name, start, end, device=CPU, parent=None, thread=1, id=0):
    """A profiler event as `profile.events()` gives it (a range we or anyone marked is an
    annotation; `id` is its correlation id)."""
    return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start * 1e6, end=end * 1e6),
                           device_type=device, cpu_parent=parent, thread=thread, id=id,
                           is_user_annotation=name.startswith("budget:") or "#" in name)


def cpu_trace():
    """Two CPU steps: data 0-2, copy 2-3, step 3-10 (ops 3-5, 6-9), then 10-11 idle loop;
    the second: data 11-12, copy 12-12.5, step 12.5-20 (op 13-19; a nested op inside it)."""
    step1, step2 = event("budget:step", 3, 10), event("budget:step", 12.5, 20)
    outer = event("aten::conv2d", 13, 19, parent=step2)
    return [event("budget:data_wait", 0, 2), event("aten::tensor", 0.5, 1.5, parent=None),
            event("budget:copy", 2, 3), step1, event("aten::addmm", 3, 5, parent=step1),
            event("aten::relu", 6, 9, parent=step1), event("budget:data_wait", 11, 12), event("budget:copy", 12, 12.5),
            step2, outer, event("aten::mkldnn_convolution", 14, 18, parent=outer)]


def test_annotations_are_looked_through_and_other_threads_left_out():
    """An op under `Optimizer.step#Adam.step` (an annotation inside the step) is one of the
    step's top-level ops; the annotation itself is not an op; an op of another thread (a
    pin-memory thread) during the step is not the step's."""
    step = event("budget:step", 0, 10)
    adam = event("Optimizer.step#Adam.step", 1, 9, parent=step)
    events = [step, adam, event("aten::add_", 2, 3, parent=adam), event("aten::mul_", 5, 6, parent=adam),
              event("aten::copy_", 4, 8, thread=2)]
    ranges, ops, kernels, memcpy = trace_intervals(events)
    assert ops == [(2, 3), (5, 6)] and kernels == [] and memcpy == []
    parts = split(ranges, ops, kernels, memcpy, cuda=False)
    assert parts["compute"] == pytest.approx(2) and parts["overhead"] == pytest.approx(8)


def test_cpu_split_from_a_trace():
    ranges, ops, kernels, memcpy = trace_intervals(cpu_trace())
    assert ranges == {"data_wait": [(0, 2), (11, 12)], "copy": [(2, 3), (12, 12.5)], "step": [(3, 10), (12.5, 20)]}
    assert (13, 19) in ops and (14, 18) not in ops  # only top-level ops: children are inside them
    parts = split(ranges, ops, kernels, memcpy, cuda=False)
    # the op inside data_wait (the Dataset's own tensor work) is data wait, not compute
    assert parts == pytest.approx({"data_wait": 3, "copy": 1.5, "compute": 11, "overhead": 3.5, "other": 1})
    assert sum(parts.values()) == pytest.approx(20)


def test_cuda_split_counts_device_time_first():
    """Kernels run while the host waits for data: that time is compute (the device was
    busy); the host inside a step while no kernel runs is overhead (launches, Python)."""
    ranges = {"data_wait": [(0, 2)], "copy": [(2, 3)], "step": [(3, 10)]}
    kernels = [(1, 2.5), (4, 5), (6, 7)]      # one still running from the previous step
    memcpy = [(2.5, 3)]
    parts = split(ranges, ops=[(3, 9)], kernels=kernels, memcpy=memcpy, cuda=True)
    assert parts == pytest.approx({"compute": 3.5, "copy": 0.5, "data_wait": 1, "overhead": 5, "other": 0})


def test_trace_sorts_device_events():
    events = [event("budget:step", 0, 9),
              event("budget:step", 0, 9, device=CUDA),  # the GPU-side copy of a user range: not a range
              event("Optimizer.step#Adam.step", 0.5, 8, device=CUDA),  # nor is anyone else's, nor a kernel
              event("Memcpy HtoD (Pageable -> Device)", 1, 2, device=CUDA),
              event("void cudnn::conv_kernel", 3, 4, device=CUDA)]
    ranges, ops, kernels, memcpy = trace_intervals(events)
    assert ranges == {"step": [(0, 9)]} and ops == [] and kernels == [(3, 4)] and memcpy == [(1, 2)]


def test_split_needs_a_marked_range():
    with pytest.raises(ValueError, match="no marked range"):
        split({}, [], [], [], cuda=False)


@pytest.mark.slow
def test_a_real_profiled_pass_adds_up():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [(torch.rand(32, 1, 28, 28), torch.randint(0, 10, (32,))) for _ in range(3)]

    def step(batch):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    parts = budget.profile_steps(iter(data * 3), lambda b: b, step, 7, torch.device("cpu"))
    assert parts["steps"] == 7 and parts["compute_s"] > 0
    total = sum(parts[f"{name}_s"] for name in budget.PARTS)
    assert total == pytest.approx(parts["step_s"], abs=1e-5) and all(parts[f"{n}_s"] >= 0 for n in budget.PARTS)



def test_per_step_sets_the_parts_beside_a_plain_clock():
    out = budget.per_step({"data_wait": 0.3, "copy": 0.0, "compute": 0.5, "overhead": 0.1, "other": 0.1}, 10, 1.25)
    assert out["step_s"] == pytest.approx(0.1) and out["wall_s"] == 0.125 and out["vs_wall"] == 0.8
    assert "wall_s" not in budget.per_step(dict.fromkeys(budget.PARTS, 1.0), 2)


def eager_cuda_trace():
    """One CUDA step, 0-10: kernel A (launched at 0.5) runs 1-3; B, launched at 2 while A
    ran, starts at 4; C, launched at 7, runs 7.5-9. A host op whose own id is C's
    correlation id (ids of ops and of launches are separate counters) comes first."""
    return [event("budget:step", 0, 10), event("aten::addmm", 0, 0.4, id=3),
            event("cudaLaunchKernel", 0.5, 0.7, id=1), event("cudaLaunchKernel", 2, 2.2, id=2),
            event("cudaLaunchKernel", 7, 7.2, id=3),
            event("kernel_a", 1, 3, device=CUDA, id=1), event("kernel_b", 4, 5, device=CUDA, id=2),
            event("kernel_c", 7.5, 9, device=CUDA, id=3)]


def test_device_idle_splits_into_host_wait_and_launch_gaps_instant_by_instant():
    """Idle 0-1, 3-4, 5-7.5, 9-10 (overhead 5.5). Work was queued 0.5-1 (A), 3-4 (B) and
    7-7.5 (C): launch gaps 2; the rest, nothing queued, is host wait 3.5."""
    events = eager_cuda_trace()
    ranges, _, kernels, memcpy = trace_intervals(events)
    queued, unmatched = queued_intervals(events)
    assert unmatched == 0 and sorted(queued) == [(0.5, 1), (2, 4), (7, 7.5)]  # not (0, 7.5): the op is no launch
    idle = idle_split(ranges, kernels, memcpy, queued)
    assert idle == pytest.approx({"host_wait": 3.5, "launch_gap": 2})
    overhead = split(ranges, [], kernels, memcpy, cuda=True)["overhead"]
    assert idle["host_wait"] + idle["launch_gap"] == pytest.approx(overhead)


def test_a_graphs_kernels_are_queued_from_its_one_launch():
    """A replayed CUDA graph: one launch call (0.1), three kernels with its correlation id;
    the device's idle instants after the launch are launch gaps, before it host wait."""
    events = [event("budget:step", 0, 4.5), event("cudaGraphLaunch", 0.1, 0.3, id=9),
              event("k1", 1, 2, device=CUDA, id=9), event("k2", 2.5, 3, device=CUDA, id=9),
              event("k3", 3.2, 4, device=CUDA, id=9)]
    ranges, _, kernels, memcpy = trace_intervals(events)
    idle = device_idle(events, ranges, kernels, memcpy, steps=1)
    overhead = per_step(split(ranges, [], kernels, memcpy, cuda=True), 1)["overhead_s"]
    assert idle == pytest.approx({"host_wait_s": 0.6, "launch_gap_s": 1.6})  # 0-0.1 and 4-4.5; 0.1-1, 2-2.5, 3-3.2
    assert idle["host_wait_s"] + idle["launch_gap_s"] == pytest.approx(overhead, abs=1e-9)


def test_no_split_when_a_launch_is_missing_from_the_trace():
    """A kernel whose launch call is not in the trace: the split would guess, so none."""
    events = eager_cuda_trace()[:-4] + eager_cuda_trace()[-3:]  # C's launch call dropped
    ranges, _, kernels, memcpy = trace_intervals(events)
    assert queued_intervals(events)[1] == 1
    assert device_idle(events, ranges, kernels, memcpy, steps=1) == {"host_wait_s": None, "launch_gap_s": None}


def test_an_overhead_bound_cuda_verdict_names_the_half_that_bounds_it():
    parts = {"data_wait_s": 0.0, "copy_s": 0.0, "compute_s": 0.2, "other_s": 0.0, "steps": 4}
    host = budget.Budget(per_step={**parts, "overhead_s": 0.8, "host_wait_s": 0.6, "launch_gap_s": 0.2, "step_s": 1.0},
                         device="cuda:0")
    gaps = budget.Budget(per_step={**parts, "overhead_s": 0.8, "host_wait_s": 0.1, "launch_gap_s": 0.7, "step_s": 1.0},
                         device="cuda:0")
    unsplit = budget.Budget(per_step={**parts, "overhead_s": 0.8, "step_s": 1.0}, device="cuda:0")
    assert "(host wait 60%, launch gaps 20%)" in verdict(host) and "CUDA graph" in verdict(host)
    assert "(host wait 10%, launch gaps 70%)" in verdict(gaps) and "fuse" in verdict(gaps)
    assert "host wait" not in verdict(unsplit) and "CUDA graph" in verdict(unsplit)
