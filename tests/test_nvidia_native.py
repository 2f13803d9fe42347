"""The NVIDIA plugin through the real pynvml (nvidia-ml-py) over a simulated libnvidia-ml.so.1.

Only the C library (tests/native/simnvml.c) is simulated: names, ctypes structures, error classes
and missing-symbol handling are nvidia-ml-py's own. See tests/simnvml.py and docs/nvidia.md.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from simnvml import (
    INSTANT_ABSENT,
    INSTANT_DOUBLE,
    INSTANT_FAILS_LATER,
    SimMig,
    SimNode,
    a100,
    h200,
    installed_pynvml_file,
    measure_nvml,
    simulated_time,
    v100,
)

from core_plugins.nvidia import nvml
from core_plugins.nvidia.accelerator import NvidiaAccelerator

H200_A = "GPU-0a1b2c3d-0000-4000-8000-000000000001"
H200_B = "GPU-0a1b2c3d-0000-4000-8000-000000000002"
A100 = "GPU-a100a100-0000-4000-8000-000000000003"
V100 = "GPU-v100v100-0000-4000-8000-000000000004"
MIG_A = "MIG-5c5c5c5c-0000-4000-8000-00000000000a"
MIG_B = "MIG-5c5c5c5c-0000-4000-8000-00000000000b"


def node(**changes: Any) -> SimNode:
    """Two H200s, an A100 and a V100, as NVML enumerates them (PCI bus order)."""
    gpus = [h200(H200_A, 400.0, 0x19), h200(H200_B, 250.0, 0x3B), a100(A100, 200.0, 0x4C), v100(V100, 150.0, 0x5D)]
    return SimNode(gpus=gpus, **changes)


def with_migs() -> SimNode:
    simulated = node()
    simulated.gpus[2].migs = [
        SimMig(MIG_A, 1, 0, 10_737_418_240, "NVIDIA A100-SXM4-80GB MIG 1g.10gb"),
        SimMig(MIG_B, 2, 0, 10_737_418_240, "NVIDIA A100-SXM4-80GB MIG 1g.10gb"),
    ]
    return simulated


def test_pynvml_loads_the_simulated_library_by_its_own_loader(
    simnvml_libraries: dict[str, Path], pynvml_folder: Path | None, tmp_path: Path
) -> None:
    """No patching: pynvml's _LoadNvmlLibrary does CDLL("libnvidia-ml.so.1"), found on LD_LIBRARY_PATH."""
    node_file = tmp_path / "node.txt"
    node_file.write_text(node().text())
    script = (
        "import pynvml; print(pynvml.__file__); pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(3);"
        "print(pynvml.nvmlDeviceGetCount(), pynvml.nvmlDeviceGetName(h), pynvml.nvmlDeviceGetPciInfo(h).busId,"
        "pynvml.nvmlSystemGetDriverVersion()); pynvml.nvmlShutdown()"
    )
    environment = {
        **os.environ,
        "LD_LIBRARY_PATH": str(simnvml_libraries["current"].parent),
        "SIM_NVML_NODE": str(node_file),
    }
    if pynvml_folder is not None:
        environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pynvml_folder), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", script], env=environment, capture_output=True, text=True, check=True, timeout=60
    )
    module_file, *printed = done.stdout.split()
    assert (
        Path(module_file).resolve()
        == (pynvml_folder / "pynvml.py" if pynvml_folder else installed_pynvml_file()).resolve()
    )
    assert printed == ["4", "Tesla", "V100-SXM2-16GB", "00000000:5D:00.0", "535.104.05"]


def test_discovery_and_versions_through_the_real_binding(
    sim_nvml: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    sim_nvml(node())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,GPU-0a1b2c3d-0000-4000-8000-000000000002")
    v100_record, h200_record = NvidiaAccelerator().visible_devices()
    assert (v100_record.name, v100_record.details["uuid"]) == ("Tesla V100-SXM2-16GB", V100)
    assert v100_record.details["compute_capability"] == "7.0" and v100_record.details["energy_counter"] is True
    assert h200_record.details["power_limit_watts"] == 700.0 and h200_record.memory_bytes == 150_754_820_096
    assert NvidiaAccelerator().driver_versions() == {"nvidia_driver": "535.104.05", "cuda_driver": "12.2"}


def test_an_older_driver_without_get_architecture_still_lists_the_gpus(sim_nvml: Callable[..., Any]) -> None:
    """An older driver lacks nvmlDeviceGetArchitecture: pynvml raises NVMLError_FunctionNotFound,
    not NVMLError_NotSupported. The counter is then judged by compute capability (Volta = 7.0)."""
    pynvml = sim_nvml(node(driver="450.80.02", cuda_version=11000), driver="no-architecture")
    clock = simulated_time(pynvml)
    pynvml.nvmlInit()
    try:
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):
            pynvml.nvmlDeviceGetArchitecture(pynvml.nvmlDeviceGetHandleByIndex(0))
    finally:
        pynvml.nvmlShutdown()
    devices = NvidiaAccelerator().visible_devices()
    assert [d.name for d in devices] == ["NVIDIA H200", "NVIDIA H200", "NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-16GB"]
    assert all(d.details["energy_counter"] for d in devices)
    measurement = measure_nvml(clock, devices[3:], 0.2)
    assert measurement.details["methods"] == {"gpu3": "counter"}
    assert measurement.components_joules["gpu3"] == pytest.approx(150.0 * 0.2, abs=0.002)


