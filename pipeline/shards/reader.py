"""Reading shards back, verified on the way: a whole split into tensors (`read_split`) and
the per-shard primitives every reader shares (opening a shard as a plain file of its stated
size, its safetensors header checked against the manifest's sample schema before a byte is
copied, its digests). `mapped.MappedSplit` reads a split for random access without copying
it; `python benchmarks/shard_load.py` measures each way of loading.
"""

from __future__ import annotations

import errno
import hashlib
import io
import math
import mmap
import os
import stat
from pathlib import Path

import numpy as np
import torch

from pipeline.core.bounded import UnsafeFileError, file_kind, parse_json, plain_descriptor
from pipeline.core.errors import InputError, reason
from pipeline.core.location import is_url
from pipeline.shards.format import (
    DTYPES,
    MAX_HEADER,
    Sample,
    ShardError,
    manifest_sample,
    max_shard_bytes,
    read_manifest,
    zstd,
)

VERIFY = ("xxh3", "sha256", "none")
UNREADABLE = "a readable safetensors header"  # what a header that does not parse is not


def hasher(verify: str):
    """(manifest key, hash object) for a `verify` mode other than "none"."""
    if verify == "xxh3":
        import xxhash

        return "xxh3_128", xxhash.xxh3_128()
    if verify == "sha256":
        return "sha256", hashlib.sha256()
    raise ShardError(f"verify must be one of {VERIFY}, got {verify!r:.40}")


_OPEN = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def _descriptor(path: str, name: str, dir_fd: int | None) -> tuple[int, os.stat_result]:
    """`plain_descriptor` of the shard `name`, opened through the folder's descriptor when
    given (the folder this reader opened, whatever has taken its name since)."""
    if dir_fd is None:
        return plain_descriptor(path)
    try:
        fd = os.open(name, _OPEN, dir_fd=dir_fd)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise UnsafeFileError(f"{path}: a link, not a plain file") from None
        raise
    status = os.fstat(fd)
    if not stat.S_ISREG(status.st_mode):
        os.close(fd)
        raise UnsafeFileError(f"{path}: {file_kind(status.st_mode)}, not a regular file; expected a file here")
    os.set_blocking(fd, True)
    return fd, status


def open_shard(folder: Path | str, entry: dict, dir_fd: int | None = None) -> tuple[str, int, int]:
    """(path, read-only descriptor, size) of a shard that is a plain file in its folder (not a
    link, FIFO or device: the manifest's names are plain names, so it cannot be outside)
    and of the size the manifest states; one message per way it is not (missing,
    unreadable, a link, the wrong size). The caller closes the descriptor. The path is a
    string: a Path per shard cost more than opening the file."""
    path = os.path.join(folder, entry["file"])
    try:
        fd, status = _descriptor(path, entry["file"], dir_fd)
    except FileNotFoundError:
        raise ShardError(f"{path}: shard listed in the manifest is missing") from None
    except UnsafeFileError as err:
        raise ShardError(f"{err}; shards must be plain files in their folder") from None
    except OSError as err:  # mode 000, too many open files, an I/O error
        raise ShardError(f"{path}: cannot be opened ({err.strerror or reason(err)})") from None
    if status.st_size != entry["bytes"]:
        os.close(fd)
        raise ShardError(f"{path}: {status.st_size:,} bytes, manifest says {entry['bytes']:,} (truncated?)")
    return path, fd, status.st_size


def _readinto(source, view: memoryview, path: Path) -> None:
    """Fill `view` from a stream that may return short reads."""
    while view.nbytes:
        got = source.readinto(view)
        if not got:
            raise ShardError(f"{path}: ends early (truncated?)")
        view = view[got:]


def _dtype_name(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def read_header(
    source, path: Path, count: int, targets: dict[str, torch.Tensor]
) -> tuple[int, list[tuple[str, int, int]], dict]:
    """The safetensors header (8-byte little-endian length + JSON), checked against the
    schema the targets carry (a tensor per field: its dtype and [count, *shape]); returns
    the header's length in bytes, the tensors' (name, begin, end) within the data area in
    file order (`_tiles`) and its `__metadata__` ({} when there is none)."""
    raw = source.read(8)
    if len(raw) < 8:
        raise ShardError(f"{path}: not a safetensors shard (ends after {len(raw)} bytes)")
    size = int.from_bytes(raw, "little")
    if not 0 < size < MAX_HEADER:
        raise ShardError(f"{path}: not a safetensors shard (header length {size})")
    try:
        header = parse_json(source.read(size), path, finite=True, expected=UNREADABLE)
    except InputError as err:  # not UTF-8, not JSON, nested too deeply, a key twice, NaN
        raise ShardError(str(err)) from None
    if not isinstance(header, dict):
        raise ShardError(f"{path}: not a safetensors header (JSON {type(header).__name__}, not an object)")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict):
        raise ShardError(f"{path}: the header's __metadata__ is not an object")
    if set(header) - set(targets):
        raise ShardError(
            f"{path}: tensors {sorted(set(header) - set(targets))!r:.80} "
            f"are not fields of the manifest's sample {sorted(targets)}"
        )
    regions = {}
    for name, target in targets.items():
        shape, dtype = [count, *target.shape[1:]], _dtype_name(target)
        info = header.get(name)
        if not isinstance(info, dict):
            raise ShardError(f"{path}: no tensor {name!r}")
        if info.get("dtype") != DTYPES[dtype] or info.get("shape") != shape:
            raise ShardError(
                f"{path}: tensor {name!r} is {info.get('dtype')} {info.get('shape')}, "
                f"expected {DTYPES[dtype]} ({dtype}) {shape}"
            )
        offsets = info.get("data_offsets")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            raise ShardError(f"{path}: tensor {name!r} has no valid data_offsets ({offsets!r})")
        regions[name] = (offsets[0], offsets[1])
    return 8 + size, _tiles(path, regions, count, targets), metadata


