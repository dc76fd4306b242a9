"""Tensor shards on disk, and loaders that keep the accelerator fed.

Preprocessing happens once, here: each split becomes a few large safetensors files
(images uint8 [n, 28, 28], labels uint8 [n]; no pickle, memory-mappable), optionally
zstd-compressed, listed with sizes, sha256 and xxh3-128 in `manifest.json`. A few large
shards rather than many small files, because DVC (and every file system) pays per file.

Loading memory-maps each shard, hashes it in place with xxh3 (~20 GB/s here: a fraction
of the load time; sha256 runs at ~1 GB/s and would cost four times the copy) and copies
each tensor once into its place in the output, at memory-copy speed. sha256 stays
in the manifest for `sha256sum`-style checks and `verify="sha256"`.

Three ways to feed a training loop, fastest last:
- `ShardDataset`: map-style, with `__getitems__`, for code that keeps its DataLoader;
- `load_split`: the verified split as uint8 tensors on a device;
- `DeviceBatches`: the split resident on the device, shuffled there by a seeded generator,
  converted to float per batch; equal batch counts on every DDP rank.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import mmap
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import save as st_save

from pipeline.atomic import atomic_dir
from pipeline.errors import InputError

FORMAT_VERSION = 2
IMAGE_SHAPE = (28, 28)
VERIFY = ("xxh3", "sha256", "none")


class ShardError(InputError):
    """A shard folder that does not match its manifest; the message names file and check."""


# ---------------------------------------------------------------- writing


def _zstd():
    import zstandard  # only the writer and zstd shards need it; the GPU machines lack it

    return zstandard


def _hasher(verify: str):
    """(manifest key, hash object) for a `verify` mode; xxh3 falls back to sha256 where
    xxhash is not installed (a bare machine with only torch: still verified, just slower)."""
    if verify == "xxh3":
        try:
            import xxhash
        except ImportError:
            return "sha256", hashlib.sha256()
        return "xxh3_128", xxhash.xxh3_128()
    return "sha256", hashlib.sha256()


def _xxh3(data: bytes) -> str:
    import xxhash  # the writer runs where the project is installed

    return xxhash.xxh3_128_hexdigest(data)


def shard_bytes(images: np.ndarray, labels: np.ndarray, compression: str, level: int) -> bytes:
    raw = st_save({"images": np.ascontiguousarray(images), "labels": np.ascontiguousarray(labels)})
    if compression == "none":
        return raw
    if compression == "zstd":
        return _zstd().ZstdCompressor(level=level).compress(raw)
    raise ValueError(f"shard compression must be 'none' or 'zstd', got {compression!r}")


def write_shards(images: np.ndarray, labels: np.ndarray, out_dir: Path, *, dataset: str, split: str,
                 samples_per_shard: int, compression: str = "none", level: int = 3,
                 source: dict | None = None) -> dict:
    """Write one split as shards plus manifest.json into `out_dir` (replaced whole)."""
    if images.dtype != np.uint8 or images.shape[1:] != IMAGE_SHAPE or len(images) != len(labels):
        raise ShardError(f"{dataset}/{split}: expected uint8 images [n, 28, 28] and n labels, "
                         f"got {images.dtype} {list(images.shape)} and {len(labels)} labels")
    if samples_per_shard < 1:
        raise ValueError("samples_per_shard must be at least 1")
    suffix = ".safetensors" + (".zst" if compression == "zstd" else "")
    entries = []
    with atomic_dir(Path(out_dir)) as tmp:
        for number, start in enumerate(range(0, len(images), samples_per_shard)):
            stop = min(start + samples_per_shard, len(images))
            blob = shard_bytes(images[start:stop], labels[start:stop], compression, level)
            name = f"shard-{number:05d}{suffix}"
            (tmp / name).write_bytes(blob)
            entries.append({"file": name, "count": stop - start, "bytes": len(blob),
                            "sha256": hashlib.sha256(blob).hexdigest(),
                            "xxh3_128": _xxh3(blob)})
        manifest = {
            "format_version": FORMAT_VERSION,
            "dataset": dataset,
            "split": split,
            "count": int(len(images)),
            "images": {"dtype": "uint8", "shape": list(IMAGE_SHAPE)},
            "labels": {"dtype": "uint8"},
            "compression": {"codec": compression, "level": level if compression == "zstd" else None},
            "source": source or {},
            "shards": entries,
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def shard_dataset(parquet_dir: Path, out_dir: Path, dataset: str, samples_per_shard: int,
                  compression: str, level: int) -> None:
    """Stage `shard@<dataset>`: both splits of the Parquet under study into shards."""
    with atomic_dir(Path(out_dir)) as tmp:  # both splits or neither
        _shard_splits(Path(parquet_dir), tmp, Path(out_dir), dataset, samples_per_shard, compression, level)


def _shard_splits(parquet_dir: Path, tmp: Path, out_dir: Path, dataset: str, samples_per_shard: int,
                  compression: str, level: int) -> None:
    from pipeline.convert import read_parquet_arrays, verify_checksum

    for split in ("train", "test"):
        source = Path(parquet_dir) / f"{split}.parquet"
        verify_checksum(source)  # one flipped byte anywhere: refused, the file named
        labels, images = read_parquet_arrays(source)
        # The content's digest, not the file's: every codec holds the same samples, so a
        # codec experiment writes byte-identical shards and DVC skips everything after them.
        digest = hashlib.sha256(np.ascontiguousarray(labels).tobytes() + np.ascontiguousarray(images).tobytes())
        manifest = write_shards(images, labels, tmp / split, dataset=dataset, split=split,
                                samples_per_shard=samples_per_shard, compression=compression,
                                level=level, source={"content_sha256": digest.hexdigest()})
        total = sum(s["bytes"] for s in manifest["shards"])
        print(f"{out_dir}/{split}: {len(manifest['shards'])} shards, {total / 1e6:.1f} MB", file=sys.stderr)


# ---------------------------------------------------------------- reading


_HEX = frozenset("0123456789abcdef")
MAX_COUNT = 1 << 31            # samples in one split: far above any real data set, far below petabytes
SAMPLE_BYTES = 28 * 28 + 1     # one image and its label
MAX_HEADER = 1 << 20           # the safetensors header bound the reader enforces


def _fail(file: Path, key: str, message: str) -> ShardError:
    return ShardError(f"{file}: {key}: {message}")


def _expect(file: Path, key: str, value, kind: type | tuple[type, ...], what: str):
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise _fail(file, key, f"expected {what}, got {value!r:.60}")
    return value


def _count(file: Path, key: str, value, low: int = 0) -> int:
    _expect(file, key, value, int, "an integer")
    if not low <= value <= MAX_COUNT:
        raise _fail(file, key, f"{value} is outside {low}..{MAX_COUNT}")
    return value


def _digest(file: Path, key: str, value, length: int) -> str:
    _expect(file, key, value, str, f"{length} hex digits")
    if len(value) != length or not set(value) <= _HEX:
        raise _fail(file, key, f"expected {length} lowercase hex digits, got {value!r:.80}")
    return value


def shard_name(file: Path, key: str, value) -> str:
    """A shard's file name: a plain name inside the split folder, nothing that walks out
    of it (no separators, no '..', no absolute path, no NUL)."""
    _expect(file, key, value, str, "a file name")
    if (not value or value in (".", "..") or "/" in value or "\\" in value or "\0" in value
            or len(value) > 255 or not value.startswith("shard-")):
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
    if compression.get("codec") not in ("none", "zstd"):
        raise _fail(file, "compression.codec", f"{compression.get('codec')!r:.30}, expected 'none' or 'zstd'")
    shards = _expect(file, "shards", manifest["shards"], list, "a list")
    suffix = ".safetensors" + (".zst" if compression["codec"] == "zstd" else "")
    seen: set[str] = set()
    total = 0
    for number, entry in enumerate(shards):
        where = f"shards[{number}]"
        _expect(file, where, entry, dict, "an object")
        name = shard_name(file, f"{where}.file", entry.get("file"))
        if not name.endswith(suffix):
            raise _fail(file, f"{where}.file", f"{name!r} does not end in {suffix!r} (compression {compression['codec']})")
        if name in seen:
            raise _fail(file, f"{where}.file", f"{name!r} is listed twice")
        seen.add(name)
        n = _count(file, f"{where}.count", entry.get("count"), low=1)
        size = _count(file, f"{where}.bytes", entry.get("bytes"), low=1)
        if compression["codec"] == "none" and not n * SAMPLE_BYTES < size <= n * SAMPLE_BYTES + 8 + MAX_HEADER:
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
    try:
        manifest = json.loads(file.read_bytes()[: 64 << 20])
    except FileNotFoundError:
        raise ShardError(f"{file}: missing (is {path} a shard folder?)") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
        raise ShardError(f"{file}: not valid JSON ({err})") from None
    check_manifest(manifest, file)
    for key, wanted in (("dataset", dataset), ("split", split)):
        if wanted is not None and manifest.get(key) != wanted:
            raise ShardError(f"{file}: manifest is for {key} {manifest.get(key)!r}, expected {wanted!r}")
    return manifest


def _shard_path(folder: Path, name: str) -> Path:
    """The shard's path, refused if it is a link or otherwise resolves outside the folder."""
    path = folder / name
    if path.is_symlink() or path.resolve().parent != folder.resolve():
        raise ShardError(f"{path}: a link or a path outside {folder}; shards must be plain files in their folder")
    return path


