"""The bench's time, known before it starts, and a host too busy to measure, said up front.

A bench takes minutes to an hour, so before its first rung it prints what it will take:
a short calibration times the write-up's model training on random batches here, and an
earlier bench document of the same device type and mode (this machine's, else another's,
`results/<machine>/<dataset>.json` or the workspace's) is scaled by the ratio of the two
calibrations (older documents carry none: their `device` rung's step stands in). While the
bench runs, the time left is the earlier run's time per part (variant, floor, seeds),
scaled by how this run has kept pace so far.

A busy host spreads and slows every figure, so it is found first: the processes that used
the CPU over a short window (other than this one), the load average against the usable
cores, and how much the calibration's blocks of steps disagree.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from pipeline.bench.document import Calibration
from pipeline.bench.model import SimpleCNN
from pipeline.budget import duration, usable_cores
from pipeline.core.bounded import read_json
from pipeline.core.errors import InputError

BUSY_SHARE = 0.2  # of a core: a process using more than this during the window is listed
SHAKY = 2.0  # calibration blocks spread past this many times bench.max_spread: an unsteady host


def calibrate(device: torch.device, batch_size: int, blocks: int = 5, block_s: float = 0.25) -> Calibration:
    """Train SimpleCNN with Adam on one random batch: 3 warm-up steps, then `blocks` blocks of
    as many steps as fill about `block_s` seconds; the fastest block's seconds per step."""
    torch.manual_seed(0)
    model = SimpleCNN().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.rand(batch_size, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (batch_size,), device=device)

    def steps(n: int) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(n):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return (time.perf_counter() - start) / n

    first = min(steps(1) for _ in range(3))
    per_block = max(1, min(1000, int(block_s / max(first, 1e-6))))
    timed = [steps(per_block) for _ in range(blocks)]
    middle = statistics.median(timed)
    # the fastest block: another process can only slow a block down, so the fastest is the
    # machine's own speed, the figure two calibrations compare by; the spread says the rest
    spread = (max(timed) - min(timed)) / middle if middle > 0 else 0.0
    return Calibration(step_s=min(timed), spread=spread)


def busy_processes(
    window_s: float = 0.5, exclude: tuple[int, ...] = (), share: float = BUSY_SHARE
) -> list[tuple[int, str, float]]:
    """(pid, name, share of one core) of every process that used more than `share` of a
    core over `window_s` seconds, busiest first (Linux /proc; elsewhere none are seen)."""

    def cpu_ticks() -> dict[int, tuple[str, int]]:
        found = {}
        for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as stat:
                    text = stat.read(4096).decode("utf-8", "replace")
            except OSError:
                continue
            name, _, rest = text.rpartition(")")
            fields = rest.split()
            if len(fields) > 12:
                found[int(entry.name)] = (name.partition("(")[2], int(fields[11]) + int(fields[12]))
        return found

    before = cpu_ticks()
    time.sleep(window_s)
    after = cpu_ticks()
    hertz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    ignored = {os.getpid(), *exclude}
    busy = [
        (pid, name, (ticks - before[pid][1]) / hertz / window_s)
        for pid, (name, ticks) in after.items()
        if pid in before and pid not in ignored
    ]
    return sorted((b for b in busy if b[2] > share), key=lambda b: -b[2])


def host_report(calibration: Calibration, max_spread: float, busy: list[tuple[int, str, float]]) -> str | None:
    """One paragraph when the host is too busy to measure well: what runs, what it does to the
    figures; None on a quiet host."""
    cores = usable_cores()
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = 0.0
    used = sum(share for _, _, share in busy)
    troubles = []
    if busy and used > 0.5:
        names = ", ".join(f"{name} (pid {pid}) {share:.0%} of a core" for pid, name, share in busy[:4])
        troubles.append(f"other processes use {used:.1f} of its {cores} usable cores: {names}")
    elif load > cores:
        troubles.append(f"its load average is {load:.1f} on {cores} usable cores")
    if calibration.spread > SHAKY * max_spread:  # short blocks spread more than whole epochs on any host
        troubles.append(
            f"blocks of the same training steps took {calibration.spread:.0%} apart "
            f"(over {SHAKY:g}x bench.max_spread, {max_spread:.0%})"
        )
    if not troubles:
        return None
    return (
        "warning: this host is busy: " + "; ".join(troubles) + ". Every figure will be slower and spread wider "
        "than on a quiet host, and rungs whose epochs spread past bench.max_spread are marked unstable; for "
        "figures to keep, stop them or run the bench later."
    )


def reference_step_s(document: dict) -> float | None:
    """What a bench document's run took per calibration step: its own calibration, else its
    `device` rung's steady seconds per train step (older documents)."""
    calibration = _mapping(document, "calibration")
    if _positive(calibration.get("step_s")):
        return float(calibration["step_s"])
    device = _mapping(_mapping(document, "variants"), "device")
    params = _mapping(document, "params")
    if device.get("extrapolated") or not all(
        _positive(v) for v in (device.get("train_s"), params.get("train_samples"), params.get("batch_size"))
    ):
        return None
    return float(device["train_s"]) / math.ceil(params["train_samples"] / params["batch_size"])


