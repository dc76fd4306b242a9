"""Where data lives: a local path, or a URL of an object store (read through fsspec)."""

from __future__ import annotations


def is_url(location: object) -> bool:
    """A location that names a remote store (`scheme://...`) rather than a local path."""
    return "://" in str(location)