def _readinto(source, view: memoryview, path: Path) -> None:
    """Fill `view` from a stream that may return short reads."""
    while view.nbytes:
        got = source.readinto(view)
        if not got:
            raise ShardError(f"{path}: ends early (truncated?)")
        view = view[got:]


def _read_header(source, path: Path, count: int) -> tuple[int, dict[str, tuple[int, int]]]:
    """The safetensors header (8-byte little-endian length + JSON), checked against the
    manifest; returns its length in bytes and {tensor: (begin, end)} within the data area."""
    raw = source.read(8)
    size = int.from_bytes(raw, "little") if len(raw) == 8 else -1
    if not 0 < size < 1 << 20:
        raise ShardError(f"{path}: not a safetensors shard (header length {size})")
    try:
        header = json.loads(source.read(size))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ShardError(f"{path}: not a readable safetensors header ({err})") from None
    regions = {}
    for name, shape in (("images", [count, *IMAGE_SHAPE]), ("labels", [count])):
        info = header.get(name) if isinstance(header, dict) else None
        if not isinstance(info, dict):
            raise ShardError(f"{path}: no tensor {name!r}")
        if info.get("dtype") != "U8" or info.get("shape") != shape:
            raise ShardError(f"{path}: tensor {name!r} is {info.get('dtype')} {info.get('shape')}, "
                             f"expected U8 (uint8) {shape}")
        offsets = info.get("data_offsets")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            raise ShardError(f"{path}: tensor {name!r} has no valid data_offsets ({offsets!r})")
        regions[name] = (offsets[0], offsets[1])
    return 8 + size, regions


