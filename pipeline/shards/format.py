"""What a shard folder is: the sample schema, the manifest's format, how a writer builds it,
and the checks a reader runs before opening anything it names.

A split is a few large safetensors files (one tensor per field of the declared sample; no
pickle, memory-mappable; DVC and file systems pay per file), optionally zstd-compressed,
listed in `manifest.json` with counts, sizes, sha256 and xxh3-128. Version 4 adds per-block
xxh3-64 digests in each file's own header, so a reader verifies only the blocks a batch
touches; versions 3 and 2 are still read (`read_manifest`). docs/shards.md says it whole.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.bounded import read_json
from pipeline.core.errors import InputError, is_hex

FORMAT_VERSION = 4
READ_VERSIONS = (2, 3, 4)  # what read_manifest accepts; 2 and 3 are upgraded in memory
BLOCK_BYTES = 1 << 14  # the verified unit of random access: a batch of 512 samples hashes ~8 MB at most
DATA_ALIGN = BLOCK_BYTES  # a block-verified shard's data area starts at a multiple of it (the header is
# padded with spaces): each block then covers whole pages, and where the map starts on a 64 KiB boundary (Linux
# puts maps of files of 2 MiB or more on 2 MiB ones) lies in one of the kernel's 64 KiB fault-around windows,
# so a batch pays one page fault per block it touches, not sometimes two
MAX_BLOCKS = 1 << 15  # block digests per shard: 512 KiB of hex in a header (larger shards: larger blocks)
CODECS = ("none", "zstd")

# numpy dtype name -> safetensors dtype code (little-endian, as safetensors stores them).
DTYPES = {
    "bool": "BOOL",
    "uint8": "U8",
    "int8": "I8",
    "uint16": "U16",
    "int16": "I16",
    "uint32": "U32",
    "int32": "I32",
    "uint64": "U64",
    "int64": "I64",
    "float16": "F16",
    "float32": "F32",
    "float64": "F64",
}
ITEMSIZE = {
    "bool": 1,
    "uint8": 1,
    "int8": 1,
    "uint16": 2,
    "int16": 2,
    "uint32": 4,
    "int32": 4,
    "uint64": 8,
    "int64": 8,
    "float16": 2,
    "float32": 4,
    "float64": 8,
}
INTEGER = {"uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64"}
MAX_FIELDS = 64  # fields in one sample
MAX_SAMPLE_BYTES = 1 << 30  # one sample, all fields: 1 GiB (a 16k x 16k RGBA image fits)
MAX_DIMS = 8
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")  # a Python identifier: a tensor name, a key, an argument


class ShardError(InputError):
    """A shard folder that does not match its manifest, data that do not match the sample
    schema, or an argument the library cannot take; the message, one line, names the file
    (or data set, or argument) and the check. Every error the library raises is one (a
    ValueError too), or one of the subclasses below."""


class ShardIndexError(ShardError, IndexError):
    """A sample index outside the split: an IndexError too, so that iterating over a dataset
    by its indices ends there."""


class ShardTypeError(ShardError, TypeError):
    """A sample index that is not an integer (a float, a bool, a string): a TypeError too, as
    Python's own sequences raise."""


@dataclass(frozen=True)
class Field:
    """One tensor of every sample: its name (the safetensors tensor name), numpy dtype name,
    shape of one sample (`()` for a scalar) and, for a class label, the number of classes
    (values 0..classes-1, checked on write and on read)."""

    name: str
    dtype: str
    shape: tuple[int, ...] = ()
    classes: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", dtype_name(self.dtype))
        problem = field_problem(self)
        if problem:
            raise ShardError(f"field {self.name!r:.80}: {problem}")

    @property
    def row_bytes(self) -> int:
        """Bytes one sample of this field takes in a shard."""
        return math.prod(self.shape) * ITEMSIZE[self.dtype]

    def to_json(self) -> dict:
        entry = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}
        if self.classes is not None:
            entry["classes"] = self.classes
        return entry

    def first_bad(self, values) -> int | None:
        """The index of the first sample whose value is outside 0..classes-1 (a numpy array
        or CPU tensor of this field), or None: the one class-label rule every reader and
        writer asks. Always None for a field without classes."""
        if self.classes is None or not len(values):
            return None
        array = values.numpy() if hasattr(values, "numpy") else values
        flat = array.reshape(len(array), -1)
        bad = ((flat >= self.classes) | (flat < 0)).any(axis=1).nonzero()[0]
        return int(bad[0]) if len(bad) else None

    def check_classes(self, values, where: str, first_id: int) -> None:
        """Raise a ShardError naming `where`, this field and the sample (its index in the
        split: `first_id` + position) when a value is outside the classes (`values`: a numpy
        array or CPU tensor, as for `first_bad`)."""
        index = self.first_bad(values)
        if index is not None:
            raise ShardError(
                f"{where}: field {self.name!r}: value {values[index].tolist()} "
                f"at sample {first_id + index} is outside 0..{self.classes - 1}"
            )


def dtype_name(dtype) -> object:
    """A dtype as its numpy name: a string as given; a numpy dtype or scalar type
    (`arr.dtype`, `np.float32`) or a torch dtype (`torch.float32`) by its name, so that a
    field can be declared from the data at hand. Anything else comes back unchanged, for
    `field_problem` to refuse."""
    if isinstance(dtype, str):
        return dtype
    if type(dtype).__module__ == "torch":  # torch.float32 -> "float32" (torch need not be imported here)
        return str(dtype).removeprefix("torch.")
    import numpy as np

    if isinstance(dtype, np.dtype | type):  # (a Python type too: float is float64, as numpy has it)
        try:
            return np.dtype(dtype).name
        except TypeError:
            return dtype
    return dtype


RESERVED = {"__metadata__"}  # safetensors' header key for its metadata: no tensor may take the name


def field_problem(field: Field) -> str | None:
    """What is wrong with a field's declaration, or None: the one rule for both a Field built
    in code and one read from a manifest."""
    if not isinstance(field.name, str) or not _NAME.fullmatch(field.name):
        return "the name must be a Python identifier of at most 64 characters"
    if field.name in RESERVED:
        return f"the name {field.name} is reserved by safetensors (its header's metadata); choose another"
    if not isinstance(field.dtype, str) or field.dtype not in DTYPES:
        return f"dtype {field.dtype!r:.30} is not one of {sorted(DTYPES)}"
    shape = field.shape
    if (
        not isinstance(shape, tuple)
        or len(shape) > MAX_DIMS
        or not all(isinstance(d, int) and not isinstance(d, bool) and 1 <= d <= MAX_SAMPLE_BYTES for d in shape)
    ):
        return f"shape {shape!r:.60} must be at most {MAX_DIMS} dimensions of 1..{MAX_SAMPLE_BYTES}"
    if math.prod(shape) * ITEMSIZE[field.dtype] > MAX_SAMPLE_BYTES:
        return f"one sample takes over {MAX_SAMPLE_BYTES:,} bytes"
    if field.classes is not None:
        if field.dtype not in INTEGER:
            return f"classes need an integer dtype, not {field.dtype}"
        top = (1 << (8 * ITEMSIZE[field.dtype] - (0 if field.dtype.startswith("u") else 1))) - 1
        if isinstance(field.classes, bool) or not isinstance(field.classes, int) or not 1 <= field.classes <= top + 1:
            return f"classes {field.classes!r:.30} must be an integer in 1..{top + 1} (what {field.dtype} holds)"
    return None


