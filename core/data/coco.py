"""COCO detection data in its own layout: ``root/annotations/instances_train2017.json`` and the
images in ``root/train2017/``.

Each sample is the image resized to fit the workload's padded size keeping its aspect ratio (as
MMDetection resizes to fit 1333x800) and padded at the bottom and right, ImageNet-normalised, with
a target of ``MAX_OBJECTS`` rows (class index 0..79 in sorted category-id order, x1, y1, x2, y2 in
pixels of the resized image); unused rows have class -1. Crowd annotations are left out, as
detectors' training pipelines do.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from core.data.files import MAX_IMAGE_FILE_BYTES, open_image, read_data_file
from core.data.listing import coco_samples

#: rows per target; objects beyond it are dropped (COCO images rarely have more annotations)
MAX_OBJECTS = 100
_MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
_STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


class CocoDetection(Dataset):
    """The annotation file is checked while planning (``core.data.listing.coco_samples``): boxes,
    categories, and every ``file_name`` a regular file inside ``train2017/``."""

    def __init__(self, root: Path, image_shape: tuple[int, int, int]) -> None:
        self.samples = coco_samples(root)
        self.image_shape = image_shape

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        from PIL import Image

        path, rows = self.samples[index]
        _, height, width = self.image_shape
        with open_image(read_data_file(path, MAX_IMAGE_FILE_BYTES, "an image"), str(path)) as image:
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
