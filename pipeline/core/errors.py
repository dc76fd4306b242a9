"""The errors a user can cause with bad input, apart from bugs.

The CLI turns any of these into one line on stderr and exit status 2; anything else is a
bug and keeps its traceback.
"""

from __future__ import annotations

import re

_HEX_DIGITS = re.compile("[0-9a-f]*")
SLUG = "[a-z0-9][a-z0-9_-]{0,63}"  # a data set's name (a folder name): matched whole, never with `$`
_SLUG = re.compile(SLUG)


class InputError(ValueError):
    """Bad input: a file, a row, a key or a value that breaks its contract. The message
    names the file (and line, column, key or shard) and what was expected."""


class DataError(InputError):
    """Input data that breaks the data set's contract; the message says what and where."""


def is_hex(value: str, length: int) -> bool:
    """A digest as every file here records it: exactly `length` lowercase hex digits."""
    return len(value) == length and _HEX_DIGITS.fullmatch(value) is not None


def is_slug(value) -> bool:
    """A plain name: a-z and 0-9 first, then also '-' and '_', at most 64 characters, and
    nothing else (no trailing newline: `$` would let one through)."""
    return isinstance(value, str) and _SLUG.fullmatch(value) is not None


def reason(err: BaseException, limit: int = 200) -> str:
    """A library's error as the tail of one of ours: its first line, cut to `limit`, or its
    type's name when it says nothing (a bare `KeyError()` or `OSError()`)."""
    lines = str(err).splitlines()
    return lines[0][:limit] if lines and lines[0] else type(err).__name__


class SystemFailure(InputError):
    """The operating system refused a read or write (disk full, file too large, read-only or
    forbidden): not a bug, and nothing of the outputs changed. The message names the path
    and what to do."""


_ADVICE = {
    "ENOSPC": "the disk is full: free space there (or write the output elsewhere), then run again",
    "EDQUOT": "the disk quota is used up: free space there (or write the output elsewhere), then run again",
    "EFBIG": "the file is larger than this system or `ulimit -f` allows: raise the limit, then run again",
    "EROFS": "the file system is read-only: write the output to a writable folder",
    "EACCES": "permission denied: check the owner and mode of the path and its folder (ls -ld)",
    "EPERM": "operation not permitted: check the owner and mode of the path and its folder (ls -ld)",
}


def os_errno(err: BaseException) -> int | None:
    """The errno behind `err`: an OSError's own, or the one a library's error quotes
    ("[Errno 28]", "os error 28"), or None."""
    import re

    number = getattr(err, "errno", None)
    if isinstance(number, int):
        return number
    found = re.search(r"(?:errno|os error)\s*(\d+)", str(err), re.IGNORECASE)
    return int(found.group(1)) if found else None


def system_failure(err: BaseException, path: object = None) -> SystemFailure | None:
    """A one-line SystemFailure for a disk-full, file-too-large, read-only or permission error
    (naming `path`, else `err.filename`), or None for any other error."""
    import errno
    import os

    number = os_errno(err)
    name = errno.errorcode.get(number, "") if number is not None else ""
    if name not in _ADVICE:
        return None
    where = path or getattr(err, "filename", None) or "(a file)"
    return SystemFailure(f"{where}: {os.strerror(number)} ({name}); {_ADVICE[name]}; the outputs are unchanged")
