"""A split read for random access without copying it: each uncompressed shard memory-mapped
and gathered from in place, verified block by block as batches touch it.

Every process reads through maps (the kernel's shared page cache), their number and bytes
bounded by policy (`process_max_open`, `max_open`, `max_resident`), and a split never feeds
new bytes under the manifest it was opened with: docs/shards.md ("Read it") gives each rule.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import resource
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.core.bounded import UnsafeFileError, plain_descriptor
from pipeline.core.errors import reason
from pipeline.core.location import is_url
from pipeline.shards.format import (
    MAX_HEADER,
    ShardError,
    ShardIndexError,
    ShardTypeError,
    blocks_in,
    check_identity,
    manifest_sample,
    read_manifest,
)
from pipeline.shards.reader import (
    VERIFY,
    allocate,
    check_classes,
    open_shard,
    read_header,
    read_shard_into,
    verify_shard,
)
from pipeline.shards.remote import RemoteShards

MAX_FLAGS = 1 << 30  # verified-block flags of one split: 16 TiB of data at the smallest block


@dataclass
class MappedShard:
    """One uncompressed shard: its fields as read-only arrays over a map of the file, and,
    where the header lists block digests, which of its blocks are verified so far. A shard
    whose map was closed (`close_map`) keeps its verified blocks and the identity of its
    file, and is mapped again when next used."""

    path: str
    columns: dict[str, np.ndarray]
    mapped: mmap.mmap | None = None
    view: memoryview | None = None  # the data area (after the header), hashed block by block
    digests: bytes = b""  # 8 bytes per block, from the header
    done: np.ndarray | None = None  # verified blocks
    offsets: tuple[int, ...] = ()  # per field: where its first row lies in the data area
    block: int = 0
    fd: int | None = None  # read with pread instead of the map (the caller asked for pread)
    data_start: int = 0  # where the data area starts in the file
    identity: tuple[int, ...] | None = None  # (st_dev, st_ino, st_size, st_mtime_ns) of the file mapped
    size: int = 0  # bytes the manifest states

    @property
    def is_open(self) -> bool:
        """Whether the shard can be read now (mapped, or held in memory: a zstd shard)."""
        return self.mapped is not None or (self.identity is None and bool(self.columns))

    def check_size(self) -> None:
        """The file still has the size the manifest states (read through a map, a truncated
        file kills the process with SIGBUS; this names a truncation made before it, and
        narrows the window for one made during a read, which it cannot close)."""
        if self.mapped is None:
            return
        try:
            now = self.mapped.size() if self.fd is None else os.fstat(self.fd).st_size
        except (OSError, ValueError) as err:
            raise ShardError(f"{self.path}: cannot be read any more ({reason(err)})") from None
        if now != self.size:
            raise ShardError(
                f"{self.path}: {now:,} bytes now, manifest says {self.size:,} (truncated or rewritten while open?)"
            )

    def _block(self, number: int) -> bytes | memoryview:
        begin = number * self.block
        if self.fd is None:
            return self.view[begin : begin + self.block]
        return os.pread(self.fd, self.block, self.data_start + begin)

    def check_block(self, number: int) -> None:
        """Verify block `number` against the header's digest and mark it done, or raise a
        ShardError naming the file, the block and its bytes."""
        data = self._block(number)
        begin, end = number * self.block, number * self.block + len(data)
        got, expected = _xxh3_64(data), self.digests[8 * number : 8 * number + 8]
        if got != expected:
            raise ShardError(
                f"{self.path}: checksum mismatch in block {number} (bytes {begin:,}..{end:,} after "
                f"the header): header xxh3_64 {expected.hex()}, file {got.hex()}"
            )
        self.done[number] = True

    def check_all(self) -> int:
        """Verify every block not verified yet; how many that was."""
        todo = [] if self.done is None else np.flatnonzero(~self.done).tolist()
        if todo:
            self.check_size()
        for number in todo:
            self.check_block(number)
        return len(todo)

    def let_go(self) -> None:
        """Drop this process's pages of the map (the page cache keeps them)."""
        if self.mapped is not None:
            self.mapped.madvise(mmap.MADV_DONTNEED)

    def use_pread(self) -> None:
        """Read this shard with pread from now on: the file mapped is opened again (by its path,
        refused unless it is the same file) and this process's pages of the map let go. Where it
        cannot be opened again, or is another file now, the map stays in use: it holds the file
        that was checked."""
        if self.fd is not None or self.mapped is None or self.identity is None:
            return
        try:
            fd, status = plain_descriptor(Path(self.path))
        except (OSError, UnsafeFileError):
            return
        if _file_identity(status) != self.identity:
            os.close(fd)
            return
        self.fd = fd
        self.let_go()

    def read_rows(self, rows: np.ndarray, row_bytes: list[int], start: int, out: dict[str, np.ndarray]) -> None:
        """Rows `rows` of every field into `out` from slot `start` on, read from the file with
        pread: nothing of the file is mapped into this process."""
        for (name, target), offset, size in zip(out.items(), self.offsets, row_bytes):
            flat = target.reshape(len(target), -1).view(np.uint8)
            begin = self.data_start + offset
            for slot, row in enumerate(rows.tolist(), start):
                if os.preadv(self.fd, [memoryview(flat[slot])], begin + row * size) != size:
                    raise ShardError(f"{self.path}: ends early (changed since it was opened?)")

    def close_map(self) -> None:
        """Close the map and the descriptor (what bounds a process's maps and descriptors);
        the verified blocks and the file's identity stay for when it is mapped again."""
        self.columns, self.view = {}, None
        mapped, self.mapped = self.mapped, None
        if mapped is not None:
            try:
                mapped.close()
            except BufferError:  # an array over it is still referenced somewhere: the collector closes it
                pass
        self.close()

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _file_identity(status: os.stat_result) -> tuple[int, ...]:
    """What tells one file from another that took its name: device, inode, size, mtime."""
    return (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns)


