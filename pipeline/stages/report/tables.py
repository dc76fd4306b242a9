"""The report's markdown: the ladder and budget tables per run, the headline across
machines, the codec table and the bench's running time, from checked runs (`data`)."""

from __future__ import annotations

import html
import math
from collections.abc import Callable

from pipeline.bench.document import (
    CodecEntry,
    Seeds,
    Spread,
    TargetSeconds,
    TimeToAccuracy,
    TunedSeeds,
    Variant,
    fastest_full,
)
from pipeline.bench.variants import writeup_recipe
from pipeline.stages.report import charts
from pipeline.stages.report.data import Run

# --- text --------------------------------------------------------------------------------


def text(value: str) -> str:
    """Free text from a metrics file, safe in a markdown table and in HTML: entities escaped
    (so no tag and no `<!--` marker), pipes escaped, whitespace runs one space."""
    return html.escape(" ".join(value.split()), quote=True).replace("|", "\\|")


def num(x: float) -> str:
    """Three significant figures, never scientific: 0.0535, 1.35, 68.8, 1494."""
    if x == 0:
        return "0"
    digits = max(0, 2 - math.floor(math.log10(abs(x))))
    return f"{x:.{digits}f}"


def opt(x: float | None, fmt: Callable[[float], str] = num) -> str:
    return "n/a" if x is None else fmt(x)


def machine_line(run: Run) -> str:
    """Who measured: the machine's description, torch, date, where the file is."""
    d = run.doc
    if d.machine:
        m = d.machine
        gpu = f", {m.gpu_count} x {text(m.gpu)}" if m.gpu else ""
        cuda = f", CUDA {text(m.cuda)}" if m.cuda else ""
        what = f"{text(m.cpu)}, {m.cores} cores, {num(m.memory_gb)} GB{gpu}; torch {text(m.torch)}{cuda}; on {m.device}"
    else:
        e = d.env
        commit = f", commit {text(e.commit)}" if e.commit else ""
        what = f"{text(e.device)} ({text(e.device_type)}), {e.cpu_count} CPUs; torch {text(e.torch)}{commit}"
    when = f", {run.when.isoformat()}" if run.when else ""
    source = "`dvc repro` on this machine" if run.local else f"`{run.path.parent.name}/{run.path.name}`"
    p = d.params
    sampled = (
        f"; sampled rungs: {p.sample_steps} steps x {p.sample_epochs} epochs"
        if p.sample_steps and p.sample_epochs
        else ""
    )
    quick = "**quick run** (`bench.quick`: fewer epochs and steps, no spread): " if p.quick else ""
    plan = d.quick_plan
    if plan is not None and (plan.cuts or plan.skipped):  # what the budget cut, where it cut anything
        cuts = [text(cut) for cut in plan.cuts] + ([f"{', '.join(plan.skipped)} left out"] if plan.skipped else [])
        sampled = f"; sampled rungs: {p.sample_steps} steps or fewer x {p.sample_epochs} epochs" if sampled else ""
        sampled += f"; within its {num(plan.budget_s / 60)} min: {'; '.join(cuts)}"
    return f"{quick}{what}{when}; {p.epochs} epochs, batch {p.batch_size}{sampled} ({source})"


def spread_text(spread: Spread | None) -> str:
    """(max - min) / median of the timed epochs, as a percentage: unit-free, so it reads the
    same for a sampled variant (whose epochs are its sampled steps) as for a full one."""
    if spread is None:
        return "n/a"
    if spread.median == 0:
        return "0%" if spread.max == spread.min else "n/a"
    return f"{100 * (spread.max - spread.min) / spread.median:.0f}%"


VS_NAIVE = "vs naive: `naive`'s steady train s/epoch over the row's"
WALL_VS_NAIVE = "wall vs naive: `naive`'s wall s over the row's, what the whole run cost"


def vs_naive(naive: float | None, row: float | None) -> str:
    """`naive`'s figure over the row's, as "12.3x": the one meaning of the pages' "vs naive" (the
    bench JSON's `speedup` is another figure: train + test per epoch, docs/bench.md)."""
    if naive is None or row is None or row <= 0:
        return "n/a"
    return f"{num(naive / row)}x"


