"""ResNet-50 and ResNet-152: bottleneck ResNets in versions v1.5, v1 and v2."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field

from core.base.config import Framework
from core.workloads.counting import Tally, conv_output
from core.workloads.vision.base import VisionOptions, VisionWorkload
from core.workloads.zoo import Source, keras_source, logits_module, option_error, transformers_source

ResNetVersion = Literal["v1.5", "v1", "v2"]


class ResNetOptions(VisionOptions):
    resnet_version: ResNetVersion | None = Field(
        default=None,
        description="'v1.5' (TorchVision's: the stride on the 3x3; the GH200 and ACES papers'), 'v1' (He et al., "
        "keras.applications: the stride on the first 1x1), 'v2' (tf_cnn_benchmarks' pre-activation resnet50_v2, "
        "CARAML's; 1001 ImageNet classes, PyTorch only); None: v1.5 with PyTorch, v1 with TensorFlow",
    )


class ResNet(VisionWorkload):
    """Bottleneck ResNet in three versions (``resnet_version``): v1.5 by default, as TorchVision
    builds it and the papers ran it; v1 (He et al. 2016, keras.applications); v2, the
    pre-activation network of tf_cnn_benchmarks that CARAML ran (core/workloads/preactivation.py).
    keras.applications has v1 only, with biases in its convolutions; core builds v1.5 in Keras as
    Graphcore's TensorFlow 2 ResNet-50 (the ACES and CARAML IPU runs') is built: the stride in the
    3x3 and no convolution biases (:func:`keras_resnet_v1_5`)."""

    depths: ClassVar[tuple[int, int, int, int]]
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
        if framework is Framework.tensorflow and self.version(options, framework) == "v2":
            raise option_error(
                "resnet_version",
                options.resnet_version,
                f"the pre-activation {self.name} v2 is built with PyTorch only; with tensorflow: 'v1' (keras."
                "applications, the default) or 'v1.5'",
            )

    def shape_details(self, o: VisionOptions) -> dict[str, Any]:
        assert isinstance(o, ResNetOptions)
        return {**super().shape_details(o), "resnet_version": self.version(o, self.reference_framework)}

    def tally(self, o: Any, framework: Framework) -> Tally:
        version = self.version(o, framework)
        conv_bias = framework is Framework.tensorflow and version == "v1"  # keras.applications' own
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

    def keras_model(self, o: VisionOptions) -> Any:
        assert isinstance(o, ResNetOptions)
        if self.version(o, Framework.tensorflow) == "v1":
            return super().keras_model(o)
        channels, height, width = self.input_shape(o)
        return keras_resnet_v1_5(self.depths, (height, width, channels), self.num_classes(o), self.name)

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
        return logits_module(transformers.ResNetForImageClassification(config), "pixel_values")


def keras_resnet_v1_5(
    depths: tuple[int, int, int, int], input_shape: tuple[int, int, int], classes: int, name: str
) -> Any:
    """A Keras ResNet v1.5 mapping images to logits: keras.applications' stem, layer names and batch
    norm epsilon (so pipelines split it by the same blocks), with the stride of a stage's first block
    in its 3x3 instead of its first 1x1 and no convolution biases (a batch norm follows each), as
    TorchVision's and Graphcore's TensorFlow 2 ResNet-50 (graphcore/examples, vision/cnns/tensorflow2/
    model/resnet_models.py) are."""
    from tensorflow import keras

    layers = keras.layers

    def conv_bn(x: Any, filters: int, kernel: int, stride: int, prefix: str, relu: bool) -> Any:
        x = layers.Conv2D(filters, kernel, strides=stride, padding="same", use_bias=False, name=f"{prefix}_conv")(x)
        x = layers.BatchNormalization(epsilon=1.001e-5, name=f"{prefix}_bn")(x)
        return layers.Activation("relu", name=f"{prefix}_relu")(x) if relu else x

    inputs = keras.Input(shape=input_shape)
    x = layers.ZeroPadding2D(3, name="conv1_pad")(inputs)
    x = layers.Conv2D(64, 7, strides=2, use_bias=False, name="conv1_conv")(x)
    x = layers.BatchNormalization(epsilon=1.001e-5, name="conv1_bn")(x)
    x = layers.Activation("relu", name="conv1_relu")(x)
    x = layers.ZeroPadding2D(1, name="pool1_pad")(x)
    x = layers.MaxPooling2D(3, strides=2, name="pool1_pool")(x)
    for stage, (depth, filters) in enumerate(zip(depths, (64, 128, 256, 512)), start=2):
        for block in range(1, depth + 1):
            prefix = f"conv{stage}_block{block}"
            stride = 2 if block == 1 and stage > 2 else 1
            shortcut = x
            if block == 1:  # a projection where the width (or the resolution) changes
                shortcut = conv_bn(x, 4 * filters, 1, stride, f"{prefix}_0", relu=False)
            y = conv_bn(x, filters, 1, 1, f"{prefix}_1", relu=True)
            y = conv_bn(y, filters, 3, stride, f"{prefix}_2", relu=True)  # v1.5: the stride here
            y = conv_bn(y, 4 * filters, 1, 1, f"{prefix}_3", relu=False)
            x = layers.Add(name=f"{prefix}_add")([shortcut, y])
            x = layers.Activation("relu", name=f"{prefix}_out")(x)
    x = layers.GlobalAveragePooling2D(name="avg_pool")(x)
    outputs = layers.Dense(classes, name="predictions")(x)
    return keras.Model(inputs, outputs, name=f"{name}_v1_5")


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
