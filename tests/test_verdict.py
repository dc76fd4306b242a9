"""The verdict is a claim backed by evidence: compute only with FLOP/s to show against this
device's measured peak, thread contention said first when one thread is faster, close parts
both named, a lever only where this machine's evidence says it pays (bf16 where bfloat16
measured faster and the step computes near enough to the peak; channels_last and torch.compile
named as measurements to make; Dataset advice fitted to the Dataset seen); the thread check really runs its steps at the counts it reports; a device
this machine lacks is refused at construction; Kineto's log lines never reach the user."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, TensorDataset

from pipeline.budget import Peak, TimeBudget
from pipeline.budget.findloop import profile_script
from pipeline.budget.peak import device_peak
from pipeline.budget.threads import ThreadCheck, plan
from pipeline.budget.timebudget import Budget
from pipeline.budget.trace import CONVOLUTION, RANGE, QuietProfiler, kineto_lines_dropped, window_parts
from pipeline.budget.units import duration
from pipeline.budget.verdict import LadderQuote, LoaderSeen, diagnose, loader_seen, rule_for, verdict
from pipeline.core.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
PEAK = Peak(rates={"float32": 1e11, "bfloat16": 4e11}, machine="test-machine", device="cpu", threads=2)


def budget(
    shares: dict[str, float],
    step_s: float = 0.01,
    flop_per_step: float | None = None,
    threads: ThreadCheck | None = None,
    peak: Peak | None = PEAK,
    ops: float = 40.0,
) -> Budget:
    """A CPU budget whose parts are `shares` of a step of `step_s` seconds."""
    per_step = {
        f"{part}_s": shares.get(part, 0.0) * step_s for part in ("data_wait", "copy", "compute", "overhead", "other")
    }
    per_step.update(step_s=step_s, steps=20, host_wait_s=None, launch_gap_s=None)
    return Budget(
        per_step=per_step,
        device="cpu",
        flop_per_step=flop_per_step,
        ops_per_step=ops,
        peak=peak,
        threads=threads,
        machine="test-machine",
    )


def test_no_compute_advice_for_a_loop_below_one_percent_of_the_peak():
    """The issue's tiny model: compute 96% of the step, 256 FLOP a step: the time is the cost
    of dispatching small ops, and the verdict says so, with the fraction and the peak."""
    tiny = budget({"compute": 0.96, "overhead": 0.04}, step_s=0.059, flop_per_step=256)
    said = verdict(tiny)
    assert said.startswith("DISPATCH-BOUND: time inside ops is 96% of the step"), said
    assert "autocast" not in said and "COMPUTE" not in said
    why = said.split("\nWhy: ")[1]
    assert "of this CPU's float32 peak" in why and "measured on test-machine" in why and "40 ops a step" in why


@pytest.mark.parametrize(("fraction", "weak"), [(0.3, False), (0.05, True)])
def test_compute_is_claimed_with_its_fraction_of_the_peak_and_weak_below_a_tenth(fraction, weak):
    """bf16 autocast is advised on the probe's word only where the step computes near enough
    to the peak for the probe's large matmuls to speak for its ops: a step at 5% of it spends
    its time elsewhere (small ops, where bf16's casts can cost more than it saves)."""
    step = 0.01
    loop = budget({"compute": 0.8, "overhead": 0.2}, step_s=step, flop_per_step=fraction * PEAK.float32 * step)
    said = verdict(loop)
    assert said.startswith("COMPUTE-BOUND (weak evidence): " if weak else "COMPUTE-BOUND: compute is 80%"), said
    assert f"{fraction * 100:.2g}% of this CPU's float32 peak" in said
    if weak:
        assert (
            "Try: bf16 autocast" not in said
            and (
                "bfloat16 matmuls measured 4.0x float32's rate here, but on large matmuls, and the step reaches only 5% "
                "of float32's peak: its time is not in matmul throughput, so bf16 autocast is untested at this size"
            )
            in said
        ), said
    else:
        assert "Try: bf16 autocast" in said


def test_a_step_faster_than_the_probed_peak_claims_no_share_of_it():
    """A peak probed in a busy moment came out below what the step computed: 22 times the
    peak is not a share, it is a wrong probe. The claim is weak, quotes no percentage, no
    precision lever is advised on that probe, and it says how to probe again."""
    step = 0.01
    loop = budget({"compute": 0.9, "overhead": 0.1}, step_s=step, flop_per_step=22 * PEAK.float32 * step)
    said = verdict(loop)
    assert said.startswith("COMPUTE-BOUND (weak evidence): "), said
    assert "above the peak probed here" in said and "peak.json" in said
    assert "% of this CPU's float32 peak" not in said and "2.2e+03%" not in said
    assert "bf16 autocast (" not in said and "so bf16 autocast is untested" in said  # not on that probe's word


def test_compute_without_counted_flops_says_its_evidence_is_weak():
    said = verdict(budget({"compute": 0.9, "overhead": 0.1}, flop_per_step=None))
    assert said.startswith("COMPUTE-BOUND (weak evidence): ") and "the profiler counted no FLOPs" in said


def test_kernels_too_short_to_fill_a_gpu_are_dispatch_without_counted_flops():
    """A graph-replayed or compiled step counts no FLOPs; 73 kernels of 6 us each say enough."""
    per = {
        "data_wait_s": 0.0,
        "copy_s": 0.0,
        "compute_s": 73 * 6e-6,
        "overhead_s": 0.0001,
        "other_s": 0.0,
        "step_s": 73 * 6e-6 + 0.0001,
        "steps": 20,
        "host_wait_s": 0.0001,
        "launch_gap_s": 0.0,
    }
    replayed = Budget(per_step=per, device="cuda:0", kernels_per_step=73.0, machine="h100")
    said = verdict(replayed)
    assert said.startswith("DISPATCH-BOUND: time inside kernels is 81% of the step"), said
    assert "fewer, larger kernels" in said and "73 kernels a step, 6 us each" in said
    big = Budget(
        per_step={**per, "compute_s": 73 * 60e-6, "step_s": 73 * 60e-6 + 0.0001},
        device="cuda:0",
        kernels_per_step=73.0,
        machine="h100",
    )
    assert verdict(big).startswith("COMPUTE-BOUND (weak evidence)")


def replayed(kernels: float | None, kernel_s: float, overhead_s: float) -> Budget:
    """A CUDA step that replays one captured graph, `kernels` kernels of `kernel_s` each
    traced (None: the trace shows none), the rest of the step idle as the trace reads it."""
    compute = (kernels or 0) * kernel_s
    per = {
        "data_wait_s": 0.0,
        "copy_s": 0.0,
        "compute_s": compute,
        "overhead_s": overhead_s,
        "other_s": 0.0,
        "step_s": compute + overhead_s,
        "steps": 20,
        "host_wait_s": overhead_s if kernels else None,
        "launch_gap_s": 0.0 if kernels else None,
    }
    return Budget(per_step=per, device="cuda:0", kernels_per_step=kernels, graphs_per_step=1.0, machine="h100")


def test_a_replayed_graph_is_never_told_to_capture_a_graph():
    """A step that replays a graph has no launches left to save: small kernels are told to be
    fewer and larger inside the graph (quoting graphed -> compiled), a device idle between
    replays to do more per replay; neither is told to capture the step. The report says the
    step replays one."""
    small = replayed(68.0, 6e-6, 0.00005)
    said = verdict(small)
    assert said.startswith("DISPATCH-BOUND: "), said
    assert "already replays a CUDA graph" in said and "fewer, larger kernels inside the graph" in said
    assert "68 kernels from 1 CUDA graph replay" in small.report()
    assert small.to_json()["graphs_per_step"] == 1.0
    idle = verdict(replayed(68.0, 6e-6, 0.004))  # the device idles, nothing queued, between replays
    assert idle.startswith("OVERHEAD-BOUND") and "idles between replays" in idle and "do more per replay" in idle
    for text in (said, idle):
        assert "capture the step" not in text and "torch.compile it" not in text, text
    large = verdict(replayed(68.0, 60e-6, 0.00005))
    assert large.startswith("COMPUTE-BOUND (weak evidence)") and "replays a CUDA graph, whose kernels" in large


def test_a_replay_whose_kernels_the_trace_lacks_is_not_read_as_idle():
    """A replayed graph whose kernels the trace does not show: the step reads as all idle,
    which it is not; the verdict names the unseen graph (weak), never OVERHEAD or compute."""
    unseen = replayed(None, 0.0, 0.004)
    said = verdict(unseen)
    assert said.startswith(
        "UNSEEN GRAPH-BOUND (weak evidence): the replayed graph's device time, unseen, is up to 100%"
    )
    assert "whose kernels the trace does not show: the 100% of the step it reads as idle" in said
    assert unseen.to_json()["bound"] == "unseen"


def test_two_parts_close_to_each_other_are_both_named():
    loop = budget({"data_wait": 0.49, "compute": 0.41, "overhead": 0.1}, flop_per_step=0.3 * PEAK.float32 * 0.01)
    found = diagnose(loop)
    assert found.bounds == ("data_wait", "compute") and found.label == "DATA WAIT + COMPUTE"
    said = verdict(loop)
    assert said.startswith("DATA WAIT + COMPUTE-BOUND: data wait is 49% of the step") and " And compute is 41%" in said
    apart = budget({"data_wait": 0.65, "compute": 0.3, "overhead": 0.05}, flop_per_step=0.3 * PEAK.float32 * 0.01)
    assert diagnose(apart).bounds == ("data_wait",)


def test_compute_beside_a_data_wait_never_says_the_data_path_keeps_up():
    both = verdict(
        budget({"compute": 0.5, "data_wait": 0.45, "overhead": 0.05}, flop_per_step=0.3 * PEAK.float32 * 0.01)
    )
    assert both.startswith("COMPUTE + DATA WAIT-BOUND") and "keeps up" not in both, both
    alone = verdict(budget({"compute": 0.95, "data_wait": 0.05}, flop_per_step=0.3 * PEAK.float32 * 0.01))
    assert "the model's own arithmetic is the bound: the data path keeps up" in alone


def test_a_step_far_below_the_peak_is_not_told_to_buy_a_faster_device():
    # an MLP at 2% of the CPU's peak was told "a smaller model or a faster device"
    said = verdict(budget({"compute": 0.95, "overhead": 0.05}, flop_per_step=0.02 * PEAK.float32 * 0.01))
    assert "faster device" not in said and "though it uses little of this CPU's arithmetic" in said, said
    assert advice(said).startswith("larger ops (a larger batch) would use more of it; time the loop before")


def test_long_gaps_between_ops_are_the_steps_own_code_not_small_ops():
    # torch.save each step: 54% of the step outside ops, 40 ops; it was told "its ops are small"
    saving = verdict(budget({"compute": 0.46, "overhead": 0.54}, step_s=0.25, flop_per_step=0.3 * PEAK.float32 * 0.25))
    assert saving.startswith("OVERHEAD") and "ops are small" not in saving, saving
    assert "the step's own code outside torch's ops is the bound (3.38 ms between ops on average" in saving
    assert "log every N steps instead of each" in advice(saving) and "vectorise Python work" in advice(saving)
    small = verdict(budget({"compute": 0.3, "overhead": 0.7}, step_s=0.001, flop_per_step=0.3 * PEAK.float32 * 0.001))
    assert "its ops are small" in small  # 17.5 us between ops: dispatch


def test_contending_threads_are_said_first_with_their_fix():
    contended = ThreadCheck(threads=2, step_s=0.059, one_thread_s=0.00074, steps=6, cores=2, load=3.1)
    said = verdict(budget({"compute": 0.96, "overhead": 0.04}, step_s=0.059, flop_per_step=256, threads=contended))
    assert said.startswith("THREAD CONTENTION-BOUND: one thread runs the loop 79.7x faster than 2"), said
    assert "torch.set_num_threads(1)" in said and "2 threads run a step in 59 ms, one thread in 740 us" in said
    assert "as measured with the threads waiting: compute 96% of the step" in said and "DISPATCH" not in said
    calm = ThreadCheck(threads=2, step_s=0.004, one_thread_s=0.0045, steps=6, cores=2, load=0.2)
    said = verdict(budget({"data_wait": 0.7, "compute": 0.3}, threads=calm))
    assert said.startswith("DATA WAIT-BOUND") and "set_num_threads" not in said and "one thread in 4.5 ms" in said


def test_durations_read_in_their_unit():
    assert [duration(s) for s in (0.000743, 0.0591, 1.05, 99.4, 1049.6, 9000)] == [
        "743 us",
        "59.1 ms",
        "1.05 s",
        "99.4 s",
        "17.5 min",
        "2.5 h",
    ]


def tiny_loop(budget_: TimeBudget, seen_threads: list[int] | None = None) -> None:
    """The issue's tiny model: Linear(4, 2), batch 8, over a TensorDataset."""
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(4096, 4), torch.randint(0, 2, (4096,)))
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in budget_.batches(DataLoader(data, batch_size=8, shuffle=True)):
        with budget_.step():
            if seen_threads is not None:
                seen_threads.append(torch.get_num_threads())
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if budget_.done:
            break


