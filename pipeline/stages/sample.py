"""The sample every stage writes and reads: MNIST's and Fashion-MNIST's images and labels,
declared with the shard library's classes (the library itself holds any fixed-shape data),
and the label rule the idx and convert stages ask of what they read."""

from pipeline.core.dataset import IMAGE_SHAPE, NUM_CLASSES
from pipeline.shards.format import Field, Sample

# The tensor names and dtypes of every shard the pipeline writes (the same as what shard
# format version 2 fixed, so those shards' bytes did not change).
MNIST = Sample((Field("images", "uint8", IMAGE_SHAPE), Field("labels", "uint8", (), classes=NUM_CLASSES)))


def first_bad_label(labels) -> int | None:
    """The index of the first label outside 0..NUM_CLASSES-1 (numpy array or CPU tensor), or
    None: the label field's own rule, so the stages cannot drift from the shard writer's."""
    return MNIST["labels"].first_bad(labels)
