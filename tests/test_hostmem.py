"""Freed host memory stays in the heap during the bench (glibc), and malloc's defaults return after."""

import ctypes

import pytest
import torch

from pipeline.bench.hostmem import _glibc, reuse_host_memory


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _mapped_bytes() -> int:
    """Bytes malloc holds in separate mappings (blocks above its mmap threshold)."""
    libc = _glibc()
    if libc is None or not hasattr(libc, "mallinfo2"):
        pytest.skip("glibc >= 2.33 needed to read malloc's statistics")
    libc.mallinfo2.restype = MallInfo2
    return libc.mallinfo2().hblkhd


BLOCK = 48 << 20  # above glibc's largest dynamic mmap threshold (32 MiB): mapped by default


def test_large_blocks_come_from_the_heap_while_reusing_and_are_mapped_after():
    before = _mapped_bytes()
    with reuse_host_memory(True) as state:
        assert state == "kept"
        block = torch.empty(BLOCK, dtype=torch.uint8)
        assert _mapped_bytes() - before < BLOCK  # served from the heap: no fresh mapping to fault in
        del block
    block = torch.empty(BLOCK, dtype=torch.uint8)
    assert _mapped_bytes() - before >= BLOCK  # malloc's defaults again: a mapping of its own
    del block


def test_disabled_changes_nothing():
    before = _mapped_bytes()
    with reuse_host_memory(False) as state:
        assert state == "malloc default"
        block = torch.empty(BLOCK, dtype=torch.uint8)
        assert _mapped_bytes() - before >= BLOCK
        del block


def test_without_glibc_it_says_so(monkeypatch):
    import pipeline.bench.hostmem as hostmem

    monkeypatch.setattr(hostmem, "_glibc", lambda: None)
    with reuse_host_memory(True) as state:
        assert state == "malloc default"
