"""What this device can compute at best: a short matmul probe, measured once per machine.

A verdict of "compute-bound" is a claim about arithmetic, so it needs the device's own
ceiling beside the step's achieved FLOP/s. The probe multiplies square matrices in float32
(the ceiling the verdict weighs a step against) and bfloat16 (whether bf16 autocast pays
here: the verdict advises it only where bfloat16 measured clearly faster), sized so that one
product takes a few milliseconds, on the CPU with one thread per usable core, and keeps the
best of a few repeats: a busy moment only lowers a repeat, never raises it. The result is
kept in a small JSON file under the user's cache folder
(`$XDG_CACHE_HOME/trainpath/peak.json`, else `~/.cache/...`), keyed by the machine's name,
device, usable cores and torch version, so a second run on the same machine costs nothing; a
probe taken on a busy host is taken again next time and the larger kept.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from pipeline.budget.machine import fingerprint
from pipeline.budget.trace import sync
from pipeline.budget.units import rate

DTYPES = (torch.float32, torch.bfloat16)
MAX_SIZE = {"cpu": 2048, "cuda": 8192}
MIN_PRODUCT_S = 0.004  # a product shorter than this is timed mostly as dispatch: grow the matrices
CACHE_BYTES = 1 << 20  # the cache file is a few hundred bytes a machine


@dataclass(frozen=True)
class Peak:
    """The device's measured matmul rates by dtype, named by the machine they were measured on."""

    rates: dict  # dtype name ("float32", "bfloat16") -> FLOP/s
    machine: str
    device: str
    threads: int  # torch's intra-op threads during the probe
    busy: bool = False  # the host's load was above its usable cores during the probe

    def __post_init__(self) -> None:
        rates = self.rates if isinstance(self.rates, dict) else {}
        good = all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in rates.values())
        if "float32" not in rates or not good or not isinstance(self.threads, int) or self.threads < 1:
            raise ValueError(
                f"a Peak needs a finite float32 rate > 0 and threads >= 1, got rates={self.rates!r:.80}, "
                f"threads={self.threads!r}"
            )

    def float32_at(self, threads: int | None) -> float:
        """The float32 rate a loop on `threads` intra-op threads can reach: on the CPU the
        probe's rate scaled to that many of the probe's threads; on a GPU, the rate."""
        if self.device != "cpu" or not threads:
            return self.float32
        return self.float32 * min(threads, self.threads) / self.threads

    @property
    def float32(self) -> float:
        """The rate of float32 products: the dtype a loop computes in unless told otherwise."""
        return self.rates["float32"]

    def over_float32(self, dtype: str) -> float | None:
        """`dtype`'s measured rate over float32's (above 1: faster here); None where `dtype`
        was not measured."""
        other = self.rates.get(dtype)
        return other / self.float32 if other else None

    def describe(self) -> str:
        """Each dtype's rate, float32 first, the threads and the machine, in words."""
        threads = f"{self.threads} thread{'s' if self.threads != 1 else ''}, " if self.device == "cpu" else ""
        ordered = sorted(self.rates.items(), key=lambda item: item[0] != "float32")
        rates = ", ".join(f"{rate(flop_s)} {dtype}" for dtype, flop_s in ordered)
        return f"{rates}, {threads}measured on {self.machine}"


def _product_s(a: torch.Tensor, b: torch.Tensor, device: torch.device) -> float:
    sync(device)
    start = time.perf_counter()
    torch.mm(a, b)
    sync(device)
    return time.perf_counter() - start


def probe_dtype(device: torch.device, dtype: torch.dtype, seconds: float) -> float:
    """The best FLOP/s of square products in `dtype` over about `seconds`: the size doubles
    from 256 until one product takes MIN_PRODUCT_S (or the size cap), then it repeats, at
    least six times, until the time is spent."""
    n = 256
    while True:
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        once = min(_product_s(a, b, device) for _ in range(2))
        if once >= MIN_PRODUCT_S or n >= MAX_SIZE.get(device.type, 2048) or once * 8 > seconds:
            break
        n *= 2
    best = once
    deadline = time.perf_counter() + seconds
    for done in range(200):  # the first repeats warm the kernel up; only the best counts
        best = min(best, _product_s(a, b, device))
        if done >= 5 and time.perf_counter() > deadline:
            break
    return 2 * n**3 / best


def host_busy() -> bool:
    """Whether the last minute's load average exceeds the cores this process may use."""
    try:
        return os.getloadavg()[0] > usable_cores()
    except OSError:
        return False


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the system says), else all."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def measure_peak(device: torch.device, seconds: float = 0.6) -> Peak:
    """Probe every dtype of DTYPES for `seconds` in all; on the CPU with one intra-op thread
    per usable core (what the device can do, whatever the loop's own setting), which is put
    back afterwards."""
    device = torch.device(device)
    busy = host_busy()
    threads = torch.get_num_threads()
    probe_threads = usable_cores() if device.type == "cpu" else threads
    torch.set_num_threads(probe_threads)
    try:
        rates = {str(d).removeprefix("torch."): probe_dtype(device, d, seconds / len(DTYPES)) for d in DTYPES}
    finally:
        torch.set_num_threads(threads)
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the probe's matrices are not the user's to keep
    return Peak(
        rates=rates,
        machine=fingerprint(device.type).name,
        device=device.type,
        threads=probe_threads,
        busy=busy or host_busy(),
    )


def cache_file() -> Path:
    """The user's cache of probes: $XDG_CACHE_HOME/trainpath/peak.json, else ~/.cache/..."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "trainpath" / "peak.json"


def _key(device: torch.device) -> str:
    return (
        f"{fingerprint(device.type).name}|{device.type}|cores={usable_cores()}|torch={torch.__version__}"
        f"|float32={torch.get_float32_matmul_precision()}"
    )


def _read_cache(path: Path) -> dict:
    """The cache's entries; an unreadable or foreign file counts as empty (it is only a cache)."""
    try:
        with open(path, "rb") as file:
            entries = json.loads(file.read(CACHE_BYTES))
    except (OSError, ValueError):
        return {}
    return entries if isinstance(entries, dict) else {}


def _cached(entry: object) -> Peak | None:
    """A cache entry as a Peak, or None where it is not one (an older or edited file)."""
    try:
        return Peak(**entry)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _write_cache(path: Path, entries: dict) -> None:
    """A new file renamed over the old: a reader never sees half of it; failures are ignored."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=".peak-", suffix=".tmp", delete=False) as tmp:
            json.dump(entries, tmp, indent=1, sort_keys=True)
        os.replace(tmp.name, path)
    except OSError:
        try:
            os.unlink(tmp.name)
        except (OSError, UnboundLocalError):
            pass


def device_peak(device: str | torch.device, cache: Path | None = None) -> Peak:
    """This device's peak, from the cache when a quiet probe of this machine is there, else
    measured now (and kept)."""
    device = torch.device(device)
    path = cache_file() if cache is None else Path(cache)
    entries = _read_cache(path)
    key = _key(device)
    known = _cached(entries.get(key))
    if known is not None and not known.busy:
        return known
    peak = measure_peak(device)
    if known is not None:  # taken on a busy host before: the larger of the two, dtype by dtype
        peak = Peak(**{**asdict(peak), "rates": {d: max(r, known.rates.get(d, 0)) for d, r in peak.rates.items()}})
    _write_cache(path, {**entries, key: asdict(peak)})
    return peak
