"""Grace Hopper module power from the hwmon power sensors, as CARAML's GH200 rows were metered.

A GH200 superchip exposes its power telemetry through ACPI power meters in hwmon: each
``/sys/class/hwmon/hwmonN/device`` with a ``power1_oem_info`` file names its sensor ("Module Power
Socket 0", "Grace Power Socket 0", "CPU Power Socket 0", "SysIO Power Socket 0") and reports
``power1_average`` in microwatts. This is what FZJ-JSC/jpwr's ``gh`` method reads
(``src/jpwr/sys/gh.py``), beside NVML's GPU power, for CARAML's GH200 runs.

The module sensor covers the whole superchip: the Hopper GPU, the Grace CPU and their memory. As a
node meter (``--node-meters gh-module``) it therefore includes the run's devices, and the run's
energy is the modules' (the GPU's NVML figure is itemised beside it, not added). Only the module
sensors are read: the Grace, CPU and SysIO sensors are parts of the module, and adding them would
count their power twice. Power is sampled at the run's interval and trapezoid-integrated by core's
``DeviceEnergyMeter`` (jpwr sums its samples left-Riemann every 100 ms).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from core.plugin import (
    Availability,
    Clock,
    DeviceEnergyMeter,
    DeviceRecord,
    EnergySource,
    PowerMeter,
    PowerMeterFactory,
    RunContext,
    UnavailableMeter,
)

HWMON_ROOT = Path("/sys/class/hwmon")
MODULE_SENSOR = re.compile(r"^Module Power Socket (\d+)$")
MICROWATTS_PER_WATT = 1e6
_SCOPE = "whole Grace Hopper modules (GPU, Grace CPU and their memory): every process on the node"

ReadText = Callable[[Path], str]


def _read_text(path: Path) -> str:
    return path.read_text()


@dataclass(frozen=True)
class ModuleSensor:
    socket: int
    power_file: Path  # power1_average, in microwatts

    @property
    def key(self) -> str:
        return f"module{self.socket}"


def discover_module_sensors(root: Path, read_text: ReadText = _read_text) -> list[ModuleSensor]:
    """The module power sensors under ``root`` (hwmon), one per socket, in socket order."""
    sensors: dict[int, ModuleSensor] = {}
    for hwmon in sorted(root.glob("hwmon*")):
        label_file = hwmon / "device" / "power1_oem_info"
        if not label_file.exists():
            continue
        match = MODULE_SENSOR.match(read_text(label_file).strip())
        if match is not None:
            socket = int(match.group(1))
            sensors.setdefault(socket, ModuleSensor(socket, hwmon / "device" / "power1_average"))
    return [sensors[socket] for socket in sorted(sensors)]


def _watts(sensor: ModuleSensor, read_text: ReadText) -> Callable[[], float]:
    def read() -> float:
        return int(read_text(sensor.power_file).strip()) / MICROWATTS_PER_WATT

    return read


class GraceHopperModuleMeter(DeviceEnergyMeter):
    def __init__(
        self,
        sensors: list[ModuleSensor],
        sample_interval_seconds: float,
        *,
        read_text: ReadText = _read_text,
        timeline_points: int,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(
            GraceHopperModuleMeterFactory.name,
            [EnergySource(key=sensor.key, read_power_watts=_watts(sensor, read_text)) for sensor in sensors],
            sample_interval_seconds,
            details={
                "scope": _SCOPE,
                "power_reading": "hwmon power1_average (microwatts), trapezoid-integrated",
                "sensors": {sensor.key: str(sensor.power_file) for sensor in sensors},
            },
            timeline_points=timeline_points,
            clock=clock,
        )


class GraceHopperModuleMeterFactory(PowerMeterFactory):
    name = "gh-module"
    description = "Grace Hopper module power (GPU, CPU and memory) from hwmon, as jpwr's gh method reads it"
    accelerators = ("nvidia",)
    # As the device meter of an NVIDIA run it measures the GPUs with their CPUs and memory; as a node
    # meter beside NVML it holds the GPUs' energy, which is then itemised, not added.
    includes = ("devices", "cpu", "dram")
    node_includes = ("devices", "cpu", "dram")

    def __init__(
        self, root: Path = HWMON_ROOT, *, read_text: ReadText = _read_text, clock: Clock | None = None
    ) -> None:
        self.root = Path(root)
        self._read_text = read_text
        self._clock = clock  # None: the real clock; tests pass core.testing.SimulatedClock

    def _sensors(self) -> tuple[list[ModuleSensor], str | None]:
        try:
            sensors = discover_module_sensors(self.root, self._read_text)
        except (OSError, ValueError) as exc:
            return [], f"hwmon sensors under {self.root} cannot be read: {type(exc).__name__}: {exc}"
        if not sensors:
            return [], f"no Grace Hopper module power sensor under {self.root} (not a GH200 node)"
        return sensors, None

    def availability(self) -> Availability:
        sensors, reason = self._sensors()
        if reason:
            return Availability.no(reason)
        for sensor in sensors:
            try:
                int(self._read_text(sensor.power_file).strip())
            except (OSError, ValueError) as exc:
                return Availability.no(f"{sensor.power_file} cannot be read: {type(exc).__name__}: {exc}")
        return Availability.yes()

    def meter_for(self, devices: list[DeviceRecord], context: RunContext) -> PowerMeter:
        sensors, reason = self._sensors()
        if reason:
            return UnavailableMeter(self.name, reason)
        config = context.config
        return GraceHopperModuleMeter(
            sensors,
            config.power_sample_interval_seconds,
            read_text=self._read_text,
            timeline_points=config.power_timeline_points,
            clock=self._clock,
        )
