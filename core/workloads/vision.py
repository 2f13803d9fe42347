"""Image classification: ResNet, ViT, Swin, EfficientNet, MobileNetV3 and Inception-v3.

Every architecture comes from a well-kept library, built from its configuration with random
weights (never downloaded): transformers for PyTorch (torchvision for MobileNetV3 and
Inception-v3, which transformers does not have), keras.applications for TensorFlow.
``tally()`` walks each architecture the way its library builds it, for parameter counts and
FLOPs without building anything; tests check both against the built models.

The "small" variant keeps the architecture and cuts it down for CI: transformers get fewer,
narrower layers; convolutional networks keep every layer (the libraries offer no shallower
form in both frameworks) and take small images.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field

from core.base.config import Framework
from core.contract.pipeline import RecommendedSplit
from core.contract.workload import KerasTrainingSpec, TorchTrainingSpec
from core.workloads.counting import Tally, conv_output
from core.workloads.datasets import IMAGE_DATASETS, ImageDatasetName
from core.workloads.zoo import (
    Source,
    ZooOptions,
    ZooWorkload,
    float32_logits,
    keras_source,
    option_error,
    seeded,
    torchvision_source,
    transformers_source,
)

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
        """A Keras model mapping images [N, H, W, C] to logits [N, classes]."""
        raise NotImplementedError

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
            model=model, loss_fn=nn.CrossEntropyLoss(), make_optimizer=make_optimizer, inputs=inputs, targets=targets
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


def _logits_module(model: Any, keyword: str) -> Any:
    """Wrap a transformers model so that ``module(x)`` returns the logits tensor."""
    from torch import nn

    class Logits(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, inputs: Any) -> Any:
            return self.model(**{keyword: inputs}).logits

    return Logits()


def _make_divisible(value: float, divisor: int = 8) -> int:
    """Channel rounding of MobileNet and EfficientNet (torchvision's _make_divisible, Keras' _depth)."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    if rounded < 0.9 * value:
        rounded += divisor
    return int(rounded)


# --- ResNet ----------------------------------------------------------------------------------


ResNetVersion = Literal["v1.5", "v1", "v2"]


class ResNetOptions(VisionOptions):
    resnet_version: ResNetVersion | None = Field(
        default=None,
        description="'v1.5' (TorchVision's: the stride on the 3x3; the GH200 and ACES papers'), 'v1' (He et al., "
        "keras.applications: the stride on the first 1x1), 'v2' (tf_cnn_benchmarks' pre-activation resnet50_v2, "
        "CARAML's; 1001 ImageNet classes); None: v1.5 with PyTorch, v1 with TensorFlow",
    )


class ResNet(VisionWorkload):
    """Bottleneck ResNet in three versions (``resnet_version``): v1.5 by default, as TorchVision
    builds it and the papers ran it; v1 (He et al. 2016, keras.applications); v2, the
    pre-activation network of tf_cnn_benchmarks that CARAML ran (core/workloads/preactivation.py).
    Keras has v1 only, and adds biases to its convolutions."""

    depths: ClassVar[tuple[int, int, int, int]]
    keras_application: ClassVar[str]
    options_model: ClassVar[type[BaseModel]] = ResNetOptions
    prefers_channels_last: ClassVar[bool] = True
    widths: ClassVar[tuple[int, ...]] = (256, 512, 1024, 2048)
    pipeline_unit: ClassVar[str] = "bottleneck block"
    # transformers' ResNet (v1, v1.5) and core's pre-activation network (v2)
    pipeline_blocks: ClassVar[str | None] = r"(\.encoder\.stages\.\d+\.layers\.\d+|^blocks\.\d+)$"
    # keras.applications names a residual block's layers conv<stage>_block<n>_...
    keras_pipeline_blocks: ClassVar[str | None] = r"(conv\d_block\d+)_"
    # 64 px leaves the last stage 2x2: batch norm over a tiny batch at 1x1 makes gradients explode.
    small_image_size: ClassVar[int] = 64

    def version(self, o: ResNetOptions, framework: Framework) -> ResNetVersion:
        if o.resnet_version is not None:
            return o.resnet_version
        return "v1" if framework is Framework.tensorflow else "v1.5"

    def num_classes(self, o: VisionOptions) -> int:
        # tf_cnn_benchmarks' ImageNet has a background class: 1001 (datasets.py, ImagenetDataset).
        if (
            isinstance(o, ResNetOptions)
            and o.resnet_version == "v2"
            and o.num_classes is None
            and o.dataset == "imagenet"
        ):
            return 1001
        return super().num_classes(o)

    def check_for_framework(self, options: BaseModel, framework: Framework) -> None:
        assert isinstance(options, ResNetOptions)
        if framework is Framework.tensorflow and self.version(options, framework) != "v1":
            raise option_error(
                "resnet_version",
                options.resnet_version,
                f"keras.applications builds {self.name} v1 only; with tensorflow: 'v1' (or leave it out)",
            )

    def shape_details(self, o: VisionOptions) -> dict[str, Any]:
        assert isinstance(o, ResNetOptions)
        return {**super().shape_details(o), "resnet_version": self.version(o, self.reference_framework)}

    def tally(self, o: Any, framework: Framework) -> Tally:
        version = self.version(o, framework)
        conv_bias = framework is Framework.tensorflow
        channels, height, width = self.input_shape(o)
        t = Tally()
        height, width = conv_output(height, 7, 2, 6), conv_output(width, 7, 2, 6)
        t.conv(channels, 64, 7, height, width, bias=conv_bias, norm_parameters=2, reads_input=True)
        height, width = conv_output(height, 3, 2, 2), conv_output(width, 3, 2, 2)  # max pool
        in_channels = 64
        for stage, (depth, out_channels) in enumerate(zip(self.depths, self.widths)):
            for block in range(depth):
                stride = 2 if (block == 0 and stage > 0) else 1
                tally_block = _preactivation_block if version == "v2" else _bottleneck_block
                height, width = tally_block(t, in_channels, out_channels, height, width, stride, version, conv_bias)
                in_channels = out_channels
        if version == "v2":
            t.params(in_channels)  # the shift-only batch norm after the last stage
        t.linear(in_channels, self.num_classes(o))
        return t

    def torch_model(self, o: VisionOptions) -> Any:
        assert isinstance(o, ResNetOptions)
        channels, _, _ = self.input_shape(o)
        version = self.version(o, Framework.torch)
        if version == "v2":
            from core.workloads.preactivation import PreActivationResNet

            return PreActivationResNet(self.depths, self.num_classes(o), channels)
        transformers = self.load(Framework.torch)
        config = transformers.ResNetConfig(
            num_channels=channels,
            embedding_size=64,
            hidden_sizes=list(self.widths),
            depths=list(self.depths),
            layer_type="bottleneck",
            hidden_act="relu",
            downsample_in_first_stage=False,
            # transformers: True puts the stride in the first 1x1 (v1), False in the 3x3 (v1.5).
            downsample_in_bottleneck=version == "v1",
            num_labels=self.num_classes(o),
        )
        return _logits_module(transformers.ResNetForImageClassification(config), "pixel_values")

    def keras_model(self, o: VisionOptions) -> Any:
        from tensorflow import keras

        channels, height, width = self.input_shape(o)
        build = getattr(keras.applications, self.keras_application)
        return build(
            weights=None,
            include_top=True,
            input_shape=(height, width, channels),
            classes=self.num_classes(o),
            classifier_activation=None,
        )


