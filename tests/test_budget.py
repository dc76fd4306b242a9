"""The time budget's accounting, on synthetic traces (CUDA ones included) and one real
profiled pass on the CPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from pipeline.bench.profiled import profile_steps
from pipeline.budget import intervals, timebudget, trace
from pipeline.budget.intervals import exclusive, idle_split, intersect, per_step, split, subtract, union
from pipeline.budget.trace import device_idle, queued_intervals, trace_intervals, window_parts
from pipeline.budget.verdict import LadderQuote, evidence, rule_for, verdict

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
    return SimpleNamespace(
        name=name,
        time_range=SimpleNamespace(start=start * 1e6, end=end * 1e6),
        device_type=device,
        cpu_parent=parent,
        thread=thread,
        id=id,
        is_user_annotation=name.startswith("budget:") or "#" in name,
    )


def cpu_trace():
    """Two CPU steps: data 0-2, copy 2-3, step 3-10 (ops 3-5, 6-9), then 10-11 idle loop;
    the second: data 11-12, copy 12-12.5, step 12.5-20 (op 13-19; a nested op inside it)."""
    step1, step2 = event("budget:step", 3, 10), event("budget:step", 12.5, 20)
    outer = event("aten::conv2d", 13, 19, parent=step2)
    return [
        event("budget:data_wait", 0, 2),
        event("aten::tensor", 0.5, 1.5, parent=None),
        event("budget:copy", 2, 3),
        step1,
        event("aten::addmm", 3, 5, parent=step1),
        event("aten::relu", 6, 9, parent=step1),
        event("budget:data_wait", 11, 12),
        event("budget:copy", 12, 12.5),
        step2,
        outer,
        event("aten::mkldnn_convolution", 14, 18, parent=outer),
    ]


def test_annotations_are_looked_through_and_other_threads_left_out():
    """An op under `Optimizer.step#Adam.step` (an annotation inside the step) is one of the
    step's top-level ops; the annotation itself is not an op; an op of another thread (a
    pin-memory thread) during the step is not the step's."""
    step = event("budget:step", 0, 10)
    adam = event("Optimizer.step#Adam.step", 1, 9, parent=step)
    events = [
        step,
        adam,
        event("aten::add_", 2, 3, parent=adam),
        event("aten::mul_", 5, 6, parent=adam),
        event("aten::copy_", 4, 8, thread=2),
    ]
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
    kernels = [(1, 2.5), (4, 5), (6, 7)]  # one still running from the previous step
    memcpy = [(2.5, 3)]
    parts = split(ranges, ops=[(3, 9)], kernels=kernels, memcpy=memcpy, cuda=True)
    assert parts == pytest.approx({"compute": 3.5, "copy": 0.5, "data_wait": 1, "overhead": 5, "other": 0})


def test_trace_sorts_device_events():
    events = [
        event("budget:step", 0, 9),
        event("budget:step", 0, 9, device=CUDA),  # the GPU-side copy of a user range: not a range
        event("Optimizer.step#Adam.step", 0.5, 8, device=CUDA),  # nor is anyone else's, nor a kernel
        event("Memcpy HtoD (Pageable -> Device)", 1, 2, device=CUDA),
        event("void cudnn::conv_kernel", 3, 4, device=CUDA),
    ]
    ranges, ops, kernels, memcpy = trace_intervals(events)
    assert ranges == {"step": [(0, 9)]} and ops == [] and kernels == [(3, 4)] and memcpy == [(1, 2)]


