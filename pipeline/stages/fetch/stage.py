"""Download the raw data sets from an ordered list of mirrors, verified by content.

Mirrors re-compress files (Debian's gzip bytes differ from the original's), so what is
pinned is the sha256 of the *decompressed* content. Each file is streamed once: bytes come
off the wire, are un-gzipped and hashed on the fly, and land in a temporary file that is
renamed only after the digest matched. What is stored is the decompressed file, so the
stage output is byte-identical whichever mirror served it and DVC's cache holds.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from tqdm import tqdm

from pipeline.core.atomic import atomic_dir, atomic_path
from pipeline.core.bounded import UnsafeFileError, open_regular, short
from pipeline.core.dataset import CSV_HEADER_MAX, CSV_LINE_MAX, PIXELS
from pipeline.core.errors import InputError, is_hex, reason
from pipeline.core.sources import SourcesError, dataset_entry
from pipeline.stages.fetch.settings import FetchSettings
from pipeline.stages.mnist import MAX_HEADER, IdxError, header_size, parse_header

MIRROR_ENV = "PIPELINE_MIRROR"
CHUNK = 1 << 20
ROLES = ("train_images", "train_labels", "test_images", "test_labels", "train_csv", "test_csv")
# What a raw file may decompress to when neither its pin (`bytes`) nor the data set's rows
# say: no raw file of a 28x28 data set comes near 4 GiB (MNIST's largest is 47 MB).
MAX_RAW_BYTES = 1 << 32


def byte_bar(total: int | None, desc: str) -> tqdm:
    """A download's progress in bytes on a terminal; silent in logs and tests."""
    return tqdm(
        total=total,
        desc=desc,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        disable=not sys.stderr.isatty(),
        leave=False,
    )


@dataclass(frozen=True)
class FileSpec:
    """One published file: its name on the mirrors, the sha256 of its content and, when
    pinned, the content's size in bytes."""

    role: str
    name: str
    sha256: str
    bytes: int | None = None

    @property
    def split(self) -> str:
        return self.role.split("_", 1)[0]

    @property
    def kind(self) -> str:
        """images, labels or csv."""
        return self.role.rsplit("_", 1)[1]

    @property
    def stored_name(self) -> str:
        """Role-based name, so later stages need not know each mirror's file names."""
        return f"{self.split}.csv" if self.kind == "csv" else f"{self.split}-{self.kind}.idx"

    def budget(self, rows: Mapping[str, int] | None = None) -> int:
        """The most this file's content may be: its pinned size, else what the split's rows
        (sources.yaml) allow, else MAX_RAW_BYTES."""
        if self.bytes is not None:
            return self.bytes
        n = (rows or {}).get(self.split)
        if n is None:
            return MAX_RAW_BYTES
        return {"images": 16 + n * PIXELS, "labels": 8 + n, "csv": CSV_HEADER_MAX + n * CSV_LINE_MAX}[self.kind]


class FetchError(InputError):
    """Every mirror failed for one file; the message lists each mirror and why."""


class _Permanent(Exception):
    """This mirror will not give the right bytes: move on to the next one."""


class _Transient(Exception):
    """Worth another try at the same mirror after a pause."""


class _Short(_Permanent):
    """The content ended early: for a body sent without its length, a connection closed
    early looks the same, so that one is tried again (`fetch_file`)."""


class _Deadline(_Permanent):
    """The file took longer than `deadline_s` at this mirror: move on to the next one."""


def _plain_name(name: object) -> bool:
    return (
        isinstance(name, str)
        and 0 < len(name) <= 255
        and name not in (".", "..")
        and not any(c in name for c in "/\\\0")
    )


