"""What bounds a training loop, in words, what to try next, and why: the rules, written once.

A verdict is a claim resting on evidence, not on the largest share alone: threads waiting for
cores come first; compute is claimed only near this device's measured peak; a lever is advised
only where this machine measured it to pay; with a bench document, each part's change is
quoted from the rungs that measured it (docs/budget.md, "The verdict", gives every rule).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.utils.data import DataLoader, IterableDataset, Subset, TensorDataset

from pipeline.budget.peak import cache_file as peak_cache_file
from pipeline.budget.units import duration, rate

LABELS = {
    "data_wait": "data wait",
    "copy": "copy",
    "compute": "compute",
    "overhead": "overhead",
    "other": "other",
    "dispatch": "dispatch",
    "threads": "thread contention",
    "unseen": "unseen graph",
}
MEANINGFUL = 0.10  # of the float32 peak: below it, compute is claimed as weak
NEGLIGIBLE = 0.01  # of the float32 peak: below it, time in ops is dispatch, not arithmetic
PLAUSIBLE = 1.5  # of the float32 peak: above it, the probe, not the step, is wrong
CLOSE = 0.10  # two shares this close (fraction of the step) are both named
SMALL_KERNEL_S = 20e-6  # a device kernel shorter than this on average cannot fill the device
DISTURBED = 2.0  # profiled steps this many times the plain clock's: the window does not show the loop
DISPATCH_GAP_S = 200e-6  # CPU time outside ops per op above this is the step's own code, not dispatch
PAYS = 1.25  # bfloat16's measured matmul rate over float32's from which bf16 autocast is advised


@dataclass(frozen=True)
class Rule:
    meaning: str
    try_next: str
    rungs: tuple[tuple[str, str], ...]  # (before, after) rungs that measured the change, closest first


RULES = {
    "data_wait": Rule(
        "the step waits for its batch: the Dataset and DataLoader are the bound",
        "do the per-item work once (convert the split in the Dataset's __init__), hand out "
        "whole batches by index instead of item by item, or add DataLoader workers",
        (("naive", "preprocessed"), ("naive", "workers"), ("preprocessed", "batched")),
    ),
    "copy": Rule(
        "moving batches to the device is the bound",
        "pin the host memory and copy with non_blocking=True, or keep the data set on the device "
        "and gather each batch there",
        (("persistent", "pinned"), ("batched", "device")),
    ),
    "compute": Rule(
        "the model's own arithmetic is the bound",  # `_compute_rule` adds what the evidence says of the rest
        "a smaller model or a faster device",  # after the levers this machine measured to pay
        (("device", "compiled"),),
    ),
    "overhead": Rule(
        "Python and kernel launches are the bound: the device idles while the host issues work",
        "capture the step as a CUDA graph, torch.compile it, or do more per op (a larger batch)",
        (("device", "graphed"), ("graphed", "compiled")),
    ),
    "dispatch": Rule(
        "the kernels are too small for this device: the time goes to starting them, not to arithmetic",
        "fewer, larger kernels: a larger batch, torch.compile to fuse them, a CUDA graph",
        (("device", "graphed"), ("graphed", "compiled")),
    ),
    "other": Rule(
        "time outside the step and the wait for data is the bound: the loop's own code",
        "log every N steps instead of each, avoid .item() or other syncs per step, checkpoint less often",
        (),
    ),
    "threads": Rule(
        "torch's intra-op threads wait for cores that other work holds, and the profiler counts "
        "the wait as time inside ops",
        "torch.set_num_threads(1) (or OMP_NUM_THREADS=1) while the host is this busy, or free "
        "the cores; then profile again: the shares above are skewed by the wait",
        (),
    ),
}


# On the CPU the host does the work itself: no device idles, no copy to a device.
CPU_RULES = {
    "copy": Rule(
        "the marked copies are the bound",
        "avoid the copy (a view, or the data already in the layout the step takes), or copy once before the loop",
        (),
    ),
    "overhead": Rule(
        "Python and op dispatch inside the step are the bound: its ops are small",
        "fewer and larger ops (a larger batch, vectorised code), or torch.compile",
        (("device", "compiled"),),
    ),
    "dispatch": Rule(
        "the ops are too small for this CPU: their time is torch's cost per op (dispatch, "
        "allocation, autograd), not arithmetic",
        "fewer and larger ops: a larger batch, vectorised code, or torch.compile to fuse them",
        (("device", "compiled"),),
    ),
}


# On CUDA the overhead's two halves (`intervals.idle_split`) call for different changes.
IDLE_RULES = {
    "host_wait": Rule(
        "the device idles with nothing queued: the host issues kernels slower than the device "
        "runs them (Python, dispatch, launch calls)",
        "capture the step as a CUDA graph or torch.compile it, or do more per launch (a larger batch)",
        (("device", "graphed"), ("graphed", "compiled")),
    ),
    "launch_gap": Rule(
        "the device idles between kernels already queued: many kernels, each too small to cover its own start",
        "fewer, larger kernels: torch.compile to fuse them, a fused optimizer, a larger batch",
        (("graphed", "compiled"),),
    ),
}


# A step that replays a CUDA graph issues no launch per kernel: capturing is done, so what is
# left is the graph's kernels themselves, or the host's work between two replays.
REPLAYED = {
    "kernels": Rule(
        "the step already replays a CUDA graph, so no kernel is launched on its own: the graph's "
        "kernels are too small or too many to fill the device",
        "fewer, larger kernels inside the graph: torch.compile the step before capturing it, a "
        "fused optimizer, a larger batch",
        (("graphed", "compiled"),),
    ),
    "between": Rule(
        "the step already replays a CUDA graph, and the device idles between replays: the host's "
        "work around each (copying the batch in, Python, a sync) is the bound",
        "do more per replay (several steps, or a whole epoch, in one graph) and keep the data on "
        "the device, gathering each batch inside the graph",
        (("device", "graphed"),),
    ),
    "unseen": Rule(
        "the device runs the replayed graph's kernels, which this trace does not show, so the "
        "step's time cannot be split",
        "profile with a torch build whose profiler traces the kernels of CUDA graphs, or profile "
        "the step once without replaying it",
        (),
    ),
}


def replays(budget) -> bool:
    """Whether the step replayed a CUDA graph (`trace.step_graph_launches`)."""
    return bool(getattr(budget, "graphs_per_step", None))


def rule_for(part: str, device: str) -> Rule:
    """The rule for `part` on a device of that type ("cpu", "cuda", "cuda:0", ...), before
    this budget's evidence fits it (`_rule`): its `try_next` is said whatever the evidence."""
    return (CPU_RULES.get(part) if device.startswith("cpu") else None) or RULES[part]


