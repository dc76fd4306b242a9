"""The shard library beyond MNIST: a declared sample schema (any fixed shape and dtype),
strict writes, format version 2 still read, and the standard PyTorch data contracts."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import write_shards
from torch.utils.data import DataLoader, DistributedSampler

from pipeline.shards import (
    DeviceBatches,
    Field,
    Int64,
    Sample,
    ShardDataset,
    ShardError,
    ShardSampler,
    UnitFloat,
    read_split,
    unit_float,
    write_split,
)
from pipeline.shards.format import V2_SAMPLE, parse_fields, read_manifest
from pipeline.shards.order import EPOCHS, epoch_seed
from pipeline.shards.writer import ShardWriter
from pipeline.stages.mnist import MNIST

# A CIFAR-100-like sample with two extra fields of other dtypes.
CIFAR = Sample(
    (
        Field("image", "uint8", (3, 32, 32)),
        Field("label", "int64", (), classes=100),
        Field("box", "float32", (4,)),
        Field("weight", "int64"),
    )
)


def cifar(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "image": rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8),
        "label": rng.integers(0, 100, n),
        "box": rng.standard_normal((n, 4)).astype(np.float32),
        "weight": rng.integers(-(2**40), 2**40, n),
    }


@pytest.fixture(params=["none", "zstd"])
def cifar_split(request, tmp_path):
    data = cifar(50)
    folder = tmp_path / "cifar"
    write_split(
        data, folder, sample=CIFAR, dataset="cifar", split="train", samples_per_shard=16, compression=request.param
    )
    return folder, data


def test_any_shape_and_dtype_round_trips(cifar_split):
    folder, data = cifar_split
    manifest = read_manifest(folder)
    assert manifest["format_version"] == 4 and parse_fields(manifest["fields"]) == CIFAR
    assert [s["count"] for s in manifest["shards"]] == [16, 16, 16, 2]
    columns = read_split(folder)
    assert list(columns) == ["image", "label", "box", "weight"]
    for name, values in data.items():
        assert columns[name].dtype == getattr(torch, CIFAR[name].dtype)
        np.testing.assert_array_equal(columns[name].numpy(), values)
    assert [t.shape for t in read_split(folder).values()] == [(50, 3, 32, 32), (50,), (50, 4), (50,)]


@pytest.mark.parametrize("shuffle", ["none", "samples", "shards"])
def test_ranks_read_any_schema(cifar_split, shuffle):
    """Each rank's loader gives every field of the samples it names (`indices`), and the
    ranks together take every sample once, whatever the shuffle."""
    folder, data = cifar_split
    dataset = ShardDataset(folder)
    taken = []
    for rank in range(2):
        loader = dataset.loader(8, shuffle=shuffle, seed=1, rank=rank, world_size=2)
        for image, label, box, weight in loader:
            ids = loader.indices.numpy()
            taken += ids.tolist()
            np.testing.assert_array_equal(image.numpy(), data["image"][ids])
            np.testing.assert_array_equal(label.numpy(), data["label"][ids])
            np.testing.assert_array_equal(box.numpy(), data["box"][ids])
            np.testing.assert_array_equal(weight.numpy(), data["weight"][ids])
    assert sorted(taken) == list(range(50))


def test_samples_of_any_schema_come_back_as_stored(cifar_split):
    folder, data = cifar_split
    image, label, box, weight = ShardDataset(folder)[7]
    assert image.dtype == torch.uint8 and image.shape == (3, 32, 32)  # C, H, W kept, values as stored
    assert torch.equal(image, torch.from_numpy(data["image"][7]))
    assert label.dtype == torch.int64 and label == data["label"][7]
    assert torch.equal(box, torch.from_numpy(data["box"][7])) and weight == data["weight"][7]
    assert ShardDataset(folder).names == ["image", "label", "box", "weight"]
    floats = ShardDataset(folder, transform=[UnitFloat("image"), Int64("weight")])[7]
    assert floats[0].dtype == torch.float32 and floats[0].shape == (3, 32, 32)  # no channel added unless asked
    torch.testing.assert_close(floats[0], torch.from_numpy(data["image"][7]).float() / 255, rtol=0, atol=0)
    assert all(torch.equal(a, b) for a, b in zip(floats[1:], (label, box, weight), strict=True))
    with pytest.raises(ValueError, match=r"UnitFloat: field 'box' is float32, not uint8 \(0\.\.255\)"):
        ShardDataset(folder, transform=UnitFloat("box"))
    with pytest.raises(ValueError, match=r"Int64: field 'box' is float32, not an integer field"):
        ShardDataset(folder, transform=Int64("box"))


def test_a_class_label_out_of_range_is_refused_on_read_too(tmp_path):
    """A foreign writer's shard with label 100 in a 100-class field: refused, field and sample named."""
    data = cifar(20)
    write_split(data, tmp_path / "s", sample=CIFAR, dataset="c", split="train", samples_per_shard=8)
    wider = Sample((CIFAR["image"], Field("label", "int64", (), classes=101), CIFAR["box"], CIFAR["weight"]))
    data["label"][13] = 100
    write_split(data, tmp_path / "bad", sample=wider, dataset="c", split="train", samples_per_shard=8)
    manifest = json.loads((tmp_path / "bad" / "manifest.json").read_text())
    manifest["fields"][1]["classes"] = 100
    (tmp_path / "bad" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match=r"bad: field 'label': value 100 at sample 13 is outside 0\.\.99$"):
        read_split(tmp_path / "bad")
    with pytest.raises(ShardError, match=r"bad: field 'label': value 100 at sample 13 is outside 0\.\.99$"):
        list(ShardDataset(tmp_path / "bad").loader(4, shuffle=True))
    with pytest.raises(ShardError, match=r"bad: field 'label': value 100 at sample 13 is outside 0\.\.99$"):
        ShardDataset(tmp_path / "bad").wait()


def test_a_shard_that_does_not_match_the_declared_fields_is_refused(tmp_path):
    """The header is checked against the manifest's schema: a float64 box where float32 is declared."""
    data = cifar(10)
    other = Sample((CIFAR["image"], CIFAR["label"], Field("box", "float64", (4,)), CIFAR["weight"]))
    write_split(data, tmp_path / "s", sample=other, dataset="c", split="train", samples_per_shard=10)
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    manifest["fields"] = CIFAR.to_json()
    manifest["shards"][0]["bytes"] = (tmp_path / "s" / manifest["shards"][0]["file"]).stat().st_size
    (tmp_path / "s" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match=r"tensor 'box' is F64 \[10, 4\], expected F32 \(float32\) \[10, 4\]"):
        read_split(tmp_path / "s")


