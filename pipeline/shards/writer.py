"""Writing shards: one writer, fed samples in batches of any size, memory bounded by one
shard whatever the size of the split.

`ShardWriter` fills one preallocated shard buffer and writes each shard as soon as it is
full (a full shard's worth handed over at once is written straight from the caller's
array, no copy). `write_shards` feeds it a split held in memory; the shard stage
(`pipeline.stages.shard`) feeds it record batches streamed from Parquet, so both give the
same bytes.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from pipeline.core.atomic import atomic_dir
from pipeline.shards.format import CODECS, IMAGE_SHAPE, ShardError, label_error, new_manifest, shard_file, write_manifest, zstd

def shard_bytes(images: np.ndarray, labels: np.ndarray, compression: str, level: int) -> bytes:
    from safetensors.numpy import save

    raw = save({"images": np.ascontiguousarray(images), "labels": np.ascontiguousarray(labels)})
    if compression == "none":
        return raw
    if compression == "zstd":
        return zstd().ZstdCompressor(level=level).compress(raw)
    raise ValueError(f"shard compression must be one of {CODECS}, got {compression!r}")


def _xxh3(data: bytes) -> str:
    import xxhash  # the writer runs where the project is installed

    return xxhash.xxh3_128_hexdigest(data)


class ShardWriter:
    """Samples in (any batch sizes), numbered shards out into `folder`; `finish` writes the
    manifest. Labels outside the format's classes are refused here, so neither feeder can write them."""

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
        error = label_error(labels, self.origin, ids=range(self.count, self.count + len(labels)))
        if error:
            raise error
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