@dataclass(frozen=True)
class LoaderSeen:
    """What the verdict knows of the loop's DataLoader (`loader_seen`): what its Dataset is
    and how it makes a batch."""

    dataset: str  # the Dataset's class name, looked through Subsets (random_split's)
    kind: str  # "tensors" (a TensorDataset: its items are tensor rows already), "items", "iterable"
    by_item: bool  # a batch is fetched item by item (dataset[i] for each index) and collated
    workers: int  # the DataLoader's num_workers


def loader_seen(loader: object) -> LoaderSeen | None:
    """What `loader` is, for the verdict's Dataset advice: None where it is not a
    torch.utils.data.DataLoader (a generator, a DataLoader's iterator), whose Dataset the
    verdict then cannot see."""
    if not isinstance(loader, DataLoader):
        return None
    dataset = loader.dataset
    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    kind = (
        "iterable"
        if isinstance(dataset, IterableDataset)
        else "tensors"
        if isinstance(dataset, TensorDataset)
        else "items"
    )
    # With a batch sampler the DataLoader asks for each index of a batch in turn, unless the
    # Dataset takes the whole batch (`__getitems__`); without one it hands the sampler's
    # index (a list, from a BatchSampler given as the sampler) to the Dataset as it is.
    by_item = loader.batch_sampler is not None and not callable(getattr(dataset, "__getitems__", None))
    return LoaderSeen(
        dataset=type(dataset).__name__, kind=kind, by_item=by_item and kind != "iterable", workers=loader.num_workers
    )


