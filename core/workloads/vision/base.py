"""What every image classifier of the zoo shares: its options (dataset, image size, classes), the
input shape they give, synthetic images and labels, the optimizer, and the PyTorch and Keras specs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field

from core.base.config import Framework
from core.contract.workload import KerasTrainingSpec, TorchTrainingSpec
from core.workloads.datasets import IMAGE_DATASETS, ImageDatasetName
from core.workloads.zoo import ZooOptions, ZooWorkload, float32_logits, option_error, seeded

SGD_LEARNING_RATE = 0.01
SGD_MOMENTUM = 0.9
ADAMW_LEARNING_RATE = 1e-4


class VisionOptions(ZooOptions):
    dataset: ImageDatasetName = Field(
        default="imagenet",
        description="real dataset whose image shape, label count and epoch size the data takes",
    )
    image_size: int | None = Field(
        default=None,
        ge=8,
        le=8192,
        description="square input side in pixels; None: the dataset's (for ImageNet the model's own crop; "
        "small variant: the workload's small size)",
    )
    num_classes: int | None = Field(default=None, ge=2, le=1 << 20, description="None: the dataset's")


class HydraOptions(VisionOptions):
    dataset: ImageDatasetName = Field(default="hydra", description=VisionOptions.model_fields["dataset"].description)


class VisionWorkload(ZooWorkload):
    """Image classification with cross-entropy on synthetic images of a real dataset's shape."""

    task: ClassVar[str] = "classification"
    sample_unit: ClassVar[str] = "images"
    options_model: ClassVar[type[BaseModel]] = VisionOptions
    #: labelled images, resized to the input shape (tfrecord with TensorFlow, the others with PyTorch)
    data_formats: ClassVar[tuple[str, ...] | None] = ("image-folder", "webdataset", "tfrecord")
    #: the crop this model is trained at on ImageNet
    imagenet_image_size: ClassVar[int] = 224
    small_image_size: ClassVar[int] = 32
    min_image_size: ClassVar[int] = 32
    #: torchvision's builders take RGB input only
    rgb_only: ClassVar[bool] = False
    optimizer: ClassVar[Literal["sgd", "adamw"]] = "sgd"
    #: the keras.applications builder of the TensorFlow model (ResNet50, ...); None: no Keras model
    keras_application: ClassVar[str | None] = None

    def optimizer_state_per_parameter(self, options: BaseModel) -> int:
        return 2 if self.optimizer == "adamw" else 1  # AdamW's two moments; SGD's momentum buffer

    # --- shapes ----------------------------------------------------------------------------

    def input_shape(self, o: VisionOptions) -> tuple[int, int, int]:
        """(channels, height, width) of one image."""
        dataset = IMAGE_DATASETS[o.dataset]
        if o.image_size is not None:
            side = (o.image_size, o.image_size)
        elif o.variant == "small":
            side = (self.small_image_size, self.small_image_size)
        elif o.dataset == "imagenet" or dataset.resized_to_model:
            side = (self.imagenet_image_size, self.imagenet_image_size)
        else:
            side = (dataset.height, dataset.width)
        return (dataset.channels, *side)

    def num_classes(self, o: VisionOptions) -> int:
        return o.num_classes or IMAGE_DATASETS[o.dataset].num_classes

    def head_classes(self, options: Any) -> int | None:
        assert isinstance(options, VisionOptions)
        return self.num_classes(options)

    def samples_per_epoch(self, options: BaseModel) -> int:
        assert isinstance(options, VisionOptions)
        return IMAGE_DATASETS[options.dataset].samples_per_epoch

    def evaluation_samples(self, options: BaseModel) -> int | None:
        assert isinstance(options, VisionOptions)
        return IMAGE_DATASETS[options.dataset].evaluation_samples

    def check_options(self, o: VisionOptions) -> None:
        channels, height, width = self.input_shape(o)
        if min(height, width) < self.min_image_size:
            raise option_error(
                "image_size",
                o.image_size if o.image_size is not None else f"{height}x{width} ({o.dataset})",
                f"{self.name} takes images of at least {self.min_image_size} px; set -o image_size",
            )
        if self.rgb_only and channels != 3:
            raise option_error(
                "dataset", o.dataset, f"{self.name} takes RGB images; {o.dataset} has {channels} channel(s)"
            )

    def shape_details(self, o: VisionOptions) -> dict[str, Any]:
        return {"dataset": o.dataset, "input_shape": list(self.input_shape(o)), "num_classes": self.num_classes(o)}

    # --- models --------------------------------------------------------------------------------

    def keras_model(self, o: VisionOptions) -> Any:
        """A Keras model mapping images [N, H, W, C] to logits [N, classes]: keras.applications'
        ``keras_application`` with random weights and no softmax."""
        if self.keras_application is None:
            return super().keras_model(o)
        from tensorflow import keras

        channels, height, width = self.input_shape(o)
        build = getattr(keras.applications, self.keras_application)
        return build(
            weights=None,
            include_top=True,
            input_shape=(height, width, channels),
            classes=self.num_classes(o),
            classifier_activation=None,
            **self.keras_arguments(),
        )

    def keras_arguments(self) -> dict[str, Any]:
        """What ``keras_application`` takes besides the arguments every one of them takes."""
        return {}

    def build_torch(self, options: BaseModel, seed: int) -> TorchTrainingSpec:
        import torch
        from torch import nn

        assert isinstance(options, VisionOptions)
        model = seeded(seed, lambda: self.torch_model(options))
        model.train()
        generator = torch.Generator().manual_seed(seed + 1)
        pool = options.synthetic_pool_samples
        inputs = torch.randn(pool, *self.input_shape(options), generator=generator)
        targets = torch.randint(0, self.num_classes(options), (pool,), generator=generator)
        make_optimizer: Callable[[Any], torch.optim.Optimizer]
        if self.optimizer == "adamw":
            make_optimizer = lambda params: torch.optim.AdamW(params, lr=ADAMW_LEARNING_RATE)  # noqa: E731
        else:
            make_optimizer = lambda params: torch.optim.SGD(params, lr=SGD_LEARNING_RATE, momentum=SGD_MOMENTUM)  # noqa: E731
        return TorchTrainingSpec(
            model=model,
            loss_fn=nn.CrossEntropyLoss(),
            make_optimizer=make_optimizer,
            inputs=inputs,
            targets=targets,
            tensor_parallel_plan=self.tensor_parallel_plan(options),
        )

    def build_keras(self, options: BaseModel, seed: int) -> KerasTrainingSpec:
        import numpy as np

        assert isinstance(options, VisionOptions)
        o = options
        self.load(Framework.tensorflow)

        def make_model() -> Any:
            from tensorflow import keras

            keras.utils.set_random_seed(seed)
            return float32_logits(self.keras_model(o))

        def make_loss() -> Any:
            from tensorflow import keras

            return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

        def make_optimizer() -> Any:
            from tensorflow import keras

            if self.optimizer == "adamw":
                return keras.optimizers.AdamW(learning_rate=ADAMW_LEARNING_RATE)
            return keras.optimizers.SGD(learning_rate=SGD_LEARNING_RATE, momentum=SGD_MOMENTUM)

        channels, height, width = self.input_shape(o)
        rng = np.random.default_rng(seed + 1)
        return KerasTrainingSpec(
            make_model=make_model,
            make_loss=make_loss,
            make_optimizer=make_optimizer,
            inputs=rng.standard_normal((o.synthetic_pool_samples, height, width, channels), dtype=np.float32),
            targets=rng.integers(0, self.num_classes(o), size=(o.synthetic_pool_samples,), dtype=np.int64),
        )


def make_divisible(value: float, divisor: int = 8) -> int:
    """Channel rounding of MobileNet and EfficientNet (torchvision's _make_divisible, Keras' _depth)."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    if rounded < 0.9 * value:
        rounded += divisor
    return int(rounded)
