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

from pipeline.core.atomic import atomic_dir, atomic_path
from pipeline.core.errors import InputError, is_hex
from pipeline.core.progress import byte_bar

MIRROR_ENV = "PIPELINE_MIRROR"
CHUNK = 1 << 20
ROLES = ("train_images", "train_labels", "test_images", "test_labels", "train_csv", "test_csv")


@dataclass(frozen=True)
class FileSpec:
    """One published file: its name on the mirrors and the sha256 of its content."""

    role: str
    name: str
    sha256: str

    @property
    def stored_name(self) -> str:
        """Role-based name, so later stages need not know each mirror's file names."""
        kind, what = self.role.rsplit("_", 1)
        return f"{kind}.csv" if what == "csv" else f"{kind}-{what}.idx"


@dataclass(frozen=True)
class FetchSettings:
    timeout_s: float = 30.0
    retries: int = 3
    backoff_s: float = 1.0


class FetchError(InputError):
    """Every mirror failed for one file; the message lists each mirror and why."""


class _Permanent(Exception):
    """This mirror will not give the right bytes: move on to the next one."""


class _Transient(Exception):
    """Worth another try at the same mirror after a pause."""


def parse_files(files: Mapping[str, Mapping[str, str]]) -> list[FileSpec]:
    """Validate a data set's `files` block from params.yaml."""
    specs = []
    for role, entry in files.items():
        if role not in ROLES:
            raise ValueError(f"unknown file role {role!r}; expected one of {ROLES}")
        sha = str(entry.get("sha256", "")).lower()
        if not is_hex(sha, 64):
            raise ValueError(f"file {role}: sha256 must be 64 hex digits, got {sha!r}")
        specs.append(FileSpec(role=role, name=str(entry["name"]), sha256=sha))
    roles = {s.role for s in specs}
    idx_roles, csv_roles = set(ROLES[:4]), set(ROLES[4:])
    if roles != idx_roles and roles != csv_roles:
        raise ValueError(
            f"a data set needs either the four IDX files {sorted(idx_roles)} or the two CSV "
            f"files {sorted(csv_roles)}; got {sorted(roles)}"
        )
    return specs


def load_sources(path: Path, dataset: str) -> tuple[dict, list[str]]:
    """(files, mirrors) of `dataset` from sources.yaml: the pins and where to look."""
    import yaml

    try:
        sources = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FetchError(f"{path}: no such sources file") from None
    except yaml.YAMLError as err:
        raise FetchError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
    entry = sources.get(dataset) if isinstance(sources, dict) else None
    if not isinstance(entry, dict) or not isinstance(entry.get("files"), dict):
        raise FetchError(f"{path}: no data set {dataset!r} with a `files` mapping "
                         f"(known: {sorted(sources) if isinstance(sources, dict) else []})")
    mirrors = entry.get("mirrors") or []
    if not isinstance(mirrors, list) or not all(isinstance(m, str) for m in mirrors):
        raise FetchError(f"{path}: {dataset}.mirrors must be a list of URLs or folders")
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


def _open(url: str, timeout_s: float) -> tuple[BinaryIO, int | None]:
    """Open a URL or a local path; http(s) honours the connect/read timeout."""
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme in ("http", "https"):
        request = urllib.request.Request(url, headers={"User-Agent": "mnist-pipeline/0.1"})
        try:
            response = urllib.request.urlopen(request, timeout=timeout_s)  # noqa: S310
        except urllib.error.HTTPError as err:
            cls = _Transient if err.code >= 500 or err.code == 429 else _Permanent
            raise cls(f"HTTP {err.code} {err.reason}") from None
        except (urllib.error.URLError, TimeoutError, socket.timeout, ConnectionError) as err:
            reason = getattr(err, "reason", err)
            raise _Transient(f"cannot connect: {reason}") from None
        length = response.headers.get("Content-Length")
        return response, int(length) if length else None
    path = Path(urllib.request.url2pathname(urllib.parse.urlsplit(url).path)) if scheme == "file" else Path(url)
    if not path.is_file():
        raise _Permanent("not found")
    return path.open("rb"), path.stat().st_size


