"""What a dataset holds, from its folder layout and its index files, without decoding a sample.

Planning lists the dataset (:func:`check_dataset`), so a bad one is refused before any device is
touched: a ConfigError naming ``data``, the file (and the entry of an index file) and the problem.
Every file a sample is read from must be a regular file after its links are followed: a link to a
device or a FIFO would block or never end. The datasets list it again in setup; the costly listings
(an ImageNet folder, COCO's annotation file) come from a cache then, while the files are unchanged.

Nothing here imports a framework.
"""

from __future__ import annotations

import functools
import math
import os
import stat
from array import array
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any, TypeGuard

from core.base.errors import ConfigError
from core.base.files import parse_json
from core.data import HELD_OUT_SPLIT, IMAGE_SUFFIXES, TOKEN_SUFFIXES, TRAIN_SPLIT
from core.data.files import file_problem

SHARD_SUFFIXES = (".tar",)
RECORD_SUFFIXES = (".tfrecord", ".tfrecords")

COCO_ANNOTATIONS = Path("annotations") / "instances_train2017.json"
COCO_IMAGES = "train2017"
CITYSCAPES_IMAGES = Path("leftImg8bit") / "train"
CITYSCAPES_LABELS = Path("gtFine") / "train"
CITYSCAPES_IMAGE_SUFFIX = "_leftImg8bit.png"
CITYSCAPES_LABEL_SUFFIX = "_gtFine_labelTrainIds.png"

#: (image file, class index) in sorted class-folder order
ImageSamples = tuple[tuple[Path, int], ...]
#: (image file, rows of (class, x1, y1, x2, y2) in pixels)
CocoSamples = tuple[tuple[Path, tuple[tuple[float, ...], ...]], ...]


def _refuse(file: Path | str, problem: str) -> ConfigError:
    return ConfigError("data", str(file), problem)


def _require_regular(file: Path, what: str) -> None:
    problem = file_problem(file)
    if problem is not None:
        raise _refuse(file, f"{problem}; {what} must be a regular file")


# --- image folders ---------------------------------------------------------------------------------


def image_folder(root: Path) -> tuple[tuple[str, ...], ImageSamples]:
    """(classes, samples) of ``root/<class>/<image>``: classes numbered in sorted folder order
    (torchvision's convention), images in name order within each."""
    try:
        classes = tuple(sorted(entry.name for entry in os.scandir(root) if entry.is_dir()))
        # A class folder's modification time changes when an image is added or removed.
        signature = tuple(os.stat(root / name).st_mtime_ns for name in classes)
    except OSError as error:
        raise _refuse(root, f"cannot list it: {error.strerror or error}") from None
    return classes, _image_samples(str(root), classes, signature)


@functools.lru_cache(maxsize=1)
def _image_samples(root: str, classes: tuple[str, ...], signature: tuple[int, ...]) -> ImageSamples:
    samples: list[tuple[Path, int]] = []
    for label, name in enumerate(classes):
        folder = Path(root) / name
        try:
            entries = sorted((e for e in os.scandir(folder) if _is_image_name(e.name)), key=lambda e: e.name)
        except OSError as error:
            raise _refuse(folder, f"cannot list it: {error.strerror or error}") from None
        for entry in entries:
            # is_file() follows links and is true for regular files only; the usual case needs no stat.
            if not entry.is_file():
                _require_regular(folder / entry.name, "an image of an image folder")
            samples.append((folder / entry.name, label))
    if not samples:
        raise _refuse(root, f"no images ({', '.join(IMAGE_SUFFIXES)}) under {root}/<class>/")
    return tuple(samples)


#: what a run to a target reads from files, said in its refusals
SPLIT_LAYOUT = (
    f"a data set split into {TRAIN_SPLIT}/ and {HELD_OUT_SPLIT}/ (training, evaluation): an image folder "
    f"(DATA/{TRAIN_SPLIT}/<class>/<image>, DATA/{HELD_OUT_SPLIT}/<class>/<image>, the same class folders in both), "
    f"WebDataset shards (DATA/{TRAIN_SPLIT}/*.tar, DATA/{HELD_OUT_SPLIT}/*.tar), TFRecord files "
    f"(DATA/{TRAIN_SPLIT}/*.tfrecord, DATA/{HELD_OUT_SPLIT}/*.tfrecord), or token files (nanoGPT's layout: "
    f"DATA/{TRAIN_SPLIT}.bin and DATA/{HELD_OUT_SPLIT}.bin, or .npy)"
)


