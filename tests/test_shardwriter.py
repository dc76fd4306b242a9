"""The streaming shard writer: the same bytes as the in-memory one, in bounded memory."""

import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.convert import compact_table, convert_dataset, write_checksums
from pipeline.csvdata import write_csv
from pipeline.shards import load_split, shard_dataset
from pipeline.shardwriter import shard_dataset_streaming, stream_split
from conftest import make_split

ROOT = Path(__file__).resolve().parents[1]


def files(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize("layout, compression", [("compact", "none"), ("wide", "zstd"), ("compact", "zstd")])
def test_same_bytes_as_the_in_memory_writer(tmp_path, tiny, layout, compression):
    for split in ("train", "test"):
        write_csv(tiny.arrays[f"{split}_images"], tiny.arrays[f"{split}_labels"], tmp_path / "csv" / f"{split}.csv")
    convert_dataset(tmp_path / "csv", tmp_path / "pq", tmp_path / "f.json", "zstd-3", row_group_rows=10)
    shard_dataset(tmp_path / "pq" / layout, tmp_path / "a", "tiny", 24, compression, 3)
    shard_dataset_streaming(tmp_path / "pq" / layout, tmp_path / "b", "tiny", 24, compression, 3)
    assert files(tmp_path / "a") == files(tmp_path / "b")
    images, labels = load_split(tmp_path / "b" / "train")
    np.testing.assert_array_equal(images.numpy(), tiny.arrays["train_images"])


def test_memory_is_bounded_by_one_shard(tmp_path):
    """A 40,000-sample split (31 MB of pixels) through 2,000-sample shards (1.6 MB): the
    writer's peak (numpy via tracemalloc, plus Arrow's pool) stays near one shard and a
    few row groups, far below the split."""
    n, rows = 40_000, 1_000
    images, labels = make_split(n, 3)
    path = tmp_path / "big" / "compact" / "train.parquet"
    path.parent.mkdir(parents=True)
    with pq.ParquetWriter(path, compact_table(labels[:1], images[:1].reshape(1, -1)).schema, compression="zstd") as w:
        for start in range(0, n, rows):
            w.write_table(compact_table(labels[start:start + rows], images[start:start + rows].reshape(-1, 784)))
    del images
    code = f"""
import tracemalloc, pyarrow as pa
from pathlib import Path
from pipeline.shardwriter import stream_split
run = lambda out: stream_split(Path({str(path)!r}), Path(out), dataset='big', split='train',
                               samples_per_shard=2000, batch_rows=1000)
run({str(tmp_path / 'warm')!r})  # the first call's lazy imports are not the writer's memory
tracemalloc.start()
run({str(tmp_path / 'out')!r})
print(tracemalloc.get_traced_memory()[1], pa.default_memory_pool().max_memory())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    numpy_peak, arrow_peak = map(int, out.split())
    split_bytes = n * 785
    assert numpy_peak + arrow_peak < split_bytes / 4, (numpy_peak, arrow_peak, split_bytes)
    loaded, _ = load_split(tmp_path / "out")
    assert len(loaded) == n
