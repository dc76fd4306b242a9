"""Reading shards back, verified on the way: a whole split into tensors (`read_split`,
`load_split`), rows of one shard (`read_shard_into`, for the ranks), or a split mapped
for random access without a copy (`MappedSplit`, behind `ShardDataset`, verified block by
block as batches touch them).

What each shard must hold comes from the manifest's sample schema: the reader allocates one
tensor per field, of its dtype and [count, *shape], and checks every shard's safetensors
header against those (names, dtypes, shapes, offsets) before copying a byte.

Loading memory-maps each shard, hashes it in place with xxh3 and copies each tensor once
into its place in the output. sha256 stays in the manifest for `sha256sum`-style checks and
`verify="sha256"`. How fast each way loads, next to a plain memory copy of the same bytes,
depends on the machine: `python benchmarks/shard_load.py` measures it, and docs/results.md
shows the recorded runs.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import mmap
import os
from pathlib import Path

import numpy as np
import torch

from pipeline.core.bounded import UnsafeFileError, plain_descriptor
from pipeline.core.host import physical_memory
from pipeline.shards.format import (DTYPES, MAX_HEADER, Sample, ShardError, blocks_in, manifest_sample,
                                    max_shard_bytes, read_manifest, zstd)

VERIFY = ("xxh3", "sha256", "none")

try:  # loaded with the module rather than by a first batch (a millisecond); optional (`_xxh3_64`)
    import xxhash  # noqa: F401
except ImportError:
    pass


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


def _open_shard(folder: Path | str, entry: dict) -> tuple[str, int, int]:
    """(path, read-only descriptor, size) of a shard that is a plain file in its folder (not a
    link, FIFO or device: the manifest's names are plain names, so it cannot be outside)
    and of the size the manifest states; one message per way it is not. The caller closes
    the descriptor. The path is a string: a Path per shard cost more than opening the file."""
    path = os.path.join(folder, entry["file"])
    try:
        fd, status = plain_descriptor(path)
    except FileNotFoundError:
        raise ShardError(f"{path}: shard listed in the manifest is missing") from None
    except UnsafeFileError as err:
        raise ShardError(f"{err}; shards must be plain files in their folder") from None
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


def _read_header(source, path: Path, count: int, targets: dict[str, torch.Tensor],
                 known: dict | None = None) -> tuple[int, list[tuple[str, int, int]], dict]:
    """The safetensors header (8-byte little-endian length + JSON), checked against the
    schema the targets carry (a tensor per field: its dtype and [count, *shape]); returns
    the header's length in bytes, the tensors' (name, begin, end) within the data area in
    file order (`_tiles`) and its `__metadata__` ({} when there is none). `known` (a dict the
    caller keeps across the shards of a split) remembers the tensor entries already checked
    for a count: a split's headers differ only in their metadata, so they are checked once
    per split, and each shard's are compared with them."""
    raw = source.read(8)
    if len(raw) < 8:
        raise ShardError(f"{path}: not a safetensors shard (ends after {len(raw)} bytes)")
    size = int.from_bytes(raw, "little")
    if not 0 < size < MAX_HEADER:
        raise ShardError(f"{path}: not a safetensors shard (header length {size})")
    try:
        header = _json(source.read(size))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ShardError(f"{path}: not a readable safetensors header ({err})") from None
    if not isinstance(header, dict):
        raise ShardError(f"{path}: not a safetensors header (JSON {type(header).__name__}, not an object)")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict):
        raise ShardError(f"{path}: the header's __metadata__ is not an object")
    if known is not None and count in known and known[count][0] == header:
        return 8 + size, known[count][1], metadata
    if set(header) - set(targets):
        raise ShardError(f"{path}: tensors {sorted(set(header) - set(targets))!r:.80} "
                         f"are not fields of the manifest's sample {sorted(targets)}")
    regions = {}
    for name, target in targets.items():
        shape, dtype = [count, *target.shape[1:]], _dtype_name(target)
        info = header.get(name)
        if not isinstance(info, dict):
            raise ShardError(f"{path}: no tensor {name!r}")
        if info.get("dtype") != DTYPES[dtype] or info.get("shape") != shape:
            raise ShardError(f"{path}: tensor {name!r} is {info.get('dtype')} {info.get('shape')}, "
                             f"expected {DTYPES[dtype]} ({dtype}) {shape}")
        offsets = info.get("data_offsets")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            raise ShardError(f"{path}: tensor {name!r} has no valid data_offsets ({offsets!r})")
        regions[name] = (offsets[0], offsets[1])
    tiles = _tiles(path, regions, count, targets)
    if known is not None:
        known[count] = (header, tiles)
    return 8 + size, tiles, metadata


