import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import write_shards, write_unchecked_split

from pipeline.shards import DeviceBatches, Int64, ShardDataset, ShardError, UnitFloat, read_split, unit_float
from pipeline.shards.order import epoch_seed
from pipeline.stages.convert.stage import convert_dataset
from pipeline.stages.csvdata import write_csv
from pipeline.stages.shard.settings import ShardSettings
from pipeline.stages.shard.stage import shard_dataset


def load(path, **options) -> tuple[torch.Tensor, ...]:
    """A split's fields as a tuple, in the manifest's order (images, labels for MNIST's schema)."""
    return tuple(read_split(path, **options).values())


def columns(images, labels) -> dict[str, torch.Tensor]:
    return {"images": images, "labels": labels}


@pytest.fixture
def arrays(tiny):
    return tiny.arrays["train_images"], tiny.arrays["train_labels"]


@pytest.fixture(params=["none", "zstd"])
def split_dir(request, tmp_path, arrays):
    images, labels = arrays
    write_shards(
        images,
        labels,
        tmp_path / "s",
        dataset="tiny",
        split="train",
        samples_per_shard=24,
        compression=request.param,
        level=3,
    )
    return tmp_path / "s"


def test_round_trip_from_parquet(tmp_path, tiny):
    csv = tmp_path / "csv"
    write_csv(tiny.arrays["train_images"], tiny.arrays["train_labels"], csv / "train.csv")
    write_csv(tiny.arrays["test_images"], tiny.arrays["test_labels"], csv / "test.csv")
    convert_dataset(csv, tmp_path / "pq", tmp_path / "f.json", "zstd-3")
    for layout in ("wide", "compact"):
        shard_dataset(tmp_path / "pq" / layout, tmp_path / layout, "tiny", ShardSettings(20, "zstd", 3))
        for split in ("train", "test"):
            fields = read_split(tmp_path / layout / split, dataset="tiny", split=split)
            assert list(fields) == ["images", "labels"]  # the manifest's order
            images, labels = fields["images"], fields["labels"]
            np.testing.assert_array_equal(images.numpy(), tiny.arrays[f"{split}_images"])
            np.testing.assert_array_equal(labels.numpy(), tiny.arrays[f"{split}_labels"])
    manifest = json.loads((tmp_path / "compact/train/manifest.json").read_text())
    assert [s["count"] for s in manifest["shards"]] == [20, 20, 20, 4]
    assert len(manifest["source"]["content_sha256"]) == 64 and manifest["count"] == 64


def test_manifest_and_sizes(split_dir):
    manifest = json.loads((split_dir / "manifest.json").read_text())
    assert manifest["dataset"] == "tiny" and manifest["split"] == "train"
    assert manifest["format_version"] == 4
    assert manifest["fields"] == [
        {"name": "images", "dtype": "uint8", "shape": [28, 28]},
        {"name": "labels", "dtype": "uint8", "shape": [], "classes": 10},
    ]
    for entry in manifest["shards"]:
        assert (split_dir / entry["file"]).stat().st_size == entry["bytes"]


def test_deterministic_bytes(tmp_path, arrays):
    for name in ("a", "b"):
        write_shards(
            *arrays, tmp_path / name, dataset="tiny", split="train", samples_per_shard=30, compression="zstd", level=5
        )
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert files == [
        "manifest.json",
        "shard-00000.safetensors.zst",
        "shard-00001.safetensors.zst",
        "shard-00002.safetensors.zst",
    ]
    for name in files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def _flip_byte(path, at=None):
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 2 if at is None else at] ^= 0xFF
    path.write_bytes(bytes(blob))


def test_corrupted_shard_detected(split_dir, arrays):
    shard = next(split_dir.glob("shard-00001*"))
    _flip_byte(shard)
    with pytest.raises(ShardError, match=rf"{shard.name}: checksum mismatch: manifest xxh3_128 [0-9a-f]{{32}}, file"):
        load(split_dir)
    with pytest.raises(ShardError, match=rf"{shard.name}: checksum mismatch: manifest sha256 [0-9a-f]{{64}}, file"):
        load(split_dir, verify="sha256")
    images, _ = load(split_dir, verify="none")  # unverified: the flipped pixel gets through
    assert not np.array_equal(images.numpy(), arrays[0])


def test_corrupted_compressed_shard_and_header(tmp_path, arrays):
    write_shards(*arrays, tmp_path / "z", dataset="tiny", split="train", samples_per_shard=30, compression="zstd")
    _flip_byte(tmp_path / "z" / "shard-00000.safetensors.zst")
    with pytest.raises(ShardError, match=r"shard-00000.safetensors.zst: checksum mismatch"):
        load(tmp_path / "z")
    write_shards(*arrays, tmp_path / "p", dataset="tiny", split="train", samples_per_shard=30)
    _flip_byte(tmp_path / "p" / "shard-00000.safetensors", at=7)  # the header length's top byte
    with pytest.raises(ShardError, match=r"shard-00000.safetensors: not a safetensors shard \(header length"):
        load(tmp_path / "p", verify="none")


