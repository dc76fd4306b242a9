import numpy as np
import polars as pl
import pytest

from pipeline.core.dataset import COLUMNS
from pipeline.stages.csvdata import HEADER, DataError, copy_csv, render_csvs, write_csv
from pipeline.stages.mnist import write_idx


def test_exact_bytes_for_known_input(tmp_path):
    images = np.zeros((2, 28, 28), np.uint8)
    images[0, 0, 0], images[0, 0, 1], images[1, 27, 27] = 255, 7, 10
    labels = np.array([3, 0], np.uint8)
    write_csv(images, labels, tmp_path / "t.csv")
    header = "label," + ",".join(f"pixel{i}" for i in range(1, 785))
    row0 = "3,255,7," + ",".join(["0"] * 782)
    row1 = "0," + ",".join(["0"] * 783) + ",10"
    assert (tmp_path / "t.csv").read_bytes() == f"{header}\n{row0}\n{row1}\n".encode()


def test_polars_reads_back_equal(tmp_path, tiny):
    images, labels = tiny.arrays["train_images"], tiny.arrays["train_labels"]
    write_csv(images, labels, tmp_path / "t.csv")
    frame = pl.read_csv(tmp_path / "t.csv")
    assert frame.columns == COLUMNS
    np.testing.assert_array_equal(frame["label"].to_numpy(), labels)
    np.testing.assert_array_equal(frame.drop("label").to_numpy().reshape(-1, 28, 28), images)


def _raw(tmp_path, tiny):
    raw = tmp_path / "raw"
    for role, array in tiny.arrays.items():
        kind, what = role.split("_")
        write_idx(raw / f"{kind}-{what}.idx", array)
    return raw


def test_render_is_deterministic(tmp_path, tiny):
    raw = _raw(tmp_path, tiny)
    render_csvs(raw, tmp_path / "a")
    render_csvs(raw, tmp_path / "b")
    for split in ("train", "test"):
        assert (tmp_path / "a" / f"{split}.csv").read_bytes() == (tmp_path / "b" / f"{split}.csv").read_bytes()


def test_count_mismatch_names_both_files(tmp_path, tiny, capsys):
    raw = _raw(tmp_path, tiny)
    write_idx(raw / "test-labels.idx", tiny.arrays["test_labels"][:-1])
    with pytest.raises(DataError, match=r"32 images in .*test-images.idx but 31 labels"):
        render_csvs(raw, tmp_path / "csv")
    assert not (tmp_path / "csv" / "test.csv").exists()
    assert "train.csv" not in capsys.readouterr().err  # nothing said of a split the failure threw away
    render_csvs(_raw(tmp_path / "ok", tiny), tmp_path / "csv")
    said = capsys.readouterr().err.splitlines()
    assert [line.split(":")[0] for line in said] == [str(tmp_path / "csv" / f"{s}.csv") for s in ("train", "test")]


def test_label_out_of_range(tmp_path, tiny):
    raw = _raw(tmp_path, tiny)
    labels = tiny.arrays["train_labels"].copy()
    labels[5] = 11
    write_idx(raw / "train-labels.idx", labels)
    with pytest.raises(DataError, match="label 11 at index 5 is outside 0..9"):
        render_csvs(raw, tmp_path / "csv")


@pytest.mark.parametrize("label", [10, 255])
def test_label_just_outside_the_range(tmp_path, tiny, label):
    raw = _raw(tmp_path, tiny)
    labels = tiny.arrays["test_labels"].copy()
    labels[-1] = label
    write_idx(raw / "test-labels.idx", labels)
    with pytest.raises(DataError, match=f"test-labels.idx: label {label} at index 31 is outside 0..9"):
        render_csvs(raw, tmp_path / "csv")
    assert not (tmp_path / "csv").exists()


