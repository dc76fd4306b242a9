import re

import numpy as np
import pytest

from pipeline.core.errors import DataError
from pipeline.stages.mnist import IdxError, idx_bytes, parse_idx, read_idx, read_raw_split, write_idx


@pytest.mark.parametrize("shape", [(5,), (3, 28, 28), (2, 3, 4, 5)])
def test_round_trip(tmp_path, shape):
    array = np.random.default_rng(0).integers(0, 256, shape).astype(np.uint8)
    write_idx(tmp_path / "a.idx", array)
    back = read_idx(tmp_path / "a.idx")
    assert back.shape == shape and back.dtype == np.uint8
    np.testing.assert_array_equal(back, array)


def test_header_matches_mnist_magic():
    assert idx_bytes(np.zeros((2, 28, 28), np.uint8))[:4] == b"\x00\x00\x08\x03"
    assert idx_bytes(np.zeros(7, np.uint8))[:8] == b"\x00\x00\x08\x01\x00\x00\x00\x07"


def test_bad_magic_names_file():
    data = b"\x1f\x8b\x08\x00" + bytes(20)
    with pytest.raises(IdxError, match=r"labels\.idx: bad magic number 0x1f8b0800"):
        parse_idx(data, "labels.idx")


def test_truncated_data():
    data = idx_bytes(np.zeros((4, 28, 28), np.uint8))
    with pytest.raises(IdxError, match=r"truncated: header says shape \(4, 28, 28\)"):
        parse_idx(data[:-1], "x")


def test_wrong_count_trailing_bytes():
    data = idx_bytes(np.zeros(10, np.uint8)) + b"\x00"
    with pytest.raises(
        IdxError, match=r"^x: trailing bytes: header says shape \(10,\) \(18 bytes\), file has 19 bytes$"
    ):
        parse_idx(data, "x")
    with pytest.raises(IdxError, match=r"^x: truncated: header says shape \(10,\) \(18 bytes\), file has 17 bytes$"):
        parse_idx(data[:-2], "x")


def test_truncated_header():
    with pytest.raises(IdxError, match="truncated header"):
        parse_idx(b"\x00\x00\x08\x03\x00\x00", "x")
    with pytest.raises(IdxError, match="too short"):
        parse_idx(b"\x00", "x")


def _split(tmp_path, images, labels):
    write_idx(tmp_path / "train-images.idx", images)
    write_idx(tmp_path / "train-labels.idx", labels)
    return tmp_path


@pytest.mark.parametrize(
    ("images", "labels", "message"),
    [
        (
            np.zeros((4, 28, 28), np.int8),
            np.zeros(4, np.uint8),
            r"train-images.idx: expected uint8 images .* got int8 \[4, 28, 28\]",
        ),
        (np.zeros((4, 28, 27), np.uint8), np.zeros(4, np.uint8), r"train-images.idx: .* got uint8 \[4, 28, 27\]"),
        (np.zeros((4, 784), np.uint8), np.zeros(4, np.uint8), r"train-images.idx: .* got uint8 \[4, 784\]"),
        (
            np.zeros((4, 28, 28), np.uint8),
            np.zeros((4, 1), np.uint8),
            r"train-labels.idx: expected uint8 labels .* got uint8 \[4, 1\]",
        ),
        (np.zeros((4, 28, 28), np.uint8), np.zeros(4, np.int8), r"train-labels.idx: .* got int8 \[4\]"),
        (np.zeros((4, 28, 28), np.uint8), np.zeros(5, np.uint8), r"train: 4 images in .* but 5 labels"),
        (np.zeros((4, 28, 28), np.uint8), np.array([0, 9, 10, 3], np.uint8), r"label 10 at index 2 is outside 0..9"),
    ],
)
def test_read_split_cross_checks(tmp_path, images, labels, message):
    with pytest.raises(DataError, match=message):
        read_raw_split(_split(tmp_path, images, labels), "train")


def test_read_split_returns_both_arrays(tmp_path):
    images, labels = np.arange(2 * 784, dtype=np.uint8).reshape(2, 28, 28), np.array([9, 0], np.uint8)
    back_images, back_labels = read_raw_split(_split(tmp_path, images, labels), "train")
    np.testing.assert_array_equal(back_images, images)
    np.testing.assert_array_equal(back_labels, labels)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x00\x00\x08", r"^<bytes>: 3 bytes, too short for an IDX header \(4 bytes\)$"),
        (b"\x00\x00\x08\x00", r"^<bytes>: header declares 0 dimensions$"),
        (b"\x00\x00\x08\x01\x00\x00", r"^<bytes>: truncated header: 1 dimensions need 8 bytes$"),
        (b"\x00\x01\x08\x01" + bytes(4), r"^<bytes>: bad magic number 0x00010801"),
    ],
)
def test_parse_idx_says_why(data, message):
    with pytest.raises(IdxError, match=message):
        parse_idx(data)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x1f\x8b\x08\x00", r"bad magic number 0x1f8b0800.*gzip file not unpacked"),  # a gzip file, not unpacked
        (bytes([0, 0, 8, 3, 0, 0, 0, 1]), r"truncated header: 3 dimensions need 16 bytes"),
        (
            idx_bytes(np.zeros(10, np.uint8))[:-1],
            r"truncated: header says shape \(10,\) \(18 bytes\), file has 17 bytes",
        ),
        (
            idx_bytes(np.zeros(10, np.uint8)) + b"\0",
            r"trailing bytes: header says shape \(10,\) \(18 bytes\), file has 19",
        ),
        (
            bytes([0, 0, 8, 4]) + bytes(4) + (2**32 - 1).to_bytes(4, "big") * 3,
            r"header says shape \(0, 4294967295, 4294967295, 4294967295\), which no array can have",
        ),
    ],
)
def test_read_idx_names_the_file_whatever_is_wrong(tmp_path, content, message):
    """Magic, header, size and shape: each fault of a file on disk is named by its path."""
    path = tmp_path / "x.idx"
    path.write_bytes(content)
    with pytest.raises(IdxError, match=rf"^{re.escape(str(path))}: {message}"):
        read_idx(path)