def image_folder_splits(root: Path) -> tuple[Path, Path]:
    """The (training, held-out) image folders of ``root``, each listed (:func:`image_folder`), with the
    same classes: a class is numbered by its place among them, so a held-out folder with a class more
    or less would label its images wrong. ConfigError naming ``data`` where a split is missing, holds
    no class folders of images (no labels), or the classes differ."""
    splits = []
    for split, role in ((TRAIN_SPLIT, "training"), (HELD_OUT_SPLIT, "held-out")):
        folder = root / split
        if not folder.is_dir():
            raise _refuse(root, f"no {split}/ folder (the {role} split); a run to a target reads {SPLIT_LAYOUT}")
        if not any(entry.is_dir() for entry in os.scandir(folder)):
            raise _refuse(folder, f"no class folders, so no labels; a run to a target reads {SPLIT_LAYOUT}")
        splits.append((folder, image_folder(folder)[0]))
    (train, train_classes), (held_out, held_out_classes) = splits
    if train_classes != held_out_classes:
        only_train = sorted(set(train_classes) - set(held_out_classes))
        only_held_out = sorted(set(held_out_classes) - set(train_classes))
        raise _refuse(
            root,
            f"the splits' classes differ (only in {TRAIN_SPLIT}/: {only_train or 'none'}; only in "
            f"{HELD_OUT_SPLIT}/: {only_held_out or 'none'}); a run to a target reads {SPLIT_LAYOUT}",
        )
    return train, held_out


#: the formats whose training and held-out splits a run to a target reads (:func:`target_splits`);
#: the frameworks whose executor reads each are core.data.FORMAT_FRAMEWORKS' (image folders, shards
#: and token files PyTorch's, TFRecord files Keras'): planning refuses the rest, naming ``data``
TARGET_SPLIT_FORMATS: tuple[str, ...] = ("image-folder", "webdataset", "tfrecord", "tokens")


def split_path(root: Path, split: str) -> Path | None:
    """Where ``root``'s split ``split`` ("train", "val") is: the folder ``root/split``, or a token file
    ``root/split.bin`` or ``root/split.npy`` (nanoGPT's prepare scripts write train.bin and val.bin);
    None where there is none. ConfigError naming ``data`` where two are there: which one is meant is
    not for core to guess."""
    found = [
        path
        for path in (root / split, *(root / f"{split}{suffix}" for suffix in TOKEN_SUFFIXES))
        if os.path.lexists(path)
    ]
    if len(found) > 1:
        names = ", ".join(path.name for path in found)
        raise _refuse(root, f"{names}: one {split} split, a folder or a token file, not {len(found)}")
    return found[0] if found else None


def target_splits(root: Path, data_format: str) -> tuple[str, Path, Path]:
    """(format, training split, held-out split) of a data set laid out for a run to a target:
    ``root/train`` and ``root/val``, each a data set of one format (``data_format``, or the training
    split's own where it is "auto"), the held-out one of the same; or token files ``root/train.bin`` and
    ``root/val.bin`` (:func:`split_path`). An image folder's splits are checked as
    :func:`image_folder_splits` checks them. ConfigError naming ``data`` otherwise, saying the layout."""
    from core.data import detect_format

    splits = []
    for split, role in ((TRAIN_SPLIT, "training"), (HELD_OUT_SPLIT, "held-out")):
        path = split_path(root, split)
        if path is None:
            raise _refuse(root, f"no {split}/ folder (the {role} split); a run to a target reads {SPLIT_LAYOUT}")
        splits.append(path)
    training, held_out = splits
    found = detect_format(training) if data_format == "auto" else data_format
    if found not in TARGET_SPLIT_FORMATS:
        raise _refuse(
            root,
            f"{found} splits; a run to a target reads its splits from files as {SPLIT_LAYOUT} "
            f"(formats: {', '.join(TARGET_SPLIT_FORMATS)})",
        )
    if found == "image-folder":
        return (found, *image_folder_splits(root))
    held_out_format = detect_format(held_out)
    if held_out_format != found:
        raise _refuse(held_out, f"{held_out_format} data, not {found} as in {training}; the splits must be alike")
    return found, training, held_out


