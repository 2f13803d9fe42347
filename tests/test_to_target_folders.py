"""Training to a target from files (docs/to-target.md, "From an image folder"): the digits written as
an image folder split into train/ and val/, a run that reaches its target reading it through core's
loader, the folder's evaluation against the in-memory one on the same weights, and the refusals."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from target_support import HELD_OUT, TARGET, TRAINING, assert_reached_from_files, digits_executor

from core.api import run_here
from core.base.errors import ConfigError
from core.base.results import RunState

pytest.importorskip("sklearn")


@pytest.fixture(scope="module")
def digits_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from core.workloads.digits import write_image_folder

    return write_image_folder(tmp_path_factory.mktemp("digits") / "folder")


def _copy(folder: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    return copy


def test_the_folder_holds_the_in_memory_split_within_half_a_grey_level(digits_folder: Path) -> None:
    from core.workloads.digits import DigitsOptions, split_digits

    train_x, train_y, test_x, test_y = split_digits(DigitsOptions())
    for split, images, labels in (("train", train_x, train_y), ("val", test_x, test_y)):
        files = sorted((digits_folder / split).glob("*/*.png"))
        assert len(files) == len(images) == (TRAINING if split == "train" else HELD_OUT)
        assert sorted(p.name for p in (digits_folder / split).iterdir()) == [str(d) for d in range(10)]
        for file in files[::37]:
            index = int(file.stem)
            assert int(file.parent.name) == labels[index]
            with Image.open(file) as image:
                assert image.mode == "L" and image.size == (8, 8)
                decoded = np.asarray(image, dtype=np.float32) / 255.0
            assert np.abs(decoded.reshape(-1) - images[index]).max() <= 1 / 510 + 1e-7


@pytest.mark.slow
def test_digits_reach_their_target_from_the_folder_with_the_curve(digits_folder: Path) -> None:
    result = run_here("digits", "cpu", power_meter="none", data=str(digits_folder), target=TARGET)
    assert_reached_from_files(result, "image-folder")


@pytest.mark.slow
def test_the_folder_evaluation_is_the_in_memory_one_on_the_png_rounded_images(digits_folder: Path) -> None:
    """On the same weights (trained one epoch from the folder), the folder's evaluation counts the same
    right predictions as the in-memory evaluation of the same images rounded as the PNGs store them,
    and its loss is the same to fp32 rounding (the images come in another order: class by class). The
    unrounded in-memory images differ by at most half a grey level a pixel: the same top-1 within a few
    images and the loss within 1% here (measured: at most 1 image, 0.04%, over seeds 0 to 2)."""
    import torch

    from core.workloads.digits import DigitsOptions, split_digits

    files = digits_executor(str(digits_folder))
    memory = digits_executor("synthetic")
    try:
        files.run_steps(TRAINING // 32)
        memory._placed_model.load_state_dict(files.model_state())
        from_files = files.evaluate()
        unrounded = memory.evaluate()
        _, _, test_x, test_y = split_digits(DigitsOptions())
        rounded = torch.from_numpy(np.rint(test_x * 255.0) / 255.0).float().reshape(-1, 1, 8, 8)
        memory._spec.evaluation_inputs = rounded
        memory._spec.evaluation_targets = torch.from_numpy(test_y).long()
        in_memory = memory.evaluate()
    finally:
        files.close()
        memory.close()
    assert from_files is not None and in_memory is not None and unrounded is not None
    assert from_files["top1"] > 0.5  # trained: the labels the folder gave are the digits'
    assert from_files["top1"] == in_memory["top1"]
    assert from_files["loss"] == pytest.approx(in_memory["loss"], rel=1e-5)
    assert abs(from_files["top1"] - unrounded["top1"]) <= 3 / HELD_OUT
    assert from_files["loss"] == pytest.approx(unrounded["loss"], rel=1e-2)


def _without_val(folder: Path, tmp_path: Path) -> Path:
    copy = _copy(folder, tmp_path)
    shutil.rmtree(copy / "val")
    return copy


def _val_without_classes(folder: Path, tmp_path: Path) -> Path:
    copy = _copy(folder, tmp_path)
    for image in list((copy / "val").glob("*/*.png")):
        image.rename(copy / "val" / f"{image.parent.name}-{image.name}")
    for class_folder in [p for p in (copy / "val").iterdir() if p.is_dir()]:
        class_folder.rmdir()
    return copy


def _val_missing_a_class(folder: Path, tmp_path: Path) -> Path:
    copy = _copy(folder, tmp_path)
    shutil.rmtree(copy / "val" / "7")
    return copy


def _shards(folder: Path, tmp_path: Path) -> Path:
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "000000.tar").write_bytes(b"\0" * 1024)
    return shards


@pytest.mark.parametrize(
    ("make", "options", "field", "says"),
    [
        (_without_val, {}, "data", "no val/ folder"),
        (_val_without_classes, {}, "data", "no class folders, so no labels"),
        (_val_missing_a_class, {}, "data", "classes differ"),
        (_shards, {}, "data", "no train/ folder (the training split)"),
        (lambda folder, _: folder, {"data_format": "cityscapes"}, "data", "cityscapes splits; a run to a target reads"),
        (lambda folder, _: folder, {"micro_batch_size": 1500}, "micro_batch_size", "training split of 1437"),
    ],
)
def test_planning_refuses_files_a_target_cannot_be_run_on(
    digits_folder: Path, tmp_path: Path, make: Any, options: dict[str, Any], field: str, says: str
) -> None:
    data = make(digits_folder, tmp_path)
    with pytest.raises(ConfigError) as refused:
        run_here("digits", "cpu", power_meter="none", data=str(data), target=TARGET, **options)
    assert refused.value.field == field
    assert says in str(refused.value)


def test_a_folder_without_splits_is_refused_naming_data(digits_folder: Path) -> None:
    # One split given as the dataset: its class folders are no train/ and val/.
    with pytest.raises(ConfigError, match="no train/ folder") as refused:
        run_here("digits", "cpu", power_meter="none", data=str(digits_folder / "train"), target=TARGET)
    assert refused.value.field == "data"


@pytest.mark.slow
def test_two_replicas_reading_the_folder_give_one_process_curve(digits_folder: Path) -> None:
    # The whole path: `core.run` launches 2 processes (torchrun, gloo), each reading its share of every
    # global batch through its own loader workers, the held-out split sharded and all-reduced.
    from core import run

    target = {"metric": "top1", "value": 1.0, "max_epochs": 3}  # never reached: three points each
    common = {"power_meter": "none", "data": str(digits_folder), "target": target}
    replicated = run("digits", "cpu", replicas=2, micro_batch_size=16, **common)
    whole = run_here("digits", "cpu", replicas=1, micro_batch_size=32, **common)
    for result in (replicated, whole):
        assert result.status.state is RunState.target_not_reached and result.to_target is not None
        assert [point.samples for point in result.to_target.curve] == [44 * 32, 88 * 32, 132 * 32]
    assert replicated.world_size == 2
    # The same samples per update in the same order: DDP's averaged gradients differ from one process's
    # by rounding only (tests/test_to_target.py), so each point is within one held-out image and 1 %.
    for ours, theirs in zip(replicated.to_target.curve, whole.to_target.curve):  # type: ignore[union-attr]
        assert abs(ours.metrics["top1"] - theirs.metrics["top1"]) <= 1 / HELD_OUT + 1e-12
        assert ours.metrics["loss"] == pytest.approx(theirs.metrics["loss"], rel=1e-2)


def test_a_folder_with_more_classes_than_the_head_predicts_is_refused_before_running(
    digits_folder: Path, tmp_path: Path
) -> None:
    # Ten class folders against a head of five: a label of 5..9 would break the loss mid-run.
    with pytest.raises(ConfigError) as refused:
        run_here(
            "resnet50",
            "cpu",
            power_meter="none",
            data=str(digits_folder),
            target=TARGET,
            workload_options={"variant": "small", "num_classes": 5},
        )
    assert refused.value.field == "workload_options.num_classes" and "holds 10 class folders" in str(refused.value)
    # digits' head is its ten digits: an eleventh class folder cannot be predicted.
    copy = _copy(digits_folder, tmp_path)
    for split in ("train", "val"):
        shutil.copytree(copy / split / "9", copy / split / "z-extra")
    with pytest.raises(ConfigError) as refused:
        run_here("digits", "cpu", power_meter="none", data=str(copy), target=TARGET)
    assert refused.value.field == "data" and "holds 11" in str(refused.value)
