"""Verified as used: format version 4's block digests (in each shard's header, the header's
digest in the manifest), and a split that verifies the blocks each batch touches instead of
hashing everything before the first batch."""

import json
import pickle

import numpy as np
import pytest
import xxhash

from pipeline.core.dataset import MNIST
from pipeline.shards import ShardDataset, ShardError, write_split
from pipeline.shards.format import BLOCK_BYTES, DATA_ALIGN, read_manifest
from pipeline.shards.reader import MappedSplit

PER_SHARD = 300  # 300 x 785 bytes of data: 15 blocks of 16 KiB per shard


@pytest.fixture
def split(tmp_path):
    rng = np.random.default_rng(3)
    data = {"images": rng.integers(0, 256, (900, 28, 28), dtype=np.uint8),
            "labels": rng.integers(0, 10, 900, dtype=np.uint8)}
    folder = tmp_path / "split"
    write_split(data, folder, sample=MNIST, dataset="d", split="train", samples_per_shard=PER_SHARD)
    return folder, data


def _header(raw: bytes) -> tuple[int, dict]:
    """(where the data area starts, the parsed header) of a safetensors file."""
    length = int.from_bytes(raw[:8], "little")
    return 8 + length, json.loads(raw[8 : 8 + length])


def _image_byte(folder, sample: int) -> tuple[str, int, int]:
    """(shard file, offset in the file, offset in its data area) of the first pixel of `sample`."""
    entry = read_manifest(folder)["shards"][sample // PER_SHARD]
    start, header = _header((folder / entry["file"]).read_bytes())
    offset = header["images"]["data_offsets"][0] + (sample % PER_SHARD) * 784
    return entry["file"], start + offset, offset


def _flip(path, offset: int) -> None:
    body = bytearray(path.read_bytes())
    body[offset] ^= 1
    path.write_bytes(bytes(body))


def _no_background(monkeypatch) -> None:
    """Keep the verifying thread from starting, so what a batch verifies is all that is."""
    monkeypatch.setattr(MappedSplit, "_join_in_background", lambda self: None)


def test_every_block_of_every_uncompressed_shard_has_its_digest(split):
    folder, _ = split
    manifest = read_manifest(folder)
    assert manifest["format_version"] == 4 and manifest["block_bytes"] == BLOCK_BYTES
    for entry in manifest["shards"]:
        raw = (folder / entry["file"]).read_bytes()
        start, header = _header(raw)
        assert start % DATA_ALIGN == 0  # every block on whole pages (the header padded with spaces)
        assert entry["header_xxh3_64"] == xxhash.xxh3_64_hexdigest(raw[:start])
        blocks = [raw[i : i + BLOCK_BYTES] for i in range(start, len(raw), BLOCK_BYTES)]
        listed = header["__metadata__"]["xxh3_64_blocks"]
        assert len(blocks) == 15 and listed == "".join(xxhash.xxh3_64_hexdigest(b) for b in blocks)


def test_the_header_with_its_digests_is_what_safetensors_reads(split):
    from safetensors.numpy import load_file

    folder, data = split
    loaded = load_file(folder / "shard-00001.safetensors")
    np.testing.assert_array_equal(loaded["images"], data["images"][PER_SHARD : 2 * PER_SHARD])


def test_large_shards_get_larger_blocks():
    from pipeline.shards.format import MAX_BLOCKS, block_bytes

    assert block_bytes("none", 4 << 20) == BLOCK_BYTES and block_bytes("zstd", 4 << 20) is None
    assert block_bytes("none", MAX_BLOCKS * BLOCK_BYTES) == BLOCK_BYTES
    assert block_bytes("none", MAX_BLOCKS * BLOCK_BYTES + 1) == 2 * BLOCK_BYTES
    assert block_bytes("none", 100 << 30) == 4 << 20  # a 100 GiB shard: 25,600 blocks of 4 MiB


def test_a_batch_verifies_only_the_blocks_it_touches(split, monkeypatch):
    folder, data = split
    _no_background(monkeypatch)
    mapped = MappedSplit(folder)
    assert not mapped.blocks.done.any()  # opening checks the headers only
    batch = mapped.take([0, 899])
    np.testing.assert_array_equal(batch["images"], data["images"][[0, 899]])
    done = mapped.blocks.done.reshape(3, 15)
    # sample 0: block 0 (its image) and block 14 (the labels, last in the file); sample 899,
    # the last of shard 2: block 14 (its image, bytes 234,416.. of the data, and its label)
    assert [np.flatnonzero(row).tolist() for row in done] == [[0, 14], [], [14]]
    mapped.take([20])  # image bytes 15,680..16,464: across blocks 0 and 1
    assert np.flatnonzero(mapped.blocks.done.reshape(3, 15)[0]).tolist() == [0, 1, 14]


def test_a_damaged_block_is_found_by_the_batch_that_touches_it(split, monkeypatch):
    folder, data = split
    name, offset, data_offset = _image_byte(folder, 450)  # shard 1, the middle of its images
    _flip(folder / name, offset)
    _no_background(monkeypatch)
    mapped = MappedSplit(folder)  # opening hashes headers only
    np.testing.assert_array_equal(mapped.take([0, 1, 899])["labels"], data["labels"][[0, 1, 899]])
    block = data_offset // BLOCK_BYTES
    with pytest.raises(ShardError, match=rf"{name}: checksum mismatch in block {block} \(bytes "
                                         rf"{block * BLOCK_BYTES:,}\.\.{(block + 1) * BLOCK_BYTES:,} after the header\): "
                                         rf"header xxh3_64 [0-9a-f]{{16}}, file"):
        mapped.take([450])


def test_the_background_check_finds_damage_no_batch_touched(split):
    folder, _ = split
    name, offset, _ = _image_byte(folder, 450)
    _flip(folder / name, offset)
    dataset = ShardDataset(folder)
    with pytest.raises(ShardError, match=rf"{name}: checksum mismatch in block"):
        dataset.split.wait()
    with pytest.raises(ShardError, match=rf"{name}: checksum mismatch in block"):
        dataset.batch([0])  # every batch after the check failed refuses


def test_a_damaged_header_is_refused_before_the_first_batch_and_after(split):
    """Opening reads the manifest; the shards are mapped and their headers checked by
    `prepare` or the first batch, and a split found damaged stays refused."""
    folder, _ = split
    raw = (folder / "shard-00001.safetensors").read_bytes()
    _flip(folder / "shard-00001.safetensors", raw.index(b"xxh3_64_blocks") + 30)  # one of the digests
    dataset = ShardDataset(folder)
    message = r"shard-00001.safetensors: header checksum mismatch: manifest header_xxh3_64 [0-9a-f]{16}, file [0-9a-f]{16}$"
    for use in (lambda: dataset.batch([0]), lambda: dataset.batch([0]), dataset.split.prepare, dataset.split.wait,
                lambda: next(iter(dataset.loader(8, shuffle=True)))):
        with pytest.raises(ShardError, match=message):
            use()


def test_every_header_is_checked_not_only_the_first_of_its_kind(split):
    """Headers that match the manifest's digests are still checked against the schema, shard
    by shard: the check remembered for the first shard does not pass a second that differs."""
    folder, _ = split
    path = folder / "shard-00001.safetensors"
    raw = path.read_bytes()
    start, _ = _header(raw)
    at = raw.index(b'"U8"', 0, start)  # the first uint8 field's dtype, as int8: same length
    path.write_bytes(raw[:at] + b'"I8"' + raw[at + 4 :])
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["shards"][1]["header_xxh3_64"] = xxhash.xxh3_64_hexdigest(path.read_bytes()[:start])
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match=r"shard-00001.safetensors: tensor '\w+' is I8 \[300"):
        MappedSplit(folder).prepare()


