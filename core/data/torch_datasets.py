"""PyTorch datasets over real files: an image-folder tree, WebDataset-style tar shards, and a
flat token file. Each yields (input, target) samples shaped like the workload's synthetic pool,
so a model runs unchanged on either."""

from __future__ import annotations

import bisect
import itertools
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from core.base.deprecation import REMOVED_IN, warn_deprecated
from core.base.errors import DataError
from core.data.files import (
    MAX_IMAGE_FILE_BYTES,
    MAX_SAMPLE_BYTES,
    MAX_SAMPLE_MEMBERS,
    MAX_SHARD_MEMBER_BYTES,
    open_image,
    opened_data_file,
    read_data_file,
)
from core.data.listing import image_folder, shard_files
from core.data.split_index import IMAGE_MEMBER_EXTENSIONS, LABEL_MEMBER_EXTENSION, split_shards
from core.data.tar_headers import BoundedTarInfo, ExtendedHeaderError, check_archive_end

# ImageNet channel statistics: the normalisation every ImageNet-trained vision model expects.
_MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
_STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


def decode_image(data: bytes, channels: int, height: int, width: int, source: str = "an image") -> torch.Tensor:
    """Encoded image bytes -> float tensor [C, H, W], resized and normalised. ``source`` names the
    file (or shard member) in a DataError when the bytes are no image, or one too large."""
    from PIL import Image

    with open_image(data, source) as image:
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
        classes, self.samples = image_folder(root)
        self.classes = list(classes)
        self.image_shape = image_shape

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        path, label = self.samples[index]
        data = read_data_file(path, MAX_IMAGE_FILE_BYTES, "an image")
        return decode_image(data, *self.image_shape, str(path)), torch.tensor(label)


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

        def admit(name: str, size: int) -> None:
            """Before a member is read: what its sample would then hold must stay within the bound."""
            key = name.partition(".")[0]
            held = sum(map(len, parts.values())) if key == current_key else 0
            if held + size > MAX_SAMPLE_BYTES:
                raise DataError(
                    f"{shard}: sample {key!r} would hold {held + size:,} bytes with member {name!r}, more than "
                    f"the {MAX_SAMPLE_BYTES:,} allowed for one sample (a tar or compression bomb?)"
                )

        for name, data in _shard_members(shard, admit):
            key, _, extension = name.partition(".")
            if key != current_key:
                if parts:
                    yield self._sample(shard, current_key, parts)
                current_key, parts = key, {}
            if len(parts) >= MAX_SAMPLE_MEMBERS:
                raise DataError(f"{shard}: sample {key!r} has more than the {MAX_SAMPLE_MEMBERS} members allowed")
            parts[extension.lower()] = data
        if parts:
            yield self._sample(shard, current_key, parts)

    def _sample(self, shard: Path, key: str | None, parts: dict[str, bytes]) -> tuple[torch.Tensor, torch.Tensor]:
        image_extension = next((e for e in IMAGE_MEMBER_EXTENSIONS if e in parts), None)
        label = parts.get(LABEL_MEMBER_EXTENSION)
        if image_extension is None or label is None:
            raise DataError(
                f"{shard}: sample {key!r} needs an image (.jpg/.png) and a .cls label; found {sorted(parts)}"
            )
        target = class_label(label, f"{shard}: member '{key}.cls'")
        image = decode_image(parts[image_extension], *self.image_shape, f"{shard}: member '{key}.{image_extension}'")
        return image, torch.tensor(target)


def class_label(text: bytes, source: str) -> int:
    """A ``.cls`` member's class: a whole number in decimal text; DataError naming ``source`` otherwise."""
    try:
        return int(text.decode("ascii").strip())
    except ValueError:  # UnicodeDecodeError included
        raise DataError(f"{source}: {text[:40]!r} is not a whole-number class label") from None


class IndexedShards(Dataset):
    """The samples of a split's tar shards, read one by one at the offsets their member headers give
    (core.data.split_index: indexed once, cached): a run to a target reads them in
    :class:`core.data.epoch_order.EpochOrder`'s order, as it reads an image folder. Sample ``i`` is
    the ``i``-th of the shards in name order, each in member order."""

    def __init__(self, split: Path, image_shape: tuple[int, int, int]) -> None:
        self.shards = split_shards(split)
        self.image_shape = image_shape
        self._starts = list(itertools.accumulate((len(shard) for shard in self.shards), initial=0))

    def __len__(self) -> int:
        return self._starts[-1]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        which = bisect.bisect_right(self._starts, index) - 1
        shard, position = self.shards[which], index - self._starts[which]
        where = f"{shard.shard}: sample {position} (the member at byte {shard.image_offsets[position]:,})"
        with opened_data_file(shard.shard, "a shard") as (stream, _):
            image = _read_at(stream, shard.image_offsets[position], shard.image_sizes[position], where)
            label = _read_at(stream, shard.label_offsets[position], shard.label_sizes[position], where)
        return decode_image(image, *self.image_shape, where), torch.tensor(class_label(label, f"{where}'s label"))


def _read_at(stream: IO[bytes], offset: int, size: int, where: str) -> bytes:
    """``size`` bytes at ``offset`` (sizes were bounded when the shard was indexed)."""
    stream.seek(offset)
    data = stream.read(size)
    if len(data) != size:
        raise DataError(f"{where}: the shard ends {size - len(data):,} bytes early (changed since it was indexed?)")
    return data


