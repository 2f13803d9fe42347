"""Tensor parallelism, sharding, recomputation and pipeline schedules (issue 32): the configuration's
own rules, and refusals in planning where no executor applies them yet (never silently ignored)."""

from __future__ import annotations

from typing import Any

import pytest

from core.api import run_here
from core.base.config import make_config
from core.base.errors import ConfigError


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"tensor_parallel": 3, "devices_per_replica": 4}, "tensor_parallel"),  # 4 devices are not 3 x stages
        ({"tensor_parallel": True}, "tensor_parallel"),  # strict: a boolean is no count
        ({"sharding": "zero3"}, "sharding"),
        ({"recompute": "some"}, "recompute"),
        ({"pipeline_schedule": "interleaved"}, "pipeline_schedule"),
    ],
)
def test_a_placement_the_configuration_cannot_hold_is_refused_naming_its_field(
    options: dict[str, Any], field: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        make_config(workload="fcnn", accelerator="cpu", **options)
    assert refused.value.field == field


def test_pipeline_stages_are_the_devices_of_a_replica_over_its_tensor_parallel_ones() -> None:
    config = make_config(workload="fcnn", accelerator="cpu", devices_per_replica=8, tensor_parallel=2)
    assert config.pipeline_parallel == 4
    assert make_config(workload="fcnn", accelerator="cpu").pipeline_parallel == 1


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"sharding": "fsdp", "framework": "tensorflow"}, "sharding"),
        ({"recompute": "full"}, "recompute"),
        ({"pipeline_schedule": "gpipe"}, "pipeline_schedule"),  # no pipeline stages
    ],
)
def test_what_no_executor_applies_yet_is_refused_before_running(options: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as refused:
        run_here("fcnn", "cpu", power_meter="none", **options)
    assert refused.value.field == field