@pytest.mark.parametrize(
    ("ranges", "cuda", "kernels", "expected"),
    [
        # every part named, 0.0 where nothing of it happened
        ({"step": [(0, 2)]}, False, [], {"data_wait": 0.0, "copy": 0.0, "compute": 0.0, "overhead": 2, "other": 0.0}),
        # the window starts with a copy, and ends with one
        (
            {"copy": [(0, 1)], "step": [(1, 5)]},
            False,
            [],
            {"data_wait": 0.0, "copy": 1, "compute": 0.0, "overhead": 4, "other": 0.0},
        ),
        (
            {"step": [(0, 4)], "copy": [(4, 6)]},
            False,
            [],
            {"data_wait": 0.0, "copy": 2, "compute": 0.0, "overhead": 4, "other": 0.0},
        ),
        # a wait after the last step (the loader's end) is outside the window
        (
            {"data_wait": [(0, 1), (5, 7)], "step": [(1, 5)]},
            False,
            [],
            {"data_wait": 1, "copy": 0.0, "compute": 0.0, "overhead": 4, "other": 0.0},
        ),
        # on CUDA, the host's copy range counts as copy where no kernel runs, memcpy or not
        (
            {"copy": [(0, 1)], "step": [(1, 3)]},
            True,
            [(1, 2)],
            {"data_wait": 0.0, "copy": 1, "compute": 1, "overhead": 1, "other": 0.0},
        ),
    ],
)
def test_the_window_spans_the_marked_ranges_and_every_part_is_named(ranges, cuda, kernels, expected):
    assert split(ranges, [], kernels, [], cuda=cuda) == expected


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

    parts = profile_steps(iter(data * 3), lambda b: b, step, 7, torch.device("cpu"))
    assert parts["steps"] == 7 and parts["compute_s"] > 0
    total = sum(parts[f"{name}_s"] for name in intervals.PARTS)
    assert total == pytest.approx(parts["step_s"], abs=1e-5) and all(parts[f"{n}_s"] >= 0 for n in intervals.PARTS)


def test_per_step_sets_the_parts_beside_a_plain_clock():
    out = intervals.per_step({"data_wait": 0.3, "copy": 0.0, "compute": 0.5, "overhead": 0.1, "other": 0.1}, 10, 1.25)
    assert out["step_s"] == pytest.approx(0.1) and out["wall_s"] == 0.125 and out["vs_wall"] == 0.8
    assert "wall_s" not in intervals.per_step(dict.fromkeys(intervals.PARTS, 1.0), 2)


def eager_cuda_trace():
    """One CUDA step, 0-10: kernel A (launched at 0.5) runs 1-3; B, launched at 2 while A
    ran, starts at 4; C, launched at 7, runs 7.5-9. A host op whose own id is C's
    correlation id (ids of ops and of launches are separate counters) comes first."""
    return [
        event("budget:step", 0, 10),
        event("aten::addmm", 0, 0.4, id=3),
        event("cudaLaunchKernel", 0.5, 0.7, id=1),
        event("cudaLaunchKernel", 2, 2.2, id=2),
        event("cudaLaunchKernel", 7, 7.2, id=3),
        event("kernel_a", 1, 3, device=CUDA, id=1),
        event("kernel_b", 4, 5, device=CUDA, id=2),
        event("kernel_c", 7.5, 9, device=CUDA, id=3),
    ]


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
    events = [
        event("budget:step", 0, 4.5),
        event("cudaGraphLaunch", 0.1, 0.3, id=9),
        event("k1", 1, 2, device=CUDA, id=9),
        event("k2", 2.5, 3, device=CUDA, id=9),
        event("k3", 3.2, 4, device=CUDA, id=9),
    ]
    ranges, _, kernels, memcpy = trace_intervals(events)
    idle = device_idle(events, ranges, kernels, memcpy, steps=1)
    overhead = per_step(split(ranges, [], kernels, memcpy, cuda=True), 1)["overhead_s"]
    assert idle == pytest.approx({"host_wait_s": 0.6, "launch_gap_s": 1.6})  # 0-0.1 and 4-4.5; 0.1-1, 2-2.5, 3-3.2
    assert idle["host_wait_s"] + idle["launch_gap_s"] == pytest.approx(overhead, abs=1e-9)


