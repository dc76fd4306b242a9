"""Shards read from where they are stored: a split at a URL, fetched shard by shard into a
bounded node-local cache (docs/shards.md, "A split in object storage"; docs/scale.md).

    split = RemoteShards("s3://bucket/shards/mnist/train", cache=Path("/local/cache"), max_bytes=2 << 30)
    folder, entry = split.local(0)       # shard 0, fetched (or found) in the cache and verified

Whole shards, not byte ranges: the manifest's checksums cover whole files. The cache names a
copy by its content, renames it into place only once size and checksum match, verifies it
again before use, evicts the least recently used past `max_bytes` (never one another process
holds), and lets the ranks of a node share it behind a per-shard lock. Every read has
deadlines (`watched.Deadlines`); fsspec (s3fs for s3://) is imported on first use.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.core.bounded import parse_json
from pipeline.core.errors import InputError, reason
from pipeline.shards.format import MAX_MANIFEST, ShardError, check_manifest, suffix
from pipeline.shards.reader import VERIFY, hasher
from pipeline.shards.watched import Deadlines, watched

CHUNK = 8 << 20  # one ranged GET per chunk: bounded memory whatever the shard's size
READ = 1 << 20  # what one read() asks for: progress is seen (and a deadline checked) at least this often
OBJECTS = "objects"  # the cache's verified shard copies; temporaries and locks beside them


def join(location: str, name: str) -> str:
    return f"{str(location).rstrip('/')}/{name}"


class _Where(str):
    """A URL that check_manifest can name in its messages (it asks for `.parent`)."""

    @property
    def parent(self) -> str:
        return self.rsplit("/", 1)[0]


@dataclass
class FetchCounts:
    """What one process fetched: bytes and shards that came over the network, and cache hits."""

    bytes: int = 0
    shards: list[str] = field(default_factory=list)
    hits: int = 0
    manifest_bytes: int = 0

    def as_dict(self) -> dict:
        return {
            "bytes": self.bytes,
            "shards": list(self.shards),
            "hits": self.hits,
            "manifest_bytes": self.manifest_bytes,
        }


def _not_missing(err: FileNotFoundError) -> str | None:
    """Why a "not found" was not one, or None: fsspec's HTTP store says FileNotFoundError for
    any failure, with the client's own error as its cause (a refused connection, an HTTP
    status such as 500); a 404, or a store's own not-found, is missing indeed."""
    cause = err.__cause__ or err.__context__
    status = getattr(cause, "status", None)
    if isinstance(status, int) and status != 404:  # aiohttp's ClientResponseError
        return f"HTTP {status} {getattr(cause, 'message', '')}".strip()
    if isinstance(cause, OSError) and not isinstance(cause, FileNotFoundError):  # (aiohttp's connection errors)
        return f"{type(cause).__name__}: {reason(cause)}"
    return None


