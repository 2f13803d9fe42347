"""TFRecord files of encoded images for the Keras executor, read by a tf.data pipeline.

Each record is a tf.train.Example with the encoded image under ``image/encoded`` (the ImageNet
TFRecord convention) or ``image``, and the integer label under ``image/class/label`` or
``label``; the label is used as stored. Images are decoded, resized to the workload's input size
and ImageNet-normalised, in parallel, and batched to whole weight updates. Each image's header is
read first (core.data.files.image_header): one that declares more pixels than an image may have is
refused naming its file, before TensorFlow allocates its pixels.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from core.base.errors import DataError
from core.data.files import image_header, opened_data_file

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


def _features() -> dict[str, Any]:
    """What core reads of a tf.train.Example: the image under ``image/encoded`` (ImageNet's
    convention) or ``image``, the label under ``image/class/label`` or ``label`` (-1 where neither is)."""
    import tensorflow as tf

    return {
        "image/encoded": tf.io.FixedLenFeature([], tf.string, default_value=""),
        "image": tf.io.FixedLenFeature([], tf.string, default_value=""),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64, default_value=-1),
        "label": tf.io.FixedLenFeature([], tf.int64, default_value=-1),
    }


def _encoded_and_label(example: dict[str, Any]) -> tuple[Any, Any]:
    """(encoded image, label) of parsed :func:`_features`, one example's or a batch's."""
    import tensorflow as tf

    empty = tf.constant("", dtype=tf.string)
    encoded = tf.where(tf.equal(example["image/encoded"], empty), example["image"], example["image/encoded"])
    return encoded, tf.maximum(example["image/class/label"], example["label"])


def _image_decoder(image_shape: tuple[int, int, int]) -> Callable[[Any], Any]:
    """``decode(encoded) -> image [H, W, C]``: decoded, resized to the workload's input and, for three
    channels, ImageNet-normalised. The image's header must have been checked (:func:`checked_image`)."""
    import tensorflow as tf

    height, width, channels = image_shape

    def decode(encoded: Any) -> Any:
        image = tf.io.decode_image(encoded, channels=channels, expand_animations=False)
        image = tf.image.resize(tf.cast(image, tf.float32) / 255.0, (height, width))
        if channels == 3:
            image = (image - tf.constant(_MEAN)) / tf.constant(_STD)
        return image

    return decode


def example_parser(image_shape: tuple[int, int, int]) -> Callable[[Any, Any], tuple[Any, Any]]:
    """``parse(record, file) -> (image [H, W, C], label)``: a serialized tf.train.Example as core
    reads one (:func:`_features`), its image's header checked, then decoded (:func:`_image_decoder`);
    ``file`` (a string tensor) names the record's file in a DataError."""
    import tensorflow as tf

    features, decode = _features(), _image_decoder(image_shape)

    def parse(record: Any, file: Any) -> tuple[Any, Any]:
        encoded, label = _encoded_and_label(tf.io.parse_single_example(record, features))
        encoded = tf.numpy_function(checked_image, [encoded, file], tf.string, stateful=False)
        encoded.set_shape([])
        return decode(encoded), label

    return parse


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

    parse = example_parser(image_shape)
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


class RecordSplit:
    """A run to a target's split of TFRecord files, read record by record at the offsets their framing
    gives (core.data.split_index: indexed once, cached), so the Keras executor reads it in
    :class:`core.data.epoch_order.EpochOrder`'s order as it reads an in-memory split. Record ``i`` is
    the ``i``-th of the files in name order. The records' bytes are read on the host; parsing and
    decoding them is :func:`example_parser`'s, in a tf.data map over the records asked for."""

    def __init__(self, split: Path, image_shape: tuple[int, int, int]) -> None:
        from core.data.split_index import split_records

        self.split = split
        self.files = split_records(split)
        self._starts = list(itertools.accumulate((len(records) for records in self.files), initial=0))
        self._parse, self._decode = _batch_parser(), _batch_decoder(image_shape)

    def __len__(self) -> int:
        return self._starts[-1]

    def take(self, indices: Sequence[int]) -> tuple[Any, Any]:
        """(images [N, H, W, C] float32, labels [N] int64) as numpy arrays, of records ``indices``."""
        import numpy as np
        import tensorflow as tf

        records, names, places = [], [], []
        for index in indices:
            which = bisect.bisect_right(self._starts, int(index)) - 1
            file, position = self.files[which], int(index) - self._starts[which]
            records.append(self._read(file.file, file.offsets[position], file.lengths[position]))
            names.append(str(file.file))
            places.append(f"{file.file}: record {position} (at byte {file.offsets[position]:,})")
        try:
            encoded, labels = (value.numpy() for value in self._parse(tf.constant(records)))
            for image, place in zip(encoded, places):
                image_header(image, f"{place}: its image")  # its size, before TensorFlow allocates its pixels
            images = self._decode(tf.constant(encoded)).numpy()
        except DataError:
            raise
        except Exception as error:  # a damaged record, an image over the bound: the data's fault
            raise DataError(pipeline_failure(error, str(self.split))) from error
        if len(labels) and labels.min() < 0:
            place = places[int(np.argmax(labels < 0))]
            raise DataError(f"{place}: no integer label (image/class/label or label): a run to a target needs one")
        return images, labels.astype(np.int64)

    @staticmethod
    def _read(file: Path, offset: int, length: int) -> bytes:
        with opened_data_file(file, "a TFRecord file") as (stream, _):
            stream.seek(offset)
            data = stream.read(length)
        if len(data) != length:
            raise DataError(
                f"{file}: the record at byte {offset:,} is cut off (the file changed since it was indexed?)"
            )
        return data


def _batch_parser() -> Callable[[Any], tuple[Any, Any]]:
    """``parse(records [N]) -> (encoded images [N], labels [N])`` of serialized tf.train.Examples
    (:func:`_features`), one tf.function for every batch size."""
    import tensorflow as tf

    features = _features()

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def parse(records: Any) -> tuple[Any, Any]:
        return _encoded_and_label(tf.io.parse_example(records, features))

    return parse


def _batch_decoder(image_shape: tuple[int, int, int]) -> Callable[[Any], Any]:
    """``decode(encoded [N]) -> images [N, H, W, C]``, one tf.function traced once for every batch size
    (a tf.data pipeline built per batch retraced its map each time: 160 ms for an update of 32 digits, 12 ms so)."""
    import tensorflow as tf

    decode = _image_decoder(image_shape)
    image = tf.TensorSpec(image_shape, tf.float32)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def decode_all(encoded: Any) -> Any:
        return tf.map_fn(decode, encoded, fn_output_signature=image, parallel_iterations=32)

    return decode_all
