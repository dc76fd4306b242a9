"""What a shard folder is: the manifest's format, how a writer builds it, and the schema a
reader checks before opening anything it names.

A split is a few large safetensors files (images uint8 [n, 28, 28], labels uint8 [n]; no
pickle, memory-mappable), optionally zstd-compressed, listed in `manifest.json` with counts,
sizes, sha256 and xxh3-128. A few large shards rather than many small files, because DVC
(and every file system) pays per file. Writer (`shardwriter`), whole-split reader
(`shardreader`) and per-rank reader (`ranks`) all go through this module, so the format is
stated once.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.core.bounded import UnsafeFileError, read_capped
from pipeline.core.errors import InputError, is_hex

FORMAT_VERSION = 2
IMAGE_SHAPE = (28, 28)
NUM_CLASSES = 10               # labels are class indices 0..NUM_CLASSES-1
CODECS = ("none", "zstd")


class ShardError(InputError):
    """A shard folder that does not match its manifest; the message names file and check."""


def first_bad_label(labels) -> int | None:
    """The index of the first label outside 0..NUM_CLASSES-1 (numpy array or CPU tensor), or
    None: the one label rule that every reader and writer, and the stages, ask."""
    values = labels.numpy() if hasattr(labels, "numpy") else labels
    bad = (values >= NUM_CLASSES).nonzero()[0]
    return int(bad[0]) if len(bad) else None


def label_error(labels, where: str, ids=None) -> ShardError | None:
    """A ShardError naming `where`, the first label out of range and its sample (`ids[i]`
    when given: the sample's index in its split), or None when all fit."""
    index = first_bad_label(labels)
    if index is None:
        return None
    sample = index if ids is None else int(ids[index])
    return ShardError(f"{where}: label {int(labels[index])} at sample {sample} is outside 0..{NUM_CLASSES - 1}")


def zstd():
    """The zstandard module, imported where used: only zstd shards need it, and the lent GPU
    machines lack it."""
    import zstandard

    return zstandard


def epoch_seed(seed: int, epoch: int) -> int:
    """The one mix of (seed, epoch) behind every shuffle (DeviceBatches, ranks): runs repeat
    exactly and epochs differ."""
    return seed * 1_000_003 + epoch


def suffix(codec: str) -> str:
    return ".safetensors" + (".zst" if codec == "zstd" else "")


def shard_file(number: int, codec: str) -> str:
    return f"shard-{number:05d}{suffix(codec)}"


def new_manifest(*, dataset: str, split: str, count: int, codec: str, level: int, source: dict,
                 shards: list[dict]) -> dict:
    """The manifest both writers produce (key order included: the bytes are DVC's cache key)."""
    return {
        "format_version": FORMAT_VERSION,
        "dataset": dataset,
        "split": split,
        "count": int(count),
        "images": {"dtype": "uint8", "shape": list(IMAGE_SHAPE)},
        "labels": {"dtype": "uint8"},
        "compression": {"codec": codec, "level": level if codec == "zstd" else None},
        "source": source,
        "shards": shards,
    }


def write_manifest(folder: Path, manifest: dict) -> None:
    (Path(folder) / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


MAX_COUNT = 1 << 31            # samples in one split: far above any real data set, far below petabytes
SAMPLE_BYTES = 28 * 28 + 1     # one image and its label
MAX_HEADER = 1 << 20           # the safetensors header bound the reader enforces


def max_shard_bytes(count: int) -> int:
    """The most a shard of `count` samples can take uncompressed: its samples, the 8-byte
    header length and the largest header the reader accepts."""
    return count * SAMPLE_BYTES + 8 + MAX_HEADER


MAX_BYTES = max_shard_bytes(MAX_COUNT)


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


def check_manifest(manifest, file: Path) -> dict:
    """The manifest's schema, checked before anything it names is opened: known keys and
    types, file names confined to the folder and listed once, counts that add up and sizes
    that can hold them. The reader runs where only torch is installed, so this is plain
    code rather than a schema library."""
    _expect(file, "(top level)", manifest, dict, "a JSON object")
    known = {"format_version", "dataset", "split", "count", "images", "labels", "compression", "source", "shards"}
    missing, extra = known - {"source"} - set(manifest), set(manifest) - known
    if missing or extra:
        raise _fail(file, "(keys)", f"missing {sorted(missing)}, unknown {sorted(extra)}")
    if manifest["format_version"] != FORMAT_VERSION:
        raise _fail(file, "format_version", f"{manifest['format_version']!r:.20}, expected {FORMAT_VERSION}")
    for key in ("dataset", "split"):
        _expect(file, key, manifest[key], str, "a string")
    count = _count(file, "count", manifest["count"])
    if manifest["images"] != {"dtype": "uint8", "shape": list(IMAGE_SHAPE)}:
        raise _fail(file, "images", f"{manifest['images']!r:.80}, expected uint8 {list(IMAGE_SHAPE)}")
    if manifest["labels"] != {"dtype": "uint8"}:
        raise _fail(file, "labels", f"{manifest['labels']!r:.80}, expected uint8")
    compression = _expect(file, "compression", manifest["compression"], dict, "an object")
    if compression.get("codec") not in CODECS:
        raise _fail(file, "compression.codec", f"{compression.get('codec')!r:.30}, expected 'none' or 'zstd'")
    shards = _expect(file, "shards", manifest["shards"], list, "a list")
    ending = suffix(compression["codec"])
    seen: set[str] = set()
    total = 0
    for number, entry in enumerate(shards):
        where = f"shards[{number}]"
        _expect(file, where, entry, dict, "an object")
        name = shard_name(file, f"{where}.file", entry.get("file"))
        if not name.endswith(ending):
            raise _fail(file, f"{where}.file", f"{name!r} does not end in {ending!r} (compression {compression['codec']})")
        if name in seen:
            raise _fail(file, f"{where}.file", f"{name!r} is listed twice")
        seen.add(name)
        n = _count(file, f"{where}.count", entry.get("count"), low=1)
        size = _count(file, f"{where}.bytes", entry.get("bytes"), low=1, high=MAX_BYTES)
        if compression["codec"] == "none" and not n * SAMPLE_BYTES < size <= max_shard_bytes(n):
            raise _fail(file, f"{where}.bytes", f"{size:,} bytes cannot hold {n:,} samples of {SAMPLE_BYTES} bytes")
        _digest(file, f"{where}.sha256", entry.get("sha256"), 64)
        _digest(file, f"{where}.xxh3_128", entry.get("xxh3_128"), 32)
        total += n
    if total != count:
        raise _fail(file, "shards", f"shard counts add up to {total:,}, count says {count:,}")
    return manifest


def read_manifest(path: Path, dataset: str | None = None, split: str | None = None) -> dict:
    path = Path(path)
    file = path / "manifest.json"
    try:  # a regular file inside the folder, at most 64 MiB read (a FIFO or a link out: refused)
        manifest = json.loads(read_capped(file, 64 << 20, "manifest", within=path))
    except FileNotFoundError:
        raise ShardError(f"{file}: missing (is {path} a shard folder?)") from None
    except UnsafeFileError as err:
        raise ShardError(str(err)) from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
        raise ShardError(f"{file}: not valid JSON ({err})") from None
    check_manifest(manifest, file)
    for key, wanted in (("dataset", dataset), ("split", split)):
        if wanted is not None and manifest.get(key) != wanted:
            raise ShardError(f"{file}: manifest is for {key} {manifest.get(key)!r}, expected {wanted!r}")
    return manifest
