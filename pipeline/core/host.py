"""What this machine has: one place that reads its physical memory, for the machine stage's
record and the shard reader's default join limit alike."""

from __future__ import annotations

import os


def physical_memory() -> int | None:
    """Bytes of physical memory, or None where the system does not say (no sysconf names)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None