def verify_shard(path: Path, entry: dict, verify: str, data) -> None:
    if verify == "none":
        return
    key, digest = hasher(verify)
    digest.update(data)
    if digest.hexdigest() != entry.get(key):
        raise ShardError(f"{path}: checksum mismatch: manifest {key} {entry.get(key)}, file {digest.hexdigest()}")


def _row_bytes(target: torch.Tensor) -> int:
    """Bytes one sample of a field takes (its target's row)."""
    return math.prod(target.shape[1:]) * target.element_size()


def _bytes_of(target: torch.Tensor) -> torch.Tensor:
    """The target's memory as a flat uint8 tensor (a view: writing it fills the target)."""
    return target.reshape(-1).view(torch.uint8)


def _tiles(
    path: Path, regions: dict[str, tuple[int, int]], count: int, targets: dict[str, torch.Tensor]
) -> list[tuple[str, int, int]]:
    """(name, begin, end) in file order, checking the tensors tile the data area with no
    holes (as safetensors requires) and have the sizes the manifest's count implies."""
    position, tiles = 0, []
    for name, (begin, end) in sorted(regions.items(), key=lambda item: item[1]):
        size = count * _row_bytes(targets[name])
        if begin != position or end - begin != size:
            raise ShardError(f"{path}: tensor {name!r} at bytes {begin}..{end}, expected {position}..{position + size}")
        tiles.append((name, begin, end))
        position = end
    return tiles


def _check_frame(path: Path, blob: bytes, count: int, row_bytes: int) -> None:
    """A zstd shard's frame states its decompressed size: it must be what `count` samples
    of `row_bytes` take, before anything that size is allocated or decompressed."""
    size = zstd().frame_content_size(blob)
    if size < 0:  # -1: the writer streamed the frame and never said; ours always says
        raise ShardError(f"{path}: zstd frame does not state its decompressed size")
    if not count * row_bytes < size <= max_shard_bytes(count, row_bytes):
        raise ShardError(f"{path}: zstd frame holds {size:,} bytes, not {count:,} samples")


def _skip(stream, size: int, path: Path) -> None:
    scratch = memoryview(bytearray(min(size, 1 << 20)))
    while size:
        step = min(size, scratch.nbytes)
        _readinto(stream, scratch[:step], path)
        size -= step


def _read_zstd(stream, path: Path, count: int, targets: dict[str, torch.Tensor], first: int, stop: int) -> None:
    """Decompress straight into the targets' rows, skipping the rows outside first..stop."""
    _, tiles, _ = read_header(stream, path, count, targets)
    for name, _, _ in tiles:
        row = _row_bytes(targets[name])
        _skip(stream, first * row, path)
        _readinto(stream, memoryview(_bytes_of(targets[name]).numpy()), path)
        _skip(stream, (count - stop) * row, path)
    if stream.read(1):
        raise ShardError(f"{path}: bytes after the last tensor")