def _verify(path: Path, entry: dict, verify: str, data) -> None:
    if verify == "none":
        return
    key, hasher = _hasher(verify)
    hasher.update(data)
    if hasher.hexdigest() != entry.get(key):
        raise ShardError(f"{path}: checksum mismatch: manifest {key} {entry.get(key)}, file {hasher.hexdigest()}")


def _tiles(path: Path, regions: dict[str, tuple[int, int]], targets: dict[str, torch.Tensor]):
    """(name, begin, end) in file order, checking the tensors tile the data area with no
    holes (as safetensors requires) and have the sizes the manifest implies."""
    position = 0
    for name, (begin, end) in sorted(regions.items(), key=lambda item: item[1]):
        if begin != position or end - begin != targets[name].nbytes:
            raise ShardError(f"{path}: tensor {name!r} at bytes {begin}..{end}, expected "
                             f"{position}..{position + targets[name].nbytes}")
        yield name, begin, end
        position = end


def _check_frame(path: Path, blob: bytes, count: int) -> None:
    """A zstd shard's frame states its decompressed size: it must be what `count` samples
    take, before anything that size is allocated or decompressed."""
    size = _zstd().frame_content_size(blob)
    if size < 0 or not count * SAMPLE_BYTES < size <= count * SAMPLE_BYTES + 8 + MAX_HEADER:
        raise ShardError(f"{path}: zstd frame holds {size:,} bytes, not {count:,} samples")


def _read_shard_into(folder: Path, entry: dict, compression: str, verify: str,
                     targets: dict[str, torch.Tensor]) -> None:
    """Fill `targets` (this shard's slices of the output tensors) from one shard file.

    Uncompressed: the file is memory-mapped, hashed in place and each tensor copied once
    into its slice by torch (multi-threaded), which runs at memory-copy speed; a read()
    into the output ran at half that. zstd: the small file is read, hashed, and
    decompressed as a stream straight into the slices."""
    path = _shard_path(folder, entry["file"])
    try:
        file = path.open("rb", buffering=0)
    except FileNotFoundError:
        raise ShardError(f"{path}: shard listed in the manifest is missing") from None
    with file:
        size = os.fstat(file.fileno()).st_size
        if size != entry["bytes"]:
            raise ShardError(f"{path}: {size:,} bytes, manifest says {entry['bytes']:,} (truncated?)")
        if compression == "zstd":
            blob = file.read()
            _verify(path, entry, verify, blob)
            _check_frame(path, blob, entry["count"])
            stream = _zstd().ZstdDecompressor().stream_reader(io.BytesIO(blob))
            _, regions = _read_header(stream, path, entry["count"])
            for name, _, _ in _tiles(path, regions, targets):
                _readinto(stream, memoryview(targets[name].numpy()).cast("B"), path)
            return
        # ACCESS_COPY: private and writable (nothing is written), so torch takes it without a warning.
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY) as mapped:
            _verify(path, entry, verify, mapped)
            data_start, regions = _read_header(mapped, path, entry["count"])
            end = 0
            for name, begin, end in _tiles(path, regions, targets):
                source = np.frombuffer(mapped, np.uint8, end - begin, data_start + begin)
                targets[name].view(-1).copy_(torch.from_numpy(source))
                del source  # the map cannot close while an array still points into it
            if data_start + end != size:
                raise ShardError(f"{path}: {size - data_start - end:,} bytes after the last tensor")