class RemoteShards:
    """A shard split at `url`, its shards fetched on demand into `cache` (at most `max_bytes`)."""

    def __init__(
        self,
        url: str,
        cache: Path,
        max_bytes: int,
        *,
        verify: str = "xxh3",
        retries: int = 2,
        storage_options: dict | None = None,
        deadlines: Deadlines | None = None,
    ) -> None:
        if not isinstance(verify, str) or verify not in VERIFY:
            raise ShardError(f"verify must be one of {VERIFY}, got {verify!r:.40}")
        if type(max_bytes) is not int or max_bytes < 1:
            raise ShardError(f"max_bytes must be a number of bytes (1 or more), got {max_bytes!r:.40}")
        if type(retries) is not int or retries < 0:
            raise ShardError(f"retries must be an integer (0 or more), got {retries!r:.40}")
        if deadlines is not None and not isinstance(deadlines, Deadlines):
            raise ShardError(f"deadlines must be a Deadlines (pipeline.shards.watched), got {type(deadlines).__name__}")
        try:
            import fsspec  # lazily: only remote splits need it
        except ImportError:
            raise ShardError(
                f"{url}: reading shards from a URL needs fsspec (and s3fs for s3://): pip install -e '.[s3]'"
            ) from None

        self.url, self.verify, self.retries, self.max_bytes = str(url).rstrip("/"), verify, retries, max_bytes
        self.deadlines = deadlines or Deadlines()
        self.cache = Path(cache)
        self.objects = self.cache / OBJECTS
        for folder in (self.cache, self.objects):  # before anything is created: never through a link
            if folder.is_symlink():
                raise ShardError(f"{folder}: a link; the cache writes only inside a folder of its own")
        try:
            self.objects.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise ShardError(f"{self.objects}: exists and is not a folder; the cache needs it as one") from None
        self.counts = FetchCounts()
        try:
            # a file system of its own: fsspec's instance cache would hand back one made
            # earlier in this process for another endpoint (the key leaves out the environment)
            self.fs, self.root = fsspec.core.url_to_fs(self.url, skip_instance_cache=True, **(storage_options or {}))
        except (ImportError, ValueError) as err:  # an unknown scheme, or its package missing (s3fs for s3://)
            raise ShardError(f"{self.url}: cannot open ({reason(err)})") from None
        # HTTP(S): one streamed GET per shard (block size 0), so a static server without
        # range requests serves too; an object store: ranged GETs of CHUNK bytes.
        protocols = {self.fs.protocol} if isinstance(self.fs.protocol, str) else set(self.fs.protocol)
        self.block_size = 0 if protocols & {"http", "https"} else CHUNK
        self.manifest = self._read_manifest()
        codec = self.manifest["compression"]["codec"]
        for entry in self.manifest["shards"]:
            if entry["bytes"] > max_bytes:
                raise ShardError(
                    f"{join(self.url, entry['file'])}: {entry['bytes']:,} bytes do not fit the "
                    f"cache bound of {max_bytes:,} bytes (raise train.cache_mib)"
                )
        self._suffix = suffix(codec)

    def _read_manifest(self) -> dict:
        where = _Where(join(self.url, "manifest.json"))

        def read(progress: list) -> bytes:
            parts = []
            with self.fs.open(join(self.root, "manifest.json"), "rb") as file:
                while sum(map(len, parts)) <= MAX_MANIFEST and not progress[1]:
                    part = file.read(READ)
                    if not part:
                        break
                    parts.append(part)
                    progress[0] += len(part)
            return b"".join(parts)

        try:
            raw = watched(read, where, MAX_MANIFEST, self.deadlines)
        except ShardError:
            raise
        except FileNotFoundError as err:
            if why := _not_missing(err):
                raise ShardError(f"{where}: cannot read ({why})") from None
            raise ShardError(f"{where}: missing (is {self.url} a shard folder?)") from None
        except Exception as err:  # whatever the store answers (refused, unreachable, denied): one line
            raise ShardError(f"{where}: cannot read ({type(err).__name__}: {reason(err)})") from None
        if len(raw) > MAX_MANIFEST:
            raise ShardError(f"{where}: larger than {MAX_MANIFEST:,} bytes")
        self.counts.manifest_bytes += len(raw)
        try:
            manifest = parse_json(raw, where)
        except InputError as err:  # not JSON, or a key given twice
            raise ShardError(str(err)) from None
        return check_manifest(manifest, where)  # type: ignore[arg-type]  # (it only formats the name)

    def _key(self, entry: dict) -> tuple[str, str]:
        """(manifest key of the digest, cache file name) for a shard: named by its content."""
        key, _ = hasher(self.verify if self.verify != "none" else "sha256")
        return key, entry[key] + self._suffix

    def local(self, shard: int) -> tuple[Path, dict]:
        """(folder, entry) for `read_shard_into`: shard `shard` verified in the cache, fetched
        if it was not there. The entry names the cached copy; its checksums are the manifest's."""
        with self.holding(shard) as found:
            return found

    @contextlib.contextmanager
    def holding(self, shard: int) -> Iterator[tuple[Path, dict]]:
        """`local(shard)`, held: while the block runs, no process sharing the cache evicts the
        copy (open or map it inside the block; once open, an eviction cannot take it away)."""
        entry = self.manifest["shards"][shard]
        _, name = self._key(entry)
        with self._locked(name):
            for stale in self.objects.glob(f".{name}.*.tmp"):  # a killed fetch's leftovers
                stale.unlink(missing_ok=True)
            path = self.objects / name
            if path.is_file() and not path.is_symlink():
                if self._intact(path, entry) is None:
                    os.utime(path)  # recently used: evicted last
                    self.counts.hits += 1
                    yield self.objects, {**entry, "file": name}
                    return
                path.unlink()  # damaged on disk: fetch anew
            self._fetch(entry, name)
            yield self.objects, {**entry, "file": name}

    def _intact(self, path: Path, entry: dict) -> str | None:
        """None when `path` has the shard's size and checksum, else what is wrong."""
        size = path.stat().st_size
        if size != entry["bytes"]:
            return f"{size:,} bytes, manifest says {entry['bytes']:,}"
        if self.verify == "none":
            return None
        key, digest = hasher(self.verify)
        with path.open("rb") as file:
            while chunk := file.read(CHUNK):
                digest.update(chunk)
        return None if digest.hexdigest() == entry[key] else f"checksum mismatch: manifest {key} {entry[key]}"

    def _fetch(self, entry: dict, name: str) -> None:
        source = join(self.url, entry["file"])
        self._make_room(entry["bytes"])
        problem = ""
        for _ in range(self.retries + 1):
            fd, tmp_name = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=self.objects)
            tmp = Path(tmp_name)
            try:
                with os.fdopen(fd, "wb") as out:
                    digest = self._download(join(self.root, entry["file"]), out, entry["bytes"])
                problem = self._mismatch(entry, digest)
                if not problem:
                    os.replace(tmp, self.objects / name)
                    self.counts.shards.append(entry["file"])
                    return
            except FileNotFoundError as err:
                problem = f"cannot read ({why})" if (why := _not_missing(err)) else "missing from the store"
            except ShardError as err:
                problem = str(err)
            except Exception as err:  # the store's answer, whatever it was: retried, then one line
                problem = f"{type(err).__name__}: {reason(err)}"
            finally:
                tmp.unlink(missing_ok=True)
        raise ShardError(f"{source}: {problem} (after {self.retries + 1} tries); nothing cached")

    def _mismatch(self, entry: dict, digest: str | None) -> str:
        if digest is None:  # verify "none": the size alone was checked
            return ""
        key, _ = hasher(self.verify)
        return "" if digest == entry[key] else f"checksum mismatch: manifest {key} {entry[key]}, got {digest}"

    def _download(self, path: str, out, size: int) -> str | None:
        """Stream the object into `out`, hashing as it comes (None for verify "none"), reading
        at most one byte more than `size`: an object longer than its manifest entry is caught
        without reading all of it. Every byte received counts in `counts.bytes`."""
        digest = None if self.verify == "none" else hasher(self.verify)[1]

        def read(progress: list) -> int:
            got = 0
            with self.fs.open(path, "rb", block_size=self.block_size, cache_type="none") as file:
                while got <= size and not progress[1]:
                    chunk = file.read(min(READ, size + 1 - got))
                    if not chunk:
                        break
                    out.write(chunk)
                    got += len(chunk)
                    progress[0] = got
                    self.counts.bytes += len(chunk)
                    if digest is not None:
                        digest.update(chunk)
            return got

        got = watched(read, None, size, self.deadlines)
        if got < size:
            raise ShardError(f"only {got:,} of the manifest's {size:,} bytes (partial download)")
        if got > size:
            raise ShardError(f"longer than the manifest's {size:,} bytes (not this shard)")
        return None if digest is None else digest.hexdigest()

    def _make_room(self, needed: int) -> None:
        """Evict the least recently used copies until `needed` more bytes fit the bound. A copy
        another process holds (its lock taken) is skipped; a temporary left by a killed fetch
        counts against the bound and goes first."""
        entries = []
        for path in self.objects.iterdir():
            if path.is_symlink() or not path.is_file() or path.name.endswith(".lock"):
                continue
            status = path.stat()
            stale = path.name.startswith(".") and path.name.endswith(".tmp")
            entries.append((not stale, status.st_mtime_ns, path.name, status.st_size))
        used = sum(size for *_, size in entries)
        for kept, _, name, size in sorted(entries):
            if used + needed <= self.max_bytes:
                break
            owner = name[1:].split(".", 1)[0] + self._suffix if not kept else name
            if self._try_evict(owner, self.objects / name):
                used -= size

    def _try_evict(self, owner: str, path: Path) -> bool:
        """Remove `path` unless another process holds `owner`'s lock right now."""
        lock = self.objects / f".{owner}.lock"
        if lock.is_symlink():
            return False
        fd = os.open(lock, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        try:
            path.unlink(missing_ok=True)
            return True
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _locked(self, name: str) -> Iterator[None]:
        """One fetcher per shard and cache: other ranks on the node wait, then find it cached."""
        fd = os.open(self.objects / f".{name}.lock", os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # (the lock file stays: removing it would race with a waiter)
