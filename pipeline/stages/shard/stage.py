"""Stage `shard@<dataset>`: the convert stage's Parquet, checked, streamed into shards.

Memory stays bounded by one shard whatever the size of the split: record batches are read
one row group at a time (`source`) and handed to the library's `ShardWriter`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pipeline.core.atomic import atomic_dir
from pipeline.core.dataset import IMAGE_SHAPE, SPLITS, idx_sha256
from pipeline.core.errors import DataError
from pipeline.core.parquet import verify_checksum
from pipeline.stages.shard.settings import ShardSettings
from pipeline.stages.shard.source import Pins, check_folder, iter_samples, label_digests, mnist_writer, split_line


def stream_split(
    source: Path,
    out_dir: Path,
    *,
    dataset: str,
    split: str,
    layout: ShardSettings,
    batch_rows: int = 8192,
    rows: int | None = None,
    pins: Pins | None = None,
) -> dict:
    """One split's Parquet -> shards + manifest.json in `out_dir` (new or empty); with `rows`
    (sources.yaml), the file must hold exactly that many, checked before a page is read and
    again as they stream (row groups that state fewer rows than their pages hold). With
    `pins`, its labels (before any shard is written) and its images must be the published
    files' samples, in their order. The manifest's `source` records both IDX digests."""
    digest, labels_idx, count = label_digests(source, rows)
    if pins is not None:
        pins.check(source, "labels", labels_idx.hexdigest(), dataset, split)
    images_idx = idx_sha256((count, *IMAGE_SHAPE))
    written_labels = idx_sha256((count,))  # the labels of this second read, to match the first's
    writer = mnist_writer(out_dir, source, dataset, split, layout)
    for labels, images in iter_samples(source, batch_rows, rows):
        written_labels.update(labels.tobytes())
        digest.update(images.tobytes())
        images_idx.update(images.tobytes())
        if writer.count + len(labels) > count:
            raise DataError(f"{source}: more rows than its footer states ({count:,})")
        writer.add({"images": images.reshape(len(images), *IMAGE_SHAPE), "labels": labels})
    if writer.count != count:
        raise DataError(f"{source}: {writer.count:,} rows, but its footer states {count:,}")
    if writer.count == 0:
        raise DataError(f"{source}: no samples")
    if written_labels.hexdigest() != labels_idx.hexdigest():
        raise DataError(
            f"{source}: changed while it was read (its labels differ between two reads); rerun once nothing writes to it"
        )
    if pins is not None:
        pins.check(source, "images", images_idx.hexdigest(), dataset, split)
    return writer.finish(
        {
            "content_sha256": digest.hexdigest(),
            "idx_sha256": {"images": images_idx.hexdigest(), "labels": labels_idx.hexdigest()},
        }
    )


def shard_dataset(
    parquet_dir: Path,
    out_dir: Path,
    dataset: str,
    layout: ShardSettings,
    rows: dict[str, int] | None = None,
    pins: dict[str, Pins] | None = None,
) -> None:
    """Stage `shard@<dataset>`: both splits, checked against SHA256SUMS (and, given `rows`
    and `pins` per split, against the data set's row counts and published files), streamed
    to shards; the whole folder swapped in at the end (both splits or neither). The layout's
    engine "ray" writes each split's blocks as Ray tasks (pipeline.stages.shard.ray): same bytes."""
    if layout.engine == "ray":
        from pipeline.stages.shard.ray import shard_dataset_ray

        shard_dataset_ray(parquet_dir, out_dir, dataset, layout, rows=rows, pins=pins)
        return
    check_folder(Path(parquet_dir))
    said = []
    with atomic_dir(Path(out_dir)) as tmp:
        for split in SPLITS:
            source = Path(parquet_dir) / f"{split}.parquet"
            verify_checksum(source)  # one flipped byte anywhere: refused, the file named
            one = {"rows": (rows or {}).get(split), "pins": (pins or {}).get(split)}
            manifest = stream_split(source, tmp / split, dataset=dataset, split=split, layout=layout, **one)
            said.append(split_line(out_dir, split, manifest))
    print("\n".join(said), file=sys.stderr)
