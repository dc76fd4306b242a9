"""The time budget's accounting, on synthetic traces (CUDA ones included) and one real
profiled pass on the CPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from pipeline.bench import budget
from pipeline.bench.budget import exclusive, intersect, split, subtract, trace_intervals, union

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


def event(name, start, end, device=CPU, parent=None, thread=1):
    """A profiler event as `profile.events()` gives it (a range we or anyone marked is an
    annotation)."""
    return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start * 1e6, end=end * 1e6),
                           device_type=device, cpu_parent=parent, thread=thread,
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