def process_max_open() -> int:
    """Maps all the splits of this process keep open at once: its descriptor limit less a
    reserve for everything else (an eighth, at least 128: a DataLoader's pipes and the
    descriptors of the batches its workers hand over), at least 4 and at most 65,536."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return 1 << 16
    return max(4, min(1 << 16, soft - max(128, soft // 8)))


_OPEN_MAPS = [0]  # maps open in this process, every split's (a forked child inherits them with the count)


def _xxh3_64(data) -> bytes:
    from xxhash import xxh3_64_digest

    return xxh3_64_digest(data)


def _head(fd: int, size: int) -> bytes:
    """A shard's header as stored (8-byte length and JSON), at most 8 + MAX_HEADER bytes."""
    head = os.pread(fd, min(size, 1 << 14), 0)
    declared = int.from_bytes(head[:8], "little") if len(head) >= 8 else 0
    wanted = min(8 + min(declared, MAX_HEADER), size)
    if wanted > len(head):
        head += os.pread(fd, wanted - len(head), len(head))
    return head[:wanted]


def map_shard(
    folder, entry: dict, templates: dict, verify: str, block: int | None, pread: bool = False, dir_fd: int | None = None
) -> MappedShard:
    """Map one uncompressed shard after the checks every reader runs (a plain file of the
    stated size; the header against the sample schema). With `block` (format version 4 and
    verify "xxh3"), the header is checked against the manifest's `header_xxh3_64` before it
    is parsed and the data are verified block by block later; otherwise the whole file is
    hashed now (verify "xxh3" or "sha256") or not at all ("none"). With `pread`, the shard
    keeps its descriptor and is read with pread (`read_rows`), its map let go after the
    checks. `dir_fd`: the folder's descriptor the file is opened through."""
    path, fd, size = open_shard(folder, entry, dir_fd)
    with _closed_on_failure(path, fd):
        status = os.fstat(fd)
        head = _head(fd, size) if block else b""
        mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    try:
        shard = _mapped_shard(path, entry, templates, verify, block, head, mapped, size)
    except BaseException:
        mapped.close()  # (no array was handed out: the map is ours to close)
        os.close(fd)
        raise
    shard.identity, shard.size = _file_identity(status), size
    if pread:
        shard.fd = fd
        shard.let_go()
    else:
        os.close(fd)
    return shard


