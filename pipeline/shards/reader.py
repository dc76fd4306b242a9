"""Reading shards back: a whole split into tensors, verified on the way.

Loading memory-maps each shard, hashes it in place with xxh3 and copies each tensor once
into its place in the output. sha256 stays in the manifest for `sha256sum`-style checks and
`verify="sha256"`. What this machine measures (`python benchmarks/shard_load.py`): the
verified load runs at about a quarter of memory-copy speed (xxh3 is most of it), the
unverified one close to it; the README has the figures.
"""

from __future__ import annotations

import hashlib
import io
import json
import mmap
import os
from pathlib import Path

import numpy as np
import torch

from pipeline.shards.format import (IMAGE_SHAPE, MAX_HEADER, SAMPLE_BYTES, ShardError, label_error, max_shard_bytes,
                                    read_manifest, zstd)

VERIFY = ("xxh3", "sha256", "none")


def _hasher(verify: str):
    """(manifest key, hash object) for a `verify` mode; xxh3 falls back to sha256 where
    xxhash is not installed (a bare machine with only torch: still verified, just slower)."""
    if verify == "xxh3":
        try:
            import xxhash
        except ImportError:
            return "sha256", hashlib.sha256()
        return "xxh3_128", xxhash.xxh3_128()
    if verify == "sha256":
        return "sha256", hashlib.sha256()
    raise ValueError(f"verify must be one of {VERIFY}, got {verify!r}")


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
    if len(raw) < 8:
        raise ShardError(f"{path}: not a safetensors shard (ends after {len(raw)} bytes)")
    size = int.from_bytes(raw, "little")
    if not 0 < size < MAX_HEADER:
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


ROW_BYTES = {"images": IMAGE_SHAPE[0] * IMAGE_SHAPE[1], "labels": 1}


def _tiles(path: Path, regions: dict[str, tuple[int, int]], count: int):
    """(name, begin, end) in file order, checking the tensors tile the data area with no
    holes (as safetensors requires) and have the sizes the manifest's count implies."""
    position = 0
    for name, (begin, end) in sorted(regions.items(), key=lambda item: item[1]):
        size = count * ROW_BYTES[name]
        if begin != position or end - begin != size:
            raise ShardError(f"{path}: tensor {name!r} at bytes {begin}..{end}, expected {position}..{position + size}")
        yield name, begin, end
        position = end


def _check_frame(path: Path, blob: bytes, count: int) -> None:
    """A zstd shard's frame states its decompressed size: it must be what `count` samples
    take, before anything that size is allocated or decompressed."""
    size = zstd().frame_content_size(blob)
    if size < 0:  # -1: the writer streamed the frame and never said; ours always says
        raise ShardError(f"{path}: zstd frame does not state its decompressed size")
    if not count * SAMPLE_BYTES < size <= max_shard_bytes(count):
        raise ShardError(f"{path}: zstd frame holds {size:,} bytes, not {count:,} samples")


def _skip(stream, size: int, path: Path) -> None:
    scratch = memoryview(bytearray(min(size, 1 << 20)))
    while size:
        step = min(size, scratch.nbytes)
        _readinto(stream, scratch[:step], path)
        size -= step


def _read_zstd(stream, path: Path, count: int, targets: dict[str, torch.Tensor], first: int, stop: int) -> None:
    """Decompress straight into the targets' rows, skipping the rows outside first..stop."""
    _, regions = _read_header(stream, path, count)
    for name, _, _ in _tiles(path, regions, count):
        row = ROW_BYTES[name]
        _skip(stream, first * row, path)
        if stop > first:  # (an empty view cannot be cast to bytes)
            _readinto(stream, memoryview(targets[name].numpy()).cast("B"), path)
        _skip(stream, (count - stop) * row, path)
    if stream.read(1):
        raise ShardError(f"{path}: bytes after the last tensor")


def read_shard_into(folder: Path, entry: dict, compression: str, verify: str,
                    targets: dict[str, torch.Tensor], rows: tuple[int, int] | None = None) -> None:
    """Fill `targets` ("images", "labels": tensors of rows b - a) with rows a..b of one shard
    (all of it by default). The whole file is verified either way; only the rows are copied.

    Uncompressed: the file is memory-mapped, hashed in place and each tensor copied once
    into its slice by torch (multi-threaded), which runs at memory-copy speed; a read()
    into the output ran at half that. zstd: the small file is read, hashed, and
    decompressed as a stream straight into the slices (rows outside a..b are skipped)."""
    count = entry["count"]
    first, stop = rows or (0, count)
    if not 0 <= first <= stop <= count:
        raise ValueError(f"rows {first}..{stop} are outside the shard's 0..{count}")
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
            try:  # (damage not caught by a checksum, verify "none", is seen here)
                _check_frame(path, blob, count)
                _read_zstd(zstd().ZstdDecompressor().stream_reader(io.BytesIO(blob)), path, count, targets,
                           first, stop)
            except zstd().ZstdError as err:
                raise ShardError(f"{path}: corrupt zstd data ({err})") from None
            return
        # ACCESS_COPY: private and writable (nothing is written), so torch takes it without a warning.
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY) as mapped:
            _verify(path, entry, verify, mapped)
            data_start, regions = _read_header(mapped, path, count)
            for name, begin, end in _tiles(path, regions, count):  # two tensors: `end` is the last one's
                row = ROW_BYTES[name]
                source = np.frombuffer(mapped, np.uint8, (stop - first) * row, data_start + begin + first * row)
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
    try:
        images = torch.empty((manifest["count"], *IMAGE_SHAPE), dtype=torch.uint8, pin_memory=pin)
        labels = torch.empty(manifest["count"], dtype=torch.uint8, pin_memory=pin)
    except RuntimeError:  # torch's "can't allocate memory": a count no real split has
        raise ShardError(f"{folder / 'manifest.json'}: count {manifest['count']:,} needs "
                         f"{manifest['count'] * SAMPLE_BYTES / 1e9:,.1f} GB, which cannot be allocated here") from None
    start = 0
    for entry in manifest["shards"]:
        stop = start + entry["count"]
        read_shard_into(folder, entry, compression, verify,
                         {"images": images[start:stop], "labels": labels[start:stop]})
        start = stop
    error = label_error(labels, str(folder))
    if error:
        raise error
    return images.to(device, non_blocking=pin), labels.to(device, non_blocking=pin)  # on the CPU: themselves