def _json(raw: bytes):
    """`json.loads` of a header with its trailing padding compared rather than scanned: a
    block-verified shard's header is padded with spaces to 16 KiB (`DATA_ALIGN`); json.loads
    would match them with a regex, and `bytes.rstrip(b" ")` walks them byte by byte (20-30 us
    a shard either way, milliseconds before the first batch of a 100-shard split). Other
    padding (any JSON whitespace) or damage goes to json.loads whole."""
    end = raw.rfind(b"}") + 1 or len(raw)
    if raw[end:] == b" " * (len(raw) - end):
        return json.loads(raw[:end].decode())
    return json.loads(raw.decode())


def _verify(path: Path, entry: dict, verify: str, data) -> None:
    if verify == "none":
        return
    key, hasher = _hasher(verify)
    hasher.update(data)
    if hasher.hexdigest() != entry.get(key):
        raise ShardError(f"{path}: checksum mismatch: manifest {key} {entry.get(key)}, file {hasher.hexdigest()}")


def _row_bytes(target: torch.Tensor) -> int:
    """Bytes one sample of a field takes (its target's row)."""
    return math.prod(target.shape[1:]) * target.element_size()


def _bytes_of(target: torch.Tensor) -> torch.Tensor:
    """The target's memory as a flat uint8 tensor (a view: writing it fills the target)."""
    return target.reshape(-1).view(torch.uint8)


def _tiles(path: Path, regions: dict[str, tuple[int, int]], count: int,
           targets: dict[str, torch.Tensor]) -> list[tuple[str, int, int]]:
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
    _, tiles, _ = _read_header(stream, path, count, targets)
    for name, _, _ in tiles:
        row = _row_bytes(targets[name])
        _skip(stream, first * row, path)
        if stop > first:  # (an empty view cannot be cast to bytes)
            _readinto(stream, memoryview(_bytes_of(targets[name]).numpy()), path)
        _skip(stream, (count - stop) * row, path)
    if stream.read(1):
        raise ShardError(f"{path}: bytes after the last tensor")


def read_shard_into(folder: Path, entry: dict, compression: str, verify: str,
                    targets: dict[str, torch.Tensor], rows: tuple[int, int] | None = None) -> None:
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
        raise ValueError(f"rows {first}..{stop} are outside the shard's 0..{count}")
    path, fd, size = _open_shard(folder, entry)
    with open(fd, "rb", buffering=0) as file:
        if compression == "zstd":
            blob = file.read()
            _verify(path, entry, verify, blob)
            try:  # (damage not caught by a checksum, verify "none", is seen here)
                _check_frame(path, blob, count, sum(_row_bytes(t) for t in targets.values()))
                _read_zstd(zstd().ZstdDecompressor().stream_reader(io.BytesIO(blob)), path, count, targets,
                           first, stop)
            except zstd().ZstdError as err:
                raise ShardError(f"{path}: corrupt zstd data ({err})") from None
            return
        # ACCESS_COPY: private and writable (nothing is written), so torch takes it without a warning.
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY) as mapped:
            _verify(path, entry, verify, mapped)
            data_start, tiles, _ = _read_header(mapped, path, count, targets)
            end = 0
            for name, begin, end in tiles:  # `end`: the last tensor's
                row = _row_bytes(targets[name])
                source = np.frombuffer(mapped, np.uint8, (stop - first) * row, data_start + begin + first * row)
                _bytes_of(targets[name]).copy_(torch.from_numpy(source))
                del source  # the map cannot close while an array still points into it
            if data_start + end != size:
                raise ShardError(f"{path}: {size - data_start - end:,} bytes after the last tensor")


def default_join_limit() -> int:
    """A quarter of this machine's physical memory (2 GiB where it cannot be read): the
    largest split `MappedSplit` copies into one array per field unless told otherwise, so
    that a split near or over the memory stays mapped instead of being copied whole."""
    memory = physical_memory()
    return memory // 4 if memory else 2 << 30