def test_a_replayed_graph_is_counted_per_step_and_its_kernels_are_compute_not_idle():
    """Two steps, each replaying one CUDA graph (one launch call, two kernels with its
    correlation id), a graph launched outside the steps besides: the window counts one replay
    a step, and the graph's kernel time is compute, never overhead; off CUDA nothing is
    counted (None)."""
    events = [
        event("budget:step", 0, 4),
        event("cudaGraphLaunch", 0.1, 0.3, id=9),
        event("k1", 1, 2, device=CUDA, id=9),
        event("k2", 2, 3.5, device=CUDA, id=9),
        event("budget:step", 5, 9),
        event("cudaGraphLaunch", 5.1, 5.3, id=10),
        event("k1", 6, 7, device=CUDA, id=10),
        event("k2", 7, 8.5, device=CUDA, id=10),
        event("cudaGraphLaunch", 9.5, 9.6, id=11),  # between the steps: not a step's
        event("cuGraphLaunch", 5.15, 5.25, id=12),  # the same replay at the driver's level: not a second
    ]
    window = window_parts(events, 2, None, torch.device("cuda"), flops=False)
    assert window.graphs_per_step == 1.0 and window.kernels_per_step == 2.0
    assert window.per_step["compute_s"] == pytest.approx(2.5) and window.per_step["overhead_s"] == pytest.approx(1.5)
    assert window_parts(events, 2, None, torch.device("cpu"), flops=False).graphs_per_step is None


def test_no_split_when_a_launch_is_missing_from_the_trace():
    """A kernel whose launch call is not in the trace: the split would guess, so none."""
    events = eager_cuda_trace()[:-4] + eager_cuda_trace()[-3:]  # C's launch call dropped
    ranges, _, kernels, memcpy = trace_intervals(events)
    assert queued_intervals(events)[1] == 1
    assert device_idle(events, ranges, kernels, memcpy, steps=1) == {"host_wait_s": None, "launch_gap_s": None}


def cuda_budget(overhead, compute, host_wait=None, launch_gap=None, device="cuda:0"):
    """A budget of one part pair, in seconds per step of 0.5 s (`step_s`), on `device`."""
    per_step = {
        "data_wait_s": 0.0,
        "copy_s": 0.0,
        "compute_s": compute,
        "overhead_s": overhead,
        "other_s": 0.0,
        "steps": 4,
        "step_s": overhead + compute,
    }
    if host_wait is not None or launch_gap is not None:
        per_step.update(host_wait_s=host_wait, launch_gap_s=launch_gap)
    return timebudget.Budget(per_step=per_step, device=device)


def test_an_overhead_bound_cuda_verdict_names_the_half_that_bounds_it():
    host, gaps = cuda_budget(0.4, 0.1, 0.3, 0.1), cuda_budget(0.4, 0.1, 0.05, 0.35)
    assert verdict(host).startswith(
        "OVERHEAD-BOUND: overhead is 80% of the step (host wait 60%, launch gaps 20%); "
        "the device idles with nothing queued"
    )
    assert "Try: capture the step as a CUDA graph" in verdict(host)
    assert verdict(gaps).startswith(
        "OVERHEAD-BOUND: overhead is 80% of the step (host wait 10%, launch gaps 70%); "
        "the device idles between kernels already queued"
    )
    assert verdict(cuda_budget(0.4, 0.1)) == (
        "OVERHEAD-BOUND: overhead is 80% of the step; "
        + rule_for("overhead", "cuda").meaning
        + ". Try: "
        + rule_for("overhead", "cuda").try_next
        + "."
        "\nWhy: overhead 80% of the step."
    )


