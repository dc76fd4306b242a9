"""Keep freed host memory for reuse while the bench runs (glibc's malloc).

glibc serves every block above its mmap threshold (128 KiB at start, raised as large blocks
are freed, never past 32 MiB) with a fresh mapping and unmaps it on free, and trims the top
of its heap back to the kernel. A CPU train step at batch 512 allocates activations and
gradients of tens of MiB and frees them before the next step, so with those defaults every
step maps new pages that the kernel must fault in and zero on first touch: system time that
moves with whatever else the host is doing. On a small CPU that was a large and unsteady share
of every eager epoch (docs/bench.md shows how to see it: `-S bench.reuse_host_memory=false`).

Raising both thresholds keeps freed blocks in the heap for the next step to reuse, as the
caching allocator does for CUDA memory and as jemalloc or tcmalloc (PyTorch's CPU tuning
guide) would; it needs no library and no preloading. Forked DataLoader workers inherit it.
Elsewhere than glibc it does nothing and says so.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
from collections.abc import Iterator

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)
GLIBC_DEFAULT = 128 * 1024  # both thresholds' documented start value
KEEP = 1 << 30  # blocks up to 1 GiB come from (and return to) the heap


def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "mallopt") and hasattr(libc, "gnu_get_libc_version") else None


def _set(libc: ctypes.CDLL, threshold: int) -> bool:
    return bool(libc.mallopt(M_MMAP_THRESHOLD, threshold)) and bool(libc.mallopt(M_TRIM_THRESHOLD, threshold))


@contextlib.contextmanager
def reuse_host_memory(enabled: bool) -> Iterator[str]:
    """Within: freed host blocks stay in the heap for reuse (when `enabled` and on glibc).

    Yields what holds, for the results: "kept" or "malloc default". On exit both thresholds
    go back to glibc's documented start value (the dynamic raising it does by default cannot
    be switched back on) and the free memory kept at the heap's top is given back."""
    libc = _glibc() if enabled else None
    if libc is None:
        yield "malloc default"
        return
    kept = _set(libc, KEEP)
    try:
        yield "kept" if kept else "malloc default"
    finally:
        _set(libc, GLIBC_DEFAULT)
        libc.malloc_trim(0)