@dataclass(frozen=True)
class Sample:
    """The fields of one sample, in order (the order every reader returns them in)."""

    fields: tuple[Field, ...]

    def __post_init__(self) -> None:
        if isinstance(self.fields, str | bytes) or not hasattr(self.fields, "__iter__"):
            raise ShardError(f"a sample's fields are a tuple of Field, got {type(self.fields).__name__}")
        object.__setattr__(self, "fields", tuple(self.fields))
        for number, field in enumerate(self.fields):
            if not isinstance(field, Field):
                raise ShardError(
                    f"a sample's fields are a tuple of Field: fields[{number}] is {type(field).__name__} {field!r:.40}"
                )
        names = [f.name for f in self.fields]
        if not 1 <= len(names) <= MAX_FIELDS:
            raise ShardError(f"a sample has 1..{MAX_FIELDS} fields, got {len(names)}")
        if len(set(names)) != len(names):
            raise ShardError(f"field names must be distinct, got {names}")
        if self.row_bytes > MAX_SAMPLE_BYTES:
            raise ShardError(f"one sample takes {self.row_bytes:,} bytes, over {MAX_SAMPLE_BYTES:,}")

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.fields]

    @property
    def row_bytes(self) -> int:
        """Bytes one sample takes in a shard, all fields."""
        return sum(f.row_bytes for f in self.fields)

    def __getitem__(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    def to_json(self) -> list[dict]:
        return [f.to_json() for f in self.fields]


# What format version 2 declared implicitly: MNIST's images and labels.
V2_SAMPLE = Sample((Field("images", "uint8", (28, 28)), Field("labels", "uint8", (), classes=10)))


def zstd():
    """The zstandard module, imported where used: only zstd shards need it, and a machine
    with the bare install lacks it."""
    import zstandard

    return zstandard


def suffix(codec: str) -> str:
    return ".safetensors" + (".zst" if codec == "zstd" else "")


def shard_file(number: int, codec: str) -> str:
    return f"shard-{number:05d}{suffix(codec)}"


def new_manifest(
    *,
    sample: Sample,
    dataset: str,
    split: str,
    count: int,
    codec: str,
    level: int,
    source: dict,
    shards: list[dict],
    block: int | None,
) -> dict:
    """The manifest every writer produces (key order included: the bytes are DVC's cache key)."""
    return {
        "format_version": FORMAT_VERSION,
        "dataset": dataset,
        "split": split,
        "count": int(count),
        "fields": sample.to_json(),
        "compression": {"codec": codec, "level": level if codec == "zstd" else None},
        "block_bytes": block,
        "source": source,
        "shards": shards,
    }


def block_bytes(codec: str, shard_bytes: int) -> int | None:
    """The size of the blocks whose digests each shard's header lists, for shards of at most
    `shard_bytes` data: BLOCK_BYTES, doubled until at most MAX_BLOCKS cover a shard.
    Uncompressed shards only: a zstd shard is decompressed whole, so it is verified whole."""
    if codec != "none":
        return None
    block = BLOCK_BYTES
    while blocks_in(shard_bytes, block) > MAX_BLOCKS:
        block *= 2
    return block


def blocks_in(size: int, block: int) -> int:
    """Blocks of `block` bytes a file of `size` bytes is cut into (the last may be short)."""
    return -(-size // block)


MANIFEST_TMP = ".manifest.json.tmp"  # what `write_manifest` leaves if stopped before its rename


def write_manifest(folder: Path, manifest: dict) -> None:
    """manifest.json in `folder`, written beside and renamed into place: whole or not at all."""
    tmp = Path(folder) / MANIFEST_TMP
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    tmp.replace(Path(folder) / "manifest.json")


MAX_COUNT = 1 << 31  # samples in one split: far above any real data set, far below petabytes
MAX_HEADER = 1 << 20  # the safetensors header bound the reader enforces
MAX_BYTES = 1 << 44  # one shard file, whatever its codec (16 TiB)
MAX_MANIFEST = 64 << 20  # manifest.json: ~250 bytes a shard, so some 250,000 shards


def max_shard_bytes(count: int, row_bytes: int) -> int:
    """The most a shard of `count` samples of `row_bytes` each can take uncompressed: its
    samples, the 8-byte header length and the largest header the reader accepts."""
    return count * row_bytes + 8 + MAX_HEADER


def _fail(file: Path, key: str, message: str) -> ShardError:
    return ShardError(f"{file}: {key}: {message}")


def _expect(file: Path, key: str, value, kind: type | tuple[type, ...], what: str):
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise _fail(file, key, f"expected {what}, got {value!r:.60}")
    return value


def _count(file: Path, key: str, value, low: int = 0, high: int = MAX_COUNT) -> int:
    _expect(file, key, value, int, "an integer")
    if not low <= value <= high:
        raise _fail(file, key, f"{value} is outside {low}..{high}")
    return value


def _digest(file: Path, key: str, value, length: int) -> str:
    _expect(file, key, value, str, f"{length} hex digits")
    if not is_hex(value, length):
        raise _fail(file, key, f"expected {length} lowercase hex digits, got {value!r:.80}")
    return value


def shard_name(file: Path, key: str, value) -> str:
    """A shard's file name: a plain name inside the split folder, nothing that walks out
    of it ("shard-" first, so never '', '.', '..' or absolute; no separator, no NUL)."""
    _expect(file, key, value, str, "a file name")
    if not value.startswith("shard-") or "/" in value or "\\" in value or "\0" in value or len(value) > 255:
        raise _fail(file, key, f"{value!r:.80} is not a plain shard file name inside {file.parent}")
    return value


def parse_fields(value, file: Path = Path("manifest.json")) -> Sample:
    """A manifest's `fields` list as a Sample, every declaration checked (names, dtypes,
    shapes, classes, sizes) before any shard is opened."""
    _expect(file, "fields", value, list, "a list of fields")
    if not 1 <= len(value) <= MAX_FIELDS:
        raise _fail(file, "fields", f"{len(value)} fields, expected 1..{MAX_FIELDS}")
    fields = []
    for number, entry in enumerate(value):
        where = f"fields[{number}]"
        _expect(file, where, entry, dict, "an object")
        extra = set(entry) - {"name", "dtype", "shape", "classes"}
        if extra or not {"name", "dtype", "shape"} <= set(entry):
            raise _fail(file, where, f"expected keys name, dtype, shape (and classes), got {sorted(entry)!r:.80}")
        shape = _expect(file, f"{where}.shape", entry["shape"], list, "a list of sizes")
        try:
            field = Field(entry["name"], entry["dtype"], tuple(shape), entry.get("classes"))
        except ValueError as err:
            raise _fail(file, where, str(err)) from None
        fields.append(field)
    try:
        return Sample(tuple(fields))
    except ValueError as err:
        raise _fail(file, "fields", str(err)) from None


def _upgrade_v2(manifest: dict, file: Path) -> dict:
    """A version-2 manifest (MNIST-only: fixed `images` and `labels` keys) in version-3 form."""
    v2 = {"images": {"dtype": "uint8", "shape": [28, 28]}, "labels": {"dtype": "uint8"}}
    for key, wanted in v2.items():
        if manifest[key] != wanted:
            raise _fail(file, key, f"{manifest[key]!r:.80}, expected {wanted} (format version 2)")
    upgraded = {key: value for key, value in manifest.items() if key not in v2}
    upgraded["fields"] = V2_SAMPLE.to_json()
    return upgraded


_KEYS = {
    2: {"format_version", "dataset", "split", "count", "images", "labels", "compression", "source", "shards"},
    3: {"format_version", "dataset", "split", "count", "fields", "compression", "source", "shards"},
}
_KEYS[4] = _KEYS[3] | {"block_bytes"}


def _block_bytes(file: Path, manifest: dict) -> int | None:
    """The manifest's `block_bytes`: a power of two from 4 KiB to 1 GiB for uncompressed
    shards, null for zstd ones."""
    value = manifest["block_bytes"]
    if manifest["compression"]["codec"] == "zstd":
        if value is not None:
            raise _fail(file, "block_bytes", f"{value!r:.30}, expected null (zstd shards are verified whole)")
        return None
    _count(file, "block_bytes", value, low=1 << 12, high=1 << 30)
    if value & (value - 1):
        raise _fail(file, "block_bytes", f"{value} is not a power of two")
    return value


def check_manifest(manifest, file: Path, first_shard: int = 0) -> dict:
    """The manifest's schema, checked before anything it names is opened: known keys and
    types, declared fields, file names confined to the folder and each in its place (shard
    `first_shard + i` at entry i: a part's record starts at its first shard), counts that
    add up, sizes that can hold them and digests. Returns it in version-4 form (an older one
    upgraded, with `block_bytes` null). The reader runs where only torch is installed, so this is plain code rather
    than a schema library."""
    _expect(file, "(top level)", manifest, dict, "a JSON object")
    version = manifest.get("format_version")
    if version not in READ_VERSIONS or isinstance(version, bool):
        raise _fail(file, "format_version", f"{version!r:.20}, expected one of {list(READ_VERSIONS)}")
    known = _KEYS[version]
    missing, extra = known - {"source"} - set(manifest), set(manifest) - known
    if missing or extra:
        raise _fail(file, "(keys)", f"missing {sorted(missing)}, unknown {sorted(extra)}")
    if version == 2:
        manifest = _upgrade_v2(manifest, file)
    if version < 4:
        manifest = {**manifest, "block_bytes": None}
    for key in ("dataset", "split"):
        _expect(file, key, manifest[key], str, "a string")
    count = _count(file, "count", manifest["count"])
    row_bytes = parse_fields(manifest["fields"], file).row_bytes
    compression = _expect(file, "compression", manifest["compression"], dict, "an object")
    if compression.get("codec") not in CODECS:
        raise _fail(file, "compression.codec", f"{compression.get('codec')!r:.30}, expected 'none' or 'zstd'")
    block = _block_bytes(file, manifest) if version >= 4 else None
    shards = _expect(file, "shards", manifest["shards"], list, "a list")
    ending = suffix(compression["codec"])
    total = 0
    for number, entry in enumerate(shards):
        where = f"shards[{number}]"
        _expect(file, where, entry, dict, "an object")
        name = shard_name(file, f"{where}.file", entry.get("file"))
        if not name.endswith(ending):
            raise _fail(
                file, f"{where}.file", f"{name!r} does not end in {ending!r} (compression {compression['codec']})"
            )
        placed = shard_file(first_shard + number, compression["codec"])
        if name != placed:  # (so none is listed twice either)
            raise _fail(
                file,
                f"{where}.file",
                f"{name!r} where {placed!r} belongs: shards are numbered by their place in the split, "
                f"and entries out of place would reorder its samples",
            )
        n = _count(file, f"{where}.count", entry.get("count"), low=1)
        size = _count(file, f"{where}.bytes", entry.get("bytes"), low=1, high=MAX_BYTES)
        if compression["codec"] == "none" and not n * row_bytes < size <= max_shard_bytes(n, row_bytes):
            raise _fail(file, f"{where}.bytes", f"{size:,} bytes cannot hold {n:,} samples of {row_bytes} bytes")
        _digest(file, f"{where}.sha256", entry.get("sha256"), 64)
        _digest(file, f"{where}.xxh3_128", entry.get("xxh3_128"), 32)
        if block is not None:
            _digest(file, f"{where}.header_xxh3_64", entry.get("header_xxh3_64"), 16)
        total += n
    if total != count:
        raise _fail(file, "shards", f"shard counts add up to {total:,}, count says {count:,}")
    return manifest


def manifest_sample(manifest: dict) -> Sample:
    """The sample schema of a manifest that `check_manifest` passed."""
    return parse_fields(manifest["fields"])


def read_manifest(path: Path, dataset: str | None = None, split: str | None = None) -> dict:
    """The folder's manifest.json, checked, in version-4 form; `dataset`/`split` when given
    must match it."""
    path = Path(path)
    file = path / "manifest.json"
    try:  # a regular file inside the folder, at most 64 MiB read (a FIFO or a link out: refused)
        manifest = read_json(file, MAX_MANIFEST, "manifest", within=path)
    except FileNotFoundError:
        raise ShardError(f"{file}: missing (is {path} a shard folder?)") from None
    except InputError as err:  # too large, not a regular file, a link out, not JSON, a key twice
        raise ShardError(str(err)) from None
    return check_identity(check_manifest(manifest, file), file, dataset, split)


def check_identity(manifest: dict, file, dataset: str | None, split: str | None) -> dict:
    """The manifest, when its data set and split are the ones asked for (None: any); else a
    ShardError naming the file and both values. Every reader, local or remote, asks it."""
    for key, wanted in (("dataset", dataset), ("split", split)):
        if wanted is not None and manifest.get(key) != wanted:
            raise ShardError(f"{file}: manifest is for {key} {manifest.get(key)!r}, expected {wanted!r}")
    return manifest
