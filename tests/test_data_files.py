"""A dataset's files are the user's input and are read with limits: links to devices, FIFOs,
decompression bombs and oversized shard members are refused naming the file; broken files are
named with their problem; memory exhausted while reading is a data fault, not the model's `oom`;
COCO file names stay inside the dataset; the loader's workers leave no process or temporary file."""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import torch
from data_support import png, write_image_folder, write_shards

from core import ConfigError, RunState, Workload, run
from core.base.errors import DataError
from core.contract.manager import get_plugin_manager
from core.contract.workload import TorchTrainingSpec
from core.data.coco import CocoDetection
from core.data.files import MAX_IMAGE_PIXELS, open_image
from core.data.torch_datasets import WebDatasetShards
from core.running.runner import classify_fault
from core.testing import registered_plugins

pytest.importorskip("PIL")

ROOT = Path(__file__).resolve().parents[1]
IMAGE_SHAPE = (3, 12, 12)


class TinyImageModel(Workload):
    name: ClassVar[str] = "tiny-image-model"
    default_micro_batch_size: ClassVar[int] = 2

    def build_torch(self, options: Any, seed: int) -> TorchTrainingSpec:
        torch.manual_seed(seed)
        return TorchTrainingSpec(
            model=torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 12 * 12, 3)),
            loss_fn=torch.nn.CrossEntropyLoss(),
            make_optimizer=lambda p: torch.optim.SGD(p, lr=0.01),
            inputs=torch.randn(8, *IMAGE_SHAPE),
            targets=torch.randint(0, 3, (8,)),
        )


def train(data: Path, workers: int = 0, **options: Any) -> Any:
    with registered_plugins():
        return run(
            TinyImageModel(), "cpu", data=str(data), data_workers=workers, warmup_steps=0, power_meter="none",
            **{"steps": 2, **options},
        )  # fmt: skip


@pytest.fixture
def no_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planning must refuse before any device is touched: building an executor fails the test."""
    accelerator = get_plugin_manager().accelerator("cpu")

    def touched(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a device was touched")

    monkeypatch.setattr(type(accelerator), "executor_for", touched)


def png_header(width: int, height: int) -> bytes:
    """A PNG whose header declares width x height RGB pixels, with almost no pixel data: what a
    decompression bomb shows before it is decoded."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\0" * 64)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


def assert_data_fault(result: Any, file: Path | str, fragment: str) -> None:
    status = result.status
    assert status.state is RunState.error and status.error_type == "DataError", status
    assert str(file) in status.message and fragment in status.message, status.message
    assert "BytesIO" not in status.message and "Traceback" not in status.message, status.message


# --- files that are not regular files: refused while planning --------------------------------------


@pytest.mark.parametrize("target", ["/dev/null", "fifo"])
def test_an_image_that_is_a_device_or_a_fifo_is_refused_before_anything_runs(
    target: str, tmp_path: Path, no_device: None
) -> None:
    folder = write_image_folder(tmp_path / "images")
    image = folder / "cat" / "0.png"
    image.unlink()
    if target == "fifo":
        os.mkfifo(image)
    else:
        image.symlink_to(target)
    with pytest.raises(ConfigError) as refused:
        train(folder)
    assert refused.value.field == "data" and refused.value.value == str(image)
    assert "not a regular file" in str(refused.value)


def test_a_shard_that_is_a_fifo_is_refused_before_anything_runs(tmp_path: Path, no_device: None) -> None:
    shards = write_shards(tmp_path / "shards")
    os.mkfifo(shards / "zz-fifo.tar")  # opening it to read would wait for a writer forever
    with pytest.raises(ConfigError) as refused:
        train(shards)
    assert refused.value.value == str(shards / "zz-fifo.tar") and "FIFO" in str(refused.value)


def test_a_tfrecord_file_that_is_a_fifo_is_refused_in_planning(tmp_path: Path, no_device: None) -> None:
    records = tmp_path / "records"
    records.mkdir()
    os.mkfifo(records / "train-0.tfrecord")
    with pytest.raises(ConfigError) as refused:
        run("mobilenetv3-small", "cpu", framework="tensorflow", data=str(records), steps=1, power_meter="none")
    assert refused.value.value == str(records / "train-0.tfrecord") and "FIFO" in str(refused.value)


