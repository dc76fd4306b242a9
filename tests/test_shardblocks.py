"""Verified as used: format version 4's block digests (in each shard's header, the header's
digest in the manifest), and a mapped split that maps a shard when a batch first touches it and
verifies the blocks each batch touches instead of hashing everything before the first batch."""

import json
import os
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import xxhash

from pipeline.shards import ShardDataset, ShardError, write_split
from pipeline.shards.format import BLOCK_BYTES, DATA_ALIGN, read_manifest
from pipeline.shards.mapped import MappedSplit
from pipeline.stages.mnist import MNIST

PER_SHARD = 300  # 300 x 785 bytes of data: 15 blocks of 16 KiB per shard


@pytest.fixture
def split(tmp_path):
    rng = np.random.default_rng(3)
    data = {
        "images": rng.integers(0, 256, (900, 28, 28), dtype=np.uint8),
        "labels": rng.integers(0, 10, 900, dtype=np.uint8),
    }
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


def _verified(mapped: MappedSplit) -> list[list[int] | None]:
    """Per shard, the blocks verified so far (None: the shard is not mapped yet)."""
    return [None if shard is None else np.flatnonzero(shard.done).tolist() for shard in mapped.shards]


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


def test_a_batch_verifies_only_the_blocks_it_touches(split):
    folder, data = split
    mapped = MappedSplit(folder)
    assert _verified(mapped) == [None, None, None]  # opening reads the manifest only
    batch = mapped.take([0, 899])
    np.testing.assert_array_equal(batch["images"], data["images"][[0, 899]])
    # sample 0: block 0 (its image) and block 14 (the labels, last in the file); sample 899,
    # the last of shard 2: block 14 (its image, bytes 234,416.. of the data, and its label);
    # shard 1, untouched, is not even mapped
    assert _verified(mapped) == [[0, 14], None, [14]]
    mapped.take([20])  # image bytes 15,680..16,464: across blocks 0 and 1
    assert _verified(mapped) == [[0, 1, 14], None, [14]]


def test_a_damaged_block_is_found_by_the_batch_that_touches_it(split):
    folder, data = split
    name, offset, data_offset = _image_byte(folder, 450)  # shard 1, the middle of its images
    _flip(folder / name, offset)
    mapped = MappedSplit(folder)  # opening reads the manifest; mapping a shard hashes its header only
    np.testing.assert_array_equal(mapped.take([0, 1, 899])["labels"], data["labels"][[0, 1, 899]])
    block = data_offset // BLOCK_BYTES
    with pytest.raises(
        ShardError,
        match=rf"{name}: checksum mismatch in block {block} \(bytes "
        rf"{block * BLOCK_BYTES:,}\.\.{(block + 1) * BLOCK_BYTES:,} after the header\): "
        rf"header xxh3_64 [0-9a-f]{{16}}, file",
    ):
        mapped.take([450])


def test_wait_finds_damage_no_batch_touched(split):
    """No thread reads what batches do not touch: damage elsewhere is found by the batch
    that touches it, or by `wait()`, which verifies every block; batches that touch only
    sound blocks are still served."""
    folder, data = split
    name, offset, _ = _image_byte(folder, 450)
    _flip(folder / name, offset)
    dataset = ShardDataset(folder)
    for _ in range(3):
        np.testing.assert_array_equal(dataset.batch([0, 899])[0].numpy(), data["images"][[0, 899]])
    with pytest.raises(ShardError, match=rf"{name}: checksum mismatch in block"):
        dataset.wait()
    with pytest.raises(ShardError, match=rf"{name}: checksum mismatch in block"):
        dataset.split.wait()  # still damaged: asked again, found again
    np.testing.assert_array_equal(dataset.batch([0, 899])[0].numpy(), data["images"][[0, 899]])
    with pytest.raises(ShardError, match=rf"{name}: checksum mismatch in block"):
        dataset.batch([450])
    with pytest.raises(ShardError, match=rf"{name}: checksum mismatch in block"):
        ShardDataset(folder).wait()