def _positive(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _mapping(document: object, key: str) -> dict:
    """`document[key]` when both are mappings, else an empty one: an earlier run's file is
    only ever a hint, and a malformed one gives no estimate rather than stopping a bench."""
    value = document.get(key) if isinstance(document, dict) else None
    return value if isinstance(value, dict) else {}


def usable_reference(path: Path, device_type: str) -> dict | None:
    """A bench document at `path` that a run on `device_type` can scale from."""
    try:
        document = read_json(path, 64 << 20, "bench metrics file")
    except (OSError, InputError):
        return None
    variants = _mapping(document, "variants")
    if _mapping(document, "env").get("device_type") != device_type or not variants:
        return None
    if not all(isinstance(v, dict) for v in variants.values()):
        return None
    return document if reference_step_s(document) else None


def find_reference(
    dataset: str, candidates: list[Path], device_type: str, quick: bool, machine: str | None
) -> dict | None:
    """The earlier bench of `dataset` on this device type to scale from: this machine's in
    this mode first, then this machine's in the other, then another machine's. A file counts
    by the data set it records, not by its name alone (a copy named otherwise is not one)."""
    usable = [
        doc
        for path in candidates
        if path.name == f"{dataset}.json"
        for doc in [usable_reference(path, device_type)]
        if doc and doc.get("dataset") == dataset
    ]

    def rank(doc: dict) -> tuple[bool, bool]:
        return _mapping(doc, "machine").get("name") != machine, bool(_mapping(doc, "params").get("quick")) != quick

    return min(usable, key=rank, default=None)


def parts(document: dict) -> dict[str, float]:
    """An earlier run's seconds per part (each variant, `floor`, `seeds`, summing to its
    `wall_s`): recorded ones where it has them (`bench_s`), else its variants' recorded
    times, a sampled rung's scaled to the steps it ran, and the rest spread over them."""
    variants = _mapping(document, "variants")
    params = _mapping(document, "params")
    recorded = {name: v["bench_s"] for name, v in variants.items() if _positive(v.get("bench_s"))}
    if recorded and len(recorded) == len(variants):
        extra = {k: document[k] for k in ("floor_s", "seeds_s") if _positive(document.get(k))}
        return {**recorded, **{k.removesuffix("_s"): v for k, v in extra.items()}}
    steps = math.ceil(params.get("train_samples", 60000) / max(1, params.get("batch_size", 512)))
    share = params.get("sample_steps", 20) * params.get("sample_epochs", 4) / max(1, steps * params.get("epochs", 5))
    rough = {
        name: float(v.get("wall_s", 0.0)) * (share if v.get("extrapolated") else 1.0) for name, v in variants.items()
    }
    total = sum(rough.values())
    wall = _number(document, "wall_s")
    scale = wall / total if total > 0 and wall > 0 else 1.0
    return {name: seconds * scale for name, seconds in rough.items()}


def _number(entry: dict, key: str) -> float:
    value = entry.get(key)
    return float(value) if _positive(value) else 0.0


def predict(document: dict, settings) -> dict[str, float]:
    """Seconds per part of a bench with `settings` (a `settings.BenchSettings`), at the speed
    of the run `document` records: each rung from that run's setup and per-epoch figures and
    this run's epochs, sampled steps and profiled pass; a floor epoch after each full rung;
    the seeds at that run's median time to accuracy. A rung it did not run takes the mean."""
    variants = _mapping(document, "variants")
    params = _mapping(document, "params")
    steps = max(1, math.ceil(_number(params, "train_samples") / max(1.0, _number(params, "batch_size"))))
    floor_s = _number(_mapping(document, "floor"), "train_s")
    out: dict[str, float] = {}
    for name in settings.variants:
        entry = variants.get(name)
        if not isinstance(entry, dict):
            continue
        epoch = _number(entry, "train_s") + _number(entry, "test_s")
        once = _number(entry, "setup_s") + max(0.0, _number(entry, "first_epoch_train_s") - _number(entry, "train_s"))
        if name in settings.sample:
            share = settings.sample_steps / steps
            out[name] = once + (settings.sample_epochs + settings.budget) * share * epoch
        else:
            profiled = min(1.0, settings.sample_steps / steps) * _number(entry, "train_s") if settings.budget else 0.0
            out[name] = once + settings.epochs_of(name) * epoch + profiled + (floor_s if settings.floor else 0.0)
    known = list(out.values()) or [0.0]
    out.update({name: statistics.mean(known) for name in settings.variants if name not in out})
    if settings.accuracy_seeds:
        out["seeds"] = settings.accuracy_seeds * _number(_mapping(document, "seeds"), "median")
    tuned = variants.get("tuned")
    if "tuned" in settings.variants and settings.tuned is not None and settings.tuned.seeds:
        # each seed its whole schedule: the rung's setup and epochs, no profiled pass or floor
        once = (
            _number(tuned, "setup_s") + settings.tuned.epochs * (_number(tuned, "train_s") + _number(tuned, "test_s"))
            if isinstance(tuned, dict)
            else out["tuned"]
        )
        out["tuned_seeds"] = settings.tuned.seeds * once
    return out


@dataclass
class Pace:
    """The time left of a bench: an earlier run's parts, scaled by this run's pace so far,
    kind by kind. A sampled rung's per-item Python and a full rung's arithmetic change
    speed apart from one machine to the next, so each kind keeps its own pace; a kind not
    yet seen keeps the calibration's."""

    expected: dict[str, float]  # seconds per part, scaled by the calibration
    kinds: dict[str, str] = dataclasses.field(default_factory=dict)  # part -> kind; unnamed parts: "full"

    def total(self) -> float:
        return sum(self.expected.values())

    def left(self, done: dict[str, float]) -> float:
        """Seconds left after the parts `done` (part -> the seconds it took), each kind at
        the pace its parts were done at."""

        def kind(name: str) -> str:
            return self.kinds.get(name, "full")

        pace = {}
        for k in {kind(name) for name in self.expected}:
            took = sum(seconds for name, seconds in done.items() if kind(name) == k and name in self.expected)
            planned = sum(self.expected[name] for name in done if kind(name) == k and name in self.expected)
            pace[k] = took / planned if planned > 0 and took > 0 else 1.0
        return sum(seconds * pace[kind(name)] for name, seconds in self.expected.items() if name not in done)


def same_run(document: dict, settings) -> bool:
    """Whether `document` ran what `settings` asks, part by part, with each part's time
    recorded: then its recorded times are the estimate, else `predict`'s."""
    params = _mapping(document, "params")
    variants = _mapping(document, "variants")
    asked = {
        "quick": settings.quick,
        "epochs": settings.epochs,
        "sample_steps": settings.sample_steps,
        "sample_epochs": settings.sample_epochs,
    }
    return (
        all(params.get(key) == value for key, value in asked.items())
        and list(variants) == list(settings.variants)
        and all(isinstance(v.get("bench_s"), (int, float)) for v in variants.values())
    )


def settings_of(document: dict, settings):
    """The settings `document`'s own run had, as far as it records them (`settings` for the rest)."""
    params, variants = _mapping(document, "params"), _mapping(document, "variants")
    seeds = _mapping(document, "seeds").get("seeds")

    def count(key: str, default: int) -> int:
        return int(params[key]) if _positive(params.get(key)) else default

    return dataclasses.replace(
        settings,
        variants=tuple(variants),
        sample=tuple(n for n, v in variants.items() if v.get("extrapolated")),
        epochs=count("epochs", settings.epochs),
        sample_steps=count("sample_steps", 1),
        sample_epochs=count("sample_epochs", 1),
        quick=bool(params.get("quick")),
        floor=bool(_mapping(document, "floor")),
        budget=any(v.get("budget") for v in variants.values()),
        accuracy_seeds=len(seeds) if isinstance(seeds, list) else 0,
    )


def pace_for(reference: dict, calibration: Calibration, settings) -> Pace:
    """This run's expected parts (`settings`: a `settings.BenchSettings`): the reference's
    recorded ones where it ran the same bench, else `predict`'s, corrected by how far
    `predict` missed the reference's own wall time (what it does not model: loading, worker
    starts); scaled by this machine's calibration step over the reference's."""
    scale = calibration.step_s / reference_step_s(reference)
    if same_run(reference, settings):
        earlier = parts(reference)
    else:
        earlier = predict(reference, settings)
        own = sum(predict(reference, settings_of(reference, settings)).values())
        wall = reference.get("wall_s")
        missed = min(2.0, max(0.5, float(wall) / own)) if own > 0 and _positive(wall) else 1.0
        earlier = {name: seconds * missed for name, seconds in earlier.items()}
    kinds = {name: "sampled" if name in settings.sample else "full" for name in settings.variants}
    return Pace({name: seconds * scale for name, seconds in earlier.items()}, kinds)


def announce(
    dataset: str, reference: dict | None, calibration: Calibration, pace: Pace | None, others: dict[str, float]
) -> str:
    """The estimate, printed before the first rung: this data set's, the whole bench's, and
    what it rests on."""
    here = f"a training step of the write-up's model takes {duration(calibration.step_s)} here"
    if reference is None or pace is None:
        return (
            f"bench {dataset}: no earlier bench on this device type and mode to scale from, so no estimate "
            f"yet ({here}); the time left is printed after each rung"
        )
    whose = _mapping(reference, "machine").get("name") or "an unnamed machine"
    wall = reference.get("wall_s")
    took = f", whose bench of {dataset} took {duration(float(wall))}" if _positive(wall) else ""
    total = pace.total()
    whole = ""
    if others:
        names = ", ".join(others)
        whole = f"; the whole bench, with {names}, about {duration(total + sum(others.values()))}"
    return (
        f"bench {dataset}: about {duration(total)} here{whole} ({here}, "
        f"{duration(reference_step_s(reference))} on {whose}{took})"
    )
