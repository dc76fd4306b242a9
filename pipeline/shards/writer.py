"""Writing shards: one writer, fed samples in batches of any size, memory bounded by one
shard whatever the size of the split.

Every batch is checked against the sample schema and converted to each field's declared
dtype before anything is buffered (a value that does not fit is refused with its field and
sample index), so the bytes never depend on how the caller batches. Several processes may
each write a part of a split (`write_part`, or `ShardWriter` given `first_sample`) and
`merge_parts` joins them: the same bytes as one writer's (docs/shards.md, "Several writers,
one split").
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import json
import math
import numbers
import os
import re
import shutil
import sys
import tempfile
import time
import weakref
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.atomic import BusyError, atomic_dir, locked
from pipeline.core.bounded import read_json
from pipeline.core.errors import InputError, SystemFailure, is_slug, reason, system_failure
from pipeline.shards.format import (
    CODECS,
    DATA_ALIGN,
    DTYPES,
    INTEGER,
    MANIFEST_TMP,
    MAX_MANIFEST,
    Field,
    Sample,
    ShardError,
    block_bytes,
    check_manifest,
    new_manifest,
    parse_fields,
    read_manifest,
    shard_file,
    write_manifest,
    zstd,
)

# safetensors' `Dtype` enum order: it lays tensors out by dtype, later in this order first, then
# by name. tests/test_shardwriter.py checks `safetensors_parts` against the library itself.
SAFETENSORS_ORDER = ("BOOL", "U8", "I8", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "F64", "I64", "U64")


def _layout(columns: Mapping[str, np.ndarray]) -> tuple[dict, list[memoryview]]:
    """A safetensors file's tensor entries and data buffers, in file order: tensors laid out
    by dtype, later in `SAFETENSORS_ORDER` first, then by name, as the library does."""
    arrays = {name: np.ascontiguousarray(values) for name, values in columns.items()}
    order = sorted(arrays, key=lambda name: (-SAFETENSORS_ORDER.index(DTYPES[arrays[name].dtype.name]), name))
    header, offset = {}, 0
    for name in order:
        nbytes = arrays[name].nbytes
        header[name] = {
            "dtype": DTYPES[arrays[name].dtype.name],
            "shape": list(arrays[name].shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    return header, [memoryview(arrays[name].reshape(-1)).cast("B") for name in order]


def _header(tensors: dict, metadata: dict[str, str] | None, align: int = 8) -> memoryview:
    """The 8-byte little-endian length, then the JSON (`__metadata__` first) padded with
    spaces so that the data area starts at a multiple of `align` (8, as safetensors does)."""
    text = json.dumps({"__metadata__": metadata, **tensors} if metadata else tensors, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % align)
    return memoryview(len(text).to_bytes(8, "little") + text)


def safetensors_parts(columns: Mapping[str, np.ndarray]) -> list[memoryview]:
    """An uncompressed shard as the buffers of its safetensors file, in file order: the header,
    then each column's bytes, in place. Exactly what `safetensors.numpy.save` returns, without
    its copies: it joins every tensor into one new bytes object, which took about half of an
    uncompressed write (`benchmarks/peers.py`, write-none)."""
    tensors, data = _layout(columns)
    return [_header(tensors, None), *data]


def placed_file(first_sample: int, samples_per_shard: int, index: int, codec: str) -> str:
    """The file of the `index`-th shard written from sample `first_sample` on: numbered by its
    place in the split, so parts written apart merge into the names one writer gives."""
    return shard_file(first_sample // samples_per_shard + index, codec)


def shard_parts(
    columns: Mapping[str, np.ndarray], compression: str, level: int, block: int | None = None
) -> list[memoryview]:
    """One shard's file as buffers in file order: the columns as safetensors tensors (named
    by field), uncompressed with the xxh3-64 of every `block` bytes of the data area listed
    in the header (`__metadata__.xxh3_64_blocks`), or zstd (one frame that states its size)."""
    if compression == "none":
        if not block:
            return safetensors_parts(columns)
        tensors, data = _layout(columns)
        return [_header(tensors, {"xxh3_64_blocks": block_digests(data, block)}, DATA_ALIGN), *data]
    if compression == "zstd":
        return [memoryview(zstd().ZstdCompressor(level=level).compress(b"".join(safetensors_parts(columns))))]
    raise ShardError(f"shard compression must be one of {CODECS}, got {compression!r:.40}")


def shard_bytes(columns: Mapping[str, np.ndarray], compression: str, level: int, block: int | None = None) -> bytes:
    """One shard's file as one bytes object (`shard_parts` joined)."""
    return b"".join(shard_parts(columns, compression, level, block))


def block_digests(parts: list[memoryview], block: int) -> str:
    """The xxh3-64 digest of every `block` bytes of what `parts` make (the last block may be
    short), as one hex string: what a reader checks a batch's blocks against. A block inside
    one part is hashed in one call; only a block that spans parts goes through a streaming
    hasher (a streaming hasher for every block cost a tenth of an uncompressed write)."""
    from xxhash import xxh3_64, xxh3_64_digest

    digests: list[bytes] = []
    spanning, room = None, 0  # the hasher of a block begun in an earlier part, and what it still wants
    for part in parts:
        start = 0
        if spanning is not None:
            start = min(room, part.nbytes)
            spanning.update(part[:start])
            room -= start
            if room:
                continue
            digests.append(spanning.digest())
            spanning = None
        whole = (part.nbytes - start) // block
        digests += [xxh3_64_digest(part[at : at + block]) for at in range(start, start + whole * block, block)]
        start += whole * block
        if start < part.nbytes:
            spanning, room = xxh3_64(part[start:]), block - (part.nbytes - start)
    if spanning is not None:
        digests.append(spanning.digest())
    return b"".join(digests).hex()


