"""COCO detection data in its own layout: ``root/annotations/instances_train2017.json`` and the
images in ``root/train2017/``.

Each sample is the image resized to fit the workload's padded size keeping its aspect ratio (as
MMDetection resizes to fit 1333x800) and padded at the bottom and right, ImageNet-normalised, with
a target of ``MAX_OBJECTS`` rows (class index 0..79 in sorted category-id order, x1, y1, x2, y2 in
pixels of the resized image); unused rows have class -1. Crowd annotations are left out, as
detectors' training pipelines do.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from core.errors import ConfigError

ANNOTATIONS = Path("annotations") / "instances_train2017.json"
IMAGES = "train2017"
#: rows per target; objects beyond it are dropped (COCO images rarely have more annotations)
MAX_OBJECTS = 100
_MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
_STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


def is_coco(path: Path) -> bool:
    return (path / ANNOTATIONS).is_file()


def _field_error(document: Path, field: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError("data", f"{document}: {field} = {value!r}", allowed)


def _boxes_by_image(document: Path, annotations: list[Any], class_of: dict[int, int]) -> dict[int, list[list[float]]]:
    boxes: dict[int, list[list[float]]] = {}
    for index, annotation in enumerate(annotations):
        bbox = annotation.get("bbox")
        if not (isinstance(bbox, list) and len(bbox) == 4 and all(isinstance(v, (int, float)) for v in bbox)):
            raise _field_error(document, f"annotations[{index}].bbox", bbox, "[x, y, width, height] in pixels")
        if annotation.get("category_id") not in class_of:
            raise _field_error(
                document, f"annotations[{index}].category_id", annotation.get("category_id"), "an id of categories[]"
            )
        if annotation.get("iscrowd", 0):
            continue
        x, y, width, height = bbox
        if width > 0 and height > 0:
            row = [float(class_of[annotation["category_id"]]), x, y, x + width, y + height]
            boxes.setdefault(annotation.get("image_id", -1), []).append(row)
    return boxes


class CocoDetection(Dataset):
    def __init__(self, root: Path, image_shape: tuple[int, int, int]) -> None:
        document = root / ANNOTATIONS
        if not document.is_file():
            raise ConfigError("data", str(root), f"a COCO folder needs {ANNOTATIONS}")
        content = json.loads(document.read_text())
        for key in ("images", "annotations", "categories"):
            if not isinstance(content.get(key), list):
                raise _field_error(document, key, content.get(key), "a list (COCO's instances layout)")
        class_of = {c["id"]: index for index, c in enumerate(sorted(content["categories"], key=lambda c: c["id"]))}
        boxes = _boxes_by_image(document, content["annotations"], class_of)
        self.samples = []
        for index, image in enumerate(content["images"]):
            if not isinstance(image.get("file_name"), str):
                raise _field_error(document, f"images[{index}].file_name", image.get("file_name"), "a file name")
            self.samples.append((root / IMAGES / image["file_name"], boxes.get(image.get("id"), [])))
        if not self.samples:
            raise _field_error(document, "images", [], "at least one image")
        self.image_shape = image_shape

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        from PIL import Image

        path, rows = self.samples[index]
        _, height, width = self.image_shape
        with Image.open(path) as image:
            scale = min(height / image.height, width / image.width)
            resized = image.convert("RGB").resize(
                (max(1, round(image.width * scale)), max(1, round(image.height * scale))), Image.Resampling.BILINEAR
            )
            array = np.asarray(resized, dtype=np.float32) / 255.0
        canvas = torch.zeros(3, height, width)
        picture = (torch.from_numpy(array.copy()).permute(2, 0, 1) - _MEAN) / _STD
        canvas[:, : picture.shape[1], : picture.shape[2]] = picture
        target = torch.full((MAX_OBJECTS, 5), -1.0)
        if rows:
            kept = torch.tensor(rows[:MAX_OBJECTS])
            kept[:, 1:] *= scale
            target[: len(kept)] = kept
        return canvas, target
