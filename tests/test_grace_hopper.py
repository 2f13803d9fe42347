"""The Grace Hopper module meter (plugins/nvidia/grace_hopper.py) over a fake hwmon tree laid out as
a GH200 node's: the sensors jpwr's gh method reads (FZJ-JSC/jpwr, src/jpwr/sys/gh.py), in simulated
time so that a busy machine measures the same."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from core.energy.combined import Covers, device_meter_counted
from core.testing import SimulatedClock, run_context
from core_plugins.nvidia.grace_hopper import (
    GraceHopperModuleMeter,
    GraceHopperModuleMeterFactory,
    discover_module_sensors,
)

# One hwmon device per sensor, four sockets (CARAML's JEDI node: 4x GH200), as their
# power1_oem_info names them; hwmon0 is a sensor without one (a CPU temperature), which is skipped.
SENSORS = [f"{kind} Power Socket {socket}" for socket in range(4) for kind in ("Module", "Grace", "CPU", "SysIO")]


def hwmon_tree(root: Path, watts: dict[str, Callable[[float], float]], clock: SimulatedClock) -> Callable[[Path], str]:
    """Make the tree under ``root``; return a reader whose power files follow ``watts`` (by sensor
    label, in W) at the clock's time, in microwatts as the kernel writes them."""
    (root / "hwmon0" / "device").mkdir(parents=True)
    power: dict[Path, Callable[[float], float]] = {}
    for number, label in enumerate(SENSORS, start=1):
        device = root / f"hwmon{number}" / "device"
        device.mkdir(parents=True)
        (device / "power1_oem_info").write_text(label + "\n")
        (device / "power1_average").write_text("0\n")
        power[device / "power1_average"] = watts.get(label, lambda t: 50.0)

    def read_text(path: Path) -> str:
        if path in power:
            return f"{round(power[path](clock.now()) * 1e6)}\n"
        return path.read_text()

    return read_text


def config(**options: object) -> object:
    from core.base.config import make_config

    return make_config(workload="fcnn", accelerator="nvidia", **options)


def test_only_the_module_sensors_are_read_one_per_socket(tmp_path: Path) -> None:
    read_text = hwmon_tree(tmp_path, {}, SimulatedClock())
    sensors = discover_module_sensors(tmp_path, read_text)
    assert [sensor.key for sensor in sensors] == ["module0", "module1", "module2", "module3"]
    # Grace, CPU and SysIO are parts of the module: reading them too would count their power twice.
    assert all(read_text(sensor.power_file.parent / "power1_oem_info").startswith("Module") for sensor in sensors)


def test_module_power_is_integrated_per_socket(tmp_path: Path) -> None:
    clock = SimulatedClock()
    step = 0.2537  # off the sampling grid
    watts = {
        "Module Power Socket 0": lambda t: 500.0,
        "Module Power Socket 1": lambda t: 300.0 if t < step else 700.0,
    }
    factory = GraceHopperModuleMeterFactory(tmp_path, read_text=hwmon_tree(tmp_path, watts, clock), clock=clock)
    assert factory.availability().available
    from core_plugins.nvidia.accelerator import NvidiaAccelerator

    context = run_context(config(power_sample_interval_seconds=0.005), NvidiaAccelerator())
    meter = factory.meter_for([], context)
    assert isinstance(meter, GraceHopperModuleMeter)
    meter.start()
    clock.wait_for_waiters(1)  # the power sampler
    clock.run_for(0.5, 0.005)
    measurement = meter.stop()
    meter.close()
    assert measurement.meter == "gh-module" and measurement.method == "sampled"
    components = measurement.components_joules
    assert components["module0"] == pytest.approx(500.0 * 0.5, rel=1e-6)
    exact = 300.0 * step + 700.0 * (0.5 - step)
    assert components["module1"] == pytest.approx(exact, rel=0.01)
    assert components["module2"] == pytest.approx(25.0, rel=1e-6)  # 50 W
    assert measurement.energy_joules == pytest.approx(sum(components.values()))


def test_as_a_node_meter_it_holds_the_gpus_energy_rather_than_adding_to_it() -> None:
    # CARAML metered its GH200 rows with jpwr's gh method: the module's power, GPU included.
    gh = GraceHopperModuleMeterFactory
    nvml = Covers("nvml", "device", ("devices",))
    assert not device_meter_counted(nvml, [Covers(gh.name, "node", gh.node_includes)])


def test_a_node_that_is_no_grace_hopper_says_so(tmp_path: Path) -> None:
    availability = GraceHopperModuleMeterFactory(tmp_path).availability()
    assert not availability.available and "no Grace Hopper module power sensor" in availability.reason
    clock = SimulatedClock()
    read = hwmon_tree(tmp_path, {}, clock)

    def broken(path: Path) -> str:
        if path.name == "power1_average":
            raise PermissionError(13, "Permission denied", str(path))
        return read(path)

    refused = GraceHopperModuleMeterFactory(tmp_path, read_text=broken).availability()
    assert not refused.available and "PermissionError" in refused.reason