def shard_entry(name: str, count: int, parts: list[memoryview], sha256: str, xxh3_128: str, block: int | None) -> dict:
    """A shard's manifest entry: its file, samples, size, digests (and the header's xxh3-64
    when the header lists block digests)."""
    import xxhash

    entry = {
        "file": name,
        "count": count,
        "bytes": sum(part.nbytes for part in parts),
        "sha256": sha256,
        "xxh3_128": xxh3_128,
    }
    if block:
        entry["header_xxh3_64"] = xxhash.xxh3_64_hexdigest(parts[0])
    return entry


def _misfit(field: Field, array: np.ndarray) -> np.ndarray | None:
    """Where `array` holds values `field.dtype` cannot hold exactly (integers: out of range
    or not whole; bool: not 0/1; floats: finite values that overflow to inf), as a boolean
    mask of its shape, or None when every value fits by its dtype alone."""
    target = np.dtype(field.dtype)
    kind = array.dtype.kind
    if kind not in "biuf":
        return np.ones(array.shape, bool)  # strings, objects, complex: nothing fits
    if field.dtype == "bool":
        return None if kind == "b" else (array != 0) & (array != 1)
    if field.dtype in INTEGER:
        if kind == "b" or kind in "iu" and np.can_cast(array.dtype, target):
            return None
        info = np.iinfo(target)
        if kind in "iu":  # integer against integer: exact
            return (array < info.min) | (array > info.max)
        # a float against the powers of two that bound the integer type (exact in floating point)
        top = 2.0 ** (info.bits - 1 if info.min else info.bits)  # int64: 2**63, uint8: 256
        with np.errstate(invalid="ignore"):
            return ~np.isfinite(array) | (array != np.trunc(array)) | (array < info.min) | (array >= top)
    if kind == "f" and array.dtype.itemsize > target.itemsize:  # float narrowing: rounds, must not overflow
        with np.errstate(over="ignore"):
            return np.isfinite(array) & ~np.isfinite(array.astype(target))
    if kind in "iu":  # integer -> float: only the integers the float type holds exactly
        return _inexact_integers(array, target)
    return None


def _float_bits(target: np.dtype) -> tuple[int, int]:
    """(significand bits, largest finite value as an integer) of a float dtype: an integer is
    held exactly when its odd part has at most that many bits and it is at most that value."""
    info = np.finfo(target)
    return info.nmant + 1, int(info.max)


def _inexact_integers(array: np.ndarray, target: np.dtype) -> np.ndarray | None:
    """Where an integer array holds values the float dtype `target` would round (16,777,217
    in float32, 2**53 + 1 in float64) or overflow (65,520 in float16), as a mask; None when
    its dtype's every value is exact there (int16 in float32, int32 in float64). Integer
    arithmetic throughout: a float comparison would round the very values it checks."""
    bits, top = _float_bits(target)
    signed = array.dtype.kind == "i"
    if array.dtype.itemsize * 8 - signed <= bits:
        return None
    if signed:
        wide = array.astype(np.int64)
        magnitude = wide.view(np.uint64).copy()
        negative = wide < 0
        magnitude[negative] = ~magnitude[negative] + np.uint64(1)  # two's complement: |-2**63| is 2**63
    else:
        magnitude = array.astype(np.uint64)
    lowest = magnitude & (~magnitude + np.uint64(1))  # the lowest set bit (0 for 0)
    odd = magnitude // np.where(lowest == 0, np.uint64(1), lowest)
    inexact = odd >= np.uint64(1 << bits)
    if top < 1 << 64:
        inexact |= magnitude > np.uint64(top)
    return inexact


def _exact_integer(value: int, dtype: str) -> bool:
    """Whether the field dtype `dtype` holds the Python integer `value` exactly."""
    if dtype == "bool":
        return value in (0, 1)
    if dtype in INTEGER:
        info = np.iinfo(np.dtype(dtype))
        return info.min <= value <= info.max
    bits, top = _float_bits(np.dtype(dtype))
    magnitude = abs(value)
    return magnitude <= top and (magnitude >> max(0, (magnitude & -magnitude).bit_length() - 1)) < 1 << bits


def _shown(value) -> str:
    """A value as an error message quotes it: a numpy scalar as its Python value, cut short."""
    value = value.item() if isinstance(value, np.generic) else value
    return f"{value!r:.40}"


def _as_array(field: Field, values, where: str, first_id: int) -> np.ndarray:
    """`values` as a numpy array of numbers: a torch tensor of a dtype numpy lacks (bfloat16,
    ...) refused naming the field; an object array (a mixed pandas frame's `.values`) of
    numbers given its numbers' dtype, of anything else refused naming the field, the value
    and its sample. A list numpy makes floats of is read as an object array, so that an
    integer in it is held exactly or refused, never rounded on the way."""
    try:
        array = np.asarray(values)
        listed = (
            np.asarray(values, dtype=object) if isinstance(values, list | tuple) and array.dtype.kind == "f" else None
        )
    except (TypeError, ValueError, RuntimeError) as err:
        kind = getattr(values, "dtype", type(values).__name__)
        raise ShardError(
            f"{where}: field {field.name!r}: {kind} values cannot be written as {field.dtype} "
            f"({reason(err)}); convert them to {field.dtype} first"
        ) from None
    if listed is not None:
        return _from_objects(field, listed, where, first_id, "list", bools=True)
    if array.dtype != object:
        return array
    return _from_objects(field, array, where, first_id, "object", bools=False)


