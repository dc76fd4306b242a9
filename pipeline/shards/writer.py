"""Writing shards: one writer, fed either a whole split in memory or Parquet record batches
streamed from disk, memory bounded by one shard whatever the size of the split.

`ShardWriter` fills one preallocated shard buffer and writes each shard as soon as it is
full (a full shard's worth handed over at once is written straight from the caller's
array, no copy). `write_shards` feeds it arrays (the GPU machines' standalone bench, tests);
the stage `shard_dataset` feeds it from `iter_samples`, so both give the same bytes.

The manifest's content digest, sha256 of all labels then all images, is what lets a codec
experiment write byte-identical shards (every codec holds the same samples). Streamed, it
takes two passes: the label column alone first (one byte a sample, read without the images:
Parquet is columnar), then the images as they stream.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.atomic import atomic_dir
from pipeline.errors import DataError, reason
from pipeline.idx import COLUMNS, PIXELS, SPLITS
from pipeline.manifest import CODECS, IMAGE_SHAPE, ShardError, new_manifest, shard_file, write_manifest


def _zstd():
    import zstandard  # imported where used: the GPU machines lack it

    return zstandard


def shard_bytes(images: np.ndarray, labels: np.ndarray, compression: str, level: int) -> bytes:
    from safetensors.numpy import save

    raw = save({"images": np.ascontiguousarray(images), "labels": np.ascontiguousarray(labels)})
    if compression == "none":
        return raw
    if compression == "zstd":
        return _zstd().ZstdCompressor(level=level).compress(raw)
    raise ValueError(f"shard compression must be one of {CODECS}, got {compression!r}")


def _xxh3(data: bytes) -> str:
    import xxhash  # the writer runs where the project is installed

    return xxhash.xxh3_128_hexdigest(data)


class ShardWriter:
    """Samples in (any batch sizes), numbered shards out into `folder`; `finish` writes the
    manifest. Labels outside 0..9 are refused here, so neither feeder can write them."""

    def __init__(self, folder: Path, *, dataset: str, split: str, samples_per_shard: int,
                 compression: str = "none", level: int = 3, origin: str | None = None) -> None:
        if samples_per_shard < 1:
            raise ValueError("samples_per_shard must be at least 1")
        if compression not in CODECS:
            raise ValueError(f"shard compression must be one of {CODECS}, got {compression!r}")
        self.folder, self.dataset, self.split = Path(folder), dataset, split
        self.origin = origin or f"{dataset}/{split}"  # what error messages name
        self.size, self.compression, self.level = samples_per_shard, compression, level
        self.labels = np.empty(0, np.uint8)  # the buffer, allocated on first partial shard
        self.images = np.empty((0, *IMAGE_SHAPE), np.uint8)
        self.filled = 0
        self.count = 0
        self.entries: list[dict] = []
        self.folder.mkdir(parents=True, exist_ok=True)

    def _write(self, images: np.ndarray, labels: np.ndarray) -> None:
        blob = shard_bytes(images, labels, self.compression, self.level)
        name = shard_file(len(self.entries), self.compression)
        (self.folder / name).write_bytes(blob)
        self.entries.append({"file": name, "count": len(labels), "bytes": len(blob),
                             "sha256": hashlib.sha256(blob).hexdigest(), "xxh3_128": _xxh3(blob)})

    def _flush(self) -> None:
        if self.filled:
            self._write(self.images[: self.filled], self.labels[: self.filled])
            self.filled = 0

    def add(self, labels: np.ndarray, images: np.ndarray) -> None:
        """labels uint8 [b], images uint8 [b, 28, 28] or [b, 784]."""
        images = images.reshape(len(images), *IMAGE_SHAPE)
        if labels.size and int(labels.max()) > 9:
            raise ShardError(f"{self.origin}: label {int(labels.max())} is outside 0..9")
        self.count += len(labels)
        while len(labels):
            if self.filled == 0 and len(labels) >= self.size:  # a whole shard: no copy
                self._write(images[: self.size], labels[: self.size])
                take = self.size
            else:
                if not len(self.labels):
                    self.labels = np.empty(self.size, np.uint8)
                    self.images = np.empty((self.size, *IMAGE_SHAPE), np.uint8)
                take = min(self.size - self.filled, len(labels))
                self.labels[self.filled : self.filled + take] = labels[:take]
                self.images[self.filled : self.filled + take] = images[:take]
                self.filled += take
                if self.filled == self.size:
                    self._flush()
            labels, images = labels[take:], images[take:]

    def finish(self, source: dict | None = None) -> dict:
        self._flush()
        manifest = new_manifest(dataset=self.dataset, split=self.split, count=self.count,
                                codec=self.compression, level=self.level, source=source or {},
                                shards=self.entries)
        write_manifest(self.folder, manifest)
        return manifest


def write_shards(images: np.ndarray, labels: np.ndarray, out_dir: Path, *, dataset: str, split: str,
                 samples_per_shard: int, compression: str = "none", level: int = 3,
                 source: dict | None = None) -> dict:
    """Write one split held in memory as shards plus manifest.json into `out_dir` (replaced whole)."""
    if images.dtype != np.uint8 or images.shape[1:] != IMAGE_SHAPE or len(images) != len(labels):
        raise ShardError(f"{dataset}/{split}: expected uint8 images [n, 28, 28] and n labels, "
                         f"got {images.dtype} {list(images.shape)} and {len(labels)} labels")
    with atomic_dir(Path(out_dir)) as tmp:
        writer = ShardWriter(tmp, dataset=dataset, split=split, samples_per_shard=samples_per_shard,
                             compression=compression, level=level)
        writer.add(np.asarray(labels, np.uint8), images)
        return writer.finish(source)


# ---------------------------------------------------------------- the stage: Parquet in, streamed


@contextmanager
def _parquet(path: Path) -> Iterator[pq.ParquetFile]:
    """The split opened for streaming. Any damage, found opening it (footer) or reading it
    (a page's CRC, a column missing or mistyped), becomes one error naming the file."""
    from pipeline.convert import check_types  # convert needs polars; `write_shards` runs without it

    try:
        # pre_buffer off + a 1 MiB buffered stream: pages are read as decoded, not whole
        # column chunks ahead (Arrow's peak on a 31 MB split: 4.3 MB against 26 MB).
        source = pq.ParquetFile(path, page_checksum_verification=True, pre_buffer=False, buffer_size=1 << 20)
        check_types(path, source.schema_arrow)
        yield source
    except DataError:
        raise
    except (OSError, ValueError, KeyError, pa.ArrowException) as err:
        raise DataError(f"{path}: not a readable Parquet split ({reason(err)})") from None


def _complete(path: Path, batch: pa.RecordBatch) -> pa.RecordBatch:
    """The batch, once none of its columns has a null."""
    from pipeline.convert import check_present

    for name, column in zip(batch.schema.names, batch.columns):
        check_present(path, name, column)
    return batch


def iter_samples(path: Path, batch_rows: int = 8192) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(labels [b], images [b, 784]) uint8 batches of a split, either layout, in file order."""
    with _parquet(path) as source:
        compact = "image" in source.schema_arrow.names
        columns = ["label", "image"] if compact else COLUMNS
        # use_threads=False: pyarrow's threaded reader decodes row groups ahead, which is
        # memory growing with the file; one at a time keeps it bounded.
        for batch in source.iter_batches(batch_size=batch_rows, columns=columns, use_threads=False):
            batch = _complete(path, batch)
            labels = batch.column(0).to_numpy()
            if compact:
                images = batch.column(1)
                flat = np.frombuffer(images.buffers()[1], np.uint8, len(images) * PIXELS, images.offset * PIXELS)
                yield labels, flat.reshape(len(images), PIXELS)
            else:
                by_column = np.stack([batch.column(i).to_numpy() for i in range(1, 785)])
                yield labels, np.ascontiguousarray(by_column.T)


def _label_digest(path: Path) -> hashlib._Hash:
    """sha256 over every label: the first pass, the label column only."""
    digest = hashlib.sha256()
    with _parquet(path) as source:
        for batch in source.iter_batches(batch_size=1 << 16, columns=["label"], use_threads=False):
            digest.update(_complete(path, batch).column(0).to_numpy().tobytes())
    return digest


def stream_split(source: Path, out_dir: Path, *, dataset: str, split: str, samples_per_shard: int,
                 compression: str = "none", level: int = 3, batch_rows: int = 8192) -> dict:
    """One split's Parquet -> shards + manifest.json in `out_dir` (new or empty)."""
    digest = _label_digest(source)
    writer = ShardWriter(out_dir, dataset=dataset, split=split, samples_per_shard=samples_per_shard,
                         compression=compression, level=level, origin=str(source))
    for labels, images in iter_samples(source, batch_rows):
        digest.update(images.tobytes())
        writer.add(labels, images)
    if writer.count == 0:
        raise DataError(f"{source}: no samples")
    return writer.finish({"content_sha256": digest.hexdigest()})


def shard_dataset(parquet_dir: Path, out_dir: Path, dataset: str, samples_per_shard: int,
                  compression: str, level: int) -> None:
    """Stage `shard@<dataset>`: both splits, checked against SHA256SUMS, streamed to shards;
    the whole folder swapped in at the end (both splits or neither)."""
    from pipeline.convert import verify_checksum

    with atomic_dir(Path(out_dir)) as tmp:
        for split in SPLITS:
            source = Path(parquet_dir) / f"{split}.parquet"
            verify_checksum(source)  # one flipped byte anywhere: refused, the file named
            manifest = stream_split(source, tmp / split, dataset=dataset, split=split,
                                    samples_per_shard=samples_per_shard, compression=compression, level=level)
            total = sum(s["bytes"] for s in manifest["shards"])
            print(f"{out_dir}/{split}: {len(manifest['shards'])} shards, {total / 1e6:.1f} MB", file=sys.stderr)