def test_wrong_dtype_in_shard(tmp_path, arrays):
    from safetensors.numpy import save_file

    write_shards(*arrays, tmp_path / "s", dataset="tiny", split="train", samples_per_shard=64)
    images, labels = arrays
    shard = tmp_path / "s" / "shard-00000.safetensors"
    save_file({"images": images, "labels": labels.astype(np.int64)}, shard)
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    manifest["shards"][0]["bytes"] = shard.stat().st_size
    (tmp_path / "s" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match=r"tensor 'labels' is I64 \[64\], expected U8 \(uint8\) \[64\]"):
        load(tmp_path / "s", verify="none")


def test_truncated_and_missing_shard(split_dir):
    shard = next(split_dir.glob("shard-00002*"))
    shard.write_bytes(shard.read_bytes()[:-5])
    with pytest.raises(ShardError, match=rf"{shard.name}: .* bytes, manifest says .* \(truncated\?\)"):
        load(split_dir, verify="none")
    shard.unlink()
    with pytest.raises(ShardError, match=rf"{shard.name}: shard listed in the manifest is missing"):
        load(split_dir)


def test_wrong_dataset_and_shape(tmp_path, split_dir, arrays):
    with pytest.raises(ShardError, match="manifest is for dataset 'tiny', expected 'mnist'"):
        load(split_dir, dataset="mnist")
    with pytest.raises(ShardError, match="manifest.json: missing"):
        load(tmp_path)
    manifest = json.loads((split_dir / "manifest.json").read_text())
    manifest["shards"][0]["count"] -= 1
    manifest["shards"][1]["count"] += 1
    (split_dir / "manifest.json").write_text(json.dumps(manifest))
    # uncompressed: the manifest's sizes cannot hold its counts (caught before opening a file);
    # zstd: the frame or the header disagrees with the count
    with pytest.raises(
        ShardError,
        match=r"shards\[1\]\.bytes: [\d,]+ bytes cannot hold 25 samples|"
        r"zstd frame holds .* not 23 samples|expected U8 \(uint8\) \[23, 28, 28\]",
    ):
        load(split_dir)


def test_shard_dataset_batches(split_dir, arrays):
    """Samples and batches come back as stored (dtype and shape): nothing is converted unless
    a transform asks."""
    images, labels = arrays
    dataset = ShardDataset(split_dir)
    x, y = dataset[3]
    assert x.shape == (28, 28) and x.dtype == torch.uint8 and y.shape == () and y.dtype == torch.uint8
    assert torch.equal(x, torch.from_numpy(images[3])) and y == int(labels[3])
    xb, yb = next(iter(dataset.loader(batch_size=10)))
    assert xb.shape == (10, 28, 28) and xb.dtype == yb.dtype == torch.uint8
    np.testing.assert_array_equal(xb.numpy(), images[:10])
    np.testing.assert_array_equal(yb.numpy(), labels[:10])
    xs, ys = dataset.batch([5, 0, 5])
    np.testing.assert_array_equal(xs.numpy(), images[[5, 0, 5]])
    np.testing.assert_array_equal(ys.numpy(), labels[[5, 0, 5]])


def test_shard_dataset_converts_only_with_a_transform(split_dir, arrays):
    images, labels = arrays
    dataset = ShardDataset(split_dir, transform=[UnitFloat("images", add_channel=True), Int64("labels")])
    x, y = dataset[3]
    assert x.shape == (1, 28, 28) and x.dtype == torch.float32 and y.dtype == torch.int64
    torch.testing.assert_close(x[0], torch.from_numpy(images[3]).float() / 255, rtol=0, atol=0)
    xb, yb = next(iter(dataset.loader(batch_size=10)))
    assert xb.shape == (10, 1, 28, 28) and xb.dtype == torch.float32 and yb.dtype == torch.int64
    assert torch.equal(xb, unit_float(torch.from_numpy(images[:10]), add_channel=True))
    np.testing.assert_array_equal(yb.numpy(), labels[:10])
    only_labels = ShardDataset(split_dir, transform=Int64("labels"))[3]  # one transform, not a list
    assert only_labels[0].dtype == torch.uint8 and only_labels[1].dtype == torch.int64


@pytest.mark.parametrize(
    ("transform", "message"),
    [
        (UnitFloat("image"), r"UnitFloat: no field 'image' \(fields: \['images', 'labels'\]\)"),
        (Int64("pixels"), r"Int64: no field 'pixels'"),
        ("not callable", r"a transform must be callable, got str"),
    ],
)
def test_a_transform_is_checked_against_the_fields_when_the_reader_is_built(split_dir, transform, message):
    with pytest.raises(ValueError, match=message):
        ShardDataset(split_dir, transform=transform)
    with pytest.raises(ValueError, match=message):
        DeviceBatches(read_split(split_dir), 8, transform=[transform])


