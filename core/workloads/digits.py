"""scikit-learn's handwritten digits: a small real data set that installs from the package index.

1,797 greyscale images of 8x8 pixels (values 0 to 16), ten classes, shipped inside scikit-learn
(nothing is downloaded). It is what a run to a target quality (docs/to-target.md) trains on in tests
and in the README: a small MLP or CNN reaches 95% top-1 on the held-out split in seconds on a CPU.

The held-out split is stratified and drawn with a fixed seed (:data:`SPLIT_SEED`), not the run's:
runs with different seeds are judged on the same images. The run's seed sets the weights (and the
order a run to a target reads the training split in).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from core.base.config import Framework
from core.contract.workload import KerasTrainingSpec, TorchTrainingSpec, Workload, module_installed
from core.data import HELD_OUT_SPLIT, TRAIN_SPLIT

#: the held-out split's seed: the same split whatever the run's seed
SPLIT_SEED = 0
DIGITS_SAMPLES = 1797
CLASSES = 10
PIXELS = 64  # 8 x 8
#: one image as the models take it (channels, height, width): a greyscale image folder decodes to it
IMAGE_SHAPE = (1, 8, 8)
MAX_PIXEL = 16.0
MOMENTUM = 0.9


class DigitsOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    model: Literal["mlp", "cnn"] = Field(
        default="mlp", description="'mlp' (one hidden layer) or 'cnn' (two 3x3 convolutions, then a linear layer)"
    )
    hidden_width: int = Field(default=64, ge=1, le=1 << 14, description="the MLP's hidden units; the CNN's channels")
    learning_rate: float = Field(default=0.05, gt=0.0, le=10.0, description="SGD's learning rate (momentum 0.9)")
    held_out_fraction: float = Field(
        default=0.2, gt=0.0, lt=1.0, description="the share of the images held out for evaluation (stratified)"
    )


def held_out_samples(options: DigitsOptions) -> int:
    """Images in the held-out split (scikit-learn's train_test_split rounds the test share up)."""
    import math

    return math.ceil(DIGITS_SAMPLES * options.held_out_fraction)


def split_digits(options: DigitsOptions) -> tuple[Any, Any, Any, Any]:
    """(train inputs, train labels, held-out inputs, held-out labels) as numpy arrays, pixels in [0, 1]."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = (digits.data / MAX_PIXEL).astype("float32")
    train_x, test_x, train_y, test_y = train_test_split(
        images,
        digits.target,
        test_size=held_out_samples(options),
        stratify=digits.target,
        random_state=SPLIT_SEED,
    )
    return train_x, train_y, test_x, test_y


def write_image_folder(
    root: str | Path, options: DigitsOptions | None = None, per_split: int | None = None, per_class: int | None = None
) -> Path:
    """Write the digits as an image folder split as a run to a target reads it
    (docs/to-target.md): ``root/train/<digit>/<index>.png`` and ``root/val/<digit>/<index>.png``, the
    same stratified split as the in-memory workload (``options.held_out_fraction``, :data:`SPLIT_SEED`).

    Each image is an 8x8 greyscale PNG whose pixel is ``round(value / 16 x 255)``: it decodes to
    the in-memory pixel within half a grey level (1/510). ``<index>`` is the image's place in its
    split, so a folder lists each class's images in the in-memory order.

    :param per_split: keep only each split's first images (a small folder for tests); None keeps all
    :param per_class: keep only each class's first images in each split (a tiny folder whose splits
        still hold every class: ``core sweep --toy``'s runs to a target); None keeps all
    :returns: ``root``
    """
    root = Path(root)
    for split, index, png, label in _split_pngs(options, per_split, per_class):
        folder = root / split / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{index:04d}.png").write_bytes(png)
    return root


def write_shards(
    root: str | Path,
    options: DigitsOptions | None = None,
    per_split: int | None = None,
    shards: int = 4,
    per_class: int | None = None,
) -> Path:
    """Write the digits as WebDataset shards split as a run to a target reads them:
    ``root/train/digits-<n>.tar`` and ``root/val/digits-<n>.tar``, ``shards`` of each split (the last
    may hold fewer samples). Each sample is ``<index>.png`` (the PNG :func:`write_image_folder`
    writes) and ``<index>.cls`` (the digit as text), the members core's shard reader groups by key;
    the split's samples run through the shards in the in-memory order.

    :param per_split: keep only each split's first images; None keeps all
    :param per_class: keep only each class's first images in each split; None keeps all
    :returns: ``root``
    """
    import io
    import tarfile

    root = Path(root)
    by_split = _by_split(options, per_split, per_class)
    for split, samples in by_split.items():
        folder = root / split
        folder.mkdir(parents=True, exist_ok=True)
        per_shard = -(-len(samples) // shards)
        for number in range(shards):
            with tarfile.open(folder / f"digits-{number:04d}.tar", "w", format=tarfile.USTAR_FORMAT) as archive:
                for index, png, label in samples[number * per_shard : (number + 1) * per_shard]:
                    for extension, payload in (("png", png), ("cls", str(label).encode("ascii"))):
                        member = tarfile.TarInfo(f"{index:06d}.{extension}")
                        member.size = len(payload)
                        archive.addfile(member, io.BytesIO(payload))
    return root


def write_records(
    root: str | Path,
    options: DigitsOptions | None = None,
    per_split: int | None = None,
    files: int = 4,
    per_class: int | None = None,
) -> Path:
    """Write the digits as TFRecord files split as a run to a target reads them:
    ``root/train/digits-<n>.tfrecord`` and ``root/val/digits-<n>.tfrecord``, ``files`` of each split.
    Each record is a ``tf.train.Example`` with the PNG (as :func:`write_image_folder` writes it) under
    ``image/encoded`` and the digit under ``image/class/label`` (ImageNet's TFRecord convention, which
    core's record reader reads); the split's samples run through the files in the in-memory order.
    Needs TensorFlow (to frame the records and their CRCs as TensorFlow checks them).

    :param per_split: keep only each split's first images; None keeps all
    :param per_class: keep only each class's first images in each split; None keeps all
    :returns: ``root``
    """
    import tensorflow as tf

    root = Path(root)
    for split, samples in _by_split(options, per_split, per_class).items():
        folder = root / split
        folder.mkdir(parents=True, exist_ok=True)
        per_file = -(-len(samples) // files)
        for number in range(files):
            with tf.io.TFRecordWriter(str(folder / f"digits-{number:04d}.tfrecord")) as writer:
                for _, png, label in samples[number * per_file : (number + 1) * per_file]:
                    feature = {
                        "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[png])),
                        "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                    }
                    writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    return root


def _split_pngs(
    options: DigitsOptions | None, per_split: int | None, per_class: int | None = None
) -> Iterator[tuple[str, int, bytes, int]]:
    """(split, index in the split, PNG, label) of every image, in the in-memory split's order: an 8x8
    greyscale PNG whose pixel is ``round(value / 16 x 255)``; with ``per_class``, each class's first
    that many of each split only."""
    import io

    import numpy as np
    from PIL import Image

    train_x, train_y, test_x, test_y = split_digits(options or DigitsOptions())
    for split, images, labels in ((TRAIN_SPLIT, train_x, train_y), (HELD_OUT_SPLIT, test_x, test_y)):
        kept: dict[int, int] = {}
        for index, (image, label) in enumerate(zip(images[:per_split], labels[:per_split])):
            kept[int(label)] = kept.get(int(label), 0) + 1
            if per_class is not None and kept[int(label)] > per_class:
                continue
            grey = np.rint(image.reshape(8, 8) * 255.0).astype(np.uint8)
            buffer = io.BytesIO()
            Image.fromarray(grey).save(buffer, format="PNG")
            yield split, index, buffer.getvalue(), int(label)


def _by_split(
    options: DigitsOptions | None, per_split: int | None, per_class: int | None = None
) -> dict[str, list[tuple[int, bytes, int]]]:
    samples: dict[str, list[tuple[int, bytes, int]]] = {TRAIN_SPLIT: [], HELD_OUT_SPLIT: []}
    for split, index, png, label in _split_pngs(options, per_split, per_class):
        samples[split].append((index, png, label))
    return samples


def mlp_weights(options: DigitsOptions) -> int:
    return PIXELS * options.hidden_width + options.hidden_width * CLASSES


class Digits(Workload):
    name: ClassVar[str] = "digits"
    description: ClassVar[str] = "scikit-learn's 8x8 handwritten digits (real data, held-out split): MLP or CNN"
    task: ClassVar[str] = "classification"
    sample_unit: ClassVar[str] = "images"
    default_micro_batch_size: ClassVar[int] = 32
    frameworks: ClassVar[tuple[Framework, ...]] = (Framework.torch, Framework.tensorflow)
    options_model: ClassVar[type[BaseModel]] = DigitsOptions
    #: in memory from scikit-learn, or (a run to a target) from a data set split into train/ and val/:
    #: an image folder or shards (PyTorch), TFRecord files (Keras), as :func:`write_image_folder`,
    #: :func:`write_shards` and :func:`write_records` write them
    data_formats: ClassVar[tuple[str, ...] | None] = ("image-folder", "webdataset", "tfrecord")
    evaluation_metrics: ClassVar[Mapping[str, bool]] = MappingProxyType({"top1": True, "loss": False})

    def missing_library(self, framework: Framework) -> str | None:
        return None if module_installed("sklearn") else "scikit-learn (pip install 'core[digits]')"

    def parameter_count(self, options: BaseModel) -> int | None:
        assert isinstance(options, DigitsOptions)
        return mlp_weights(options) if options.model == "mlp" else None

    def optimizer_state_per_parameter(self, options: BaseModel) -> int:
        return 1  # SGD with momentum

    def flops_per_sample(self, options: BaseModel) -> float | None:
        assert isinstance(options, DigitsOptions)
        # 2 forward and 4 backward FLOPs per weight per sample, as the FCNN counts them.
        return 6.0 * mlp_weights(options) if options.model == "mlp" else None

    def head_classes(self, options: Any) -> int | None:
        return CLASSES

    def samples_per_epoch(self, options: BaseModel) -> int:
        assert isinstance(options, DigitsOptions)
        return DIGITS_SAMPLES - held_out_samples(options)

    def evaluation_samples(self, options: BaseModel) -> int:
        assert isinstance(options, DigitsOptions)
        return held_out_samples(options)

    def details(self, options: BaseModel) -> dict[str, Any]:
        assert isinstance(options, DigitsOptions)
        return {
            "data": "scikit-learn digits",
            "training_samples": self.samples_per_epoch(options),
            "held_out_samples": held_out_samples(options),
            "split_seed": SPLIT_SEED,
        }

    def build_torch(self, options: BaseModel, seed: int) -> TorchTrainingSpec:
        import torch

        assert isinstance(options, DigitsOptions)
        train_x, train_y, test_x, test_y = split_digits(options)
        torch.manual_seed(seed)
        width = options.hidden_width
        model: torch.nn.Module
        if options.model == "mlp":
            model = torch.nn.Sequential(
                torch.nn.Flatten(), torch.nn.Linear(PIXELS, width), torch.nn.ReLU(), torch.nn.Linear(width, CLASSES)
            )
        else:
            model = torch.nn.Sequential(
                torch.nn.Conv2d(1, width // 2 or 1, 3, padding=1),
                torch.nn.ReLU(),
                torch.nn.Conv2d(width // 2 or 1, width, 3, padding=1),
                torch.nn.ReLU(),
                torch.nn.MaxPool2d(2),
                torch.nn.Flatten(),
                torch.nn.Linear(width * 16, CLASSES),
            )

        def tensors(images: Any, labels: Any) -> tuple[torch.Tensor, torch.Tensor]:
            # Images [1, 8, 8] for both models: what an image folder's greyscale PNGs decode to.
            inputs = torch.from_numpy(images).reshape(len(images), *IMAGE_SHAPE)
            return inputs, torch.from_numpy(labels).to(torch.int64)

        inputs, targets = tensors(train_x, train_y)
        held_out_inputs, held_out_targets = tensors(test_x, test_y)
        rate = options.learning_rate
        return TorchTrainingSpec(
            model=model,
            loss_fn=torch.nn.functional.cross_entropy,
            make_optimizer=lambda parameters: torch.optim.SGD(parameters, lr=rate, momentum=MOMENTUM),
            inputs=inputs,
            targets=targets,
            evaluation_inputs=held_out_inputs,
            evaluation_targets=held_out_targets,
        )

    def build_keras(self, options: BaseModel, seed: int) -> KerasTrainingSpec:
        """The same model, split and optimizer as :meth:`build_torch`, in Keras: layers initialised
        from PyTorch's default distributions (weights and biases uniform in +-1/sqrt(fan_in)), images
        channels-last [8, 8, 1] for both models (what a TFRecord's greyscale PNG decodes to; the MLP
        flattens them first, as PyTorch's does), SGD with the same momentum (Keras' form of it takes
        the same steps)."""
        assert isinstance(options, DigitsOptions)
        train_x, train_y, test_x, test_y = split_digits(options)
        width = options.hidden_width
        shape = (8, 8, 1)

        def make_model() -> Any:
            from tensorflow import keras

            keras.utils.set_random_seed(seed)

            def torch_default(fan_in: int) -> dict[str, Any]:
                # PyTorch's Linear and Conv2d defaults: kaiming_uniform(a=sqrt(5)) is U(+-1/sqrt(fan_in)).
                bound = fan_in**-0.5
                return {
                    "kernel_initializer": keras.initializers.VarianceScaling(1 / 3, "fan_in", "uniform"),
                    "bias_initializer": keras.initializers.RandomUniform(-bound, bound),
                }

            layers = keras.layers
            model = keras.Sequential(name=f"digits_{options.model}")
            model.add(keras.Input(shape=shape))
            if options.model == "mlp":
                model.add(layers.Flatten())
                model.add(layers.Dense(width, activation="relu", **torch_default(PIXELS)))
                model.add(layers.Dense(CLASSES, **torch_default(width)))
            else:
                narrow = width // 2 or 1
                model.add(layers.Conv2D(narrow, 3, padding="same", activation="relu", **torch_default(9)))
                model.add(layers.Conv2D(width, 3, padding="same", activation="relu", **torch_default(9 * narrow)))
                model.add(layers.MaxPooling2D(2))
                model.add(layers.Flatten())
                model.add(layers.Dense(CLASSES, **torch_default(width * 16)))
            # Logits in float32 so mixed-precision policies keep a stable softmax.
            model.add(layers.Activation("linear", dtype="float32"))
            return model

        def make_loss() -> Any:
            from tensorflow import keras

            return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

        rate = options.learning_rate

        def make_optimizer() -> Any:
            from tensorflow import keras

            return keras.optimizers.SGD(learning_rate=rate, momentum=MOMENTUM)

        return KerasTrainingSpec(
            make_model=make_model,
            make_loss=make_loss,
            make_optimizer=make_optimizer,
            inputs=train_x.reshape(len(train_x), *shape),
            targets=train_y.astype("int64"),
            evaluation_inputs=test_x.reshape(len(test_x), *shape),
            evaluation_targets=test_y.astype("int64"),
        )