def test_a_damaged_header_is_refused_by_every_use_of_its_shard(split):
    """Opening reads the manifest; a shard is mapped and its header checked when a batch
    first touches it (or by `wait`), and a shard found damaged stays refused."""
    folder, data = split
    raw = (folder / "shard-00001.safetensors").read_bytes()
    _flip(folder / "shard-00001.safetensors", raw.index(b"xxh3_64_blocks") + 30)  # one of the digests
    dataset = ShardDataset(folder)
    np.testing.assert_array_equal(dataset.batch([0, 899])[1].numpy(), data["labels"][[0, 899]])  # other shards
    message = (
        r"shard-00001.safetensors: header checksum mismatch: manifest header_xxh3_64 [0-9a-f]{16}, file [0-9a-f]{16}$"
    )
    for use in (
        lambda: dataset.batch([PER_SHARD]),
        lambda: dataset.batch([0, 2 * PER_SHARD - 1]),
        dataset.wait,
        lambda: list(dataset.loader(8, shuffle=True)),
    ):
        with pytest.raises(ShardError, match=message):
            use()
    assert dataset.split.shards[1] is None


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
    mapped = MappedSplit(folder)
    mapped.take([0, 899])
    with pytest.raises(ShardError, match=r"shard-00001.safetensors: tensor '\w+' is I8 \[300"):
        mapped.wait()


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
    manifest["shards"][1].update(
        bytes=path.stat().st_size, header_xxh3_64=xxhash.xxh3_64_hexdigest(path.read_bytes()[: 8 + len(text)])
    )
    (folder / "manifest.json").write_text(json.dumps(manifest))
    images, labels = ShardDataset(folder).batch([PER_SHARD, 2 * PER_SHARD - 1])
    assert np.array_equal(images.numpy(), data["images"][[PER_SHARD, 2 * PER_SHARD - 1]])


def test_a_bad_label_is_refused_by_the_batch_that_holds_it(split):
    """A foreign writer's label 10 in a 10-class field: written under 11 classes, then the
    manifest says 10 (the digests all match)."""
    from pipeline.shards import Field, Sample

    folder, data = split
    labels = data["labels"].copy()
    labels[899] = 10
    wider = Sample((MNIST["images"], Field("labels", "uint8", (), classes=11)))
    write_split(
        {"images": data["images"], "labels": labels},
        folder,
        sample=wider,
        dataset="d",
        split="train",
        samples_per_shard=PER_SHARD,
    )
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["fields"][1]["classes"] = 10
    (folder / "manifest.json").write_text(json.dumps(manifest))
    mapped = MappedSplit(folder)
    mapped.take([0, 898])
    with pytest.raises(ShardError, match=r"split: field 'labels': value 10 at sample 899 is outside 0\.\.9$"):
        mapped.take([5, 899])


def test_older_manifests_and_sha256_verify_a_whole_shard_when_it_is_mapped(split):
    """Without block digests (format 3, or verify "sha256"), a shard is hashed whole when a
    batch first touches it: any sample of the damaged shard is refused, the other shards served."""
    folder, data = split
    name, offset, _ = _image_byte(folder, 450)
    _flip(folder / name, offset)
    sha = MappedSplit(folder, verify="sha256")
    np.testing.assert_array_equal(sha.take([0, 899])["labels"], data["labels"][[0, 899]])
    with pytest.raises(ShardError, match=rf"{name}: checksum mismatch: manifest sha256"):
        sha.take([PER_SHARD])  # sample 300: not the damaged one, but in its shard
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["format_version"] = 3
    del manifest["block_bytes"]
    for entry in manifest["shards"]:
        del entry["header_xxh3_64"]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    old = MappedSplit(folder)
    assert old.block is None
    np.testing.assert_array_equal(old.take([0, 899])["labels"], data["labels"][[0, 899]])
    with pytest.raises(ShardError, match=rf"{name}: checksum mismatch: manifest xxh3_128"):
        old.take([2 * PER_SHARD - 1])
    with pytest.raises(ShardError, match=rf"{name}: checksum mismatch: manifest xxh3_128"):
        MappedSplit(folder).wait()


def test_a_worker_verifies_what_its_parent_had_not(split):
    folder, _ = split
    name, offset, _ = _image_byte(folder, 450)
    _flip(folder / name, offset)
    parent = MappedSplit(folder)
    worker = pickle.loads(pickle.dumps(parent))
    with pytest.raises(ShardError, match=rf"{name}: checksum mismatch in block"):
        worker.take([450])
    whole = MappedSplit(folder, verify="none")  # nothing to verify: its workers verify nothing either
    assert pickle.loads(pickle.dumps(whole)).take([450])["images"].shape == (1, 28, 28)


