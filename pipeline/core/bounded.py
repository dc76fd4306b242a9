"""Reading an input with a bound on what it can cost.

Every reader here knows the most it may take before it opens anything: a regular file (a
FIFO, a socket or a device is refused before a byte is read, so nothing can block or read
without end), inside the folder it belongs to when one is named (a link out of it is
refused), at most `cap` bytes (the size is checked first, then the read stops at the cap,
so a file that grows while read is refused too). On top of that, the two text formats the
pipeline reads from users: YAML (params.yaml, sources.yaml) with duplicate keys and aliases
refused, and JSON (figures, metrics) with duplicate keys refused and each number checked
finite and in range where it is used (`number`, which names the file and the key).
Standard library and PyYAML only.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

from pipeline.core.errors import DataError, InputError, reason

MiB = 1 << 20
TEXT_CAP = 1 * MiB  # params.yaml, sources.yaml, a figures or metrics JSON: a few KiB in practice


class UnsafeFileError(InputError):
    """Not a regular file inside its folder, or larger than the reader's cap."""


_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is ('a folder', 'a FIFO (named pipe)', ...)."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def check_inside(path: Path, folder: Path) -> None:
    """Refuse `path` when it (through links) resolves outside `folder`."""
    real, base = Path(path).resolve(), Path(folder).resolve()
    if real != base and base not in real.parents:
        raise UnsafeFileError(
            f"{path}: a link to {real}, outside {base}; a stage reads only the files in "
            f"its input folder (replace the link with a copy of the file)"
        )


_OPEN = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)


def _checked_fd(path: Path, flags: int) -> tuple[int, os.stat_result]:
    """`path` opened with `flags` (O_NONBLOCK among them: should it be a FIFO, opening it does
    not wait for a writer) as a descriptor and its fstat, refused unless a regular file (by
    the descriptor's own fstat: what was opened, not what a name pointed to earlier)."""
    fd = os.open(path, flags)
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise UnsafeFileError(f"{path}: {file_kind(status.st_mode)}, not a regular file; expected a file here")
    except BaseException:
        os.close(fd)
        raise
    return fd, status


def _as_file(fd: int) -> BinaryIO:
    try:
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def open_regular(path: Path, within: Path | None = None) -> BinaryIO:
    """`path` opened for binary reading if it is a regular file (and, given `within`, one that
    resolves inside that folder). FileNotFoundError passes through for callers to word."""
    path = Path(path)
    if within is not None:
        check_inside(path, within)
    mode = os.stat(path).st_mode  # follows links: what would be opened
    if not stat.S_ISREG(mode):
        raise UnsafeFileError(f"{path}: {file_kind(mode)}, not a regular file; expected a file here")
    return _as_file(_checked_fd(path, _OPEN)[0])  # (checked again: it may have changed since the stat)


def plain_descriptor(path: Path) -> tuple[int, os.stat_result]:
    """A read-only descriptor of `path` and its fstat if it is itself a regular file: not a
    link (O_NOFOLLOW: a name listed inside a folder then cannot lead out of it, and no
    resolving of the whole path per file), FIFO, socket or device; the caller closes it. For
    memory-mapping many files (a split's shards), where a file object per file is overhead.
    FileNotFoundError passes through."""
    try:
        return _checked_fd(path, _OPEN | os.O_NOFOLLOW)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise UnsafeFileError(f"{path}: a link, not a plain file") from None
        raise


def too_large(path: Path, size: int, cap: int, what: str) -> UnsafeFileError:
    return UnsafeFileError(
        f"{path}: {size:,} bytes or more, larger than any {what} can be "
        f"(at most {cap:,} bytes); a wrong or damaged file?"
    )


def read_capped(path: Path, cap: int, what: str = "file of its kind", within: Path | None = None) -> bytes:
    """The whole of a regular file of at most `cap` bytes, or UnsafeFileError; reads at most
    cap + 1 bytes whatever the file claims or does."""
    with open_regular(path, within) as f:
        size = os.fstat(f.fileno()).st_size
        if size > cap:
            raise too_large(path, size, cap, what)
        data = f.read(cap + 1)
    if len(data) > cap:
        raise too_large(path, len(data), cap, what)
    return data


def read_text(path: Path, cap: int = TEXT_CAP, what: str = "file of its kind", within: Path | None = None) -> str:
    """A UTF-8 text file of at most `cap` bytes; bytes that are not UTF-8 are named by offset."""
    data = read_capped(path, cap, what, within)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start:,})") from None