def test_device_batches_shuffle_reproducible_and_varies(arrays):
    images, labels = (torch.from_numpy(a) for a in arrays)
    a = DeviceBatches(columns(images, labels), batch_size=16, shuffle=True, seed=1)
    b = DeviceBatches(columns(images, labels), batch_size=16, shuffle=True, seed=1)
    first = [y for _, y in a]
    assert [torch.equal(p, q) for p, q in zip(first, [y for _, y in b], strict=True)] == [True] * 4
    second = torch.cat([y for _, y in a])
    assert not torch.equal(torch.cat(first), second)
    assert torch.equal(a.rank_order(0).sort().values, torch.arange(64))
    assert torch.equal(torch.cat(first), labels[a.rank_order(0)])


def test_device_batches_give_every_field_as_stored(arrays):
    images, labels = (torch.from_numpy(a) for a in arrays)
    ids = torch.arange(64, dtype=torch.int32)
    batches = DeviceBatches({"images": images, "labels": labels, "ids": ids}, batch_size=8, shuffle=True, seed=2)
    for x, y, i in batches:
        assert x.dtype == y.dtype == torch.uint8 and x.shape == (len(i), 28, 28) and i.dtype == torch.int32
        assert torch.equal(x, images[i.long()]) and torch.equal(y, labels[i.long()])
        assert torch.equal(batches.indices, i.long())  # the indices of the batch just yielded
    with pytest.raises(ValueError, match=r"fields differ in length: \{'images': 64, 'labels': 63\}"):
        DeviceBatches(columns(images, labels[:63]), batch_size=8)
    with pytest.raises(ValueError, match="columns must map field names to tensors"):
        DeviceBatches({}, batch_size=8)


def test_device_batches_float_and_normalised(arrays):
    images, labels = (torch.from_numpy(a) for a in arrays)
    stored = next(iter(DeviceBatches(columns(images, labels), batch_size=8)))
    assert torch.equal(stored[0], images[:8]) and torch.equal(stored[1], labels[:8])  # as stored by default
    batches = DeviceBatches(
        columns(images, labels),
        batch_size=8,
        shuffle=False,
        transform=[UnitFloat("images", mean=0.5, std=0.25, add_channel=True), Int64("labels")],
    )
    x, y = next(iter(batches))
    assert x.shape == (8, 1, 28, 28) and x.dtype == torch.float32
    torch.testing.assert_close(x[:, 0], (images[:8].float() / 255 - 0.5) / 0.25)
    assert y.dtype == torch.int64 and torch.equal(y, labels[:8].long())
    torch.testing.assert_close(unit_float(images[:8], add_channel=True)[:, 0], images[:8].float() / 255)
    assert unit_float(images[:8]).shape == (8, 28, 28)  # no channel axis unless asked
    for half in ({"mean": 0.5}, {"std": 0.25}):
        with pytest.raises(ValueError, match="mean and std go together"):
            unit_float(images[:8], **half)
        with pytest.raises(ValueError, match="mean and std go together"):
            UnitFloat("images", **half)
    with pytest.raises(ValueError, match=r"unit_float: expected uint8 values, got torch.float32"):
        unit_float(images[:8].float())
    with pytest.raises(ValueError, match=r"UnitFloat: field 'ids' is int64, not uint8"):
        DeviceBatches({"ids": torch.arange(64)}, batch_size=8, transform=UnitFloat("ids"))
    with pytest.raises(ValueError, match=r"Int64: field 'x' is float32, not an integer field"):
        DeviceBatches({"x": torch.zeros(64)}, batch_size=8, transform=Int64("x"))


def test_shuffle_is_drawn_on_the_cpu(arrays):
    """The order is the CPU generator's wherever the data live, so a GPU run and a CPU run of
    one seed train on the same batches (a CUDA generator would give another permutation)."""
    images, labels = (torch.from_numpy(a) for a in arrays)
    batches = DeviceBatches(columns(images, labels), batch_size=8, shuffle=True, seed=5)
    for epoch in (0, 3):
        expected = torch.randperm(len(labels), generator=torch.Generator().manual_seed(epoch_seed(5, epoch)))
        assert torch.equal(batches.rank_order(epoch), expected)