def test_a_header_longer_than_the_first_read_is_read_whole(split):
    """Headers are read with pread, 16 KiB first: a longer one (larger shards list more
    block digests) is read to its end, checked and parsed as any other."""
    folder, data = split
    path = folder / "shard-00001.safetensors"
    raw = path.read_bytes()
    start, header = _header(raw)
    header["__metadata__"]["note"] = "x" * 40_000
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + raw[start:])
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["shards"][1].update(bytes=path.stat().st_size, header_xxh3_64=xxhash.xxh3_64_hexdigest(path.read_bytes()[: 8 + len(text)]))
    (folder / "manifest.json").write_text(json.dumps(manifest))
    images, labels = ShardDataset(folder, raw=True).batch([PER_SHARD, 2 * PER_SHARD - 1])
    assert np.array_equal(images.numpy(), data["images"][[PER_SHARD, 2 * PER_SHARD - 1]])


def test_a_bad_label_is_refused_by_the_batch_that_holds_it(split, monkeypatch):
    """A foreign writer's label 10 in a 10-class field: written under 11 classes, then the
    manifest says 10 (the digests all match)."""
    from pipeline.shards import Field, Sample

    folder, data = split
    labels = data["labels"].copy()
    labels[899] = 10
    wider = Sample((MNIST["images"], Field("labels", "uint8", (), classes=11)))
    write_split({"images": data["images"], "labels": labels}, folder, sample=wider, dataset="d", split="train",
                samples_per_shard=PER_SHARD)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["fields"][1]["classes"] = 10
    (folder / "manifest.json").write_text(json.dumps(manifest))
    _no_background(monkeypatch)
    mapped = MappedSplit(folder)
    mapped.take([0, 898])
    with pytest.raises(ShardError, match=r"split: field 'labels': value 10 at sample 899 is outside 0\.\.9$"):
        mapped.take([5, 899])