def tfrecord(*lengths: int, data: bytes = b"x") -> bytes:
    """Records whose headers declare ``lengths``, each holding ``data`` (CRCs left zero: TensorFlow
    checks them, planning does not)."""
    return b"".join(struct.pack("<Q", length) + b"\0" * 4 + data + b"\0" * 4 for length in lengths)


@pytest.mark.parametrize(
    "content,fragment",
    [
        # TensorFlow allocated a terabyte for this record and the process died of a segmentation fault.
        (tfrecord(1, 1 << 40), "the record at byte 17 declares 1,099,511,627,776 bytes, but only 1 follow it"),
        (tfrecord(1, 1)[:-3], "the record at byte 17 declares 1 bytes, but only 0 follow it"),
        (tfrecord(1) + b"\1\2", "cut off at byte 17: a record header needs 12 bytes, 2 remain"),
    ],
    ids=["a terabyte declared", "cut inside a record", "cut inside a header"],
)
def test_a_tfrecord_file_whose_records_do_not_fit_it_is_refused_in_planning(
    content: bytes, fragment: str, tmp_path: Path, no_device: None
) -> None:
    records = tmp_path / "records"
    records.mkdir()
    (records / "train-0.tfrecord").write_bytes(tfrecord(1, 1, 1))
    (records / "train-1.tfrecord").write_bytes(content)
    with pytest.raises(ConfigError) as refused:
        run("mobilenetv3-small", "cpu", framework="tensorflow", data=str(records), steps=1, power_meter="none")
    assert refused.value.value == str(records / "train-1.tfrecord"), refused.value
    assert fragment in str(refused.value), refused.value


@pytest.mark.parametrize(
    "layout,target,fragment",
    [
        ("annotations/instances_train2017.json", "/dev/zero", "a character device (a link to /dev/zero)"),
        ("annotations/instances_train2017.json", "/nonexistent", "a broken link"),
        ("tokens.bin", "/dev/zero", "a character device (a link to /dev/zero)"),
        ("tokens.npy", "/nonexistent", "a broken link"),
        ("train.tfrecord", "/dev/null", "a character device (a link to /dev/null)"),
    ],
)
def test_the_file_that_tells_the_format_is_named_when_it_is_no_regular_file(
    layout: str, target: str, fragment: str, tmp_path: Path
) -> None:
    # Issue 26 (F9): detection skipped a path that failed is_file(): a COCO folder whose annotations
    # link to /dev/zero became "an image-folder dataset", a token file linked to a device "not a dataset".
    from core.data import detect_format

    link = tmp_path / "data" / layout
    link.parent.mkdir(parents=True)
    (tmp_path / "data" / "train2017").mkdir()
    link.symlink_to(target)
    data = link if "/" not in layout else tmp_path / "data"
    with pytest.raises(ConfigError) as refused:
        detect_format(data)
    assert refused.value.field == "data" and str(link) in str(refused.value), refused.value
    assert fragment in str(refused.value) and "must be a regular file" in str(refused.value)


@pytest.mark.parametrize("target", ["/dev/zero", "/dev/urandom", "fifo"])
def test_data_that_is_a_device_or_a_fifo_itself_is_named_as_what_it_is(target: str, tmp_path: Path) -> None:
    from core.data import detect_format

    data = tmp_path / "data"  # no suffix that names a format
    if target == "fifo":
        os.mkfifo(data)
    else:
        data.symlink_to(target)
    with pytest.raises(ConfigError) as refused:
        detect_format(data)
    said = "a FIFO (named pipe)" if target == "fifo" else f"a character device (a link to {target})"
    assert refused.value.value == str(data) and f"{said}, not a regular file; not a dataset" in str(refused.value)


def test_a_data_link_to_a_device_is_refused_by_core_run_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from core.cli import main

    (tmp_path / "tok.bin").symlink_to("/dev/zero")
    monkeypatch.chdir(tmp_path)
    assert main(["run", "gpt2-124m", "--data", "tok.bin", "--dry-run"]) == 2
    error = capsys.readouterr().err
    assert "tok.bin" in error and "a character device" in error and "not a dataset" not in error, error