def test_a_tiny_model_gets_no_compute_advice_against_the_measured_peak():
    """Against this machine's measured peak, a Linear(4, 2) step at batch 8 counts 256 FLOPs
    (the forward's product and the weight's gradient, 128 each): a step of microseconds on a
    peak of GFLOP/s is far below 1% of it, whatever the load, so its verdict never claims
    compute. (The fraction itself is a measurement: `benchmarks/verdicts.py` prints it.)"""
    tiny = TimeBudget("cpu", steps=10, skip=3)
    tiny_loop(tiny)
    result = tiny.result
    assert result.peak is not None and result.peak.machine == result.machine
    assert result.flop_per_step == 256  # counted from the ops' shapes, not timed
    said = verdict(result)
    assert "COMPUTE" not in said.split(":")[0] and "autocast" not in said, said


def test_the_thread_check_runs_its_steps_at_the_counts_it_reports_and_puts_the_count_back():
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen: list[int] = []
        checked = TimeBudget("cpu", steps=3, skip=1, threads_check=4, peak=None)
        tiny_loop(checked, seen)
        assert seen[4:] == plan(2, 2) == [2, 2, 1, 1, 2, 2, 1, 1]  # after 1 skipped and 3 profiled steps
        assert torch.get_num_threads() == 2
        check = checked.result.threads
        assert check.threads == 2 and check.steps == 4 and check.step_s > 0 and check.one_thread_s > 0
        left = TimeBudget("cpu", steps=2, skip=0, threads_check=8, peak=None)
        for i, _ in enumerate(left.batches(range(100))):
            with left.step():
                pass
            if i == 4:  # the loop leaves during the check: the count is put back, the budget kept
                break
        assert torch.get_num_threads() == 2 and left.result is not None
    finally:
        torch.set_num_threads(saved)