def test_a_file_cut_while_it_is_read_is_named_as_truncated(tmp_path, monkeypatch):
    """The size is checked from fstat before the body is read, and again on the bytes read:
    a file cut between the two is refused, not returned short. (fstat of this one file
    reports the size it had before the cut.)"""
    import os

    path = tmp_path / "x.idx"
    whole = idx_bytes(np.arange(10, dtype=np.uint8))
    path.write_bytes(whole[:-3])
    inode, real, faked = path.stat().st_ino, os.fstat, []

    def before_the_cut(fd):
        st = real(fd)
        if st.st_ino != inode:
            return st
        faked.append(fd)
        return os.stat_result(
            (
                st.st_mode,
                st.st_ino,
                st.st_dev,
                st.st_nlink,
                st.st_uid,
                st.st_gid,
                len(whole),
                st.st_atime,
                st.st_mtime,
                st.st_ctime,
            )
        )

    monkeypatch.setattr(os, "fstat", before_the_cut)
    with pytest.raises(
        IdxError,
        match=rf"^{re.escape(str(path))}: truncated: header says shape \(10,\) \(18 bytes\), "
        r"file has 15 bytes$",
    ):
        read_idx(path)
    assert faked  # (the fake was consulted)


@pytest.mark.parametrize("dtype", [np.int8, ">i2", ">i4", ">f4", ">f8"])
def test_wider_types_round_trip(dtype):
    array = (np.arange(24).reshape(2, 3, 4) - 5).astype(dtype)
    back = parse_idx(idx_bytes(array))
    assert back.dtype == np.dtype(dtype) and back.shape == (2, 3, 4)
    np.testing.assert_array_equal(back, array)


def test_dimension_sizes_use_all_four_bytes():
    """Sizes past 2**16 in a later dimension and past 2**24 in the first: every byte of
    each big-endian size counts."""
    for shape in [(1, 1, 70_000), (1 << 24 | 1,)]:
        back = parse_idx(idx_bytes(np.zeros(shape, np.uint8)))
        assert back.shape == shape


def test_empty_array_is_a_valid_file():
    assert parse_idx(b"\x00\x00\x08\x01" + bytes(4)).shape == (0,)


@pytest.mark.parametrize("dtype, code", [(np.int16, 0x0B), (np.int32, 0x0C), (np.float64, 0x0E)])
def test_wider_types_are_written_big_endian(dtype, code):
    """IDX stores every multi-byte type big-endian whatever the machine: 258 as int16 is 01 02."""
    array = np.array([[1, 258], [-3, 70000 if dtype != np.int16 else 4]], dtype=dtype)
    blob = idx_bytes(array)
    assert blob[:12] == bytes([0, 0, code, 2]) + (2).to_bytes(4, "big") + (2).to_bytes(4, "big")
    assert blob[12:] == array.astype(np.dtype(dtype).newbyteorder(">")).tobytes()
    if dtype == np.int16:
        assert blob[14:16] == b"\x01\x02"
    np.testing.assert_array_equal(parse_idx(blob), array)


def test_a_shape_no_array_can_have_is_named_with_its_source():
    """An empty body whose other dimensions multiply past what numpy can hold (their product
    with 0 is 0 bytes, so the size check passes) is one IdxError naming the file."""
    header = (0x0804).to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in (0, 2**32 - 1, 2**32 - 1, 2**32 - 1))
    with pytest.raises(
        IdxError,
        match=r"^odd\.idx: header says shape \(0, 4294967295, 4294967295, 4294967295\), "
        r"which no array can have$",
    ):
        parse_idx(header, "odd.idx")


def test_read_split_bounds_and_confines_the_labels_file_too(tmp_path):
    """With `rows`, a labels file that declares more labels is refused by its header, before
    its body is read; a labels file linking out of the raw folder is refused."""
    from pipeline.core.bounded import UnsafeFileError

    raw = _split(tmp_path / "raw", np.zeros((3, 28, 28), np.uint8), np.zeros(4, np.uint8))
    with pytest.raises(
        IdxError, match=r"train-labels\.idx: header says shape \(4,\) \(12 bytes\), more than the 11 bytes"
    ):
        read_raw_split(raw, "train", rows=3)
    write_idx(tmp_path / "elsewhere.idx", np.zeros(3, np.uint8))
    (raw / "train-labels.idx").unlink()
    (raw / "train-labels.idx").symlink_to(tmp_path / "elsewhere.idx")
    with pytest.raises(UnsafeFileError, match=r"train-labels\.idx"):
        read_raw_split(raw, "train", rows=3)
