"""Cityscapes in its own folder layout: ``root/leftImg8bit/train/<city>/*_leftImg8bit.png`` and the
label maps ``root/gtFine/train/<city>/*_gtFine_labelTrainIds.png`` (train ids 0..18, 255 unlabelled,
as cityscapesScripts' ``createTrainIdLabelImgs`` writes them).

Each sample is a crop of the workload's crop size from the full-resolution frame (Cityscapes frames
are 2048x1024), its position fixed per frame, padded with label 255 where a frame is smaller;
MMSegmentation also rescales each frame at random before cropping, which is left out here.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from core.base.errors import DataError
from core.data.files import MAX_IMAGE_FILE_BYTES, open_image, read_data_file
from core.data.listing import cityscapes_pairs

IGNORE_INDEX = 255
_MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
_STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


class CityscapesSegmentation(Dataset):
    def __init__(self, root: Path, image_shape: tuple[int, int, int]) -> None:
        self.samples = cityscapes_pairs(root)
        _, self.height, self.width = image_shape

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image_path, label_path = self.samples[index]
        image = open_image(read_data_file(image_path, MAX_IMAGE_FILE_BYTES, "an image"), str(image_path))
        label = open_image(read_data_file(label_path, MAX_IMAGE_FILE_BYTES, "a label map"), str(label_path))
        with image, label:
            if image.size != label.size:
                raise DataError(f"{label_path}: {label.size[0]} x {label.size[1]}, not its image's size {image.size}")
            pixels = np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
            train_ids = np.asarray(label, dtype=np.uint8)
        picture = torch.zeros(3, max(self.height, pixels.shape[0]), max(self.width, pixels.shape[1]))
        mask = torch.full(picture.shape[1:], IGNORE_INDEX, dtype=torch.uint8)
        picture[:, : pixels.shape[0], : pixels.shape[1]] = (
            torch.from_numpy(pixels.copy()).permute(2, 0, 1) - _MEAN
        ) / _STD
        mask[: pixels.shape[0], : pixels.shape[1]] = torch.from_numpy(train_ids.copy())
        place = random.Random(index)  # the same crop of a frame every epoch, for repeatable runs
        top = place.randint(0, picture.shape[1] - self.height)
        left = place.randint(0, picture.shape[2] - self.width)
        return (
            picture[:, top : top + self.height, left : left + self.width].contiguous(),
            mask[top : top + self.height, left : left + self.width].contiguous(),
        )