def _bottleneck_block(
    t: Tally, in_channels: int, out_channels: int, height: int, width: int, stride: int, version: str, bias: bool
) -> tuple[int, int]:
    """A v1 or v1.5 block; returns its output size. v1 strides in the first 1x1, v1.5 in the 3x3
    (so its first 1x1 runs at the input's resolution: +6 % FLOPs for ResNet-50)."""
    middle = out_channels // 4
    out_height, out_width = conv_output(height, 1, stride), conv_output(width, 1, stride)
    if in_channels != out_channels or stride != 1:
        t.conv(in_channels, out_channels, 1, out_height, out_width, bias=bias, norm_parameters=2)
    reduce_at = (out_height, out_width) if version == "v1" else (height, width)
    t.conv(in_channels, middle, 1, *reduce_at, bias=bias, norm_parameters=2)
    t.conv(middle, middle, 3, out_height, out_width, bias=bias, norm_parameters=2)
    t.conv(middle, out_channels, 1, out_height, out_width, bias=bias, norm_parameters=2)
    return out_height, out_width


def _preactivation_block(
    t: Tally, in_channels: int, out_channels: int, height: int, width: int, stride: int, version: str, bias: bool
) -> tuple[int, int]:
    """tf_cnn_benchmarks' v2 block: a shift-only pre-activation norm, a projection without norm, the
    stride in the first 1x1, and no norm after the last 1x1."""
    middle = out_channels // 4
    out_height, out_width = conv_output(height, 1, stride), conv_output(width, 1, stride)
    t.params(in_channels)  # the pre-activation norm's shift
    if in_channels != out_channels:
        t.conv(in_channels, out_channels, 1, out_height, out_width)
    t.conv(in_channels, middle, 1, out_height, out_width, norm_parameters=2)
    t.conv(middle, middle, 3, out_height, out_width, norm_parameters=2)
    t.conv(middle, out_channels, 1, out_height, out_width)
    return out_height, out_width


class ResNet50(ResNet):
    name: ClassVar[str] = "resnet50"
    description: ClassVar[str] = "ResNet-50 (He et al. 2016), image classification"
    architecture: ClassVar[str] = "ResNet-50 v1.5 (v1, v2 by resnet_version), bottleneck blocks [3, 4, 6, 3]"
    depths: ClassVar[tuple[int, int, int, int]] = (3, 4, 6, 3)
    keras_application: ClassVar[str] = "ResNet50"
    sources: ClassVar[dict[Framework, Source]] = {
        Framework.torch: transformers_source("ResNetForImageClassification"),
        Framework.tensorflow: keras_source("ResNet50"),
    }
    frameworks: ClassVar[tuple[Framework, ...]] = tuple(sources)
    default_micro_batch_size: ClassVar[int] = 64


