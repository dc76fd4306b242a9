"""The errors a user can cause with bad input, apart from bugs.

The CLI turns any of these into one line on stderr and exit status 2; anything else is a
bug and keeps its traceback.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad input: a file, a row, a key or a value that breaks its contract. The message
    names the file (and line, column, key or shard) and what was expected."""


class DataError(InputError):
    """Input data that breaks the data set's contract; the message says what and where."""