@pytest.mark.parametrize(
    "name,content,fragment",
    [
        ("fifo.bin", None, "FIFO"),
        ("odd.bin", b"\x01\x02\x03", "whole uint16 token ids"),
        ("floats.npy", np.zeros(64, dtype=np.float32), "integer token ids"),
        ("table.npy", np.zeros((8, 8), dtype=np.int64), "1-D array"),
        ("damaged.npy", b"\x93NUMPY garbage", "not a .npy array"),
        # numpy's text goes on over lines advising allow_pickle=True: only its first line is said.
        ("long-header.npy", b"\x93NUMPY\x01\x00\xff\xff" + b"{" * 70_000, "Header info length (65535) is large"),
    ],
)
def test_a_token_file_numpy_cannot_map_as_token_ids_is_refused_in_planning(
    name: str, content: Any, fragment: str, tmp_path: Path, no_device: None
) -> None:
    path = tmp_path / name
    if content is None:
        os.mkfifo(path)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        np.save(path, content)
    with pytest.raises(ConfigError) as refused:
        run("gpt2-124m", "cpu", data=str(path), data_format="tokens", steps=1, power_meter="none")
    assert refused.value.field == "data" and refused.value.value == str(path)
    assert (
        fragment in str(refused.value) and "\n" not in str(refused.value) and "allow_pickle" not in str(refused.value)
    )


# --- COCO file names -----------------------------------------------------------------------------


def coco_with_file_name(root: Path, file_name: Any) -> Path:
    from test_dense_data import coco_fixture

    coco_fixture(root)
    document = root / "annotations" / "instances_train2017.json"
    content = json.loads(document.read_text())
    content["images"][1]["file_name"] = file_name
    document.write_text(json.dumps(content))
    return document


@pytest.mark.parametrize(
    "file_name,link,fragment",
    [
        ("../../../../../../etc/passwd", None, "inside it"),
        ("/etc/passwd", None, "inside it"),
        ("outside/passwd", ("outside", "/etc"), "outside the folder"),  # a folder link that leaves
        ("passwd.png", ("passwd.png", "/etc/passwd"), "outside the folder"),  # a file link that leaves
        ("random.png", ("random.png", "/dev/urandom"), "outside the folder"),
        ("missing.png", None, "no such file"),
        (7, None, "a file name"),
    ],
)
def test_a_coco_file_name_that_leaves_the_image_folder_is_refused_naming_the_entry(
    file_name: Any, link: tuple[str, str] | None, fragment: str, tmp_path: Path, no_device: None
) -> None:
    document = coco_with_file_name(tmp_path / "coco", file_name)
    if link is not None:
        (tmp_path / "coco" / "train2017" / link[0]).symlink_to(link[1])
    with pytest.raises(ConfigError) as refused:
        run("faster-rcnn-r50-fpn", "cpu", data=str(tmp_path / "coco"), steps=1, power_meter="none")
    message = str(refused.value)
    assert refused.value.field == "data" and str(document) in message
    assert "images[1].file_name" in message and fragment in message, message
    with pytest.raises(ConfigError):  # the dataset itself refuses it too (the Graphcore loader builds it)
        CocoDetection(tmp_path / "coco", (3, 64, 64))


def test_a_coco_link_that_stays_inside_the_image_folder_is_read(tmp_path: Path) -> None:
    coco_with_file_name(tmp_path / "coco", "again.png")
    (tmp_path / "coco" / "train2017" / "again.png").symlink_to("b.png")
    dataset = CocoDetection(tmp_path / "coco", (3, 64, 64))
    assert dataset[1][0].shape == (3, 64, 64)


# --- broken files: named, with the problem -------------------------------------------------------


def truncated_png() -> bytes:
    data = png((10, 20, 30), size=64)
    return data[: len(data) // 2]


def truncated_jpeg() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 10, 10)).save(buffer, format="JPEG")
    return buffer.getvalue()[:300]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize(
    "content,fragment",
    [
        (b"this is a text file named like an image", "not an image Pillow can read"),
        (b"", "an empty file"),
        (truncated_png(), "truncated"),
        (truncated_jpeg(), "truncated"),
        (png_header(100_000, 100_000), "decompression bomb"),  # over twice Pillow's bound: Pillow raises
        (png_header(10_000, 10_000), "decompression bomb"),  # over Pillow's bound: Pillow only warns
    ],
)
def test_a_broken_image_is_named_with_its_problem(content: bytes, fragment: str, workers: int, tmp_path: Path) -> None:
    folder = write_image_folder(tmp_path / "images")
    broken = folder / "cat" / "0.jpg"
    broken.write_bytes(content)
    for other in folder.rglob("*.png"):  # every batch reads the broken file, whatever the order
        other.write_bytes(content)
    result = train(folder, workers)
    assert_data_fault(result, folder, fragment)
    if workers:
        assert "DataLoader worker process" in result.status.message