@pytest.mark.parametrize("drop_last", [False, True])
def test_rank_split_disjoint_equal_batches(arrays, drop_last):
    """61 samples over 4 ranks: runs of 16, 15, 15, 15 of one epoch order. Every rank takes the
    same number of steps; without drop_last every sample is taken once (the shorter runs'
    last batch is smaller, here empty), with it every rank takes 3 whole batches."""
    images, labels = torch.from_numpy(arrays[0][:61]), torch.arange(61)  # labels = sample ids
    world = 4
    parts = [
        DeviceBatches(
            columns(images, labels), batch_size=5, shuffle=True, seed=3, rank=r, world_size=world, drop_last=drop_last
        )
        for r in range(world)
    ]
    lengths = [len(p) for p in parts]
    batches = [[y for _, y in p] for p in parts]  # epoch 0 of each rank
    sizes = [[len(y) for y in rank] for rank in batches]
    assert [len(s) for s in sizes] == lengths == [lengths[0]] * world
    if drop_last:
        assert sizes == [[5, 5, 5]] * 4
    else:
        assert sizes == [[5, 5, 5, 1], [5, 5, 5, 0], [5, 5, 5, 0], [5, 5, 5, 0]]
    seen = [torch.cat(rank) for rank in batches]
    ids = torch.cat(seen)
    assert len(set(ids.tolist())) == len(ids)  # disjoint
    order = DeviceBatches(columns(images, labels), batch_size=5, shuffle=True, seed=3).rank_order(0)
    if drop_last:  # each rank's whole batches from the start of its run
        assert [s.tolist() for s in seen] == [order[start : start + 15].tolist() for start in (0, 16, 31, 46)]
    else:  # the ranks' runs, in rank order, are the epoch's order
        assert torch.equal(ids, order)


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (b"[1, 2]", r"not a safetensors header \(JSON list, not an object\)"),
        (b'{"images": {"dtype": "U8", "shape": [64, 28, 28]}}', r"tensor 'images' has no valid data_offsets"),
        (b'{"images": ', r"not a readable safetensors header"),
        (b'{"images": {}}' + b" " * 30 + b"x", r"not a readable safetensors header"),  # data after the padding
        (b"[" * 100_000, r"not a readable safetensors header \(nested too deeply\)"),  # no RecursionError
        (b'{"labels": {}, "labels": {}}', r"not a readable safetensors header \(key 'labels' is given twice\)"),
        (b'{"images": NaN}', r"not a readable safetensors header \(NaN is not a number JSON allows\)"),
        (b'{"images": "\xff"}', r"not a readable safetensors header \('utf-8' codec can't decode"),
    ],
)
def test_malformed_shard_header(tmp_path, arrays, header, message):
    write_shards(*arrays, tmp_path / "s", dataset="tiny", split="train", samples_per_shard=64)
    shard = tmp_path / "s" / "shard-00000.safetensors"
    shard.write_bytes(
        len(header).to_bytes(8, "little") + header + bytes(64 * 785)
    )  # a plausible size: the header is what is wrong
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    manifest["shards"][0]["bytes"] = shard.stat().st_size
    (tmp_path / "s" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match=rf"shard-00000.safetensors: {message}") as err:
        load(tmp_path / "s", verify="none")
    assert str(err.value).count("shard-00000.safetensors") == 1  # the shard named once


@pytest.mark.parametrize("pad", [b" " * 40, b"\n\t \r" * 10])
def test_a_header_padded_with_any_json_whitespace_reads(tmp_path, arrays, pad):
    write_shards(*arrays, tmp_path / "s", dataset="tiny", split="train", samples_per_shard=64)
    shard = tmp_path / "s" / "shard-00000.safetensors"
    raw = shard.read_bytes()
    size = int.from_bytes(raw[:8], "little")
    header = b" " + raw[8 : 8 + size].rstrip(b" ") + pad
    shard.write_bytes(len(header).to_bytes(8, "little") + header + raw[8 + size :])
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    manifest["shards"][0]["bytes"] = shard.stat().st_size
    (tmp_path / "s" / "manifest.json").write_text(json.dumps(manifest))
    np.testing.assert_array_equal(load(tmp_path / "s", verify="none")[0].numpy(), arrays[0][:64])


def test_device_batches_follow_their_seed_and_epoch(arrays):
    images, labels = torch.from_numpy(arrays[0]), torch.arange(64)  # labels = sample ids
    orders = {
        seed: DeviceBatches(columns(images, labels), batch_size=16, shuffle=True, seed=seed).rank_order(0)
        for seed in (1, 2)
    }
    assert not torch.equal(orders[1], orders[2])
    batches = DeviceBatches(columns(images, labels), batch_size=16, shuffle=True, seed=1)
    batches.set_epoch(5)
    assert batches.epoch == 5
    assert torch.equal(torch.cat([y for _, y in batches]), batches.rank_order(5))
    assert batches.epoch == 6
    assert torch.equal(torch.cat([y for _, y in batches]), batches.rank_order(6))  # iterating moves on
    unshuffled = DeviceBatches(columns(images, labels), batch_size=16)  # shuffle=False by default
    assert torch.equal(torch.cat([y for _, y in unshuffled]), torch.arange(64))
    assert torch.equal(torch.cat([y for _, y in unshuffled]), torch.arange(64))  # every epoch the same