def reached(times: list[TimeToAccuracy] | None) -> str:
    """The cell, per target: "<seconds> s to <target>% (epoch <n>)", with "warm <s> s" beside
    where the warm-up and capture took part of it, or "not reached (<target>%)", joined by
    "; "; "n/a" where not measured (a sampled rung)."""
    if not times:
        return "n/a"
    cells = []
    for time in times:
        target = f"{100 * time.target:g}%"
        warm = time.warm_seconds
        apart = f"; warm {num(warm)} s" if warm is not None and num(warm) != num(time.seconds) else ""
        cells.append(
            f"not reached ({target})"
            if time.seconds is None
            else f"{num(time.seconds)} s to {target} (epoch {time.epoch}{apart})"
        )
    return "; ".join(cells)


def ladder_table(run: Run) -> str:
    """One data set's ladder on one machine: steady figures beside what a user pays."""
    lines = [
        f"**{run.doc.dataset}**: {machine_line(run)}",
        "",
        "| variant | train s/epoch | spread | test s/epoch | setup s | wall s | accuracy "
        "| time to accuracy | vs naive | wall vs naive |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    naive = run.doc.variants.get("naive")
    for name, v in run.doc.variants.items():
        mark = " *" if v.extrapolated else ""
        mark += " (graph)" if v.cuda_graph else ""
        mark += " **unstable**" if v.unstable else ""
        spread = spread_text(v.spread)
        accuracy = opt(v.accuracy, lambda a: f"{a:.4f}") + (" (outside tolerance)" if v.accuracy_ok is False else "")
        vs = (
            f"{vs_naive(naive and naive.train_s, v.train_s)} | "  # another recipe: other epochs
            f"{vs_naive(naive and naive.wall_s, v.wall_s) if writeup_recipe(name) else 'n/a'}"
        )
        lines.append(
            f"| {name}{mark} | {num(v.train_s)} | {spread} | {num(v.test_s)} | {opt(v.setup_s)} "
            f"| {opt(v.wall_s)} | {accuracy} | {reached(v.time_to_accuracy)} | {vs} |"
        )
    reasons = [
        f"`{n}`: {text(v.unstable_reason or 'no reason given')}" for n, v in run.doc.variants.items() if v.unstable
    ]
    if reasons:
        lines += ["", "Unstable (re-run on a quiet machine before trusting these): " + "; ".join(reasons) + "."]
    seeds = run.doc.seeds
    if seeds is not None:
        lines += [
            "",
            f"Time to {100 * seeds.target:g}% of `{seeds.variant}` (the first rung to reach it) from "
            f"{seeds_text(seeds.seeds)}: {seeds_spread(seeds)}.",
        ]
    if run.doc.tuned is not None:
        lines += ["", tuned_line(run.doc.tuned)]
    floor = run.doc.floor
    if floor.train_s is not None:
        extra = (
            f"; with `compiled`'s options {num(floor.compiled_train_s)} s/epoch"
            if floor.compiled_train_s is not None
            else ""
        )
        taken = f", the fastest of {floor.epochs} epochs taken between the variants" if floor.epochs else ""
        lines += ["", f"Compute floor (the same steps with no data path{taken}): {num(floor.train_s)} s/epoch{extra}."]
    return "\n".join(lines)


def budget_table(run: Run) -> str | None:
    rows = [(n, v.budget) for n, v in run.doc.variants.items() if v.budget]
    if not rows:
        return None
    head = " | ".join(charts.BUDGET_LABELS[p] for p in charts.BUDGET_PARTS)
    lines = [
        f"**{run.doc.dataset}** on `{run.machine}`, milliseconds per train step (clock: the profiled "
        "pass on a plain clock; timed: the timed epochs' median):",
        "",
        f"| variant | step | {head} | clock | timed |",
        "|---|---:|" + "---:|" * (len(charts.BUDGET_PARTS) + 2),
    ]
    for name, b in rows:
        parts = " | ".join(num(1000 * getattr(b, p)) for p in charts.BUDGET_PARTS)
        clocks = " | ".join(opt(None if s is None else 1000 * s) for s in (b.wall_s, b.epoch_step_s))
        lines.append(f"| {name} | {num(1000 * b.step_s)} | {parts} | {clocks} |")
    return "\n".join(lines)


def best_variant(run: Run) -> tuple[str, Variant]:
    """The fastest steady train epoch among the fully run variants (sampled ones if none)."""
    variants = run.doc.variants
    return fastest_full(variants) or min(variants.items(), key=lambda item: item[1].train_s)


def seeds_text(seeds: list[int]) -> str:
    """ "seeds 43-45" for a run of consecutive seeds, else "seeds 43, 47"."""
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"seeds {seeds[0]}-{seeds[-1]}"
    return ("seed " if len(seeds) == 1 else "seeds ") + ", ".join(str(s) for s in seeds)


def tuned_line(tuned: TunedSeeds) -> str:
    """The `tuned` recipe over its seeds: the final accuracy's mean and range, then the time
    to each target with its spread."""
    times = "; ".join(f"to {100 * t.target:g}%: {seeds_spread(t, len(tuned.seeds))}" for t in tuned.targets)
    return (
        f"`tuned` from {seeds_text(tuned.seeds)}, each its whole schedule: test accuracy mean "
        f"{100 * tuned.accuracy_mean:.2f}% ({100 * tuned.accuracy_min:.2f}-{100 * tuned.accuracy_max:.2f}%)"
        + (f"; {times}." if times else ".")
    )


def seeds_spread(seeds: Seeds | TargetSeconds, count: int | None = None) -> str:
    """The median and range over the seeds, a seed that missed the target counted as slower
    than every other: "median <m> s (<min>-<max> s)", or "median <m> s, fastest <min> s; 1 of 3
    did not reach it"."""
    if seeds.min is None:
        return "no seed reached it"
    count = len(seeds.seconds) if count is None else count
    missed = count - seeds.reached
    if not missed:
        return f"median {num(seeds.median)} s ({num(seeds.min)}-{num(seeds.max)} s)"
    median = "not reached by half or more" if seeds.median is None else f"median {num(seeds.median)} s"
    return f"{median}, fastest {num(seeds.min)} s; {missed} of {count} did not reach it"


def fastest_to_accuracy(run: Run) -> str:
    """The headline's cell: the median over fresh seeds when the bench took them, else the
    least time to the first target among the rungs, else "n/a"; then the `tuned` recipe's
    median to its last target, over its seeds."""
    cells = [first_target(run)]
    tuned = run.doc.tuned
    if tuned is not None and tuned.targets:
        last = tuned.targets[-1]
        shown = "not reached" if last.median is None else f"{num(last.median)} s"
        cells.append(f"{shown} to {100 * last.target:g}% (`tuned`, median of {len(tuned.seeds)} seeds)")
    return "; ".join(c for c in cells if c != "n/a") or "n/a"


def first_target(run: Run) -> str:
    """The ladder's time to its first target (the write-up's recipe; `tuned` has its own cell)."""
    seeds = run.doc.seeds
    if seeds is not None:
        shown = "not reached" if seeds.median is None else f"{num(seeds.median)} s"
        return f"{shown} to {100 * seeds.target:g}% (`{seeds.variant}`, median of {len(seeds.seeds)} seeds)"
    reached = [
        (v.time_to_accuracy[0].seconds, n, v.time_to_accuracy[0].target)
        for n, v in run.doc.variants.items()
        if v.time_to_accuracy and v.time_to_accuracy[0].seconds is not None and writeup_recipe(n)
    ]
    if not reached:
        return "n/a"
    seconds, name, target = min(reached)
    return f"{num(seconds)} s to {100 * target:g}% (`{name}`)"


def headline_table(machines: dict[str, dict[str, Run]]) -> str:
    """Per machine and data set: the write-up's naive loop, its best rung, the fastest here,
    and the least wait for a trained model."""
    lines = [
        "| machine | data set | naive | the write-up's best (`preprocessed`) | best here | vs naive "
        "| time to accuracy |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for machine, runs in machines.items():
        for dataset, run in runs.items():
            variants = run.doc.variants
            naive = variants.get("naive")
            seed = variants.get("preprocessed")
            name, best = best_variant(run)
            # `*` a sampled rung (extrapolated), as the per-machine tables mark it
            flag = lambda n: ("*" if variants[n].extrapolated else "") + (" (unstable)" if variants[n].unstable else "")  # noqa: E731
            ratio = vs_naive(naive and naive.train_s, best.train_s)
            quick = " (quick)" if run.doc.params.quick else ""
            lines.append(
                f"| `{machine}`{quick} | {dataset} | {opt(naive and naive.train_s)}{naive and flag('naive') or ''} "
                f"| {opt(seed and seed.train_s)}{seed and flag('preprocessed') or ''} "
                f"| {num(best.train_s)} (`{name}`){flag(name)} | {ratio} | {fastest_to_accuracy(run)} |"
            )
    return "\n".join(lines) + (
        "\n\nSeconds per train epoch (steady: the median of the timed epochs; a sampled rung's, `*`, of "
        "those after the first, scaled to the whole epoch); "
        + VS_NAIVE
        + "; time to accuracy: from the start of the rung, setup included, "
        "to its first test pass at the data set's first `bench.target_accuracy` (the ladder's recipe), "
        "and the `tuned` recipe's median over its seeds to the last."
    )


def codec_markdown(codecs: dict[str, dict[str, dict[str, CodecEntry]]]) -> str:
    names = list(dict.fromkeys(c for layouts in codecs.values() for by in layouts.values() for c in by))
    lines = ["| data set | layout | " + " | ".join(names) + " |", "|---|---|" + "---:|" * len(names)]
    for dataset, layouts in codecs.items():
        for layout, by_codec in layouts.items():
            cells = [
                f"{num(by_codec[c].train.MB)} MB / {num(by_codec[c].train.read_s)} s" if c in by_codec else "n/a"
                for c in names
            ]
            lines.append(f"| {dataset} | {layout} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


NOTE = (
    "`*` sampled: timed over a fixed number of steps per epoch and scaled to the whole epoch "
    "(accuracy not measured). `(graph)`: each epoch replays one CUDA graph. **unstable**: the timed "
    "epochs spread more than `bench.max_spread`, a twin doing identical work disagrees, or it beats "
    "its floor. spread: (max - min) / median of the timed epochs after the first (all of them where "
    "fewer than three were timed). setup s: everything before the "
    "first timed step; wall s: setup plus every epoch, train and test (a sampled row's: scaled from its "
    "sampled steps, like its epochs). time to accuracy: from the rung's start, setup included, to "
    "the end of the first test pass at or above each of `bench.target_accuracy`'s accuracies (a "
    "sampled rung measures no accuracy). `tuned`: `compiled` with its own recipe, `bench.tuned`. "
    + VS_NAIVE
    + "; "
    + WALL_VS_NAIVE
    + "."
)


def spent_s(run: Run) -> float | None:
    """Seconds the bench spent on a run's variants: each one's setup and every epoch it
    actually timed (a sampled variant's sampled steps, not its extrapolated epoch); None
    when a variant does not record them."""
    total = 0.0
    for v in run.doc.variants.values():
        if v.measured is None:
            return None
        total += (v.setup_s or 0.0) + sum(v.measured.train_s) + sum(v.measured.test_s)
    return total


def bench_time(machines: dict[str, dict[str, Run]]) -> str:
    """How long the bench ran on each CPU machine: the whole stage's wall time where the
    metrics record it, else what the variants record of their setup and timed epochs."""
    lines = []
    for machine, runs in machines.items():
        cpu = [r for r in runs.values() if (r.doc.machine.device if r.doc.machine else r.doc.env.device_type) == "cpu"]
        if not cpu:
            continue
        first = cpu[0]
        cores = first.doc.machine.cores if first.doc.machine else first.doc.env.cpu_count
        names = ", ".join(r.doc.dataset for r in cpu)
        walls = [r.doc.wall_s for r in cpu]
        spent = [spent_s(r) for r in cpu]
        if None not in walls:
            each = " + ".join(num(wall / 60) for wall in walls)
            lines.append(
                f"- `{machine}` ({cores} cores): {num(sum(walls) / 60)} minutes for {names} ({each}; "
                f"the whole stage: floor, every variant, profiled passes, seeds)"
            )
        elif None not in spent:
            lines.append(
                f"- `{machine}` ({cores} cores): {num(sum(spent) / 60)} minutes for "
                f"{names} (setup and timed epochs of every variant only: its run recorded no stage time, "
                f"so whatever else it ran is left out)"
            )
    return "\n".join(lines) or "No CPU bench run on record yet."
