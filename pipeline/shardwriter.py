"""The shard stage, streaming: Parquet record batches in, shards out, memory bounded by one
shard whatever the size of the split.

`shards.write_shards` takes a whole split in memory, which is fine for MNIST and not for a
500 GB image set. This writer reads the Parquet file in record batches, fills one
preallocated shard buffer, and writes each shard as soon as it is full, through the same
`shard_bytes` and manifest entries, so its output is byte-identical to the in-memory writer's
(tested). The manifest's content digest, sha256 of all labels then all images, is computed
in two passes: the label column alone first (one byte a sample, read without the images:
Parquet is columnar), then the images as they stream.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from pipeline.atomic import atomic_dir
from pipeline.convert import IMAGE_TYPE, verify_checksum
from pipeline.errors import DataError
from pipeline.idx import COLUMNS, PIXELS, SPLITS
from pipeline.shards import FORMAT_VERSION, IMAGE_SHAPE, _xxh3, shard_bytes


def _open(path: Path) -> pq.ParquetFile:
    try:
        # pre_buffer off + a 1 MiB buffered stream: pages are read as decoded, not whole
        # column chunks ahead (Arrow's peak on a 31 MB split: 4.3 MB against 26 MB).
        return pq.ParquetFile(path, page_checksum_verification=True, pre_buffer=False, buffer_size=1 << 20)
    except Exception as err:  # pyarrow raises several kinds for a damaged footer
        raise DataError(f"{path}: not a readable Parquet file ({str(err).splitlines()[0][:200]})") from None


def iter_samples(path: Path, batch_rows: int = 8192) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(labels [b], images [b, 784]) uint8 batches of a split, either layout, in file order."""
    source = _open(path)
    compact = "image" in source.schema_arrow.names
    columns = ["label", "image"] if compact else COLUMNS
    try:
        # use_threads=False: pyarrow's threaded reader decodes row groups ahead, which is
        # memory growing with the file; one at a time keeps it bounded.
        for batch in source.iter_batches(batch_size=batch_rows, columns=columns, use_threads=False):
            labels = batch.column(0).to_numpy(zero_copy_only=False).astype(np.uint8, copy=False)
            if compact:
                images = batch.column(1)
                if images.type != IMAGE_TYPE:
                    raise DataError(f"{path}: column 'image' is {images.type}, expected {IMAGE_TYPE}")
                flat = np.frombuffer(images.buffers()[1], np.uint8, len(images) * PIXELS, images.offset * PIXELS)
                yield labels, flat.reshape(len(images), PIXELS)
            else:
                by_column = np.stack([batch.column(i).to_numpy(zero_copy_only=False) for i in range(1, 785)])
                yield labels, np.ascontiguousarray(by_column.T).astype(np.uint8, copy=False)
    except OSError as err:
        raise DataError(f"{path}: not a readable Parquet file ({str(err).splitlines()[0][:200]})") from None


def _label_digest(path: Path) -> tuple[hashlib._Hash, int]:
    """sha256 over every label (first pass: the label column only), and the sample count."""
    digest, count = hashlib.sha256(), 0
    for batch in _open(path).iter_batches(batch_size=1 << 16, columns=["label"]):
        labels = batch.column(0).to_numpy(zero_copy_only=False).astype(np.uint8, copy=False)
        digest.update(labels.tobytes())
        count += len(labels)
    return digest, count


def stream_split(source: Path, out_dir: Path, *, dataset: str, split: str, samples_per_shard: int,
                 compression: str = "none", level: int = 3, batch_rows: int = 8192) -> dict:
    """One split's Parquet -> shards + manifest.json in `out_dir` (which must be new/empty)."""
    digest, count = _label_digest(source)
    if count == 0:
        raise DataError(f"{source}: no samples")
    suffix = ".safetensors" + (".zst" if compression == "zstd" else "")
    labels = np.empty(samples_per_shard, np.uint8)
    images = np.empty((samples_per_shard, *IMAGE_SHAPE), np.uint8)
    flat = images.reshape(samples_per_shard, PIXELS)
    entries: list[dict] = []
    filled = 0

    def flush() -> None:
        nonlocal filled
        blob = shard_bytes(images[:filled], labels[:filled], compression, level)
        name = f"shard-{len(entries):05d}{suffix}"
        (out_dir / name).write_bytes(blob)
        entries.append({"file": name, "count": filled, "bytes": len(blob),
                        "sha256": hashlib.sha256(blob).hexdigest(), "xxh3_128": _xxh3(blob)})
        filled = 0

    out_dir.mkdir(parents=True, exist_ok=True)
    for batch_labels, batch_images in iter_samples(source, batch_rows):
        digest.update(batch_images.tobytes())
        if batch_labels.size and int(batch_labels.max()) > 9:
            raise DataError(f"{source}: a label is outside 0..9")
        while len(batch_labels):
            take = min(samples_per_shard - filled, len(batch_labels))
            labels[filled:filled + take] = batch_labels[:take]
            flat[filled:filled + take] = batch_images[:take]
            filled += take
            batch_labels, batch_images = batch_labels[take:], batch_images[take:]
            if filled == samples_per_shard:
                flush()
    if filled:
        flush()
    manifest = {
        "format_version": FORMAT_VERSION, "dataset": dataset, "split": split, "count": count,
        "images": {"dtype": "uint8", "shape": list(IMAGE_SHAPE)}, "labels": {"dtype": "uint8"},
        "compression": {"codec": compression, "level": level if compression == "zstd" else None},
        "source": {"content_sha256": digest.hexdigest()}, "shards": entries,
    }
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def shard_dataset_streaming(parquet_dir: Path, out_dir: Path, dataset: str, samples_per_shard: int,
                            compression: str, level: int) -> None:
    """Stage `shard@<dataset>`: both splits, checked against SHA256SUMS, streamed to shards;
    the whole folder swapped in at the end (both splits or neither)."""
    with atomic_dir(Path(out_dir)) as tmp:
        for split in SPLITS:
            source = Path(parquet_dir) / f"{split}.parquet"
            verify_checksum(source)
            manifest = stream_split(source, tmp / split, dataset=dataset, split=split,
                                    samples_per_shard=samples_per_shard, compression=compression, level=level)
            total = sum(s["bytes"] for s in manifest["shards"])
            print(f"{out_dir}/{split}: {len(manifest['shards'])} shards, {total / 1e6:.1f} MB", file=sys.stderr)