def load_split(path: Path, device: str | torch.device = "cpu", *, dataset: str | None = None,
               split: str | None = None, verify: str = "xxh3") -> tuple[torch.Tensor, torch.Tensor]:
    """The whole split as (images uint8 [n, 28, 28], labels uint8 [n]) on `device`.

    verify: "xxh3" (default; the mapped file is hashed in place, about a fifth of the load time),
    "sha256" (the cryptographic digest, ~1 GB/s), or "none". Sizes, tensor names, dtypes,
    shapes, counts and labels are always checked. For CUDA the split is read straight into
    pinned memory, then copied to the device asynchronously.
    """
    if verify not in VERIFY:
        raise ValueError(f"verify must be one of {VERIFY}, got {verify!r}")
    folder = Path(path)
    manifest = read_manifest(folder, dataset, split)
    compression = manifest["compression"]["codec"]
    device = torch.device(device)
    pin = device.type == "cuda"
    images = torch.empty((manifest["count"], *IMAGE_SHAPE), dtype=torch.uint8, pin_memory=pin)
    labels = torch.empty(manifest["count"], dtype=torch.uint8, pin_memory=pin)
    start = 0
    for entry in manifest["shards"]:
        stop = start + entry["count"]
        _read_shard_into(folder, entry, compression, verify,
                         {"images": images[start:stop], "labels": labels[start:stop]})
        start = stop
    if labels.numel() and int(labels.max()) > 9:
        raise ShardError(f"{folder}: a label is outside 0..9")
    if device.type == "cpu":
        return images, labels
    return images.to(device, non_blocking=pin), labels.to(device, non_blocking=pin)


# ---------------------------------------------------------------- feeding a training loop


def to_float(images: torch.Tensor, mean: float | None = None, std: float | None = None,
             channels_last: bool = False, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 [b, 28, 28] -> float [b, 1, 28, 28] in 0..1 (optionally normalised), on its device."""
    x = images.unsqueeze(1).to(dtype).div_(255)
    if mean is not None and std is not None:
        x = x.sub_(mean).div_(std)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


class ShardDataset(torch.utils.data.Dataset):
    """Map-style view of a shard split. `__getitems__` serves a whole batch in one gather;
    use `collate_fn=ShardDataset.collate` (or `loader()`) so the DataLoader passes it through."""

    def __init__(self, path: Path, **load_kwargs) -> None:
        self.images, self.labels = load_split(path, "cpu", **load_kwargs)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return to_float(self.images[index : index + 1])[0], self.labels[index].long()

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.as_tensor(indices)
        return to_float(self.images[index]), self.labels[index].long()

    @staticmethod
    def collate(batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return batch

    def loader(self, batch_size: int, **kwargs) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(self, batch_size=batch_size, collate_fn=self.collate, **kwargs)


@dataclass
class DeviceBatches:
    """Batches from a split held on the device: no host work and no copies per step.

    Every epoch draws a fresh permutation from a generator seeded with (seed, epoch), so runs
    repeat exactly and epochs differ. With `world_size > 1` each rank takes a disjoint,
    equal-sized slice of the same permutation, so every rank yields the same number of
    batches (uneven counts hang DDP's collectives).
    """

    images: torch.Tensor
    labels: torch.Tensor
    batch_size: int
    shuffle: bool = True
    seed: int = 0
    drop_last: bool = False
    channels_last: bool = False
    mean: float | None = None
    std: float | None = None
    rank: int = 0
    world_size: int = 1
    dtype: torch.dtype = torch.float32
    epoch: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside 0..{self.world_size - 1}")
        self.per_rank = len(self.labels) // self.world_size

    def __len__(self) -> int:
        whole = self.per_rank // self.batch_size
        return whole if self.drop_last else math.ceil(self.per_rank / self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def indices(self, epoch: int) -> torch.Tensor:
        """This rank's sample order for `epoch`, on the data's device."""
        device = self.labels.device
        n = len(self.labels)
        if self.shuffle:
            generator = torch.Generator(device=device)
            generator.manual_seed(self.seed * 1_000_003 + epoch)
            order = torch.randperm(n, generator=generator, device=device)
        else:
            order = torch.arange(n, device=device)
        mine = order[: self.per_rank * self.world_size][self.rank :: self.world_size]
        return mine[: len(self) * self.batch_size] if self.drop_last else mine

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = self.indices(self.epoch)
        self.epoch += 1
        for start in range(0, len(order), self.batch_size):
            index = order[start : start + self.batch_size]
            yield (to_float(self.images[index], self.mean, self.std, self.channels_last, self.dtype),
                   self.labels[index].long())