def allocate(sample: Sample, count: int, pin: bool = False) -> dict[str, torch.Tensor]:
    """Empty tensors for `count` samples, one per field of `sample` ([count, *shape], its
    dtype), in field order: what `read_shard_into` fills."""
    return {f.name: torch.empty((count, *f.shape), dtype=getattr(torch, f.dtype), pin_memory=pin)
            for f in sample.fields}


def check_classes(sample: Sample, columns: dict[str, torch.Tensor], where: str, ids=None) -> None:
    """Every class-label field's values within its classes, or a ShardError naming `where`,
    the field and the sample (its index in the split: `ids[i]` when given)."""
    for field in sample.fields:
        index = field.first_bad(columns[field.name])
        if index is not None:
            sample_id = index if ids is None else int(ids[index])
            field.check_classes(columns[field.name][index : index + 1], where, sample_id)


def read_split(path: Path, device: str | torch.device = "cpu", *, dataset: str | None = None,
               split: str | None = None, verify: str = "xxh3") -> dict[str, torch.Tensor]:
    """The whole split as {field: tensor [n, *shape] of its dtype} on `device`, in the
    manifest's field order.

    verify: "xxh3" (default; the mapped file is hashed in place, about a fifth of the load time),
    "sha256" (the cryptographic digest, ~1 GB/s), or "none". Sizes, tensor names, dtypes,
    shapes, counts and class labels are always checked. For CUDA the split is read straight
    into pinned memory, then copied to the device asynchronously.
    """
    if verify not in VERIFY:
        raise ValueError(f"verify must be one of {VERIFY}, got {verify!r}")
    folder = Path(path)
    manifest = read_manifest(folder, dataset, split)
    sample = manifest_sample(manifest)
    compression = manifest["compression"]["codec"]
    device = torch.device(device)
    pin = device.type == "cuda"
    try:
        columns = allocate(sample, manifest["count"], pin)
    except RuntimeError:  # torch's "can't allocate memory": a count no real split has
        raise ShardError(f"{folder / 'manifest.json'}: count {manifest['count']:,} needs "
                         f"{manifest['count'] * sample.row_bytes / 1e9:,.1f} GB, which cannot be allocated here") from None
    start = 0
    for entry in manifest["shards"]:
        stop = start + entry["count"]
        read_shard_into(folder, entry, compression, verify, {name: t[start:stop] for name, t in columns.items()})
        start = stop
    check_classes(sample, columns, str(folder))
    return {name: t.to(device, non_blocking=pin) for name, t in columns.items()}  # on the CPU: themselves


def load_split(path: Path, device: str | torch.device = "cpu", *, dataset: str | None = None,
               split: str | None = None, verify: str = "xxh3") -> tuple[torch.Tensor, ...]:
    """`read_split`'s tensors as a tuple in field order: for MNIST's schema (images uint8
    [n, 28, 28], labels uint8 [n])."""
    return tuple(read_split(path, device, dataset=dataset, split=split, verify=verify).values())


def _xxh3_64():
    """xxhash's one-shot xxh3-64 digest, or None where xxhash is not installed (then shards
    are verified whole, with sha256)."""
    try:
        from xxhash import xxh3_64_digest
    except ImportError:
        return None
    return xxh3_64_digest