class ResNet152(ResNet):
    name: ClassVar[str] = "resnet152"
    description: ClassVar[str] = "ResNet-152 (He et al. 2016), image classification"
    architecture: ClassVar[str] = "ResNet-152 v1.5 (v1, v2 by resnet_version), bottleneck blocks [3, 8, 36, 3]"
    depths: ClassVar[tuple[int, int, int, int]] = (3, 8, 36, 3)
    keras_application: ClassVar[str] = "ResNet152"
    sources: ClassVar[dict[Framework, Source]] = {
        Framework.torch: transformers_source("ResNetForImageClassification"),
        Framework.tensorflow: keras_source("ResNet152"),
    }
    frameworks: ClassVar[tuple[Framework, ...]] = tuple(sources)
    default_micro_batch_size: ClassVar[int] = 32


# --- Vision Transformer ----------------------------------------------------------------------


class VisionTransformer(VisionWorkload):
    """ViT (Dosovitskiy et al. 2021): patches, a CLS token and learned positions, pre-norm encoder layers."""

    #: (hidden, layers, heads, intermediate) of the full and the small variant
    full: ClassVar[tuple[int, int, int, int]]
    small: ClassVar[tuple[int, int, int, int]] = (64, 2, 2, 256)
    patch_size: ClassVar[int]
    optimizer: ClassVar[Literal["sgd", "adamw"]] = "adamw"
    sources: ClassVar[dict[Framework, Source]] = {Framework.torch: transformers_source("ViTForImageClassification")}
    frameworks: ClassVar[tuple[Framework, ...]] = tuple(sources)

    def dimensions(self, o: VisionOptions) -> tuple[int, int, int, int]:
        return self.small if o.variant == "small" else self.full

    def tally(self, o: Any, framework: Framework) -> Tally:
        hidden, layers, _, intermediate = self.dimensions(o)
        channels, height, width = self.input_shape(o)
        grid_h, grid_w = height // self.patch_size, width // self.patch_size
        tokens = grid_h * grid_w + 1  # patches and the CLS token
        t = Tally()
        t.conv(channels, hidden, self.patch_size, grid_h, grid_w, bias=True, reads_input=True)
        t.params(hidden + tokens * hidden)  # CLS token, position embeddings
        for _ in range(layers):
            t.params(2 * hidden)  # layer norm before attention
            for _ in range(4):  # query, key, value, output
                t.linear(hidden, hidden, tokens=tokens)
            t.matmul(2 * tokens * tokens * hidden)  # scores and weighted values, all heads
            t.params(2 * hidden)  # layer norm before the MLP
            t.linear(hidden, intermediate, tokens=tokens)
            t.linear(intermediate, hidden, tokens=tokens)
        t.params(2 * hidden)  # final layer norm
        t.linear(hidden, self.num_classes(o))  # on the CLS token
        return t

    def torch_model(self, o: VisionOptions) -> Any:
        transformers = self.load(Framework.torch)
        hidden, layers, heads, intermediate = self.dimensions(o)
        channels, height, width = self.input_shape(o)
        config = transformers.ViTConfig(
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=intermediate,
            image_size=(height, width),
            patch_size=self.patch_size,
            num_channels=channels,
            num_labels=self.num_classes(o),
        )
        return _logits_module(transformers.ViTForImageClassification(config), "pixel_values")


class VitLarge32(VisionTransformer):
    """The GH200 paper's ViT-L: its 306.5 M parameters are ViT-L/32's (torchvision vit_l_32: 306,535,400)."""

    name: ClassVar[str] = "vit-l32"
    description: ClassVar[str] = "ViT-L/32 vision transformer, image classification (the GH200 paper's ViT-L)"
    architecture: ClassVar[str] = "ViT-L/32: 24 layers, hidden 1024, 16 heads, MLP 4096, 32x32 patches"
    full: ClassVar[tuple[int, int, int, int]] = (1024, 24, 16, 4096)
    patch_size: ClassVar[int] = 32
    default_micro_batch_size: ClassVar[int] = 64


class VitLarge16(VisionTransformer):
    name: ClassVar[str] = "vit-l16"
    description: ClassVar[str] = "ViT-L/16 vision transformer, image classification (4x ViT-L/32's FLOPs)"
    architecture: ClassVar[str] = "ViT-L/16: 24 layers, hidden 1024, 16 heads, MLP 4096, 16x16 patches"
    full: ClassVar[tuple[int, int, int, int]] = (1024, 24, 16, 4096)
    patch_size: ClassVar[int] = 16
    default_micro_batch_size: ClassVar[int] = 32


class VitHuge14(VisionTransformer):
    """ViT-H/14 at 518 px: the GH200 paper's 633.5 M parameters are torchvision's SWAG end-to-end
    vit_h_14 (633,470,440), whose position table is for 518 px (37 x 37 patches)."""

    name: ClassVar[str] = "vit-h14"
    description: ClassVar[str] = "ViT-H/14 vision transformer at 518 px, image classification"
    architecture: ClassVar[str] = "ViT-H/14: 32 layers, hidden 1280, 16 heads, MLP 5120, 14x14 patches, 518 px"
    imagenet_image_size: ClassVar[int] = 518
    full: ClassVar[tuple[int, int, int, int]] = (1280, 32, 16, 5120)
    patch_size: ClassVar[int] = 14
    small_image_size: ClassVar[int] = 28
    min_image_size: ClassVar[int] = 14
    default_micro_batch_size: ClassVar[int] = 16