@dataclass(frozen=True)
class Diagnosis:
    """The bound(s) the evidence supports, with the evidence in words."""

    bounds: tuple[str, ...]  # first the main one; a second when its share is close; "threads" first when so
    why: tuple[str, ...]  # the evidence, one clause each
    weak: bool = False  # the evidence does not settle the claim (no FLOPs counted, no peak)
    disturbed: float | None = None  # the profiled steps over the plain clock's, when past DISTURBED

    @property
    def label(self) -> str:
        """The bounds' names joined by ' + ' (what the JSON and the headline carry)."""
        return " + ".join(LABELS[b].upper() for b in self.bounds)


def raw_fraction(budget) -> float | None:
    """The step's achieved FLOP/s over this device's measured float32 peak at the loop's own
    intra-op threads; None where either is unknown."""
    achieved = budget.achieved_flop_s()
    return achieved / budget.peak.float32_at(budget.intra_threads) if achieved and budget.peak else None


def outran_probe(budget) -> bool:
    """Whether the step computed faster than PLAUSIBLE times the fastest rate the probe
    measured (any dtype: a bf16 or TF32 loop may beat float32's): then the probe ran in a
    busy moment, and no share of it is claimed, nor any lever advised on its word."""
    fraction = raw_fraction(budget)
    if fraction is None:
        return False
    fastest = max(budget.peak.rates.values()) / budget.peak.float32
    return fraction > PLAUSIBLE * fastest


def compute_fraction(budget) -> float | None:
    """`raw_fraction`, or None where the step outran the probe (`outran_probe`)."""
    return None if outran_probe(budget) else raw_fraction(budget)


def percent(fraction: float) -> str:
    """A fraction as a percentage of two significant digits, however small (whole from a tenth)."""
    if fraction < 1e-4:
        return "under 0.01%"
    return f"{fraction * 100:.2g}%" if fraction < 0.1 else f"{fraction * 100:.0f}%"


def _compute_evidence(budget) -> tuple[str, str, bool]:
    """(the part compute stands for: "compute" or "dispatch", the evidence, weak?)."""
    fraction = compute_fraction(budget)
    unit = "kernels" if budget.kernels_per_step is not None else "ops"
    count = budget.kernels_per_step if budget.kernels_per_step is not None else budget.ops_per_step
    each = ""
    if count:
        each = f"; {count:.0f} {unit} a step, {duration(budget.per_step['compute_s'] / count)} each"
    if fraction is None:
        if budget.kernels_per_step and budget.per_step["compute_s"] / budget.kernels_per_step < SMALL_KERNEL_S:
            return (
                "dispatch",
                (
                    f"no FLOPs counted, but the kernels average under {duration(SMALL_KERNEL_S)}: too "
                    f"short to fill the device{each}"
                ),
                False,
            )
        if budget.flop_per_step:
            why = "no peak of this device to set them against"
        elif replays(budget):
            why = "the step replays a CUDA graph, whose kernels run with no op the profiler counts FLOPs for"
        else:
            why = "the profiler counted no FLOPs for these ops"
        if outran_probe(budget):
            ceiling = budget.peak.float32_at(budget.intra_threads)
            why = (
                f"the step computes at {rate(budget.achieved_flop_s())}, above the peak probed here "
                f"({rate(ceiling)} float32 at its threads, {rate(max(budget.peak.rates.values()))} at best): that "
                f"probe ran in a busy moment (a new one is taken on a quiet host: delete {peak_cache_file()})"
            )
        return "compute", f"{why}, so how hard they compute is unknown{each}", True
    gpu = budget.kernels_per_step is not None
    at = (
        ""
        if gpu or not budget.intra_threads
        else f" at {budget.intra_threads} thread{'s' if budget.intra_threads != 1 else ''}"
    )
    where = f"{percent(fraction)} of this {'GPU' if gpu else 'CPU'}'s float32 peak{at}"
    said = f"the step computes at {rate(budget.achieved_flop_s())}, {where} ({budget.peak.describe()}){each}"
    if fraction < NEGLIGIBLE:
        return "dispatch", said, False
    return "compute", said, fraction < MEANINGFUL


