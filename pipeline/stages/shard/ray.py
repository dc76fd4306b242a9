"""The shard stage on Ray (`shard.engine: ray`): each block of a split written as a part by a
Ray task, the split merged by the shard library's `merge_parts`.

Why the same bytes as the local engine: a block is a whole number of shards starting at a
multiple of `samples_per_shard`, and the library numbers a part's shards by their place in
the split, so the merged folder holds the files one writer gives. The manifest's digests are
sequential sha256 passes over the whole split, which parts cannot share: one more task
computes them beside the writers, with a digest of each block that its writer's must equal
(a source replaced between reads is refused, not written under the other's digests). A worker or node that dies is retried by Ray (a part's
complete shards are renamed into place, so a rerun writes the same files again); a part that
never arrives stops the stage with one line before `merge_parts`, which would refuse the
short split anyway. The output folder must be one every node writes to (a shared file
system, mounted at the same path on each: tasks are given absolute paths); the input may be
a folder there or an object-store URL every node reads.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any

from pipeline.core.atomic import atomic_dir
from pipeline.core.dataset import SPLITS
from pipeline.core.errors import DataError, reason
from pipeline.core.location import is_url
from pipeline.core.parquet import parse_sums, verify_checksum
from pipeline.shards.writer import merge_parts
from pipeline.stages.ray_cluster import RETRIES, cluster, gather
from pipeline.stages.shard.settings import ShardSettings
from pipeline.stages.shard.source import (
    Pins,
    check_folder,
    label_digests,
    plan_blocks,
    split_digests,
    split_line,
    write_block,
)


def split_source(parquet_dir: Path | str, split: str) -> Path | str:
    """Where a split's Parquet file is: a path in a folder, or a key under a URL."""
    if is_url(parquet_dir):
        return f"{str(parquet_dir).rstrip('/')}/{split}.parquet"
    return Path(parquet_dir) / f"{split}.parquet"


def verify_url(source: str) -> None:
    """A split at a URL checked against its folder's SHA256SUMS, as `verify_checksum` checks a
    local one: the bytes every task will read are the bytes the convert stage wrote."""
    import fsspec

    head, layout, name = source.rsplit("/", 2)
    sums = f"{head}/SHA256SUMS"
    try:
        with fsspec.open(sums, "rb", skip_instance_cache=True) as f:  # not one cached for another endpoint
            text = f.read(64 << 10).decode("ascii", "replace")
        digest = hashlib.sha256()
        with fsspec.open(source, "rb", skip_instance_cache=True) as f:
            while chunk := f.read(1 << 22):
                digest.update(chunk)
    except (OSError, ValueError) as err:
        raise DataError(f"{source}: cannot be checked against {sums} ({reason(err)})") from None
    wanted = parse_sums(text, sums).get(f"{layout}/{name}")
    if wanted is None:
        raise DataError(f"{sums}: no checksum for {layout}/{name}")
    if digest.hexdigest() != wanted:
        raise DataError(
            f"{source}: checksum mismatch: SHA256SUMS says {wanted[:16]}..., file is "
            f"{digest.hexdigest()[:16]}... (damaged after the convert stage wrote it)"
        )


def check_reads(
    source: Path | str, blocks: list, written: list[str], read: list[str], labels: str, digest: dict
) -> None:
    """Refuse a split whose writers read other samples than the digest pass (`read`, one
    `BlockHashes` digest a block) or whose labels changed since the first pass (`labels`)."""
    changed = [block for block, ours, theirs in zip(blocks, written, read, strict=True) if ours != theirs]
    if changed or digest["idx_sha256"]["labels"] != labels:
        where = f"samples {changed[0].first:,}.. " if changed else "its labels "
        raise DataError(
            f"{source}: changed while it was read ({where}differ between two reads); rerun once nothing writes to it"
        )


def shard_split_ray(
    ray: Any,
    source: Path | str,
    folder: Path,
    *,
    dataset: str,
    split: str,
    layout: ShardSettings,
    rows: int | None = None,
    pins: Pins | None = None,
    hook: Any = None,
) -> dict:
    """One split's Parquet -> parts written by Ray tasks -> one manifest (`merge_parts`), the
    same files `stream_split` writes. Labels checked against `pins` before any task starts."""
    _, labels_idx, count = label_digests(source, rows)
    if pins is not None:
        pins.check(source, "labels", labels_idx.hexdigest(), dataset, split)
    if count == 0:
        raise DataError(f"{source}: no samples")
    total, blocks = plan_blocks(source, layout.samples_per_shard, rows)
    write = ray.remote(write_block).options(max_retries=RETRIES, num_cpus=1)
    digests = ray.remote(split_digests).options(max_retries=RETRIES, num_cpus=1).remote(source, rows, blocks=blocks)
    refs = [
        write.remote(
            source,
            folder,
            block,
            total=total,
            dataset=dataset,
            split=split,
            layout=layout,
            hook=hook,
        )
        for block in blocks
    ]
    names = [f"{folder}: the part from sample {b.first:,} ({b.count:,} samples)" for b in blocks]
    *written, digest = gather(ray, [*refs, digests], [*names, f"{source}: the digest pass"])
    check_reads(source, blocks, written, digest.pop("blocks"), labels_idx.hexdigest(), digest)
    if pins is not None:
        pins.check(source, "images", digest["idx_sha256"]["images"], dataset, split)
    return merge_parts(folder, digest, total=total)


def shard_dataset_ray(
    parquet_dir: Path | str,
    out_dir: Path,
    dataset: str,
    layout: ShardSettings,
    rows: dict[str, int] | None = None,
    pins: dict[str, Pins] | None = None,
    hook: Any = None,
) -> None:
    """Stage `shard@<dataset>` on Ray: both splits checked as the local engine checks them,
    written by Ray tasks, and the whole folder swapped in at the end (both splits or neither)."""
    if not is_url(parquet_dir):
        check_folder(Path(parquet_dir))
        parquet_dir = Path(parquet_dir).absolute()  # a worker's working folder is not this process's
    said = []
    with cluster() as ray, atomic_dir(Path(out_dir).absolute()) as tmp:
        for split in SPLITS:
            source = split_source(parquet_dir, split)
            verify_url(str(source)) if is_url(source) else verify_checksum(Path(source))
            one = {"rows": (rows or {}).get(split), "pins": (pins or {}).get(split), "hook": hook}
            manifest = shard_split_ray(ray, source, tmp / split, dataset=dataset, split=split, layout=layout, **one)
            said.append(split_line(out_dir, split, manifest, engine="ray"))
    print("\n".join(said), file=sys.stderr)