def _shard_members(shard: Path, admit: Callable[[str, int], None] | None = None) -> Iterator[tuple[str, bytes]]:
    """(name, contents) of each regular member of a tar shard, in order, each read whole after its
    header's size is checked against :data:`MAX_SHARD_MEMBER_BYTES` and by ``admit(name, size)``,
    which raises to refuse it; DataError naming the shard (and the member) when it is no readable
    tar file."""
    with opened_data_file(shard, "a shard") as (stream, _):
        yield from _tar_members(shard, stream, admit)


def _tar_members(
    shard: Path, stream: IO[bytes], admit: Callable[[str, int], None] | None = None
) -> Iterator[tuple[str, bytes]]:
    name, first = "(its first member)", True
    try:
        # Read front to back, compressed or not; nothing is held but the current member (tarfile's
        # list of the members seen is emptied as it goes); extended headers are bounded before
        # tarfile parses them.
        with tarfile.open(fileobj=stream, mode="r:*", tarinfo=BoundedTarInfo) as archive:
            for member in archive:
                archive.members = []  # type: ignore[attr-defined]  # tarfile's own list, not in its stubs
                name, first = member.name, False
                if not member.isfile():
                    continue
                if member.size > MAX_SHARD_MEMBER_BYTES:
                    raise DataError(
                        f"{shard}: member {name!r} is {member.size:,} bytes, more than the "
                        f"{MAX_SHARD_MEMBER_BYTES:,} allowed for one (a tar or compression bomb?)"
                    )
                if admit is not None:
                    admit(name, member.size)
                reader = archive.extractfile(member)
                yield name, reader.read() if reader is not None else b""
            check_archive_end(shard, archive, name)
    except DataError:
        raise
    except ExtendedHeaderError as error:
        where = "" if first else f" after member {name!r}:"
        raise DataError(f"{shard}:{where} {error}") from None
    except MemoryError:
        raise DataError(f"{shard}: out of memory reading member {name!r}") from None
    except Exception as error:  # tarfile.ReadError, and what a damaged compressed stream raises
        problem = f"{type(error).__name__}: {error}"
        raise DataError(f"{shard}: not a readable tar file at member {name!r}: {problem}") from None


class TokenFile(Dataset):
    """A flat file of token ids (nanoGPT-style ``.bin`` of uint16, or a 1-D ``.npy``), cut into
    consecutive windows of ``sequence_length`` tokens; the target of a window is the window itself
    (language-model losses shift or mask inside the model's loss).

    :param vocabulary: the model's vocabulary size: every id served must lie in [0, vocabulary), or
        the model's embedding would fail with an IndexError naming no file. None checks nothing.
    """

    def __init__(self, path: Path, sequence_length: int, dtype: str = "uint16", vocabulary: int | None = None) -> None:
        self.path = path
        self.tokens = np.load(path, mmap_mode="r") if path.suffix == ".npy" else np.memmap(path, dtype=dtype, mode="r")
        if self.tokens.ndim != 1:
            raise ValueError(f"{path}: expected a 1-D array of token ids, got shape {self.tokens.shape}")
        self.sequence_length = sequence_length
        self.vocabulary = vocabulary
        if len(self.tokens) < sequence_length:
            raise ValueError(f"{path}: {len(self.tokens)} tokens, fewer than one sequence of {sequence_length}")

    def __len__(self) -> int:
        return len(self.tokens) // self.sequence_length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = index * self.sequence_length
        # A copy: the memory map is read-only, and torch.from_numpy warns about a read-only array.
        ids = np.array(self.tokens[start : start + self.sequence_length])
        if self.vocabulary is not None:
            self._check_ids(ids, start)
        window = torch.from_numpy(ids.astype(np.int64, copy=False))
        return window, window

    def _check_ids(self, ids: np.ndarray, start: int) -> None:
        """Checked in the file's own dtype, before the cast to int64 could wrap a large id round."""
        assert self.vocabulary is not None
        low, high = ids.min(), ids.max()
        if low >= 0 and high < self.vocabulary:
            return
        position = int(np.argmax((ids < 0) | (ids >= self.vocabulary)))
        raise DataError(
            f"{self.path}: token id {ids[position]} at token offset {start + position:,} is outside the "
            f"vocabulary of {self.vocabulary:,} (allowed: 0 to {self.vocabulary - 1:,})"
        )


def torch_dataset(
    path: Path, data_format: str, pool_inputs: torch.Tensor, rank: int, world_size: int, vocabulary: int | None = None
) -> Any:
    """The dataset for ``path``, shaped after the workload's synthetic inputs.

    :param vocabulary: for token data, the model's vocabulary size, which every token id is checked
        against (``TorchTrainingSpec.vocabulary``); None checks nothing."""
    sample_shape = tuple(pool_inputs.shape[1:])
    if data_format == "tokens":
        if pool_inputs.dtype not in (torch.int64, torch.int32) or len(sample_shape) != 1:
            raise ValueError("token data needs a workload whose inputs are token ids [sequence_length]")
        return TokenFile(path, sequence_length=sample_shape[0], vocabulary=vocabulary)
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
    return WebDatasetShards(shard_files(path), sample_shape, rank, world_size)


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
