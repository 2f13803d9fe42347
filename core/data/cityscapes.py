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

from core.errors import ConfigError

IMAGES = Path("leftImg8bit") / "train"
LABELS = Path("gtFine") / "train"
IMAGE_SUFFIX = "_leftImg8bit.png"
LABEL_SUFFIX = "_gtFine_labelTrainIds.png"
IGNORE_INDEX = 255
_MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
_STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


def is_cityscapes(path: Path) -> bool:
    return (path / IMAGES).is_dir()


class CityscapesSegmentation(Dataset):
    def __init__(self, root: Path, image_shape: tuple[int, int, int]) -> None:
        if not (root / IMAGES).is_dir():
            raise ConfigError("data", str(root), f"a Cityscapes folder needs {IMAGES}/<city>/*{IMAGE_SUFFIX}")
        self.samples = []
        for image in sorted((root / IMAGES).glob(f"*/*{IMAGE_SUFFIX}")):
            frame = image.name[: -len(IMAGE_SUFFIX)]
            label = root / LABELS / image.parent.name / f"{frame}{LABEL_SUFFIX}"
            if not label.is_file():
                raise ConfigError(
                    "data", str(image), f"no label map {label.relative_to(root)} (run createTrainIdLabelImgs)"
                )
            self.samples.append((image, label))
        if not self.samples:
            raise ConfigError("data", str(root), f"no images {IMAGES}/<city>/*{IMAGE_SUFFIX}")
        _, self.height, self.width = image_shape

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        from PIL import Image

        image_path, label_path = self.samples[index]
        with Image.open(image_path) as image, Image.open(label_path) as label:
            if image.size != label.size:
                raise ConfigError("data", str(label_path), f"a label map of the image's size {image.size}")
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
