"""Real-data loaders for the detection and segmentation workloads, on tiny generated fixtures: the
COCO JSON layout and the Cityscapes folder layout."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from core import ConfigError, run
from core.data import detect_format
from core.data.cityscapes import CityscapesSegmentation
from core.data.coco import MAX_OBJECTS, CocoDetection

pytest.importorskip("PIL")


def write_png(path: Path, array: np.ndarray) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)


def coco_fixture(root: Path, annotations: list[dict] | None = None) -> Path:
    rng = np.random.default_rng(0)
    for name, (height, width) in (("a.png", (40, 80)), ("b.png", (60, 30))):
        write_png(root / "train2017" / name, rng.integers(0, 255, (height, width, 3), dtype=np.uint8))
    document = {
        "images": [{"id": 1, "file_name": "a.png"}, {"id": 2, "file_name": "b.png"}],
        "categories": [{"id": 90, "name": "toothbrush"}, {"id": 1, "name": "person"}],
        "annotations": annotations
        if annotations is not None
        else [
            {"id": 1, "image_id": 1, "category_id": 1, "bbox": [10, 5, 20, 10], "iscrowd": 0},
            {"id": 2, "image_id": 1, "category_id": 90, "bbox": [0, 0, 8, 8], "iscrowd": 1},
            {"id": 3, "image_id": 2, "category_id": 90, "bbox": [3, 6, 12, 30], "iscrowd": 0},
        ],
    }
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    (root / "annotations" / "instances_train2017.json").write_text(json.dumps(document))
    return root


def cityscapes_fixture(root: Path) -> Path:
    rng = np.random.default_rng(1)
    for city, frame in (("aachen", "aachen_000000_000019"), ("bremen", "bremen_000001_000019")):
        write_png(
            root / "leftImg8bit/train" / city / f"{frame}_leftImg8bit.png",
            rng.integers(0, 255, (64, 128, 3), dtype=np.uint8),
        )
        labels = rng.integers(0, 19, (64, 128), dtype=np.uint8)
        labels[:4] = 255
        write_png(root / "gtFine/train" / city / f"{frame}_gtFine_labelTrainIds.png", labels)
    return root


def test_coco_samples_are_resized_padded_and_boxed(tmp_path: Path) -> None:
    root = coco_fixture(tmp_path)
    assert detect_format(root) == "coco"
    dataset = CocoDetection(root, (3, 64, 64))
    image, target = dataset[0]  # 40x80 -> 32x64, padded to 64x64
    assert image.shape == (3, 64, 64) and target.shape == (MAX_OBJECTS, 5)
    assert image[:, 32:].abs().sum() == 0
    assert target[0].tolist() == [0.0, 8.0, 4.0, 24.0, 12.0]  # person (id 1) is class 0; boxes scaled 0.8
    assert (target[1:, 0] == -1).all()  # the crowd box is left out
    _, target = dataset[1]
    assert target[0, 0] == 1  # category 90: the second in id order


def test_a_bad_coco_annotation_is_named(tmp_path: Path) -> None:
    root = coco_fixture(tmp_path, [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [1, 2, 3]}])
    with pytest.raises(ConfigError, match=r"annotations\[0\]\.bbox") as error:
        CocoDetection(root, (3, 64, 64))
    assert error.value.field == "data"
    root = coco_fixture(tmp_path, [{"id": 1, "image_id": 1, "category_id": 7, "bbox": [1, 2, 3, 4]}])
    with pytest.raises(ConfigError, match=r"annotations\[0\]\.category_id"):
        CocoDetection(root, (3, 64, 64))


def test_cityscapes_samples_are_crops_with_train_ids(tmp_path: Path) -> None:
    root = cityscapes_fixture(tmp_path)
    assert detect_format(root) == "cityscapes"
    dataset = CityscapesSegmentation(root, (3, 32, 64))
    assert len(dataset) == 2
    image, mask = dataset[0]
    assert image.shape == (3, 32, 64) and mask.shape == (32, 64)
    assert set(mask.unique().tolist()) <= set(range(19)) | {255}
    assert dataset[0][1].equal(mask)  # the same crop every time
    padded_image, padded_mask = CityscapesSegmentation(root, (3, 80, 128))[1]
    assert (padded_mask[64:] == 255).all() and padded_image[:, 64:].abs().sum() == 0


def test_cityscapes_without_label_maps_is_refused(tmp_path: Path) -> None:
    root = cityscapes_fixture(tmp_path)
    next((root / "gtFine/train/aachen").iterdir()).unlink()
    with pytest.raises(ConfigError, match="labelTrainIds") as error:
        CityscapesSegmentation(root, (3, 32, 64))
    assert error.value.field == "data"


@pytest.mark.slow
def test_deeplab_and_dino_train_on_the_fixtures(tmp_path: Path) -> None:
    for name, root in (
        ("deeplabv3plus-r101", cityscapes_fixture(tmp_path / "cityscapes")),
        ("dino-swin-l", coco_fixture(tmp_path / "coco")),
    ):
        result = run(
            name,
            "cpu",
            data=str(root),
            data_workers=0,
            micro_batch_size=2,
            steps=1,
            warmup_steps=0,
            power_meter="none",
            workload_options={"variant": "small"},
        )
        assert result.status.ok, result.status


def test_a_classifier_refuses_coco_data(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        run("resnet50", "cpu", data=str(coco_fixture(tmp_path)), steps=1, power_meter="none")
    assert refused.value.field == "data"