# --- Swin Transformer ------------------------------------------------------------------------


class SwinTransformer(VisionWorkload):
    """Swin (Liu et al. 2021): attention inside shifted windows, four stages joined by patch merging."""

    #: (embed_dim, depths, heads, window, patch) of the full and the small variant
    full: ClassVar[tuple[int, tuple[int, ...], tuple[int, ...], int, int]]
    small: ClassVar[tuple[int, tuple[int, ...], tuple[int, ...], int, int]] = (16, (2, 2, 2, 2), (1, 2, 2, 4), 2, 4)
    small_image_size: ClassVar[int] = 64
    min_image_size: ClassVar[int] = 8
    optimizer: ClassVar[Literal["sgd", "adamw"]] = "adamw"
    sources: ClassVar[dict[Framework, Source]] = {Framework.torch: transformers_source("SwinForImageClassification")}
    frameworks: ClassVar[tuple[Framework, ...]] = tuple(sources)
    default_micro_batch_size: ClassVar[int] = 64

    def dimensions(self, o: VisionOptions) -> tuple[int, tuple[int, ...], tuple[int, ...], int, int]:
        return self.small if o.variant == "small" else self.full

    def stage_resolutions(self, o: VisionOptions) -> list[tuple[int, int]]:
        _, depths, _, _, patch = self.dimensions(o)
        _, height, width = self.input_shape(o)
        resolution = (math.ceil(height / patch), math.ceil(width / patch))  # the image is padded to whole patches
        resolutions = []
        for _ in depths:
            resolutions.append(resolution)
            resolution = (math.ceil(resolution[0] / 2), math.ceil(resolution[1] / 2))  # patch merging pads to even
        return resolutions

    def check_options(self, o: VisionOptions) -> None:
        super().check_options(o)
        _, _, _, window, _ = self.dimensions(o)
        smallest = min(min(r) for r in self.stage_resolutions(o))
        if smallest < window:
            # transformers builds the relative-position table for the configured window and cannot shrink it.
            raise option_error(
                "image_size",
                o.image_size if o.image_size is not None else f"{o.dataset} images",
                f"{self.name}'s last stage would be {smallest} tokens wide, narrower than its "
                f"{window}-token window; use an image_size of at least {self.min_side(o)}",
            )

    def min_side(self, o: VisionOptions) -> int:
        """The smallest image side whose last stage is still a window wide."""
        _, depths, _, window, patch = self.dimensions(o)
        return patch * (window - 1) * 2 ** (len(depths) - 1) + 1

    def tally(self, o: Any, framework: Framework) -> Tally:
        embed, depths, heads, window, patch = self.dimensions(o)
        channels, _, _ = self.input_shape(o)
        resolutions = self.stage_resolutions(o)
        t = Tally()
        t.conv(channels, embed, patch, *resolutions[0], bias=True, reads_input=True)
        t.params(2 * embed)  # layer norm of the patch embeddings
        dim = embed
        for stage, (depth, stage_heads) in enumerate(zip(depths, heads)):
            height, width = resolutions[stage]
            tokens = height * width
            padded = math.ceil(height / window) * window * math.ceil(width / window) * window
            for _ in range(depth):
                t.params(2 * dim)
                for _ in range(4):  # query, key, value, output: on the window-padded map
                    t.linear(dim, dim, tokens=padded)
                t.params((2 * window - 1) ** 2 * stage_heads)  # relative position bias table
                t.matmul(2 * padded * window * window * dim)  # scores and weighted values in every window
                t.params(2 * dim)
                t.linear(dim, 4 * dim, tokens=tokens)
                t.linear(4 * dim, dim, tokens=tokens)
            if stage < len(depths) - 1:
                merged = resolutions[stage + 1][0] * resolutions[stage + 1][1]
                t.params(2 * 4 * dim)
                t.linear(4 * dim, 2 * dim, tokens=merged, bias=False)
                dim *= 2
        t.params(2 * dim)  # final layer norm
        t.linear(dim, self.num_classes(o))
        return t

    def torch_model(self, o: VisionOptions) -> Any:
        transformers = self.load(Framework.torch)
        embed, depths, heads, window, patch = self.dimensions(o)
        channels, height, width = self.input_shape(o)
        config = transformers.SwinConfig(
            image_size=(height, width),
            patch_size=patch,
            num_channels=channels,
            embed_dim=embed,
            depths=list(depths),
            num_heads=list(heads),
            window_size=window,
            num_labels=self.num_classes(o),
        )
        return _logits_module(transformers.SwinForImageClassification(config), "pixel_values")


class SwinTiny(SwinTransformer):
    name: ClassVar[str] = "swin-t"
    description: ClassVar[str] = "Swin-T shifted-window transformer, image classification"
    architecture: ClassVar[str] = "Swin-T: embed 96, depths [2, 2, 6, 2], heads [3, 6, 12, 24], window 7, patch 4"
    full: ClassVar[tuple[int, tuple[int, ...], tuple[int, ...], int, int]] = (96, (2, 2, 6, 2), (3, 6, 12, 24), 7, 4)


