"""CPU energy from Intel/AMD RAPL counters, read through the Linux powercap sysfs interface.

Layout (kernel ``drivers/powercap``): ``/sys/class/powercap/intel-rapl:N`` is package (or psys) zone N
and ``intel-rapl:N:M`` its subzone M ("core", "uncore", "dram"). The flat entries are symlinks into
``/sys/devices/virtual/powercap/intel-rapl/intel-rapl:N/intel-rapl:N:M``, which is also reachable as
``/sys/class/powercap/intel-rapl/...``; so every zone is visible two or three times and is keyed by
its numbers here, not by path. ``intel-rapl-mmio:N`` re-exposes a package through MMIO (same
energy, name "package-N") and is ignored, or packages would be counted twice.

Each zone has ``energy_uj``, a counter that wraps to 0 after ``max_energy_range_uj``. Each zone is
an ``EnergyCounter`` of core's ``DeviceEnergyMeter``, which reads them at the window's start and
stop and polls them in between often enough that no zone passes half its range between two reads
(at ``max_power_watts``), so every wrap is seen; if reads were ever further apart than that, the
zone's energy is reported unknown rather than guessed.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from core.plugin import (
    Availability,
    Clock,
    DeviceEnergyMeter,
    DeviceRecord,
    EnergyCounter,
    EnergyMeasurement,
    EnergySource,
    PowerMeter,
    PowerMeterFactory,
    RunContext,
    UnavailableMeter,
)

POWERCAP_ROOT = Path("/sys/class/powercap")
_ZONE = re.compile(r"^intel-rapl:(\d+)$")
_SUBZONE = re.compile(r"^intel-rapl:(\d+):(\d+)$")
_SCOPE = "whole CPU packages (and their DRAM): includes idle power and every process on the host"

ReadText = Callable[[Path], str]


def _read_text(path: Path) -> str:
    return path.read_text()


@dataclass(frozen=True)
class RaplZone:
    key: str  # "package-0", "package-0/dram", "package-0/core", "psys"
    path: Path  # the zone's directory
    max_energy_range_uj: int
    in_total: bool  # packages and their dram; core/uncore are inside the package, psys overlaps it

    @property
    def energy_file(self) -> Path:
        return self.path / "energy_uj"


def _entries(directory: Path) -> list[Path]:
    """Sorted entries, or none where the directory does not exist (not Linux, no powercap)."""
    try:
        return sorted(directory.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []


def discover_zones(root: Path = POWERCAP_ROOT, read_text: ReadText = _read_text) -> list[RaplZone]:
    """Every RAPL zone once, packages in order, each followed by its subzones.

    Raises OSError/ValueError when a zone's ``name`` or ``max_energy_range_uj`` cannot be read.
    """
    # Flat entries first, then the control-type hierarchy; the first path seen for a number wins.
    tops: dict[int, Path] = {}
    subs: dict[tuple[int, int], Path] = {}
    for entry in _entries(root) + _entries(root / "intel-rapl"):
        if m := _ZONE.match(entry.name):
            tops.setdefault(int(m.group(1)), entry)
    for n, top in sorted(tops.items()):
        for entry in _entries(top):  # nested subzones: how the kernel really lays them out
            m = _SUBZONE.match(entry.name)
            if m and int(m.group(1)) == n:
                subs.setdefault((n, int(m.group(2))), entry)
    for entry in _entries(root):  # flat subzone links; duplicates of the nested ones on a real kernel
        if (m := _SUBZONE.match(entry.name)) and int(m.group(1)) in tops:
            subs.setdefault((int(m.group(1)), int(m.group(2))), entry)

    zones: list[RaplZone] = []
    used: set[str] = set()

    def add(key: str, path: Path, in_total: bool) -> None:
        if key in used:  # two zones with one name: keep both, told apart by directory
            key = f"{key}@{path.name}"
        used.add(key)
        max_range = int(read_text(path / "max_energy_range_uj").strip())
        if max_range <= 0:
            raise ValueError(f"{path / 'max_energy_range_uj'} is {max_range}, not a counter range")
        zones.append(RaplZone(key, path, max_range, in_total))

    for n, top in sorted(tops.items()):
        name = read_text(top / "name").strip()
        is_package = name.startswith("package-")  # also "package-0-die-1" on multi-die parts
        add(name, top, is_package)
        for (sub_n, _), sub in sorted(subs.items()):
            if sub_n == n:
                sub_name = read_text(sub / "name").strip()
                # DRAM is powered outside the package (server parts), so it adds to the total.
                add(f"{name}/{sub_name}", sub, is_package and sub_name == "dram")
    return zones


def _zone_counter(zone: RaplZone, read_text: ReadText, max_power_watts: float) -> EnergyCounter:
    def read() -> tuple[int, float]:
        # int() of an empty or garbled file raises: a failed read is never turned into a number.
        return int(read_text(zone.energy_file).strip()), 1e-6

    # The counter restarts at 0 after max_energy_range_uj. (The true modulus is one hardware
    # energy unit, ~15-61 uJ, larger; negligible against a range of ~262 kJ.)
    return EnergyCounter(read, range_ticks=zone.max_energy_range_uj, max_power_watts=max_power_watts)


class RaplMeter(DeviceEnergyMeter):
    """Every RAPL zone as an energy counter of core's device meter, which polls them (see the
    module's docstring); the total counts packages and DRAM, the zones inside or around them not."""

    def __init__(
        self,
        zones: list[RaplZone],
        *,
        read_text: ReadText = _read_text,
        clock: Clock | Callable[[], float] = time.monotonic,
        max_power_watts: float = 500.0,  # generous per zone; bounds the time a counter takes to wrap
        max_poll_seconds: float = 10.0,
    ) -> None:
        self.zones = list(zones)
        sources = [
            EnergySource(key=z.key, counters=(_zone_counter(z, read_text, max_power_watts),), in_total=z.in_total)
            for z in self.zones
        ]
        # Reads further apart than this could miss a wrap in some zone (less than half a range passes).
        self.safe_gap_seconds = min(
            (z.max_energy_range_uj / 1e6 / max_power_watts / 2 for z in self.zones), default=max_poll_seconds
        )
        super().__init__(
            "rapl",
            sources or [EnergySource(key="rapl")],
            sample_interval_seconds=1.0,
            sample_power=False,
            details={"scope": _SCOPE},
            clock=clock,
            max_poll_seconds=max_poll_seconds,
        )
        self.poll_interval_seconds = min(max_poll_seconds, self.safe_gap_seconds / 2)

    def start(self) -> None:
        if not self.zones:
            return  # stop() says why
        super().start()

    def stop(self) -> EnergyMeasurement:
        if not self.zones:
            return EnergyMeasurement(meter=self.name, method="counter", unavailable_reason="no RAPL zones to read")
        measurement = super().stop()
        wraps = measurement.details.get("counter_wraps", {})
        measurement.details["zones"] = [
            {
                "zone": z.key,
                "path": str(z.path),
                "joules": measurement.components_joules.get(z.key),
                "in_total": z.in_total,
                "wraps": wraps.get(z.key, 0),
                "max_energy_range_uj": z.max_energy_range_uj,
            }
            for z in self.zones
        ]
        measurement.details["wraps"] = sum(wraps.values())
        measurement.details["polls"] = measurement.details.get("counter_polls", 0)
        return measurement


