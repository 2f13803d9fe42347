"""TFRecord files of encoded images for the Keras executor, read by a tf.data pipeline.

Each record is a tf.train.Example with the encoded image under ``image/encoded`` (the ImageNet
TFRecord convention) or ``image``, and the integer label under ``image/class/label`` or
``label``; the label is used as stored. Images are decoded, resized to the workload's input size
and ImageNet-normalised, in parallel, and batched to whole weight updates.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

_MEAN = (0.485, 0.456, 0.406)
_STD = (0.229, 0.224, 0.225)


def record_files(path: Path) -> list[str]:
    """The record files at ``path``, each a regular file (checked while planning, and again here)."""
    from core.data import listing

    return [str(file) for file in listing.record_files(path)]


def image_dataset(
    path: Path,
    image_shape: tuple[int, int, int],
    update_batch: int,
    seed: int,
    *,
    num_shards: int = 1,
    shard_index: int = 0,
) -> Any:
    """An endless dataset of (images [update_batch, H, W, C], labels [update_batch]) batches.

    ``num_shards``, ``shard_index``: this process reads every ``num_shards``-th record from the
    ``shard_index``-th on (one shard per process of a run that several processes feed), and decodes
    only those."""
    import tensorflow as tf

    height, width, channels = image_shape
    empty = tf.constant("", dtype=tf.string)
    features = {
        "image/encoded": tf.io.FixedLenFeature([], tf.string, default_value=""),
        "image": tf.io.FixedLenFeature([], tf.string, default_value=""),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64, default_value=-1),
        "label": tf.io.FixedLenFeature([], tf.int64, default_value=-1),
    }

    def parse(record: Any) -> tuple[Any, Any]:
        example = tf.io.parse_single_example(record, features)
        encoded = tf.where(tf.equal(example["image/encoded"], empty), example["image"], example["image/encoded"])
        label = tf.maximum(example["image/class/label"], example["label"])
        image = tf.io.decode_image(encoded, channels=channels, expand_animations=False)
        image = tf.image.resize(tf.cast(image, tf.float32) / 255.0, (height, width))
        if channels == 3:
            image = (image - tf.constant(_MEAN)) / tf.constant(_STD)
        return image, label

    files = tf.data.Dataset.from_tensor_slices(record_files(path))
    records = files.interleave(tf.data.TFRecordDataset, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
    if num_shards > 1:
        records = records.shard(num_shards, shard_index)
    return (
        records.shuffle(4 * update_batch, seed=seed, reshuffle_each_iteration=True)
        .repeat()
        .map(parse, num_parallel_calls=tf.data.AUTOTUNE)
        .batch(update_batch, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )
