"""The errors a user can cause with bad input, apart from bugs.

The CLI turns any of these into one line on stderr and exit status 2; anything else is a
bug and keeps its traceback.
"""

from __future__ import annotations


_HEX_DIGITS = frozenset("0123456789abcdef")


class InputError(ValueError):
    """Bad input: a file, a row, a key or a value that breaks its contract. The message
    names the file (and line, column, key or shard) and what was expected."""


class DataError(InputError):
    """Input data that breaks the data set's contract; the message says what and where."""


def is_hex(value: str, length: int) -> bool:
    """A digest as every file here records it: exactly `length` lowercase hex digits."""
    return len(value) == length and set(value) <= _HEX_DIGITS


def reason(err: BaseException, limit: int = 200) -> str:
    """A library's error as the tail of one of ours: its first line, cut to `limit`, or its
    type's name when it says nothing (a bare `KeyError()` or `OSError()`)."""
    lines = str(err).splitlines()
    return lines[0][:limit] if lines and lines[0] else type(err).__name__