def _from_objects(field: Field, array: np.ndarray, where: str, first_id: int, given: str, bools: bool) -> np.ndarray:
    """An object array of numbers as a numeric array that holds each exactly: integers as
    integers (into a float field only those the float type holds exactly), other numbers as
    float64 (into an integer field only whole ones). Anything else, or a value the field
    cannot hold, is refused naming the field, the value and its sample; bools are numbers
    only where `bools` says so (a list), not in an object array."""
    flat = array.reshape(-1).tolist()
    per_sample = max(1, math.prod(array.shape[1:]))

    def refuse(at: int, problem: str, kind: str = "") -> ShardError:
        return ShardError(
            f"{where}: field {field.name!r}: value {_shown(flat[at])}{kind} at sample "
            f"{first_id + at // per_sample} {problem}"
        )

    for at, value in enumerate(flat):
        if isinstance(value, bool | np.bool_) and not bools or not isinstance(value, numbers.Real | np.bool_):
            raise refuse(at, "is not a number", f" ({type(value).__name__})")
    whole = field.dtype == "bool" or field.dtype in INTEGER
    converted = []
    for at, value in enumerate(flat):
        if isinstance(value, numbers.Integral | np.bool_):
            value = int(value)
            if not _exact_integer(value, field.dtype):
                raise refuse(at, f"does not fit {field.dtype} ({given} given)")
        elif whole:  # a fraction, NaN or inf for an integer field
            number = float(value)
            if not math.isfinite(number) or number != math.trunc(number):
                raise refuse(at, f"does not fit {field.dtype} ({given} given)")
            value = int(number)
            if not _exact_integer(value, field.dtype):
                raise refuse(at, f"does not fit {field.dtype} ({given} given)")
        else:
            value = float(value)
        converted.append(value)
    if whole or all(type(value) is int for value in converted):
        if not whole:  # integers, each exact in the float field: as float64 (exact too)
            return np.asarray(converted, dtype=np.float64).reshape(array.shape)
        numeric = np.asarray(converted)  # int64, or uint64 for values past int64's
        return numeric.reshape(array.shape)
    return np.asarray(converted, dtype=np.float64).reshape(array.shape)


