"""Deformable DETR's training loss, as transformers computes it, without scipy.

transformers' ``DeformableDetrForObjectDetectionLoss`` matches predictions to objects with
``scipy.optimize.linear_sum_assignment``; scipy is not a dependency of core, so the matching here
uses ``core.workloads.assignment`` and the same costs (focal class cost, L1 and GIoU box costs),
then transformers' own criterion (``DeformableDetrImageLoss``) and loss weights.

The executor calls ``model(images)`` and then ``loss_fn(outputs, targets)``, so the detector runs
with a loss function that only hands back every decoder layer's classes and boxes, and ``loss``
applies the criterion to them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from core.workloads.assignment import linear_sum_assignment
from core.workloads.detection import target_rows

_KEEP_EVERY_LAYER: list[Any] = []  # a ``labels`` that is not None, so the detector calls its loss function


def _every_layer(logits: Any, labels: Any, device: Any, pred_boxes: Any, config: Any, *args: Any, **kwargs: Any) -> Any:
    outputs_class, outputs_coord = args[:2] if len(args) >= 2 else (kwargs["outputs_class"], kwargs["outputs_coord"])
    return None, None, (outputs_class, outputs_coord)


def _normalised(rows: torch.Tensor, image_size: tuple[int, int]) -> dict[str, torch.Tensor]:
    """(class, x1, y1, x2, y2) pixel rows -> transformers' labels: class ids and (cx, cy, w, h) / image size."""
    height, width = image_size
    x1, y1, x2, y2 = rows[:, 1:].float().unbind(-1)
    boxes = torch.stack([(x1 + x2) / 2 / width, (y1 + y2) / 2 / height, (x2 - x1) / width, (y2 - y1) / height], -1)
    return {"class_labels": rows[:, 0].long(), "boxes": boxes}


class HungarianMatcher(nn.Module):
    """Deformable DETR's matcher: focal class cost (alpha 0.25, gamma 2), L1 and GIoU box costs."""

    def __init__(self, class_cost: float, bbox_cost: float, giou_cost: float) -> None:
        super().__init__()
        self.class_cost, self.bbox_cost, self.giou_cost = class_cost, bbox_cost, giou_cost

    @torch.no_grad()
    def forward(self, outputs: dict[str, Any], targets: list[dict[str, Any]]) -> list[tuple[Any, Any]]:
        from transformers.image_transforms import center_to_corners_format
        from transformers.loss.loss_for_object_detection import generalized_box_iou

        alpha, gamma = 0.25, 2.0
        matches = []
        for logits, boxes, target in zip(outputs["logits"], outputs["pred_boxes"], targets):
            probability = logits.float().sigmoid()[:, target["class_labels"]]
            negative = (1 - alpha) * probability**gamma * -(1 - probability + 1e-8).log()
            positive = alpha * (1 - probability) ** gamma * -(probability + 1e-8).log()
            box_l1 = torch.cdist(boxes.float(), target["boxes"], p=1)
            giou = generalized_box_iou(
                center_to_corners_format(boxes.float()), center_to_corners_format(target["boxes"])
            )
            cost = self.class_cost * (positive - negative) + self.bbox_cost * box_l1 - self.giou_cost * giou
            cost = torch.nan_to_num(cost, nan=1e30, posinf=1e30, neginf=-1e30)
            rows, columns = linear_sum_assignment(cost.cpu().numpy())
            matches.append((torch.as_tensor(rows, dtype=torch.int64), torch.as_tensor(columns, dtype=torch.int64)))
        return matches


class DeformableDetrTraining(nn.Module):
    """``module(images)`` -> (classes, boxes) of every decoder layer; ``loss(outputs, targets)``."""

    def __init__(self, detector: Any) -> None:
        super().__init__()
        self.detector = detector
        detector.loss_function = _every_layer

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self._image_size = (images.shape[-2], images.shape[-1])  # the loss normalises boxes by it
        outputs = self.detector(pixel_values=images, labels=_KEEP_EVERY_LAYER)
        outputs_class, outputs_coord = outputs.auxiliary_outputs
        return outputs_class, outputs_coord

    def loss(self, outputs: tuple[torch.Tensor, torch.Tensor], targets: torch.Tensor) -> torch.Tensor:
        from transformers.loss.loss_deformable_detr import DeformableDetrImageLoss
        from transformers.loss.loss_for_object_detection import _set_aux_loss

        config = self.detector.config
        outputs_class, outputs_coord = outputs
        labels = [_normalised(rows, self._image_size) for rows in target_rows(targets)]
        criterion = DeformableDetrImageLoss(
            matcher=HungarianMatcher(config.class_cost, config.bbox_cost, config.giou_cost),
            num_classes=config.num_labels,
            focal_alpha=config.focal_alpha,
            losses=["labels", "boxes", "cardinality"],
        )
        predictions = {
            "logits": outputs_class[-1],
            "pred_boxes": outputs_coord[-1],
            "auxiliary_outputs": _set_aux_loss(outputs_class, outputs_coord),
        }
        losses = criterion(predictions, labels)
        weights = {"loss_ce": 1.0, "loss_bbox": config.bbox_loss_coefficient, "loss_giou": config.giou_loss_coefficient}
        every_layer = dict(weights)
        for layer in range(config.decoder_layers - 1):
            every_layer.update({f"{name}_{layer}": weight for name, weight in weights.items()})
        return sum(losses[name] * weight for name, weight in every_layer.items() if name in losses)