def _mapped_shard(
    path: str, entry: dict, templates: dict, verify: str, block: int | None, head: bytes, mapped: mmap.mmap, size: int
) -> MappedShard:
    """`map_shard`'s checks and arrays over an open map."""
    count = entry["count"]
    if block:
        got = _xxh3_64(head).hex()
        if got != entry["header_xxh3_64"]:
            raise ShardError(
                f"{path}: header checksum mismatch: manifest header_xxh3_64 {entry['header_xxh3_64']}, file {got}"
            )
        import io

        source = io.BytesIO(head)
    else:
        verify_shard(path, entry, verify, mapped)
        source = mapped
    data_start, tiles, metadata = read_header(source, path, count, templates)
    end = tiles[-1][2] if tiles else 0
    if data_start + end != size:
        raise ShardError(f"{path}: {size - data_start - end:,} bytes after the last tensor")
    columns = {}
    for name, begin, _ in tiles:
        template = templates[name]
        dtype = np.dtype(str(template.dtype).removeprefix("torch."))
        items = math.prod(template.shape[1:])
        columns[name] = np.frombuffer(mapped, dtype, count * items, data_start + begin).reshape(
            count, *template.shape[1:]
        )
    begins = {name: begin for name, begin, _ in tiles}
    shard = MappedShard(
        path,
        {name: columns[name] for name in templates},
        mapped,
        data_start=data_start,
        offsets=tuple(begins[name] for name in templates),
    )
    if block:
        digests = metadata.get("xxh3_64_blocks")
        wanted = blocks_in(size - data_start, block)
        try:
            raw = bytes.fromhex(digests) if isinstance(digests, str) else b""
        except ValueError:
            raw = b""
        if len(raw) != 8 * wanted:
            raise ShardError(f"{path}: the header lists no {wanted} block digests (xxh3_64_blocks)")
        shard.view, shard.digests, shard.block = memoryview(mapped)[data_start:], raw, block
        shard.done = np.zeros(wanted, bool)
    return shard


