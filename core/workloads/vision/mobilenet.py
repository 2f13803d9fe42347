"""MobileNetV3-Small and -Large: torchvision's network for PyTorch, keras.applications' for TensorFlow."""

from __future__ import annotations

import math
from typing import Any, ClassVar

from core.base.config import Framework
from core.workloads.counting import Tally
from core.workloads.vision.base import VisionOptions, VisionWorkload, make_divisible
from core.workloads.zoo import Source, keras_source, torchvision_source

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
                squeezed = make_divisible(expanded // 4)
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

    def keras_arguments(self) -> dict[str, Any]:
        return {"include_preprocessing": False}  # no Rescaling layer of its own, as torchvision's network


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