def _chunks(stream: BinaryIO, expected: int | None, on_bytes: Callable[[int], None]) -> Iterator[bytes]:
    received = 0
    try:
        read = getattr(stream, "read1", stream.read)  # what has arrived, not a full MiB
        while chunk := read(CHUNK):
            received += len(chunk)
            on_bytes(len(chunk))
            yield chunk
    except (TimeoutError, socket.timeout):
        raise _Transient(f"read timed out after {received:,} bytes") from None
    except http.client.IncompleteRead:
        raise _Transient(f"truncated body: connection closed after {received:,} bytes") from None
    except (ConnectionError, http.client.HTTPException) as err:
        raise _Transient(f"connection broke after {received:,} bytes: {err!r}") from None
    if expected is not None and received != expected:
        raise _Transient(f"truncated body: got {received:,} of {expected:,} bytes")


def _store_verified(chunks: Iterator[bytes], spec: FileSpec, dest: Path) -> None:
    """Un-gzip (when gzip) and hash on the fly; rename onto `dest` only if the digest matches."""
    digest = hashlib.sha256()
    inflater: zlib._Decompress | None = None
    first = True
    with atomic_path(dest) as tmp, tmp.open("wb") as out:
        for chunk in chunks:
            if first:
                inflater = zlib.decompressobj(wbits=31) if chunk[:2] == b"\x1f\x8b" else None
                first = False
            while chunk:
                if inflater is None:
                    data, chunk = chunk, b""
                else:
                    try:
                        data = inflater.decompress(chunk)
                    except zlib.error as err:
                        raise _Permanent(f"corrupt gzip data: {err}") from None
                    chunk = inflater.unused_data
                    if inflater.eof and chunk:  # another gzip member follows
                        inflater = zlib.decompressobj(wbits=31)
                digest.update(data)
                out.write(data)
        if inflater is not None and not inflater.eof:
            raise _Permanent("truncated gzip: the stream ends before the end-of-stream marker")
        out.close()
        actual = digest.hexdigest()
        if actual != spec.sha256:
            raise _Permanent(
                f"checksum mismatch (sha256 of the decompressed content): expected "
                f"{spec.sha256}, got {actual}"
            )


def fetch_file(spec: FileSpec, bases: Sequence[str], out_dir: Path, settings: FetchSettings) -> str:
    """Fetch one file from the first mirror that gives the right content; return its URL."""
    failures: list[str] = []
    for base in bases:
        url = _join(base, spec.name)
        for attempt in range(settings.retries + 1):
            try:
                stream, size = _open(url, settings.timeout_s)
                with stream, byte_bar(size, spec.name) as bar:
                    _store_verified(_chunks(stream, size, bar.update), spec, out_dir / spec.stored_name)
                return url
            except _Permanent as err:
                failures.append(f"  - {url}: {err}")
                break
            except _Transient as err:
                if attempt == settings.retries:
                    failures.append(f"  - {url}: {err} (gave up after {attempt + 1} tries)")
                    break
                pause = settings.backoff_s * 2**attempt
                print(f"{url}: {err}; retrying in {pause:g} s", file=sys.stderr)
                time.sleep(pause)
    raise FetchError(
        f"could not fetch {spec.name} from any of {len(bases)} mirrors:\n" + "\n".join(failures)
    )


def fetch_dataset(
    dataset: str,
    files: Mapping[str, Mapping[str, str]],
    mirrors: Sequence[str],
    out_dir: Path,
    settings: FetchSettings = FetchSettings(),
    env: Mapping[str, str] | None = None,
) -> None:
    """Stage `fetch@<dataset>`: every file of the data set, verified, into `out_dir`."""
    specs = parse_files(files)
    bases = mirror_bases(dataset, mirrors, os.environ if env is None else env)
    if not bases:
        raise FetchError(f"{dataset}: no mirrors configured and ${MIRROR_ENV} is not set")
    with atomic_dir(Path(out_dir)) as tmp:
        for spec in specs:
            url = fetch_file(spec, bases, tmp, settings)
            print(f"{dataset}: {spec.stored_name} <- {url} (sha256 ok)", file=sys.stderr)
