"""EfficientNet-B0 and -B4: MBConv blocks compound-scaled from B0, with Graphcore's published
pipeline splits; and Graphcore's G16-GN variants of both, the models its IPU examples train."""

from __future__ import annotations

import math
from typing import Any, ClassVar

from core.base.config import Framework
from core.contract.pipeline import RecommendedSplit
from core.workloads.counting import Tally
from core.workloads.vision.base import VisionOptions, VisionWorkload, make_divisible
from core.workloads.zoo import Source, keras_source, logits_module, transformers_source

# The B0 baseline (Tan and Le 2019), scaled in width and depth for B1..B7. The first stage's blocks
# are depthwise-separable (no expansion); the others expand by ``EfficientNet.expand_ratio``.
_EFFICIENTNET_BLOCKS = (  # kernel, repeats, in, out, stride
    (3, 1, 32, 16, 1),
    (3, 2, 16, 24, 2),
    (5, 2, 24, 40, 2),
    (3, 3, 40, 80, 2),
    (5, 3, 80, 112, 1),
    (5, 4, 112, 192, 2),
    (3, 1, 192, 320, 1),
)


class EfficientNet(VisionWorkload):
    """MBConv blocks with squeeze-and-excitation, compound-scaled from B0."""

    width_coefficient: ClassVar[float]
    depth_coefficient: ClassVar[float]
    dropout_rate: ClassVar[float]
    #: the inverted residuals' expansion (every stage but the first)
    expand_ratio: ClassVar[int] = 6
    #: channels per group of the blocks' spatial convolutions; None: one (depthwise, the paper's)
    group_size: ClassVar[int | None] = None
    #: the stem pads 1 px all round (timm), so that an odd side halves to ceil(n / 2) in PyTorch too;
    #: False: transformers' stem, which pads right and bottom only and rounds down
    symmetric_stem: ClassVar[bool] = False
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
        repeats = [math.ceil(self.depth_coefficient * r) for _, r, _, _, _ in _EFFICIENTNET_BLOCKS]
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
            for _, repeats, _, _, stride in _EFFICIENTNET_BLOCKS
            for repeat in range(math.ceil(self.depth_coefficient * repeats))
        ]

    def spatial_groups(self, channels: int) -> int:
        """Groups of a block's k x k convolution over ``channels``: depthwise, or Graphcore's
        ``max(channels // group_dim, 1)`` (a full convolution below ``group_size`` channels)."""
        return channels if self.group_size is None else max(channels // self.group_size, 1)

    def tally(self, o: Any, framework: Framework) -> Tally:
        channels, height, width = self.input_shape(o)
        t = Tally()
        # An odd side halves to ceil(n / 2), as in the reference (TensorFlow) EfficientNet; transformers'
        # stem rounds it down (its blocks are told to round up, see transformers_model).
        if framework is Framework.tensorflow or self.symmetric_stem:
            height, width = math.ceil(height / 2), math.ceil(width / 2)
        else:
            height, width = height // 2, width // 2
        stem = self.round_filters(32)
        t.conv(channels, stem, 3, height, width, norm_parameters=2, reads_input=True)
        for stage, (kernel, repeats, block_in, block_out, first_stride) in enumerate(_EFFICIENTNET_BLOCKS):
            in_channels, out_channels = self.round_filters(block_in), self.round_filters(block_out)
            ratio = 1 if stage == 0 else self.expand_ratio
            for repeat in range(math.ceil(self.depth_coefficient * repeats)):
                stride = first_stride if repeat == 0 else 1
                block_in_channels = in_channels if repeat == 0 else out_channels
                expanded = block_in_channels * ratio
                if ratio != 1:
                    t.conv(block_in_channels, expanded, 1, height, width, norm_parameters=2)
                if stride == 2:
                    height, width = math.ceil(height / 2), math.ceil(width / 2)
                t.conv(
                    expanded, expanded, kernel, height, width, groups=self.spatial_groups(expanded), norm_parameters=2
                )
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
        return logits_module(self.transformers_model(o), "pixel_values")

    def transformers_model(self, o: VisionOptions) -> Any:
        """transformers' EfficientNetForImageClassification for this scaling and expansion."""
        transformers = self.load(Framework.torch)
        channels, height, width = self.input_shape(o)
        config = transformers.EfficientNetConfig(
            num_channels=channels,
            image_size=height,
            width_coefficient=self.width_coefficient,
            depth_coefficient=self.depth_coefficient,
            expand_ratios=[1] + [self.expand_ratio] * (len(_EFFICIENTNET_BLOCKS) - 1),
            hidden_dim=self.round_filters(1280),
            dropout_rate=self.dropout_rate,
            num_labels=self.num_classes(o),
            # Symmetric padding in every stride-2 block: an odd side then halves to ceil(n / 2), as in
            # TensorFlow (transformers' checkpoints list the blocks this matters for at their own size).
            depthwise_padding=[index for index, stride in enumerate(self.block_strides()) if stride == 2],
        )
        return transformers.EfficientNetForImageClassification(config)


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


class EfficientNetG16GN(EfficientNet):
    """Graphcore's G16-GN EfficientNet (graphcore/examples vision/cnns/pytorch, configs.yml's
    efficientnet-g16-gn base): the blocks' spatial convolutions grouped 16 channels to a group instead
    of depthwise (``efficientnet_group_dim: 16``), expansion 4 instead of 6
    (``efficientnet_expand_ratio: 4``), and group norm of 4 groups, eps 0.001, in place of every batch
    norm (``norm_type: group``, ``norm_num_groups: 4``, ``norm_eps: 0.001``), as Masters et al. (2021,
    arXiv:2106.03640) propose for the IPU: grouped convolutions use it better than depthwise ones, and
    group norm does not depend on the small micro-batches it trains with.
    Graphcore edits timm's EfficientNet after building it; here transformers' is edited the same way,
    to the same parameter count and FLOPs (tests/test_zoo.py). PyTorch only, as Graphcore's."""

    expand_ratio: ClassVar[int] = 4
    group_size: ClassVar[int | None] = 16
    #: group norm's groups, Graphcore's norm_num_groups
    norm_groups: ClassVar[int] = 4
    norm_eps: ClassVar[float] = 0.001
    symmetric_stem: ClassVar[bool] = True  # timm's stem pads 1 px all round
    sources: ClassVar[dict[Framework, Source]] = {
        Framework.torch: transformers_source("EfficientNetForImageClassification")
    }
    frameworks: ClassVar[tuple[Framework, ...]] = tuple(sources)

    def torch_model(self, o: VisionOptions) -> Any:
        from torch import nn

        model = self.transformers_model(o)
        # timm's stem pads 1 px all round; transformers' pads right and bottom only.
        model.efficientnet.embeddings.padding = nn.ZeroPad2d(1)
        for parent in list(model.modules()):  # listed first: children are replaced on the way
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.BatchNorm2d):
                    setattr(parent, name, nn.GroupNorm(self.norm_groups, child.num_features, eps=self.norm_eps))
                elif name == "depthwise_conv" and isinstance(child, nn.Conv2d):
                    setattr(parent, name, self.grouped_conv(child))
        return logits_module(model, "pixel_values")

    def grouped_conv(self, depthwise: Any) -> Any:
        """What Graphcore's timm.models.layers.create_conv2d puts in place of a depthwise convolution:
        the same (square) kernel, stride and padding, grouped, no bias, PyTorch's initialisation."""
        from torch import nn

        return nn.Conv2d(
            depthwise.in_channels,
            depthwise.out_channels,
            depthwise.kernel_size[0],
            stride=depthwise.stride[0],
            padding=depthwise.padding,
            groups=self.spatial_groups(depthwise.in_channels),
            bias=False,
        )