class SwinLarge(SwinTransformer):
    name: ClassVar[str] = "swin-l"
    description: ClassVar[str] = "Swin-L shifted-window transformer, image classification (DINO's backbone)"
    architecture: ClassVar[str] = "Swin-L: embed 192, depths [2, 2, 18, 2], heads [6, 12, 24, 48], window 7, patch 4"
    full: ClassVar[tuple[int, tuple[int, ...], tuple[int, ...], int, int]] = (
        192,
        (2, 2, 18, 2),
        (6, 12, 24, 48),
        7,
        4,
    )
    default_micro_batch_size: ClassVar[int] = 16


class SwinBase(SwinTransformer):
    name: ClassVar[str] = "swin-b"
    description: ClassVar[str] = "Swin-B shifted-window transformer, image classification"
    architecture: ClassVar[str] = "Swin-B: embed 128, depths [2, 2, 18, 2], heads [4, 8, 16, 32], window 7, patch 4"
    full: ClassVar[tuple[int, tuple[int, ...], tuple[int, ...], int, int]] = (128, (2, 2, 18, 2), (4, 8, 16, 32), 7, 4)
    default_micro_batch_size: ClassVar[int] = 32


# --- EfficientNet ----------------------------------------------------------------------------

# The B0 baseline (Tan and Le 2019), scaled in width and depth for B1..B7.
_EFFICIENTNET_BLOCKS = (  # kernel, repeats, in, out, expand ratio, stride
    (3, 1, 32, 16, 1, 1),
    (3, 2, 16, 24, 6, 2),
    (5, 2, 24, 40, 6, 2),
    (3, 3, 40, 80, 6, 2),
    (5, 3, 80, 112, 6, 1),
    (5, 4, 112, 192, 6, 2),
    (3, 1, 192, 320, 6, 1),
)


class EfficientNet(VisionWorkload):
    """MBConv blocks with squeeze-and-excitation, compound-scaled from B0."""

    width_coefficient: ClassVar[float]
    depth_coefficient: ClassVar[float]
    dropout_rate: ClassVar[float]
    keras_application: ClassVar[str]
    prefers_channels_last: ClassVar[bool] = True
    pipeline_blocks: ClassVar[str | None] = r"\.encoder\.blocks\.\d+$"
    pipeline_unit: ClassVar[str] = "MBConv block"
    # keras.applications names an MBConv block's layers block<stage><letter>_...
    keras_pipeline_blocks: ClassVar[str | None] = r"(block\d+[a-z])_"
    #: published pipeline splits (graphcore/examples vision/cnns/pytorch/train/configs.yml), each a
    #: tuple of split points as (stage, block within the stage) in timm's numbering of the seven stages
    published_splits: ClassVar[tuple[tuple[tuple[int, int], ...], ...]] = ()

    def recommended_pipeline_splits(self, options: Any, blocks: tuple[str, ...]) -> dict[int, RecommendedSplit]:
        # transformers numbers the blocks flat; timm per stage: stage s begins after the blocks of
        # the stages before it, each of ceil(depth x repeats) blocks (the same rounding in both).
        repeats = [math.ceil(self.depth_coefficient * r) for _, r, _, _, _, _ in _EFFICIENTNET_BLOCKS]
        if sum(repeats) != len(blocks):
            return {}
        starts = [sum(repeats[:stage]) for stage in range(len(repeats))]
        return {
            len(splits) + 1: RecommendedSplit(
                tuple(blocks[starts[stage] + block] for stage, block in splits),
                "graphcore/examples vision/cnns/pytorch/train/configs.yml (pipeline_splits "
                + ", ".join(f"blocks/{stage}/{block}" for stage, block in splits)
                + ")",
            )
            for splits in self.published_splits
        }

    def round_filters(self, channels: int) -> int:
        return _make_divisible(channels * self.width_coefficient)

    def block_strides(self) -> list[int]:
        """The stride of every block, in order."""
        return [
            stride if repeat == 0 else 1
            for _, repeats, _, _, _, stride in _EFFICIENTNET_BLOCKS
            for repeat in range(math.ceil(self.depth_coefficient * repeats))
        ]

    def tally(self, o: Any, framework: Framework) -> Tally:
        channels, height, width = self.input_shape(o)
        t = Tally()
        # An odd side halves to ceil(n / 2), as in the reference (TensorFlow) EfficientNet; transformers'
        # stem rounds it down (its blocks are told to round up, see torch_model).
        if framework is Framework.tensorflow:
            height, width = math.ceil(height / 2), math.ceil(width / 2)
        else:
            height, width = height // 2, width // 2
        stem = self.round_filters(32)
        t.conv(channels, stem, 3, height, width, norm_parameters=2, reads_input=True)
        for kernel, repeats, block_in, block_out, ratio, first_stride in _EFFICIENTNET_BLOCKS:
            in_channels, out_channels = self.round_filters(block_in), self.round_filters(block_out)
            for repeat in range(math.ceil(self.depth_coefficient * repeats)):
                stride = first_stride if repeat == 0 else 1
                block_in_channels = in_channels if repeat == 0 else out_channels
                expanded = block_in_channels * ratio
                if ratio != 1:
                    t.conv(block_in_channels, expanded, 1, height, width, norm_parameters=2)
                if stride == 2:
                    height, width = math.ceil(height / 2), math.ceil(width / 2)
                t.conv(expanded, expanded, kernel, height, width, groups=expanded, norm_parameters=2)
                squeezed = max(1, int(block_in_channels * 0.25))
                t.conv(expanded, squeezed, 1, 1, 1, bias=True)
                t.conv(squeezed, expanded, 1, 1, 1, bias=True)
                t.conv(expanded, out_channels, 1, height, width, norm_parameters=2)
            in_channels = out_channels
        top = self.round_filters(1280)
        t.conv(in_channels, top, 1, height, width, norm_parameters=2)
        t.linear(top, self.num_classes(o))
        return t

    def torch_model(self, o: VisionOptions) -> Any:
        transformers = self.load(Framework.torch)
        channels, height, width = self.input_shape(o)
        config = transformers.EfficientNetConfig(
            num_channels=channels,
            image_size=height,
            width_coefficient=self.width_coefficient,
            depth_coefficient=self.depth_coefficient,
            hidden_dim=self.round_filters(1280),
            dropout_rate=self.dropout_rate,
            num_labels=self.num_classes(o),
            # Symmetric padding in every stride-2 block: an odd side then halves to ceil(n / 2), as in
            # TensorFlow (transformers' checkpoints list the blocks this matters for at their own size).
            depthwise_padding=[index for index, stride in enumerate(self.block_strides()) if stride == 2],
        )
        return _logits_module(transformers.EfficientNetForImageClassification(config), "pixel_values")

    def keras_model(self, o: VisionOptions) -> Any:
        from tensorflow import keras

        channels, height, width = self.input_shape(o)
        build = getattr(keras.applications, self.keras_application)
        return build(
            weights=None,
            include_top=True,
            input_shape=(height, width, channels),
            classes=self.num_classes(o),
            classifier_activation=None,
        )


