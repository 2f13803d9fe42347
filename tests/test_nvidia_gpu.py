"""On a real NVIDIA GPU (skipped elsewhere): placement, precision, NVML energy against an
independent counter read around the same window."""

from __future__ import annotations

from typing import Any

import pytest

from core.energy import DeviceEnergyMeter
from core.testing import TINY_FCNN, registered_plugins, run_tiny

pytestmark = pytest.mark.gpu


def test_fcnn_trains_in_bf16_with_mfu_and_counter_energy() -> None:
    with registered_plugins():
        result = run_tiny("fcnn", "nvidia", precision="bf16", micro_batch_size=256, steps=50,
                          power_meter="auto", workload_options={**TINY_FCNN, "hidden_width": 1024})
    assert result.executor_details["device"] == "cuda:0" and result.executor_details["autocast_dtype"] == "bfloat16"
    assert result.flops_per_second == pytest.approx(result.flops_per_sample * result.throughput_per_second)
    assert result.model_flops_utilization is not None and 0 < result.model_flops_utilization < 1
    assert result.energy.method == "counter" and result.energy_joules > 0
    assert result.devices[0].details["uuid"].startswith("GPU-")


def test_fp32_turns_tf32_off_for_matmul_and_convolution() -> None:
    with registered_plugins():
        result = run_tiny("fcnn", "nvidia", precision="fp32")
    assert result.executor_details["matmul_allow_tf32"] is False
    assert result.executor_details["cudnn_allow_tf32"] is False


def test_window_energy_matches_an_independent_counter_read(monkeypatch: pytest.MonkeyPatch) -> None:
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)  # the test pins CUDA_VISIBLE_DEVICES-free device 0
    independent: dict[str, int] = {}
    original_start, original_stop = DeviceEnergyMeter.start, DeviceEnergyMeter.stop

    def start(self: Any) -> None:
        independent["start"] = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        original_start(self)

    def stop(self: Any) -> Any:
        measurement = original_stop(self)
        independent["stop"] = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        return measurement

    monkeypatch.setattr(DeviceEnergyMeter, "start", start)
    monkeypatch.setattr(DeviceEnergyMeter, "stop", stop)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with registered_plugins():
        result = run_tiny("fcnn", "nvidia", precision="bf16", micro_batch_size=4096, steps=400,
                          power_meter="nvml", workload_options={**TINY_FCNN, "hidden_width": 4096, "input_width": 4096})
    pynvml.nvmlShutdown()
    expected_joules = (independent["stop"] - independent["start"]) / 1000.0
    assert result.energy_joules == pytest.approx(expected_joules, rel=0.01)
    assert "counter_over_sampled" in result.energy.details