@pytest.mark.parametrize(
    "content",
    [
        b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n",  # Pillow renders EPS with Ghostscript
        b"%PDF-1.4\n",
        b"8BPS\x00\x01"
        + b"\x00" * 6
        + b"\x00\x03\x00\x00\x00\x0a\x00\x00\x00\x0a\x00\x08\x00\x03"
        + b"\x00" * 16,  # PSD
    ],
    ids=["EPS", "PDF", "PSD"],
)
def test_an_image_of_a_format_no_dataset_holds_is_refused_unopened(content: bytes) -> None:
    with pytest.raises(
        DataError, match=r"^0\.png: not an image Pillow can read as PNG, JPEG, GIF, BMP, TIFF, WebP or PPM"
    ):
        open_image(content, "0.png")


def test_pillows_own_bound_does_not_decide_what_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from PIL import Image

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)  # a program may switch Pillow's check off
    with pytest.raises(DataError, match=f"more than the {MAX_IMAGE_PIXELS:,}") as refused:
        open_image(png_header(20_000, 20_000), "big.png")
    assert str(refused.value).startswith("big.png: ")


def shard_with(folder: Path, members: list[tuple[str, bytes]], declared: dict[str, int] | None = None) -> Path:
    """One shard of these members; ``declared`` gives a member a header size its data does not have."""
    folder.mkdir()
    path = folder / "train-0000.tar"
    with open(path, "wb") as stream:
        for name, payload in members:
            info = tarfile.TarInfo(name)
            info.size = (declared or {}).get(name, len(payload))
            stream.write(info.tobuf())
            stream.write(payload + b"\0" * (-len(payload) % tarfile.BLOCKSIZE))
        stream.write(b"\0" * 2 * tarfile.BLOCKSIZE)
    return path


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize(
    "members,declared,fragment",
    [
        ([("0.png", b"not a picture"), ("0.cls", b"1")], None, "member '0.png': not an image"),
        ([("0.png", png((1, 2, 3))), ("0.cls", b"cat")], None, "member '0.cls': b'cat' is not a whole-number"),
        ([("0.png", png((1, 2, 3))), ("0.txt", b"x")], None, "needs an image (.jpg/.png) and a .cls label"),
        # A header that declares 8 GiB (a tar bomb): refused from the header, before any is read.
        ([("0.png", b"tiny"), ("0.cls", b"1")], {"0.png": 8 << 30}, "more than the 357,913,940 allowed"),
    ],
)
def test_a_bad_shard_member_is_named(
    members: list[tuple[str, bytes]], declared: dict[str, int] | None, fragment: str, workers: int, tmp_path: Path
) -> None:
    shard = shard_with(tmp_path / "shards", members, declared)
    assert_data_fault(train(shard.parent, workers), shard, fragment)


def test_a_sample_whose_members_together_pass_the_bound_is_refused_before_the_last_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Sixteen members, each under the member bound, made a 16 MB gzip shard hold 5 GB in a worker.
    import core.data.torch_datasets

    monkeypatch.setattr(core.data.torch_datasets, "MAX_SAMPLE_BYTES", 1_000)
    members = [("0.png", png((1, 2, 3))), ("0.cls", b"1"), ("0.json", b"{}" * 300), ("0.txt", b"x" * 600)]
    shard = shard_with(tmp_path / "shards", members)
    with pytest.raises(
        DataError, match=r"sample '0' would hold 1,\d{3} bytes with member '0.txt', more than the 1,000"
    ) as refused:
        list(WebDatasetShards([shard], IMAGE_SHAPE)._samples(shard))
    assert str(refused.value).startswith(str(shard))
    shard.unlink()
    shard.parent.rmdir()
    shard = shard_with(tmp_path / "shards", members[:3])  # within it: read
    assert len(list(WebDatasetShards([shard], IMAGE_SHAPE)._samples(shard))) == 1