def test_the_idle_split_is_used_only_where_it_is_whole_and_overhead_bounds():
    """A compute-bound step says nothing of the halves; a half missing, or a step of no
    length, is no split at all."""
    assert verdict(cuda_budget(0.1, 0.4, 0.05, 0.05)).startswith(
        "COMPUTE-BOUND (weak evidence): compute is 80% of the step; the model"
    )
    for half in ({"host_wait_s": None}, {"launch_gap_s": None}):
        partial = cuda_budget(0.4, 0.1, 0.3, 0.1)
        partial.per_step.update(half)
        assert "host wait" not in verdict(partial)
    assert cuda_budget(0.0, 0.0, 0.0, 0.0).idle_shares() is None
    assert cuda_budget(0.4, 0.1, 0.3, 0.1).idle_shares() == pytest.approx({"host_wait": 0.6, "launch_gap": 0.2})
    assert cuda_budget(0.4, 0.1).idle_shares() is None


def test_the_cpu_has_rules_of_its_own_for_overhead_and_copy():
    assert rule_for("overhead", "cpu").meaning.startswith("Python and op dispatch inside the step")
    assert rule_for("overhead", "cuda:0").meaning.startswith("Python and kernel launches")
    assert rule_for("copy", "cpu") is not rule_for("copy", "cuda") and rule_for("compute", "cpu") is rule_for(
        "compute", "cuda"
    )
    said = verdict(cuda_budget(0.4, 0.1, device="cpu"))
    assert said.startswith("OVERHEAD-BOUND: overhead is 80% of the step; Python and op dispatch inside the step")


def test_evidence_quotes_the_closest_pair_the_ladder_ran():
    rule = rule_for("overhead", "cuda")  # (device -> graphed), then (graphed -> compiled)
    ladder = {"variants": {"graphed": {"train_s": 2.0}, "compiled": {"train_s": 1.0, "extrapolated": True}}}
    assert evidence(rule, LadderQuote.of(ladder)) == (
        " On a ladder of an unnamed machine (bench): `graphed` 2 -> `compiled` 1 (sampled: extrapolated) s/epoch."
    )
    ladder["variants"]["device"] = {"train_s": 4.0, "unstable": True}
    ladder.update(dataset="mnist", machine={"device": "cpu", "name": "amd-epyc-2c"}, params={"quick": True})
    assert evidence(rule, LadderQuote.of(ladder), "amd-epyc-2c") == (
        " On this machine's ladder (`amd-epyc-2c`, mnist, on cpu, a quick "
        "run): `device` 4 (unstable) -> `graphed` 2 s/epoch."
    )
    assert evidence(rule, LadderQuote.of(ladder), "intel-xeon-2c").startswith(
        " On another machine's ladder (`amd-epyc-2c`, mnist"
    )
    assert evidence(rule, None) == "" and evidence(rule, LadderQuote.of({"dataset": "mnist"})) == ""
    assert evidence(rule, LadderQuote.of({"variants": {"device": {"train_s": 4.0}}})) == ""


def test_queued_from_the_earliest_launch_call_and_every_unmatched_event_counted():
    events = [
        event("cudaLaunchKernel", 2.0, 2.1, id=5),
        event("cudaLaunchKernel", 1.0, 1.1, id=5),
        event("k", 3, 4, device=CUDA, id=5),
        event("lost", 5, 6, device=CUDA, id=6),
        event("lost too", 7, 8, device=CUDA, id=7),
    ]
    assert queued_intervals(events) == ([(1.0, 3.0)], 2)


def test_device_idle_is_per_step_rounded_to_a_microsecond_and_sums_to_the_overhead():
    """The graph trace of `test_a_graphs_kernels_are_queued_from_its_one_launch` over three
    steps: host wait 0.6 and launch gaps 1.6 in all."""
    events = [
        event("budget:step", 0, 4.5),
        event("cudaGraphLaunch", 0.1, 0.3, id=9),
        event("k1", 1, 2, device=CUDA, id=9),
        event("k2", 2.5, 3, device=CUDA, id=9),
        event("k3", 3.2, 4, device=CUDA, id=9),
    ]
    ranges, _, kernels, memcpy = trace_intervals(events)
    idle = device_idle(events, ranges, kernels, memcpy, steps=3)
    assert idle == {"host_wait_s": 0.2, "launch_gap_s": 0.533333}
    assert (
        round(idle["host_wait_s"] + idle["launch_gap_s"], 6)
        == per_step(split(ranges, [], kernels, memcpy, cuda=True), 3)["overhead_s"]
    )


