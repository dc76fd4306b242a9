"""What every stage agrees a data set is: two splits of 28x28 uint8 images with class labels
0..9, and the tabular columns the CSV and the wide Parquet layout spell them in, with the
bounds of one CSV row (the fetch stage sizes a CSV download by them, the csv and convert
stages check each line against them), and the IDX header the published files begin with
(a split's digests are taken over it). The shard sample the stages write is declared in
`pipeline.stages.mnist`: core imports nothing of the shard library.
"""

SPLITS = ("train", "test")
IMAGE_SHAPE = (28, 28)
NUM_CLASSES = 10  # labels are class indices 0..NUM_CLASSES-1
PIXELS = IMAGE_SHAPE[0] * IMAGE_SHAPE[1]
# The write-up's wide layout, and the CSV header of the Kaggle edition: label, pixel1..pixel784.
COLUMNS = ["label"] + [f"pixel{i}" for i in range(1, PIXELS + 1)]
CSV_HEADER = ",".join(COLUMNS)
CSV_HEADER_MAX = len(CSV_HEADER) + 2  # with CRLF
# What one data row can be, before any parser sees it: 785 fields of 1 to 3 digits (0..255;
# the writer never pads), 784 commas, then LF or CRLF. A line outside these bounds cannot be
# a row, whatever else it holds.
CSV_ROW_MIN = len(COLUMNS) * 2 - 1  # without its line end
CSV_ROW_MAX = len(COLUMNS) * 4 - 1  # without its line end
CSV_LINE_MAX = CSV_ROW_MAX + 2  # with CRLF
SPLIT_BYTES_MAX = 1 << 40  # one split as CSV or Parquet, as a figures file may state it: far above any


def idx_header(code: int, shape: tuple[int, ...]) -> bytes:
    """The header of an IDX file holding an array of type `code` and `shape`: what the bytes
    of a split's images or labels are preceded by in the published files."""
    return bytes([0, 0, code, len(shape)]) + b"".join(int(d).to_bytes(4, "big") for d in shape)


def idx_sha256(shape: tuple[int, ...]):
    """A sha256 already fed the header of a uint8 IDX file of `shape`: fed the array's bytes,
    it is the digest of that file as published (what sources.yaml pins and manifests record)."""
    import hashlib

    return hashlib.sha256(idx_header(0x08, shape))


__all__ = [
    "COLUMNS",
    "CSV_HEADER",
    "CSV_HEADER_MAX",
    "CSV_LINE_MAX",
    "CSV_ROW_MAX",
    "CSV_ROW_MIN",
    "IMAGE_SHAPE",
    "NUM_CLASSES",
    "PIXELS",
    "SPLITS",
    "SPLIT_BYTES_MAX",
    "idx_header",
    "idx_sha256",
]