class Blocks:
    """The block digests of a split's mapped uncompressed shards (format version 4) and which
    blocks are verified so far, in one array over the split: `check_rows` finds the blocks a
    batch's samples lie in with a few numpy operations and hashes only those not yet
    verified, so a split is hashed at most once however its batches are drawn."""

    def __init__(self, block: int, hash_fn, row_bytes: list[int]) -> None:
        self.block, self.hash = block, hash_fn
        self.paths: list[Path] = []
        self.views: list[memoryview] = []
        self.digests: list[bytes] = []
        self.starts = [0]                      # the split-wide number of each shard's first block
        self.offsets: list[list[int]] = []     # per shard: where each field's first row is in the data area
        self.row_bytes = row_bytes             # per field
        self.done = np.zeros(0, bool)
        self.complete = False

    def add(self, path: Path, data: memoryview, digests: str, offsets: list[int]) -> None:
        """A shard's data area (what follows its header), the hex digests of its blocks and
        where each field's first row lies in the data area."""
        self.paths.append(path)
        self.views.append(data)
        self.digests.append(bytes.fromhex(digests))
        self.starts.append(self.starts[-1] + len(self.digests[-1]) // 8)
        self.offsets.append(offsets)

    def ready(self) -> None:
        """Every shard added: nothing verified yet."""
        self.done = np.zeros(self.starts[-1], bool)

    def _check(self, shard: int, number: int) -> None:
        if self.done[self.starts[shard] + number]:
            return
        begin = number * self.block
        end = min(begin + self.block, self.views[shard].nbytes)
        got, wanted = self.hash(self.views[shard][begin:end]), self.digests[shard][8 * number : 8 * number + 8]
        if got != wanted:
            raise ShardError(f"{self.paths[shard]}: checksum mismatch in block {number} (bytes {begin:,}..{end:,} "
                             f"after the header): header xxh3_64 {wanted.hex()}, file {got.hex()}")
        self.done[self.starts[shard] + number] = True

    def check_shard(self, shard: int) -> None:
        for number in range(self.starts[shard + 1] - self.starts[shard]):
            self._check(shard, number)

    def release(self, shard: int) -> None:
        """Let go of a verified shard's map (so that, once its arrays are gone too, it is
        unmapped and its pages leave this process's memory)."""
        self.views[shard] = memoryview(b"")

    def check_rows(self, shards: np.ndarray, rows: np.ndarray) -> None:
        """Verify every block the samples at (`shards`, `rows`) lie in (a row number in its
        shard), or raise a ShardError naming the file and the bad block."""
        if self.complete or not len(rows):
            return
        offsets, starts = np.asarray(self.offsets, np.int64)[shards], np.asarray(self.starts, np.int64)[shards]
        touched = []
        for field, row in enumerate(self.row_bytes):
            first = offsets[:, field] + rows * row
            last = (first + row - 1) // self.block
            first //= self.block
            if row <= self.block:  # a row spans at most two blocks
                touched += [starts + first, starts + last]
            else:
                touched += [np.arange(s + a, s + b + 1) for s, a, b in zip(starts, first, last)]
        wanted = np.concatenate(touched)
        todo = np.sort(wanted[~self.done[wanted]])
        todo = todo[np.concatenate(([True], todo[1:] != todo[:-1]))] if len(todo) else todo  # (np.unique's first
        # call imports numpy.ma: 9 ms before a first batch)
        if len(todo):
            owners = np.searchsorted(self.starts, todo, side="right") - 1
            hash_fn, block, views, digests, done = self.hash, self.block, self.views, self.digests, self.done
            for number, shard in zip(todo.tolist(), owners.tolist()):  # (the hot loop of a first batch: inlined)
                local = number - self.starts[shard]
                if hash_fn(views[shard][local * block : (local + 1) * block]) != digests[shard][8 * local : 8 * local + 8]:
                    self._check(shard, local)  # raises, naming the block
                done[number] = True
            self.complete = bool(self.done.all())


class _Layout:
    """What each shard of a split is checked against, built once per split: the sample's
    fields as empty tensors (their dtypes and shapes, for `_read_header`) and the header
    entries already found right, per shard count (`_read_header`'s `known`)."""

    def __init__(self, sample: Sample) -> None:
        self.sample, self.templates, self.known = sample, allocate(sample, 0), {}
        self.names = sample.names
        self.fields = {f.name: (np.dtype(f.dtype), math.prod(f.shape), f.shape) for f in sample.fields}


def _map(folder: Path, entry: dict, layout: _Layout, verify: str, blocks: Blocks | None = None) -> dict[str, np.ndarray]:
    """One uncompressed shard's fields as read-only numpy arrays over a memory map of the file
    (no copy, and the pages are the page cache's, shared by every process that maps them),
    after the checks `read_shard_into` runs (size, digest, header against the schema). With
    `blocks`, the file is not hashed whole: its header is checked against the manifest's
    `header_xxh3_64` before it is parsed, and its data area is added to `blocks` with the
    block digests the header lists, to be verified as batches touch it."""
    count = entry["count"]
    path, fd, size = _open_shard(folder, entry)
    try:
        head = _head(fd, size) if blocks is not None else b""
        mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)  # stays open while an array uses it
    finally:
        os.close(fd)
    if blocks is None:
        _verify(path, entry, verify, mapped)
        source = mapped
    else:
        _verify_header(path, entry, head, blocks.hash)
        source = io.BytesIO(head)
    data_start, tiles, metadata = _read_header(source, path, count, layout.templates, layout.known)
    end = 0
    columns = {}
    for name, begin, end in tiles:
        dtype, items, shape = layout.fields[name]
        columns[name] = np.frombuffer(mapped, dtype, count * items, data_start + begin).reshape(count, *shape)
    if data_start + end != size:
        raise ShardError(f"{path}: {size - data_start - end:,} bytes after the last tensor")
    if blocks is not None:
        digests = metadata.get("xxh3_64_blocks")
        wanted = 16 * blocks_in(size - data_start, blocks.block)
        if not (isinstance(digests, str) and len(digests) == wanted):
            raise ShardError(f"{path}: the header lists no {wanted // 16} block digests (xxh3_64_blocks)")
        begins = {name: begin for name, begin, _ in tiles}
        try:
            blocks.add(path, memoryview(mapped)[data_start:], digests, [begins[name] for name in layout.names])
        except ValueError:
            raise ShardError(f"{path}: the header's block digests are not hex") from None
    return {name: columns[name] for name in layout.names}