def test_per_step_rounds_to_a_microsecond_and_leaves_the_ratio_out_without_a_clock():
    out = intervals.per_step({"data_wait": 0.0, "copy": 0.0, "compute": 1.0, "overhead": 0.0, "other": 0.0}, 3, 3.0)
    assert out == {
        "data_wait_s": 0.0,
        "copy_s": 0.0,
        "compute_s": 0.333333,
        "overhead_s": 0.0,
        "other_s": 0.0,
        "step_s": 0.333333,
        "steps": 3,
        "wall_s": 1.0,
        "vs_wall": 0.333,
    }
    assert intervals.per_step(dict.fromkeys(intervals.PARTS, 0.0), 1, 0.0)["vs_wall"] is None


def test_step_flops_counts_the_host_ops_that_start_inside_a_step():
    """Steps 1-2 and 3-4 (the ends included); an op before, between or after them, a device
    event and an op without a count add nothing."""

    def op(start, flops=None, device=CPU, dtypes=("float", "float")):
        e = event("aten::mm", start, start + 0.1, device=device)
        e.input_dtypes = list(dtypes)
        if flops is not None:
            e.flops = flops
        return e

    events = [
        op(1.5, 100),
        op(2.0, 10),
        op(3.0, 1000),
        op(0.5, 1),
        op(2.5, 2),
        op(4.5, 3),
        op(1.6, 5, device=CUDA),
        op(1.7, 0),
        op(1.8),
        op(3.5, 20_000, dtypes=("c10::BFloat16", "c10::BFloat16")),
        op(3.6, 300_000, dtypes=("c10::Half", "c10::Half")),
        op(4.6, 5_000, dtypes=("c10::BFloat16",)),
    ]
    assert trace.step_flops(events, [(1, 2), (3, 4)]) == (321_110, 320_000)  # (all, bfloat16 or float16)


def test_the_profiler_records_the_device_only_on_cuda():
    from torch.profiler import ProfilerActivity

    assert trace.activities(torch.device("cpu")) == [ProfilerActivity.CPU]
    assert trace.activities(torch.device("cuda")) == [ProfilerActivity.CPU, ProfilerActivity.CUDA]


def test_to_json_holds_every_figure_its_shares_and_the_bound():
    per = {
        "data_wait_s": 0.1,
        "copy_s": 0.0,
        "compute_s": 0.15,
        "overhead_s": 0.05,
        "other_s": 0.0,
        "step_s": 0.3,
        "steps": 4,
    }
    b = timebudget.Budget(
        per_step=per, device="cuda:0", kernels_per_step=12.0, flop_per_step=3e9, peak_device_bytes=1024
    )
    assert b.to_json() == {
        "device": "cuda:0",
        "machine": None,
        **per,
        "bound": "compute",
        "partial": False,
        "largest_part": "compute",
        "intra_threads": None,
        "kernels_per_step": 12.0,
        "graphs_per_step": None,
        "verdict": "COMPUTE",
        "ops_per_step": None,
        "share": {"data_wait": 0.3333, "copy": 0.0, "compute": 0.5, "overhead": 0.1667, "other": 0.0},
        "flop_per_step": 3e9,
        "achieved_flop_s": pytest.approx(1e10),
        "peak_flop_s": None,
        "threads": None,
        "peak_device_bytes": 1024,
        "other_loaders_s": 0.0,
        "low_precision": None,
        "compiled": False,
    }
    empty = timebudget.Budget(per_step={**dict.fromkeys(per, 0.0), "steps": 1}, device="cpu", flop_per_step=3e9)
    assert empty.shares() == dict.fromkeys(intervals.PARTS, 0.0) and empty.to_json()["achieved_flop_s"] is None
    assert timebudget.Budget(per_step=per, device="cpu").to_json()["achieved_flop_s"] is None