@pytest.mark.parametrize("device", ["cuda:99", "tpu", "not a device"])
def test_a_device_this_machine_lacks_is_refused_at_construction(device):
    with pytest.raises(InputError, match=r"^device '?(cuda:99|tpu|not a device)"):
        TimeBudget(device)


def test_the_peak_is_measured_once_per_machine_and_kept(tmp_path):
    cache = tmp_path / "peak.json"
    first = device_peak("cpu", cache)
    assert first.rates["float32"] > 0 and first.machine and cache.exists()
    if not first.busy:  # a probe on a busy host is taken again next time
        assert device_peak("cpu", cache) == first
    cache.write_text("{not json")  # a damaged cache is only a cache: measured again
    assert device_peak("cpu", cache).rates["float32"] > 0


def test_kineto_lines_are_dropped_and_every_other_line_kept(capfd):
    with kineto_lines_dropped():
        os.write(2, b"USDT:2026-11-27 09:39:16 3342:3342 SyncActivityProfilerHandler.cpp:52] profiler_start\n")
        os.write(2, b"a warning of the user's own\n")
    assert capfd.readouterr().err == "a warning of the user's own\n"


@pytest.mark.slow
def test_the_readme_loop_prints_no_profiler_log_line():
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "XDG_CACHE_HOME": os.environ["XDG_CACHE_HOME"]}
    done = subprocess.run(
        [sys.executable, "examples/own_loop.py"], capture_output=True, text=True, cwd=ROOT, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "USDT" not in done.stdout + done.stderr and "\nWhy: " in done.stdout


def test_the_thread_count_is_put_back_when_a_retimed_step_raises_and_left_alone_otherwise():
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        failing = TimeBudget("cpu", steps=1, skip=0, threads_check=4, peak=None)
        batches = failing.batches(range(100))
        with pytest.raises(RuntimeError):
            for i in batches:
                with failing.step():
                    if torch.get_num_threads() == 1:  # a step re-timed on one thread fails
                        raise RuntimeError("the user's step failed")
        assert torch.get_num_threads() == 2  # put back at once, the generator still open
        batches.close()
        untouched = TimeBudget("cpu", steps=1, skip=0, threads_check=0, peak=None)
        torch.set_num_threads(1)  # the user's own setting, after construction: never forced back
        for _ in untouched.batches(range(5)):
            with untouched.step():
                pass
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(saved)


@pytest.mark.parametrize(
    "ladder",
    [
        [1, 2],
        {"variants": {"naive": {}, "preprocessed": {"train_s": 1.0}}},
        {"variants": {"naive": {"train_s": None}, "preprocessed": {"train_s": 1.0}}},
        {"variants": {"naive": {"train_s": 9.0}, "preprocessed": {"train_s": 1.0}}, "machine": "amd", "params": [1]},
    ],
)
def test_a_malformed_ladder_is_quoted_as_nothing_or_by_what_it_holds(ladder):
    said = verdict(budget({"data_wait": 0.8, "compute": 0.2}), LadderQuote.of(ladder))
    assert said.startswith("DATA WAIT-BOUND") and "s/epoch" not in said or "`naive` 9 -> `preprocessed` 1" in said


def test_a_ladder_is_this_machines_only_when_this_machine_is_known():
    ladder = {
        "dataset": "mnist",
        "machine": {"name": "amd-epyc-2c", "device": "cpu"},
        "variants": {"naive": {"train_s": 64.4}, "preprocessed": {"train_s": 12.6}},
    }
    unknown = budget({"data_wait": 0.8, "compute": 0.2})
    unknown.machine = None
    assert " On `amd-epyc-2c`'s ladder (mnist, on cpu): " in verdict(unknown, LadderQuote.of(ladder))
    assert "this machine's" not in verdict(unknown, LadderQuote.of(ladder))


def test_a_peak_is_refused_without_a_float32_rate_and_scaled_to_the_loops_threads():
    for rates in ({}, {"float32": 0.0}, {"float32": float("nan")}):
        with pytest.raises(ValueError, match="a Peak needs a finite float32 rate"):
            Peak(rates=rates, machine="m", device="cpu", threads=2)
    sixteen = Peak(rates={"float32": 1.6e12}, machine="m", device="cpu", threads=16)
    assert sixteen.float32_at(1) == pytest.approx(1e11) and sixteen.float32_at(32) == 1.6e12
    one_thread = budget({"compute": 0.9, "overhead": 0.1}, step_s=0.01, flop_per_step=0.3 * 1e11 * 0.01, peak=sixteen)
    one_thread.intra_threads = 1  # a loop on one thread is weighed against one thread's share of the peak
    assert verdict(one_thread).startswith(
        "COMPUTE-BOUND: "
    ) and "30% of this CPU's float32 peak at 1 thread" in verdict(one_thread)


def test_no_descriptor_is_left_open_when_the_capture_file_cannot_be_made(monkeypatch):
    from pipeline.budget import trace

    def refused(*args, **kwargs):
        raise OSError(24, "Too many open files")

    before = len(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(trace.tempfile, "TemporaryFile", refused)
    for _ in range(5):
        with kineto_lines_dropped():
            pass
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_window_much_slower_than_the_plain_clock_is_said_to_be_weak_evidence():
    """Beside two spinning processes a per-item loop's profiled steps took 48.5 ms, the same
    steps on a plain clock 8.4 ms: the verdict says its window is not the loop."""
    calm = ThreadCheck(threads=2, step_s=0.0084, one_thread_s=0.0085, steps=6, cores=2, load=1.9)
    disturbed = budget(
        {"data_wait": 0.17, "compute": 0.8, "overhead": 0.03},
        step_s=0.0485,
        flop_per_step=0.002 * PEAK.float32 * 0.0485,
        threads=calm,
    )
    said = verdict(disturbed)
    assert said.startswith(
        "DISPATCH-BOUND (weak evidence: the profiled window ran 5.8x slower than the same steps unprofiled"
    ), said
    assert "the profiled steps took 5.8x the plain clock's (48.5 ms against 8.4 ms on average)" in said
    steady = budget(
        {"data_wait": 0.7, "compute": 0.3},
        step_s=0.004,
        threads=ThreadCheck(threads=2, step_s=0.0033, one_thread_s=0.0031, steps=6, cores=2, load=0.1),
    )
    assert "weak evidence" not in verdict(steady) and "plain clock's" not in verdict(steady)


def test_a_compiled_step_is_not_re_timed_on_other_thread_counts():
    # torch.compile guards on the thread count: the check recompiled inside its re-timed
    # steps (one took 1.1 s against 1 ms) and once read as 59x thread contention
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        model = torch.compile(torch.nn.Linear(4, 2))
        checked = TimeBudget("cpu", steps=3, skip=2, threads_check=4, peak=None)
        seen = []
        for x, _ in checked.batches(DataLoader(TensorDataset(torch.randn(128, 4), torch.zeros(128)), batch_size=8)):
            with checked.step():
                seen.append(torch.get_num_threads())
                model(x).sum().backward()
            if checked.done:
                break
        result = checked.result
        assert result.compiled and result.threads is None and set(seen) == {2}, (result.compiled, seen)
        assert "no thread check: the step runs torch.compile'd code" in verdict(result)
    finally:
        torch.set_num_threads(saved)


def test_heavier_steps_on_one_side_claim_neither_contention_nor_a_disturbed_window():
    """Validation every few steps: the side at the loop's threads caught most of the heavy
    steps, so its median is a heavy step's. By medians alone that read as 100x contention,
    and the window's mean step against the plain clock's median as a disturbed window."""
    from pipeline.budget.threads import thread_check

    light, heavy = 0.012, 1.2
    timed = [(2, light), (2, heavy), (2, heavy), (1, light), (1, light), (1, light)] * 2
    check = thread_check(timed, 2)
    assert check.step_s == heavy and check.fastest_s == check.one_fastest_s == light and not check.contended
    window_mean = (4 * light + heavy) / 5  # the window's 20 steps: one heavy in five
    loop = budget(
        {"compute": 0.9, "overhead": 0.1},
        step_s=window_mean,
        flop_per_step=0.3 * PEAK.float32 * window_mean,
        threads=check,
    )
    found = diagnose(loop)
    assert found.bounds == ("compute",) and found.disturbed is None
    said = verdict(loop)
    assert "THREAD" not in said and "quieter host" not in said and "set_num_threads" not in said, said
    contended = thread_check([(2, 0.008), (2, 0.009), (1, 0.002), (1, 0.0021)] * 3, 2)
    assert contended.contended  # fastest and medians agree: one thread four times faster


def test_a_loop_with_a_heavy_step_every_few_is_not_called_contended():
    import time

    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        checked = TimeBudget("cpu", steps=4, skip=1, threads_check=8, peak=None)
        model = torch.nn.Linear(4, 2)
        data = TensorDataset(torch.randn(256, 4), torch.zeros(256))
        for i, (x, _) in enumerate(checked.batches(DataLoader(data, batch_size=8))):
            with checked.step():
                model(x).sum().backward()
                if i % 3 == 0:
                    time.sleep(0.05)  # what a validation pass adds to a step
            if checked.done:
                break
        check = checked.result.threads
        assert check.fastest_s < check.mean_s and not check.contended, check
        assert "THREAD" not in verdict(checked.result).split(":")[0]
    finally:
        torch.set_num_threads(saved)


# Advice from this machine's evidence (issue 60): each lever is named only where the evidence
# given says it pays. The budgets are fabricated: what is held is the rule, not a timing.
AVX2 = Peak(rates={"float32": 146e9, "bfloat16": 1.37e9}, machine="avx2-cpu", device="cpu", threads=2)


def compute_bound(peak: Peak | None = PEAK, convolutions: bool | None = None) -> Budget:
    """A compute-bound CPU step at 40% of `peak`'s float32 rate (of PEAK's where `peak` is None)."""
    rate = (peak or PEAK).float32
    loop = budget(
        {"compute": 0.9, "data_wait": 0.05, "overhead": 0.05}, step_s=0.2, flop_per_step=0.4 * rate * 0.2, peak=peak
    )
    loop.convolutions = convolutions  # what the trace said (`trace.step_convolutions`); None: not looked
    return loop


def advice(said: str) -> str:
    """The verdict's `Try:` sentence."""
    return said.split("Try: ", 1)[1].split("\nWhy: ")[0]


def test_bf16_autocast_is_advised_only_where_bfloat16_measured_faster_than_float32():
    faster = advice(verdict(compute_bound(PEAK)))
    assert faster.startswith("bf16 autocast (bfloat16 matmuls measured 4.0x float32's rate on this CPU)"), faster
    slower = verdict(compute_bound(AVX2))  # the CPU: AVX2 only, bf16 emulated
    assert "bf16 autocast (" not in slower and advice(slower).startswith(
        "a smaller model or a faster device: the step computes at 40% of this CPU's measured float32 peak, and no "
        "lever measured to pay here (bfloat16 matmuls measured 1.37 GFLOP/s against float32's 146 GFLOP/s: bf16 "
        "autocast would slow the step)"
    ), slower
    barely = Peak(rates={"float32": 1e11, "bfloat16": 1.1e11}, machine="m", device="cpu", threads=2)
    assert "bf16 autocast (" not in verdict(compute_bound(barely))
    assert "would gain too little to pay for its casts" in verdict(compute_bound(barely))
    untested = Peak(rates={"float32": 1e11}, machine="m", device="cpu", threads=2)
    for peak in (untested, None):
        said = verdict(compute_bound(peak))
        assert "bf16 autocast (" not in said and "no bfloat16 peak was measured here" in said, said


def test_bf16_autocast_is_not_advised_to_a_step_whose_flops_run_in_bfloat16_already():
    model, x = torch.nn.Linear(256, 256), torch.randn(64, 256)
    with QuietProfiler(torch.device("cpu"), flops=True) as profiler:
        with torch.profiler.record_function(RANGE + "step"), torch.autocast("cpu", dtype=torch.bfloat16):
            model(x).float().sum().backward()
    window = window_parts(list(profiler.events()), 1, None, torch.device("cpu"), flops=True)
    assert window.low_precision is not None and window.low_precision >= 0.5, window
    loop = compute_bound(PEAK)
    loop.low_precision = window.low_precision
    said = verdict(loop)
    assert "bf16 autocast (" not in said and "of the step's counted FLOPs already run in bfloat16 or float16" in said
    loop.low_precision = 0.0  # float32 throughout: the lever this machine measured stands
    assert advice(verdict(loop)).startswith("bf16 autocast (bfloat16 matmuls measured 4.0x")


def test_percentages_read_whole_from_ten_percent_and_never_in_exponent_form():
    from pipeline.budget.verdict import percent

    assert [percent(f) for f in (0.00005, 0.0123, 0.094, 0.4, 1.8, 12.5)] == [
        "under 0.01%",
        "1.2%",
        "9.4%",
        "40%",
        "180%",
        "1250%",
    ]


def test_channels_last_is_named_to_measure_only_for_a_step_the_trace_shows_running_convolutions():
    """Nothing here timed channels_last (on a CPU it can slow small convolutions): it is named
    as a measurement to make where the step runs convolutions, never as a lever that pays."""
    measure = "torch.compile and channels_last (the step runs convolutions) are unmeasured here: time the loop"
    for peak in (PEAK, AVX2):  # whatever bf16 does
        conv = advice(verdict(compute_bound(peak, convolutions=True)))
        assert measure in conv and conv.count("channels_last") == 1, conv
    assert advice(verdict(compute_bound(PEAK, convolutions=True))).startswith("bf16 autocast (bfloat16 matmuls")
    linear = advice(verdict(compute_bound(AVX2, convolutions=False)))
    assert "channels_last (" not in linear and "the step runs no convolution, so channels_last has nothing" in linear
    assert "channels_last" not in verdict(compute_bound(PEAK, convolutions=None))  # not looked: not named


def test_torch_compile_is_named_as_something_to_measure_never_as_a_claim():
    for loop in (compute_bound(PEAK, False), compute_bound(AVX2, False)):
        said = advice(verdict(loop))
        assert said.count("torch.compile") == 1 and said.endswith(
            "torch.compile is unmeasured here: time the loop with it before counting on it."
        ), said


def data_bound(loader: object, device: str = "cpu") -> Budget:
    loop = budget({"data_wait": 0.8, "compute": 0.15, "overhead": 0.05})
    loop.device = device
    loop.loader = loader_seen(loader)
    return loop


class PerItem(Dataset):
    """Each item built in __getitem__, as a first Dataset does."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        return torch.tensor([float(i)] * 4), i % 2


TENSORS = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))


def test_a_tensor_dataset_is_told_to_hand_out_whole_batches_not_to_convert_in_init():
    said = verdict(data_bound(DataLoader(TENSORS, batch_size=8, shuffle=True)))
    assert said.startswith("DATA WAIT-BOUND: ") and "__init__" not in said and "convert the split" not in said, said
    assert "the DataLoader fetches the TensorDataset's items one by one" in said
    assert advice(said).startswith("hand out whole batches by index instead of item by item: a BatchSampler")
    assert "workers" not in advice(said) and "on the device" not in said  # no per-item work; no device on the CPU
    split = torch.utils.data.random_split(TENSORS, [48, 16])[0]  # a Subset is looked through
    assert "__init__" not in verdict(data_bound(DataLoader(split, batch_size=8)))
    on_gpu = verdict(data_bound(DataLoader(TENSORS, batch_size=8), device="cuda:0"))
    assert "keep the tensors on the device and gather each batch there" in on_gpu and "__init__" not in on_gpu
    batched = DataLoader(TENSORS, sampler=BatchSampler(RandomSampler(TENSORS), 8, False), batch_size=None)
    whole = advice(verdict(data_bound(batched)))
    assert "hand out whole batches" not in whole and "without a DataLoader" in whole and "__init__" not in whole


def test_a_dataset_doing_per_item_work_is_told_to_do_it_once_in_init():
    said = advice(verdict(data_bound(DataLoader(PerItem(), batch_size=8))))
    assert said == (
        "do the per-item work once (convert the split in the Dataset's __init__), hand out whole batches "
        "by index instead of item by item, or add DataLoader workers."
    ), said
    two = advice(verdict(data_bound(DataLoader(PerItem(), batch_size=8, num_workers=2))))
    assert "more DataLoader workers than its 2" in two and "add DataLoader workers" not in two
    unseen = verdict(data_bound(iter(range(3))))  # not a DataLoader: the general rule
    assert advice(unseen) == rule_for("data_wait", "cpu").try_next + "."


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(64))


def test_a_stream_gets_advice_that_needs_no_index_and_warns_of_repeating_workers():
    # the general rule told a stream to hand out batches by index and to add workers, which
    # repeat every sample of an IterableDataset that does not split its data by worker
    said = verdict(data_bound(DataLoader(Stream(), batch_size=8)))
    assert "the Stream stream (an IterableDataset) is the bound" in said and "by index" not in said
    assert "get_worker_info()" in advice(said) and "else each worker repeats every sample" in advice(said)


class Sleepy(Dataset):
    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int) -> torch.Tensor:
        import time

        time.sleep(0.003)
        return torch.zeros(4)


def test_a_second_loaders_wait_inside_the_step_is_data_wait_and_named_as_such():
    # `for (x, y), u in zip(fast, slow)`: the slow loader's wait fell inside the step and was
    # read as overhead ("its ops are small"); it is a wait for data, from another loader
    slow = iter(DataLoader(Sleepy(), batch_size=4))
    checked = TimeBudget("cpu", steps=6, skip=1, threads_check=0, peak=None)
    model = torch.nn.Linear(4, 2)
    for x, y in checked.batches(DataLoader(TENSORS, batch_size=8)):
        with checked.step():
            next(slow)
            model(x).sum().backward()
        if checked.done:
            break
    result = checked.result
    assert result.shares()["data_wait"] > 0.8 and result.other_loaders_s > 0.010, result.per_step
    said = verdict(result)
    assert said.startswith("DATA WAIT-BOUND") and "mostly from another DataLoader than the loop's own" in said
    assert "TensorDataset" not in said  # the loop's own loader is not the one it waits on
    assert result.to_json()["other_loaders_s"] == result.other_loaders_s


def profiled_step(model: torch.nn.Module, x: torch.Tensor):
    """One marked step of `model` on `x` under the profiler, read as a window."""
    with QuietProfiler(torch.device("cpu")) as profiler:
        with torch.profiler.record_function(RANGE + "step"):
            model(x).sum().backward()
    return window_parts(list(profiler.events()), 1, None, torch.device("cpu"), flops=False)


def test_the_trace_says_whether_the_step_ran_convolutions():
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 2))
    assert profiled_step(conv, torch.randn(2, 3, 8, 8)).convolutions
    assert not profiled_step(torch.nn.Linear(8, 2), torch.randn(2, 8)).convolutions
    names = (
        "conv1d",
        "conv2d",
        "convolution",
        "_convolution",
        "mkldnn_convolution",
        "cudnn_convolution",
        "_slow_conv2d_forward",
        "conv_transpose2d",
        "convolution_backward",
        "_conv_depthwise2d",
    )
    assert all(CONVOLUTION.match("aten::" + name) for name in names)
    assert not any(
        CONVOLUTION.match("aten::" + name)
        for name in ("_convert_indices_from_coo_to_csr", "addmm", "conj", "contiguous")
    )


def test_a_script_over_a_tensor_dataset_is_seen_as_one_and_never_told_to_convert(tmp_path):
    """`python -m pipeline profile`'s path: the DataLoader is found by the command, not given."""
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n"
        "data = TensorDataset(torch.randn(512, 8), torch.randint(0, 2, (512,)))\n"
        "model = torch.nn.Linear(8, 2)\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x, y in DataLoader(data, batch_size=16, shuffle=True):\n"
        "    loss = torch.nn.functional.cross_entropy(model(x), y)\n"
        "    optimizer.zero_grad()\n    loss.backward()\n    optimizer.step()\n"
    )
    result = profile_script(script, [], "cpu", steps=4, skip=1)
    assert result.loader == LoaderSeen(dataset="TensorDataset", kind="tensors", by_item=True, workers=0)
    assert "__init__" not in verdict(result)  # whatever bound this host's load gives it


@pytest.mark.parametrize("width", [40, 60, 100])
def test_the_report_wraps_at_whole_words_never_inside_a_machine_name(width):
    """The report wraps at `width` columns at spaces only: a machine name such as
    amd-epyc-2c-avx512bf16 (quoted in the head and in the peak's evidence) stays whole on
    one line, where a hyphen break would print `amd-` and `epyc-...` on two."""
    name = "amd-epyc-2c-avx512bf16"
    peak = Peak(rates={"float32": 1e11, "bfloat16": 4e11}, machine=name, device="cpu", threads=2)
    measured = budget({"compute": 0.9, "overhead": 0.1}, flop_per_step=5e7, peak=peak)
    measured.machine = name
    report = measured.report(width=width)
    lines = report.splitlines()
    assert all(len(line) <= width or " " not in line for line in lines), report
    assert sum(line.count(name) for line in lines) == report.count(name) >= 2, report
    assert not any(line.rstrip().endswith("-") for line in lines), report