def test_csv_edition_copied_with_header_added(tmp_path):
    (tmp_path / "src.csv").write_bytes(b"5," + b",".join([b"0"] * 784) + b"\n")
    copy_csv(tmp_path / "src.csv", tmp_path / "out.csv")
    lines = (tmp_path / "out.csv").read_text().splitlines()
    assert lines[0].startswith("label,pixel1,") and lines[1].startswith("5,0,")
    copy_csv(tmp_path / "out.csv", tmp_path / "again.csv")  # a header is not doubled
    assert (tmp_path / "again.csv").read_bytes() == (tmp_path / "out.csv").read_bytes()
    header = HEADER.rstrip("\n")
    (tmp_path / "crlf.csv").write_bytes(f"{header}\r\n5,".encode() + b",".join([b"0"] * 784) + b"\r\n")
    copy_csv(tmp_path / "crlf.csv", tmp_path / "crlf-out.csv")  # a Windows header is still the header
    assert (tmp_path / "crlf-out.csv").read_bytes() == (tmp_path / "crlf.csv").read_bytes()
    (tmp_path / "spaced.csv").write_text(f"{header} \n5," + ",".join(["0"] * 784) + "\n")
    with pytest.raises(DataError, match="line 1 is neither the header"):
        copy_csv(tmp_path / "spaced.csv", tmp_path / "bad.csv")
    for almost in (f"{header}X\n", f"{header}\r\r\n"):  # one line ending stripped, nothing more
        (tmp_path / "almost.csv").write_text(almost + "5," + ",".join(["0"] * 784) + "\n")
        with pytest.raises(DataError, match="line 1 is neither the header"):
            copy_csv(tmp_path / "almost.csv", tmp_path / "bad.csv")
    (tmp_path / "junk.csv").write_text("hello,world\n")
    with pytest.raises(DataError, match="line 1 is neither the header"):
        copy_csv(tmp_path / "junk.csv", tmp_path / "bad.csv")


def test_a_csv_edition_is_bounded_by_its_rows_and_kept_inside_its_folder(tmp_path):
    """With `rows`, a copy takes at most a header and that many rows' worth of bytes (the
    convert stage checks each line): exactly that many pass, one byte more is refused and
    nothing is written; a link leading out of the raw folder is refused."""
    from pipeline.core.bounded import UnsafeFileError
    from pipeline.core.dataset import CSV_HEADER_MAX, CSV_LINE_MAX

    cap = CSV_HEADER_MAX + 2 * CSV_LINE_MAX
    (tmp_path / "full.csv").write_bytes(HEADER.encode() + b"1" * (cap - len(HEADER)))
    copy_csv(tmp_path / "full.csv", tmp_path / "ok.csv", rows=2)
    assert (tmp_path / "ok.csv").stat().st_size == cap
    (tmp_path / "over.csv").write_bytes(HEADER.encode() + b"1" * (cap + 1 - len(HEADER)))
    with pytest.raises(DataError, match=f"more than {cap:,} bytes, more than a header and the split's 2 rows"):
        copy_csv(tmp_path / "over.csv", tmp_path / "no.csv", rows=2)
    assert not (tmp_path / "no.csv").exists()
    copy_csv(tmp_path / "over.csv", tmp_path / "unbounded.csv")  # no rows given: no bound
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "train.csv").symlink_to(tmp_path / "full.csv")
    with pytest.raises(UnsafeFileError):
        copy_csv(raw / "train.csv", tmp_path / "out.csv", within=raw)


def test_render_takes_the_csv_editions_a_mirror_served(tmp_path):
    """A raw folder holding `{train,test}.csv` (a CSV mirror) is copied, not read as IDX."""
    raw = tmp_path / "raw"
    raw.mkdir()
    for split in ("train", "test"):
        (raw / f"{split}.csv").write_bytes(b"5," + b",".join([b"0"] * 784) + b"\n")
    render_csvs(raw, tmp_path / "csv", {"train": 1, "test": 1})
    assert (tmp_path / "csv" / "train.csv").read_bytes() == HEADER.encode() + (raw / "train.csv").read_bytes()


def test_render_bounds_a_csv_edition_by_the_split_rows_and_keeps_it_in_the_raw_folder(tmp_path):
    """`render_csvs` hands each split's row count and the raw folder to the copy: a CSV
    larger than its rows can take is refused, and so is one linking out of the folder; in
    both cases no output folder is left."""
    from pipeline.core.bounded import UnsafeFileError

    raw = tmp_path / "raw"
    raw.mkdir()
    row = b"5," + b",".join([b"0"] * 784) + b"\n"
    (raw / "train.csv").write_bytes(row * 20)  # more than a header and one row of 784 three-digit pixels
    (raw / "test.csv").write_bytes(row)
    with pytest.raises(
        DataError, match=r"train\.csv: more than [\d,]+ bytes, more than a header and the split's 1 rows"
    ):
        render_csvs(raw, tmp_path / "csv", {"train": 1, "test": 1})
    (tmp_path / "elsewhere.csv").write_bytes(row)
    (raw / "train.csv").unlink()
    (raw / "train.csv").symlink_to(tmp_path / "elsewhere.csv")
    with pytest.raises(UnsafeFileError, match=r"train\.csv"):
        render_csvs(raw, tmp_path / "csv", {"train": 1, "test": 1})
    assert not (tmp_path / "csv").exists()