class MappedSplit:
    """A shard split (local folder or URL) for random access: `take(indices)` gathers a batch,
    one array per field, in the manifest's field order and dtypes, verified as it is touched.

    Opening reads and checks the manifest (and, given `dataset`/`split`, that it is that data
    set's split); a shard is mapped, its size and header checked, when a batch first touches
    it; at most `max_open` maps and `max_resident` bytes of them are held (see above);
    `pread=True` reads rows with pread. Pickled (DataLoader workers under spawn or
    forkserver), it carries its arguments and its manifest's digest: a worker opens the split
    again, refuses it if a writer replaced it meanwhile, and verifies what it touches itself."""

    def __init__(
        self,
        location,
        *,
        dataset: str | None = None,
        split: str | None = None,
        verify: str = "xxh3",
        max_resident: int | None = None,
        max_open: int | None = None,
        pread: bool = False,
        cache: Path | str | None = None,
        cache_bytes: int = 1 << 40,
        storage_options: dict | None = None,
        deadlines=None,
    ) -> None:
        if not isinstance(location, str | os.PathLike):
            raise ShardError(f"location must be a folder or a URL (str or pathlib.Path), got {type(location).__name__}")
        if not isinstance(verify, str) or verify not in VERIFY:
            raise ShardError(f"verify must be one of {VERIFY}, got {verify!r:.40}")
        if max_resident is not None and (type(max_resident) is not int or max_resident < 0):
            raise ShardError(f"max_resident must be a number of bytes (0 or more), got {max_resident!r:.40}")
        if max_open is not None and (type(max_open) is not int or max_open < 1):
            raise ShardError(f"max_open must be a number of maps (1 or more), got {max_open!r:.40}")
        if type(pread) is not bool:
            raise ShardError(f"pread must be True or False, got {pread!r:.40}")
        for key, value in (("dataset", dataset), ("split", split)):
            if value is not None and not isinstance(value, str):
                raise ShardError(f"{key} must be a name (str) or None, got {type(value).__name__}")
        if cache is not None and not isinstance(cache, str | os.PathLike):
            raise ShardError(f"cache must be a folder (str or pathlib.Path), got {type(cache).__name__}")
        if type(cache_bytes) is not int or cache_bytes < 1:
            raise ShardError(f"cache_bytes must be a number of bytes (1 or more), got {cache_bytes!r:.40}")
        if storage_options is not None and not isinstance(storage_options, dict):
            raise ShardError(f"storage_options must be a dict, got {type(storage_options).__name__}")
        self._args = {
            "location": location,
            "dataset": dataset,
            "split": split,
            "verify": verify,
            "max_resident": max_resident,
            "max_open": max_open,
            "pread": pread,
            "cache": cache,
            "cache_bytes": cache_bytes,
            "storage_options": storage_options,
            "deadlines": deadlines,
        }
        self._open(**self._args)

    def _open(
        self,
        location,
        dataset,
        split,
        verify,
        max_resident,
        max_open,
        pread,
        cache,
        cache_bytes,
        storage_options,
        deadlines,
    ) -> None:
        self.verify, self.max_resident, self.pread = verify, max_resident, pread
        self._replaced: str | None = None  # why this copy may not be read (`__setstate__`)
        self.max_open = max_open  # None: only the process's bound (`process_max_open`)
        self.process_max_open = process_max_open()
        self.opened: OrderedDict[int, None] = OrderedDict()  # shards with a map open, least recently used first
        self.held = 0  # bytes of the shards in `opened`
        self.dir_fd: int | None = None
        self.remote: RemoteShards | None = None
        if is_url(location):
            if cache is None:
                raise ShardError(f"{location}: a split at a URL needs a cache folder (cache=...)")
            self.remote = RemoteShards(
                str(location),
                Path(cache),
                cache_bytes,
                verify=verify,
                storage_options=storage_options,
                deadlines=deadlines,
            )
            self.location = self.remote.url
            manifest = check_identity(self.remote.manifest, f"{self.location}/manifest.json", dataset, split)
        else:
            self.location = Path(location)
            self.dir_fd = _folder_descriptor(self.location)
            try:
                manifest = read_manifest(self.location, dataset, split)
                _same_folder(self.location, self.dir_fd)
            except BaseException:  # closed here, once: __del__ must not close the number again
                os.close(self.dir_fd)
                self.dir_fd = None
                raise
        self.manifest = manifest
        self.sample = manifest_sample(manifest)
        self.count: int = manifest["count"]
        self.counts = [entry["count"] for entry in manifest["shards"]]
        self.ends = np.cumsum(self.counts, dtype=np.int64)
        self.starts = self.ends - np.asarray(self.counts, dtype=np.int64)
        self.codec = manifest["compression"]["codec"]
        self.block = manifest["block_bytes"] if verify == "xxh3" else None
        self.templates = allocate(self.sample, 0)
        self.row_bytes = [f.row_bytes for f in self.sample.fields]
        self.shards: list[MappedShard | None] = [None] * len(self.counts)
        self.seen = np.zeros(len(self.counts), bool)  # shards mapped at least once (their offsets known)
        # Which blocks of the whole split are verified, one flag per block, each shard's flags
        # a view of its range (sized from its stated bytes, an upper bound on its data area):
        # a batch's blocks are looked up in one call however many shards it touches. The
        # flags are zeroed pages the kernel maps as a shard is first touched; `left` counts
        # the flags not set yet.
        self.done = self.block_base = self.field_offsets = None
        self.left = 0
        if self.block and self.remote is None and self.codec != "zstd":
            bounds = [blocks_in(entry["bytes"], self.block) for entry in manifest["shards"]]
            self.block_base = np.concatenate([[0], np.cumsum(bounds, dtype=np.int64)])
            self.left = int(self.block_base[-1])
            if self.left > MAX_FLAGS:
                raise ShardError(
                    f"{self.location}: the manifest's shards add up to {self.left:,} blocks of "
                    f"{self.block:,} bytes, more than a split here may have ({MAX_FLAGS:,})"
                )
            self.done = np.zeros(self.left, bool)
            self.field_offsets = np.zeros((len(self.counts), len(self.row_bytes)), np.int64)
        if self.codec == "zstd":
            held = self.count * self.sample.row_bytes
            if max_resident is not None and held > max_resident:
                raise ShardError(
                    f"{self.location}: zstd shards are decompressed into memory ({held:,} bytes), over "
                    f"max_resident {max_resident:,}; write the split uncompressed to read it within a bound"
                )
            for number in range(len(self.counts)):
                self.shards[number] = self._decompressed(number)

    def _where(self, number: int):
        """(folder, manifest entry) of shard `number`: the local folder, or the cache (fetched)."""
        if self.remote is None:
            return self.location, self.manifest["shards"][number]
        return self.remote.local(number)

    def _decompressed(self, number: int) -> MappedShard:
        try:
            targets = allocate(self.sample, self.counts[number])
        except RuntimeError:  # torch's "can't allocate memory": a count no real shard has
            raise ShardError(
                f"{self.location}: shard {number} of {self.counts[number]:,} samples needs "
                f"{self.counts[number] * self.sample.row_bytes:,} bytes, which cannot be allocated "
                f"here"
            ) from None
        folder, entry = self._where(number)
        verify = self.verify if self.remote is None else "none"  # (the cache verified its copy)
        read_shard_into(folder, entry, self.codec, verify, targets, dir_fd=self.dir_fd)
        return MappedShard(str(Path(str(folder)) / entry["file"]), {k: t.numpy() for k, t in targets.items()})

    def shard(self, number: int) -> MappedShard:
        """Shard `number`, mapped (and fetched) if its map is not open, its size checked; the
        least recently used maps past `max_open` or `max_resident` closed."""
        self._current()
        shard = self.shards[number]
        if shard is not None and shard.is_open:
            if number in self.opened:
                self.opened.move_to_end(number)
                shard.check_size()
            return shard
        fresh = self._map(number, known=shard)
        if shard is None:
            if self.done is not None:
                self._track(number, fresh)
            self.shards[number] = shard = fresh
            self.seen[number] = True
        else:  # mapped again: the very file first verified, its verified blocks kept
            shard.mapped, shard.view, shard.columns, shard.fd = fresh.mapped, fresh.view, fresh.columns, fresh.fd
        self.opened[number] = None
        _OPEN_MAPS[0] += 1
        self.held += self.manifest["shards"][number]["bytes"]
        self._trim(keep=number)
        return shard

    def _map(self, number: int, known: MappedShard | None) -> MappedShard:
        """Map shard `number`: verified as the split asks the first time (`known` None); again
        after its map was closed, a local shard must be the file first mapped (`_remap`), a
        shard at a URL is the cache's copy, verified whole against the manifest when fetched."""
        if known is not None and self.remote is None:
            return self._remap(number, known)
        verify = self.verify if known is None else "none"
        if self.remote is None:
            fresh = map_shard(
                self.location,
                self.manifest["shards"][number],
                self.templates,
                verify,
                self.block,
                self.pread,
                self.dir_fd,
            )
        else:  # opened while the cache holds its lock: no other rank evicts it in between
            with self.remote.holding(number) as (folder, entry):
                fresh = map_shard(folder, entry, self.templates, "none", None, self.pread)
        return fresh

    def _remap(self, number: int, known: MappedShard) -> MappedShard:
        """Shard `number` mapped again after its map was closed: the file first verified (same
        device, inode, size and mtime), its arrays laid over the new map where its checked
        header put them (nothing parsed again, so that a split of more shards than maps open
        pays a few system calls per shard it maps again, not a header)."""
        path, fd, size = open_shard(self.location, self.manifest["shards"][number], self.dir_fd)
        with _closed_on_failure(path, fd):
            if _file_identity(os.fstat(fd)) != known.identity:
                raise ShardError(
                    f"{path}: another file than the one this process verified (replaced or rewritten "
                    f"since); open the split again"
                )
            mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        count = self.counts[number]
        columns = {
            f.name: np.frombuffer(mapped, f.dtype, count * math.prod(f.shape), known.data_start + offset).reshape(
                count, *f.shape
            )
            for f, offset in zip(self.sample.fields, known.offsets)
        }
        fresh = MappedShard(path, columns, mapped, identity=known.identity, size=size)
        if known.block:
            fresh.view = memoryview(mapped)[known.data_start :]
        if self.pread:
            fresh.fd = fd
            fresh.let_go()
        else:
            os.close(fd)
        return fresh

    def _over(self) -> bool:
        """Whether this split must close a map: more than `max_open` open, more than the
        process's bound open over all its splits, or more than `max_resident` bytes mapped."""
        return (
            self.max_open is not None
            and len(self.opened) > self.max_open
            or _OPEN_MAPS[0] > self.process_max_open
            or self.max_resident is not None
            and self.held > self.max_resident
        )

    def _trim(self, keep: int | None = None) -> None:
        """Close this split's least recently used maps (never `keep`'s, the one in use) while
        it is over a bound (`_over`)."""
        sizes = self.manifest["shards"]
        while self.opened and self._over():
            number = next(iter(self.opened))
            if number == keep:  # (the one in use is the most recent: alone, then)
                return
            del self.opened[number]
            _OPEN_MAPS[0] -= 1
            self.held -= sizes[number]["bytes"]
            self.shards[number].close_map()

    def _track(self, number: int, shard: MappedShard) -> None:
        """Make `shard`'s verified-block flags a view of the split's: none set, if it is to be
        verified block by block; all, if it was verified whole (or not at all)."""
        base, bound = int(self.block_base[number]), int(self.block_base[number + 1])
        blocks = 0 if shard.done is None else len(shard.done)
        self.done[base + blocks : bound] = True  # past the shard's data area, or the whole range
        self.left -= bound - base - blocks
        if shard.done is not None:
            shard.done = self.done[base : base + blocks]
            self.field_offsets[number] = shard.offsets

    def __len__(self) -> int:
        return self.count

    def _range(self) -> str:
        """The indices this split takes, in words."""
        return f"0..{self.count - 1}" if self.count else "(the split holds no samples)"

    def take(self, indices) -> dict[str, np.ndarray]:
        """The samples at `indices` (ints, negative from the end): one new array per field,
        [b, *shape] of its declared dtype, in the manifest's field order."""
        self._current()
        try:
            index = np.asarray(indices)
        except (TypeError, ValueError) as err:  # ragged lists, objects numpy cannot take
            raise ShardTypeError(
                f"expected a 1-D sequence of integer sample indices, got {type(indices).__name__} ({reason(err)})"
            ) from None
        if index.dtype == object and index.ndim == 1 and all(type(i) is int for i in index.tolist()):
            # Python ints past int64 (numpy keeps them as objects): out of range, not of the wrong type
            raise ShardIndexError(f"sample index {max(index.tolist(), key=abs)} is outside {self._range()}")
        if index.ndim != 1 or (len(index) and index.dtype.kind not in "iu"):
            raise ShardTypeError(
                f"expected a 1-D sequence of integer sample indices, got {index.dtype} {list(index.shape)}"
            )
        # (compared before the cast: a uint64 of 2**63 or more would wrap to a negative index)
        if len(index) and (index.max() >= self.count or index.dtype.kind == "i" and index.min() < -self.count):
            raise ShardIndexError(f"sample index out of range {self._range()}")
        index = index.astype(np.int64, copy=False)
        index = np.where(index < 0, index + self.count, index)
        out = {f.name: np.empty((len(index), *f.shape), f.dtype) for f in self.sample.fields}
        if len(self.counts) == 1:
            owner = np.zeros(len(index), np.int64)
            self._gather([(0, 0, len(index))], owner, index, out)
        elif len(index):
            # Grouped by shard (stable: a shard's rows keep the batch's order), gathered group
            # by group into a sorted copy, then put back in the batch's order once per field.
            owner = np.searchsorted(self.ends, index, side="right")
            order = np.argsort(owner, kind="stable")
            owner = owner[order]
            rows = index[order] - self.starts[owner]
            edges = [0, *(np.flatnonzero(np.diff(owner)) + 1).tolist(), len(index)]
            groups = [(int(owner[a]), a, b) for a, b in zip(edges[:-1], edges[1:])]
            ordered = {name: np.empty_like(values) for name, values in out.items()}
            self._gather(groups, owner, rows, ordered)
            for name, values in ordered.items():
                out[name][order] = values
        check_classes(self.sample, out, str(self.location), ids=index)
        return out

    def _gather(
        self, groups: list[tuple[int, int, int]], owner: np.ndarray, rows: np.ndarray, out: dict[str, np.ndarray]
    ) -> None:
        """Rows `rows[a:b]` of shard `number` into `out[a:b]` for each (number, a, b), each
        group's shard mapped (its size checked) and the blocks its rows lie in verified just
        before they are read: however many shards a batch touches, only the bounded set of
        maps is open. The blocks due are found once per batch for the shards mapped before,
        per group only for a shard mapped for the first time (its offsets come with it)."""
        known = self.seen[owner]
        due = self._due_blocks(owner[known], rows[known])
        if len(self.opened) >= len(groups) // 2:  # maps open first: the batch's misses do not close them before use
            groups = sorted(groups, key=lambda group: group[0] not in self.opened)
        for number, a, b in groups:
            first = not self.seen[number]
            shard = self.shard(number)  # mapped (fetched) on first touch, its size checked
            blocks = self._due_blocks(owner[a:b], rows[a:b]).get(number, []) if first else due.get(number, [])
            for block in blocks:
                shard.check_block(block)
                self.left -= 1
            if shard.fd is not None:
                shard.read_rows(rows[a:b], self.row_bytes, a, out)
                continue
            picked = rows[a:b]
            for name, values in shard.columns.items():
                values.take(picked, 0, out[name][a:b])
        self._trim()

    def _due_blocks(self, owner: np.ndarray, rows: np.ndarray) -> dict[int, list[int]]:
        """The blocks not verified yet that the rows (of shards `owner`, each mapped before)
        lie in: {shard number: its block numbers}, found for all the rows at once."""
        if not self.left or not len(rows):
            return {}
        firsts, lasts = [], []
        for field, row in enumerate(self.row_bytes):
            first = self.field_offsets[owner, field] + rows * row
            firsts.append(first // self.block)
            lasts.append((first + row - 1) // self.block)
        first, last = np.concatenate(firsts), np.concatenate(lasts)
        base = self.block_base[np.concatenate([owner] * len(self.row_bytes))]
        span = last - first + 1  # blocks per row and field (1 or 2 unless a row is larger than a block)
        ids = np.repeat(base + first, span) + np.arange(int(span.sum())) - np.repeat(np.cumsum(span) - span, span)
        pending = np.unique(ids[~self.done[ids]])
        numbers = np.searchsorted(self.block_base, pending, side="right") - 1
        due: dict[int, list[int]] = {}
        for number, block in zip(numbers.tolist(), (pending - self.block_base[numbers]).tolist()):
            due.setdefault(number, []).append(block)
        return due

    def wait(self) -> None:
        """Map (fetch) and verify every shard now; raise what is wrong."""
        self._current()
        for number in range(len(self.counts)):
            shard = self.shard(number)
            self.left -= shard.check_all()
            check_classes(
                self.sample,
                shard.columns,
                str(self.location),
                ids=range(int(self.starts[number]), int(self.ends[number])),
            )
        self._trim()

    def __getstate__(self) -> dict:
        return {"_args": self._args, "manifest_sha256": _manifest_digest(self.manifest)}

    def __del__(self) -> None:
        _OPEN_MAPS[0] -= len(getattr(self, "opened", ()))  # (their maps close with their arrays)
        for shard in getattr(self, "shards", []):
            if shard is not None:
                shard.close()
        if getattr(self, "dir_fd", None) is not None:
            os.close(self.dir_fd)
            self.dir_fd = None

    def __setstate__(self, state: dict) -> None:
        self._args = {"max_open": None, "pread": False, **state["_args"]}
        self._open(**self._args)
        wanted = state.get("manifest_sha256")
        if wanted is not None and _manifest_digest(self.manifest) != wanted:
            # said at the first read, which a DataLoader hands back to its main process as the
            # ShardError it is (raised while a worker unpickles, it only kills the worker)
            self._replaced = (
                f"{self.location}: replaced by a writer since it was opened in the process that sent it "
                f"here (a DataLoader worker reopens the split); open it again"
            )

    def _current(self) -> None:
        """Nothing, or the ShardError of a split a writer replaced before this copy reopened it."""
        if self._replaced is not None:
            raise ShardError(self._replaced)


def _manifest_digest(manifest: dict) -> str:
    """The sha256 of a manifest's content: the same for a split of the same shards (their
    digests are in it), another for a split a writer replaced."""
    import hashlib
    import json

    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()


@contextlib.contextmanager
def _closed_on_failure(path: Path, fd: int) -> Iterator[None]:
    """Within the block, any failure closes `fd` (the shard's, opened for mapping); an OS
    error becomes one ShardError naming the file."""
    try:
        yield
    except OSError as err:
        os.close(fd)
        raise ShardError(f"{path}: cannot be mapped ({err.strerror or reason(err)})") from None
    except BaseException:
        os.close(fd)
        raise


def _folder_descriptor(folder: Path) -> int:
    """A descriptor of the split's folder, which its shards are opened through: a folder
    swapped for a new one under this name leaves this process the one it opened."""
    try:
        return os.open(folder, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ShardError(f"{folder / 'manifest.json'}: missing (is {folder} a shard folder?)") from None
    except OSError as err:
        raise ShardError(f"{folder}: not a readable shard folder ({reason(err)})") from None


def _same_folder(folder: Path, fd: int) -> None:
    """The folder named `folder` is still the one `fd` opened (the manifest just read came
    from it), else a ShardError: a writer swapped it in between."""
    try:
        now = os.stat(folder)
    except OSError:
        now = None
    held = os.fstat(fd)
    if now is None or (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
        raise ShardError(f"{folder}: replaced by a writer while being opened; open it again")