def test_device_batches_resume_where_the_loop_stopped(arrays):
    """state_dict counts the batches the loop took; a fresh DeviceBatches loaded with it
    finishes the epoch, then goes on as the uninterrupted one does."""
    images, labels = torch.from_numpy(arrays[0]), torch.arange(64)
    whole = DeviceBatches(columns(images, labels), batch_size=10, shuffle=True, seed=7)
    expected = [torch.cat([y for _, y in whole]) for _ in range(2)]
    first = DeviceBatches(columns(images, labels), batch_size=10, shuffle=True, seed=7)
    taken = []
    for step, (_, y) in enumerate(first):
        taken.append(y)
        if step == 2:
            break
    state = first.state_dict()
    assert state == {
        "epoch": 0,
        "due": [[30, 64]],
        "seed": 7,
        "shuffle": "samples",
        "count": 64,
        "shard_counts": None,
        "drop_last": False,
    }
    resumed = DeviceBatches(columns(images, labels), batch_size=10, shuffle=True, seed=7)
    resumed.load_state_dict(state)
    rest = [y for _, y in resumed]
    assert len(rest) == 4 and torch.equal(torch.cat(taken + rest), expected[0])
    assert torch.equal(torch.cat([y for _, y in resumed]), expected[1])
    first.load_state_dict(state)  # also into the same one, its iteration abandoned
    assert torch.equal(torch.cat([y for _, y in first]), expected[0][30:])
    other = DeviceBatches(columns(images, labels), batch_size=10, shuffle=True, seed=8)
    with pytest.raises(ShardError, match=r"data position: saved with seed 7, this loader has 8"):
        other.load_state_dict(state)


def test_read_split_refuses_a_label_outside_0_to_9(tmp_path, arrays):
    """A shard written by something else (the writer refuses label 10): read_split must
    still check what it hands to the model (and so must the mapped reader)."""
    images, labels = arrays
    labels = labels.copy()
    labels[40] = 10
    folder = tmp_path / "s"
    write_unchecked_split(folder, images, labels)
    with pytest.raises(ShardError, match=r"s: field 'labels': value 10 at sample 40 is outside 0..9$"):
        load(folder)
    dataset = ShardDataset(folder)
    assert dataset.batch([39, 41])[1].tolist() == labels[[39, 41]].tolist()
    with pytest.raises(ShardError, match=r"s: field 'labels': value 10 at sample 40 is outside 0..9$"):
        dataset.batch([0, 40])
    labels[40] = 9  # the same file with a valid label loads: the check is on the label alone
    write_unchecked_split(tmp_path / "ok", images, labels)
    _, loaded = load(tmp_path / "ok")
    assert loaded[40] == 9


@pytest.mark.parametrize(
    ("images", "labels", "message"),
    [
        (
            np.full((4, 28, 28), 0.5, np.float32),
            np.zeros(4, np.uint8),
            r"^d/train: field 'images': value .*0\.5.* at sample 0 does not fit uint8 \(float32 given\)$",
        ),
        (
            np.zeros((4, 28, 27), np.uint8),
            np.zeros(4, np.uint8),
            r"^d/train: field 'images': expected shape \[n, 28, 28\], got \[4, 28, 27\]$",
        ),
        (
            np.zeros((4, 28, 28), np.uint8),
            np.zeros(3, np.uint8),
            r"^d/train: fields of one batch differ in length: \{'images': 4, 'labels': 3\}$",
        ),
    ],
)
def test_write_shards_checks_its_input(tmp_path, images, labels, message):
    with pytest.raises(ShardError, match=message):
        write_shards(images, labels, tmp_path / "s", dataset="d", split="train", samples_per_shard=2)
    assert not (tmp_path / "s").exists()


def test_write_shards_settings_checked(tmp_path, arrays):
    with pytest.raises(ValueError, match="samples_per_shard must be at least 1"):
        write_shards(*arrays, tmp_path / "a", dataset="d", split="train", samples_per_shard=0)
    with pytest.raises(ValueError, match="shard compression must be one of"):
        write_shards(*arrays, tmp_path / "b", dataset="d", split="train", samples_per_shard=8, compression="lz4")
    manifest = write_shards(*arrays, tmp_path / "c", dataset="d", split="train", samples_per_shard=64)
    assert [s["count"] for s in manifest["shards"]] == [64] and manifest["count"] == 64
    assert manifest["compression"] == {"codec": "none", "level": None}
    zstd = write_shards(
        *arrays, tmp_path / "z", dataset="d", split="train", samples_per_shard=30, compression="zstd", level=7
    )
    assert zstd["compression"] == {"codec": "zstd", "level": 7}
    assert [s["file"] for s in zstd["shards"]] == [f"shard-0000{i}.safetensors.zst" for i in range(3)]


