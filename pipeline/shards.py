"""Tensor shards on disk, and loaders that keep the accelerator fed.

Preprocessing happens once, here: each split becomes a few large safetensors files
(images uint8 [n, 28, 28], labels uint8 [n]; no pickle, memory-mappable), optionally
zstd-compressed, listed with sizes and sha256 in `manifest.json`. A few large shards
rather than many small files, because DVC (and every file system) pays per file.

Three ways to feed a training loop, fastest last:
- `ShardDataset`: map-style, with `__getitems__`, for code that keeps its DataLoader;
- `load_split`: the verified split as uint8 tensors on a device;
- `DeviceBatches`: the split resident on the device, shuffled there by a seeded generator,
  converted to float per batch; equal batch counts on every DDP rank.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import save as st_save
from safetensors.torch import load as st_load

from pipeline.atomic import atomic_dir

FORMAT_VERSION = 1
IMAGE_SHAPE = (28, 28)


class ShardError(ValueError):
    """A shard folder that does not match its manifest; the message names file and check."""


# ---------------------------------------------------------------- writing


def _zstd():
    import zstandard  # only the writer and zstd shards need it; the GPU machines lack it

    return zstandard


def shard_bytes(images: np.ndarray, labels: np.ndarray, compression: str, level: int) -> bytes:
    raw = st_save({"images": np.ascontiguousarray(images), "labels": np.ascontiguousarray(labels)})
    if compression == "none":
        return raw
    if compression == "zstd":
        return _zstd().ZstdCompressor(level=level).compress(raw)
    raise ValueError(f"shard compression must be 'none' or 'zstd', got {compression!r}")


def write_shards(images: np.ndarray, labels: np.ndarray, out_dir: Path, *, dataset: str, split: str,
                 samples_per_shard: int, compression: str = "none", level: int = 3,
                 source: dict | None = None) -> dict:
    """Write one split as shards plus manifest.json into `out_dir` (replaced whole)."""
    if images.dtype != np.uint8 or images.shape[1:] != IMAGE_SHAPE or len(images) != len(labels):
        raise ShardError(f"{dataset}/{split}: expected uint8 images [n, 28, 28] and n labels, "
                         f"got {images.dtype} {list(images.shape)} and {len(labels)} labels")
    if samples_per_shard < 1:
        raise ValueError("samples_per_shard must be at least 1")
    suffix = ".safetensors" + (".zst" if compression == "zstd" else "")
    entries = []
    with atomic_dir(Path(out_dir)) as tmp:
        for number, start in enumerate(range(0, len(images), samples_per_shard)):
            stop = min(start + samples_per_shard, len(images))
            blob = shard_bytes(images[start:stop], labels[start:stop], compression, level)
            name = f"shard-{number:05d}{suffix}"
            (tmp / name).write_bytes(blob)
            entries.append({"file": name, "count": stop - start, "bytes": len(blob),
                            "sha256": hashlib.sha256(blob).hexdigest()})
        manifest = {
            "format_version": FORMAT_VERSION,
            "dataset": dataset,
            "split": split,
            "count": int(len(images)),
            "images": {"dtype": "uint8", "shape": list(IMAGE_SHAPE)},
            "labels": {"dtype": "uint8"},
            "compression": {"codec": compression, "level": level if compression == "zstd" else None},
            "source": source or {},
            "shards": entries,
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def shard_dataset(parquet_dir: Path, out_dir: Path, dataset: str, samples_per_shard: int,
                  compression: str, level: int) -> None:
    """Stage `shard@<dataset>`: both splits of the Parquet under study into shards."""
    from pipeline.convert import read_parquet_arrays

    for split in ("train", "test"):
        source = Path(parquet_dir) / f"{split}.parquet"
        labels, images = read_parquet_arrays(source)
        digest = hashlib.sha256(source.read_bytes()).hexdigest()
        manifest = write_shards(images, labels, Path(out_dir) / split, dataset=dataset, split=split,
                                samples_per_shard=samples_per_shard, compression=compression,
                                level=level, source={"file": str(source), "sha256": digest})
        total = sum(s["bytes"] for s in manifest["shards"])
        print(f"{out_dir}/{split}: {len(manifest['shards'])} shards, {total / 1e6:.1f} MB", file=sys.stderr)


# ---------------------------------------------------------------- reading


def read_manifest(path: Path, dataset: str | None = None, split: str | None = None) -> dict:
    path = Path(path)
    file = path / "manifest.json"
    try:
        manifest = json.loads(file.read_text())
    except FileNotFoundError:
        raise ShardError(f"{file}: missing (is {path} a shard folder?)") from None
    except json.JSONDecodeError as err:
        raise ShardError(f"{file}: not valid JSON ({err})") from None
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ShardError(f"{file}: format_version {manifest.get('format_version')!r}, expected {FORMAT_VERSION}")
    for key, wanted in (("dataset", dataset), ("split", split)):
        if wanted is not None and manifest.get(key) != wanted:
            raise ShardError(f"{file}: manifest is for {key} {manifest.get(key)!r}, expected {wanted!r}")
    if sum(s["count"] for s in manifest["shards"]) != manifest["count"]:
        raise ShardError(f"{file}: shard counts do not add up to count {manifest['count']}")
    return manifest


def _read_shard(folder: Path, entry: dict, compression: str, verify: bool) -> dict[str, torch.Tensor]:
    path = folder / entry["file"]
    try:
        blob = path.read_bytes()
    except FileNotFoundError:
        raise ShardError(f"{path}: shard listed in the manifest is missing") from None
    if len(blob) != entry["bytes"]:
        raise ShardError(f"{path}: {len(blob):,} bytes, manifest says {entry['bytes']:,} (truncated?)")
    if verify:
        actual = hashlib.sha256(blob).hexdigest()
        if actual != entry["sha256"]:
            raise ShardError(f"{path}: checksum mismatch: manifest sha256 {entry['sha256']}, file {actual}")
    if compression == "zstd":
        blob = _zstd().ZstdDecompressor().decompress(blob)
    try:
        return st_load(blob)
    except Exception as err:  # safetensors raises its own error type for a bad header
        raise ShardError(f"{path}: not a readable safetensors shard ({err})") from None


def _check_tensor(path: Path, name: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tensor.dtype != torch.uint8 or tuple(tensor.shape) != shape:
        raise ShardError(f"{path}: tensor {name!r} is {tensor.dtype} {list(tensor.shape)}, "
                         f"expected torch.uint8 {list(shape)}")


def load_split(path: Path, device: str | torch.device = "cpu", *, dataset: str | None = None,
               split: str | None = None, verify: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole split as (images uint8 [n, 28, 28], labels uint8 [n]) on `device`.

    `verify=True` hashes every shard (sha256 runs at ~1-2 GB/s, a few ms per MNIST split);
    sizes, dtypes, shapes and counts are always checked.
    """
    folder = Path(path)
    manifest = read_manifest(folder, dataset, split)
    compression = manifest["compression"]["codec"]
    images = torch.empty((manifest["count"], *IMAGE_SHAPE), dtype=torch.uint8)
    labels = torch.empty(manifest["count"], dtype=torch.uint8)
    start = 0
    for entry in manifest["shards"]:
        tensors = _read_shard(folder, entry, compression, verify)
        shard_path, n = folder / entry["file"], entry["count"]
        for name in ("images", "labels"):
            if name not in tensors:
                raise ShardError(f"{shard_path}: no tensor {name!r}")
        _check_tensor(shard_path, "images", tensors["images"], (n, *IMAGE_SHAPE))
        _check_tensor(shard_path, "labels", tensors["labels"], (n,))
        images[start : start + n] = tensors["images"]
        labels[start : start + n] = tensors["labels"]
        start += n
    if labels.numel() and int(labels.max()) > 9:
        raise ShardError(f"{folder}: a label is outside 0..9")
    device = torch.device(device)
    if device.type == "cuda":
        return images.pin_memory().to(device, non_blocking=True), labels.pin_memory().to(device, non_blocking=True)
    return images.to(device), labels.to(device)