def test_older_manifests_and_sha256_verify_everything_on_opening(split):
    folder, _ = split
    name, offset, _ = _image_byte(folder, 450)
    _flip(folder / name, offset)
    with pytest.raises(ShardError, match=rf"{name}: checksum mismatch: manifest sha256"):
        MappedSplit(folder, verify="sha256")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["format_version"] = 3
    del manifest["block_bytes"]
    for entry in manifest["shards"]:
        del entry["header_xxh3_64"]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match=rf"{name}: checksum mismatch: manifest xxh3_128"):
        MappedSplit(folder)


def test_a_worker_verifies_what_its_parent_had_not(split, monkeypatch):
    folder, _ = split
    name, offset, _ = _image_byte(folder, 450)
    _flip(folder / name, offset)
    _no_background(monkeypatch)
    parent = MappedSplit(folder)
    worker = pickle.loads(pickle.dumps(parent))
    with pytest.raises(ShardError, match=rf"{name}: checksum mismatch in block"):
        worker.take([450])
    monkeypatch.undo()
    whole = MappedSplit(folder, verify="none")  # nothing to verify: its workers verify nothing either
    assert pickle.loads(pickle.dumps(whole)).take([450])["images"].shape == (1, 28, 28)


def test_once_verified_a_workers_copy_hashes_nothing(split, monkeypatch):
    folder, data = split
    parent = MappedSplit(folder)
    parent.wait()
    hashed = []
    monkeypatch.setattr("pipeline.shards.reader._xxh3_64", lambda: hashed.append(1) or xxhash.xxh3_64_digest)
    worker = pickle.loads(pickle.dumps(parent))
    np.testing.assert_array_equal(worker.take([450])["images"], data["images"][[450]])
    assert hashed == [] and worker.blocks is None


