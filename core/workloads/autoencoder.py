"""The image-compression autoencoder of the ACES GPU-vs-IPU study, written here in both frameworks.

The paper describes it only in words: "a representative image compression model that resembles
an Autoencoder ... residual blocks and one bottleneck", trained on MNIST in TensorFlow 2.4 to
reconstruct its input. This is that shape, identical in PyTorch and Keras:

    encoder  conv 3x3 (C) | conv 3x3 stride 2 (C), N residual blocks | conv 3x3 stride 2 (C), N residual blocks
             | conv 1x1 to B channels: the bottleneck, at a quarter of the resolution
    decoder  conv 1x1 (C), N residual blocks | transposed conv 4x4 stride 2 (C), N residual blocks
             | transposed conv 4x4 stride 2 (C) | conv 3x3 to the image's channels, sigmoid

A residual block is ``relu(x + conv3x3(relu(conv3x3(x))))``; every convolution has a bias and is
followed by a ReLU unless said otherwise; no normalisation (compression models avoid batch norm).
The loss is the mean squared error of the reconstruction against its input (in PyTorch the model
returns both, so a real dataset's labels pass through unused). The layer widths are this project's
choice (the paper gives none): C (``channels``), N (``residual_blocks``) and B
(``bottleneck_channels``) are options.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, Field

from core.base.config import Framework
from core.contract.workload import KerasTrainingSpec, TorchTrainingSpec
from core.workloads.counting import Tally
from core.workloads.datasets import IMAGE_DATASETS, ImageDatasetName
from core.workloads.zoo import Source, ZooOptions, ZooWorkload, option_error, seeded

ADAM_LEARNING_RATE = 1e-3


def reconstruction_loss(outputs: Any, _labels: Any) -> Any:
    """Mean squared error of (reconstruction, image), the PyTorch model's outputs."""
    from torch.nn import functional

    reconstruction, images = outputs
    return functional.mse_loss(reconstruction, images)


class AcesOptions(ZooOptions):
    dataset: ImageDatasetName = Field(default="mnist", description="real dataset whose image shape the data takes")
    image_size: int | None = Field(
        default=None, ge=4, le=8192, description="square input side in pixels (a multiple of 4); None: the dataset's"
    )
    channels: int | None = Field(default=None, ge=1, le=4096, description="width C of the trunk; None: 128 (small: 16)")
    residual_blocks: int | None = Field(
        default=None, ge=0, le=64, description="residual blocks N at each of the four trunk stages; None: 2 (small: 1)"
    )
    bottleneck_channels: int = Field(default=8, ge=1, le=4096, description="channels B of the bottleneck")


