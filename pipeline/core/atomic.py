"""Outputs appear complete or not at all, one writer at a time.

Every stage writes to a temporary sibling and renames it into place only after the last
byte is written, so a crash, a failed check or Ctrl-C never leaves a file that looks valid
to DVC or to the next stage. A stage whose output is a folder builds the whole folder
beside the target and swaps it in at the end: on failure nothing of the target changes.

Each target has a lock (`.<name>.lock` beside it while held, `flock`, released by the kernel
when the process dies): a second run that would write the same target stops at once with a message
instead of interleaving with the first. Holding the lock, a writer removes temporaries a
killed run left behind (`.<name>.<8 random characters>.tmp`, its own only). Both kinds of file are in `.dvcignore`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import fcntl
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pipeline.core.errors import InputError, SystemFailure, reason, system_failure


class BusyError(InputError):
    """Another process is writing the same output right now."""


def _temporary(dest: Path) -> re.Pattern:
    """`.<name>.<8 random characters>.tmp`: how mkstemp and mkdtemp name `dest`'s temporaries."""
    return re.compile(re.escape(f".{dest.name}.") + r"[a-z0-9_]{8}\.tmp")


def _stale(dest: Path) -> list[Path]:
    """The temporaries of `dest` alone. (A glob `.<name>.*.tmp` would also match a sibling
    target's, such as `.train.parquet.x1y2z3w4.tmp` for `train`, which another run holding
    that sibling's lock may be writing right now.)"""
    own = _temporary(dest)
    return [p for p in dest.parent.iterdir() if own.fullmatch(p.name)]


@contextlib.contextmanager
def _worded(dest: Path) -> Iterator[None]:
    """A disk-full, file-too-large, read-only or permission error inside becomes one
    SystemFailure naming `dest` where it struck `dest`'s lock or one of its temporaries (or
    no file in particular), else the file it names."""
    prefix = re.escape(str(dest.parent / f".{dest.name}."))
    temporary = re.compile(prefix + r"[a-z0-9_]{8}\.tmp")
    ours = re.compile(prefix + r"([a-z0-9_]{8}\.tmp(/.*)?|lock)")
    try:
        yield
    except SystemFailure as err:  # worded further in, naming a path inside our temporary
        raise SystemFailure(temporary.sub(str(dest), str(err))) from None
    except Exception as err:
        name = getattr(err, "filename", None)
        name = None if name is None else str(name)
        if name is None or not ours.fullmatch(name):
            where = name or dest  # no file in particular, or one that is not ours
        else:
            where = temporary.sub(str(dest), name) if temporary.match(name) else dest  # (the lock: dest)
        failure = system_failure(err, where)
        if failure is None and isinstance(err, OSError) and name is not None and ours.fullmatch(name):
            # any other refusal of our own lock or temporary: the output named, not our file
            failure = SystemFailure(
                f"{dest}: cannot be written: {err.strerror or reason(err)} creating a file in {dest.parent}"
            )
        if failure is None:
            raise
        raise failure from None


def _umask() -> int:
    """mkstemp/mkdtemp create private (0600/0700) entries; outputs get the usual mode."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def locked(dest: Path) -> Iterator[None]:
    """Hold `dest`'s lock, and clear the temporaries of earlier, killed runs."""
    dest = Path(dest)
    lock = dest.parent / f".{dest.name}.lock"
    with _worded(dest):
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # The holder removes the lock file when done; a lock taken on a file already
        # removed would exclude nobody, so it counts as busy too.
        if os.fstat(fd).st_ino != os.stat(lock).st_ino:
            raise BlockingIOError
    except (BlockingIOError, FileNotFoundError):
        os.close(fd)
        raise BusyError(
            f"{dest}: another run is writing it right now (lock {lock}); wait for it to finish, then run again"
        ) from None
    try:
        for stale in list(_stale(dest)):
            shutil.rmtree(stale) if stale.is_dir() and not stale.is_symlink() else stale.unlink(missing_ok=True)
        yield
    finally:
        lock.unlink(missing_ok=True)  # while still holding it: no file is left inside outputs
        os.close(fd)