def test_zstd_shards_are_verified_whole(tmp_path, split):
    _, data = split
    write_split(data, tmp_path / "z", sample=MNIST, dataset="d", split="train", samples_per_shard=PER_SHARD,
                compression="zstd")
    checked = read_manifest(tmp_path / "z")
    assert checked["block_bytes"] is None and all("header_xxh3_64" not in e for e in checked["shards"])
    manifest = json.loads((tmp_path / "z" / "manifest.json").read_text())
    manifest["block_bytes"] = BLOCK_BYTES
    (tmp_path / "z" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match=r"manifest.json: block_bytes: 16384, expected null \(zstd shards"):
        read_manifest(tmp_path / "z")


def test_once_joined_the_maps_are_let_go(split):
    """The split is held once: after the join, no shard's map is kept for verification."""
    folder, data = split
    mapped = MappedSplit(folder)
    mapped.take([1])
    mapped.wait()
    assert mapped.blocks.done.all() and all(view.nbytes == 0 for view in mapped.blocks.views)
    np.testing.assert_array_equal(mapped.take([450, 7])["images"], data["images"][[450, 7]])


def test_a_split_over_the_join_limit_stays_mapped(split):
    """Over `join_limit`, batches come from the maps, shard by shard, and no thread reads the
    rest of the split: only what batches touch is verified, until `wait()` asks for all."""
    folder, data = split
    mapped = MappedSplit(folder, join_limit=900 * 785 - 1)  # one byte short of the split's data
    assert not mapped.joins and MappedSplit(folder, join_limit=900 * 785).joins
    for indices in ([3, 899], [450, 2], [100, 700, 5]):
        np.testing.assert_array_equal(mapped.take(indices)["images"], data["images"][indices])
    assert mapped._thread is None and mapped.whole is None and not mapped.blocks.done.all()
    assert all(view.nbytes for view in mapped.blocks.views)  # still mapped
    mapped.wait()  # verifies the rest here, and copies nothing
    assert mapped.blocks.done.all() and mapped.whole is None and mapped._thread is None
    worker = pickle.loads(pickle.dumps(mapped))  # verified: its workers hash nothing
    assert worker.join_limit == mapped.join_limit and worker.blocks is None


def test_over_the_join_limit_damage_is_found_by_a_batch_or_by_wait(split):
    folder, _ = split
    name, offset, _ = _image_byte(folder, 450)
    _flip(folder / name, offset)
    dataset = ShardDataset(folder, join_limit=0)
    for _ in range(3):
        dataset.batch([0, 899])  # batches after the first start no thread that would find it
    with pytest.raises(ShardError, match=rf"{name}: checksum mismatch in block"):
        dataset.batch([450])
    with pytest.raises(ShardError, match=rf"{name}: checksum mismatch in block"):
        ShardDataset(folder, join_limit=0).split.wait()


def test_the_loader_gives_the_same_epoch_joined_or_not(split):
    import torch

    folder, _ = split

    def epoch(limit):
        dataset = ShardDataset(folder, raw=True, join_limit=limit)
        return [x for x, _ in dataset.loader(64, shuffle=True, generator=torch.Generator().manual_seed(1))]

    joined, mapped = epoch(None), epoch(0)
    assert len(joined) == len(mapped) == 15
    assert all(torch.equal(a, b) for a, b in zip(joined, mapped, strict=True))


@pytest.mark.parametrize("limit", [-1, 1.5, True, "1GB"])
def test_a_bad_join_limit_is_refused(split, limit):
    with pytest.raises(ValueError, match="join_limit must be a number of bytes"):
        MappedSplit(split[0], join_limit=limit)


@pytest.mark.parametrize(("memory", "limit"), [(24 << 30, 6 << 30), (1000, 250), (None, 2 << 30)])
def test_the_default_join_limit_is_a_quarter_of_memory(monkeypatch, split, memory, limit):
    from pipeline.shards import reader

    monkeypatch.setattr(reader, "physical_memory", lambda: memory)
    assert reader.default_join_limit() == limit == MappedSplit(split[0]).join_limit