def diagnose(budget) -> Diagnosis:
    """The bound(s) of `budget` (a `timebudget.Budget`) from its shares and evidence."""
    shares = budget.shares()
    if replays(budget) and not budget.kernels_per_step:  # the device's time reads as idle: it is not
        return Diagnosis(
            bounds=("unseen",),
            why=(
                f"the step replays {budget.graphs_per_step:g} CUDA graph(s) whose kernels the trace does not "
                f"show: the {shares['overhead']:.0%} of the step it reads as idle is the graph's device time",
            ),
            weak=True,
        )
    ranked = sorted(shares, key=shares.__getitem__, reverse=True)
    top, second = ranked[0], ranked[1]
    named = [top] + ([second] if shares[second] > 0.2 and shares[top] - shares[second] <= CLOSE else [])
    why = [" and ".join(f"{LABELS[p]} {shares[p]:.0%}" for p in named) + " of the step"]
    weak = False
    bounds = []
    for part in named:
        if part == "compute":
            part, evidence, weak = _compute_evidence(budget)
            why.append(evidence)
        bounds.append(part)
    threads = budget.threads
    if threads is None and getattr(budget, "compiled", False) and budget.device.startswith("cpu"):
        why.append("no thread check: the step runs torch.compile'd code, which another thread count recompiles")
    if threads is not None:
        said = (
            f"{threads.threads} threads run a step in {duration(threads.step_s)}, one thread in "
            f"{duration(threads.one_thread_s)}"
        )
        if threads.contended:  # every share beside it is skewed by the wait: that bound alone is named
            load = f", load {threads.load:.1f}" if threads.load is not None else ""
            why = [
                f"{said} ({threads.slowdown:.1f}x slower with more threads; {threads.cores} cores{load})",
                "as measured with the threads waiting: " + why[0],
            ] + why[1:]
            return Diagnosis(bounds=("threads",), why=tuple(why), weak=False)
        why.append(said)
        # mean against mean: a heavier step some iterations take (validation, a checkpoint)
        # counts in the window's mean as in the plain clock's, not against a median
        plain = threads.mean_s if threads.mean_s is not None else threads.step_s
        ratio = budget.per_step["step_s"] / plain if plain > 0 else 1.0
        if ratio > DISTURBED:  # the window is not the loop: its shares describe a disturbed stretch
            why.append(
                f"the profiled steps took {ratio:.1f}x the plain clock's ({duration(budget.per_step['step_s'])} "
                f"against {duration(plain)} on average): the profiler's own cost, or load while it ran"
            )
            return Diagnosis(bounds=tuple(dict.fromkeys(bounds)), why=tuple(why), weak=weak, disturbed=ratio)
    return Diagnosis(bounds=tuple(dict.fromkeys(bounds)), why=tuple(why), weak=weak)


@dataclass(frozen=True)
class Rung:
    """One rung of a bench run, as the verdict quotes it."""

    train_s: float  # seconds per epoch
    extrapolated: bool = False  # timed on sampled steps
    unstable: bool = False  # its epochs disagreed

    def quote(self, name: str) -> str:
        marks = [
            word for flag, word in ((self.extrapolated, "sampled: extrapolated"), (self.unstable, "unstable")) if flag
        ]
        return f"`{name}` {self.train_s:.3g}" + (f" ({', '.join(marks)})" if marks else "")