def fit(field: Field, values, where: str, first_id: int) -> np.ndarray:
    """`values` (array-like, [b, *field.shape]) as a C-contiguous array of the field's dtype,
    or a ShardError naming `where`, the field, the first value that does not fit and its
    sample (index `first_id` + i)."""
    array = _as_array(field, values, where, first_id)
    if array.ndim == 0 or array.shape[1:] != field.shape:
        wanted = ", ".join(["n", *map(str, field.shape)])
        raise ShardError(f"{where}: field {field.name!r}: expected shape [{wanted}], got {list(array.shape)}")
    bad = _misfit(field, array)
    if bad is not None and bad.any():
        flat = bad.reshape(-1).nonzero()[0][0]
        sample = int(flat // max(1, math.prod(field.shape)))
        raise ShardError(
            f"{where}: field {field.name!r}: value {_shown(array.reshape(-1)[flat])} at sample "
            f"{first_id + sample} does not fit {field.dtype} ({array.dtype} given)"
        )
    converted = np.ascontiguousarray(array, dtype=field.dtype)
    field.check_classes(converted, where, first_id)
    return converted


def _hex_digest(hasher, parts: list[memoryview]) -> str:
    for part in parts:
        hasher.update(part)
    return hasher.hexdigest()


def check_names(dataset: str, split: str) -> None:
    """`dataset` and `split` are plain slugs, as the CLI asks of data set names: they become
    folder names and manifest entries, so `../x`, `a/b` or a newline never reach either."""
    for key, value in (("dataset", dataset), ("split", split)):
        if not is_slug(value):
            raise ShardError(
                f"{key} {value!r:.60} is not a plain name (a-z and 0-9 first, then also '-' and '_', "
                f"at most 64 characters)"
            )


class ShardBusyError(ShardError, BusyError):
    """Another writer (or merge) holds the folder, or the part, right now: one line naming it
    and its lock. A `pipeline.core.atomic.BusyError` too."""


class ShardSystemError(ShardError, SystemFailure):
    """The operating system refused a write (disk full, file too large, read-only, no
    permission): one line naming the path and what to do; nothing published changed. A
    `pipeline.core.errors.SystemFailure` too."""


@contextlib.contextmanager
def _shard_errors(where: Path, temporary: Path | None = None) -> Iterator[None]:
    """What the writer's locks, folders and files raise, as the library's errors: a busy lock
    as a ShardBusyError, a disk-full or permission error as a ShardSystemError naming the
    path (`where` when it names none), a folder not the library's to replace as a ShardError,
    any other OS error as a ShardError naming its file. A path inside `temporary` (a whole
    split's new folder) is named as the same path in `where`, the folder the caller gave."""

    def named(message: str) -> str:
        return message.replace(str(temporary), str(where)) if temporary is not None else message

    try:
        yield
    except ShardError:
        raise
    except BusyError as err:
        raise ShardBusyError(str(err)) from None
    except SystemFailure as err:
        raise ShardSystemError(named(str(err))) from None
    except InputError as err:  # atomic_dir's check: a file, or a folder of someone else's
        raise ShardError(str(err)) from None
    except OSError as err:
        path = getattr(err, "filename", None) or where
        failure = system_failure(err, path)
        if failure is not None:
            raise ShardSystemError(named(str(failure))) from None
        raise ShardError(named(f"{path}: {err.strerror or reason(err)}")) from None


ZSTD_LEVELS = (-(1 << 17), 22)  # zstd's levels: negative ones faster, 1..22 smaller (0: its default, 3)


def _check_arguments(folder, sample, samples_per_shard, compression, level, origin, first_sample, total) -> None:
    """A writer's arguments, each refused in one line naming it, before any folder is touched."""
    if not isinstance(folder, str | os.PathLike):
        raise ShardError(f"folder must be a path (str or pathlib.Path), got {type(folder).__name__}")
    if not isinstance(sample, Sample):
        raise ShardError(f"sample must be a Sample of Fields (pipeline.shards.Sample), got {type(sample).__name__}")
    if type(samples_per_shard) is not int or samples_per_shard < 1:
        raise ShardError(f"samples_per_shard must be at least 1 (an integer), got {samples_per_shard!r:.40}")
    if first_sample is not None and (
        type(first_sample) is not int or first_sample < 0 or first_sample % samples_per_shard
    ):
        raise ShardError(
            f"first_sample must be a multiple of samples_per_shard ({samples_per_shard}), got {first_sample!r:.40}"
        )
    if total is not None and (type(total) is not int or total < 1 or first_sample is None or first_sample >= total):
        raise ShardError(
            f"total must be the split's sample count (1 or more: an empty split is write_split's), past "
            f"first_sample, and only for a part (first_sample {first_sample!r:.40}), got {total!r:.40}"
        )
    if not isinstance(compression, str) or compression not in CODECS:
        raise ShardError(f"shard compression must be one of {CODECS}, got {compression!r:.40}")
    low, high = ZSTD_LEVELS
    if isinstance(level, bool) or not isinstance(level, numbers.Integral) or not low <= level <= high:
        raise ShardError(f"level must be a zstd level, an integer in {low}..{high}, got {level!r:.40}")
    if origin is not None and not isinstance(origin, str):
        raise ShardError(f"origin must be a string (what error messages name), got {type(origin).__name__}")


def _checked_source(source) -> dict:
    """`source` (what the manifest records of where the split came from): a dict that JSON
    holds as it is, or None ({}); anything else refused in one line naming it."""
    if source is None:
        return {}
    if not isinstance(source, dict):
        raise ShardError(f"source must be a dict (recorded in manifest.json), got {type(source).__name__}")
    try:
        json.dumps(source, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise ShardError(
            f"source must hold only what JSON holds (it is recorded in manifest.json): {reason(err)}"
        ) from None
    return source


_UNFINISHED: weakref.WeakSet = weakref.WeakSet()  # writers neither finished nor aborted yet


@atexit.register
def _abort_unfinished() -> None:
    """At interpreter exit, abort every writer left unfinished (nothing it wrote is published),
    while imports still work: left to `__del__` during the interpreter's teardown, the abort
    would print "Exception ignored ... ImportError: sys.meta_path is None"."""
    for writer in list(_UNFINISHED):
        with contextlib.suppress(Exception):
            writer.abort()


def published(folder: Path) -> set[str]:
    """The shard files the folder's manifest.json lists now (none without one): files a
    reader may hold open, which no writer replaces."""
    try:
        manifest = read_json(Path(folder) / "manifest.json", MAX_MANIFEST, "manifest", within=Path(folder))
    except (OSError, InputError):
        return set()
    shards = manifest.get("shards") if isinstance(manifest, dict) else None
    return {entry["file"] for entry in shards or [] if isinstance(entry, dict) and isinstance(entry.get("file"), str)}


class ShardWriter:
    """Samples in (any batch sizes), numbered shards out into `folder`; `finish` writes the
    manifest. Values that do not fit the sample schema are refused here, so no feeder can
    write them.

    A whole split (no `first_sample`) is written into a new folder beside `folder`, holding
    `folder`'s lock (as `write_split` does), and swapped in whole by `finish`: a reader of the
    old split keeps the files it opened, a second writer is refused in one line, and nothing
    published is rewritten in place. A part (`first_sample`) writes each shard to a temporary
    file and renames it into `folder`, refusing a name the folder's manifest lists; `total`,
    the split's sample count, goes into the part's record so that `merge_parts` can tell a
    missing part. Use it as a context manager, or call `finish` (or `abort`); a writer still
    open when the interpreter exits is aborted then, without a word.

    Every error it raises is a ShardError: a busy folder or part a ShardBusyError, a write
    the operating system refuses a ShardSystemError naming the folder given."""

    def __init__(
        self,
        folder: Path,
        *,
        sample: Sample,
        dataset: str,
        split: str,
        samples_per_shard: int,
        compression: str = "none",
        level: int = 3,
        origin: str | None = None,
        first_sample: int | None = None,
        total: int | None = None,
    ) -> None:
        _check_arguments(folder, sample, samples_per_shard, compression, level, origin, first_sample, total)
        check_names(dataset, split)
        self.first_sample, self.total = first_sample, total  # first_sample None: the whole split
        self.dataset, self.split = dataset, split
        self.origin = origin or f"{dataset}/{split}"  # what error messages name
        self.size, self.compression, self.level = samples_per_shard, compression, int(level)
        self.block = block_bytes(compression, samples_per_shard * sample.row_bytes)
        self.sample = sample
        self.buffers: dict[str, np.ndarray] = {}  # allocated on the first partial shard
        self.filled = 0
        self.count = 0
        self.entries: list[dict] = []
        self.target = Path(folder)
        self._stack = contextlib.ExitStack()
        try:
            with _shard_errors(self.target):
                if first_sample is None:
                    check_replaceable(self.target)  # (atomic_dir refuses a folder without a manifest)
                    self.folder = self._stack.enter_context(
                        atomic_dir(self.target, marker="manifest.json", owns=is_split_folder)
                    )
                    self.published: set[str] = set()
                else:
                    self.folder = self.target
                    (self.folder / PARTS_DIR).mkdir(parents=True, exist_ok=True)
                    self._stack.enter_context(parts_held(self.folder, exclusive=False))  # never beside a merge
                    self._stack.enter_context(locked(self.folder / PARTS_DIR / self._key))  # one writer per part
                    self.published = published(self.folder)
                    # An earlier run of this part leaves its record; its shards are about to be replaced,
                    # so the record goes first: a merge never pairs it with this run's files.
                    (self.folder / PARTS_DIR / f"{self._key}.json").unlink(missing_ok=True)
        except BaseException:
            self._stack.close()  # a lock taken before the refusal is let go now, not when collected
            raise
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="shard-sha256")
        _UNFINISHED.add(self)

    def _errors(self):
        """`_shard_errors` for this writer: its paths named as the folder the caller gave."""
        return _shard_errors(self.target, self.folder if self.folder != self.target else None)

    @property
    def _key(self) -> str:
        return f"{self.first_sample:012d}"

    def _open(self, name: str) -> tuple[object, Path]:
        """(file, its path) to write shard `name` to: the file itself in a whole split's new
        folder; a part's temporary, renamed into place once complete."""
        if self.first_sample is None:
            path = self.folder / name
            return open(path, "wb"), path
        if name in self.published:
            raise ShardError(
                f"{self.folder / name}: listed in {self.folder / 'manifest.json'}; a published shard is "
                f"never rewritten (write the parts into a new folder, or remove the old split first)"
            )
        fd, tmp = tempfile.mkstemp(prefix=f".{self._key}.", suffix=".tmp", dir=self.folder / PARTS_DIR)
        return os.fdopen(fd, "wb"), Path(tmp)

    def _write(self, columns: dict[str, np.ndarray]) -> None:
        """Write one shard from its buffers in place (`shard_parts`, which lists the digest of
        each block in the header), hashing them with sha256 on a thread while this one writes
        them and hashes them with xxh3 (hashlib releases the GIL: sha256 alone took as long
        as the rest of the write). Nothing is left running when this returns, so an error
        later never races a write into a folder being removed, and the buffers may be
        refilled."""
        import xxhash  # the writer runs where the project is installed

        parts = shard_parts(columns, self.compression, self.level, self.block)
        name = placed_file(self.first_sample or 0, self.size, len(self.entries), self.compression)
        sha256 = self.pool.submit(_hex_digest, hashlib.sha256(), parts)
        try:
            file, path = self._open(name)
            try:
                with file:  # (parts larger than its buffer go straight through)
                    for part in parts:
                        file.write(part)
                if path.name != name:  # a part's shard: complete before it has its name
                    os.replace(path, self.folder / name)
            finally:
                if path.name != name:
                    path.unlink(missing_ok=True)
            xxh3 = _hex_digest(xxhash.xxh3_128(), parts)
        finally:
            digest = sha256.result()
        self.entries.append(shard_entry(name, len(next(iter(columns.values()))), parts, digest, xxh3, self.block))

    def _flush(self) -> None:
        if self.filled:
            self._write({name: buffer[: self.filled] for name, buffer in self.buffers.items()})
            self.filled = 0

    def _checked(self, batch: Mapping[str, object]) -> dict[str, np.ndarray]:
        """The batch's columns converted to the schema, in field order; one length for all."""
        if not isinstance(batch, Mapping) or set(batch) != set(self.sample.names):
            given = sorted(batch) if isinstance(batch, Mapping) else type(batch).__name__
            raise ShardError(f"{self.origin}: a batch must map exactly the fields {self.sample.names}, got {given}")
        columns = {f.name: fit(f, batch[f.name], self.origin, self.count) for f in self.sample.fields}
        lengths = {name: len(values) for name, values in columns.items()}
        if len(set(lengths.values())) > 1:
            raise ShardError(f"{self.origin}: fields of one batch differ in length: {lengths}")
        return columns

    def add(self, batch: Mapping[str, object]) -> None:
        """A batch {field name: array-like [b, *field shape]}, b >= 0, every field given."""
        if self.pool is None:
            raise ShardError(f"{self.origin}: this writer is finished or aborted")
        columns = self._checked(batch)
        with self._errors():
            self._add(columns)

    def _add(self, columns: dict[str, np.ndarray]) -> None:
        n = len(next(iter(columns.values())))
        if self.total is not None and self.first_sample + self.count + n > self.total:
            raise ShardError(
                f"{self.origin}: the part from sample {self.first_sample:,} goes past the split's "
                f"total of {self.total:,} samples"
            )
        self.count += n
        while n:
            if self.filled == 0 and n >= self.size:  # a whole shard: no copy
                self._write({name: values[: self.size] for name, values in columns.items()})
                take = self.size
            else:
                if not self.buffers:
                    self.buffers = {f.name: np.empty((self.size, *f.shape), f.dtype) for f in self.sample.fields}
                take = min(self.size - self.filled, n)
                for name, values in columns.items():
                    self.buffers[name][self.filled : self.filled + take] = values[:take]
                self.filled += take
                if self.filled == self.size:
                    self._flush()
            columns = {name: values[take:] for name, values in columns.items()}
            n -= take

    def finish(self, source: dict | None = None) -> dict:
        """Write the last shard and the manifest (or, for a part, the part's record), then
        swap the new split in (a part: let its lock go)."""
        if self.pool is None:
            raise ShardError(f"{self.origin}: this writer is finished or aborted")
        with self._errors():
            return self._finish(source)

    def _finish(self, source: dict | None) -> dict:
        try:
            source = _checked_source(source)
            self._flush()
            self.pool.shutdown()
            manifest = new_manifest(
                sample=self.sample,
                dataset=self.dataset,
                split=self.split,
                count=self.count,
                codec=self.compression,
                level=self.level,
                source=source,
                shards=self.entries,
                block=self.block,
            )
            if self.first_sample is None:
                write_manifest(self.folder, manifest)
                check_replaceable(self.target)  # again, just before the swap: a file put in since is kept
            else:
                part = {**manifest, "first_sample": self.first_sample, "samples_per_shard": self.size}
                if self.total is not None:
                    part["total"] = self.total
                record = self.folder / PARTS_DIR / f"{self._key}.json"
                tmp = record.with_name(f".{self._key}.record.tmp")
                tmp.write_text(json.dumps(part, indent=2) + "\n")
                tmp.replace(record)
        except BaseException as err:
            self._close(err)
            raise
        self._close(None)
        return manifest

    def abort(self) -> None:
        """Stop without publishing anything: a whole split's new folder is removed, `folder`
        left as it was; a part leaves its complete shards and no record."""
        if self.pool is not None:
            with self._errors():
                self._close(ShardError(f"{self.origin}: aborted"))

    def _close(self, err: BaseException | None) -> None:
        pool, self.pool = self.pool, None
        if pool is None:
            return
        _UNFINISHED.discard(self)
        pool.shutdown()
        if err is None:
            self._stack.close()
        else:
            with contextlib.suppress(type(err)):
                self._stack.__exit__(type(err), err, err.__traceback__)

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, kind, err, trace) -> None:
        with self._errors():
            if err is not None:
                self._close(err)  # (a full disk comes back worded, naming the folder)
            else:
                self.abort()  # left without finish(): nothing published

    def __del__(self) -> None:
        """A writer dropped unfinished aborts (at interpreter exit `_abort_unfinished` has
        done so already; during the teardown after it, whatever is left is let go quietly)."""
        if getattr(self, "pool", None) is None:
            return
        try:
            self.abort()
        except Exception:
            if not sys.is_finalizing():
                raise


