"""ResNet v2 as CARAML ran it: tf_cnn_benchmarks' ``resnet50_v2`` (``resnet_model.py``,
``bottleneck_block_v2``), written in PyTorch because transformers has no pre-activation ResNet.

It differs from the textbook pre-activation network (He et al. 2016b) and from Keras' ResNet50V2
in details that change the parameter count:

- a block's stride sits in its first 1x1 convolution, as in v1;
- the pre-activation batch norm of a block, and the one after the last stage, only shift
  (``scale=False`` in tf_cnn_benchmarks: a beta, no gamma);
- the projection shortcut is a bare 1x1 convolution of the pre-activation, without batch norm;
- the batch norms inside a block scale and shift; the block's last 1x1 convolution has none;
- ImageNet has 1001 classes in tf_cnn_benchmarks (a background class).

Imported only when the model is built: this module imports torch.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional

STAGE_WIDTHS = (256, 512, 1024, 2048)


class ShiftOnlyBatchNorm(nn.Module):
    """Batch norm that normalises and adds a learned shift, without a learned scale."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = nn.BatchNorm2d(channels, eps=1e-3, momentum=0.001, affine=False)
        self.shift = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x) + self.shift[None, :, None, None]


class PreActivationBottleneck(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        middle = out_channels // 4
        self.preactivation = ShiftOnlyBatchNorm(in_channels)
        self.projection = (
            nn.Conv2d(in_channels, out_channels, 1, stride, bias=False) if in_channels != out_channels else None
        )
        self.reduce = nn.Conv2d(in_channels, middle, 1, stride, bias=False)
        self.reduce_norm = nn.BatchNorm2d(middle)
        self.spatial = nn.Conv2d(middle, middle, 3, 1, padding=1, bias=False)
        self.spatial_norm = nn.BatchNorm2d(middle)
        self.expand = nn.Conv2d(middle, out_channels, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        preactivated = functional.relu(self.preactivation(x))
        shortcut = self.projection(preactivated) if self.projection is not None else x
        y = functional.relu(self.reduce_norm(self.reduce(preactivated)))
        y = functional.relu(self.spatial_norm(self.spatial(y)))
        return shortcut + self.expand(y)


class PreActivationResNet(nn.Module):
    """Images [N, C, H, W] to logits [N, classes]."""

    def __init__(self, depths: tuple[int, ...], num_classes: int, channels: int = 3) -> None:
        super().__init__()
        # TensorFlow's 'SAME' padding of a 7x7/2 convolution: 3 before, 3 after (tf_cnn's SAME_RESNET).
        self.stem = nn.Conv2d(channels, 64, 7, 2, padding=3, bias=False)
        self.stem_norm = nn.BatchNorm2d(64)
        blocks: list[nn.Module] = []
        in_channels = 64
        for stage, (depth, out_channels) in enumerate(zip(depths, STAGE_WIDTHS)):
            for block in range(depth):
                stride = 2 if block == 0 and stage > 0 else 1
                blocks.append(PreActivationBottleneck(in_channels, out_channels, stride))
                in_channels = out_channels
        self.blocks = nn.Sequential(*blocks)
        self.final_norm = ShiftOnlyBatchNorm(in_channels)
        self.classifier = nn.Linear(in_channels, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = functional.relu(self.stem_norm(self.stem(images)))
        # TensorFlow's 'SAME' 3x3/2 max pool pads after only (0 before, 1 after).
        x = functional.max_pool2d(functional.pad(x, (0, 1, 0, 1), value=float("-inf")), 3, 2)
        x = functional.relu(self.final_norm(self.blocks(x)))
        return self.classifier(x.mean((2, 3)))