class RaplMeterFactory(PowerMeterFactory):
    name = "rapl"
    description = "CPU package and DRAM energy from Intel/AMD RAPL counters (Linux powercap sysfs)"
    accelerators = ("cpu",)
    # On a CPU run the devices are these packages, and DRAM comes with them; beside other devices
    # (--node-meters rapl on a GPU host) it measures the host's CPU and DRAM.
    includes = ("devices", "cpu", "dram")
    node_includes = ("cpu", "dram")

    def __init__(self, root: Path = POWERCAP_ROOT, *, read_text: ReadText = _read_text) -> None:
        self.root = Path(root)
        self._read_text = read_text

    def _zones(self) -> tuple[list[RaplZone], str | None]:
        try:
            zones = discover_zones(self.root, self._read_text)
        except (OSError, ValueError) as exc:
            return [], f"RAPL zones under {self.root} cannot be read: {type(exc).__name__}: {exc}"
        if not zones:
            return [], (
                f"no RAPL zones under {self.root} (not an Intel/AMD CPU with the intel_rapl "
                "powercap driver loaded, or not Linux)"
            )
        if not any(z.in_total for z in zones):
            return [], f"no RAPL package zone under {self.root} (found only: {', '.join(z.key for z in zones)})"
        return zones, None

    def availability(self) -> Availability:
        zones, reason = self._zones()
        if reason:
            return Availability.no(reason)
        for zone in zones:
            try:
                int(self._read_text(zone.energy_file).strip())
            except PermissionError:
                return Availability.no(
                    f"RAPL energy counters are not readable: permission denied on {zone.energy_file}. Since "
                    "the fix for CVE-2020-8694 (PLATYPUS, Linux 5.10 and stable kernels from November 2020) "
                    "energy_uj is readable by root only; run as root, or grant read access until reboot with "
                    f"`sudo chmod o+r {self.root}/intel-rapl:*/energy_uj`"
                )
            except (OSError, ValueError) as exc:
                return Availability.no(
                    f"RAPL energy counter {zone.energy_file} cannot be read: {type(exc).__name__}: {exc}"
                )
        return Availability.yes()

    def meter_for(self, devices: list[DeviceRecord], context: RunContext) -> PowerMeter:
        zones, reason = self._zones()
        if reason:
            return UnavailableMeter(self.name, reason)
        return RaplMeter(zones, read_text=self._read_text)
