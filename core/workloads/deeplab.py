"""DeepLabV3+ (Chen et al. 2018) in plain torch, laid out as MMSegmentation's
``deeplabv3plus_r101-d8`` config builds it; transformers has no DeepLab.

- Backbone ResNetV1c: a deep stem of three 3x3 convolutions in place of the 7x7 one, bottlenecks
  with the stride on the 3x3 convolution (v1.5), stages 3 and 4 dilated (2 and 4) in place of
  their stride, so features stay at 1/8 of the input. ``contract_dilation``: the first block of a
  dilated stage uses half its dilation.
- Head: image pooling, a 1x1 branch and three depthwise-separable 3x3 branches (dilations 12, 24,
  36), fused by a 3x3 convolution; upsampled to 1/4 and joined with stage 1's features projected to
  48 channels; two depthwise-separable convolutions; dropout and a 1x1 classifier.
- Auxiliary FCN head on stage 3 (one 3x3 convolution, dropout, classifier), used only by the loss.

``forward`` returns (logits, auxiliary logits), both below the input resolution; the loss upsamples.
The parameter and FLOP walk is ``core.workloads.segmentation.deeplab_tally``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from core.workloads.segmentation import DeeplabShape

DROPOUT = 0.1  # MMSegmentation's dropout before every classifier


def conv_bn_relu(
    in_channels: int, out_channels: int, kernel: int, stride: int = 1, dilation: int = 1, groups: int = 1
) -> nn.Sequential:
    """MMSegmentation's ConvModule: a bias-free convolution (padding keeps the size), BN, ReLU."""
    padding = dilation * (kernel // 2)
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel, stride, padding, dilation, groups=groups, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    )


def separable_conv(in_channels: int, out_channels: int, dilation: int = 1) -> nn.Sequential:
    """MMSegmentation's DepthwiseSeparableConvModule: 3x3 depthwise, then 1x1 pointwise, each with BN, ReLU."""
    return nn.Sequential(
        conv_bn_relu(in_channels, in_channels, 3, dilation=dilation, groups=in_channels),
        conv_bn_relu(in_channels, out_channels, 1),
    )


class Bottleneck(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, stride: int, dilation: int) -> None:
        super().__init__()
        middle = out_channels // 4
        self.reduce = conv_bn_relu(in_channels, middle, 1)
        self.spatial = conv_bn_relu(middle, middle, 3, stride=stride, dilation=dilation)
        self.expand = nn.Sequential(nn.Conv2d(middle, out_channels, 1, bias=False), nn.BatchNorm2d(out_channels))
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride, bias=False), nn.BatchNorm2d(out_channels)
            )
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.expand(self.spatial(self.reduce(x))) + self.shortcut(x))


class ResNetV1c(nn.Module):
    """Returns the output of every stage."""

    def __init__(self, shape: DeeplabShape) -> None:
        super().__init__()
        half = shape.stem_width // 2
        self.stem = nn.Sequential(
            conv_bn_relu(3, half, 3, stride=2),
            conv_bn_relu(half, half, 3),
            conv_bn_relu(half, shape.stem_width, 3),
            nn.MaxPool2d(3, 2, 1),
        )
        stages = []
        in_channels = shape.stem_width
        for depth, out_channels, stride, dilation in zip(
            shape.depths, shape.stage_widths, shape.stage_strides, shape.stage_dilations
        ):
            first_dilation = dilation // 2 if dilation > 1 else 1  # contract_dilation
            blocks = [Bottleneck(in_channels, out_channels, stride, first_dilation)]
            blocks += [Bottleneck(out_channels, out_channels, 1, dilation) for _ in range(depth - 1)]
            stages.append(nn.Sequential(*blocks))
            in_channels = out_channels
        self.stages = nn.ModuleList(stages)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        features = []
        x = self.stem(x)
        for stage in self.stages:
            x = stage(x)
            features.append(x)
        return features


class SeparableAsppHead(nn.Module):
    """DeepLabV3+'s decoder (MMSegmentation's DepthwiseSeparableASPPHead)."""

    def __init__(self, shape: DeeplabShape, classes: int) -> None:
        super().__init__()
        top, low, head = shape.stage_widths[-1], shape.stage_widths[0], shape.head_channels
        self.image_pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), conv_bn_relu(top, head, 1))
        self.aspp = nn.ModuleList(
            [conv_bn_relu(top, head, 1), *(separable_conv(top, head, dilation) for dilation in shape.aspp_dilations)]
        )
        self.aspp_fuse = conv_bn_relu((2 + len(shape.aspp_dilations)) * head, head, 3)
        self.low_level = conv_bn_relu(low, shape.low_level_channels, 1)
        self.decoder = nn.Sequential(separable_conv(head + shape.low_level_channels, head), separable_conv(head, head))
        self.classifier = nn.Sequential(nn.Dropout2d(DROPOUT), nn.Conv2d(head, classes, 1))

    def forward(self, low_level: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
        pooled = self.image_pool(top).expand(-1, -1, *top.shape[-2:])
        aspp = self.aspp_fuse(torch.cat([pooled, *(branch(top) for branch in self.aspp)], dim=1))
        aspp = nn.functional.interpolate(aspp, size=low_level.shape[-2:], mode="bilinear", align_corners=False)
        return self.classifier(self.decoder(torch.cat([aspp, self.low_level(low_level)], dim=1)))


class DeeplabV3Plus(nn.Module):
    def __init__(self, shape: DeeplabShape, classes: int) -> None:
        super().__init__()
        self.backbone = ResNetV1c(shape)
        self.decode_head = SeparableAsppHead(shape, classes)
        self.auxiliary_head = nn.Sequential(
            conv_bn_relu(shape.stage_widths[2], shape.auxiliary_channels, 3),
            nn.Dropout2d(DROPOUT),
            nn.Conv2d(shape.auxiliary_channels, classes, 1),
        )

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.backbone(images)
        return self.decode_head(features[0], features[3]), self.auxiliary_head(features[2])