PARTS_DIR = ".parts"  # where parallel writers leave their records until `merge_parts`


def write_part(
    columns: Mapping[str, object], folder: Path, *, first_sample: int, total: int | None = None, **options: Any
) -> dict:
    """Write samples `first_sample`.. of a split ({field: array-like [n, *shape]}) into `folder`,
    beside the other writers' parts; `merge_parts` makes them one split. `options`: the
    `ShardWriter`'s keywords, as `write_split` takes them. `total`, the split's sample count,
    is recorded so that a part missing at the merge is named."""
    return _write_all(columns, folder, None, **options, first_sample=first_sample, total=total)


def _write_all(columns: Mapping[str, object], folder: Path, source: dict | None, **options) -> dict:
    """`columns` written whole by one ShardWriter (`options`: its arguments), its manifest returned."""
    with ShardWriter(folder, **options) as writer:
        writer.add(columns)
        return writer.finish(source)


def _read_part(record: Path, folder: Path) -> dict:
    """One part record: a manifest of the part's own shards, checked as any manifest is, with
    where the part starts, its shard size and the split's total. Records are files anyone
    may have edited, so a ShardError names the record and the key before any value is used."""
    try:
        part = read_json(record, MAX_MANIFEST, "part record", within=folder)
    except InputError as err:  # each names the record: too large, a link, not JSON
        raise ShardError(str(err)) from None
    except OSError as err:
        raise ShardError(f"{record}: not a readable part record ({err.strerror or reason(err)})") from None
    if not isinstance(part, dict):
        raise ShardError(f"{record}: not a part record (JSON {type(part).__name__}, not an object)")
    place = {key: part.pop(key, None) for key in ("first_sample", "samples_per_shard", "total")}
    for key, low in (("first_sample", 0), ("samples_per_shard", 1), ("total", 1)):
        if (key != "total" or place[key] is not None) and (type(place[key]) is not int or place[key] < low):
            raise ShardError(f"{record}: {key}: {place[key]!r:.40}, expected an integer of at least {low}")
    return {**check_manifest(part, record, place["first_sample"] // place["samples_per_shard"]), **place}


def _split_total(folder: Path, records: list[Path], parts: list[dict], total: int | None) -> int:
    """The split's sample count: the one the parts record (all alike) or the caller gives."""
    recorded = {part["total"] for part in parts if part["total"] is not None}
    if len(recorded | ({total} if total is not None else set())) > 1:
        said = {record.name: part["total"] for record, part in zip(records, parts)}
        raise ShardError(
            f"{folder / PARTS_DIR}: the parts disagree on the split's total: {said}"
            + (f", merge_parts was given {total:,}" if total is not None else "")
        )
    if total is None and not recorded:
        raise ShardError(
            f"{folder}: no part records the split's total and none was given; pass total= to "
            f"write_part (or to merge_parts), so that a missing part cannot pass for a shorter split"
        )
    return total if total is not None else recorded.pop()


def _stray(folder: Path, listed: set[str]) -> list[str]:
    """Shard files in `folder` that no part lists (a writer killed before its record, or left
    over from another split)."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("shard-") and p.name not in listed)


MERGE_WAIT_S = 300.0  # how long a merge waits for another merge of the same parts to end


def merge_parts(folder: Path, source: dict | None = None, *, total: int | None = None) -> dict:
    """One manifest for the parts written into `folder`: every part's schema and settings the
    same, parts tiling the split from sample 0 to its total (recorded by the parts, or
    `total`) with no gap or overlap, every part but the last a whole number of shards, each
    shard file the one its samples' place numbers and holding samples_per_shard samples (the
    split's last shard at most that), and no shard file in the folder that no part lists.
    Holding the parts alone and the folder's lock, writes manifest.json (replacing it
    atomically), then removes the parts' records and folder. A merge while a part is still
    being written is refused in one line (naming the part where it can), and no writer
    starts one under a merge. Of two merges at once, one merges; the other waits for it (at
    most MERGE_WAIT_S) and returns the manifest it wrote, or, where that merge failed,
    merges itself and meets the same problem. A ShardError names the first problem;
    nothing is written then."""
    if not isinstance(folder, str | os.PathLike):
        raise ShardError(f"folder must be a path (str or pathlib.Path), got {type(folder).__name__}")
    if total is not None and (type(total) is not int or total < 1):
        raise ShardError(f"total must be the split's sample count (an integer, 1 or more), got {total!r:.40}")
    folder, source = Path(folder), _checked_source(source)
    with _shard_errors(folder):
        hold, waited = _hold_parts(folder, MERGE_WAIT_S)
        if hold is None:  # no parts' folder: none written, or a merge took them away just now
            return _no_parts(folder, waited)
        try:
            with locked(folder), contextlib.ExitStack() as writers:
                for key in _part_keys(folder):  # (every writer holds the parts shared: none is left)
                    try:
                        writers.enter_context(locked(folder / PARTS_DIR / key))
                    except BusyError:
                        raise ShardBusyError(
                            f"{folder}: the part from sample {int(key):,} is being written right now; "
                            f"merge once every writer has finished"
                        ) from None
                manifest = _merge_records(folder, source, total, waited)
            _remove_parts(folder)  # (the records are gone already: once the folder's lock is let go)
            return manifest
        finally:
            os.close(hold)


def _hold_parts(folder: Path, wait: float) -> tuple[int | None, bool]:
    """Hold `folder`'s parts alone for a merge: (the descriptor holding PARTS_DIR/WRITERS
    exclusively, or None where there is no parts folder, none written or a merge just took
    it away; whether another merge held them while this one waited). Part writers hold the
    parts shared: the merge is refused, naming a part being written where one holds its
    own lock. Another merge holds them alone: this one waits for it, at most `wait` seconds."""
    lock = folder / PARTS_DIR / WRITERS
    deadline, waited = time.monotonic() + wait, False
    while True:
        try:
            fd = os.open(lock, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o644)
        except FileNotFoundError:
            return None, waited
        try:
            if _flocked(fd, fcntl.LOCK_EX) and _same_file(fd, lock):
                return fd, waited
            if _flocked(fd, fcntl.LOCK_SH):  # no merge holds them (or one just let go): writers, or none
                current = _same_file(fd, lock)
                fcntl.flock(fd, fcntl.LOCK_UN)
                if current and _flocked(fd, fcntl.LOCK_EX) and _same_file(fd, lock):
                    return fd, waited
                if current:
                    busy = _busy_part(folder)
                    raise ShardBusyError(
                        f"{folder}: "
                        + (f"the part from sample {int(busy):,} is" if busy else "a part is")
                        + " being written right now; merge once every writer has finished"
                    )
            elif time.monotonic() < deadline:  # another merge of these parts: wait for it to end
                waited = True
            else:
                raise ShardBusyError(
                    f"{folder}: another merge of its parts has held them for over {wait:g} s "
                    f"(lock {lock}); try again once it has ended"
                )
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
        time.sleep(0.01)


def _flocked(fd: int, kind: int) -> bool:
    """Whether `flock(kind)` on `fd` was granted now (never waits)."""
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _same_file(fd: int, path: Path) -> bool:
    """Whether `fd` is still the file at `path` (a lock file removed or replaced is no lock)."""
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def _busy_part(folder: Path) -> str | None:
    """The key of a part whose writer holds its lock now, or None (looked at, never taken)."""
    for key in _part_keys(folder):
        try:
            fd = os.open(folder / PARTS_DIR / f".{key}.lock", os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if not _flocked(fd, fcntl.LOCK_EX):
                return key
        finally:
            os.close(fd)
    return None


def _remove_parts(folder: Path) -> None:
    """Take the parts' folder away in one rename (beside `folder`, a temporary of its own that
    the next holder of its lock clears if this stops halfway), then remove it: no writer or
    merge opening a lock in it meanwhile can make the removal fail half done."""
    try:
        gone = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=folder.parent))
    except OSError:
        shutil.rmtree(folder / PARTS_DIR, ignore_errors=True)
        return
    try:
        os.replace(folder / PARTS_DIR, gone / PARTS_DIR)
    except OSError:  # gone already (a writer swapped the folder in), or another file system
        shutil.rmtree(folder / PARTS_DIR, ignore_errors=True)
    shutil.rmtree(gone, ignore_errors=True)


WRITERS = ".writers.lock"  # in PARTS_DIR: held shared by every part's writer, exclusively by a merge


@contextlib.contextmanager
def parts_held(folder: Path, exclusive: bool) -> Iterator[None]:
    """A hold on `folder`'s parts: shared by each part's writer (any number at once) and
    exclusive as a merge holds them, so a merge never runs beside a writer and no writer
    starts under a merge; either, when busy, is one line. The lock file goes with the parts'
    folder when a merge removes it; a hold taken on a file already removed counts as busy."""
    lock = Path(folder) / PARTS_DIR / WRITERS
    try:
        fd = os.open(lock, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o644)
    except FileNotFoundError:  # a merge took the parts' folder away just now
        fd = None
    if fd is None or not (_flocked(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) and _same_file(fd, lock)):
        if fd is not None:
            os.close(fd)
        raise (
            ShardBusyError(f"{folder}: a part is being written right now; merge once every writer has finished")
            if exclusive
            else ShardBusyError(f"{folder}: a merge of its parts is under way; write the part once it has finished")
        )
    try:
        yield
    finally:
        os.close(fd)


def _part_keys(folder: Path) -> list[str]:
    """The parts of `folder` on record or being written: each record's name and each held
    or left lock's (`.<key>.lock`), keys of 12 digits."""
    names = [p.name for p in (folder / PARTS_DIR).iterdir()] if (folder / PARTS_DIR).is_dir() else []
    keys = {n[:-5] for n in names if n.endswith(".json")} | {
        n[1:-5] for n in names if n.startswith(".") and n.endswith(".lock")
    }
    return sorted(k for k in keys if len(k) == 12 and k.isdigit())


