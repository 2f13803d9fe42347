"""Training to a target from TFRecord files split into train/ and val/ with core's Keras executor
(docs/to-target.md, "From shards and record files"): digits reaches its target reading the records,
on the in-memory run's curve, and the records' evaluation equals the in-memory one on the same weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from core.api import run_here
from core.base.config import make_config
from core.base.results import RunState

pytestmark = [pytest.mark.tensorflow, pytest.mark.slow]
pytest.importorskip("sklearn")

TARGET = {"metric": "top1", "value": 0.9, "max_epochs": 20}
TRAINING, HELD_OUT = 1437, 360


@pytest.fixture(scope="module")
def digits_records(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from core.workloads.digits import write_records

    return write_records(tmp_path_factory.mktemp("digits") / "records")


def test_the_records_are_indexed_from_their_framing_and_decode_to_the_png_rounded_images(digits_records: Path) -> None:
    from core.data.split_index import split_samples
    from core.data.tf_records import RecordSplit
    from core.workloads.digits import DigitsOptions, split_digits

    assert split_samples(digits_records / "train", "tfrecord") == TRAINING
    assert split_samples(digits_records / "val", "tfrecord") == HELD_OUT
    _, _, test_x, test_y = split_digits(DigitsOptions())
    held_out = RecordSplit(digits_records / "val", (8, 8, 1))
    images, labels = held_out.take(np.arange(HELD_OUT)[::-1])  # any order, across the files
    assert images.shape == (HELD_OUT, 8, 8, 1) and (labels == test_y[::-1]).all()
    assert np.abs(images.reshape(HELD_OUT, -1) - np.rint(test_x[::-1] * 255.0) / 255.0).max() <= 1e-6


def test_keras_digits_reach_their_target_from_records_on_the_in_memory_curve(digits_records: Path) -> None:
    result = run_here(
        "digits", "cpu", framework="tensorflow", power_meter="none", data=str(digits_records), target=TARGET
    )
    outcome = result.to_target
    assert result.status.state is RunState.ok and outcome is not None
    assert outcome.reached and outcome.stopped_by == "target"
    last = outcome.curve[-1]
    assert last.value >= 0.9 and all(point.value < 0.9 for point in outcome.curve[:-1])
    assert outcome.samples_to_target == len(outcome.curve) * (TRAINING // 32) * 32
    details = result.executor_details
    assert details["data"] == "files" and details["data_format"] == "tfrecord"
    assert (details["dataset_samples"], details["held_out_samples"]) == (TRAINING, HELD_OUT)
    # The records hold the in-memory split in its order, so the same seed draws the same batches: the
    # curve is the in-memory run's but for the PNGs' rounding (measured: the same top-1 to the image).
    memory = run_here("digits", "cpu", framework="tensorflow", power_meter="none", target=TARGET).to_target
    assert memory is not None and len(memory.curve) == len(outcome.curve)
    for ours, theirs in zip(outcome.curve, memory.curve):
        assert abs(ours.value - theirs.value) <= 3 / HELD_OUT


def _executor(data: str) -> Any:
    import tensorflow as tf

    from core.executors.keras import KerasExecutor, KerasPlacement
    from core.workloads.digits import Digits, DigitsOptions

    config = make_config(
        workload="digits", accelerator="cpu", framework="tensorflow", micro_batch_size=32, data=data, target=TARGET
    )
    placement = KerasPlacement(
        make_strategy=lambda: tf.distribute.OneDeviceStrategy("/cpu:0"), replicas=1, device_label="/cpu:0"
    )
    return KerasExecutor(Digits().build_keras(DigitsOptions(), seed=0), config, placement)


def test_the_records_evaluation_is_the_in_memory_one_on_the_png_rounded_images(digits_records: Path) -> None:
    from core.executors.keras import ArraySplit
    from core.workloads.digits import DigitsOptions, split_digits

    files, memory = _executor(str(digits_records)), None
    try:
        files.run_steps(TRAINING // 32)
        files.synchronize()
        from_files = files.evaluate()
        weights = files.model.get_weights()
        files.close()
        memory = _executor("synthetic")
        memory.model.set_weights(weights)
        _, _, test_x, test_y = split_digits(DigitsOptions())
        memory._evaluation_split = ArraySplit(
            (np.rint(test_x * 255.0) / 255.0).astype("float32").reshape(-1, 8, 8, 1), test_y
        )
        in_memory = memory.evaluate()
    finally:
        files.close()
        if memory is not None:
            memory.close()
    assert from_files is not None and in_memory is not None
    assert from_files["top1"] > 0.5  # trained: the labels the records gave are the digits'
    assert from_files["top1"] == in_memory["top1"]
    assert from_files["loss"] == pytest.approx(in_memory["loss"], rel=1e-5)