def as_version_2(folder: Path) -> dict:
    """The folder's manifest rewritten as format version 2 wrote it (fixed images/labels keys)."""
    manifest = json.loads((folder / "manifest.json").read_text())
    del manifest["fields"]
    old = {
        "format_version": 2,
        **{k: manifest[k] for k in ("dataset", "split", "count")},
        "images": {"dtype": "uint8", "shape": [28, 28]},
        "labels": {"dtype": "uint8"},
        **{k: manifest[k] for k in ("compression", "source", "shards")},
    }
    (folder / "manifest.json").write_text(json.dumps(old, indent=2) + "\n")
    return old


def test_version_2_manifests_are_still_read(tmp_path):
    rng = np.random.default_rng(3)
    images, labels = rng.integers(0, 256, (40, 28, 28), dtype=np.uint8), rng.integers(0, 10, 40, dtype=np.uint8)
    write_shards(images, labels, tmp_path / "s", dataset="d", split="train", samples_per_shard=16)
    old = as_version_2(tmp_path / "s")
    manifest = read_manifest(tmp_path / "s")
    assert manifest["format_version"] == 2 and manifest["fields"] == MNIST.to_json() and "images" not in manifest
    assert manifest["shards"] == old["shards"]
    got = read_split(tmp_path / "s")
    np.testing.assert_array_equal(got["images"].numpy(), images)
    np.testing.assert_array_equal(got["labels"].numpy(), labels)
    mapped = ShardDataset(tmp_path / "s")  # no block digests: each shard verified whole when mapped
    np.testing.assert_array_equal(mapped.batch(range(40))[0].numpy(), images)
    old["images"]["shape"] = [32, 32]  # version 2 only ever meant MNIST's shape
    (tmp_path / "s" / "manifest.json").write_text(json.dumps(old))
    with pytest.raises(ShardError, match=r"manifest.json: images: .* expected .* \(format version 2\)$"):
        read_split(tmp_path / "s")


def test_mnist_schema_is_what_version_2_fixed():
    """So the pipeline's shard files keep their bytes across the format change."""
    assert MNIST == V2_SAMPLE
    assert MNIST.to_json() == [
        {"name": "images", "dtype": "uint8", "shape": [28, 28]},
        {"name": "labels", "dtype": "uint8", "shape": [], "classes": 10},
    ]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("image", 256, r"field 'image': value 256 at sample 5 does not fit uint8 \(int64 given\)"),
        ("image", -1, r"field 'image': value -1 at sample 5 does not fit uint8 \(int64 given\)"),
        ("label", 100, r"field 'label': value 100 at sample 5 is outside 0\.\.99"),
        ("label", -1, r"field 'label': value -1 at sample 5 is outside 0\.\.99"),
        ("label", 1.5, r"field 'label': value 1\.5 at sample 5 does not fit int64 \(float64 given\)"),
        ("box", 1e39, r"field 'box': value 1e\+39 at sample 5 does not fit float32 \(float64 given\)"),
        (
            "weight",
            2.0**63,
            r"field 'weight': value 9\.223372036854776e\+18 at sample 5 does not fit int64 \(float64 given\)",
        ),
        ("weight", -(2.0**63), None),  # the smallest int64: fits
        ("weight", float("nan"), r"field 'weight': value nan at sample 5 does not fit int64 \(float64 given\)"),
    ],
)
def test_values_that_do_not_fit_are_refused_with_field_and_sample(tmp_path, field, value, message):
    data = {
        name: values.astype(np.float64) if name != "image" else values.astype(np.int64)
        for name, values in cifar(12).items()
    }
    data[field][5] = value
    if message is None:
        write_split(data, tmp_path / "s", sample=CIFAR, dataset="c", split="train", samples_per_shard=4)
        assert read_split(tmp_path / "s")[field][5] == value
        return
    with pytest.raises(ShardError, match=rf"^c/train: {message}$"):
        write_split(data, tmp_path / "s", sample=CIFAR, dataset="c", split="train", samples_per_shard=4)
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(
    ("dtype", "values", "fits"),
    [
        ("uint8", np.array([0.0, 255.0]), True),
        ("uint8", np.array([256.0]), False),
        ("int8", np.array([-128.0, 127.0]), True),
        ("int8", np.array([128.0]), False),
        ("int64", np.array([2.0**62, -(2.0**63)]), True),
        ("int64", np.array([np.inf]), False),
        ("int64", np.array([True, False]), True),
        ("uint8", np.array([True]), True),
        ("uint8", np.array([-1, 255], np.int16), False),
        ("uint16", np.array([65535], np.int64), True),
        ("bool", np.array([0, 1], np.int64), True),
        ("bool", np.array([2.0, 0.0]), False),
        ("float16", np.array([2048, 65504, -65504], np.int64), True),
        ("float16", np.array([2049], np.int64), False),
        ("float16", np.array([65519], np.int64), False),
        ("float16", np.array([-65520], np.int32), False),
        ("float16", np.array([65520], np.uint32), False),
        ("float16", np.array([255, -128], np.int16), True),
        ("float32", np.array([2**24, -(2**24), 2**31], np.int64), True),
        ("float32", np.array([2**24 + 1]), False),
        ("float32", np.array([-(2**24) - 1], np.int32), False),
        ("float32", np.array([2**63 - 1], np.int64), False),
        ("float32", np.array([-(2**63)], np.int64), True),
        ("float32", np.array([32767], np.int16), True),
        ("float64", np.array([2**53, 2**63, 2**64 - 2**11], np.uint64), True),
        ("float64", np.array([2**53 + 1]), False),
        ("float64", np.array([2**64 - 1], np.uint64), False),
        ("float64", np.array([-(2**63) + 1]), False),
        ("float64", np.array([2**31 - 1, -(2**31)], np.int32), True),
        ("float64", np.array([0, 1], np.uint8), True),
        ("float32", np.array([3.0e38]), True),
        ("float32", np.array(["1.0"]), False),
        ("float64", np.array([1 + 1j]), False),
    ],
)
def test_a_value_fits_its_field_exactly_at_the_edges(dtype, values, fits):
    """Each value either has its own exact counterpart in the field's dtype (a bool as 0/1,
    a whole float within the integer range, an integer the float type holds exactly: at most
    its significand's bits between its lowest and highest set bit, 11 for float16, 24 for
    float32, 53 for float64, and within float16's 65,504) and is stored as that, or the batch
    is refused naming it."""
    from pipeline.shards.writer import fit

    field = Field("x", dtype)
    if not fits:
        with pytest.raises(ShardError, match=rf"^w: field 'x': value .* at sample 7 does not fit {dtype} "):
            fit(field, values, "w", 7)
        return
    got = fit(field, values, "w", 7)
    assert got.dtype == np.dtype(dtype) and got.flags.c_contiguous
    np.testing.assert_array_equal(got, values.astype(dtype))


