"""The NVIDIA plugin: discovery, visibility, NVML energy, peaks, a whole run.

Through the real pynvml (nvidia-ml-py, every release at hand) over the simulated libnvidia-ml.so.1 of
tests/native/simnvml.c (the `sim_nvml` fixture, tests/simnvml.py); CUDA_VISIBLE_DEVICES parsing and
the peak table are pure functions, tested as such.
"""

from __future__ import annotations

import ctypes.util
import dataclasses
import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from simnvml import (
    INSTANT_ABSENT,
    SimNode,
    a100,
    h200,
    init_and_shutdown_calls,
    lose_gpu,
    measure_nvml,
    p100,
    simulated_time,
)

import core.workloads
from core import Availability, Precision, RunConfig, hookimpl, make_config, run
from core.base.results import DeviceRecord
from core.executors.base import Executor
from core.testing import SimulatedClock, SimulatedExecutor, registered_plugins, run_context
from core_plugins.nvidia import nvml
from core_plugins.nvidia.accelerator import PROBE, NvidiaAccelerator
from core_plugins.nvidia.meter import NvmlMeterFactory
from core_plugins.nvidia.visibility import visible_nvml_indices

UUIDS = [
    "GPU-1111aaaa-0000-0000-0000-000000000000",
    "GPU-2222bbbb-0000-0000-0000-000000000000",
    "GPU-3333cccc-0000-0000-0000-000000000000",
]


@pytest.mark.parametrize(
    "variable,expected",
    [
        (None, [0, 1, 2]),
        ("2,0", [2, 0]),
        ("GPU-2222bbbb", [1]),
        ("3333cccc,0", [2, 0]),  # CUDA accepts a UUID without its GPU- prefix
        ("1,7,0", [1]),  # the list ends at the first entry that matches no device
        ("0,0,1", [0]),  # and at a repeated one
        ("", []),
        ("-1", []),
        ("GPU-", []),  # a prefix shared by every device is ambiguous
    ],
)
def test_cuda_visible_devices_follows_the_cuda_rules(variable: str | None, expected: list[int]) -> None:
    assert visible_nvml_indices(variable, UUIDS) == expected


def three_gpus() -> SimNode:
    """An H200 at a steady 400 W, an A100 whose power climbs from 100 W by 100 W a second, and a
    P100 (Pascal: no energy counter) at 150 W."""
    a100_ramping = a100(UUIDS[1], 100.0, 0x3B)
    a100_ramping.power_ramp_watts_per_second = 100.0
    gpus = [h200(UUIDS[0], 400.0, 0x19), a100_ramping, p100(UUIDS[2], 150.0, 0x5D)]
    return SimNode(gpus, driver="570.124.06", cuda_version=12080)