@pytest.mark.parametrize("verify", ["xxh3", "sha256"])
def test_each_verify_mode_checks_its_own_digest(split_dir, verify):
    """Damage the digest the mode reads in the manifest (not the file): only that mode fails."""
    manifest = json.loads((split_dir / "manifest.json").read_text())
    key = {"xxh3": "xxh3_128", "sha256": "sha256"}[verify]
    manifest["shards"][1][key] = "0" * len(manifest["shards"][1][key])
    (split_dir / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match=rf"shard-00001\S*: checksum mismatch: manifest {key} 0000"):
        load(split_dir, verify=verify)
    other = {"xxh3": "sha256", "sha256": "xxh3"}[verify]
    assert len(load(split_dir, verify=other)[1]) == 64
    with pytest.raises(ValueError, match="verify must be one of"):
        load(split_dir, verify="md5")


def test_device_batches_partial_last_batch_and_drop_last(arrays):
    images, labels = torch.from_numpy(arrays[0]), torch.arange(64)
    keep = DeviceBatches(columns(images, labels), batch_size=10, shuffle=True, seed=0)
    sizes = [len(y) for _, y in keep]
    assert len(keep) == 7 and sizes == [10] * 6 + [4]
    drop = DeviceBatches(columns(images, labels), batch_size=10, shuffle=True, seed=0, drop_last=True)
    assert len(drop) == 6 and [len(y) for _, y in drop] == [10] * 6
    assert len(drop.rank_order(0)) == 60 and torch.equal(drop.rank_order(0), keep.rank_order(0)[:60])
    with pytest.raises(ValueError, match="rank 2 is outside 0..1"):
        DeviceBatches(columns(images, labels), batch_size=10, rank=2, world_size=2)
    with pytest.raises(ValueError, match="batch_size must be an integer of at least 1, got 0"):
        DeviceBatches(columns(images, labels), batch_size=0)
    with pytest.raises(ValueError, match="shuffle must be True, False or one of"):
        DeviceBatches(columns(images, labels), batch_size=10, shuffle="random")


def test_device_batches_layout_and_dtype(arrays):
    images, labels = torch.from_numpy(arrays[0]), torch.from_numpy(arrays[1])
    # (channels_last cannot be seen on a 1-channel batch: its strides are the same either way)
    transform = UnitFloat("images", dtype=torch.bfloat16, add_channel=True)
    x, _ = next(iter(DeviceBatches(columns(images, labels), batch_size=8, shuffle=False, transform=transform)))
    assert x.dtype == torch.bfloat16 and x.shape == (8, 1, 28, 28)
    torch.testing.assert_close(x[:, 0].float(), images[:8].float() / 255, atol=4e-3, rtol=0)


def test_shard_dataset_passes_its_options_on(split_dir, arrays):
    with pytest.raises(ShardError, match="manifest is for dataset 'tiny', expected 'other'"):
        ShardDataset(split_dir, dataset="other")
    with pytest.raises(ShardError, match="manifest is for split 'train', expected 'test'"):
        ShardDataset(split_dir, split="test")
    with pytest.raises(ValueError, match="verify must be one of"):
        ShardDataset(split_dir, verify="md5")
    data = ShardDataset(split_dir, dataset="tiny", split="train", verify="sha256")
    loader = data.loader(16, shuffle=True, seed=0)
    order = torch.cat([y for _, y in loader])
    assert sorted(order.tolist()) == sorted(arrays[1].tolist()) and order.tolist() != arrays[1].tolist()
    x, y = data[5]
    assert x.shape == (28, 28) and y.shape == () and y == int(arrays[1][5])
    assert torch.equal(x, torch.from_numpy(arrays[0][5]))


def _raw_shard(tmp_path, arrays, body: bytes):
    """A one-shard split whose file is `body`, the manifest's size matching it."""
    write_shards(*arrays, tmp_path / "s", dataset="tiny", split="train", samples_per_shard=64)
    (tmp_path / "s" / "shard-00000.safetensors").write_bytes(body)
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    manifest["shards"][0]["bytes"] = len(body)
    (tmp_path / "s" / "manifest.json").write_text(json.dumps(manifest))
    return tmp_path / "s"


def _tensors(images_at: tuple[int, int], labels_at: tuple[int, int]) -> bytes:
    header = {
        "images": {"dtype": "U8", "shape": [64, 28, 28], "data_offsets": list(images_at)},
        "labels": {"dtype": "U8", "shape": [64], "data_offsets": list(labels_at)},
    }
    return json.dumps(header).encode()