class EfficientNetB0G16GN(EfficientNetG16GN):
    name: ClassVar[str] = "efficientnet-b0-g16-gn"
    description: ClassVar[str] = "EfficientNet-B0 G16-GN (Graphcore's IPU variant), image classification"
    architecture: ClassVar[str] = (
        "EfficientNet-B0 G16-GN: width 1.0, depth 1.0, 224 px; groups of 16 channels, expansion 4, group norm"
    )
    width_coefficient: ClassVar[float] = EfficientNetB0.width_coefficient
    depth_coefficient: ClassVar[float] = EfficientNetB0.depth_coefficient
    dropout_rate: ClassVar[float] = EfficientNetB0.dropout_rate
    published_splits: ClassVar[tuple[tuple[tuple[int, int], ...], ...]] = EfficientNetB0.published_splits
    default_micro_batch_size: ClassVar[int] = EfficientNetB0.default_micro_batch_size


class EfficientNetB4G16GN(EfficientNetG16GN):
    name: ClassVar[str] = "efficientnet-b4-g16-gn"
    description: ClassVar[str] = "EfficientNet-B4 G16-GN (Graphcore's IPU variant), image classification"
    architecture: ClassVar[str] = (
        "EfficientNet-B4 G16-GN: width 1.4, depth 1.8, 380 px; groups of 16 channels, expansion 4, group norm"
    )
    width_coefficient: ClassVar[float] = EfficientNetB4.width_coefficient
    depth_coefficient: ClassVar[float] = EfficientNetB4.depth_coefficient
    dropout_rate: ClassVar[float] = EfficientNetB4.dropout_rate
    imagenet_image_size: ClassVar[int] = EfficientNetB4.imagenet_image_size
    published_splits: ClassVar[tuple[tuple[tuple[int, int], ...], ...]] = EfficientNetB4.published_splits
    default_micro_batch_size: ClassVar[int] = EfficientNetB4.default_micro_batch_size