def check_replaceable(dest: Path) -> None:
    """A file output may replace `dest`: absent or a regular file; anything else (a folder,
    a device such as /dev/full, a pipe) is refused with one line, untouched."""
    from pipeline.core.errors import InputError

    if dest.exists() and not dest.is_file():
        raise InputError(f"{dest}: exists and is not a regular file; refusing to replace it (choose another output)")


@contextlib.contextmanager
def atomic_path(dest: Path) -> Iterator[Path]:
    """Yield a temporary path next to `dest`; on success rename it onto `dest`. A `dest`
    that exists and is not a regular file (a folder, a device such as /dev/full, a pipe) is
    refused with one line: renaming onto it would replace the node itself."""
    dest = Path(dest)
    check_replaceable(dest)
    with locked(dest), _worded(dest):
        fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            yield tmp
            os.chmod(tmp, 0o666 & ~_umask())
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)


MARKER = ".pipeline-output"  # inside every folder atomic_dir writes: what it may replace later


def check_owned(dest: Path, marker: str = MARKER, owns: Callable[[Path], bool] | None = None) -> None:
    """`dest` may be replaced: absent, an empty folder, or a folder this project wrote (it
    holds `marker`, or `owns(dest)` says so). A file, a link, the current folder or one above
    it, or a folder of someone else's is refused with one line; nothing is touched."""
    from pipeline.core.errors import InputError

    if dest.is_symlink() or dest.exists() and not dest.is_dir():
        raise InputError(f"{dest}: exists and is not a folder; refusing to replace it (choose another output)")
    if not dest.exists():
        return
    here = Path.cwd().resolve()
    if dest.resolve() == here or dest.resolve() in here.parents:
        raise InputError(f"{dest}: is the current folder or one above it; refusing to replace it")
    if not any(dest.iterdir()) or (owns(dest) if owns is not None else (dest / marker).is_file()):
        return
    why = f"no {marker} inside" if owns is None else f"not only what it writes, a {marker} and its files"
    raise InputError(
        f"{dest}: a folder this project did not write ({why}); refusing to replace it "
        f"(remove it yourself, or choose another output)"
    )


@contextlib.contextmanager
def atomic_dir(dest: Path, marker: str | None = None, owns: Callable[[Path], bool] | None = None) -> Iterator[Path]:
    """Yield a fresh temporary folder; on success it replaces `dest` as a whole. `dest` must
    be absent, empty or the project's own (`check_owned`); the new folder is marked so
    (MARKER), unless `marker` names a file the caller writes into it that marks it instead
    (then `owns(folder)` decides whether an existing folder is one of the caller's).

    The old folder is first renamed aside (a temporary name the next run clears), so at no
    moment is `dest` a mix of old and new; at worst, after a kill at that instant, it is
    missing and DVC restores it from its cache."""
    dest = Path(dest)
    check_owned(dest, marker or MARKER, owns)
    with locked(dest), _worded(dest):
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
        try:
            yield tmp
            if marker is None:
                (tmp / MARKER).write_text("written by this project's pipeline; replaced whole by its next run\n")
            os.chmod(tmp, 0o777 & ~_umask())
            old = None
            if dest.exists() or dest.is_symlink():
                old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
                os.replace(dest, old / "old")
            os.replace(tmp, dest)
            if old is not None:
                shutil.rmtree(old)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp)


def write_text(dest: Path, text: str) -> None:
    with atomic_path(dest) as tmp:
        tmp.write_text(text, encoding="utf-8")


def as_json(value: Any) -> Any:
    """A document (or any part of one) as JSON holds it: dataclasses as objects in field
    order, tuples as lists, dates as ISO strings."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: as_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {key: as_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [as_json(item) for item in value]
    if isinstance(value, dt.date):
        return value.isoformat()
    return value


def write_json(dest: Path, document, indent: int | None = 2) -> None:
    """`document` (dataclasses included: `as_json`) as JSON (indented, a final newline),
    atomically; a NaN or an infinity
    anywhere in it is refused with an InputError naming `dest` (JSON has no such numbers,
    and a figure that is not a number must not reach a metrics file or a page)."""
    import json

    from pipeline.core.errors import InputError

    try:
        text = json.dumps(as_json(document), indent=indent, allow_nan=False)
    except ValueError:
        raise InputError(f"{dest}: refusing to write a value that is not a finite number (NaN or inf)") from None
    write_text(Path(dest), text + "\n")