def _merge_records(folder: Path, source: dict, total: int | None, waited: bool) -> dict:
    """The merge itself, under the parts' hold and the folder's lock (see `merge_parts`)."""
    records = sorted((folder / PARTS_DIR).glob("*.json"))  # none where there is no such folder
    if not records:
        return _no_parts(folder, waited)
    parts = [_read_part(record, folder) for record in records]
    total = _split_total(folder, records, parts, total)
    keys = ("dataset", "split", "fields", "compression", "block_bytes", "samples_per_shard")
    first = parts[0]
    expected, entries = 0, []
    for record, part in zip(records, parts):
        for key in keys:
            if part.get(key) != first.get(key):
                raise ShardError(
                    f"{record}: {key} {part.get(key)!r:.60} differs from the first part's {first.get(key)!r:.60}"
                )
        if part.get("first_sample") != expected:
            raise ShardError(
                f"{record}: starts at sample {part.get('first_sample')!r}, expected {expected} "
                f"(a part missing or overlapping)"
            )
        size = part["samples_per_shard"]
        if part is not parts[-1] and part["count"] % size:
            raise ShardError(
                f"{record}: {part['count']} samples is not a whole number of shards of "
                f"{size} (only the last part may end with a short shard)"
            )
        for index, entry in enumerate(part["shards"]):  # (each in its place: `_read_part` checked)
            want = entry["file"]
            last = part is parts[-1] and index == len(part["shards"]) - 1
            if entry["count"] > size or (entry["count"] < size and not last):
                raise ShardError(
                    f"{record}: {want} holds {entry['count']} samples, not {size} (every shard holds "
                    f"samples_per_shard, the split's last at most that)"
                )
        expected += part["count"]
        entries += part["shards"]
    stray = _stray(folder, {entry["file"] for entry in entries})
    if expected > total:
        raise ShardError(
            f"{folder}: the parts hold samples 0..{expected:,}, past the split's total of {total:,} "
            f"(parts of a larger split, or the wrong total)"
        )
    if expected != total:
        raise ShardError(
            f"{folder}: the parts hold samples 0..{expected:,} of the split's {total:,}: the part from "
            f"sample {expected:,} is missing (a writer that did not finish?)"
            + (f"; shard files no part lists: {', '.join(stray[:4])}" if stray else "")
        )
    if stray:
        raise ShardError(
            f"{folder}: shard files no part lists: {', '.join(stray[:4])}"
            f"{' ...' if len(stray) > 4 else ''} (a writer killed before its record, or another "
            f"split's); remove them or rerun that part"
        )
    compression = first["compression"]
    manifest = new_manifest(
        sample=parse_fields(first["fields"], records[0]),
        dataset=first["dataset"],
        split=first["split"],
        count=expected,
        codec=compression["codec"],
        level=compression["level"] if compression["codec"] == "zstd" else 3,
        source=source,
        shards=entries,
        block=first["block_bytes"],
    )
    check_manifest(json.loads(json.dumps(manifest)), folder / "manifest.json")
    write_manifest(folder, manifest)
    for record in records:  # merged: no later merge takes them again (the folder goes once the lock is let go)
        record.unlink()
    return manifest