def _head(fd: int, size: int, first: int = 1 << 14) -> bytes:
    """A shard's header as stored (8-byte length and JSON, at most 8 + MAX_HEADER bytes and
    the file's size), read with pread rather than through the map: a page fault costs more
    than the copy, and the header is read once."""
    head = os.pread(fd, min(size, first), 0)
    declared = int.from_bytes(head[:8], "little") if len(head) >= 8 else 0
    wanted = min(8 + min(declared, MAX_HEADER), size)
    if wanted > len(head):
        head += os.pread(fd, wanted - len(head), len(head))
    return head[:wanted]


def _verify_header(path: Path, entry: dict, head: bytes, hash_fn) -> None:
    """The header (`_head`) against the manifest's digest of it, before a byte of it is parsed."""
    got = hash_fn(head).hex()
    if got != entry["header_xxh3_64"]:
        raise ShardError(f"{path}: header checksum mismatch: manifest header_xxh3_64 {entry['header_xxh3_64']}, "
                         f"file {got}")


def _map_shards(folder: Path, entries: list[dict], sample: Sample, verify: str) -> list[dict[str, np.ndarray]]:
    """`_map` of every entry, verified whole, class labels checked. One thread: hashing the maps on two
    threads was slower here (the page faults serialise in the kernel), and so was
    MAP_POPULATE (measured at 600,000 samples, 2 cores)."""
    chunks, start, layout = [], 0, _Layout(sample)
    for entry in entries:
        chunk = _map(folder, entry, layout, verify)
        check_classes(sample, chunk, str(folder), ids=range(start, start + entry["count"]))
        chunks.append(chunk)
        start += entry["count"]
    return chunks