F32, F64 = Sample((Field("x", "float32"),)), Sample((Field("x", "float64"),))


@pytest.mark.parametrize(
    ("sample", "values", "shown", "given"),
    [
        (F32, np.array([0, 16_777_217]), "16777217", "int64"),  # float32 holds 2**24, not 2**24 + 1
        (F32, [0, 16_777_217], "16777217", "int64"),  # a Python list of ints
        (F32, torch.tensor([0, 16_777_217]), "16777217", "int64"),  # a tensor
        (F32, np.array([0, 16_777_217], object), "16777217", "object"),  # a mixed pandas frame's .values
        (F32, [0.5, 16_777_217], "16777217", "list"),  # numpy would make it 16777216.0 first
        (F64, np.array([0, 2**53 + 1]), "9007199254740993", "int64"),
        (F64, np.array([0, 2**64 - 1], np.uint64), "18446744073709551615", "uint64"),
        (F64, [0, 2**64 - 1], "18446744073709551615", "list"),  # numpy: float64, 2**64 - 1 rounded
        (F64, [0.5, 2**53 + 1], "9007199254740993", "list"),
        (F64, np.array([0, 2**70], object), "1180591620717411303424", None),  # 2**70: exact in float64, stored
        (F64, np.array([0, 2**70 + 1], object), "1180591620717411303425", "object"),
    ],
)
def test_an_integer_a_float_field_cannot_hold_exactly_is_refused(tmp_path, sample, values, shown, given):
    """Issue 61: 16,777,217 written into float32 became 16,777,216, and 2**53 + 1 and 2**64 - 1
    into float64 changed, without a word. Now refused with the field, the value and the
    sample, however the integers are handed over; an integer the float holds is stored."""
    if given is None:
        write_split({"x": values}, tmp_path / "s", sample=sample, dataset="d", split="s", samples_per_shard=4)
        assert [int(v) for v in read_split(tmp_path / "s")["x"].tolist()] == [int(v) for v in values]
        return
    with pytest.raises(
        ShardError,
        match=rf"^d/s: field 'x': value {shown} at sample 1 does not fit "
        rf"{sample['x'].dtype} \({given} given\)$",
    ):
        write_split({"x": values}, tmp_path / "s", sample=sample, dataset="d", split="s", samples_per_shard=4)
    assert not (tmp_path / "s").exists()


def test_an_integer_field_takes_a_list_of_ints_and_whole_floats_exactly(tmp_path):
    """numpy makes [2**53 + 1, 2.0] float64 (2**53 + 1 rounded); the writer reads such a list
    number by number, so an int64 field stores 2**53 + 1 itself, and a fraction is refused."""
    sample = Sample((Field("x", "int64"),))
    write_split({"x": [2**53 + 1, 2.0, -3]}, tmp_path / "s", sample=sample, dataset="d", split="s", samples_per_shard=4)
    assert read_split(tmp_path / "s")["x"].tolist() == [2**53 + 1, 2, -3]
    with pytest.raises(ShardError, match=r"^d/s: field 'x': value 2\.5 at sample 1 does not fit int64 \(list given\)$"):
        write_split({"x": [2**53 + 1, 2.5]}, tmp_path / "t", sample=sample, dataset="d", split="s", samples_per_shard=4)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_special_floats_round_trip_bit_exact_and_floats_narrow_as_before(tmp_path, dtype):
    """NaN payloads, infinities, -0 and subnormals of the field's own dtype come back bit for
    bit; a float64 array into a narrower float field is rounded as before (only an overflow
    to inf is refused), and a Python float too."""
    kind = np.dtype(dtype)
    bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[kind.itemsize]
    info = np.finfo(kind)
    special = np.array(
        [
            np.nan,
            -np.nan,
            np.inf,
            -np.inf,
            -0.0,
            0.0,
            info.smallest_subnormal,
            -info.smallest_subnormal,
            info.max,
            info.min,
        ],
        kind,
    )
    payload = special.view(bits).copy()
    payload[0] |= bits(1)  # a NaN with a payload bit set
    values = payload.view(kind)
    sample = Sample((Field("x", dtype),))
    for name, given in (("same", values), ("tensor", torch.from_numpy(values))):
        write_split({"x": given}, tmp_path / name, sample=sample, dataset="d", split="s", samples_per_shard=4)
        for got in (
            read_split(tmp_path / name)["x"].numpy(),
            ShardDataset(tmp_path / name).batch(range(10))[0].numpy(),
        ):
            assert got.view(bits).tolist() == payload.tolist()
    if dtype != "float64":
        wide = np.array([0.1, 1 / 3, 65504.0, 1e-8])
        write_split({"x": wide}, tmp_path / "narrowed", sample=sample, dataset="d", split="s", samples_per_shard=4)
        assert read_split(tmp_path / "narrowed")["x"].numpy().tobytes() == wide.astype(kind).tobytes()
        write_split(
            {"x": [0.1, 1 / 3]}, tmp_path / "listed", sample=sample, dataset="d", split="s", samples_per_shard=4
        )
        assert read_split(tmp_path / "listed")["x"].numpy().tobytes() == np.array([0.1, 1 / 3]).astype(kind).tobytes()