@dataclass(frozen=True)
class LadderQuote:
    """What the verdict quotes of a bench run: each rung's seconds per epoch, and whose run it
    was (its machine's name and device, its data set, whether it was a quick run)."""

    rungs: dict[str, Rung]
    dataset: str = "bench"
    machine: str | None = None
    device: str | None = None
    quick: bool = False

    @classmethod
    def of(cls, document: object) -> LadderQuote:
        """The quote of a bench metrics document (metrics/bench/<dataset>.json, read as JSON);
        a rung without a number of seconds, or a part of another shape, is quoted as nothing
        rather than crashing the report."""
        doc = document if isinstance(document, dict) else {}
        variants = doc.get("variants") if isinstance(doc.get("variants"), dict) else {}
        rungs = {
            name: Rung(float(v["train_s"]), bool(v.get("extrapolated")), bool(v.get("unstable")))
            for name, v in variants.items()
            if isinstance(v, dict) and isinstance(v.get("train_s"), (int, float)) and not isinstance(v["train_s"], bool)
        }
        about = doc.get("machine") if isinstance(doc.get("machine"), dict) else {}
        params = doc.get("params") if isinstance(doc.get("params"), dict) else {}
        name, device = about.get("name"), about.get("device")
        return cls(
            rungs,
            str(doc.get("dataset", "bench")),
            name if isinstance(name, str) and name else None,
            device if isinstance(device, str) and device else None,
            bool(params.get("quick")),
        )


def evidence(rule: Rule, ladder: LadderQuote | None, machine: str | None = None) -> str:
    """What the rule's closest change did on the ladder quoted, in words, named by the machine
    that measured it: the first of its rung pairs the ladder ran. `machine`: this machine's
    name; a ladder is called this machine's only when the names match, another machine's
    when they differ, and by its own name when `machine` is unknown."""
    rungs = ladder.rungs if ladder is not None else {}
    pair = next(((before, after) for before, after in rule.rungs if before in rungs and after in rungs), None)
    if pair is None:
        return ""
    before, after = pair
    measured = ladder.machine
    named = measured and machine is not None  # only then can "this" or "another" machine be said
    about = [
        f"`{measured}`" if named else None,
        ladder.dataset,
        f"on {ladder.device}" if ladder.device else None,
        "a quick run" if ladder.quick else None,
    ]
    if not measured:
        whose = "a ladder of an unnamed machine"
    elif machine is None:
        whose = f"`{measured}`'s ladder"
    elif measured != machine:
        whose = "another machine's ladder"
    else:
        whose = "this machine's ladder"
    figures = f"{rungs[before].quote(before)} -> {rungs[after].quote(after)}"
    return f" On {whose} ({', '.join(a for a in about if a)}): {figures} s/epoch."


def _device_word(budget) -> str:
    return "CPU" if budget.device.startswith("cpu") else "GPU"


def _compute_rule(budget) -> Rule:
    """The compute rule with the levers this machine's evidence says pay: bf16 autocast (unless
    most counted FLOPs run in bfloat16 or float16 already) where
    the measured bfloat16 peak beats float32's by PAYS and the step computes near enough to
    that peak (MEANINGFUL) for the probe's large matmuls to speak for its ops. channels_last
    (where the trace shows convolutions) and torch.compile are named as measurements, never
    as claims: nothing here timed them. Where no lever pays, the rule says so with the
    evidence against each."""
    base = rule_for("compute", budget.device)
    fraction = compute_fraction(budget)
    if fraction is not None and fraction < MEANINGFUL:  # far from the peak: not the device's limit
        meaning = f"{base.meaning}, though it uses little of this {_device_word(budget)}'s arithmetic"
        try_next = "larger ops (a larger batch) would use more of it; time the loop before counting on it"
    else:
        meaning = base.meaning + (": the data path keeps up" if budget.shares()["data_wait"] < CLOSE else "")
        try_next = base.try_next
    base = Rule(meaning, try_next, base.rungs)
    levers, against = [], []
    peak = budget.peak
    probed_busy = outran_probe(budget)  # the step outran the probe: not to be trusted
    speedup = peak.over_float32("bfloat16") if peak is not None and not probed_busy else None
    low = getattr(budget, "low_precision", None)
    if low is not None and low >= 0.5:
        against.append(f"{percent(low)} of the step's counted FLOPs already run in bfloat16 or float16 ops")
    elif probed_busy:
        against.append("the peak probe ran in a busy moment, so bf16 autocast is untested")
    elif speedup is None:
        against.append("no bfloat16 peak was measured here, so bf16 autocast is untested")
    elif speedup >= PAYS and (fraction is None or fraction < MEANINGFUL):
        reach = f"only {percent(fraction)} of" if fraction is not None else "an unknown share of"
        against.append(
            f"bfloat16 matmuls measured {speedup:.1f}x float32's rate here, but on large matmuls, and the step "
            f"reaches {reach} float32's peak: its time is not in matmul throughput, so bf16 autocast is untested "
            f"at this size"
        )
    elif speedup >= PAYS:
        levers.append(
            f"bf16 autocast (bfloat16 matmuls measured {speedup:.1f}x float32's rate on this {_device_word(budget)})"
        )
    else:
        slower = "would slow the step" if speedup < 1 else "would gain too little to pay for its casts"
        against.append(
            f"bfloat16 matmuls measured {rate(peak.rates['bfloat16'])} against float32's "
            f"{rate(peak.float32)}: bf16 autocast {slower}"
        )
    convolutions = getattr(budget, "convolutions", None)  # None: a budget that did not look
    if convolutions is False:
        against.append("the step runs no convolution, so channels_last has nothing to reorder")
    compile_ = (
        "torch.compile and channels_last (the step runs convolutions) are unmeasured here: time the loop with "
        "each before counting on it"
        if convolutions
        else "torch.compile is unmeasured here: time the loop with it before counting on it"
    )
    if levers:
        return Rule(base.meaning, f"{' and '.join(levers)}; past that, {base.try_next}; {compile_}", base.rungs)
    at = (
        f"the step computes at {percent(fraction)} of this {_device_word(budget)}'s measured float32 peak, and "
        if fraction is not None
        else ""
    )
    return Rule(
        base.meaning,
        f"{base.try_next}: {at}no lever measured to pay here ({'; '.join(against)}); {compile_}",
        base.rungs,
    )