def test_a_workers_copy_carries_its_arguments_and_verifies_what_it_touches(split, monkeypatch):
    """Pickled, a split is its arguments only: a worker maps the shards again and verifies
    what its batches touch itself, even where its parent had verified everything."""
    folder, data = split
    parent = MappedSplit(folder, max_resident=1 << 30)
    parent.wait()
    assert len(pickle.dumps(parent)) < 1000
    hashed = []
    monkeypatch.setattr(
        "pipeline.shards.mapped._xxh3_64", lambda blob: hashed.append(len(blob)) or xxhash.xxh3_64_digest(blob)
    )
    worker = pickle.loads(pickle.dumps(parent))
    assert worker.max_resident == 1 << 30 and worker.verify == "xxh3" and _verified(worker) == [None] * 3
    np.testing.assert_array_equal(worker.take([450])["images"], data["images"][[450]])
    # shard 1's header (one block long), then sample 150 of it: its image in block 7, its
    # label in block 14 (the last, short)
    start, _ = _header((folder / "shard-00001.safetensors").read_bytes())
    assert hashed == [start, BLOCK_BYTES, PER_SHARD * 785 - 14 * BLOCK_BYTES]
    assert _verified(worker) == [None, [7, 14], None]


def test_zstd_shards_are_verified_whole(tmp_path, split):
    _, data = split
    write_split(
        data, tmp_path / "z", sample=MNIST, dataset="d", split="train", samples_per_shard=PER_SHARD, compression="zstd"
    )
    checked = read_manifest(tmp_path / "z")
    assert checked["block_bytes"] is None and all("header_xxh3_64" not in e for e in checked["shards"])
    manifest = json.loads((tmp_path / "z" / "manifest.json").read_text())
    manifest["block_bytes"] = BLOCK_BYTES
    (tmp_path / "z" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match=r"manifest.json: block_bytes: 16384, expected null \(zstd shards"):
        read_manifest(tmp_path / "z")


def test_zstd_shards_are_decompressed_when_the_split_is_opened(tmp_path, split):
    _, data = split
    write_split(
        data, tmp_path / "z", sample=MNIST, dataset="d", split="train", samples_per_shard=PER_SHARD, compression="zstd"
    )
    mapped = MappedSplit(tmp_path / "z", max_resident=900 * 785)
    assert all(shard is not None and shard.done is None for shard in mapped.shards)  # held, verified whole
    np.testing.assert_array_equal(mapped.take([899, 0, 450])["images"], data["images"][[899, 0, 450]])
    with pytest.raises(
        ShardError,
        match=r"z: zstd shards are decompressed into memory \(706,500 bytes\), over "
        r"max_resident 706,499; write the split uncompressed",
    ):
        MappedSplit(tmp_path / "z", max_resident=900 * 785 - 1)
    shard = tmp_path / "z" / "shard-00002.safetensors.zst"
    blob = bytearray(shard.read_bytes())
    blob[len(blob) // 2] ^= 1
    shard.write_bytes(bytes(blob))
    with pytest.raises(ShardError, match=r"shard-00002.safetensors.zst: checksum mismatch: manifest xxh3_128"):
        MappedSplit(tmp_path / "z")


def test_batches_come_from_the_maps_and_wait_verifies_the_rest(split):
    """No copy of the split: batches are gathered from the mapped shards, only what they touch
    is verified, until `wait()` verifies every block (and copies nothing)."""
    folder, data = split
    mapped = MappedSplit(folder)
    for indices in ([3, 899], [450, 2], [100, 700, 5]):
        np.testing.assert_array_equal(mapped.take(indices)["images"], data["images"][indices])
    assert not all(shard.done.all() for shard in mapped.shards)
    mapped.wait()
    assert all(shard.done.all() for shard in mapped.shards)
    for shard in mapped.shards:  # read-only views of the maps
        assert all(not column.flags.owndata and not column.flags.writeable for column in shard.columns.values())
    np.testing.assert_array_equal(mapped.take(np.arange(900))["labels"], data["labels"])
    empty = mapped.take([])
    assert empty["images"].shape == (0, 28, 28) and empty["labels"].shape == (0,)


@pytest.mark.parametrize("indices", [[900], [-901]])
def test_indices_outside_the_split_are_refused(split, indices):
    with pytest.raises(IndexError):
        MappedSplit(split[0]).take(indices)


@pytest.mark.parametrize("indices", [[[0, 1]], [0.5]])
def test_indices_that_are_not_a_list_of_integers_are_refused(split, indices):
    with pytest.raises(TypeError):
        MappedSplit(split[0]).take(indices)


def test_negative_indices_count_from_the_end(split):
    folder, data = split
    np.testing.assert_array_equal(MappedSplit(folder).take([-1, -900])["labels"], data["labels"][[899, 0]])


def _file_pages() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[2]) * os.sysconf("SC_PAGE_SIZE")