class EfficientNetB0(EfficientNet):
    name: ClassVar[str] = "efficientnet-b0"
    description: ClassVar[str] = "EfficientNet-B0, image classification"
    architecture: ClassVar[str] = "EfficientNet-B0: width 1.0, depth 1.0, 224 px"
    width_coefficient: ClassVar[float] = 1.0
    depth_coefficient: ClassVar[float] = 1.0
    dropout_rate: ClassVar[float] = 0.2
    keras_application: ClassVar[str] = "EfficientNetB0"
    published_splits: ClassVar[tuple[tuple[tuple[int, int], ...], ...]] = (((3, 0),),)  # efficientnet-b0-g16-gn-pod16
    sources: ClassVar[dict[Framework, Source]] = {
        Framework.torch: transformers_source("EfficientNetForImageClassification"),
        Framework.tensorflow: keras_source("EfficientNetB0"),
    }
    frameworks: ClassVar[tuple[Framework, ...]] = tuple(sources)
    default_micro_batch_size: ClassVar[int] = 64


class EfficientNetB4(EfficientNet):
    name: ClassVar[str] = "efficientnet-b4"
    description: ClassVar[str] = "EfficientNet-B4, image classification"
    architecture: ClassVar[str] = "EfficientNet-B4: width 1.4, depth 1.8, 380 px"
    width_coefficient: ClassVar[float] = 1.4
    depth_coefficient: ClassVar[float] = 1.8
    dropout_rate: ClassVar[float] = 0.4
    imagenet_image_size: ClassVar[int] = 380
    keras_application: ClassVar[str] = "EfficientNetB4"
    # efficientnet-b4-g16-gn-pod16, ACES Table 2's 4 IPUs per replica
    published_splits: ClassVar[tuple[tuple[tuple[int, int], ...], ...]] = (((1, 1), (3, 0), (4, 5)),)
    sources: ClassVar[dict[Framework, Source]] = {
        Framework.torch: transformers_source("EfficientNetForImageClassification"),
        Framework.tensorflow: keras_source("EfficientNetB4"),
    }
    frameworks: ClassVar[tuple[Framework, ...]] = tuple(sources)
    default_micro_batch_size: ClassVar[int] = 16


# --- MobileNetV3 -----------------------------------------------------------------------------

# (input, kernel, expanded, output, squeeze-excite, stride) of Howard et al. (2019), tables 1 and 2.
_MOBILENET_V3_LARGE = (
    (16, 3, 16, 16, False, 1),
    (16, 3, 64, 24, False, 2),
    (24, 3, 72, 24, False, 1),
    (24, 5, 72, 40, True, 2),
    (40, 5, 120, 40, True, 1),
    (40, 5, 120, 40, True, 1),
    (40, 3, 240, 80, False, 2),
    (80, 3, 200, 80, False, 1),
    (80, 3, 184, 80, False, 1),
    (80, 3, 184, 80, False, 1),
    (80, 3, 480, 112, True, 1),
    (112, 3, 672, 112, True, 1),
    (112, 5, 672, 160, True, 2),
    (160, 5, 960, 160, True, 1),
    (160, 5, 960, 160, True, 1),
)
_MOBILENET_V3_SMALL = (
    (16, 3, 16, 16, True, 2),
    (16, 3, 72, 24, False, 2),
    (24, 3, 88, 24, False, 1),
    (24, 5, 96, 40, True, 2),
    (40, 5, 240, 40, True, 1),
    (40, 5, 240, 40, True, 1),
    (40, 5, 120, 48, True, 1),
    (48, 5, 144, 48, True, 1),
    (48, 5, 288, 96, True, 2),
    (96, 5, 576, 96, True, 1),
    (96, 5, 576, 96, True, 1),
)


