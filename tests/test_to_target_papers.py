"""The papers' studies to a target (docs/seeds.md#data-you-supply): data named by an environment
variable, each real epoch's time in the result, and the figures read from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.base.errors import ConfigError
from core.base.results import TargetOutcome
from core.contract.manager import PluginManager
from core.running.planning import plan_run
from core.storage.metrics import METRICS_BY_NAME
from core.sweep.reference import _quantities
from core.workloads.digits import write_image_folder

TARGET = {"metric": "top1", "value": 0.9, "max_epochs": 3}


@pytest.fixture(scope="module")
def manager() -> PluginManager:
    from core.contract.manager import get_plugin_manager

    return get_plugin_manager()


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_image_folder(tmp_path_factory.mktemp("digits") / "folder", per_class=3)


def test_write_image_folder_keeps_each_class_in_each_split(folder: Path) -> None:
    for split in ("train", "val"):
        classes = sorted((folder / split).iterdir())
        assert [path.name for path in classes] == [str(digit) for digit in range(10)]
        assert all(len(list(path.iterdir())) == 3 for path in classes)


@pytest.mark.parametrize("spelling", ["$I31_DIGITS_FOLDER", "${I31_DIGITS_FOLDER}"])
def test_data_from_an_environment_variable_is_its_path(
    spelling: str, folder: Path, manager: PluginManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("I31_DIGITS_FOLDER", str(folder))
    plan = plan_run(manager, "digits", "cpu", {"data": spelling, "target": TARGET, "micro_batch_size": 4})
    assert plan.config.data == str(folder)


def test_an_unset_data_variable_is_refused_naming_data_and_the_variable(
    manager: PluginManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("I31_DIGITS_FOLDER", raising=False)
    with pytest.raises(ConfigError) as refused:
        plan_run(manager, "digits", "cpu", {"data": "$I31_DIGITS_FOLDER", "target": TARGET})
    assert refused.value.field == "data" and "I31_DIGITS_FOLDER is not set" in str(refused.value)


def test_a_path_that_only_looks_like_a_variable_is_a_path(manager: PluginManager) -> None:
    with pytest.raises(ConfigError) as refused:
        plan_run(manager, "digits", "cpu", {"data": "$not a name", "target": TARGET})
    assert refused.value.field == "data" and "not set" not in str(refused.value)


def test_a_run_to_a_target_times_each_real_epoch(folder: Path) -> None:
    import core

    result = core.run(
        "digits", "cpu", data=str(folder), target=TARGET, micro_batch_size=4, power_meter="none", data_workers=0
    )
    outcome = result.to_target
    assert outcome is not None and outcome.epoch_samples == (30 // 4) * 4
    whole_epochs = outcome.samples // outcome.epoch_samples
    assert len(outcome.epoch_seconds) == whole_epochs == len(outcome.curve)
    # Evaluated after every epoch: each point's clock holds the epochs before it and the evaluations
    # (and the bookkeeping between them, untimed by either).
    assert all(seconds > 0 for seconds in outcome.epoch_seconds)
    for index, point in enumerate(outcome.curve):
        training = sum(outcome.epoch_seconds[: index + 1])
        evaluations = sum(p.evaluation_seconds for p in outcome.curve[: index + 1])
        assert training + evaluations <= point.seconds
        later = outcome.curve[index + 1].seconds if index + 1 < len(outcome.curve) else None
        assert later is None or training + evaluations < later


def test_the_epoch_figures_read_the_real_epochs() -> None:
    outcome = TargetOutcome(
        metric="top1",
        target=0.9,
        higher_is_better=True,
        reached=False,
        stopped_by="max_epochs",
        training_seconds=6.0,
        evaluation_seconds=0.5,
        epochs=3.0,
        samples=300,
        epoch_seconds=[4.0, 1.0, 2.0],
        epoch_samples=100,
    )

    def figure(name: str) -> object:
        metric = METRICS_BY_NAME[name]
        return metric._read(outcome if metric.source == "to_target" else outcome.epoch_seconds)

    assert figure("target_first_epoch_seconds") == 4.0
    assert figure("target_epoch_seconds") == 1.5
    assert figure("target_first_epoch_throughput_per_second") == 25.0
    assert figure("target_epoch_throughput_per_second") == pytest.approx(100 / 1.5)
    quantities = _quantities()  # a paper's reference row may name each
    assert {"target_epoch_throughput_per_second", "target_final_top1", "target_training_seconds"} <= set(quantities)


def test_a_result_before_schema_1_13_loads_without_epoch_times() -> None:
    outcome = TargetOutcome.model_validate(
        {
            "metric": "top1",
            "target": 0.9,
            "higher_is_better": True,
            "reached": True,
            "stopped_by": "target",
            "training_seconds": 1.0,
            "evaluation_seconds": 0.1,
            "epochs": 1.0,
            "samples": 10,
        }
    )
    assert outcome.epoch_seconds == [] and outcome.epoch_samples is None
    assert METRICS_BY_NAME["target_epoch_seconds"]._read(outcome.epoch_seconds) is None