def read_shard_into(
    folder: Path,
    entry: dict,
    compression: str,
    verify: str,
    targets: dict[str, torch.Tensor],
    rows: tuple[int, int] | None = None,
    dir_fd: int | None = None,
) -> None:
    """Fill `targets` (one tensor per field of the manifest's sample, b - a rows of its dtype
    and shape: see `allocate`) with rows a..b of one shard (all of it by default). The whole
    file is verified either way; only the rows are copied.

    Uncompressed: the file is memory-mapped, hashed in place and each tensor copied once
    into its slice by torch (multi-threaded); a read() into the output was slower
    (`benchmarks/shard_load.py` compares the ways). zstd: the small file is read, hashed, and
    decompressed as a stream straight into the slices (rows outside a..b are skipped)."""
    count = entry["count"]
    first, stop = rows or (0, count)
    if not 0 <= first <= stop <= count:
        raise ShardError(f"rows {first}..{stop} are outside the shard's 0..{count}")
    path, fd, size = open_shard(folder, entry, dir_fd)
    with open(fd, "rb", buffering=0) as file:
        if compression == "zstd":
            blob = file.read()
            verify_shard(path, entry, verify, blob)
            try:  # (damage not caught by a checksum, verify "none", is seen here)
                _check_frame(path, blob, count, sum(_row_bytes(t) for t in targets.values()))
                _read_zstd(zstd().ZstdDecompressor().stream_reader(io.BytesIO(blob)), path, count, targets, first, stop)
            except zstd().ZstdError as err:
                raise ShardError(f"{path}: corrupt zstd data ({err})") from None
            return
        # ACCESS_COPY: private and writable (nothing is written), so torch takes it without a warning.
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY) as mapped:
            verify_shard(path, entry, verify, mapped)
            data_start, tiles, _ = read_header(mapped, path, count, targets)
            end = 0
            for name, begin, end in tiles:  # `end`: the last tensor's
                row = _row_bytes(targets[name])
                source = np.frombuffer(mapped, np.uint8, (stop - first) * row, data_start + begin + first * row)
                _bytes_of(targets[name]).copy_(torch.from_numpy(source))
                del source  # the map cannot close while an array still points into it
            if data_start + end != size:
                raise ShardError(f"{path}: {size - data_start - end:,} bytes after the last tensor")


def allocate(sample: Sample, count: int, pin: bool = False) -> dict[str, torch.Tensor]:
    """Empty tensors for `count` samples, one per field of `sample` ([count, *shape], its
    dtype), in field order: what `read_shard_into` fills."""
    return {
        f.name: torch.empty((count, *f.shape), dtype=getattr(torch, f.dtype), pin_memory=pin) for f in sample.fields
    }


def check_classes(sample: Sample, columns: dict[str, torch.Tensor], where: str, ids=None) -> None:
    """Every class-label field's values within its classes, or a ShardError naming `where`,
    the field and the sample (its index in the split: `ids[i]` when given)."""
    for field in sample.fields:
        index = field.first_bad(columns[field.name])
        if index is not None:
            sample_id = index if ids is None else int(ids[index])
            field.check_classes(columns[field.name][index : index + 1], where, sample_id)


def torch_device(device) -> torch.device:
    """`device` (a torch.device, a name such as "cpu", "cuda" or "cuda:1", or an accelerator's
    index, as torch takes it) as a torch.device, or a ShardError naming the argument: "gpu"
    is not a device torch knows."""
    if isinstance(device, torch.device):
        return device
    if type(device) is int and device >= 0:
        return torch.device(device)
    if not isinstance(device, str):
        raise ShardError(
            f"device must be a torch device or its name (such as 'cpu' or 'cuda:0'), "
            f"got {type(device).__name__} {device!r:.40}"
        )
    try:
        return torch.device(device)
    except RuntimeError:  # torch's list of every device type it knows, over several lines
        raise ShardError(f"device {device!r:.40} is not a torch device (such as 'cpu', 'cuda' or 'cuda:1')") from None


def read_split(
    path: Path,
    device: str | torch.device = "cpu",
    *,
    dataset: str | None = None,
    split: str | None = None,
    verify: str = "xxh3",
) -> dict[str, torch.Tensor]:
    """The whole split as {field: tensor [n, *shape] of its dtype} on `device`, in the
    manifest's field order.

    verify: "xxh3" (default; the mapped file is hashed in place), "sha256" (the cryptographic
    digest, several times slower), or "none". Sizes, tensor names, dtypes,
    shapes, counts and class labels are always checked. For CUDA the split is read straight
    into pinned memory, then copied to the device asynchronously.
    """
    if not isinstance(path, str | os.PathLike):
        raise ShardError(f"path must be a shard folder (str or pathlib.Path), got {type(path).__name__}")
    if is_url(path):
        raise ShardError(
            f"{path}: read_split reads a local folder; a split at a URL is read with ShardDataset(url, cache=...)"
        )
    if not isinstance(verify, str) or verify not in VERIFY:
        raise ShardError(f"verify must be one of {VERIFY}, got {verify!r:.40}")
    device = torch_device(device)
    folder = Path(path)
    manifest = read_manifest(folder, dataset, split)
    sample = manifest_sample(manifest)
    compression = manifest["compression"]["codec"]
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ShardError(f"{folder}: device {device} asked for, but torch sees no CUDA device here")
    pin = device.type == "cuda"
    try:
        columns = allocate(sample, manifest["count"], pin)
    except RuntimeError:  # torch's "can't allocate memory": a count no real split has
        raise ShardError(
            f"{folder / 'manifest.json'}: count {manifest['count']:,} needs "
            f"{manifest['count'] * sample.row_bytes / 1e9:,.1f} GB, which cannot be allocated here"
        ) from None
    start = 0
    for entry in manifest["shards"]:
        stop = start + entry["count"]
        read_shard_into(folder, entry, compression, verify, {name: t[start:stop] for name, t in columns.items()})
        start = stop
    check_classes(sample, columns, str(folder))
    return {name: t.to(device, non_blocking=pin) for name, t in columns.items()}  # on the CPU: themselves