def test_with_max_resident_the_split_is_read_without_holding_it(split):
    """With `max_resident`, no more than that many bytes of shards stay mapped: reading the
    whole split with a bound of 0 leaves none of it resident in this process (each map is
    closed once its rows are gathered); what was verified stays verified and reads the same."""
    folder, data = split
    held = {}
    for limit in (None, 0):
        mapped = MappedSplit(folder, max_resident=limit)
        before = _file_pages()
        got = mapped.take(np.arange(900))
        held[limit] = _file_pages() - before
        np.testing.assert_array_equal(got["images"], data["images"])
    assert held[None] >= 900 * 785 // 2 and held[0] < 900 * 785 // 4, held
    assert all(shard.done.all() for shard in mapped.shards)
    np.testing.assert_array_equal(mapped.take([450, 7])["images"], data["images"][[450, 7]])


def test_the_loader_gives_the_same_epoch_whatever_max_resident(split):
    folder, _ = split

    def epoch(limit):
        dataset = ShardDataset(folder, max_resident=limit)
        return [x for x, _ in dataset.loader(64, shuffle=True, seed=1)]

    unbounded, bounded = epoch(None), epoch(0)
    assert len(unbounded) == len(bounded) == 15
    assert all(torch.equal(a, b) for a, b in zip(unbounded, bounded, strict=True))


@pytest.mark.parametrize("limit", [-1, 1.5, True, "1GB"])
def test_a_bad_max_resident_is_refused(split, limit):
    with pytest.raises(ValueError, match="max_resident must be a number of bytes"):
        MappedSplit(split[0], max_resident=limit)


def test_rows_larger_than_a_block_verify_every_block_they_span(tmp_path):
    """A row of 40,000 bytes spans three or four 16 KiB blocks: a batch verifies all of them,
    and damage in the middle of such a row (in a block neither its first nor its last) is
    found; rows of several shards come back in the batch's order."""
    from pipeline.shards import Field, Sample

    sample = Sample((Field("x", "uint8", (40_000,)), Field("y", "int64")))
    rng = np.random.default_rng(5)
    data = {"x": rng.integers(0, 256, (30, 40_000), dtype=np.uint8), "y": np.arange(30, dtype=np.int64)}
    folder = tmp_path / "big"
    write_split(data, folder, sample=sample, dataset="d", split="train", samples_per_shard=7)
    picks = [29, 0, 15, 8, 7, 22, 1]
    batch = MappedSplit(folder).take(picks)
    np.testing.assert_array_equal(batch["x"], data["x"][picks])
    np.testing.assert_array_equal(batch["y"], picks)
    entry = read_manifest(folder)["shards"][2]  # samples 14..20
    start, header = _header((folder / entry["file"]).read_bytes())
    row = header["x"]["data_offsets"][0] + 1 * 40_000  # sample 15
    middle = (row // BLOCK_BYTES + 1) * BLOCK_BYTES + 100  # inside the row's second block
    assert row // BLOCK_BYTES < middle // BLOCK_BYTES < (row + 40_000 - 1) // BLOCK_BYTES
    _flip(folder / entry["file"], start + middle)
    mapped = MappedSplit(folder)
    mapped.take([14, 16])  # the neighbours' blocks only
    with pytest.raises(ShardError, match=rf"{entry['file']}: checksum mismatch in block {middle // BLOCK_BYTES} "):
        mapped.take([3, 15])


def test_a_manifest_claiming_more_blocks_than_a_split_may_have_is_refused(tmp_path):
    """The verified-block flags are sized from the manifest before any shard is opened: a
    manifest stating shards of terabytes is refused with one line, not allocated."""
    from pipeline.shards import Field, Sample

    sample = Sample((Field("x", "uint8", (40_000,)),))
    folder = tmp_path / "big"
    write_split(
        {"x": np.zeros((6, 40_000), np.uint8)}, folder, sample=sample, dataset="d", split="train", samples_per_shard=2
    )
    manifest = json.loads((folder / "manifest.json").read_text())
    per_shard = 400_000_000  # 16 TB a shard: within MAX_BYTES, 3 x 10^9 blocks in all
    manifest["count"] = 3 * per_shard
    for entry in manifest["shards"]:
        entry["count"], entry["bytes"] = per_shard, per_shard * 40_000 + 4096
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match=r"the manifest's shards add up to [\d,]+ blocks of [\d,]+ bytes, more than"):
        MappedSplit(folder)


