"""Time to load a whole split into memory, by storage format.

    python benchmarks/shard_load.py data/parquet/mnist/zstd-3/compact/train.parquet

Side by side in one run: the previous loader (read + sha256 + parse + copy), shards
(uncompressed, memory-mapped, verified with xxh3, sha256 or not at all),
shards (zstd), the compact Parquet, torch.load of one tensor file, safetensors' own
loader, and a plain in-memory copy of the same bytes (the ceiling). MB/s counts the
decompressed uint8 data (images + labels). Each is run `--repeat` times (file in page
cache) and the best is shown, with the time to the first batch of 512 ready on the CPU.
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load as load_bytes
from safetensors.torch import load_file

from pipeline.bench.model import MODEL_INPUT
from pipeline.core.parquet import read_parquet_arrays
from pipeline.shards import DeviceBatches, read_split, write_split
from pipeline.shards.format import V2_SAMPLE


def as_columns(loaded) -> dict[str, torch.Tensor]:
    """What a case returns ({field: tensor} from `read_split`, or (images, labels)) as columns."""
    return loaded if isinstance(loaded, dict) else dict(zip(("images", "labels"), loaded, strict=True))


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


# read_parquet_arrays hands out read-only views of Arrow buffers; they are only read here.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("parquet", type=Path)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    labels, images = read_parquet_arrays(args.parquet)
    megabytes = (images.nbytes + labels.nbytes) / 1e6
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        columns = {"images": images, "labels": labels}
        write_split(columns, tmp / "plain", sample=V2_SAMPLE, dataset="d", split="train", samples_per_shard=32768)
        write_split(
            columns,
            tmp / "zstd",
            sample=V2_SAMPLE,
            dataset="d",
            split="train",
            samples_per_shard=32768,
            compression="zstd",
            level=3,
        )
        torch.save({"images": torch.from_numpy(images.copy()), "labels": torch.from_numpy(labels.copy())}, tmp / "t.pt")

        def first_batch(load):
            # float images and int64 labels, as the model takes them
            return next(iter(DeviceBatches(as_columns(load()), 512, shuffle=True, seed=0, transform=list(MODEL_INPUT))))

        def memcpy():
            return torch.from_numpy(np.array(images)), torch.from_numpy(np.array(labels))

        def safetensors_own():
            parts = [load_file(path) for path in sorted((tmp / "plain").glob("*.safetensors"))]
            return torch.cat([p["images"] for p in parts]), torch.cat([p["labels"] for p in parts])

        def previous_loader():
            # What the shard loader did before this benchmark's change: read the file, hash it
            # with sha256, parse it into tensors, copy those into the output.
            out_images, out_labels = (
                torch.empty(images.shape, dtype=torch.uint8),
                torch.empty(len(labels), dtype=torch.uint8),
            )
            start = 0
            for path in sorted((tmp / "plain").glob("*.safetensors")):
                blob = path.read_bytes()
                hashlib.sha256(blob).hexdigest()
                part = load_bytes(blob)
                stop = start + len(part["labels"])
                out_images[start:stop], out_labels[start:stop] = part["images"], part["labels"]
                start = stop
            return out_images, out_labels

        cases = {
            "previous loader (read, sha256, copy)": previous_loader,
            "memory copy (the ceiling)": memcpy,
            "shards, none, xxh3 verified": lambda: read_split(tmp / "plain"),
            "shards, none, sha256 verified": lambda: read_split(tmp / "plain", verify="sha256"),
            "shards, none, unverified": lambda: read_split(tmp / "plain", verify="none"),
            "shards, zstd-3, xxh3 verified": lambda: read_split(tmp / "zstd"),
            "safetensors load_file + cat": safetensors_own,
            "parquet compact (this codec)": lambda: tuple(
                map(torch.from_numpy, read_parquet_arrays(args.parquet)[::-1])
            ),
            "torch.load one tensor file": lambda: tuple(torch.load(tmp / "t.pt").values()),
        }
        print(f"{args.parquet}: {len(labels):,} samples, {megabytes:.1f} MB decompressed")
        for name, load in cases.items():
            seconds = best(load, args.repeat)
            to_batch = best(lambda: first_batch(load), args.repeat)
            print(
                f"  {name:38s} {seconds * 1e3:8.1f} ms  {megabytes / seconds:8.0f} MB/s   "
                f"first batch {to_batch * 1e3:7.1f} ms"
            )


if __name__ == "__main__":
    main()