@pytest.mark.parametrize(
    ("size", "message"),
    [
        (0, r"not a safetensors shard \(header length 0\)"),
        (1 << 20, r"not a safetensors shard \(header length 1048576\)"),
        (1, r"not a readable safetensors header"),  # a length of 1 is allowed; the byte is not JSON
    ],
)
def test_header_length_bounds(tmp_path, arrays, size, message):
    body = size.to_bytes(8, "little") + b"x" * min(size, 64) + bytes(64 * 785)
    with pytest.raises(ShardError, match=rf"shard-00000.safetensors: {message}"):
        load(_raw_shard(tmp_path, arrays, body), verify="none")


@pytest.mark.parametrize("raw", [b"", b"\x01", bytes(7)])
def test_header_length_cut_short(raw):
    """Fewer than the 8 bytes of the length: said as such, whatever those bytes would read as."""
    import io

    from pipeline.shards.reader import read_header

    with pytest.raises(ShardError, match=rf"^s.safetensors: not a safetensors shard \(ends after {len(raw)} bytes\)$"):
        read_header(io.BytesIO(raw), Path("s.safetensors"), 64, {"labels": torch.empty(64, dtype=torch.uint8)})


def test_tensors_in_any_order_in_the_file(tmp_path, arrays):
    """safetensors orders the data by offset, not by name: labels first is a valid file."""
    images, labels = arrays
    header = _tensors((64, 64 + 64 * 784), (0, 64))
    body = len(header).to_bytes(8, "little") + header + labels.tobytes() + images.tobytes()
    got_images, got_labels = load(_raw_shard(tmp_path, arrays, body), verify="none")
    np.testing.assert_array_equal(got_images.numpy(), images)
    np.testing.assert_array_equal(got_labels.numpy(), labels)


def test_tensor_of_the_wrong_size_where_it_should_start(tmp_path, arrays):
    header = _tensors((0, 64 * 784 - 1), (64 * 784 - 1, 64 * 784 + 63))
    body = len(header).to_bytes(8, "little") + header + bytes(64 * 785)
    with pytest.raises(
        ShardError, match=r"shard-00000.safetensors: tensor 'images' at bytes 0..50175, expected 0..50176"
    ):
        load(_raw_shard(tmp_path, arrays, body), verify="none")


def test_link_to_a_shard_inside_the_folder_is_refused(split_dir):
    """Even a link that stays in the folder: shards are plain files (a link can change under us)."""
    first = split_dir / next(p.name for p in split_dir.iterdir() if p.name.startswith("shard-00000"))
    (split_dir / "copy").write_bytes(first.read_bytes())
    first.unlink()
    first.symlink_to(split_dir / "copy")
    with pytest.raises(ShardError, match=r"a link, not a plain file; shards must be plain files in their folder"):
        load(split_dir)


def test_split_name_and_empty_row_range(split_dir, arrays):
    with pytest.raises(ShardError, match="manifest is for split 'train', expected 'test'"):
        load(split_dir, split="test")
    from pipeline.shards.reader import read_shard_into

    manifest = json.loads((split_dir / "manifest.json").read_text())
    empty = {"images": torch.empty((0, 28, 28), dtype=torch.uint8), "labels": torch.empty(0, dtype=torch.uint8)}
    read_shard_into(split_dir, manifest["shards"][0], manifest["compression"]["codec"], "xxh3", empty, rows=(3, 3))
    some = {"images": torch.empty((2, 28, 28), dtype=torch.uint8), "labels": torch.empty(2, dtype=torch.uint8)}
    read_shard_into(split_dir, manifest["shards"][0], manifest["compression"]["codec"], "xxh3", some, rows=(3, 5))
    np.testing.assert_array_equal(some["labels"].numpy(), arrays[1][3:5])
    np.testing.assert_array_equal(some["images"].numpy(), arrays[0][3:5])
    with pytest.raises(ValueError, match="rows 5..3 are outside the shard's 0..24"):
        read_shard_into(split_dir, manifest["shards"][0], manifest["compression"]["codec"], "xxh3", some, rows=(5, 3))


def _zstd_shard(folder, body: bytes | None = None):
    """A one-shard zstd split of 400 samples (several zstd blocks); `body` replaces the
    compressed file, the manifest's size following it."""
    from conftest import make_split

    write_shards(*make_split(400, 9), folder, dataset="tiny", split="train", samples_per_shard=400, compression="zstd")
    shard = folder / "shard-00000.safetensors.zst"
    if body is not None:
        shard.write_bytes(body)
        manifest = json.loads((folder / "manifest.json").read_text())
        manifest["shards"][0]["bytes"] = len(body)
        (folder / "manifest.json").write_text(json.dumps(manifest))
    return shard


