"""PyTorch datasets over real files: an image-folder tree, WebDataset-style tar shards, and a
flat token file. Each yields (input, target) samples shaped like the workload's synthetic pool,
so a model runs unchanged on either."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from core.data import IMAGE_SUFFIXES
from core.deprecation import REMOVED_IN, warn_deprecated

# ImageNet channel statistics: the normalisation every ImageNet-trained vision model expects.
_MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
_STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


def decode_image(data: bytes, channels: int, height: int, width: int) -> torch.Tensor:
    """Encoded image bytes -> float tensor [C, H, W], resized and normalised."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        image = image.convert("RGB" if channels == 3 else "L").resize((width, height), Image.Resampling.BILINEAR)
        array = np.asarray(image, dtype=np.float32) / 255.0
    tensor = torch.from_numpy(array.copy())
    tensor = tensor.permute(2, 0, 1) if tensor.dim() == 3 else tensor.unsqueeze(0)
    if channels == 3:
        tensor = (tensor - _MEAN) / _STD
    return tensor


class ImageFolder(Dataset):
    """root/<class>/<image>: classes numbered in sorted folder order (torchvision's convention)."""

    def __init__(self, root: Path, image_shape: tuple[int, int, int]) -> None:
        self.classes = sorted(entry.name for entry in root.iterdir() if entry.is_dir())
        self.samples = [
            (path, label)
            for label, name in enumerate(self.classes)
            for path in sorted((root / name).iterdir())
            if path.suffix.lower() in IMAGE_SUFFIXES
        ]
        if not self.samples:
            raise ValueError(f"no images ({', '.join(IMAGE_SUFFIXES)}) under {root}/<class>/")
        self.image_shape = image_shape

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        path, label = self.samples[index]
        return decode_image(path.read_bytes(), *self.image_shape), torch.tensor(label)


class WebDatasetShards(IterableDataset):
    """Tar shards whose members group by key: ``000017.jpg`` + ``000017.cls`` is one sample.

    Shards are split between ranks and then between loader workers, so every sample is read by
    exactly one worker of one rank per pass; passes repeat for as long as training asks.
    """

    def __init__(
        self, shards: list[Path], image_shape: tuple[int, int, int], rank: int = 0, world_size: int = 1
    ) -> None:
        if not shards:
            raise ValueError("no .tar shards")
        self.shards = shards
        self.image_shape = image_shape
        self.rank, self.world_size = rank, world_size

    def _my_shards(self) -> list[Path]:
        worker = get_worker_info()
        workers, worker_id = (worker.num_workers, worker.id) if worker else (1, 0)
        position, stride = self.rank * workers + worker_id, self.world_size * workers
        mine = self.shards[position::stride]
        # Fewer shards than readers: share them round-robin rather than leave a reader idle forever.
        return mine or [self.shards[position % len(self.shards)]]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            for shard in self._my_shards():
                yield from self._samples(shard)

    def _samples(self, shard: Path) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        current_key: str | None = None
        parts: dict[str, bytes] = {}
        with tarfile.open(shard) as archive:
            for member in archive:
                if not member.isfile():
                    continue
                key, _, extension = member.name.partition(".")
                if key != current_key:
                    if parts:
                        yield self._sample(parts)
                    current_key, parts = key, {}
                reader = archive.extractfile(member)
                assert reader is not None
                parts[extension.lower()] = reader.read()
            if parts:
                yield self._sample(parts)

    def _sample(self, parts: dict[str, bytes]) -> tuple[torch.Tensor, torch.Tensor]:
        image = next((parts[e] for e in ("jpg", "jpeg", "png", "webp") if e in parts), None)
        label = parts.get("cls")
        if image is None or label is None:
            raise ValueError(f"WebDataset sample needs an image (.jpg/.png) and a .cls label; found {sorted(parts)}")
        return decode_image(image, *self.image_shape), torch.tensor(int(label.decode().strip()))


class TokenFile(Dataset):
    """A flat file of token ids (nanoGPT-style ``.bin`` of uint16, or a 1-D ``.npy``), cut into
    consecutive windows of ``sequence_length`` tokens; the target of a window is the window itself
    (language-model losses shift or mask inside the model's loss)."""

    def __init__(self, path: Path, sequence_length: int, dtype: str = "uint16") -> None:
        self.tokens = np.load(path, mmap_mode="r") if path.suffix == ".npy" else np.memmap(path, dtype=dtype, mode="r")
        if self.tokens.ndim != 1:
            raise ValueError(f"{path}: expected a 1-D array of token ids, got shape {self.tokens.shape}")
        self.sequence_length = sequence_length
        if len(self.tokens) < sequence_length:
            raise ValueError(f"{path}: {len(self.tokens)} tokens, fewer than one sequence of {sequence_length}")

    def __len__(self) -> int:
        return len(self.tokens) // self.sequence_length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = index * self.sequence_length
        window = torch.from_numpy(np.asarray(self.tokens[start : start + self.sequence_length], dtype=np.int64))
        return window, window


def torch_dataset(path: Path, data_format: str, pool_inputs: torch.Tensor, rank: int, world_size: int) -> Any:
    """The dataset for ``path``, shaped after the workload's synthetic inputs."""
    sample_shape = tuple(pool_inputs.shape[1:])
    if data_format == "tokens":
        if pool_inputs.dtype not in (torch.int64, torch.int32) or len(sample_shape) != 1:
            raise ValueError("token data needs a workload whose inputs are token ids [sequence_length]")
        return TokenFile(path, sequence_length=sample_shape[0])
    if len(sample_shape) != 3:
        raise ValueError(
            f"image data needs a workload whose inputs are images [C, H, W]; this one takes {sample_shape}"
        )
    if data_format == "image-folder":
        return ImageFolder(path, sample_shape)
    if data_format == "coco":
        from core.data.coco import CocoDetection

        return CocoDetection(path, sample_shape)
    if data_format == "cityscapes":
        from core.data.cityscapes import CityscapesSegmentation

        return CityscapesSegmentation(path, sample_shape)
    shards = [path] if path.is_file() else sorted(path.glob("*.tar"))
    return WebDatasetShards(shards, sample_shape, rank, world_size)


def __getattr__(name: str) -> Any:
    # ``make_dataset`` was this function's name until the plugin API exported it as
    # ``core.plugin.torch_dataset``; plugins that imported the old name keep working for a release.
    if name == "make_dataset":
        warn_deprecated(
            "core.data.torch_datasets.make_dataset is now core.plugin.torch_dataset; "
            f"the old name goes in core {REMOVED_IN}",
            removed_in=REMOVED_IN,
        )
        return torch_dataset
    raise AttributeError(f"module 'core.data.torch_datasets' has no attribute {name!r}")
