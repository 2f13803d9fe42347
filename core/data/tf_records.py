"""TFRecord files of encoded images for the Keras executor, read by a tf.data pipeline.

Each record is a tf.train.Example with the encoded image under ``image/encoded`` (the ImageNet
TFRecord convention) or ``image``, and the integer label under ``image/class/label`` or
``label``; the label is used as stored. Images are decoded, resized to the workload's input size
and ImageNet-normalised, in parallel, and batched to whole weight updates. Each image's header is
read first (core.data.files.image_header): one that declares more pixels than an image may have is
refused naming its file, before TensorFlow allocates its pixels.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from core.data.files import image_header

# TensorFlow's prefix to an error raised inside a tf.data function: "{{function_node __wrapped__...}} ".
_FUNCTION_NODE = re.compile(r"^\{\{function_node [^}]*\}\}\s*")
_DATA_ERROR = "DataError: "

_MEAN = (0.485, 0.456, 0.406)
_STD = (0.229, 0.224, 0.225)


def record_files(path: Path) -> list[str]:
    """The record files at ``path``, each a regular file (checked while planning, and again here)."""
    from core.data import listing

    return [str(file) for file in listing.record_files(path)]


def pipeline_failure(error: BaseException, source: str) -> str:
    """What the tf.data pipeline's ``error`` says, in one line: a DataError raised in it (an image
    over the bound, naming its record file) as its own message; anything else (a damaged record)
    with its type, after where it was reading (``source``)."""
    lines = str(error).strip().splitlines()
    first = _FUNCTION_NODE.sub("", lines[0]) if lines else ""
    if first.startswith(_DATA_ERROR):
        return first.removeprefix(_DATA_ERROR)
    return f"reading {source}: {type(error).__name__}: {first}"


def checked_image(encoded: bytes, file: bytes) -> bytes:
    """``encoded``, once its header declares an image of a sane size; else a DataError naming the
    record file ``file`` (tf.data runs this on each record, before decoding it)."""
    image_header(encoded, f"{file.decode('utf-8', 'replace')}: a record's image")
    return encoded


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

    def parse(record: Any, file: Any) -> tuple[Any, Any]:
        example = tf.io.parse_single_example(record, features)
        encoded = tf.where(tf.equal(example["image/encoded"], empty), example["image"], example["image/encoded"])
        label = tf.maximum(example["image/class/label"], example["label"])
        encoded = tf.numpy_function(checked_image, [encoded, file], tf.string, stateful=False)
        encoded.set_shape([])
        image = tf.io.decode_image(encoded, channels=channels, expand_animations=False)
        image = tf.image.resize(tf.cast(image, tf.float32) / 255.0, (height, width))
        if channels == 3:
            image = (image - tf.constant(_MEAN)) / tf.constant(_STD)
        return image, label

    files = tf.data.Dataset.from_tensor_slices(record_files(path))
    records = files.interleave(
        lambda file: tf.data.TFRecordDataset(file).map(lambda record: (record, file)),  # each record, its file
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=False,
    )
    if num_shards > 1:
        records = records.shard(num_shards, shard_index)
    return (
        records.shuffle(4 * update_batch, seed=seed, reshuffle_each_iteration=True)
        .repeat()
        .map(parse, num_parallel_calls=tf.data.AUTOTUNE)
        .batch(update_batch, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )
