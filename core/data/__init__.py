"""Where a run's samples come from: synthetic (on the device or on the host) or real files.

Synthetic data on the device measures the model alone; synthetic data on the host adds the
host-to-device copy of every micro-batch; real data adds reading and decoding in background
workers, and the runner reports the share of the window the training loop spent waiting for it.

Nothing here imports a framework at module import: ``detect_format`` and ``validate_data`` run
during planning, before any device is touched.
"""

from __future__ import annotations

import os
from pathlib import Path

from core.base.config import Framework
from core.base.errors import ConfigError, DataError
from core.data.files import file_problem

SYNTHETIC_ON_DEVICE = "synthetic"
SYNTHETIC_ON_HOST = "synthetic-host"
SYNTHETIC_SOURCES = (SYNTHETIC_ON_DEVICE, SYNTHETIC_ON_HOST)

#: a run to a target reads an image folder split as torchvision's ImageNet is: DATA/train/<class>/...
#: for training, DATA/val/<class>/... for evaluation (docs/to-target.md)
TRAIN_SPLIT, HELD_OUT_SPLIT = "train", "val"

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
TOKEN_SUFFIXES = (".bin", ".npy")
# A dataset that is one file, by its suffix.
_FILE_FORMATS = {
    ".bin": "tokens",
    ".npy": "tokens",
    ".tfrecord": "tfrecord",
    ".tfrecords": "tfrecord",
    ".tar": "webdataset",
}

# format -> frameworks whose executor reads it
FORMAT_FRAMEWORKS: dict[str, tuple[Framework, ...]] = {
    "image-folder": (Framework.torch,),
    "webdataset": (Framework.torch,),
    "tokens": (Framework.torch,),
    "tfrecord": (Framework.tensorflow,),
    "coco": (Framework.torch,),
    "cityscapes": (Framework.torch,),
}


def detect_format(path: Path) -> str:
    """The dataset format at ``path``; raises ConfigError(data, ...) when it is none of them, or when
    the file that tells the format is no regular file (a link to a device, a FIFO): named, not
    skipped for another format or for none."""
    if path.is_dir():
        return _folder_format(path)
    found = _FILE_FORMATS.get(path.suffix)
    if found is not None and os.path.lexists(path):
        _check_regular(path, path, {"tokens": "a token file", "tfrecord": "a TFRecord file"}.get(found, "a shard"))
        return found
    problem = file_problem(path)  # a device, a FIFO, or a link to one: said, not only "not a dataset"
    raise ConfigError("data", str(path), f"{problem}; {_NOT_A_DATASET}" if problem is not None else _NOT_A_DATASET)


def _check_regular(data: Path, file: Path, what: str) -> None:
    problem = file_problem(file)
    if problem is not None:
        named = "" if file == data else f"{file}: "
        raise ConfigError("data", str(data), f"{named}{problem}; {what} must be a regular file")


def _folder_format(path: Path) -> str:
    annotations = path / "annotations" / "instances_train2017.json"
    if os.path.lexists(annotations):  # a link to /dev/zero there is a broken COCO folder, not another format
        _check_regular(path, annotations, "a COCO dataset's annotations file")
        return "coco"
    if (path / "leftImg8bit" / "train").is_dir():
        return "cityscapes"
    entries = sorted(path.iterdir())
    if any(e.suffix == ".tar" for e in entries):
        return "webdataset"
    if any(e.suffix in (".tfrecord", ".tfrecords") for e in entries):
        return "tfrecord"
    if any(e.is_dir() for e in entries):
        return "image-folder"
    raise ConfigError("data", str(path), _NOT_A_DATASET)


_NOT_A_DATASET = (
    "not a dataset: expected a folder of class folders of images, a COCO or Cityscapes folder, "
    ".tar shards (WebDataset), .tfrecord files, or a .bin/.npy token file"
)