def _no_parts(folder: Path, waited: bool) -> dict:
    """With no parts left to merge: the manifest of the merge this one waited for, or one line
    saying that another merge did it, or that there were no parts. (No lock needed: a manifest
    and a split are only ever replaced whole.)"""
    try:
        merged = read_manifest(folder)
    except ShardError:
        merged = None
    if merged is not None and waited:
        return merged
    if merged is not None:
        raise ShardError(
            f"{folder}: no parts to merge: another merge_parts merged them already (its "
            f"manifest.json holds the split, {merged['count']:,} samples)"
        )
    raise ShardError(f"{folder}: no parts to merge (expected {PARTS_DIR}/*.json written by write_part)")


_PARTS_FILES = re.compile(r"\d{12}\.json|\.\d{12}\.lock|\.\d{12}\.(record|[a-z0-9_]{8})\.tmp|" + re.escape(WRITERS))


def is_split_folder(folder: Path) -> bool:
    """A folder this library wrote, which `write_split` may replace: a manifest of the shard
    format, and nothing else but the plain files that manifest lists, the writer's manifest
    temporary and the parts' own folder (records, locks and temporaries only)."""
    manifest = _own_manifest(Path(folder))
    return manifest is not None and _stranger(Path(folder), manifest) is None


def _own_manifest(folder: Path) -> dict | None:
    """The folder's manifest.json where it is one of the shard format's (a plain file inside,
    a JSON object with an integer format_version and a list of shards), else None."""
    try:
        manifest = read_json(folder / "manifest.json", MAX_MANIFEST, "manifest", within=folder)
    except (OSError, InputError):  # none, a special file, a link out, not JSON
        return None
    if not (
        isinstance(manifest, dict)
        and isinstance(manifest.get("format_version"), int)
        and isinstance(manifest.get("shards"), list)
    ):
        return None
    return manifest