class MobileNetV3(VisionWorkload):
    """MobileNetV3: inverted residuals with squeeze-and-excitation and hard-swish; transformers has none,
    so PyTorch builds torchvision's (when installed) and TensorFlow keras.applications', the same network."""

    blocks: ClassVar[tuple[tuple[int, int, int, int, bool, int], ...]]
    last_channels: ClassVar[int]
    prefers_channels_last: ClassVar[bool] = True
    rgb_only: ClassVar[bool] = True
    default_micro_batch_size: ClassVar[int] = 128
    torchvision_builder: ClassVar[str]
    keras_application: ClassVar[str]

    def tally(self, o: Any, framework: Framework) -> Tally:
        channels, height, width = self.input_shape(o)
        t = Tally()
        height, width = math.ceil(height / 2), math.ceil(width / 2)
        t.conv(channels, 16, 3, height, width, norm_parameters=2, reads_input=True)
        for in_channels, kernel, expanded, out_channels, squeeze_excite, stride in self.blocks:
            if expanded != in_channels:
                t.conv(in_channels, expanded, 1, height, width, norm_parameters=2)
            height, width = math.ceil(height / stride), math.ceil(width / stride)
            t.conv(expanded, expanded, kernel, height, width, groups=expanded, norm_parameters=2)
            if squeeze_excite:
                squeezed = _make_divisible(expanded // 4)
                t.conv(expanded, squeezed, 1, 1, 1, bias=True)
                t.conv(squeezed, expanded, 1, 1, 1, bias=True)
            t.conv(expanded, out_channels, 1, height, width, norm_parameters=2)
        last_conv = 6 * self.blocks[-1][3]
        t.conv(self.blocks[-1][3], last_conv, 1, height, width, norm_parameters=2)
        t.linear(last_conv, self.last_channels)
        t.linear(self.last_channels, self.num_classes(o))
        return t

    def torch_model(self, o: VisionOptions) -> Any:
        models = self.load(Framework.torch)
        return getattr(models, self.torchvision_builder)(weights=None, num_classes=self.num_classes(o))

    def keras_model(self, o: VisionOptions) -> Any:
        from tensorflow import keras

        channels, height, width = self.input_shape(o)
        build = getattr(keras.applications, self.keras_application)
        return build(
            weights=None,
            include_top=True,
            input_shape=(height, width, channels),
            classes=self.num_classes(o),
            classifier_activation=None,
            include_preprocessing=False,
        )


class MobileNetV3Small(MobileNetV3):
    name: ClassVar[str] = "mobilenetv3-small"
    description: ClassVar[str] = "MobileNetV3-Small, image classification"
    architecture: ClassVar[str] = "MobileNetV3-Small, width multiplier 1.0"
    blocks: ClassVar[tuple[tuple[int, int, int, int, bool, int], ...]] = _MOBILENET_V3_SMALL
    last_channels: ClassVar[int] = 1024
    torchvision_builder: ClassVar[str] = "mobilenet_v3_small"
    keras_application: ClassVar[str] = "MobileNetV3Small"
    sources: ClassVar[dict[Framework, Source]] = {
        Framework.torch: torchvision_source("mobilenet_v3_small"),
        Framework.tensorflow: keras_source("MobileNetV3Small"),
    }
    frameworks: ClassVar[tuple[Framework, ...]] = tuple(sources)


class MobileNetV3Large(MobileNetV3):
    name: ClassVar[str] = "mobilenetv3-large"
    description: ClassVar[str] = "MobileNetV3-Large, image classification"
    architecture: ClassVar[str] = "MobileNetV3-Large, width multiplier 1.0"
    blocks: ClassVar[tuple[tuple[int, int, int, int, bool, int], ...]] = _MOBILENET_V3_LARGE
    last_channels: ClassVar[int] = 1280
    torchvision_builder: ClassVar[str] = "mobilenet_v3_large"
    keras_application: ClassVar[str] = "MobileNetV3Large"
    sources: ClassVar[dict[Framework, Source]] = {
        Framework.torch: torchvision_source("mobilenet_v3_large"),
        Framework.tensorflow: keras_source("MobileNetV3Large"),
    }
    frameworks: ClassVar[tuple[Framework, ...]] = tuple(sources)


# --- Inception-v3 (Hydra) --------------------------------------------------------------------


class InceptionV3(VisionWorkload):
    """Inception-v3 (Szegedy et al. 2016), the classifier of Hydra, GlueX's data-quality monitor, trained on
    800x600 plots in the AI4NP study with TensorFlow/Keras. Keras' batch norms have no scale (1 parameter
    per channel), torchvision's have one (2); torchvision's auxiliary classifier is left out."""

    name: ClassVar[str] = "inception-v3"
    description: ClassVar[str] = "Inception-v3 as in Hydra (AI4NP), image classification on 800x600 plots"
    architecture: ClassVar[str] = "Inception-v3 without the auxiliary classifier"
    options_model: ClassVar[type[BaseModel]] = HydraOptions
    imagenet_image_size: ClassVar[int] = 299
    small_image_size: ClassVar[int] = 75
    min_image_size: ClassVar[int] = 75
    rgb_only: ClassVar[bool] = True
    prefers_channels_last: ClassVar[bool] = True
    default_micro_batch_size: ClassVar[int] = 8
    sources: ClassVar[dict[Framework, Source]] = {
        Framework.tensorflow: keras_source("InceptionV3"),
        Framework.torch: torchvision_source("inception_v3"),
    }
    frameworks: ClassVar[tuple[Framework, ...]] = (Framework.torch, Framework.tensorflow)
    reference_framework: ClassVar[Framework] = Framework.tensorflow

    def tally(self, o: Any, framework: Framework) -> Tally:
        norm = 1 if framework is Framework.tensorflow else 2
        t = Tally()
        channels, height, width = self.input_shape(o)

        def conv(
            size: tuple[int, int],
            cin: int,
            cout: int,
            kernel: tuple[int, int],
            stride: int = 1,
            valid: bool = False,
            first: bool = False,
        ) -> tuple[int, int]:
            if valid:
                size = (conv_output(size[0], kernel[0], stride), conv_output(size[1], kernel[1], stride))
            t.conv(cin, cout, kernel, *size, norm_parameters=norm, reads_input=first)
            return size

        def pool(size: tuple[int, int]) -> tuple[int, int]:  # 3x3 stride-2 max pool, no padding
            return conv_output(size[0], 3, 2), conv_output(size[1], 3, 2)

        size = conv((height, width), channels, 32, (3, 3), 2, valid=True, first=True)
        size = conv(size, 32, 32, (3, 3), valid=True)
        size = conv(size, 32, 64, (3, 3))
        size = pool(size)
        size = conv(size, 64, 80, (1, 1), valid=True)
        size = conv(size, 80, 192, (3, 3), valid=True)
        size = pool(size)
        cin = 192
        for pool_features in (32, 64, 64):  # mixed 0-2 (InceptionA)
            conv(size, cin, 64, (1, 1))
            conv(size, cin, 48, (1, 1)), conv(size, 48, 64, (5, 5))
            conv(size, cin, 64, (1, 1)), conv(size, 64, 96, (3, 3)), conv(size, 96, 96, (3, 3))
            conv(size, cin, pool_features, (1, 1))
            cin = 64 + 64 + 96 + pool_features
        # mixed 3 (InceptionB): stride-2 reduction
        reduced = conv(size, cin, 384, (3, 3), 2, valid=True)
        conv(size, cin, 64, (1, 1)), conv(size, 64, 96, (3, 3)), conv(size, 96, 96, (3, 3), 2, valid=True)
        size, cin = reduced, 384 + 96 + cin
        for c7 in (128, 160, 160, 192):  # mixed 4-7 (InceptionC)
            conv(size, cin, 192, (1, 1))
            conv(size, cin, c7, (1, 1)), conv(size, c7, c7, (1, 7)), conv(size, c7, 192, (7, 1))
            conv(size, cin, c7, (1, 1)), conv(size, c7, c7, (7, 1)), conv(size, c7, c7, (1, 7))
            conv(size, c7, c7, (7, 1)), conv(size, c7, 192, (1, 7))
            conv(size, cin, 192, (1, 1))
            cin = 768
        # mixed 8 (InceptionD): stride-2 reduction
        conv(size, cin, 192, (1, 1))
        reduced = conv(size, 192, 320, (3, 3), 2, valid=True)
        conv(size, cin, 192, (1, 1)), conv(size, 192, 192, (1, 7)), conv(size, 192, 192, (7, 1))
        conv(size, 192, 192, (3, 3), 2, valid=True)
        size, cin = reduced, 320 + 192 + cin
        for _ in range(2):  # mixed 9-10 (InceptionE)
            conv(size, cin, 320, (1, 1))
            conv(size, cin, 384, (1, 1)), conv(size, 384, 384, (1, 3)), conv(size, 384, 384, (3, 1))
            conv(size, cin, 448, (1, 1)), conv(size, 448, 384, (3, 3))
            conv(size, 384, 384, (1, 3)), conv(size, 384, 384, (3, 1))
            conv(size, cin, 192, (1, 1))
            cin = 320 + 768 + 768 + 192
        t.linear(cin, self.num_classes(o))
        return t

    def torch_model(self, o: VisionOptions) -> Any:
        models = self.load(Framework.torch)
        return models.inception_v3(weights=None, aux_logits=False, init_weights=True, num_classes=self.num_classes(o))

    def keras_model(self, o: VisionOptions) -> Any:
        from tensorflow import keras

        channels, height, width = self.input_shape(o)
        return keras.applications.InceptionV3(
            weights=None,
            include_top=True,
            input_shape=(height, width, channels),
            classes=self.num_classes(o),
            classifier_activation=None,
        )


VISION_WORKLOADS = (
    ResNet50,
    ResNet152,
    VitLarge32,
    VitLarge16,
    VitHuge14,
    SwinTiny,
    SwinBase,
    SwinLarge,
    EfficientNetB0,
    EfficientNetB4,
    MobileNetV3Small,
    MobileNetV3Large,
    InceptionV3,
)
