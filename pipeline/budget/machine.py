"""Which machine this is, in the words every figure carries: a fingerprint and its name.

The name (`amd-epyc-2c`, `h100-80gb-hbm3`) labels every figure the project prints or
writes, so that another machine's figures are never read as this one's. The fingerprint
holds what the figures depend on (CPU model and cores, memory, GPU model and count, torch
and CUDA versions, the device used) and nothing that varies between two runs on one
machine (time, load, free memory).
"""

from __future__ import annotations

import os
import platform
import re


def cpu_model() -> str:
    """The CPU's marketing name (Linux: /proc/cpuinfo), else what `platform` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info.read(1 << 20).splitlines():
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                    return " ".join(value.split())[:120]
    except OSError:
        pass
    return (platform.processor() or platform.machine() or "unknown")[:120]


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


def fingerprint(device: str = "auto") -> dict:
    """The fingerprint of this machine as the bench would use it (`device`: auto, cpu, cuda)."""
    import torch

    cuda = torch.cuda.is_available()
    chosen = ("cuda" if cuda else "cpu") if device == "auto" else device.split(":")[0]
    gpu = torch.cuda.get_device_name(0) if cuda else None
    cores = os.cpu_count() or 1
    name = slug(gpu) if chosen == "cuda" and gpu else f"{slug(cpu_model())}-{cores}c"
    return {"name": name, "cpu": cpu_model(), "cores": cores, "memory_gb": memory_gb(), "gpu": gpu,
            "gpu_count": torch.cuda.device_count() if cuda else 0, "torch": torch.__version__,
            "cuda": torch.version.cuda, "device": chosen, "python": platform.python_version()}
