"""Inception-v3 as in Hydra (AI4NP): 800x600 plots, keras.applications' network, torchvision's for PyTorch."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel

from core.base.config import Framework
from core.workloads.counting import Tally, conv_output
from core.workloads.vision.base import HydraOptions, VisionOptions, VisionWorkload
from core.workloads.zoo import Source, keras_source, torchvision_source


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
    keras_application: ClassVar[str] = "InceptionV3"

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
