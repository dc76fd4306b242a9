"""What every stage agrees a data set is: two splits of 28x28 uint8 images with class labels
0..9 (MNIST's sample schema, declared with the shard format's classes: the shard library
itself holds any fixed-shape data), and the tabular columns the CSV and the wide Parquet
layout spell them in.
"""

from pipeline.shards.format import Field, Sample

SPLITS = ("train", "test")
IMAGE_SHAPE = (28, 28)
NUM_CLASSES = 10               # labels are class indices 0..NUM_CLASSES-1
# MNIST and Fashion-MNIST: the tensor names and dtypes of every shard the pipeline writes
# (the same as what shard format version 2 fixed, so those shards' bytes did not change).
MNIST = Sample((Field("images", "uint8", IMAGE_SHAPE), Field("labels", "uint8", (), classes=NUM_CLASSES)))
PIXELS = IMAGE_SHAPE[0] * IMAGE_SHAPE[1]
# The write-up's wide layout, and the CSV header of the Kaggle edition: label, pixel1..pixel784.
COLUMNS = ["label"] + [f"pixel{i}" for i in range(1, PIXELS + 1)]


def first_bad_label(labels) -> int | None:
    """The index of the first label outside 0..NUM_CLASSES-1 (numpy array or CPU tensor), or
    None: MNIST's label field's rule, which the idx and convert stages ask too."""
    return MNIST["labels"].first_bad(labels)


__all__ = ["COLUMNS", "IMAGE_SHAPE", "MNIST", "NUM_CLASSES", "PIXELS", "SPLITS", "first_bad_label"]