def _data_rule(budget) -> Rule:
    """The data-wait rule fitted to the loader seen (`Budget.loader`): a TensorDataset has
    nothing left to convert and no per-item work for workers to share, so it is told to hand
    out whole batches (and on a GPU to keep the tensors there); a Dataset of its own gets the
    general rule, with what its loader already does left out; a stream (IterableDataset),
    advice that needs no index. Mostly another loader's wait: that loader's rule, in general
    terms. No loader seen: the general rule."""
    base = rule_for("data_wait", budget.device)
    seen = getattr(budget, "loader", None)  # None: a budget that did not look, or not a DataLoader
    others = getattr(budget, "other_loaders_s", 0.0) or 0.0
    if others * 2 > budget.per_step["data_wait_s"]:  # mostly another loader's wait: its Dataset is unseen
        return Rule(
            f"the step waits for batches, mostly from another DataLoader than the loop's own ("
            f"{duration(others)} a step, inside the step: a second loader zipped with the first, or a "
            f"validation loader): that loader's Dataset is the bound",
            "find that loader in the trace (its enumerate(DataLoader) ranges inside budget:step); do its "
            "per-item work once, hand out whole batches, or give it workers; or run validation less often",
            base.rungs,
        )
    if seen is None:
        return base
    if seen.kind == "iterable":
        return Rule(
            f"the step waits for its batch: the {seen.dataset} stream (an IterableDataset) is the bound",
            "make the stream yield whole batches (batch_size=None on the DataLoader) and do per-sample "
            "work once, before the loop; DataLoader workers help only where the stream splits its data "
            "by worker (torch.utils.data.get_worker_info()), else each worker repeats every sample",
            (),
        )
    gpu = not budget.device.startswith("cpu")
    if seen.kind == "tensors":
        device = ", or keep the tensors on the device and gather each batch there" if gpu else ""
        device_rung = (("batched", "device"),) if gpu else ()
        if seen.by_item:
            return Rule(
                f"the step waits for its batch: the DataLoader fetches the {seen.dataset}'s items one by "
                f"one and collates them (they are tensors already: nothing is left to convert)",
                "hand out whole batches by index instead of item by item: a BatchSampler as the "
                "DataLoader's sampler with batch_size=None, or index the tensors with each batch's "
                "shuffled indices in the loop" + device,
                (("preprocessed", "batched"),) + device_rung,
            )
        return Rule(
            f"the step waits for its batch, which the DataLoader already gathers by index from the "
            f"{seen.dataset}'s tensors: the DataLoader's own machinery is the bound",
            "index the tensors with each batch's shuffled indices in the loop, without a DataLoader" + device,
            device_rung,
        )
    batches = "hand out whole batches by index instead of item by item, " if seen.by_item else ""
    workers = (
        "add DataLoader workers"
        if seen.workers == 0
        else f"more DataLoader workers than its {seen.workers}, where cores are free"
    )
    return Rule(
        base.meaning,
        f"do the per-item work once (convert the split in the Dataset's __init__), {batches}or {workers}",
        base.rungs,
    )