def test_discovery_describes_each_visible_gpu(sim_nvml: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    pynvml = sim_nvml(three_gpus())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,GPU-1111aaaa")
    devices = NvidiaAccelerator().visible_devices()
    assert [d.name for d in devices] == ["Tesla P100-PCIE-16GB", "NVIDIA H200"]
    assert [d.index for d in devices] == [0, 1]  # cuda:0, cuda:1 as this process numbers them
    p100_record, h200_record = devices
    assert p100_record.details["energy_counter"] is False and h200_record.details["energy_counter"] is True
    assert h200_record.details["uuid"] == UUIDS[0] and h200_record.details["compute_capability"] == "9.0"
    assert h200_record.details["power_limit_watts"] == 700.0 and h200_record.memory_bytes == 150_754_820_096
    nvidia = NvidiaAccelerator()
    assert nvidia.max_replicas_for(run_context(make_config(workload="fcnn", accelerator="nvidia"), nvidia)) == 2
    inits, shutdowns = init_and_shutdown_calls(pynvml)
    assert inits == shutdowns > 0


def test_driver_versions(sim_nvml: Callable[..., Any]) -> None:
    sim_nvml(three_gpus())
    assert NvidiaAccelerator().driver_versions() == {"nvidia_driver": "570.124.06", "cuda_driver": "12.8"}


def test_counter_energy_per_gpu_with_sampled_cross_check_and_sampled_fallback(
    sim_nvml: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    pynvml = sim_nvml(three_gpus())
    clock = simulated_time(pynvml)
    reads: list[tuple[str, int]] = []
    original = pynvml.nvmlDeviceGetTotalEnergyConsumption

    def recording(handle: Any) -> int:  # the binding's own call, watched on the way through
        value = original(handle)
        reads.append((str(pynvml.nvmlDeviceGetUUID(handle)), value))
        return int(value)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetTotalEnergyConsumption", recording)
    measurement = measure_nvml(clock, NvidiaAccelerator().visible_devices(), 0.5)
    assert measurement.energy_joules is not None, measurement.unavailable_reason
    details = measurement.details
    assert details["methods"] == {"gpu0": "counter", "gpu1": "counter", "gpu2": "sampled"}
    assert measurement.method == "mixed"
    # Counter devices: exactly the difference of the two counter reads, mJ -> J.
    for key, uuid in (("gpu0", UUIDS[0]), ("gpu1", UUIDS[1])):
        first, last = [value for u, value in reads if u == uuid]
        assert measurement.components_joules[key] == pytest.approx((last - first) / 1000.0)
    # In simulated time the window is 0.5 s exactly: 400 W for 0.5 s (to the counter's millijoule).
    assert measurement.components_joules["gpu0"] == pytest.approx(400.0 * 0.5, abs=0.002)
    # The A100 climbs from 100 W by 100 W/s since the driver loaded (when the clock began).
    assert measurement.components_joules["gpu1"] == pytest.approx(100.0 * 0.5 + 50.0 * 0.5**2, abs=0.002)
    # The P100 has no counter: its energy is the integral of 150 W over the window.
    assert measurement.components_joules["gpu2"] == pytest.approx(150.0 * 0.5, rel=1e-9)
    # Counter and sampled integral agree on the counter devices (the A100's power climbing all the
    # while: the trapezoid rule is exact for a ramp); their ratio is reported.
    for key in ("gpu0", "gpu1"):
        assert details["counter_over_sampled"][key] == pytest.approx(1.0, abs=1e-4)
    assert measurement.energy_joules == pytest.approx(sum(measurement.components_joules.values()))
    assert not measurement.warnings
    # The power timeline: every GPU's sampled power over the window, in the result, one span per sample.
    timeline = measurement.power_timeline
    assert timeline is not None and set(timeline.watts) == {"gpu0", "gpu1", "gpu2"}
    assert timeline.stop_seconds[-1] == pytest.approx(0.5, rel=1e-9) and len(timeline.start_seconds) == 50
    assert all(w == pytest.approx(150.0) for w in timeline.watts["gpu2"])
    inits, shutdowns = init_and_shutdown_calls(pynvml)
    assert inits == shutdowns > 0


def test_missing_instant_power_falls_back_to_the_average(sim_nvml: Callable[..., Any]) -> None:
    simulated = three_gpus()
    for gpu in simulated.gpus:
        gpu.instant = INSTANT_ABSENT
    clock = simulated_time(sim_nvml(simulated))
    measurement = measure_nvml(clock, NvidiaAccelerator().visible_devices(), 0.2)
    # The averaged reading of a steady 150 W, integrated over exactly 0.2 s of simulated time.
    assert measurement.components_joules["gpu2"] == pytest.approx(150.0 * 0.2, rel=1e-9)
    assert measurement.details["power_reading"]["gpu0"].startswith("nvmlDeviceGetPowerUsage")


def test_instant_power_is_preferred_and_a_binding_without_the_field_falls_back(
    sim_nvml: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    simulated = three_gpus()
    simulated.gpus[1].instant = INSTANT_ABSENT  # a driver without the field on one GPU
    pynvml = sim_nvml(simulated)
    clock = simulated_time(pynvml)
    measurement = measure_nvml(clock, NvidiaAccelerator().visible_devices(), 0.1)
    assert measurement.details["power_reading"] == {
        "gpu0": "NVML_FI_DEV_POWER_INSTANT",
        "gpu1": nvml.AVERAGED_POWER,
        "gpu2": "NVML_FI_DEV_POWER_INSTANT",
    }
    # A binding without the field: every release this project supports has it (11.525.150 on), so
    # the real module, minus that one constant, stands in for an older or trimmed one.
    monkeypatch.delattr(pynvml, "NVML_FI_DEV_POWER_INSTANT")
    measurement = measure_nvml(clock, NvidiaAccelerator().visible_devices(), 0.1)
    assert set(measurement.details["power_reading"].values()) == {nvml.AVERAGED_POWER}
    assert measurement.components_joules["gpu2"] == pytest.approx(150.0 * 0.1, rel=1e-9)


def test_a_lost_gpu_gives_no_number_but_the_reason(sim_nvml: Callable[..., Any]) -> None:
    pynvml = sim_nvml(three_gpus())
    config = make_config(workload="fcnn", accelerator="nvidia", power_sample_interval_seconds=0.01)
    devices = NvidiaAccelerator().visible_devices()
    meter = NvmlMeterFactory().meter_for(devices[:1], run_context(config))
    meter.start()
    lose_gpu(pynvml, 0)
    measurement = meter.stop()
    meter.close()
    assert measurement.energy_joules is None
    assert "gpu0: NVMLError_GpuIsLost: GPU is lost" in (measurement.unavailable_reason or "")
    inits, shutdowns = init_and_shutdown_calls(pynvml)
    assert inits == shutdowns > 0


# The plugin in a process of its own, so that pynvml's _LoadNvmlLibrary runs as on a node without the
# library: nvmlLib is None and CDLL("libnvidia-ml.so.1") raises OSError, which pynvml turns into
# NVMLError_LibraryNotFound. The plugin lets it out of the device listing and names it where versions
# are only informative.
MISSING_LIBRARY_SCRIPT = """
import pynvml
from core_plugins.nvidia.accelerator import PROBE, NvidiaAccelerator
try:
    NvidiaAccelerator().visible_devices()
except pynvml.NVMLError as exc:
    print("raised", type(exc).__name__, type(exc).__module__, "|", exc)
print("versions", NvidiaAccelerator().driver_versions())
"""


@pytest.mark.parametrize("library", ["absent", "unloadable"])
def test_missing_nvml_library_is_reported_as_such(pynvml_folder: Path | None, tmp_path: Path, library: str) -> None:
    """absent: nothing named libnvidia-ml.so.1 anywhere the loader looks (skipped where a driver has
    installed one). unloadable: a truncated file of that name first on LD_LIBRARY_PATH, as a broken
    driver install leaves; glibc stops at it ("file too short") on any machine."""
    if pynvml_folder is None:
        pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed (pip install -e '.[dev]')")
    folder = tmp_path / "lib"
    folder.mkdir()
    if library == "absent" and ctypes.util.find_library("nvidia-ml") is not None:
        pytest.skip("this machine has an NVIDIA driver's libnvidia-ml.so.1: it cannot be absent here")
    if library == "unloadable":
        (folder / "libnvidia-ml.so.1").write_bytes(b"")
    environment = {**os.environ, "LD_LIBRARY_PATH": str(folder)}
    environment.pop("SIM_NVML_NODE", None)
    if pynvml_folder is not None:
        environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pynvml_folder), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", MISSING_LIBRARY_SCRIPT],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    raised, versions = done.stdout.splitlines()
    assert raised == "raised NVMLError_LibraryNotFound pynvml | NVML Shared Library Not Found"
    assert (
        versions == "versions {'nvidia_driver': 'unknown (NVMLError_LibraryNotFound: NVML Shared Library Not Found)'}"
    )


def test_a_query_the_device_does_not_support_is_absent_not_an_error(sim_nvml: Callable[..., Any]) -> None:
    """The real binding's NVMLError subclasses, as the plugin sorts them: NotSupported (here for the
    enforced power limit) means "this device has none", and the GPU is still listed."""
    simulated = three_gpus()
    simulated.gpus[0].power_limit_watts = None
    pynvml = sim_nvml(simulated)
    pynvml.nvmlInit()
    try:
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetEnforcedPowerLimit(pynvml.nvmlDeviceGetHandleByIndex(0))
    finally:
        pynvml.nvmlShutdown()
    h200_record, a100_record, _ = NvidiaAccelerator().visible_devices()
    assert h200_record.details["power_limit_watts"] is None and h200_record.name == "NVIDIA H200"
    assert a100_record.details["power_limit_watts"] == 400.0


@pytest.mark.parametrize(
    "name,precision,tflops",
    [
        ("NVIDIA H200", Precision.bf16, 989.5),
        ("NVIDIA H100 80GB HBM3", Precision.tf32, 494.5),
        ("NVIDIA H100 PCIe", Precision.fp32, 51.0),
        ("NVIDIA H100 NVL", Precision.bf16, 835.5),
        ("NVIDIA GH200 480GB", Precision.fp16, 990.0),
        ("NVIDIA A100-SXM4-80GB", Precision.tf32, 156.0),
        ("NVIDIA A100-PCIE-40GB", Precision.bf16, 312.0),
        ("Tesla V100S-PCIE-32GB", Precision.fp16, 130.0),
        ("Tesla V100-PCIE-16GB", Precision.fp16, 112.0),
        ("Tesla V100-SXM2-16GB", Precision.fp16, 125.0),
        ("Tesla V100-PCIE-32GB", Precision.fp32, 14.0),
        ("Tesla T4", Precision.fp16, 65.0),
        ("Tesla T4", Precision.bf16, None),
        ("Quadro RTX 6000", Precision.fp16, 130.5),
        ("Quadro RTX 6000", Precision.fp32, 16.3),
        ("Quadro RTX 6000", Precision.tf32, None),
        ("NVIDIA RTX 6000 Ada Generation", Precision.fp32, None),  # another GPU, not in the table
        ("NVIDIA GeForce RTX 4090", Precision.fp32, None),
    ],
)
def test_peak_table(name: str, precision: Precision, tflops: float | None) -> None:
    peak = NvidiaAccelerator().peak_flops_per_second(DeviceRecord(index=0, name=name, kind="nvidia"), precision)
    if tflops is None:
        assert peak is None
    else:
        assert peak is not None and peak[0] == pytest.approx(tflops * 1e12) and "datasheet" in peak[1]


def test_tf32_and_bf16_need_ampere(sim_nvml: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from core import ConfigError

    sim_nvml(three_gpus())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    with pytest.raises(ConfigError) as caught:
        NvidiaAccelerator().validate_run(
            run_context(make_config(workload="fcnn", accelerator="nvidia", precision="bf16"))
        )
    assert caught.value.field == "precision" and "compute capability 8.0" in caught.value.allowed
    NvidiaAccelerator().validate_run(run_context(make_config(workload="fcnn", accelerator="nvidia", precision="fp16")))


class _NvmlThatFails:
    """pynvml's surface on a host whose device nodes exist but whose driver NVML cannot load."""

    class NVMLError_DriverNotLoaded(Exception):  # noqa: N801 - pynvml's name
        pass

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        raise self.NVMLError_DriverNotLoaded("Driver Not Loaded")

    def nvmlShutdown(self) -> None:  # noqa: N802
        pass


class _NvmlWithoutGpus(_NvmlThatFails):
    def nvmlInit(self) -> None:  # noqa: N802
        pass

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return 0


@pytest.mark.parametrize(
    "binding, reason",
    [
        (_NvmlThatFails, "NVML does not initialise (NVMLError_DriverNotLoaded: Driver Not Loaded)"),
        (_NvmlWithoutGpus, "NVML initialises but sees no GPU"),
    ],
)
def test_the_meter_is_available_only_where_nvml_initialises_and_sees_a_gpu(
    binding: type, reason: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Issue 26, third pass: device nodes alone (a driver not loaded, or of another version than its
    # library) made `core plugins` call the meter available.
    (tmp_path / "nvidia0").touch()
    probe = dataclasses.replace(PROBE, device_globs=(str(tmp_path / "nvidia[0-9]*"),))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    monkeypatch.setattr(nvml, "import_pynvml", binding)
    availability = NvmlMeterFactory(probe=probe).availability()
    assert not availability.available
    assert availability.reason is not None and availability.reason.startswith(reason), availability.reason


def test_meter_is_chosen_for_nvidia_and_needs_pynvml_and_a_driver(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import importlib.util

    device_node = tmp_path / "nvidia0"
    probe = dataclasses.replace(PROBE, device_globs=(str(tmp_path / "nvidia[0-9]*"),))
    factory = NvmlMeterFactory(probe=probe)
    assert factory.reads("nvidia") and not factory.reads("cpu")
    # Asked without importing the binding or calling NVML: the binding's presence (the dev extra
    # installs it) and the driver's device nodes. No GPU here: not available, and said why.
    assert not factory.availability().available
    assert factory.availability().reason == "no NVIDIA GPU or driver found (no /dev/nvidia* device nodes)"
    device_node.touch()
    monkeypatch.setattr(nvml, "nvml_problem", lambda: None)  # (NVML's own answer: the test below)
    assert factory.availability().available == (importlib.util.find_spec("pynvml") is not None)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    assert "pip install 'core[nvidia]'" in factory.availability().reason
    assert NvmlMeterFactory().probe is PROBE  # the accelerator's probe: one answer for both


def test_overlapping_users_share_one_nvml_initialisation(sim_nvml: Callable[..., Any]) -> None:
    pynvml = sim_nvml(three_gpus())
    with nvml.nvml_session():
        NvidiaAccelerator().visible_devices()  # opens and closes its own session inside
        assert init_and_shutdown_calls(pynvml) == (1, 0)
    assert init_and_shutdown_calls(pynvml) == (1, 1)
    assert nvml.nvml_session.users == 0


# --- a whole run through core, on a simulated two-GPU node --------------------------------------


STEP_SECONDS = 0.005  # of simulated time, per update


class SimulatedNvidia(NvidiaAccelerator):
    """The real plugin with only the device work simulated: discovery, validation, devices, peaks and
    the meter are the plugin's own, through the real pynvml over the simulated NVML library."""

    def __init__(self, clock: SimulatedClock) -> None:
        self.clock = clock

    def availability(self) -> Availability:
        return Availability.yes()  # no /dev/nvidia* here; NVML is the simulated library

    def create_executor(self, workload: Any, config: RunConfig, process: Any) -> Executor:
        # Each update keeps the (simulated) GPUs busy for 5 ms of the library's simulated time.
        return SimulatedExecutor(lambda: self.clock.advance(STEP_SECONDS))


#: no /dev/nvidia* here: the simulated NVML library stands for the driver (any file that exists will do)
SIMULATED_NODE_PROBE = dataclasses.replace(PROBE, device_globs=(__file__,))


class SimulatedNode:
    """The simulated node's accelerator and the plugin's meter, both on the library's simulated time."""

    def __init__(self, clock: SimulatedClock) -> None:
        self.clock = clock

    @hookimpl
    def core_register_accelerators(self, register: Callable[[Any], None]) -> None:
        register(SimulatedNvidia(self.clock))

    @hookimpl
    def core_register_power_meters(self, register: Callable[[Any], None]) -> None:
        register(NvmlMeterFactory(clock=self.clock, probe=SIMULATED_NODE_PROBE))


def two_h200s() -> SimNode:
    return SimNode([h200(UUIDS[0], 400.0, 0x19), h200(UUIDS[1], 250.0, 0x3B)], driver="570.124.06", cuda_version=12080)


def test_a_run_on_two_gpus_reports_devices_peaks_mfu_and_energy_per_gpu(sim_nvml: Callable[..., Any]) -> None:
    pynvml = sim_nvml(two_h200s())
    clock = simulated_time(pynvml)
    with registered_plugins(core.workloads, SimulatedNode(clock), entry_points=False):
        result = run(
            "fcnn",
            "nvidia",
            framework="tensorflow",
            replicas=2,
            precision="bf16",
            steps=60,
            warmup_steps=2,
            micro_batch_size=64,
            power_sample_interval_seconds=0.01,
        )
    assert result.status.ok, result.status
    assert [d.details["uuid"] for d in result.devices] == UUIDS[:2]
    # Peak: two H200 SXM at the dense bf16 datasheet figure; MFU follows from the workload's FLOPs.
    assert result.peak_flops_per_second == pytest.approx(2 * 989.5e12)
    assert result.model_flops_utilization == pytest.approx(result.flops_per_second / result.peak_flops_per_second)
    assert "H200" in (result.peak_flops_source or "")
    # Energy per GPU from the counters over the window, cross-checked by the sampled integral.
    energy = result.energy
    assert (
        energy is not None
        and energy.method == "counter"
        and energy.details["methods"] == {"gpu0": "counter", "gpu1": "counter"}
    )
    # The meter's window is the 60 updates of 5 ms of simulated time (the runner's own window is
    # real time: the simulated executor takes none); energy to the counter's millijoule.
    window = energy.details["window_seconds"]
    assert window == pytest.approx(60 * STEP_SECONDS, rel=1e-9)
    assert energy.components_joules["gpu0"] == pytest.approx(400.0 * window, abs=0.002)
    assert energy.components_joules["gpu1"] == pytest.approx(250.0 * window, abs=0.002)
    assert result.energy_joules == pytest.approx(650.0 * window, abs=0.004)
    assert result.samples_per_watt_hour == pytest.approx(result.window_samples / (result.energy_joules / 3600.0))
    assert all(r == pytest.approx(1.0, abs=1e-4) for r in energy.details["counter_over_sampled"].values())
    assert energy.power_timeline is not None and set(energy.power_timeline.watts) == {"gpu0", "gpu1"}
    assert not energy.warnings and not any(w.startswith("energy:") for w in result.warnings)
    assert result.environment.driver_versions == {"nvidia_driver": "570.124.06", "cuda_driver": "12.8"}
    inits, shutdowns = init_and_shutdown_calls(pynvml)
    assert inits == shutdowns > 0


def test_a_counter_that_disagrees_with_sampled_power_is_flagged_in_the_result(sim_nvml: Callable[..., Any]) -> None:
    simulated = two_h200s()
    simulated.gpus[0].counter_scale = 1.2  # gpu0's counter runs 20 % fast
    clock = simulated_time(sim_nvml(simulated))
    with registered_plugins(core.workloads, SimulatedNode(clock), entry_points=False):
        result = run(
            "fcnn",
            "nvidia",
            framework="tensorflow",
            replicas=2,
            steps=60,
            warmup_steps=0,
            micro_batch_size=8,
            power_sample_interval_seconds=0.01,
        )
    assert result.status.ok and result.energy is not None
    # The counter is still the measurement; the disagreement is said, for gpu0 only.
    assert result.energy.details["counter_over_sampled"]["gpu0"] == pytest.approx(1.2, abs=1e-4)
    [warning] = result.energy.warnings
    assert warning.startswith("gpu0: the energy counter and the sampled power integral differ by")
    assert f"energy: {warning}" in result.warnings
