"""A split's Parquet read as samples, checked, and cut into blocks: what both engines of the
shard stage share (the local one streams a split through `iter_samples`; Ray tasks each
write a `Block`).

The manifest's content digest, sha256 of all labels then all images, is what lets a codec
experiment write byte-identical shards (every codec holds the same samples). Streamed, it
takes two passes: the label column alone first (one byte a sample, read without the images:
Parquet is columnar), then the images as they stream.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.core.dataset import COLUMNS, IMAGE_SHAPE, PIXELS, SPLITS, idx_sha256
from pipeline.core.errors import DataError, reason
from pipeline.core.location import is_url
from pipeline.core.parquet import LAYOUTS, check_present, check_types
from pipeline.core.sources import idx_pins, pin_owners
from pipeline.shards.writer import ShardWriter
from pipeline.stages.mnist import MNIST
from pipeline.stages.shard.settings import ShardSettings


@contextmanager
def _parquet(path: Path | str, rows: int | None = None) -> Iterator[pq.ParquetFile]:
    """The split opened for streaming, its columns and (given `rows`) its row count checked
    before any page is read. Any damage, found opening it (footer) or reading it (a page's
    CRC, a column missing or mistyped), becomes one error naming the file. A URL is read
    through fsspec (the Ray engine's tasks read a split from object storage)."""
    with contextlib.ExitStack() as stack:
        try:
            opened = stack.enter_context(_open_url(str(path))) if is_url(path) else path
            # pre_buffer off + a 1 MiB buffered stream: pages are read as decoded, not whole
            # column chunks ahead: Arrow's peak stays near a page, not a column chunk.
            source = pq.ParquetFile(opened, page_checksum_verification=True, pre_buffer=False, buffer_size=1 << 20)
        except (OSError, ValueError, KeyError, pa.ArrowException) as err:
            raise DataError(f"{path}: not a readable Parquet split ({reason(err)})") from None
        with _checked(path, source, rows):
            yield source


def _open_url(url: str) -> Any:
    """The object at `url`, open for reading through fsspec (the `[s3]` extra for s3://)."""
    import fsspec

    return fsspec.open(url, "rb", skip_instance_cache=True).open()  # not one cached for another endpoint


@contextmanager
def _checked(path: Path | str, source: pq.ParquetFile, rows: int | None) -> Iterator[None]:
    """Columns and row count checked; damage found while the caller reads becomes one error."""
    try:
        check_types(path, source.schema_arrow)
        names = set(source.schema_arrow.names)
        wanted = ["label", "image"] if "image" in names else COLUMNS
        missing = [name for name in wanted if name not in names]
        if missing:
            raise DataError(
                f"{path}: no {missing[0]!r} column ({len(missing)} missing): neither layout the convert "
                f"stage writes (columns: {sorted(names)[:5]}...)"
            )
        if rows is not None and source.metadata.num_rows != rows:
            raise DataError(
                f"{path}: {source.metadata.num_rows:,} rows, but the data set's split has {rows:,} (sources.yaml rows)"
            )
        yield
    except DataError:
        raise
    except (OSError, ValueError, KeyError, pa.ArrowException) as err:
        raise DataError(f"{path}: not a readable Parquet split ({reason(err)})") from None


def _complete(path: Path, batch: pa.RecordBatch) -> pa.RecordBatch:
    """The batch, once none of its columns has a null."""
    for name, column in zip(batch.schema.names, batch.columns):
        check_present(path, name, column)
    return batch


def iter_samples(
    path: Path | str, batch_rows: int = 8192, rows: int | None = None, row_groups: list[int] | None = None
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(labels [b], images [b, 784]) uint8 batches of a split, either layout, in file order
    (only `row_groups`, when given: a Ray task reads its own part of the split)."""
    with _parquet(path, rows) as source:
        compact = "image" in source.schema_arrow.names
        columns = ["label", "image"] if compact else COLUMNS
        # use_threads=False: pyarrow's threaded reader decodes row groups ahead, which is
        # memory growing with the file; one at a time keeps it bounded.
        for batch in source.iter_batches(
            batch_size=batch_rows, row_groups=row_groups, columns=columns, use_threads=False
        ):
            batch = _complete(path, batch)
            labels = batch.column(0).to_numpy()
            if compact:
                images = batch.column(1)
                flat = np.frombuffer(images.buffers()[1], np.uint8, len(images) * PIXELS, images.offset * PIXELS)
                yield labels, flat.reshape(len(images), PIXELS)
            else:
                by_column = np.stack([batch.column(i).to_numpy() for i in range(1, 785)])
                yield labels, np.ascontiguousarray(by_column.T)


def label_digests(path: Path | str, rows: int | None = None) -> tuple[Any, Any, int]:
    """The first pass, the label column only: sha256 over every label (the content digest's
    start), sha256 of the labels as an IDX file, and the row count."""
    content = hashlib.sha256()
    with _parquet(path, rows) as source:
        count = source.metadata.num_rows
        idx = idx_sha256((count,))
        for batch in source.iter_batches(batch_size=1 << 16, columns=["label"], use_threads=False):
            labels = _complete(path, batch).column(0).to_numpy().tobytes()
            content.update(labels)
            idx.update(labels)
    return content, idx, count


@dataclass(frozen=True)
class Pins:
    """What a split's samples must be: the sha256 of its images and of its labels as IDX
    files (sources.yaml's pins of the published files), and which data set and file each
    pinned digest belongs to, to name what a mislabelled input holds."""

    images: str
    labels: str
    owners: dict[str, str]

    def check(self, path: Path, kind: str, got: str, dataset: str, split: str) -> None:
        wanted = getattr(self, kind)
        if got != wanted:
            holds = self.owners.get(got, "samples no data set in sources.yaml has")
            raise DataError(
                f"{path}: holds {holds}, not {dataset}'s {split} {kind} (sha256 of the {kind} as an "
                f"IDX file: {got[:16]}..., sources.yaml pins {wanted[:16]}...)"
            )


def published_pins(sources: Path, dataset: str) -> dict[str, Pins] | None:
    """{split: Pins} of `dataset` from sources.yaml; None for a data set published as CSV
    (its pins are of CSV text, which the samples alone do not fix)."""
    pinned = idx_pins(sources, dataset)
    if pinned is None:
        return None
    owners = pin_owners(sources)
    return {split: Pins(pinned[f"{split}_images"], pinned[f"{split}_labels"], owners) for split in SPLITS}


@dataclass(frozen=True)
class Block:
    """Samples `first`..`first + count` of a split, a whole number of shards (the last may be
    short), read from `row_groups` after skipping `skip` rows of the first of them."""

    first: int
    count: int
    row_groups: tuple[int, ...]
    skip: int


class BlockHashes:
    """sha256 of each block's labels and images, fed a split's samples in order from the first
    block's start: what each Ray writer read, to set beside what the digest pass read (a
    source replaced between the two reads would otherwise be written under the other's
    digests)."""

    def __init__(self, blocks: list[Block]) -> None:
        self.ends = [b.first + b.count for b in blocks]
        self.hashes = [(hashlib.sha256(), hashlib.sha256()) for _ in blocks]
        self.at, self.index, self.seen = blocks[0].first, 0, 0

    def update(self, source: Path | str, labels: np.ndarray, images: np.ndarray) -> None:
        start = 0
        while start < len(labels):
            if self.at == self.ends[-1]:
                raise DataError(f"{source}: more rows than its footer states ({self.ends[-1]:,})")
            take = min(len(labels) - start, self.ends[self.index] - self.at)
            self.hashes[self.index][0].update(labels[start : start + take].tobytes())
            self.hashes[self.index][1].update(images[start : start + take].tobytes())
            self.at, self.seen, start = self.at + take, self.seen + take, start + take
            if self.at == self.ends[self.index] and self.index + 1 < len(self.ends):
                self.index += 1

    def hexdigests(self) -> list[str]:
        return [f"{labels.hexdigest()}:{images.hexdigest()}" for labels, images in self.hashes]


def split_digests(
    source: Path | str, rows: int | None = None, batch_rows: int = 8192, blocks: list[Block] | None = None
) -> dict:
    """The manifest's `source` of a split (content digest, both IDX digests), computed as
    `stream_split` computes them: each is one sequential sha256 over the whole split, so the
    Ray engine runs this as one task beside the writers, which cannot share a hash. Given
    `blocks`, "blocks" adds each block's `BlockHashes` digest, to set beside its writer's."""
    digest, labels_idx, count = label_digests(source, rows)
    images_idx = idx_sha256((count, *IMAGE_SHAPE))
    parts = BlockHashes(blocks or [Block(0, count, (), 0)])
    for labels, images in iter_samples(source, batch_rows, rows):
        digest.update(images.tobytes())
        images_idx.update(images.tobytes())
        parts.update(source, labels, images)
    if parts.seen != count:
        raise DataError(f"{source}: {parts.seen:,} rows, but its footer states {count:,}")
    out = {
        "content_sha256": digest.hexdigest(),
        "idx_sha256": {"images": images_idx.hexdigest(), "labels": labels_idx.hexdigest()},
    }
    return {**out, "blocks": parts.hexdigests()} if blocks is not None else out


def plan_blocks(source: Path | str, samples_per_shard: int, rows: int | None = None) -> tuple[int, list[Block]]:
    """(the split's rows, its blocks): each block whole shards, at least one row group's worth,
    so that a task decodes little it then skips and `merge_parts` can tile the split."""
    with _parquet(source, rows) as parquet:
        meta = parquet.metadata
        sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    total = meta.num_rows
    step = max(1, -(-max(sizes, default=1) // samples_per_shard)) * samples_per_shard
    starts = np.cumsum([0, *sizes])
    blocks = []
    for first in range(0, total, step):
        count = min(step, total - first)
        groups = [i for i in range(len(sizes)) if starts[i] < first + count and starts[i + 1] > first]
        blocks.append(Block(first, count, tuple(groups), first - int(starts[groups[0]])))
    return total, blocks


def mnist_writer(
    folder: Path,
    source: Path | str,
    dataset: str,
    split: str,
    layout: ShardSettings,
    **part,
) -> ShardWriter:
    """The writer of one split's MNIST samples from `source` (`part`: a block's `first_sample`
    and `total`), the same for both engines, so their shards are the same bytes."""
    return ShardWriter(
        folder,
        sample=MNIST,
        dataset=dataset,
        split=split,
        samples_per_shard=layout.samples_per_shard,
        compression=layout.compression,
        level=layout.level,
        origin=str(source),
        **part,
    )


def split_line(out_dir: Path, split: str, manifest: dict, engine: str = "") -> str:
    """What each engine says of a split's shards, once the folder holding both is in place
    (said before, it would name shards a failing split then throws away)."""
    size = sum(s["bytes"] for s in manifest["shards"])
    note = f" (engine: {engine})" if engine else ""
    return f"{out_dir}/{split}: {len(manifest['shards'])} shards, {size / 1e6:.1f} MB{note}"


def write_block(
    source: Path | str,
    folder: Path,
    block: Block,
    *,
    total: int,
    dataset: str,
    split: str,
    layout: ShardSettings,
    batch_rows: int = 8192,
    hook: Any = None,
) -> str:
    """One block of a split written as a part (`ShardWriter` with `first_sample`) into
    `folder`: a Ray task's work. Memory: one shard and one batch, whatever the split. `hook`
    (tests only) is called with (first, samples written) after each batch. Returns the
    `BlockHashes` digest of the samples it wrote."""
    read = BlockHashes([block])
    with mnist_writer(folder, source, dataset, split, layout, first_sample=block.first, total=total) as writer:
        skip = block.skip
        for labels, images in iter_samples(source, batch_rows, row_groups=list(block.row_groups)):
            start = min(skip, len(labels))
            skip -= start
            take = slice(start, min(len(labels), start + block.count - writer.count))
            if take.stop > take.start:
                read.update(source, labels[take], images[take])
                writer.add({"images": images[take].reshape(-1, *IMAGE_SHAPE), "labels": labels[take]})
                if hook is not None:
                    hook(block.first, writer.count)
            if writer.count == block.count:
                break
        if writer.count != block.count:
            raise DataError(
                f"{source}: samples {block.first:,}.. hold {writer.count:,} rows, but its footer "
                f"states {block.count:,} there"
            )
        writer.finish()
    return read.hexdigests()[0]


def parquet_source(given: str, engine: str) -> Path | str:
    """The shard stage's `--parquet`: an existing folder, or (engine ray) a URL."""
    if is_url(given):
        if engine != "ray":
            raise DataError(
                f"{given}: a URL is read by shard.engine ray only; copy it to a folder, or set shard.engine: ray"
            )
        return given
    if not Path(given).is_dir():
        raise DataError(f"{given}: no such folder (the convert stage's <codec>/<layout> folder)")
    return Path(given)


def check_folder(folder: Path) -> None:
    """A folder holding the splits' Parquet files; one level too high is named as such."""
    if (folder / f"{SPLITS[0]}.parquet").exists() or not folder.is_dir():
        return
    inside = sorted(p.name for p in folder.iterdir() if p.is_dir())[:8]
    layouts = [name for name in inside if name in LAYOUTS]
    hint = (
        f"pass a layout folder: {folder / layouts[0]}"
        if layouts
        else "pass the convert stage's <codec>/<layout> folder, e.g. data/parquet/<dataset>/zstd-3/compact"
    )
    raise DataError(f"{folder}: holds no {SPLITS[0]}.parquet (folders: {', '.join(inside) or 'none'}): {hint}")