def test_a_batch_that_is_not_a_mapping_is_named_by_its_type(tmp_path):
    writer = ShardWriter(tmp_path / "a" / "b", sample=MNIST, dataset="d", split="train", samples_per_shard=4)
    with pytest.raises(
        ShardError,
        match=r"^d/train: a batch must map exactly the fields \['images', 'labels'\], "
        r"got list$",
    ):
        writer.add([np.zeros((1, 28, 28), np.uint8), np.zeros(1, np.uint8)])
    writer.abort()
    assert (tmp_path / "a").is_dir() and not (tmp_path / "a" / "b").exists()  # parents made; nothing published


def test_the_sample_index_counts_across_batches(tmp_path):
    writer = ShardWriter(tmp_path / "s", sample=MNIST, dataset="d", split="train", samples_per_shard=4)
    images = np.zeros((6, 28, 28), np.uint8)
    writer.add({"images": images, "labels": np.arange(6) % 10})
    with pytest.raises(ShardError, match=r"^d/train: field 'labels': value 12 at sample 8 is outside 0\.\.9$"):
        writer.add({"images": images, "labels": [1, 2, 12, 3, 4, 5]})
    with pytest.raises(
        ShardError, match=r"a batch must map exactly the fields \['images', 'labels'\], got \['images'\]"
    ):
        writer.add({"images": images})


def test_bool_and_float16_fields(tmp_path):
    sample = Sample((Field("mask", "bool", (2, 3)), Field("x", "float16")))
    mask = np.arange(24).reshape(4, 2, 3) % 2
    write_split(
        {"mask": mask, "x": [0.5, 1, 2, 65504]},
        tmp_path / "ok",
        sample=sample,
        dataset="d",
        split="s",
        samples_per_shard=3,
    )
    columns = read_split(tmp_path / "ok")
    assert columns["mask"].dtype == torch.bool and torch.equal(columns["mask"], torch.from_numpy(mask.astype(bool)))
    assert columns["x"].tolist() == [0.5, 1, 2, 65504]
    mask[2, 1, 0] = 2
    with pytest.raises(ShardError, match=r"field 'mask': value .* at sample 2 does not fit bool"):
        write_split(
            {"mask": mask, "x": [0, 0, 0, 0]},
            tmp_path / "b",
            sample=sample,
            dataset="d",
            split="s",
            samples_per_shard=3,
        )
    with pytest.raises(ShardError, match=r"field 'x': value 70000 at sample 1 does not fit float16"):
        write_split(
            {"mask": mask % 2, "x": [0, 70000, 0, 0]},
            tmp_path / "b",
            sample=sample,
            dataset="d",
            split="s",
            samples_per_shard=3,
        )