def test_a_damaged_or_cut_off_shard_is_named(tmp_path: Path) -> None:
    shards = write_shards(tmp_path / "shards")
    first, second = sorted(shards.glob("*.tar"))
    second.write_bytes(second.read_bytes()[: 2 * 1024 + 100])  # cut inside a header, after two members
    first.write_bytes(b"\x00\x01garbage" * 300)
    for shard, fragment in ((first, "not a readable tar file"), (second, "damaged or cut off after member")):
        with pytest.raises(DataError, match=fragment) as refused:
            list(WebDatasetShards([shard], IMAGE_SHAPE)._samples(shard))
        assert str(refused.value).startswith(str(shard))


def test_a_loader_workers_error_reaches_the_run_whole(tmp_path: Path) -> None:
    # Issue 26 (F7): torch rebuilds a worker's exception from its traceback's text, and the message
    # kept only its last line: tarfile's ReadError spans lines ("- method tar: ReadError(...)"),
    # and the shard's own name was lost; a file name with a newline in it was cut at the newline.
    shards = tmp_path / "shards"
    shards.mkdir()
    shard = shards / "train-0000.tar"
    shard.write_bytes(np.random.default_rng(0).bytes(2200))
    result = train(shards, workers=2)
    assert_data_fault(result, shard, "not a readable tar file")
    assert "DataLoader worker process" in result.status.message
    folder = write_image_folder(tmp_path / "images")
    for image in folder.rglob("*.png"):
        image.rename(image.with_name(f"x\nevil-{image.name}"))
    for image in folder.rglob("*.png"):
        image.write_bytes(b"not a picture")
    result = train(folder, workers=2)
    assert_data_fault(result, folder, "not an image Pillow can read")
    assert any(str(image) in result.status.message for image in folder.rglob("*.png")), result.status.message


# --- memory exhausted while reading: a data fault ---------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_memory_exhausted_while_decoding_is_a_data_fault_not_the_models_oom(
    workers: int, image_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from PIL import ImageFile

    def exhausted(self: Any) -> None:
        raise MemoryError()

    monkeypatch.setattr(ImageFile.ImageFile, "load", exhausted)  # the workers fork with it
    result = train(image_folder, workers)
    assert_data_fault(result, image_folder, "out of memory decoding")


@pytest.mark.parametrize("workers", [0, 2])
def test_memory_exhausted_anywhere_in_the_loader_is_a_data_fault(
    workers: int, image_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from core.data import torch_datasets

    def exhausted(*args: Any) -> Any:
        raise MemoryError("can't allocate memory")

    monkeypatch.setattr(torch_datasets, "decode_image", exhausted)
    result = train(image_folder, workers)
    assert_data_fault(result, image_folder, "out of memory")
    assert classify_fault(DataError("x.png: out of memory decoding it")) is RunState.error


# --- the loader's workers: stopped, their temporary files removed --------------------------------------


@pytest.fixture
def temporary() -> Iterator[Path]:
    """An empty temporary folder of a short path, for the loader workers' ``pymp-*`` folders: the
    sockets in them may have paths of at most 107 bytes (tmp_path's can be deeper than that)."""
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="t-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_temporary_folder_too_deep_for_the_workers_sockets_is_refused_naming_tmpdir(
    image_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Past 107 bytes a worker's socket cannot be made: its queue thread printed the error and
    # dropped the batch, and the run waited for it forever.
    import multiprocessing
    import tempfile

    from core.data.loading import LoaderWorkers
    from core.data.torch_datasets import ImageFolder

    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    loader = torch.utils.data.DataLoader(ImageFolder(image_folder, IMAGE_SHAPE), batch_size=2, num_workers=2)
    with pytest.raises(DataError, match=r"\(TMPDIR\) is too deep for the sockets .* set TMPDIR to a shorter path"):
        LoaderWorkers(loader, str(image_folder)).iterate()
    assert multiprocessing.active_children() == [] and list(deep.iterdir()) == []


def test_a_loader_worker_killed_by_the_kernel_is_a_data_fault_and_leaves_no_folder(
    image_folder: Path, temporary: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import multiprocessing
    import signal
    import tempfile

    from core.data import torch_datasets

    original = torch_datasets.decode_image
    decoded = []

    def killed_on_the_third(*args: Any) -> Any:
        decoded.append(1)
        worker = torch.utils.data.get_worker_info()
        if worker is not None and worker.id == 0 and len(decoded) == 3:
            os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer ends a worker
        return original(*args)

    monkeypatch.setattr(torch_datasets, "decode_image", killed_on_the_third)
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))  # the workers' pymp-* folders go here
    result = train(image_folder, workers=2, steps=20)
    assert_data_fault(result, image_folder, "a data loader worker died")
    assert "out-of-memory killer" in result.status.message
    assert list(temporary.rglob("pymp-*")) == [] and list(temporary.glob("core-data-workers-*")) == []
    assert multiprocessing.active_children() == []