def test_counter_energy_and_instant_power_through_the_real_binding(sim_nvml: Callable[..., Any]) -> None:
    clock = simulated_time(sim_nvml(node()))
    devices = NvidiaAccelerator().visible_devices()
    measurement = measure_nvml(clock, devices, 0.4)
    assert measurement.energy_joules is not None, measurement.unavailable_reason
    assert measurement.details["methods"] == {f"gpu{i}": "counter" for i in range(4)}
    assert set(measurement.details["power_reading"].values()) == {nvml.INSTANT_POWER}
    for key, watts in (("gpu0", 400.0), ("gpu1", 250.0), ("gpu2", 200.0), ("gpu3", 150.0)):
        assert measurement.components_joules[key] == pytest.approx(watts * 0.4, abs=0.002)
        assert measurement.details["counter_over_sampled"][key] == pytest.approx(1.0, abs=1e-4)


def test_instant_power_is_read_as_the_value_type_the_driver_names(sim_nvml: Callable[..., Any]) -> None:
    """The field value is a union: a driver that answers with a double must not be read as uiVal."""
    simulated = node()
    simulated.gpus[3].instant = INSTANT_DOUBLE
    simulated.gpus[3].architecture = 4  # a counterless part, so the sampled power is the energy
    clock = simulated_time(sim_nvml(simulated))
    devices = NvidiaAccelerator().visible_devices()[3:]
    measurement = measure_nvml(clock, devices, 0.3)
    assert measurement.details["power_reading"] == {"gpu3": nvml.INSTANT_POWER}
    assert measurement.details["methods"] == {"gpu3": "sampled"}
    assert measurement.components_joules["gpu3"] == pytest.approx(150.0 * 0.3, rel=1e-9)


def test_a_driver_without_the_instant_field_falls_back_to_the_averaged_reading(sim_nvml: Callable[..., Any]) -> None:
    simulated = node()
    simulated.gpus[0].instant = INSTANT_ABSENT
    clock = simulated_time(sim_nvml(simulated))
    measurement = measure_nvml(clock, NvidiaAccelerator().visible_devices()[:2], 0.2)
    assert measurement.details["power_reading"] == {"gpu0": nvml.AVERAGED_POWER, "gpu1": nvml.INSTANT_POWER}
    assert measurement.details["counter_over_sampled"]["gpu0"] == pytest.approx(1.0, abs=1e-4)


def test_an_instant_field_that_fails_per_read_leaves_holes_not_numbers(sim_nvml: Callable[..., Any]) -> None:
    simulated = node()
    simulated.gpus[3].instant = INSTANT_FAILS_LATER  # supported when probed, failing from 50 ms on
    simulated.gpus[3].architecture = 4
    clock = simulated_time(sim_nvml(simulated))
    measurement = measure_nvml(clock, NvidiaAccelerator().visible_devices()[3:], 0.3)
    assert measurement.energy_joules is None
    assert "gpu3" in (measurement.unavailable_reason or "")


@pytest.mark.parametrize("variable", [MIG_A, f"MIG-{A100}/1/0"])
def test_a_mig_device_in_cuda_visible_devices_is_placed_on_and_measured_by_its_parent(
    sim_nvml: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    clock = simulated_time(sim_nvml(with_migs()))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", variable)
    [device] = NvidiaAccelerator().visible_devices()
    # Placement: the MIG device itself (what torch reports as cuda:0 in this process).
    assert device.details["uuid"] == MIG_A and device.details["mig_parent_uuid"] == A100
    assert device.name == "NVIDIA A100-SXM4-80GB MIG 1g.10gb" and device.memory_bytes == 10_737_418_240
    assert device.details["compute_capability"] == "8.0" and device.details["energy_counter"] is True
    # The A100 datasheet peak is the whole GPU's, not a 1g.10gb slice's.
    from core import Precision

    assert NvidiaAccelerator().peak_flops_per_second(device, Precision.bf16) is None
    # Energy: the parent A100's counter (200 W), said to be shared by the MIG instances on it.
    measurement = measure_nvml(clock, [device], 0.3)
    assert measurement.details["methods"] == {"gpu0": "counter"}
    assert measurement.components_joules["gpu0"] == pytest.approx(200.0 * 0.3, abs=0.002)
    assert measurement.details["mig_parent_gpu"] == {"gpu0": A100}
    [warning] = measurement.warnings
    assert warning.startswith(f"gpu0: MIG device {MIG_A} has no energy reading of its own") and A100 in warning


def test_two_mig_devices_on_one_gpu_count_its_energy_once(
    sim_nvml: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = simulated_time(sim_nvml(with_migs()))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{MIG_B},MIG-{A100}/1/0,0")
    devices = NvidiaAccelerator().visible_devices()
    assert [d.details["uuid"] for d in devices] == [MIG_B, MIG_A, H200_A]
    measurement = measure_nvml(clock, devices, 0.3)
    assert set(measurement.components_joules) == {"gpu0", "gpu2"}
    assert measurement.energy_joules == pytest.approx((200.0 + 400.0) * 0.3, abs=0.004)
    assert any(w.startswith("gpu1: MIG device") and "already measured as gpu0" in w for w in measurement.warnings)


def test_an_unknown_mig_device_ends_the_list_as_cuda_does(
    sim_nvml: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    sim_nvml(with_migs())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"1,MIG-{A100}/9/0,0")
    assert [d.details["uuid"] for d in NvidiaAccelerator().visible_devices()] == [H200_B]
