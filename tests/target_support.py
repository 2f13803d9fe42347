"""What the tests of runs to a target read from files share: digits' split sizes, the check that a run
from files reached its target with its curve, and an executor over the digits of a data source."""

from __future__ import annotations

from typing import Any

import pytest

from core.base.config import make_config
from core.base.distributed import SINGLE_PROCESS
from core.base.results import RunResult, RunState

TARGET = {"metric": "top1", "value": 0.9, "max_epochs": 20}
TRAINING, HELD_OUT = 1437, 360  # the in-memory split's sizes (held_out_fraction 0.2)


def assert_reached_from_files(result: RunResult, data_format: str) -> None:
    """``result`` reached top-1 0.9 reading digits' splits in ``data_format``, at its first evaluation
    at or above it, every evaluation a whole number of epochs' updates of 32."""
    outcome = result.to_target
    assert result.status.state is RunState.ok and outcome is not None
    assert outcome.reached and outcome.stopped_by == "target"
    last = outcome.curve[-1]
    assert last.value >= 0.9 and all(point.value < 0.9 for point in outcome.curve[:-1])
    assert outcome.samples_to_target == len(outcome.curve) * (TRAINING // 32) * 32
    assert outcome.epochs_to_target == pytest.approx(outcome.samples_to_target / TRAINING)
    assert result.samples_per_epoch == TRAINING
    details = result.executor_details
    assert details["data"] == "files" and details["data_format"] == data_format
    assert (details["dataset_samples"], details["held_out_samples"]) == (TRAINING, HELD_OUT)
    assert set(last.metrics) == {"top1", "loss"}


def digits_executor(data: str, seed: int = 0) -> Any:
    """A PyTorch executor of digits to :data:`TARGET`, micro-batch 32, reading ``data`` (or its own split)."""
    from core.executors.pytorch import TorchExecutor, TorchPlacement
    from core.workloads.digits import Digits, DigitsOptions

    config = make_config(workload="digits", accelerator="cpu", micro_batch_size=32, data=data, target=TARGET, seed=seed)
    return TorchExecutor(
        Digits().build_torch(DigitsOptions(), seed=seed), config, TorchPlacement("cpu"), SINGLE_PROCESS
    )