def _zstd(data: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor().compress(data)


def _unzstd(blob: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdDecompressor().decompress(blob)


def _safetensors(images_at: tuple[int, int], labels_at: tuple[int, int], tail: bytes = b"") -> bytes:
    header = json.dumps(
        {
            "images": {"dtype": "U8", "shape": [400, 28, 28], "data_offsets": list(images_at)},
            "labels": {"dtype": "U8", "shape": [400], "data_offsets": list(labels_at)},
        }
    ).encode()
    return len(header).to_bytes(8, "little") + header + bytes(400 * 785) + tail


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda blob: b"not a zstd frame" * 64, r"corrupt zstd data \("),
        (lambda blob: blob[:40] + bytes(len(blob) - 40), r"corrupt zstd data \("),
        (lambda blob: blob[: len(blob) * 3 // 4], r"ends early \(truncated\?\)"),
        (lambda blob: _zstd((1 << 20).to_bytes(8, "little") + bytes(400 * 785)), r"not a safetensors shard"),
        (lambda blob: _zstd(_safetensors((0, 313600), (313600, 314000), b"x" * 9)), r"bytes after the last tensor"),
        (
            lambda blob: _zstd(_safetensors((400, 314000), (0, 390))),
            r"tensor 'labels' at bytes 0..390, expected 0..400",
        ),
    ],
)
@pytest.mark.parametrize("rows", [None, (0, 1), (399, 400)])
def test_damaged_zstd_shard_without_verification(tmp_path, damage, message, rows):
    """Every way a zstd shard can be broken below its checksum is a ShardError naming the
    file (never zstandard's own exception), for whole reads and for row ranges."""
    from pipeline.shards.reader import read_shard_into

    good = _zstd_shard(tmp_path / "good")
    shard = _zstd_shard(tmp_path / "bad", damage(good.read_bytes()))
    entry = json.loads((shard.parent / "manifest.json").read_text())["shards"][0]
    first, stop = rows or (0, 400)
    targets = {
        "images": torch.empty(stop - first, 28, 28, dtype=torch.uint8),
        "labels": torch.empty(stop - first, dtype=torch.uint8),
    }
    with pytest.raises(ShardError, match=message) as err:
        read_shard_into(shard.parent, entry, "zstd", "none", targets, rows=rows)
    assert str(err.value).startswith(f"{shard}: ")


@pytest.mark.parametrize("rows", [(7, 7), (0, 0), (12, 12), (3, 9)])
def test_a_row_range_of_a_zstd_shard_reads_those_rows(tmp_path, rows):
    """A zstd shard is a stream: rows outside the range are skipped, an empty range skips
    every tensor whole (of any dtype), and what follows the last one is still checked."""
    from pipeline.shards import Field, Sample, write_split
    from pipeline.shards.reader import read_shard_into

    rng = np.random.default_rng(3)
    data = {"x": rng.standard_normal((12, 3)).astype(np.float32), "n": rng.integers(-9, 9, 12, dtype=np.int64)}
    sample = Sample((Field("x", "float32", (3,)), Field("n", "int64")))
    write_split(data, tmp_path / "z", sample=sample, dataset="d", split="s", samples_per_shard=12, compression="zstd")
    entry = json.loads((tmp_path / "z" / "manifest.json").read_text())["shards"][0]
    first, stop = rows
    targets = {"x": torch.full((stop - first, 3), 7.0), "n": torch.full((stop - first,), 7, dtype=torch.int64)}
    read_shard_into(tmp_path / "z", entry, "zstd", "none", targets, rows=rows)
    np.testing.assert_array_equal(targets["x"].numpy(), data["x"][first:stop])
    np.testing.assert_array_equal(targets["n"].numpy(), data["n"][first:stop])
    shard = tmp_path / "z" / entry["file"]
    shard.write_bytes(_zstd(_unzstd(shard.read_bytes()) + b"\0"))
    entry = {**entry, "bytes": shard.stat().st_size}
    with pytest.raises(ShardError, match=r"bytes after the last tensor"):
        read_shard_into(tmp_path / "z", entry, "zstd", "none", targets, rows=rows)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here: tests/test_gpu.py reads onto it")
def test_a_cuda_device_without_cuda_is_one_shard_error(split_dir):
    """Asking for CUDA where torch sees none is one line naming the split, not torch's own
    error from deep inside a copy."""
    with pytest.raises(ShardError, match=r": device cuda:1 asked for, but torch sees no CUDA device here"):
        read_split(split_dir, device="cuda:1")


def test_read_split_returns_tensors_on_the_device_asked_for(split_dir, arrays):
    """ "meta" is a device every torch build has: the split must land where it was asked to."""
    images, labels = load(split_dir, device="meta")
    assert images.device.type == "meta" and labels.device.type == "meta"
    assert images.shape == (len(arrays[1]), 28, 28) and labels.shape == (len(arrays[1]),)
    assert images.dtype == labels.dtype == torch.uint8
