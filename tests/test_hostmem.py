"""Freed host memory stays in the heap during the bench (glibc), and malloc's defaults return after."""

import ctypes

import pytest

from pipeline.bench.hostmem import _glibc, reuse_host_memory


class MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _mapped_bytes() -> int:
    """Bytes malloc holds in separate mappings (blocks above its mmap threshold)."""
    libc = _glibc()
    if libc is None or not hasattr(libc, "mallinfo2"):
        pytest.skip("glibc >= 2.33 needed to read malloc's statistics")
    libc.mallinfo2.restype = MallInfo2
    return libc.mallinfo2().hblkhd


BLOCK = 48 << 20  # above glibc's largest dynamic mmap threshold (32 MiB): mapped by default


CHECK = """
import sys
sys.path.insert(0, {tests!r})
import torch
from test_hostmem import BLOCK, _mapped_bytes
from pipeline.bench.hostmem import reuse_host_memory

before = _mapped_bytes()
with reuse_host_memory({enabled}) as state:
    block = torch.empty(BLOCK, dtype=torch.uint8)
    inside = _mapped_bytes() - before
    del block
# after: a block larger than any freed inside (a freed one may still be in the heap's bins and
# serve a request of its size, whatever the thresholds)
block = torch.empty(2 * BLOCK, dtype=torch.uint8)
print(state, inside >= BLOCK, _mapped_bytes() - before >= 2 * BLOCK)
"""


def _fresh_process(enabled: bool) -> str:
    """Run the check in a new interpreter: a heap that earlier tests (a bench) left holding
    free memory would serve the block whatever the thresholds say."""
    import subprocess
    import sys
    from pathlib import Path

    _mapped_bytes()  # skips where malloc's statistics cannot be read
    code = CHECK.format(tests=str(Path(__file__).parent), enabled=enabled)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_large_blocks_come_from_the_heap_while_reusing_and_are_mapped_after():
    # inside: served from the heap, no fresh mapping to fault in; after: malloc's defaults again
    assert _fresh_process(True) == "kept False True"


def test_disabled_changes_nothing():
    assert _fresh_process(False) == "malloc default True True"  # malloc's default: a mapping of its own


def test_without_glibc_it_says_so(monkeypatch):
    import pipeline.bench.hostmem as hostmem

    monkeypatch.setattr(hostmem, "_glibc", lambda: None)
    with reuse_host_memory(True) as state:
        assert state == "malloc default"