def _unverified(mapped: MappedSplit) -> int:
    return 0 if mapped.done is None else int((~mapped.done).sum())  # None: no block digests to verify by


def test_the_count_of_blocks_left_to_verify_is_the_flags_not_set(split):
    """`left` (at 0, batches check nothing more) is at every moment the number of blocks not
    yet verified: it reaches 0 only when every block is, by batches or by `wait()`."""
    folder, _ = split
    for verify in ("xxh3", "sha256", "none"):
        mapped = MappedSplit(folder, verify=verify)
        seen = [mapped.left]
        assert mapped.left == _unverified(mapped), verify
        for rows in ([0, 899], [20], [450, 451], list(range(0, 900, 37))):
            mapped.take(rows)
            assert mapped.left == _unverified(mapped), (verify, rows)
            seen.append(mapped.left)
        mapped.wait()
        assert mapped.left == 0 == _unverified(mapped), verify
        assert seen == sorted(seen, reverse=True), verify
        if verify == "xxh3":  # block by block: the first batches leave blocks to verify
            assert seen[1] > 0


def test_a_row_whose_last_byte_opens_a_block_verifies_that_block(tmp_path):
    """A row of one block and one byte ends on the first byte of the next block: reading that
    row alone verifies both blocks, so damage to that one byte is found."""
    from pipeline.shards import Field, Sample

    size = BLOCK_BYTES + 1
    data = {"x": np.random.default_rng(6).integers(0, 256, (4, size), dtype=np.uint8)}
    folder = tmp_path / "edge"
    write_split(
        data, folder, sample=Sample((Field("x", "uint8", (size,)),)), dataset="d", split="train", samples_per_shard=4
    )
    manifest = read_manifest(folder)
    block, entry = manifest["block_bytes"], manifest["shards"][0]
    start, header = _header((folder / entry["file"]).read_bytes())
    offset = header["x"]["data_offsets"][0]
    row = next(i for i in range(4) if (offset + (i + 1) * size - 1) % block == 0)
    last = offset + (row + 1) * size - 1  # the row's last byte, the first of its block
    _flip(folder / entry["file"], start + last)
    with pytest.raises(ShardError, match=rf"{re.escape(entry['file'])}: checksum mismatch in block {last // block} "):
        MappedSplit(folder).take([row])


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd (Linux)")
def test_a_split_read_with_pread_closes_its_descriptors_when_dropped(split):
    """With `pread=True`, each shard keeps a descriptor to read from: dropping the split
    closes them all, so a loader that opens a split per epoch does not run out of them."""
    import gc

    def open_file(fd: int) -> str | None:
        try:
            return os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:
            return None

    folder, data = split
    mapped = MappedSplit(folder, pread=True)
    np.testing.assert_array_equal(mapped.take(np.arange(900))["labels"], data["labels"])
    held = {shard.fd: str((folder / Path(shard.path).name).resolve()) for shard in mapped.shards}
    assert len(held) == 3 and all(open_file(fd) == path for fd, path in held.items())
    del mapped
    gc.collect()
    assert all(open_file(fd) != path for fd, path in held.items())  # closed (or the number reused)
