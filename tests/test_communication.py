"""The time an update spends in collectives, from PyTorch's profiler (config.profile_communication):
one update after the window, each process's collectives attributed and gathered."""

from __future__ import annotations

import subprocess
import sys

import pytest
from launching import ROOT

from core.api import run_here
from core.base.errors import ConfigError
from core.base.results import RunResult
from core.executors.communication import collective_kind, union_seconds
from core.executors.pytorch import TorchExecutor
from core.testing import TINY_FCNN


def test_overlapping_collectives_count_once() -> None:
    # microseconds: two overlapping spans (0-10, 5-12), one inside another (20-30, 22-25), one apart
    intervals = [(5.0, 12.0), (0.0, 10.0), (20.0, 30.0), (22.0, 25.0), (40.0, 41.0)]
    assert union_seconds(intervals) == pytest.approx((12 + 10 + 1) / 1e6)
    assert union_seconds([]) == 0.0


def test_a_collective_is_named_by_its_kind() -> None:
    assert collective_kind("gloo:all_reduce") == "all_reduce"
    assert collective_kind("nccl:_reduce_scatter_base") == "_reduce_scatter_base"
    assert collective_kind("ncclDevKernel_AllReduce_Sum_f32_RING_LL") == "AllReduce"


def test_one_process_spends_no_time_in_collectives() -> None:
    result = run_here("fcnn", "cpu", workload_options=TINY_FCNN, steps=2, profile_communication=True)
    assert result.status.ok, result.status
    assert result.communication_seconds_per_update == 0.0 and result.communication_fraction == 0.0
    [profile] = result.executor_details["communication"]["per_rank"]
    assert profile["collectives"] == {} and profile["update_seconds"] > 0


@pytest.mark.parametrize(
    "settings",
    [
        {"mode": "inference", "profile_communication": True},
        {"profile_communication": 1},  # a number is not a boolean
    ],
)
def test_profiling_outside_a_training_window_is_refused_naming_the_field(settings: dict[str, object]) -> None:
    with pytest.raises(ConfigError) as refused:
        run_here("fcnn", "cpu", workload_options=TINY_FCNN, **settings)
    assert refused.value.field == "profile_communication"


def test_a_failing_profile_keeps_the_window_and_names_its_phase(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: TorchExecutor) -> None:
        raise RuntimeError("profiler failed")

    monkeypatch.setattr(TorchExecutor, "profile_communication", broken)
    result = run_here("fcnn", "cpu", workload_options=TINY_FCNN, steps=2, profile_communication=True)
    assert not result.status.ok and result.status.phase == "communication"
    assert result.throughput_per_second is not None and result.window_samples  # the window is kept
    assert result.communication_fraction is None


@pytest.mark.slow
def test_sharded_replicas_attribute_their_gathers_and_reductions() -> None:
    command = [sys.executable, "-m", "core.cli", "run", "gpt-800m", "--accelerator", "cpu", "--replicas", "2"]
    command += ["--sharding", "fsdp", "--batch-size", "4", "--steps", "2", "--warmup-steps", "1"]
    command += ["-o", "variant=small", "-o", "vocabulary=96", "-o", "sequence_length=16", "--profile-communication"]
    completed = subprocess.run([*command, "--json"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = RunResult.model_validate_json(completed.stdout)
    assert result.status.ok and result.window_updates == 2  # the profiled update is not the window's
    profiles = result.executor_details["communication"]["per_rank"]
    assert len(profiles) == 2
    for profile in profiles:
        assert profile["source"] == "host collective spans"
        # FSDP2 gathers each of its 3 units' weights (2 layers, the root) for the forward at least,
        # and reduce-scatters the gradients (gloo runs a reduce-scatter as an all-reduce)
        assert profile["collectives"]["all_gather"]["count"] >= 3
        assert profile["collectives"]["all_reduce"]["count"] >= 1
        assert 0 < profile["communication_seconds"] <= profile["update_seconds"]
    assert result.communication_fraction is not None and 0 < result.communication_fraction <= 1