def _stranger(folder: Path, manifest: dict) -> str | None:
    """The first entry of `folder` that is not the split's own (`manifest.json`, a plain file
    the manifest lists, the writer's manifest temporary, the parts' folder holding only
    records, locks and temporaries), or None. `shard-notes.txt` is as much a stranger as
    `notes.txt`: only what the manifest names is ever removed."""
    listed = {entry.get("file") for entry in manifest["shards"] if isinstance(entry, dict)}
    for entry in sorted(os.scandir(folder), key=lambda entry: entry.name):
        if entry.name == PARTS_DIR and entry.is_dir(follow_symlinks=False):
            for part in sorted(os.scandir(entry.path), key=lambda part: part.name):
                if not (_PARTS_FILES.fullmatch(part.name) and part.is_file(follow_symlinks=False)):
                    return f"{PARTS_DIR}/{part.name}"
        elif not (entry.name in listed or entry.name in ("manifest.json", MANIFEST_TMP)) or not entry.is_file(
            follow_symlinks=False
        ):
            return entry.name
    return None


def check_replaceable(folder: Path) -> None:
    """A ShardError naming the entry when `folder` holds a split (a manifest of the format)
    beside files that split's manifest does not list: `write_split` never removes those."""
    folder = Path(folder)
    manifest = _own_manifest(folder) if folder.is_dir() and not folder.is_symlink() else None
    stranger = _stranger(folder, manifest) if manifest is not None else None
    if stranger is not None:
        raise ShardError(
            f"{folder}: holds {stranger!r:.80}, which its manifest.json does not list: a folder this "
            f"project did not write alone; refusing to replace it (only the files a split's manifest "
            f"lists are ever removed: move that one out, or choose another folder)"
        )


def write_split(columns: Mapping[str, object], out_dir: Path, *, source: dict | None = None, **options: Any) -> dict:
    """Write one split held in memory ({field name: array-like [n, *shape]}) as shards plus
    manifest.json into `out_dir` (replaced whole: on any error nothing is left behind).
    `options`: the `ShardWriter`'s keywords (sample, dataset, split and samples_per_shard;
    compression and level); `source`, what the split was made from, goes into the manifest."""
    if options.keys() & {"first_sample", "total"}:
        raise TypeError("write_split writes a whole split; a part is write_part's")
    _checked_source(source)
    return _write_all(columns, out_dir, source, **options)
