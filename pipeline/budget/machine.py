"""Which machine this is, in the words every figure carries: a fingerprint and its name.

The name (`amd-epyc-2c-avx512bf16`, `h100-80gb-hbm3`) labels every figure the project prints
or writes, so that another machine's figures are never read as this one's. The fingerprint
holds what the figures depend on (CPU model, the instruction sets that set its peaks, cores,
memory, GPU model and count, torch and CUDA versions, the device used) and nothing that
varies between two runs on one machine (time, load, free memory). Two CPUs sold under one
name differ in what they compute natively (AVX2 alone, or AVX-512 with bf16: peaks a hundred
times apart in bf16), so the best of those instruction sets is in the name too.
"""

from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass
from typing import Literal, Optional

from pipeline.core.bounds import ConfigDict, Int, Line, Name, Num

# The CPU flags that set a peak (x86: vector width, FMA, bf16/fp16 and AMX; Arm: NEON, SVE,
# bf16, int8 matrix), best first where they name a tier of the machine's name.
TIERS = (
    ("amx_bf16", "amx"),
    ("avx512_bf16", "avx512bf16"),
    ("avx512f", "avx512"),
    ("avx2", "avx2"),
    ("sve2", "sve2"),
    ("sve", "sve"),
    ("asimd", "neon"),
)
PEAK_FLAGS = frozenset(
    {
        "fma",
        "avx2",
        "avx512f",
        "avx512_bf16",
        "avx512_fp16",
        "avx512_vnni",
        "amx_bf16",
        "amx_tile",
        "amx_int8",
        "asimd",
        "sve",
        "sve2",
        "bf16",
        "i8mm",
        "fphp",
        "asimdhp",
    }
)


def cpu_info() -> str:
    """/proc/cpuinfo's text (Linux), or '' where there is none."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            return info.read(1 << 22)
    except OSError:
        return ""


def cpu_model(text: str | None = None) -> str:
    """The CPU's marketing name (Linux: /proc/cpuinfo), else what `platform` knows."""
    for line in (cpu_info() if text is None else text).splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "Hardware") and value.strip():
            return " ".join(value.split())[:120]
    return (platform.processor() or platform.machine() or "unknown")[:120]


def cpu_flags(text: str | None = None) -> frozenset[str]:
    """The first CPU's flags (x86 `flags`, Arm `Features`), empty where the system does not say."""
    for line in (cpu_info() if text is None else text).splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def isa(flags: frozenset[str]) -> list[str]:
    """The instruction sets among `flags` that set this CPU's peaks, sorted."""
    return sorted(flags & PEAK_FLAGS)


def tier(flags: frozenset[str]) -> str:
    """The best instruction set of the CPU ('avx512bf16', 'avx2', 'neon'), '' where unknown."""
    return next((name for flag, name in TIERS if flag in flags), "")


def native_bf16(flags: frozenset[str]) -> bool:
    """Whether the CPU computes bf16 natively (AMX-BF16, AVX512-BF16); elsewhere it is emulated."""
    return bool(flags & {"amx_bf16", "avx512_bf16"})


def physical_memory() -> int | None:
    """Bytes of physical memory, or None where the system does not say (no sysconf names)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def memory_gb() -> float:
    """Total memory in GiB, rounded to a whole GiB (the kernel's figure moves by a few MB)."""
    memory = physical_memory()
    return float(round(memory / 2**30)) if memory else 0.0


def slug(text: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100-80gb-hbm3': a folder name under results/."""
    text = re.sub(r"^nvidia\s+", "", text.strip(), flags=re.IGNORECASE)
    text = re.sub(r"\((r|tm)\)|processor|\bcpu\b|@.*$", " ", text, flags=re.IGNORECASE)
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:48] or "unknown"


def cpu_name(model: str, cores: int, best: str = "") -> str:
    """A CPU run's name, 'amd-epyc-2c-avx512bf16': the model's slug, cut so that the name,
    cores and instruction-set tier included, fits a 64-character folder name."""
    suffix = f"-{cores}c" + (f"-{best}" if best else "")
    return slug(model)[: 64 - len(suffix)].rstrip("-") + suffix


@dataclass(frozen=True, kw_only=True)
class Fingerprint:
    """A machine as its figures name it: the machine stage's file, every bench document's
    `machine` block. Fields in the file's order; the ones a document written before them lacks
    (`isa`, `python`) are None there."""

    __pydantic_config__ = ConfigDict(extra="forbid")
    name: Name
    cpu: Line
    isa: Optional[tuple[Name, ...]] = None  # the peak-setting instruction sets
    cores: Int(1, 1 << 20)
    memory_gb: Num(ge=0, le=1e7)
    gpu: Optional[Line] = None
    gpu_count: Int(0, 1 << 16) = 0
    torch: Line
    cuda: Optional[Line] = None
    device: Literal["cpu", "cuda"]
    python: Optional[Line] = None


def fingerprint(device: str = "auto") -> Fingerprint:
    """The fingerprint of this machine as the bench would use it (`device`: auto, cpu, cuda)."""
    import torch

    cuda = torch.cuda.is_available()
    chosen = ("cuda" if cuda else "cpu") if device == "auto" else device.split(":")[0]
    gpu = torch.cuda.get_device_name(0) if cuda else None
    cores = os.cpu_count() or 1
    text = cpu_info()
    flags = cpu_flags(text)
    best = tier(flags)
    name = slug(gpu) if chosen == "cuda" and gpu else cpu_name(cpu_model(text), cores, best)
    return Fingerprint(
        name=name,
        cpu=cpu_model(text),
        isa=tuple(isa(flags)),
        cores=cores,
        memory_gb=memory_gb(),
        gpu=gpu,
        gpu_count=torch.cuda.device_count() if cuda else 0,
        torch=torch.__version__,
        cuda=torch.version.cuda,
        device=chosen,
        python=platform.python_version(),
    )