def short(value: Any, limit: int = 60) -> str:
    """repr(value) cut to `limit` characters, without building the whole repr of a huge value."""
    import reprlib

    shortener = reprlib.Repr()
    shortener.maxstring = shortener.maxother = shortener.maxlong = limit
    shortener.maxlist = shortener.maxdict = shortener.maxtuple = shortener.maxset = 6
    shortener.maxlevel = 3
    return shortener.repr(value)[:limit]


# ---------------------------------------------------------------- YAML


def _yaml_loader():
    import yaml

    class StrictLoader(yaml.SafeLoader):
        """SafeLoader that refuses aliases (`*name`: nine levels of them make a value of
        billions of items from a few hundred bytes) and a key given twice in one mapping
        (PyYAML keeps the last in silence)."""

        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise yaml.composer.ComposerError(
                    None, None, f"alias *{event.anchor} is not allowed here (write the value out)", event.start_mark
                )
            return super().compose_node(parent, index)

        def construct_mapping(self, node, deep=False):
            if isinstance(node, yaml.MappingNode):
                seen = set()
                for key_node, _ in node.value:
                    key = self.construct_object(key_node, deep=True)
                    try:
                        duplicate = key in seen
                    except TypeError:  # unhashable: SafeConstructor says so below
                        continue
                    if duplicate:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"key {short(key, 40)} is given twice", key_node.start_mark
                        )
                    seen.add(key)
            return super().construct_mapping(node, deep)

    return StrictLoader


def load_yaml(path: Path, cap: int = TEXT_CAP, what: str = "YAML file", error: type[InputError] = InputError) -> Any:
    """A YAML file read strictly: at most `cap` bytes of UTF-8, no alias, no key twice; any
    problem, a missing file included, is one `error` naming the file (line and column)."""
    import yaml

    try:
        text = read_text(path, cap, what)
    except FileNotFoundError:
        raise error(f"{path}: no such {what}") from None
    except InputError as err:
        raise error(str(err)) from None
    try:
        return yaml.load(text, Loader=_yaml_loader())  # a SafeLoader, stricter
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise error(f"{path}: not valid YAML: {err.problem or err.context}{where}") from None
    except yaml.YAMLError as err:
        raise error(f"{path}: not valid YAML: {str(err).splitlines()[0] if str(err) else type(err).__name__}") from None
    except RecursionError:
        raise error(f"{path}: not valid YAML: nested too deeply") from None


# ---------------------------------------------------------------- JSON


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {short(key, 40)} is given twice")
        out[key] = value
    return out


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number JSON allows")


def parse_json(data: bytes | str, source: Path | str, finite: bool = False, expected: str = "valid JSON") -> Any:
    """JSON with no key given twice; any problem is one InputError naming the source and
    saying it is not `expected` (what the caller reads, e.g. "a readable safetensors
    header"). NaN and Infinity parse, as Python writes them (`number` refuses them naming
    their key), unless `finite` refuses them here. Bytes are read as UTF-8, as RFC 8259 asks
    (json.loads would guess UTF-16 or UTF-32 from them)."""
    try:
        if isinstance(data, bytes):
            data = data.decode()
        if finite:
            return json.loads(data, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
        return json.loads(data, object_pairs_hook=_no_duplicates)
    except RecursionError:
        raise InputError(f"{source}: not {expected} (nested too deeply)") from None
    except ValueError as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise InputError(f"{source}: not {expected} ({reason(err)})") from None


def read_json(
    path: Path, cap: int = TEXT_CAP, what: str = "JSON file", within: Path | None = None, finite: bool = False
) -> Any:
    """`parse_json` of a regular file read with a byte cap (`read_capped`)."""
    return parse_json(read_capped(path, cap, what, within), path, finite)


def number(source: Path | str, key: str, value: Any, low: float, high: float, integer: bool = False) -> float:
    """`value` if it is a finite number (an integer when asked) within low..high; else a
    DataError naming the file and the key."""
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind):
        raise DataError(f"{source}: {key}: expected {'an integer' if integer else 'a number'}, got {short(value)}")
    if not math.isfinite(value) or not low <= value <= high:
        raise DataError(f"{source}: {key}: {short(value)} is outside {low:g}..{high:g}")
    return value