@pytest.mark.parametrize("batch", [1, 3, 16, 17, 50])
def test_bytes_depend_neither_on_batching_nor_on_the_dtype_handed_over(tmp_path, batch):
    data = cifar(50)
    write_split(data, tmp_path / "whole", sample=CIFAR, dataset="c", split="t", samples_per_shard=16)
    writer = ShardWriter(tmp_path / "fed", sample=CIFAR, dataset="c", split="t", samples_per_shard=16)
    wide = {
        "image": data["image"].astype(np.int32),
        "label": data["label"].astype(np.uint8),
        "box": data["box"].astype(np.float64),
        "weight": data["weight"],
    }
    for start in range(0, 50, batch):
        writer.add({name: values[start : start + batch] for name, values in wide.items()})
    writer.finish()
    for name in ("manifest.json", "shard-00000.safetensors", "shard-00003.safetensors"):
        assert (tmp_path / "fed" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Field("a b", "uint8"), r"the name must be a Python identifier"),
        (lambda: Field("x", "float128"), r"dtype 'float128' is not one of"),
        (lambda: Field("x", "float32", (), classes=10), r"classes need an integer dtype, not float32"),
        (lambda: Field("x", "uint8", (), classes=257), r"classes 257 must be an integer in 1\.\.256"),
        (lambda: Field("x", "int8", (), classes=0), r"classes 0 must be an integer in 1\.\.128"),
        (lambda: Field("x", "uint8", (0, 3)), r"shape \(0, 3\) must be"),
        (lambda: Field("x", "uint8", [3]), r"shape \[3\] must be"),
        (lambda: Field("x", "float64", (1 << 15, 1 << 15)), r"one sample takes over"),
        (lambda: Sample((Field("x", "uint8"), Field("x", "int8"))), r"field names must be distinct"),
        (lambda: Sample(()), r"a sample has 1\.\.64 fields, got 0"),
    ],
)
def test_bad_declarations_are_refused(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_declarations_at_each_limit_are_taken_and_one_past_it_refused():
    """The bounds of a declaration are inclusive: exactly MAX_DIMS dimensions, sizes of 1,
    a sample of exactly MAX_SAMPLE_BYTES, classes 1..what the dtype holds, MAX_FIELDS fields."""
    from pipeline.shards.format import MAX_DIMS, MAX_FIELDS, MAX_SAMPLE_BYTES, field_problem

    edge = [
        Field("x", "uint8", (1,) * MAX_DIMS),
        Field("x", "uint8", (MAX_SAMPLE_BYTES,)),
        Field("x", "uint16", (MAX_SAMPLE_BYTES // 2,)),
        Field("x", "uint8", classes=1),
        Field("x", "uint8", classes=256),
        Field("x", "int8", classes=128),
        Field("x", "int64", classes=1 << 63),
    ]
    assert [field_problem(f) for f in edge] == [None] * len(edge)
    past = [
        ((1,) * (MAX_DIMS + 1), "uint8", None, "must be at most 8 dimensions"),
        ((MAX_SAMPLE_BYTES + 1,), "uint8", None, "must be at most 8 dimensions of 1..1073741824"),
        ((MAX_SAMPLE_BYTES // 2 + 1,), "uint16", None, "one sample takes over 1,073,741,824 bytes"),
        ((), "uint8", 0, r"classes 0 must be an integer in 1\.\.256"),
        ((), "uint8", 257, r"classes 257 must be an integer in 1\.\.256"),
        ((), "int8", 129, r"classes 129 must be an integer in 1\.\.128"),
        ((), "uint8", True, r"classes True must be an integer"),
    ]
    for shape, dtype, classes, message in past:
        with pytest.raises(ValueError, match=message):
            Field("x", dtype, shape, classes)
    assert len(Sample(tuple(Field(f"f{i}", "uint8") for i in range(MAX_FIELDS))).fields) == MAX_FIELDS
    with pytest.raises(ValueError, match=r"a sample has 1\.\.64 fields, got 65"):
        Sample(tuple(Field(f"f{i}", "uint8") for i in range(MAX_FIELDS + 1)))
    entries = [{"name": f"f{i}", "dtype": "uint8", "shape": []} for i in range(MAX_FIELDS + 1)]
    assert len(parse_fields(entries[:-1], Path("m.json")).fields) == MAX_FIELDS
    with pytest.raises(ShardError, match=r"^m\.json: fields: 65 fields, expected 1\.\.64"):
        parse_fields(entries, Path("m.json"))
    big = Sample((Field("a", "uint8", (MAX_SAMPLE_BYTES // 2,)), Field("b", "uint8", (MAX_SAMPLE_BYTES // 2,))))
    assert big.row_bytes == MAX_SAMPLE_BYTES
    with pytest.raises(ValueError, match=r"one sample takes 1,073,741,825 bytes, over 1,073,741,824$"):
        Sample((Field("a", "uint8", (MAX_SAMPLE_BYTES // 2,)), Field("b", "uint8", (MAX_SAMPLE_BYTES // 2 + 1,))))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"a": 1}, r"fields: expected a list of fields"),
        ([], r"fields: 0 fields, expected 1\.\.64"),
        ([{"name": "x", "dtype": "uint8"}], r"fields\[0\]: expected keys name, dtype, shape"),
        ([{"name": "x", "dtype": "uint8", "shape": [2], "extra": 1}], r"fields\[0\]: expected keys"),
        ([{"name": "x", "dtype": ["uint8"], "shape": []}], r"fields\[0\]: field 'x': dtype \['uint8'\] is not one of"),
        ([{"name": "x", "dtype": "uint8", "shape": 3}], r"fields\[0\]\.shape: expected a list of sizes, got 3"),
        ([{"name": "x", "dtype": "uint8", "shape": [True]}], r"fields\[0\]: field 'x': shape \(True,\) must be"),
        (
            [{"name": "x", "dtype": "uint8", "shape": []}, {"name": "x", "dtype": "uint8", "shape": []}],
            r"fields: field names must be distinct",
        ),
        ([{"name": "../x", "dtype": "uint8", "shape": []}], r"fields\[0\]: field '\.\./x': the name must be"),
    ],
)
def test_hostile_field_declarations_in_a_manifest(fields, message):
    with pytest.raises(ShardError, match=rf"^m\.json: {message}"):
        parse_fields(fields, Path("m.json"))


# ---- The standard PyTorch contracts ------------------------------------------------------


@pytest.fixture(scope="module")
def mnist_split(tmp_path_factory):
    rng = np.random.default_rng(5)
    images, labels = rng.integers(0, 256, (100, 28, 28), dtype=np.uint8), rng.integers(0, 10, 100, dtype=np.uint8)
    folder = tmp_path_factory.mktemp("mnist") / "train"
    write_shards(images, labels, folder, dataset="d", split="train", samples_per_shard=32)
    return folder, images, labels


def test_a_plain_dataloader_with_the_default_collate(mnist_split):
    folder, images, labels = mnist_split
    data = ShardDataset(folder)
    batches = list(DataLoader(data, batch_size=32))
    assert [len(y) for _, y in batches] == [32, 32, 32, 4]
    x = torch.cat([x for x, _ in batches])
    assert x.shape == (100, 28, 28) and x.dtype == torch.uint8 and torch.equal(x, torch.from_numpy(images))
    assert torch.equal(torch.cat([y for _, y in batches]), torch.from_numpy(labels))
    converted = ShardDataset(folder, transform=[UnitFloat("images", add_channel=True), Int64("labels")])
    batches = list(DataLoader(converted, batch_size=32))
    x = torch.cat([x for x, _ in batches])
    assert x.shape == (100, 1, 28, 28) and x.dtype == torch.float32
    assert torch.equal(x, unit_float(torch.from_numpy(images), add_channel=True))  # the device path's values
    assert torch.equal(torch.cat([y for _, y in batches]), torch.from_numpy(labels).long())


def test_shuffle_samplers_and_a_users_collate(mnist_split):
    folder, _, labels = mnist_split
    data = ShardDataset(folder)
    order = [y for _, y in DataLoader(data, batch_size=10, shuffle=True, generator=torch.Generator().manual_seed(1))]
    assert sorted(torch.cat(order).tolist()) == sorted(labels.tolist())
    seen = []
    collate = lambda samples: seen.append(len(samples)) or len(samples)  # noqa: E731
    assert list(DataLoader(data, batch_size=40, collate_fn=collate)) == [40, 40, 20] and seen == [40, 40, 20]
    halves = [list(DistributedSampler(data, num_replicas=2, rank=r, shuffle=True, seed=3)) for r in range(2)]
    for rank, mine in enumerate(halves):
        got = torch.cat(
            [
                y
                for _, y in DataLoader(
                    data,
                    batch_size=16,
                    sampler=DistributedSampler(data, num_replicas=2, rank=rank, shuffle=True, seed=3),
                )
            ]
        )
        assert torch.equal(got, torch.from_numpy(labels[mine]))
    assert sorted(halves[0] + halves[1]) == list(range(100))


@pytest.mark.slow
def test_workers_give_the_same_batches(mnist_split):
    folder, _, _ = mnist_split
    data = ShardDataset(folder)
    plain = list(DataLoader(data, batch_size=32))
    for loader in (DataLoader(data, batch_size=32, num_workers=2), data.loader(32, num_workers=2)):
        got = list(loader)
        assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(got, plain, strict=True))


def test_the_fast_path_gives_what_the_plain_path_gives(mnist_split):
    folder, images, labels = mnist_split
    data = ShardDataset(folder)
    for (fx, fy), (px, py) in zip(data.loader(32), DataLoader(data, batch_size=32), strict=True):
        assert torch.equal(fx, px) and torch.equal(fy, py)
    loader = data.loader(32, shuffle=True, seed=0)
    epochs = []
    for epoch in range(2):
        got = [(x, y, loader.indices) for x, y in loader]
        indices = torch.cat([i for _, _, i in got])
        expected = torch.randperm(100, generator=torch.Generator().manual_seed(epoch_seed(0, epoch)))
        assert torch.equal(indices, expected)  # the one rule: torch.randperm seeded by (seed, epoch)
        assert torch.equal(torch.cat([x for x, _, _ in got]), torch.from_numpy(images)[indices])
        epochs.append(torch.cat([y for _, y, _ in got]))
    assert not torch.equal(epochs[0], epochs[1])  # a fresh per-sample permutation each epoch
    assert all(sorted(e.tolist()) == sorted(labels.tolist()) for e in epochs)
    again = data.loader(32, shuffle=True, seed=0)
    assert torch.equal(torch.cat([y for _, y in again]), epochs[0])  # and the same one for the same seed
    other = data.loader(32, shuffle=True, seed=1)
    assert not torch.equal(torch.cat([y for _, y in other]), epochs[0])
    ranks = [torch.cat([y for _, y in data.loader(16, shuffle=True, seed=3, rank=r, world_size=2)]) for r in range(2)]
    assert sorted(torch.cat(ranks).tolist()) == sorted(labels.tolist())
    assert [len(b[1]) for b in data.loader(32, drop_last=True)] == [32, 32, 32]
    assert len(data.loader(32)) == 4 and len(data.loader(32, drop_last=True)) == 3


def test_a_shard_sampler_drives_a_plain_dataloader(mnist_split):
    """`batch_sampler=`: the dataset's __getitems__ gets whole batches of int64 indices."""
    folder, images, labels = mnist_split
    data = ShardDataset(folder)
    sampler = data.sampler(16, shuffle="shards", seed=2)
    batches = list(DataLoader(data, batch_sampler=sampler))
    order = sampler.order(0)
    assert [len(y) for _, y in batches] == [16] * 6 + [4]
    assert torch.equal(torch.cat([y for _, y in batches]), torch.from_numpy(labels[order]))
    assert torch.equal(torch.cat([x for x, _ in batches]), torch.from_numpy(images[order]))


def test_transform_and_indices(mnist_split):
    folder, images, _ = mnist_split
    data = ShardDataset(folder, transform=lambda batch: {**batch, "images": batch["images"].flip(-1)})
    x, y = data[-1]
    assert torch.equal(x, torch.from_numpy(images[-1]).flip(-1)) and y.dtype == torch.uint8
    with pytest.raises(IndexError, match=r"sample index out of range 0\.\.99"):
        data[100]
    with pytest.raises(TypeError, match=r"a sample index is an integer, got float"):
        data[1.0]
    assert len(data) == 100 and data.names == ["images", "labels"] and data.shard_counts == [32, 32, 32, 4]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("mean", "std"), [(None, None), (0.1307, 0.3081), (0.2860, 0.3530)])
def test_unit_float_host_path_gives_torchs_values(mnist_split, dtype, mean, std):
    """On the CPU, float32/float64 batches are made with numpy (one thread); they must be the
    values torch's own ops give (what a GPU batch goes through), bit for bit, as must the
    torch path's for the other dtypes."""
    _, images, labels = mnist_split
    x, y = torch.from_numpy(images), torch.from_numpy(labels)
    transform = [UnitFloat("images", mean=mean, std=std, dtype=dtype, add_channel=True), Int64("labels")]
    batches = DeviceBatches({"images": x, "labels": y}, 32, shuffle=True, seed=4, transform=transform)
    for (got_x, got_y), index in zip(batches, batches.rank_order(0).split(32), strict=True):
        want = x[index].to(dtype).div_(255)
        if mean is not None:
            want = want.sub_(mean).div_(std)
        want = want.unsqueeze(1)
        assert got_x.dtype == dtype and got_x.shape == want.shape and torch.equal(got_x, want)
        assert got_y.dtype == torch.int64 and torch.equal(got_y, y[index].long())


def test_mapped_split_is_verified_and_pickles_as_its_path(mnist_split, tmp_path):
    import pickle
    import shutil

    from pipeline.shards.mapped import MappedSplit

    folder, images, _ = mnist_split
    split = pickle.loads(pickle.dumps(MappedSplit(folder)))  # a spawned worker maps the files again
    np.testing.assert_array_equal(split.take(np.arange(100))["images"], images)
    used = MappedSplit(folder)
    used.take([0, 99])
    assert len(pickle.dumps(used)) < 1000  # the path, not the data (nor the maps)
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    shard = copy / "shard-00001.safetensors"
    body = bytearray(shard.read_bytes())
    body[-5] ^= 1
    shard.write_bytes(bytes(body))
    with pytest.raises(ShardError, match=r"shard-00001.safetensors: checksum mismatch"):
        ShardDataset(copy).split.wait()  # verified as used: by the batch that touches it, or by then
    ShardDataset(copy, verify="none").split.wait()  # the damage is in a label in range: only a digest sees it


def test_sampler_batches_are_int64_cut_from_torchs_permutation():
    for shuffle in (True, False):
        for epoch in (0, 2):
            sampler = ShardSampler(11, 4, shuffle=shuffle, seed=5)
            sampler.set_epoch(epoch)
            batches = list(sampler)
            assert [b.dtype for b in batches] == [np.dtype(np.int64)] * 3 and [len(b) for b in batches] == [4, 4, 3]
            generator = torch.Generator().manual_seed(epoch_seed(5, epoch))
            expected = torch.randperm(11, generator=generator) if shuffle else torch.arange(11)
            assert np.concatenate(batches).tolist() == expected.tolist()


def test_the_epoch_order_does_not_depend_on_the_world_size():
    """Ranks take contiguous runs of one order (lengths differing by at most one), so the
    runs in rank order are the order a single process takes."""
    counts = [7, 7, 7, 2]
    for shuffle in ("none", "samples", "shards"):
        alone = np.concatenate(list(ShardSampler(23, 3, shuffle=shuffle, seed=9, shard_counts=counts)))
        for world in (2, 3, 5):
            runs = [
                np.concatenate(
                    list(ShardSampler(23, 3, shuffle=shuffle, seed=9, rank=r, world_size=world, shard_counts=counts))
                )
                for r in range(world)
            ]
            assert max(map(len, runs)) - min(map(len, runs)) <= 1
            assert np.concatenate(runs).tolist() == alone.tolist()
    shards = ShardSampler(23, 3, shuffle="shards", seed=9, shard_counts=counts).order(0)
    starts = [0, 7, 14, 21, 23]
    owners = np.searchsorted(starts, shards, side="right") - 1
    assert (np.diff(owners) != 0).sum() == 3  # each shard's samples together, the shards in a seeded order
    assert sorted(shards.tolist()) == list(range(23))
    with pytest.raises(ValueError, match='shuffle "shards" needs the shard_counts'):
        ShardSampler(23, 3, shuffle="shards")


@pytest.mark.parametrize(("world", "batch", "then_world", "then_batch"), [(2, 4, 3, 5), (3, 2, 1, 7), (1, 6, 4, 1)])
def test_an_interrupted_epoch_resumes_on_another_world_size(world, batch, then_world, then_batch):
    """Elastic: stopped after 2 steps on `world` ranks, the epoch is finished on `then_world`
    ranks with another batch size, and every sample is taken exactly once."""
    taken = []
    states = []
    for rank in range(world):
        sampler = ShardSampler(37, batch, shuffle=True, seed=4, rank=rank, world_size=world)
        steps = iter(sampler)
        taken += [int(i) for _ in range(2) for i in next(steps)]
        states.append(sampler.state_dict(2))
    assert all(state == states[0] for state in states)  # the same on every rank
    for rank in range(then_world):
        sampler = ShardSampler(37, then_batch, shuffle=True, seed=4, rank=rank, world_size=then_world)
        sampler.load_state_dict(states[0])
        taken += [int(i) for b in sampler for i in b]
        assert sampler.epoch == 1 and sampler.state_dict()["due"] == [[0, 37]]
    assert sorted(taken) == list(range(37))
    with pytest.raises(ShardError, match=r"data position: saved with shuffle 'samples', this loader has 'none'"):
        ShardSampler(37, 4, seed=4).load_state_dict(states[0])
    with pytest.raises(ShardError, match=r"data position: due interval \[5, 2\] is not ordered"):
        ShardSampler(37, 4, shuffle=True, seed=4).load_state_dict({**states[0], "due": [[5, 2]]})


def test_an_epoch_stopped_many_times_on_changing_worlds_takes_every_sample_once():
    """Preempted again and again within one epoch, each time resumed on another world size and
    batch size: what is still due becomes many runs, each resume skips exactly the batches taken
    (across runs of several intervals), and the epoch ends with every sample taken once."""
    rng = np.random.default_rng(11)
    for case in range(60):
        count, shuffle = int(rng.integers(1, 90)), bool(case % 2)
        taken, state = [], None
        for stop in range(int(rng.integers(1, 5)) + 1):
            world, batch = int(rng.integers(1, 5)), int(rng.integers(1, 9))
            samplers = [
                ShardSampler(count, batch, shuffle=shuffle, seed=4, rank=r, world_size=world) for r in range(world)
            ]
            for sampler in samplers:
                if state is not None:
                    sampler.load_state_dict(state)
            total = samplers[0].steps(samplers[0].due)
            steps = int(rng.integers(1, total + 1))  # an iteration started: its plan is known
            for sampler in samplers:
                batches = iter(sampler)
                taken += [int(i) for _ in range(steps) for i in next(batches)]
            states = [sampler.state_dict(steps) for sampler in samplers]
            assert all(s == states[0] for s in states), case  # the same on every rank
            state = states[0]
            if state["epoch"] == 1:
                break
            due = [i for a, b in state["due"] for i in range(a, b)]  # positions in epoch 0's order
            order = samplers[0].order(0)
            assert sorted(order[due].tolist()) == sorted(set(range(count)) - set(taken)), case
        if state["epoch"] == 0:  # the rest on one rank
            last = ShardSampler(count, 3, shuffle=shuffle, seed=4)
            last.load_state_dict(state)
            taken += [int(i) for b in last for i in b]
        assert sorted(taken) == list(range(count)), case


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_the_loader_resumes_mid_epoch(mnist_split, workers):
    """`state_dict` counts the batches the loop took, not those the DataLoader fetched ahead
    (with workers, several batches are in flight when the loop stops)."""
    folder, _, labels = mnist_split
    data = ShardDataset(folder)
    whole = torch.cat([y for _, y in data.loader(10, shuffle=True, seed=6)])
    loader = data.loader(10, shuffle=True, seed=6, num_workers=workers)
    taken = []
    for step, (_, y) in enumerate(loader):
        taken.append(y)
        if step == 3:
            break
    state = loader.state_dict()
    assert state["epoch"] == 0 and state["due"] == [[40, 100]]
    resumed = data.loader(25, shuffle=True, seed=6, rank=1, world_size=2)  # elastic: other batch, other ranks
    resumed.load_state_dict(state)
    other = data.loader(25, shuffle=True, seed=6, rank=0, world_size=2)
    other.load_state_dict(state)
    rest = [y for loader in (other, resumed) for _, y in loader]
    assert torch.equal(torch.cat(taken + rest), whole)
    assert resumed.epoch == 1


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"count": -1}, r"count must be an integer of at least 0, got -1"),
        ({"count": 3.0}, r"count must be an integer of at least 0, got 3\.0"),
        ({"batch_size": 0}, r"batch_size must be an integer of at least 1, got 0"),
        ({"batch_size": True}, r"batch_size must be an integer of at least 1, got True"),
        ({"world_size": 0}, r"world_size must be an integer of at least 1, got 0"),
        ({"seed": -1}, r"seed must be an integer in 0..4294967295, got -1"),
        ({"rank": 2, "world_size": 2}, r"rank 2 is outside 0\.\.1"),
        ({"rank": -1}, r"rank -1 is outside 0\.\.0"),
        ({"rank": 0.0}, r"rank 0\.0 is outside 0\.\.0"),
        ({"shard_counts": [2, 2]}, r"shard_counts must be positive and add up to count 5"),
        ({"shard_counts": [5, 0]}, r"shard_counts must be positive and add up to count 5"),
        ({"shard_counts": [6, -1]}, r"shard_counts must be positive and add up to count 5"),
    ],
)
def test_sampler_arguments_are_checked_at_their_bounds(arguments, message):
    """Each argument is refused one past its bound, in one line naming it (mutation testing
    found the bounds unpinned); the bounds themselves are accepted below."""
    with pytest.raises(ValueError, match=message):
        ShardSampler(**{"count": 5, "batch_size": 2, **arguments})


def test_sampler_arguments_at_their_bounds_are_accepted():
    assert list(ShardSampler(0, 1, seed=0)) == []
    ranks = [[b.tolist() for b in ShardSampler(5, 1, rank=r, world_size=2, shard_counts=[1, 4])] for r in (0, 1)]
    assert ranks == [[[0], [1], [2]], [[3], [4], []]]  # the last rank; equal steps, its last batch empty
    assert sorted(np.concatenate(list(ShardSampler(5, 5, shard_counts=[1, 1, 1, 1, 1]))).tolist()) == [0, 1, 2, 3, 4]


def test_an_epochs_order_is_part_of_the_resume_format():
    """A saved position counts positions in an epoch's order, rebuilt from (seed, epoch) when
    the run resumes: the order for a seed is pinned here, so a change to it (a new seed mix,
    another shuffle) fails this test instead of resuming a checkpoint onto other samples."""
    assert ShardSampler(12, 3, shuffle=True, seed=7).order(0).tolist() == [5, 8, 6, 9, 1, 2, 3, 7, 0, 10, 11, 4]
    assert ShardSampler(12, 3, shuffle=True, seed=7).order(2).tolist() == [4, 10, 9, 7, 1, 6, 0, 5, 11, 2, 8, 3]
    assert ShardSampler(12, 3, shuffle="shards", seed=7, shard_counts=[5, 4, 3]).order(1).tolist() == [
        6,
        8,
        5,
        7,
        10,
        9,
        11,
        0,
        4,
        3,
        1,
        2,
    ]
    assert epoch_seed(7, 2) == 7 * 1_000_003 + 2


@pytest.mark.parametrize("shuffle", [False, True, "shards"])
def test_an_empty_split_has_no_batches_and_a_position_that_loads(shuffle):
    """A split of 0 samples: no batches, an empty int64 order, and a saved position (no
    interval due) that a new sampler accepts, before and after an epoch."""

    def make():
        return ShardSampler(0, 4, shuffle=shuffle, seed=3, shard_counts=[] if shuffle == "shards" else None)

    sampler = make()
    for epoch in (0, 5):
        order = sampler.order(epoch)
        assert order.dtype == np.int64 and order.shape == (0,)
        assert sampler.rank_order(epoch).shape == (0,)
    assert len(sampler) == 0 and list(sampler) == []
    for state in (sampler.state_dict(), sampler.state_dict(0)):
        assert state["due"] == [] and state["epoch"] == 1
        make().load_state_dict(state)
    sampler.set_epoch(4)
    assert sampler.state_dict() == {**sampler.state_dict(), "epoch": 4, "due": []}


def test_the_sampler_defaults_to_seed_0():
    assert (
        ShardSampler(40, 8, shuffle=True).order(1).tolist()
        == ShardSampler(40, 8, shuffle=True, seed=0).order(1).tolist()
    )
    assert ShardSampler(40, 8, shuffle=True).state_dict()["seed"] == 0


def test_shuffling_by_shards_without_the_shard_counts_is_refused():
    with pytest.raises(ValueError, match=r'^shuffle "shards" needs the shard_counts of the split$'):
        ShardSampler(8, 2, shuffle="shards")


@pytest.mark.parametrize("epoch", [-1, 1.0, "1", True, 1_000_003])
def test_set_epoch_takes_only_an_integer_in_the_range_a_seed_spans(epoch):
    with pytest.raises(ValueError, match=r"^epoch must be an integer in 0..1000002, got "):
        ShardSampler(8, 2).set_epoch(epoch)


@pytest.mark.parametrize("seed", [-1, 2**32, 2**60, 1.0])
def test_a_seed_outside_numpys_range_is_refused_in_one_line(seed):
    # 2**60 reached torch.Generator.manual_seed, which raised its own overflow error
    with pytest.raises(ValueError, match=r"^seed must be an integer in 0..4294967295, got "):
        ShardSampler(8, 2, shuffle=True, seed=seed)


def test_the_samplers_seed_range_is_the_params_seed_range():
    from annotated_types import Interval

    from pipeline.core.bounds import SEED
    from pipeline.shards.order import SEED_MAX

    (bounds,) = [m for m in SEED.__metadata__ if isinstance(m, Interval)]
    assert (bounds.ge, bounds.le) == (0, SEED_MAX)


def test_no_two_seed_epoch_pairs_share_a_shuffle_within_the_range():
    # seed s's epoch EPOCHS would have been seed s+1's epoch 0; the range stops one short
    last = ShardSampler(64, 8, shuffle=True, seed=0)
    assert not np.array_equal(last.order(EPOCHS - 1), ShardSampler(64, 8, shuffle=True, seed=1).order(0))
    with pytest.raises(ValueError, match="epoch must be an integer"):
        last.set_epoch(EPOCHS)


def test_a_position_of_batches_taken_needs_an_iteration_and_a_count_within_it():
    """state_dict(steps) counts batches of the iteration started last: none started is
    refused, 0 is where that iteration began, and a count outside 0..steps is refused."""
    sampler = ShardSampler(10, 2, shuffle=True, seed=1)
    with pytest.raises(ValueError, match=r"no iteration was started"):
        sampler.state_dict(0)
    sampler.load_state_dict({**sampler.state_dict(), "due": [[2, 7]]})
    begun = sampler.state_dict()
    batches = iter(sampler)
    assert sampler.state_dict(0) == begun  # begun with iter(), before its first batch
    next(batches)
    assert sampler.state_dict(0) == begun
    for steps in (-1, 4, 1.0):
        with pytest.raises(ValueError, match=r"steps must be 0\.\.3 for this epoch, got "):
            sampler.state_dict(steps)


def test_the_order_of_a_fresh_epoch_ignores_a_resumed_position():
    """rank_order(epoch) is that epoch from its beginning, whatever is left of the current one."""
    sampler = ShardSampler(10, 2, shuffle=True, seed=1)
    whole = sampler.rank_order(0).tolist()
    sampler.load_state_dict({**sampler.state_dict(), "due": [[6, 10]]})
    assert sampler.rank_order(0).tolist() == whole and sampler.rank_order().tolist() == whole[6:]