def _rule(part: str, budget) -> Rule:
    """The rule for `part`, fitted to the evidence `budget` holds."""
    if part == "unseen":
        return REPLAYED["unseen"]
    if part == "dispatch" and replays(budget):
        return REPLAYED["kernels"]
    if part == "overhead" and replays(budget):
        halves = budget.idle_shares()
        return REPLAYED["kernels" if halves and halves["launch_gap"] > halves["host_wait"] else "between"]
    if part == "overhead":
        halves = budget.idle_shares()
        if halves:
            return IDLE_RULES[max(halves, key=halves.__getitem__)]
        gap = _gap_per_op(budget)
        if budget.device.startswith("cpu") and gap > DISPATCH_GAP_S:
            return Rule(
                f"the step's own code outside torch's ops is the bound ({duration(gap)} between "
                "ops on average, far more than dispatching one costs): saving, logging, Python work",
                "find it in the trace, in the gaps between ops inside budget:step: vectorise Python work into "
                "torch ops, save checkpoints and log every N steps instead of each",
                (),
            )
    if part == "compute":
        return _compute_rule(budget)
    if part == "data_wait":
        return _data_rule(budget)
    return rule_for(part, budget.device)


def _gap_per_op(budget) -> float:
    """The step's time outside ops over its ops: torch's dispatch costs microseconds an op."""
    ops = budget.ops_per_step or 0
    return budget.per_step["overhead_s"] / ops if ops else 0.0


def _share(part: str, budget) -> str:
    """The part's share of the step, in the words of what the bound stands for."""
    shares = budget.shares()
    if part == "threads":
        return f"one thread runs the loop {budget.threads.slowdown:.1f}x faster than {budget.threads.threads}"
    if part == "unseen":
        return f"the replayed graph's device time, unseen, is up to {shares['overhead']:.0%} of the step"
    if part == "dispatch":
        inside = "kernels" if budget.kernels_per_step is not None else "ops"
        return f"time inside {inside} is {shares['compute']:.0%} of the step, at under {NEGLIGIBLE:.0%} of peak"
    return f"{LABELS[part]} is {shares[part]:.0%} of the step"


def verdict(budget, ladder: LadderQuote | None = None) -> str:
    """The bound(s), what they mean and what to try, and, given a bench run's quote, what the
    first bound's change measured there; then, on a line of its own, `Why:` and
    the evidence."""
    found = diagnose(budget)
    main = found.bounds[0]
    rule = _rule(main, budget)
    weak = " (weak evidence)" if found.weak and main in ("compute", "unseen") else ""
    if found.disturbed:
        weak = (
            f" (weak evidence: the profiled window ran {found.disturbed:.1f}x slower than the same steps "
            f"unprofiled; profile again on a quieter host, or with fewer --steps)"
        )
    halves = budget.idle_shares() if main == "overhead" else None
    detail = f" (host wait {halves['host_wait']:.0%}, launch gaps {halves['launch_gap']:.0%})" if halves else ""
    head = f"{found.label}-BOUND{weak}: {_share(main, budget)}{detail}; {rule.meaning}. Try: {rule.try_next}."
    for part in found.bounds[1:]:
        also = _rule(part, budget)
        head += f" And {_share(part, budget)}: {also.meaning}; {also.try_next}."
    quoted = next((_rule(part, budget) for part in found.bounds if _rule(part, budget).rungs), rule)
    return head + evidence(quoted, ladder, budget.machine) + "\nWhy: " + "; ".join(found.why) + "."