# ---------------------------------------------------------------- feeding a training loop


def to_float(images: torch.Tensor, mean: float | None = None, std: float | None = None,
             channels_last: bool = False, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 [b, 28, 28] -> float [b, 1, 28, 28] in 0..1 (optionally normalised), on its device."""
    x = images.unsqueeze(1).to(dtype).div_(255)
    if mean is not None and std is not None:
        x = x.sub_(mean).div_(std)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


class ShardDataset(torch.utils.data.Dataset):
    """Map-style view of a shard split. `__getitems__` serves a whole batch in one gather;
    use `collate_fn=ShardDataset.collate` (or `loader()`) so the DataLoader passes it through."""

    def __init__(self, path: Path, **load_kwargs) -> None:
        self.images, self.labels = load_split(path, "cpu", **load_kwargs)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return to_float(self.images[index : index + 1])[0], self.labels[index].long()

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.as_tensor(indices)
        return to_float(self.images[index]), self.labels[index].long()

    @staticmethod
    def collate(batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return batch

    def loader(self, batch_size: int, **kwargs) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(self, batch_size=batch_size, collate_fn=self.collate, **kwargs)


@dataclass
class DeviceBatches:
    """Batches from a split held on the device: no host work and no copies per step.

    Every epoch draws a fresh permutation from a generator seeded with (seed, epoch), so runs
    repeat exactly and epochs differ. With `world_size > 1` each rank takes a disjoint,
    equal-sized slice of the same permutation, so every rank yields the same number of
    batches (uneven counts hang DDP's collectives).
    """

    images: torch.Tensor
    labels: torch.Tensor
    batch_size: int
    shuffle: bool = True
    seed: int = 0
    drop_last: bool = False
    channels_last: bool = False
    mean: float | None = None
    std: float | None = None
    rank: int = 0
    world_size: int = 1
    dtype: torch.dtype = torch.float32
    epoch: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside 0..{self.world_size - 1}")
        self.per_rank = len(self.labels) // self.world_size

    def __len__(self) -> int:
        whole = self.per_rank // self.batch_size
        return whole if self.drop_last else math.ceil(self.per_rank / self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def indices(self, epoch: int) -> torch.Tensor:
        """This rank's sample order for `epoch`, on the data's device."""
        device = self.labels.device
        n = len(self.labels)
        if self.shuffle:
            generator = torch.Generator(device=device)
            generator.manual_seed(self.seed * 1_000_003 + epoch)
            order = torch.randperm(n, generator=generator, device=device)
        else:
            order = torch.arange(n, device=device)
        mine = order[: self.per_rank * self.world_size][self.rank :: self.world_size]
        return mine[: len(self) * self.batch_size] if self.drop_last else mine

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = self.indices(self.epoch)
        self.epoch += 1
        for start in range(0, len(order), self.batch_size):
            index = order[start : start + self.batch_size]
            yield (to_float(self.images[index], self.mean, self.std, self.channels_last, self.dtype),
                   self.labels[index].long())