class MappedSplit:
    """A split for random access on the CPU: uncompressed shards memory-mapped (no copy:
    memory is the page cache's), zstd shards decompressed into memory. `take(indices)`
    gathers a batch with numpy, one thread: on a busy host torch's intra-op threads contend
    for the cores.

    Verified as it is used (`verify="xxh3"`, format version 4, xxhash installed): opening
    reads the manifest; `prepare()` or the first batch maps the shards, checking sizes and
    headers only; each batch first verifies the blocks (16 KiB; larger in shards over 512 MiB)
    its samples lie in, so the first batch comes after hashing a few MB, not the whole split;
    from the second batch on a thread verifies the rest and joins the shards into one array
    per field, if the split's data fit in `join_limit` bytes (default: a quarter of this
    machine's memory, `default_join_limit`). A larger split stays mapped: its batches are
    gathered shard by shard (the page cache keeps what fits) and its blocks verified as
    batches touch them, so it is never read whole unless `wait()` asks. Otherwise
    (`verify="sha256"`, older manifests, no xxhash) every shard is hashed whole on opening.
    A damaged shard raises a ShardError naming the file from the batch that touches it, or from the first batch after the thread found it, and every use after that;
    `wait()` waits for the thread and raises then.

    Pickled (DataLoader workers under spawn/forkserver), it carries only its path: a worker
    maps the files again, checking sizes and headers, and verifies what the parent had not."""

    def __init__(self, path: Path, *, dataset: str | None = None, split: str | None = None,
                 verify: str = "xxh3", join_limit: int | None = None) -> None:
        if verify not in VERIFY:
            raise ValueError(f"verify must be one of {VERIFY}, got {verify!r}")
        if join_limit is not None and (type(join_limit) is not int or join_limit < 0):
            raise ValueError(f"join_limit must be a number of bytes (0 or more), got {join_limit!r}")
        self.folder, self.dataset, self.split, self.verify = Path(path), dataset, split, verify
        self.join_limit = default_join_limit() if join_limit is None else join_limit
        self._open(verify)

    @property
    def joins(self) -> bool:
        """Whether batches after the first are gathered from one copy of the split (its data
        fit in `join_limit`) rather than from the mapped shards."""
        return self.count * self.sample.row_bytes <= self.join_limit

    def _open(self, verify: str) -> None:
        manifest = read_manifest(self.folder, self.dataset, self.split)
        self.sample = manifest_sample(manifest)
        self.count: int = manifest["count"]
        self.blocks: Blocks | None = None
        self.whole: dict[str, np.ndarray] | None = None
        self._failure: Exception | None = None
        self._thread = None
        self.chunks: list[dict[str, np.ndarray]] = []
        self._unmapped: tuple[list[dict], str] | None = None  # (shard entries, verify) until `prepare` maps them
        self._owner: int | None = None  # the process whose thread joins the shards (started by the second batch)
        self._served = False            # a batch was taken in this process
        hash_fn = _xxh3_64() if verify == "xxh3" and manifest["block_bytes"] else None
        if manifest["compression"]["codec"] == "zstd":  # decompressed whole, into one chunk
            loaded = read_split(self.folder, verify=verify)
            if self.count:
                self.chunks, counts = [{name: t.numpy() for name, t in loaded.items()}], [self.count]
            else:
                counts = []
        else:
            counts = [entry["count"] for entry in manifest["shards"]]
            if hash_fn is not None:  # mapped by the first batch (or `prepare`), into a Blocks like this one
                self.blocks = Blocks(manifest["block_bytes"], hash_fn, [f.row_bytes for f in self.sample.fields])
                self._unmapped = (manifest["shards"], verify)
            else:
                self.chunks = _map_shards(self.folder, manifest["shards"], self.sample, verify)
        self.ends = np.cumsum(counts, dtype=np.int64)
        if len(self.chunks) == 1 and self.blocks is None:
            self.whole = self.chunks[0]

    def prepare(self) -> None:
        """Map the shards and check their sizes and headers now, if not done yet (the first
        `take` does it otherwise), and raise what is wrong with the split. `ShardDataset.loader`
        calls it before its first batch (`IndexBatches`' `meanwhile`)."""
        if self._unmapped is not None:
            entries, verify = self._unmapped
            layout, blocks = _Layout(self.sample), Blocks(self.blocks.block, self.blocks.hash, self.blocks.row_bytes)
            try:
                chunks = [_map(self.folder, entry, layout, verify, blocks) for entry in entries]
            except Exception as err:  # noqa: BLE001 - the split stays refused
                self._failure = err
            else:
                blocks.ready()
                self.chunks, self.blocks = chunks, blocks
            self._unmapped = None
        if self._failure is not None:
            raise self._failure

    def _joining(self) -> None:
        """Start the join in this process unless it runs here already, or the split is over
        `join_limit`: from the second batch on (the first has both cores to itself), and again
        in a worker forked before it ended."""
        if self.whole is None and self.chunks and self._owner != os.getpid() and self.joins:
            self._join_in_background()

    def _join_in_background(self) -> None:
        """Verify what is not verified yet and copy the mapped shards into one array per field
        on a thread (numpy copies and xxhash release the GIL), so that batches are one gather
        instead of one per shard; until it is done (a few tens of ms for MNIST) batches are
        gathered shard by shard, so no batch waits for the copy. Each shard,
        once copied, is swapped for its rows of the copy, which unmaps the file: its pages
        leave this process's resident memory (they stay in the page cache), so the split is
        held about once, not twice, at any moment. A failure is kept for `take` to raise."""
        import threading

        self._owner = os.getpid()
        self._thread = threading.Thread(target=self._settle, args=(len(self.chunks) > 1,), name="shards-join",
                                        daemon=True)
        self._thread.start()

    def _settle(self, join: bool) -> None:
        """Verify every shard not verified yet (blocks and class labels) and, if `join`, copy
        the shards into one array per field, swapping each shard for its rows of the copy. A
        failure is kept for `take` to raise."""
        try:
            whole = {f.name: np.empty((self.count, *f.shape), f.dtype) for f in self.sample.fields} if join else None
            start = 0
            for number, chunk in enumerate(self.chunks):
                n = len(next(iter(chunk.values())))
                if self.blocks is not None and not self.blocks.complete:
                    self.blocks.check_shard(number)
                    check_classes(self.sample, chunk, str(self.folder), ids=range(start, start + n))
                if whole is not None:
                    for name, values in chunk.items():
                        whole[name][start : start + n] = values
                    self.chunks[number] = {name: whole[name][start : start + n] for name in chunk}
                    if self.blocks is not None:
                        self.blocks.release(number)
                start += n
            if self.blocks is not None:
                self.blocks.complete = True
            if whole is not None or len(self.chunks) == 1:
                self.whole = whole if whole is not None else self.chunks[0]
        except Exception as err:  # noqa: BLE001 - raised again by the next take()
            self._failure = err

    def wait(self) -> None:
        """Wait until every shard is verified (and joined, within `join_limit`); raise what
        the check found. A split over the limit is verified here, on this thread."""
        self.prepare()
        self._joining()
        if not self.joins and self._failure is None and self.blocks is not None and not self.blocks.complete:
            self._settle(join=False)
        if self._thread is not None:
            self._thread.join()
        if self._failure is not None:
            raise self._failure

    def __getstate__(self) -> dict:
        state = {key: value for key, value in self.__dict__.items()
                 if key not in ("chunks", "ends", "whole", "blocks", "_failure", "_thread", "_unmapped", "_served")}
        verified = self._failure is None and (self.blocks is None or self.blocks.complete)
        state["_worker_verify"] = "none" if verified else self.verify  # what this process has not verified
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._open(state.pop("_worker_verify", "none"))

    def __len__(self) -> int:
        return self.count

    def take(self, indices) -> dict[str, np.ndarray]:
        """The samples at `indices` (ints, negative from the end), a copy per field [b, *shape]."""
        index = np.asarray(indices, dtype=np.int64)
        if index.ndim != 1:
            raise IndexError(f"expected a sequence of sample indices, got shape {list(index.shape)}")
        if len(index) and (index.min() < -self.count or index.max() >= self.count):
            raise IndexError(f"sample index out of range 0..{self.count - 1}")
        index = np.where(index < 0, index + self.count, index)
        self.prepare()
        if self._served:
            self._joining()
        self._served = True
        whole = self.whole
        if whole is not None:
            return {name: np.take(values, index, axis=0) for name, values in whole.items()}
        shard = np.searchsorted(self.ends, index, side="right")
        if self.blocks is not None:
            self.blocks.check_rows(shard, index - np.concatenate(([0], self.ends))[shard])
        order = np.argsort(shard, kind="stable")
        bounds = np.searchsorted(shard[order], np.arange(len(self.chunks) + 1))
        out = {f.name: np.empty((len(index), *f.shape), f.dtype) for f in self.sample.fields}
        for number, chunk in enumerate(self.chunks):
            picked = order[bounds[number] : bounds[number + 1]]
            if len(picked):
                rows = index[picked] - (self.ends[number - 1] if number else 0)
                for name, values in chunk.items():
                    out[name][picked] = np.take(values, rows, axis=0)
        if self.blocks is not None:
            check_classes(self.sample, out, str(self.folder), ids=index)
        return out

    def column(self, name: str) -> np.ndarray:
        """One field of the whole split as one array (a copy when there are several shards)."""
        self.prepare()
        if self.whole is not None:
            return self.whole[name]
        parts = [chunk[name] for chunk in self.chunks]
        if len(parts) == 1:
            return parts[0]
        if not parts:
            field = self.sample[name]
            return np.empty((0, *field.shape), field.dtype)
        return np.concatenate(parts)