def _is_image_name(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in IMAGE_SUFFIXES


# --- shards and record files -----------------------------------------------------------------------


def shard_files(path: Path) -> list[Path]:
    """The WebDataset shards at ``path``: the file itself, or a folder's ``*.tar``."""
    return _data_files(path, SHARD_SUFFIXES, "a shard")


def record_files(path: Path) -> list[Path]:
    """The TFRecord files at ``path``: the file itself, or a folder's ``*.tfrecord``/``*.tfrecords``,
    each framed as records that fit the file (:func:`record_frames`)."""
    files = _data_files(path, RECORD_SUFFIXES, "a TFRecord file")
    for file in files:
        info = os.stat(file)
        _record_frames(str(file), info.st_mtime_ns, info.st_size)
    return files


#: a TFRecord's frame: the record's length (uint64), its CRC, the data, the data's CRC
_RECORD_HEADER_BYTES, _RECORD_CRC_BYTES = 12, 4


def record_frames(file: Path) -> tuple[array[int], array[int]]:
    """(each record's data offset, its length in bytes) of a TFRecord file, from its framing
    (:func:`_record_frames`): the records counted and found without reading one."""
    info = os.stat(file)
    return _record_frames(str(file), info.st_mtime_ns, info.st_size)


@functools.lru_cache(maxsize=8192)  # a sweep plans each cell: ImageNet has 1,024 train files
def _record_frames(file_text: str, modified: int, size: int) -> tuple[array[int], array[int]]:
    """Every record of a TFRecord file fits what is left of the file after its header: (data offsets,
    lengths) of its records.

    TensorFlow's reader allocates a record's declared length before reading it: a length field of
    a terabyte (a damaged or hostile file) crashed the process with a segmentation fault, losing
    the run. Only the 12-byte headers are read, one per record (a few seconds for ImageNet's
    1.28 million); the CRCs are TensorFlow's to check."""
    file = Path(file_text)
    offsets, lengths = array("q"), array("q")
    try:
        descriptor = os.open(file, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        raise _refuse(file, f"cannot open it: {error.strerror or error}") from None
    try:
        offset = 0
        while offset < size:
            header = os.pread(descriptor, _RECORD_HEADER_BYTES, offset)
            if len(header) < _RECORD_HEADER_BYTES:
                raise _refuse(file, f"cut off at byte {offset:,}: a record header needs 12 bytes, {len(header)} remain")
            length = int.from_bytes(header[:8], "little")
            left = size - offset - _RECORD_HEADER_BYTES - _RECORD_CRC_BYTES
            if length > left:
                raise _refuse(
                    file,
                    f"the record at byte {offset:,} declares {length:,} bytes, but only {max(left, 0):,} follow it: "
                    "not a TFRecord file, or a damaged or cut-off one",
                )
            offsets.append(offset + _RECORD_HEADER_BYTES)
            lengths.append(length)
            offset += _RECORD_HEADER_BYTES + length + _RECORD_CRC_BYTES
    except OSError as error:
        raise _refuse(file, f"cannot read it: {error.strerror or error}") from None
    finally:
        os.close(descriptor)
    return offsets, lengths


def _data_files(path: Path, suffixes: tuple[str, ...], what: str) -> list[Path]:
    if path.is_dir():
        try:
            files = sorted(entry for entry in path.iterdir() if entry.suffix in suffixes)
        except OSError as error:
            raise _refuse(path, f"cannot list it: {error.strerror or error}") from None
        if not files:
            raise _refuse(path, f"no {'/'.join(suffixes)} files in this folder")
    else:
        files = [path]
    for file in files:
        _require_regular(file, what)
    return files


# --- token files -----------------------------------------------------------------------------------


def check_token_file(path: Path) -> None:
    """A flat ``.bin`` of uint16 token ids (nanoGPT's layout) or a 1-D integer ``.npy``."""
    _require_regular(path, "a token file")
    if path.suffix != ".npy":
        size = path.stat().st_size
        if size == 0 or size % 2:
            raise _refuse(path, f"{size} bytes: a .bin token file holds whole uint16 token ids (2 bytes each)")
        return
    import numpy as np

    try:
        tokens = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as error:  # numpy raises ValueError, OSError, EOFError, ... on a damaged file
        # numpy's own text may run on over lines with advice to trust the file (allow_pickle=True): its first line.
        said = next(iter(str(error).strip().splitlines()), "")
        raise _refuse(path, f"not a .npy array numpy can read: {type(error).__name__}: {said}") from None
    if not isinstance(tokens, np.ndarray) or tokens.ndim != 1 or tokens.dtype.kind not in "iu":
        shape = getattr(tokens, "shape", "?")
        raise _refuse(path, f"an array of {getattr(tokens, 'dtype', '?')} {shape}: a 1-D array of integer token ids")


#: token ids read at a time when a token file's ids are checked: 64 MiB of int64 at most
_TOKEN_CHUNK = 1 << 23


def check_token_vocabulary(path: Path, vocabulary: int, workload: str) -> None:
    """Every token id of the token file at ``path`` lies in [0, ``vocabulary``): ConfigError naming
    ``data`` (the file, the first id outside and where it is) otherwise. A run to a target reads every
    id of its splits, so an id the model cannot embed would stop it at some later epoch or evaluation;
    here it is refused before anything runs. The file is read once (about a second a GB), then cached
    while it is unchanged."""
    info = os.stat(path)
    outside = _first_id_outside(str(path), info.st_mtime_ns, info.st_size, vocabulary)
    if outside is not None:
        offset, token = outside
        raise _refuse(
            path,
            f"token id {token:,} at token offset {offset:,} is outside workload {workload!r}'s vocabulary of "
            f"{vocabulary:,} (allowed: 0 to {vocabulary - 1:,}); a GPT's is set with -o vocabulary=N",
        )


@functools.lru_cache(maxsize=16)
def _first_id_outside(path_text: str, modified: int, size: int, vocabulary: int) -> tuple[int, int] | None:
    """(offset, id) of the first token id outside [0, vocabulary) in a token file, or None."""
    import numpy as np

    tokens = _token_array(Path(path_text))
    for start in range(0, len(tokens), _TOKEN_CHUNK):
        chunk = np.asarray(tokens[start : start + _TOKEN_CHUNK])
        if chunk.size and (chunk.min() < 0 or chunk.max() >= vocabulary):
            position = int(np.argmax((chunk < 0) | (chunk >= vocabulary)))
            return start + position, int(chunk[position])
    return None


def _token_array(path: Path) -> Any:
    """The token ids of a file :func:`check_token_file` accepted, memory-mapped."""
    import numpy as np

    if path.suffix == ".npy":
        return np.load(path, mmap_mode="r", allow_pickle=False)
    return np.memmap(path, dtype=np.uint16, mode="r")


# --- COCO ------------------------------------------------------------------------------------------


def coco_samples(root: Path) -> CocoSamples:
    """Every image of ``root/annotations/instances_train2017.json`` with its boxes."""
    document = root / COCO_ANNOTATIONS
    problem = file_problem(document)
    if problem is not None:
        raise _refuse(root, f"a COCO folder needs {COCO_ANNOTATIONS}: {problem}")
    info = os.stat(document)
    return _coco_samples(str(root), info.st_mtime_ns, info.st_size)


def _entry_error(document: Path, entry: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError("data", f"{document}: {entry} = {value!r}", allowed)


@functools.lru_cache(maxsize=1)
def _coco_samples(root_text: str, modified: int, size: int) -> CocoSamples:
    root = Path(root_text)
    document = root / COCO_ANNOTATIONS
    try:
        with open(document, "rb") as stream:
            content = parse_json(stream.read())
    except MemoryError:
        raise _refuse(document, f"out of memory reading its {size:,} bytes of JSON") from None
    except (ValueError, OSError) as error:
        raise _refuse(document, f"not a JSON document core reads: {error}") from None
    if not isinstance(content, dict):
        raise _refuse(document, "a JSON object with images, annotations and categories (COCO's instances layout)")
    for key in ("images", "annotations", "categories"):
        if not isinstance(content.get(key), list):
            raise _entry_error(document, key, content.get(key), "a list (COCO's instances layout)")
    class_of = _coco_classes(document, content["categories"])
    boxes = _boxes_by_image(document, content["annotations"], class_of)
    images = _CocoImages(document, root / COCO_IMAGES)
    samples = []
    for index, image in enumerate(content["images"]):
        if not isinstance(image, dict) or not _is_int(image.get("id")):
            raise _entry_error(document, f"images[{index}]", image, "an object with an integer id and a file_name")
        path = images.path(index, image.get("file_name"))
        samples.append((path, tuple(boxes.get(image["id"], ()))))
    if not samples:
        raise _entry_error(document, "images", [], "at least one image")
    return tuple(samples)


def _coco_classes(document: Path, categories: list[Any]) -> dict[int, int]:
    """Category id -> class index 0..79, in sorted id order."""
    for index, category in enumerate(categories):
        if not isinstance(category, dict) or not _is_int(category.get("id")):
            raise _entry_error(document, f"categories[{index}]", category, "an object with an integer id")
    return {category["id"]: index for index, category in enumerate(sorted(categories, key=lambda c: c["id"]))}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_box(bbox: Any) -> TypeGuard[list[float]]:
    return (
        isinstance(bbox, list)
        and len(bbox) == 4
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in bbox)
    )


def _boxes_by_image(
    document: Path, annotations: list[Any], class_of: dict[int, int]
) -> dict[int, list[tuple[float, ...]]]:
    boxes: dict[int, list[tuple[float, ...]]] = {}
    for index, annotation in enumerate(annotations):
        if not isinstance(annotation, dict) or not _is_int(annotation.get("image_id")):
            allowed = "an object with an integer image_id, a bbox and a category_id"
            raise _entry_error(document, f"annotations[{index}]", annotation, allowed)
        bbox = annotation.get("bbox")
        if not _is_box(bbox):
            raise _entry_error(document, f"annotations[{index}].bbox", bbox, "[x, y, width, height] in pixels")
        if annotation.get("category_id") not in class_of:
            raise _entry_error(
                document, f"annotations[{index}].category_id", annotation.get("category_id"), "an id of categories[]"
            )
        if annotation.get("iscrowd", 0):
            continue
        x, y, width, height = bbox
        if width > 0 and height > 0:
            row = (float(class_of[annotation["category_id"]]), x, y, x + width, y + height)
            boxes.setdefault(annotation["image_id"], []).append(row)
    return boxes


class _CocoImages:
    """Image paths from ``file_name`` entries, each kept inside ``train2017/``: a name that is absolute,
    climbs out with ``..``, or leads out through a link is refused, as is one that is no regular file."""

    def __init__(self, document: Path, folder: Path) -> None:
        self.document, self.folder = document, folder
        self.real_folder = os.path.realpath(folder)
        self._real_parents: dict[Path, str] = {}  # most entries share train2017/ itself

    def path(self, index: int, file_name: Any) -> Path:
        entry = f"images[{index}].file_name"
        allowed = f"a file name relative to {self.folder}"
        if not isinstance(file_name, str) or not file_name.strip() or "\0" in file_name:
            raise _entry_error(self.document, entry, file_name, allowed)
        relative = PurePosixPath(file_name)
        if relative.is_absolute() or ".." in relative.parts:
            raise _entry_error(self.document, entry, file_name, f"{allowed}, inside it ('/' and '..' leave it)")
        path = self.folder / relative
        parent = self._real_parents.setdefault(path.parent, os.path.realpath(path.parent))
        real = os.path.join(parent, path.name)
        try:
            if stat.S_ISLNK(os.lstat(real).st_mode):
                real = os.path.realpath(real)
        except OSError:
            pass  # missing: named below
        if os.path.commonpath([real, self.real_folder]) != self.real_folder:
            raise _entry_error(
                self.document, entry, file_name, f"{allowed}: it leads to {real} through a link, outside the folder"
            )
        problem = file_problem(path)
        if problem is not None:
            raise _entry_error(self.document, entry, file_name, f"{path}: {problem}; an image must be a regular file")
        return path


# --- Cityscapes ------------------------------------------------------------------------------------


def cityscapes_pairs(root: Path) -> tuple[tuple[Path, Path], ...]:
    """(image, label map) of every frame under ``root/leftImg8bit/train/<city>/``."""
    if not (root / CITYSCAPES_IMAGES).is_dir():
        raise _refuse(root, f"a Cityscapes folder needs {CITYSCAPES_IMAGES}/<city>/*{CITYSCAPES_IMAGE_SUFFIX}")
    pairs = []
    for image in sorted((root / CITYSCAPES_IMAGES).glob(f"*/*{CITYSCAPES_IMAGE_SUFFIX}")):
        frame = image.name[: -len(CITYSCAPES_IMAGE_SUFFIX)]
        label = root / CITYSCAPES_LABELS / image.parent.name / f"{frame}{CITYSCAPES_LABEL_SUFFIX}"
        if not os.path.lexists(label):
            raise _refuse(image, f"no label map {label.relative_to(root)} (run createTrainIdLabelImgs)")
        _require_regular(image, "an image")
        _require_regular(label, "a label map")
        pairs.append((image, label))
    if not pairs:
        raise _refuse(root, f"no images {CITYSCAPES_IMAGES}/<city>/*{CITYSCAPES_IMAGE_SUFFIX}")
    return tuple(pairs)


# --- planning ----------------------------------------------------------------------------------------

_LISTINGS: dict[str, Callable[[Path], object]] = {
    "image-folder": image_folder,
    "webdataset": shard_files,
    "tfrecord": record_files,
    "tokens": check_token_file,
    "coco": coco_samples,
    "cityscapes": cityscapes_pairs,
}


def check_dataset(path: Path, data_format: str) -> None:
    """List the dataset at ``path`` as ``data_format`` lays it out; ConfigError naming ``data``, the
    file and the problem when it cannot be read."""
    listing = _LISTINGS.get(data_format)
    if listing is not None:
        listing(path)


def token_count(path: Path) -> int:
    """Token ids in a token file :func:`check_token_file` accepted, from its size or its header."""
    if path.suffix != ".npy":
        return path.stat().st_size // 2
    import numpy as np

    return len(np.load(path, mmap_mode="r", allow_pickle=False))


def dataset_samples(path: Path, data_format: str, tokens_per_sample: int | None) -> int | None:
    """Samples the dataset at ``path`` holds; None where only reading it tells (shards, records)."""
    if data_format == "image-folder":
        return len(image_folder(path)[1])
    if data_format == "coco":
        return len(coco_samples(path))
    if data_format == "cityscapes":
        return len(cityscapes_pairs(path))
    if data_format == "tokens" and tokens_per_sample:
        tokens = token_count(path)
        if tokens < tokens_per_sample:
            raise _refuse(path, f"{tokens:,} token(s), fewer than one sequence of {tokens_per_sample:,} tokens")
        return tokens // tokens_per_sample
    return None


def check_dataset_size(
    path: Path,
    data_format: str,
    micro_batch_size: int,
    replicas: int,
    tokens_per_sample: int | None,
    host_call_samples: int | None = None,
) -> None:
    """Every replica reads a disjoint part of each epoch and drops an incomplete micro-batch, so a
    dataset of fewer than micro-batch x replicas samples yields no batch at all: refused here, in
    planning, instead of failing in setup. ``host_call_samples``: a loader that reads a whole host
    call at once (PopTorch's) needs that many instead."""
    samples = dataset_samples(path, data_format, tokens_per_sample)
    needed = host_call_samples if host_call_samples is not None else micro_batch_size * replicas
    if samples is not None and samples < needed:
        unit = f" sequences of {tokens_per_sample:,} tokens" if data_format == "tokens" else " samples"
        what = (
            f"one host call of {needed:,} (micro-batch x gradient accumulation x device iterations x replicas)"
            if host_call_samples is not None
            else f"one micro-batch of {micro_batch_size:,} for each of {replicas:,} replica(s)"
        )
        raise _refuse(path, f"{samples:,}{unit}, fewer than {what}: needs at least {needed:,}")
