"""EfficientNet-B0 and -B4: MBConv blocks compound-scaled from B0, with Graphcore's published
pipeline splits."""

from __future__ import annotations

import math
from typing import Any, ClassVar

from core.base.config import Framework
from core.contract.pipeline import RecommendedSplit
from core.workloads.counting import Tally
from core.workloads.vision.base import VisionOptions, VisionWorkload, make_divisible
from core.workloads.zoo import Source, keras_source, logits_module, transformers_source

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
        return make_divisible(channels * self.width_coefficient)

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
        return logits_module(transformers.EfficientNetForImageClassification(config), "pixel_values")


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