def test_loader_workers_stopped_by_a_signal_leave_no_temporary_folder(
    image_folder: Path, temporary: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import multiprocessing
    import signal
    import tempfile

    from core.data.loading import LoaderWorkers
    from core.data.torch_datasets import ImageFolder

    monkeypatch.setattr(tempfile, "tempdir", str(temporary))  # the workers' pymp-* folders go here
    loader = torch.utils.data.DataLoader(
        ImageFolder(image_folder, IMAGE_SHAPE), batch_size=2, num_workers=2, persistent_workers=True
    )
    workers = LoaderWorkers(loader, str(image_folder))
    try:
        batches = workers.iterate()
        workers.next(batches)
        workers.next(batches)  # batches come from each worker in turn: both have made their folders
        assert len(list(temporary.glob("pymp-*"))) == 2
        stopped, killed = sorted(multiprocessing.active_children(), key=lambda process: process.pid)
        os.kill(stopped.pid, signal.SIGTERM)  # a stopped run's group, or torch stopping a stuck worker
        wait_for_exit(stopped)
        assert stopped.exitcode == 128 + signal.SIGTERM and len(list(temporary.glob("pymp-*"))) == 1
        os.kill(killed.pid, signal.SIGKILL)  # the out-of-memory killer: the worker cannot clean up
        wait_for_exit(killed)
        assert len(list(temporary.glob("pymp-*"))) == 1
    finally:
        workers.close()
    assert list(temporary.iterdir()) == [] and multiprocessing.active_children() == []


class StuckPastSigterm(torch.utils.data.Dataset):
    """In a worker, every sample after the first ignores SIGTERM and never returns: a worker stuck in
    native code (a decoder, a parser) that torch's teardown cannot end with its SIGTERM."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> torch.Tensor:
        import signal
        import time

        if index >= 2 and torch.utils.data.get_worker_info() is not None:
            # A worker stuck in native code never runs its Python SIGTERM handler: here, none runs.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            while True:
                time.sleep(0.05)
        return torch.zeros(2)


@pytest.mark.slow
def test_a_loader_worker_stuck_past_sigterm_is_killed_and_its_folder_removed(
    temporary: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import multiprocessing
    import tempfile

    from core.data.loading import LoaderWorkers

    monkeypatch.setattr(tempfile, "tempdir", str(temporary))  # the workers' pymp-* folders go here
    loader = torch.utils.data.DataLoader(StuckPastSigterm(), batch_size=1, num_workers=2, persistent_workers=True)
    workers = LoaderWorkers(loader, "stuck")
    try:
        batches = workers.iterate()
        assert workers.next(batches) is not None  # sample 0; each worker then sticks on its next one
    finally:
        workers.close()
    left = multiprocessing.active_children()
    for worker in left:  # killed here too, so that a failure does not hang the session at its exit
        worker.kill()
    assert left == []
    assert list(temporary.iterdir()) == []


def wait_for_exit(process: Any) -> None:
    """Join a loader worker; torch's SIGCHLD handler raises in this (the main) thread when one dies."""
    for _ in range(100):  # a hang guard only
        try:
            process.join(timeout=60)
        except RuntimeError as died:
            assert "DataLoader worker" in str(died)
        if process.exitcode is not None:
            return
    raise AssertionError(f"worker {process.pid} did not end")


def own_processes_with(marker: str) -> list[int]:
    """This user's live processes whose environment carries ``marker`` (the run's, and any it left)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.slow
def test_sigterm_to_core_run_stops_it_as_ctrl_c_does_and_says_so(tmp_path: Path, temporary: Path) -> None:
    """A batch system's time limit or `kill` sends SIGTERM: the run's loader workers are stopped and
    their folders removed before `core run` exits 143, saying what stopped it, without a traceback."""
    import signal
    import time

    folder = write_image_folder(tmp_path / "images")
    marker = f"CORE_TEST_MARKER={tmp_path.name}"
    environment = {**os.environ, "TMPDIR": str(temporary), marker.split("=")[0]: marker.split("=")[1]}
    command = [sys.executable, "-m", "core.cli", "run", "aces-autoencoder", "--data", str(folder)]
    command += ["--data-workers", "2", "--batch-size", "2", "--steps", "10000000", "--warmup-steps", "1"]
    command += ["--power-meter", "none"]
    process = subprocess.Popen(
        command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        for _ in range(3000):  # a hang guard only: until the loader's workers have started
            if len(list(temporary.glob("pymp-*"))) == 2 or process.poll() is not None:
                break
            time.sleep(0.2)
        assert process.poll() is None, process.communicate()
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=600)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 128 + signal.SIGTERM, stdout + stderr
    assert "stopped by SIGTERM; nothing was recorded" in stderr and "Traceback" not in stderr, stderr
    assert [path.name for path in temporary.iterdir() if "pymp-" in path.name] == []
    assert own_processes_with(marker) == []


@pytest.mark.slow
@pytest.mark.parametrize("broken", [False, True])
def test_loader_workers_leave_no_process_and_no_temporary_folder(broken: bool, tmp_path: Path, temporary: Path) -> None:
    folder = write_image_folder(tmp_path / "images")
    if broken:
        (folder / "dog" / "2.png").write_bytes(b"\xff\xd8 a truncated start")
        for other in folder.rglob("*.png"):
            other.write_bytes(b"\xff\xd8 a truncated start")
    marker = f"CORE_TEST_MARKER={tmp_path.name}"
    environment = {**os.environ, "TMPDIR": str(temporary), marker.split("=")[0]: marker.split("=")[1]}
    command = [sys.executable, "-m", "core.cli", "run", "aces-autoencoder", "--data", str(folder)]
    command += ["--data-workers", "2", "--batch-size", "2", "--steps", "3", "--warmup-steps", "1"]
    command += ["--power-meter", "none"]
    finished = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert finished.returncode == (1 if broken else 0), finished.stdout + finished.stderr
    if broken:
        assert "DataError" in finished.stdout and str(folder) in finished.stdout
    left = [path.relative_to(temporary) for path in temporary.rglob("*") if "pymp-" in str(path)]
    assert left == [], f"the loader's workers left {left}"
    assert list(temporary.glob("core-data-workers-*")) == []
    assert own_processes_with(marker) == []


def test_a_batch_lost_with_its_killed_worker_is_reported_as_the_worker_s_death() -> None:
    # Under load a worker can be killed after it queued a batch and before torch's check for dead
    # workers runs: fetching the batch's shared memory from it then fails as ConnectionResetError.
    import multiprocessing
    import signal
    import time
    from types import SimpleNamespace

    from core.data.loading import LoaderWorkers

    worker = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,))
    worker.start()
    os.kill(worker.pid or 0, signal.SIGKILL)

    def lost_batch() -> Any:
        raise ConnectionResetError(104, "Connection reset by peer")

    iterator = SimpleNamespace(_workers=[worker], __next__=lost_batch)
    workers = LoaderWorkers.__new__(LoaderWorkers)
    workers._source = "/data/images"
    with pytest.raises(DataError) as raised:
        workers.next(_Raising(iterator))
    message = str(raised.value)
    assert "reading /data/images: a data loader worker died" in message and "killed by signal: Killed" in message
    assert "out-of-memory killer" in message


class _Raising:
    """An iterator whose next item is what ``namespace.__next__`` raises, with its ``_workers``."""

    def __init__(self, namespace: Any) -> None:
        self._workers = namespace._workers
        self._next = namespace.__next__

    def __iter__(self) -> _Raising:
        return self

    def __next__(self) -> Any:
        return self._next()