def validate_data(
    data: str, data_format: str, framework: Framework, readable: tuple[str, ...] | None = None, workload: str = "?"
) -> str | None:
    """Check a data source before anything runs; returns the resolved format (None for synthetic).

    ``readable``: the formats the workload reads with ``framework`` (``Workload.data_formats_for``);
    () for synthetic data only, None when the workload does not say.
    """
    if data == SYNTHETIC_ON_DEVICE:
        return None
    if data == SYNTHETIC_ON_HOST:
        if framework is Framework.tensorflow:
            raise ConfigError(
                "data",
                data,
                f"the TensorFlow executor places synthetic data on the device only; "
                f"allowed: {SYNTHETIC_ON_DEVICE} or a TFRecord path",
            )
        return None
    path = Path(data)
    if not path.exists():
        raise ConfigError(
            "data", data, f"no such file or folder; allowed: {', '.join(SYNTHETIC_SOURCES)} or a dataset path"
        )
    resolved = detect_format(path) if data_format == "auto" else data_format
    if readable is not None and resolved not in readable:
        usable = [name for name in readable if framework in FORMAT_FRAMEWORKS.get(name, ())]
        synthetic = (SYNTHETIC_ON_DEVICE,) if framework is Framework.tensorflow else SYNTHETIC_SOURCES
        if not usable:
            raise ConfigError(
                "data",
                data,
                f"{_a(resolved)} dataset, but workload {workload!r} takes synthetic data "
                f"only (with {framework.value}); allowed: {', '.join(synthetic)}",
            )
        if data_format == "auto":
            raise ConfigError(
                "data",
                data,
                f"{_a(resolved)} dataset, but workload {workload!r} with {framework.value} "
                f"reads {', '.join(usable)}; allowed: {', '.join(synthetic)} or a path to "
                f"{' or '.join(_a(name) for name in usable)} dataset",
            )
        raise ConfigError(
            "data_format",
            data_format,
            f"workload {workload!r} with {framework.value} reads: {', '.join(['auto', *usable])}",
        )
    if framework not in FORMAT_FRAMEWORKS[resolved]:
        readable_here = [name for name, readers in FORMAT_FRAMEWORKS.items() if framework in readers]
        raise ConfigError("data_format", resolved, f"{framework.value} reads: {', '.join(readable_here)}")
    from core.data.listing import check_dataset

    # Every file a sample comes from, listed: a link to a device, a FIFO, a COCO file_name outside
    # the folder is refused here, before any device is touched.
    check_dataset(path, resolved)
    return resolved


# torch's DataLoader reports a worker that died ("DataLoader worker (pid 42) is killed by signal:
# Killed.", "... exited unexpectedly") from its SIGCHLD handler, wherever the main process is then.
_LOADER_WORKER_DIED = "DataLoader worker (pid"
_OUT_OF_MEMORY_KILLER = (
    "the kernel's out-of-memory killer sends SIGKILL when reading and decoding data exhausts the host's memory"
)


def loader_worker_death(error: BaseException, source: str) -> DataError | None:
    """A DataError for a data loader worker's death reported as ``error``; None for anything else.

    :param source: the data path, named in the message."""
    text = str(error).strip()
    if not isinstance(error, RuntimeError) or _LOADER_WORKER_DIED not in text:
        return None
    if "Killed" in text:
        hint = _OUT_OF_MEMORY_KILLER
    else:  # torch's SIGCHLD handler is not always installed: then no signal is named
        hint = f"killed by a signal or crashed; {_OUT_OF_MEMORY_KILLER}"
    return DataError(f"reading {source}: a data loader worker died: {text} ({hint})")


def _a(data_format: str) -> str:
    return {
        "image-folder": "an image-folder",
        "webdataset": "a webdataset (.tar shards)",
        "tokens": "a token-file",
        "tfrecord": "a TFRecord",
        "coco": "a COCO (annotations/instances_train2017.json)",
        "cityscapes": "a Cityscapes (leftImg8bit/, gtFine/)",
    }.get(data_format, f"a {data_format}")