def parse_files(files: Mapping[str, Mapping[str, str]], origin: str = "") -> list[FileSpec]:
    """Validate a data set's `files` block from sources.yaml (`origin` prefixes each message)."""
    if not isinstance(files, Mapping):
        raise FetchError(f"{origin}files must be a mapping of file roles, got {short(files)}")
    specs = []
    for role, entry in files.items():
        if role not in ROLES:
            raise FetchError(f"{origin}unknown file role {short(role)}; expected one of {ROLES}")
        if not isinstance(entry, Mapping) or not set(entry) <= {"name", "sha256", "bytes"}:
            raise FetchError(
                f"{origin}file {role}: expected {{name: ..., sha256: ...}} (optionally bytes: ...), got {short(entry)}"
            )
        sha = entry.get("sha256")
        sha = sha.lower() if isinstance(sha, str) else sha
        if not isinstance(sha, str) or not is_hex(sha, 64):
            raise FetchError(f"{origin}file {role}: sha256 must be 64 hex digits, got {short(sha)}")
        if not _plain_name(entry.get("name")):
            raise FetchError(
                f"{origin}file {role}: name must be a plain file name (no '/'), got {short(entry.get('name'))}"
            )
        size = entry.get("bytes")
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_RAW_BYTES):
            raise FetchError(
                f"{origin}file {role}: bytes must be an integer in 0..{MAX_RAW_BYTES:,}, got {short(size)}"
            )
        specs.append(FileSpec(role=role, name=entry["name"], sha256=sha, bytes=size))
    roles = {s.role for s in specs}
    idx_roles, csv_roles = set(ROLES[:4]), set(ROLES[4:])
    if roles != idx_roles and roles != csv_roles:
        raise FetchError(
            f"{origin}a data set needs either the four IDX files {sorted(idx_roles)} or the two CSV "
            f"files {sorted(csv_roles)}; got {sorted(roles)}"
        )
    return specs


def load_sources(path: Path, dataset: str) -> tuple[dict, list[str]]:
    """(files, mirrors) of `dataset` from sources.yaml: the pins and where to look, checked."""
    try:
        entry = dataset_entry(path, dataset)
    except SourcesError as err:
        raise FetchError(str(err)) from None
    mirrors = entry.get("mirrors") or []
    if not isinstance(mirrors, list) or not all(isinstance(m, str) for m in mirrors):
        raise FetchError(f"{path}: {dataset}.mirrors must be a list of URLs or folders")
    parse_files(entry["files"], f"{path}: {dataset}.files: ")
    return entry["files"], mirrors


