"""torchvision's Faster R-CNN R50-FPN, trained through core's executor.

The executor calls ``model(images)`` then ``loss_fn(outputs, targets)``, while torchvision's
detector needs the targets inside its forward (the RPN and the RoI head sample against them). So
``forward`` runs the part that needs no targets (normalisation, padding, backbone and FPN) and
``loss`` the rest, as ``GeneralizedRCNN.forward`` does in training. The transform is told the
padded image size, so it never resizes and the boxes stay in pixels.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from core.workloads.detection import target_rows


class FasterRcnnTraining(nn.Module):
    def __init__(self, models: Any, height: int, width: int, classes: int) -> None:
        super().__init__()
        from torchvision.models.detection.backbone_utils import resnet_fpn_backbone
        from torchvision.ops.misc import FrozenBatchNorm2d

        # Frozen batch-norm statistics as in every torchvision and MMDetection recipe (a backbone
        # pretrained on ImageNet); all five stages train, so the count is torchvision's 41,755,286.
        backbone = resnet_fpn_backbone(
            backbone_name="resnet50", weights=None, norm_layer=FrozenBatchNorm2d, trainable_layers=5
        )
        self.detector = models.detection.FasterRCNN(
            backbone, num_classes=classes, min_size=min(height, width), max_size=max(height, width)
        )

    def forward(self, images: torch.Tensor) -> tuple[Any, dict[str, torch.Tensor]]:
        image_list, _ = self.detector.transform(list(images))
        return image_list, self.detector.backbone(image_list.tensors)

    def loss(self, outputs: tuple[Any, dict[str, torch.Tensor]], targets: torch.Tensor) -> torch.Tensor:
        image_list, features = outputs
        # torchvision's COCO head numbers classes from 1 (0 is the background).
        labelled = [{"boxes": rows[:, 1:].float(), "labels": rows[:, 0].long() + 1} for rows in target_rows(targets)]
        proposals, proposal_losses = self.detector.rpn(image_list, features, labelled)
        _, detector_losses = self.detector.roi_heads(features, proposals, image_list.image_sizes, labelled)
        return sum((*proposal_losses.values(), *detector_losses.values()), torch.zeros((), device=targets.device))