class AcesAutoencoder(ZooWorkload):
    optimizer_state_floats: ClassVar[int | None] = 2  # Adam
    name: ClassVar[str] = "aces-autoencoder"
    description: ClassVar[str] = "ACES image-compression autoencoder (residual blocks, one bottleneck), MNIST"
    architecture: ClassVar[str] = "convolutional autoencoder: residual trunk at 1/2 and 1/4 resolution, 1x1 bottleneck"
    task: ClassVar[str] = "image-reconstruction"
    sample_unit: ClassVar[str] = "images"
    options_model: ClassVar[type[BaseModel]] = AcesOptions
    prefers_channels_last: ClassVar[bool] = True
    default_micro_batch_size: ClassVar[int] = 128
    sources: ClassVar[dict[Framework, Source]] = {
        Framework.tensorflow: Source("core.workloads.autoencoder (Keras layers)", "keras", "tensorflow"),
        Framework.torch: Source("core.workloads.autoencoder (torch.nn layers)", "torch", "torch"),
    }
    frameworks: ClassVar[tuple[Framework, ...]] = (Framework.torch, Framework.tensorflow)
    reference_framework: ClassVar[Framework] = Framework.tensorflow
    #: images; in PyTorch the model returns its input beside the reconstruction, so a labelled image
    #: dataset's labels pass through unused
    data_formats: ClassVar[tuple[str, ...] | None] = ("image-folder", "webdataset")

    def data_formats_for(self, framework: Framework) -> tuple[str, ...] | None:
        # The Keras loss compares the reconstruction with the targets, which a TFRecord gives as labels.
        return () if framework is Framework.tensorflow else self.data_formats

    def input_shape(self, o: AcesOptions) -> tuple[int, int, int]:
        dataset = IMAGE_DATASETS[o.dataset]
        if o.image_size is not None:
            return dataset.channels, o.image_size, o.image_size
        return dataset.channels, dataset.height, dataset.width

    def widths(self, o: AcesOptions) -> tuple[int, int]:
        small = o.variant == "small"
        channels = o.channels if o.channels is not None else (16 if small else 128)
        blocks = o.residual_blocks if o.residual_blocks is not None else (1 if small else 2)
        return channels, blocks

    def check_options(self, o: AcesOptions) -> None:
        _, height, width = self.input_shape(o)
        if height % 4 or width % 4:
            raise option_error(
                "image_size",
                o.image_size or f"{height}x{width} ({o.dataset})",
                "the encoder halves the image twice and the decoder doubles it back: "
                "height and width must be multiples of 4",
            )

    def samples_per_epoch(self, options: BaseModel) -> int:
        assert isinstance(options, AcesOptions)
        return IMAGE_DATASETS[options.dataset].samples_per_epoch

    def shape_details(self, o: AcesOptions) -> dict[str, Any]:
        channels, blocks = self.widths(o)
        return {
            "dataset": o.dataset,
            "input_shape": list(self.input_shape(o)),
            "channels": channels,
            "residual_blocks": blocks,
            "bottleneck_channels": o.bottleneck_channels,
        }

    def tally(self, o: Any, framework: Framework) -> Tally:
        image_channels, height, width = self.input_shape(o)
        channels, blocks = self.widths(o)
        half, quarter = (height // 2, width // 2), (height // 4, width // 4)
        t = Tally()

        def residual(size: tuple[int, int]) -> None:
            for _ in range(2 * blocks):
                t.conv(channels, channels, 3, *size, bias=True)

        t.conv(image_channels, channels, 3, height, width, bias=True, reads_input=True)
        t.conv(channels, channels, 3, *half, bias=True)
        residual(half)
        t.conv(channels, channels, 3, *quarter, bias=True)
        residual(quarter)
        t.conv(channels, o.bottleneck_channels, 1, *quarter, bias=True)
        t.conv(o.bottleneck_channels, channels, 1, *quarter, bias=True)
        residual(quarter)
        t.transposed_conv(channels, channels, 4, *quarter)
        residual(half)
        t.transposed_conv(channels, channels, 4, *half)
        t.conv(channels, image_channels, 3, height, width, bias=True)
        return t

    def images(self, o: AcesOptions, seed: int, channels_last: bool) -> Any:
        import numpy as np

        channels, height, width = self.input_shape(o)
        shape = (
            (o.synthetic_pool_samples, height, width, channels)
            if channels_last
            else (o.synthetic_pool_samples, channels, height, width)
        )
        # Pixel intensities in [0, 1), what a sigmoid output can reconstruct.
        return np.random.default_rng(seed + 1).random(shape, dtype=np.float32)

    def torch_model(self, o: AcesOptions) -> Any:
        import torch
        from torch import nn

        image_channels, _, _ = self.input_shape(o)
        channels, blocks = self.widths(o)

        class Residual(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.first = nn.Conv2d(channels, channels, 3, padding=1)
                self.second = nn.Conv2d(channels, channels, 3, padding=1)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return torch.relu(x + self.second(torch.relu(self.first(x))))

        def trunk() -> list[nn.Module]:
            return [Residual() for _ in range(blocks)]

        class Reconstruction(nn.Module):
            """Returns the reconstruction and the image it reconstructs, so that the loss needs no
            targets: labels from a real dataset pass through unused."""

            def __init__(self, network: nn.Module) -> None:
                super().__init__()
                self.network = network

            def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                return self.network(images), images

        return Reconstruction(
            nn.Sequential(
                nn.Conv2d(image_channels, channels, 3, padding=1),
                nn.ReLU(),
                nn.Conv2d(channels, channels, 3, stride=2, padding=1),
                nn.ReLU(),
                *trunk(),
                nn.Conv2d(channels, channels, 3, stride=2, padding=1),
                nn.ReLU(),
                *trunk(),
                nn.Conv2d(channels, o.bottleneck_channels, 1),
                nn.Conv2d(o.bottleneck_channels, channels, 1),
                nn.ReLU(),
                *trunk(),
                nn.ConvTranspose2d(channels, channels, 4, stride=2, padding=1),
                nn.ReLU(),
                *trunk(),
                nn.ConvTranspose2d(channels, channels, 4, stride=2, padding=1),
                nn.ReLU(),
                nn.Conv2d(channels, image_channels, 3, padding=1),
                nn.Sigmoid(),
            )
        )

    def build_torch(self, options: BaseModel, seed: int) -> TorchTrainingSpec:
        import torch

        assert isinstance(options, AcesOptions)
        model = seeded(seed, lambda: self.torch_model(options))
        images = torch.from_numpy(self.images(options, seed, channels_last=False))
        return TorchTrainingSpec(
            model=model,
            loss_fn=reconstruction_loss,
            make_optimizer=lambda params: torch.optim.Adam(params, lr=ADAM_LEARNING_RATE),
            # The targets are unused (the reconstruction is compared with its input): one label each.
            inputs=images,
            targets=torch.zeros(len(images), dtype=torch.int64),
        )

    def build_keras(self, options: BaseModel, seed: int) -> KerasTrainingSpec:
        assert isinstance(options, AcesOptions)
        o = options
        self.load(Framework.tensorflow)
        image_channels, height, width = self.input_shape(o)
        channels, blocks = self.widths(o)

        def make_model() -> Any:
            from tensorflow import keras

            keras.utils.set_random_seed(seed)
            layers = keras.layers

            def conv(x: Any, filters: int, kernel: int, stride: int = 1, activation: str | None = "relu") -> Any:
                return layers.Conv2D(filters, kernel, strides=stride, padding="same", activation=activation)(x)

            def trunk(x: Any) -> Any:
                for _ in range(blocks):
                    y = conv(conv(x, channels, 3), channels, 3, activation=None)
                    x = layers.ReLU()(layers.Add()([x, y]))
                return x

            def up(x: Any) -> Any:
                return layers.Conv2DTranspose(channels, 4, strides=2, padding="same", activation="relu")(x)

            inputs = keras.Input(shape=(height, width, image_channels))
            x = conv(inputs, channels, 3)
            x = trunk(conv(x, channels, 3, stride=2))
            x = trunk(conv(x, channels, 3, stride=2))
            x = conv(x, o.bottleneck_channels, 1, activation=None)
            x = trunk(conv(x, channels, 1))
            x = trunk(up(x))
            x = up(x)
            x = conv(x, image_channels, 3, activation=None)
            # The reconstruction in float32, so mixed-precision policies keep a stable loss.
            outputs = layers.Activation("sigmoid", dtype="float32")(x)
            return keras.Model(inputs, outputs, name="aces_autoencoder")

        def make_loss() -> Any:
            import tensorflow as tf

            def per_image_mse(targets: Any, outputs: Any) -> Any:
                return tf.reduce_mean(tf.square(tf.cast(targets, outputs.dtype) - outputs), axis=[1, 2, 3])

            return per_image_mse

        def make_optimizer() -> Any:
            from tensorflow import keras

            return keras.optimizers.Adam(learning_rate=ADAM_LEARNING_RATE)

        images = self.images(o, seed, channels_last=True)
        return KerasTrainingSpec(
            make_model=make_model,
            make_loss=make_loss,
            make_optimizer=make_optimizer,
            inputs=images,
            targets=images.copy(),
        )