def mirror_bases(dataset: str, mirrors: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """The mirrors to try, in order: $PIPELINE_MIRROR/<dataset> first when set."""
    bases = list(mirrors)
    override = env.get(MIRROR_ENV, "").strip()
    if override:
        bases.insert(0, override.rstrip("/") + "/" + dataset)
    return bases


def _join(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name


def _open(url: str, timeout_s: float, wire_cap: int, cut: bool = False) -> tuple[BinaryIO, int | None]:
    """Open a URL or a local path; http(s) honours the connect/read timeout. A local path
    must be a regular file (a FIFO or a device would block or never end); a body larger
    than `wire_cap` is refused before it is read."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError as err:
        raise _Permanent(f"not a usable URL ({reason(err)})") from None
    if parts.scheme in ("http", "https"):
        request = urllib.request.Request(url, headers={"User-Agent": "mnist-pipeline/0.1"})
        try:
            response = urllib.request.urlopen(request, timeout=timeout_s)  # noqa: S310
        except urllib.error.HTTPError as err:
            cls = _Transient if err.code >= 500 or err.code == 429 else _Permanent
            raise cls(f"HTTP {err.code} {reason(err).removeprefix(f'HTTP Error {err.code}: ')}") from None
        except (urllib.error.URLError, TimeoutError, socket.timeout, ConnectionError) as err:
            reason_ = getattr(err, "reason", err)
            if isinstance(reason_, TimeoutError):  # (socket.timeout is TimeoutError) connected or not, no answer
                within = f"{timeout_s:.3g} s, what was left of fetch.deadline_s" if cut else f"{timeout_s:g} s"
                raise _Transient(f"no answer within {within} (connecting, or waiting for its response)") from None
            raise _Transient(
                f"cannot connect: {reason(reason_) if isinstance(reason_, BaseException) else reason_}"
            ) from None
        except (ValueError, http.client.HTTPException) as err:  # InvalidURL, a bad port, a bad status line
            raise _Permanent(f"not a usable URL or answer ({reason(err)})") from None
        length = response.headers.get("Content-Length")
        size = int(length) if length and length.isdigit() else None
        if size is not None and size > wire_cap:
            response.close()
            raise _Permanent(f"{size:,} bytes, more than this file can take ({wire_cap:,})")
        return response, size
    if parts.scheme not in ("", "file"):
        raise _Permanent(f"unsupported URL scheme {parts.scheme!r}: expected http(s)://, file:// or a folder")
    path = Path(urllib.request.url2pathname(parts.path)) if parts.scheme == "file" else Path(url)
    try:
        stream = open_regular(path)
    except (FileNotFoundError, NotADirectoryError):
        raise _Permanent("not found") from None
    except UnsafeFileError as err:
        raise _Permanent(str(err).removeprefix(f"{path}: ")) from None
    size = os.fstat(stream.fileno()).st_size
    if size > wire_cap:
        stream.close()
        raise _Permanent(f"{size:,} bytes, more than this file can take ({wire_cap:,})")
    return stream, size


def _chunks(
    stream: BinaryIO,
    expected: int | None,
    on_bytes: Callable[[int], None],
    deadline: float = float("inf"),
    wire_cap: int = MAX_RAW_BYTES,
) -> Iterator[bytes]:
    received = 0
    try:
        read = getattr(stream, "read1", stream.read)  # what has arrived, not a full MiB
        while chunk := read(CHUNK):
            received += len(chunk)
            if received > wire_cap:
                raise _Permanent(f"more than {wire_cap:,} bytes sent, more than this file can take")
            on_bytes(len(chunk))
            yield chunk
            if time.monotonic() > deadline:
                raise _Deadline(
                    f"incomplete when its deadline passed ({received:,} bytes received): too slow (fetch.deadline_s)"
                )
    except (TimeoutError, socket.timeout):
        raise _Transient(f"read timed out after {received:,} bytes") from None
    except http.client.IncompleteRead:
        raise _Transient(f"truncated body: connection closed after {received:,} bytes") from None
    except (ConnectionError, http.client.HTTPException) as err:
        raise _Transient(f"connection broke after {received:,} bytes: {err!r}") from None
    if expected is not None and received != expected:
        raise _Transient(f"truncated body: got {received:,} of {expected:,} bytes")


def wire_cap(limit: int) -> int:
    """The most bytes a file of `limit` content bytes may take on the wire: gzip of data that
    does not compress adds 5 bytes per 16 KiB block, and a header and trailer per member."""
    return limit + limit // 1024 + (64 << 10)


class _Content:
    """The content of one file as it streams: un-gzipped when it starts with gzip's magic
    (decided on its first two bytes, however the reads split them), at most `limit` bytes
    out whatever the ratio (each inflate call is capped at CHUNK bytes out), an IDX file's
    header checked as soon as it has arrived, hashed and written."""

    def __init__(self, spec: FileSpec, out: BinaryIO, limit: int, rows: Mapping[str, int] | None) -> None:
        self.spec, self.out, self.limit, self.rows = spec, out, limit, rows
        self.digest = hashlib.sha256()
        self.written = 0
        self.undecided = b""  # raw bytes until gzip or not can be told
        self.gzip: bool | None = None
        self.inflater = zlib.decompressobj(wbits=31)
        self.head = b"" if spec.kind != "csv" else None  # an IDX file's first bytes, until checked

    def _emit(self, data: bytes) -> None:
        if not data:
            return
        if self.head is not None:  # first: the header may say more precisely what is wrong
            self.head += data[:MAX_HEADER]
            self._check_header(final=False)
        self.written += len(data)
        if self.written > self.limit:
            raise _Permanent(
                f"content runs past {self.limit:,} bytes, more than this file has "
                f"(sources.yaml pin or row count, or its IDX header): a gzip bomb or another file"
            )
        self.digest.update(data)
        self.out.write(data)

    def _check_header(self, final: bool) -> None:
        """Once the header is in: its size must fit the limit (which it then tightens), and
        its sample count must be the data set's."""
        try:
            if len(self.head) < 4 and not final:
                return
            needed = header_size(self.head, "content")
            if len(self.head) < needed and not final:
                return
            _, shape, _, size = parse_header(self.head, "content")
        except IdxError as err:
            raise _Permanent(f"not an IDX file: {str(err).removeprefix('content: ')}") from None
        self.head = None
        expected = (self.rows or {}).get(self.spec.split)
        if expected is not None and shape[0] != expected:
            raise _Permanent(
                f"IDX header says {shape[0]:,} samples (shape {shape}); the data set's "
                f"{self.spec.split} split has {expected:,} (sources.yaml rows)"
            )
        if size > self.limit:
            raise _Permanent(
                f"IDX header says shape {shape} ({size:,} bytes), more than this file has ({self.limit:,} bytes)"
            )
        self.limit = size

    def feed(self, chunk: bytes) -> None:
        if self.gzip is None:
            self.undecided += chunk
            if len(self.undecided) < 2:
                return
            self.gzip = self.undecided[:2] == b"\x1f\x8b"
            chunk, self.undecided = self.undecided, b""
        if not self.gzip:
            self._emit(chunk)
            return
        while True:
            if self.inflater.eof:
                if not chunk:
                    return
                self.inflater = zlib.decompressobj(wbits=31)  # another gzip member follows
            try:
                data = self.inflater.decompress(chunk, CHUNK)
            except zlib.error as err:
                raise _Permanent(f"corrupt gzip data: {err}") from None
            self._emit(data)
            chunk = self.inflater.unused_data if self.inflater.eof else self.inflater.unconsumed_tail
            if not chunk and len(data) < CHUNK:
                return

    def finish(self) -> None:
        if self.gzip is None:  # 0 or 1 bytes in all
            self.gzip = False
            self._emit(self.undecided)
        if self.gzip and not self.inflater.eof:
            raise _Short("truncated gzip: the stream ends before the end-of-stream marker")
        if self.head is not None:
            self._check_header(final=True)
        if self.spec.kind != "csv" and self.written < self.limit:  # the header's size, once read
            raise _Short(f"content ends after {self.written:,} of the {self.limit:,} bytes its IDX header states")


def _store_verified(
    chunks: Iterator[bytes], spec: FileSpec, dest: Path, limit: int | None = None, rows: Mapping[str, int] | None = None
) -> None:
    """Un-gzip (when gzip) and hash on the fly, within `limit` bytes of content; rename onto
    `dest` only if the digest matches."""
    with atomic_path(dest) as tmp, tmp.open("wb") as out:
        content = _Content(spec, out, spec.budget(rows) if limit is None else limit, rows)
        for chunk in chunks:
            content.feed(chunk)
        content.finish()
        out.close()
        actual = content.digest.hexdigest()
        if actual != spec.sha256:
            raise _Permanent(
                f"checksum mismatch (sha256 of the decompressed content): expected {spec.sha256}, got {actual}"
            )


def fetch_file(
    spec: FileSpec, bases: Sequence[str], out_dir: Path, settings: FetchSettings, rows: Mapping[str, int] | None = None
) -> str:
    """Fetch one file from the first mirror that gives the right content; return its URL.

    Bounded at each mirror: at most `settings.deadline_s` (plus one read's timeout) over
    every try and pause, and at most the file's budget in bytes, sent or decompressed."""
    failures: list[str] = []
    limit = spec.budget(rows)
    for base in bases:
        url = _join(base, spec.name)
        deadline = time.monotonic() + settings.deadline_s
        for attempt in range(settings.retries + 1):
            try:
                left = deadline - time.monotonic()
                wait = max(min(settings.timeout_s, left), 0.001)
                stream, size = _open(url, wait, wire_cap(limit), cut=wait < settings.timeout_s)
                with stream, byte_bar(size, spec.name) as bar:
                    try:
                        _store_verified(
                            _chunks(stream, size, bar.update, deadline, wire_cap(limit)),
                            spec,
                            out_dir / spec.stored_name,
                            limit,
                            rows,
                        )
                    except _Short as err:
                        if size is not None or urllib.parse.urlsplit(url).scheme not in ("http", "https"):
                            raise
                        raise _Transient(f"{err} (sent without a Content-Length: cut short?)") from None
                return url
            except _Permanent as err:
                failures.append(f"  - {url}: {err}")
                break
            except _Transient as err:
                pause = settings.backoff_s * 2**attempt
                if attempt == settings.retries or time.monotonic() + pause >= deadline:
                    why = "" if attempt == settings.retries else f", its deadline ({settings.deadline_s:g} s) near"
                    failures.append(f"  - {url}: {err} (gave up after {attempt + 1} tries{why})")
                    break
                print(f"{url}: {err}; retrying in {pause:g} s", file=sys.stderr)
                time.sleep(pause)
    raise FetchError(f"could not fetch {spec.name} from any of {len(bases)} mirrors:\n" + "\n".join(failures))


def fetch_dataset(
    dataset: str,
    files: Mapping[str, Mapping[str, str]],
    mirrors: Sequence[str],
    out_dir: Path,
    settings: FetchSettings = FetchSettings(),
    env: Mapping[str, str] | None = None,
    rows: Mapping[str, int] | None = None,
) -> None:
    """Stage `fetch@<dataset>`: every file of the data set, verified, into `out_dir`; with
    `rows` (sources.yaml), an IDX file's header must state the split's sample count."""
    specs = parse_files(files)
    bases = mirror_bases(dataset, mirrors, os.environ if env is None else env)
    if not bases:
        raise FetchError(f"{dataset}: no mirrors configured and ${MIRROR_ENV} is not set")
    with atomic_dir(Path(out_dir)) as tmp:
        for spec in specs:
            url = fetch_file(spec, bases, tmp, settings, rows)
            print(f"{dataset}: {spec.stored_name} <- {url} (sha256 ok)", file=sys.stderr)
