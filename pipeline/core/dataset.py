"""What every stage agrees a data set is: two splits of 28x28 uint8 images with class labels
(the shard format's sample schema), and the tabular columns the CSV and the wide Parquet
layout spell them in.
"""

from pipeline.shards.format import IMAGE_SHAPE, NUM_CLASSES

SPLITS = ("train", "test")
PIXELS = IMAGE_SHAPE[0] * IMAGE_SHAPE[1]
# The seed's wide layout, and the CSV header of the Kaggle edition: label, pixel1..pixel784.
COLUMNS = ["label"] + [f"pixel{i}" for i in range(1, PIXELS + 1)]

__all__ = ["COLUMNS", "IMAGE_SHAPE", "NUM_CLASSES", "PIXELS", "SPLITS"]
