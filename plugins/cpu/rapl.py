"""CPU energy from Intel/AMD RAPL counters, read through the Linux powercap sysfs interface.

Layout (kernel ``drivers/powercap``): ``/sys/class/powercap/intel-rapl:N`` is package (or psys) zone N
and ``intel-rapl:N:M`` its subzone M ("core", "uncore", "dram"). The flat entries are symlinks into
``/sys/devices/virtual/powercap/intel-rapl/intel-rapl:N/intel-rapl:N:M``, which is also reachable as
``/sys/class/powercap/intel-rapl/...``; so every zone is visible two or three times and is keyed by
its numbers here, not by path. ``intel-rapl-mmio:N`` re-exposes a package through MMIO (same
energy, name "package-N") and is ignored, or packages would be counted twice.

Each zone has ``energy_uj``, a counter that wraps to 0 after ``max_energy_range_uj``. The window's
energy is the sum of wrap-corrected deltas between reads. Two reads alone cannot see a counter wrap
twice, so a background thread also reads the counters often enough that no zone can pass its whole
range between two reads (at ``max_power_watts``); if reads were ever further apart than that, the
measurement is reported unavailable rather than guessed.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from core.plugin import (
    Availability,
    DeviceRecord,
    EnergyMeasurement,
    PowerMeter,
    PowerMeterFactory,
    RunConfig,
    UnavailableMeter,
)

POWERCAP_ROOT = Path("/sys/class/powercap")
_ZONE = re.compile(r"^intel-rapl:(\d+)$")
_SUBZONE = re.compile(r"^intel-rapl:(\d+):(\d+)$")
_MAX_KEPT_ERRORS = 10
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


def _read_counters(zones: list[RaplZone], read_text: ReadText) -> tuple[list[int] | None, str | None]:
    """All counters, or None and which file failed how. A failed read is never turned into a number."""
    values: list[int] = []
    for zone in zones:
        try:
            values.append(int(read_text(zone.energy_file).strip()))
        except (OSError, ValueError) as exc:
            return None, f"cannot read {zone.energy_file}: {type(exc).__name__}: {exc}"
    return values, None


class RaplMeter(PowerMeter):
    name = "rapl"

    def __init__(
        self,
        zones: list[RaplZone],
        *,
        read_text: ReadText = _read_text,
        clock: Callable[[], float] = time.monotonic,
        max_power_watts: float = 500.0,  # generous per zone; bounds the time a counter takes to wrap
        max_poll_seconds: float = 10.0,
    ) -> None:
        self.zones = list(zones)
        self._read_text = read_text
        self._clock = clock
        # Reads further apart than this could hide a second wrap in some zone.
        self.safe_gap_seconds = min(
            (z.max_energy_range_uj / 1e6 / max_power_watts for z in self.zones), default=max_poll_seconds
        )
        self.poll_interval_seconds = min(max_poll_seconds, self.safe_gap_seconds / 2)
        self._lock = threading.Lock()
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_error: str | None = "RaplMeter.stop() was called before start()"
        self._stopping = False
        self._t_start = self._t_last = 0.0
        self._last: list[int] = []
        self._energy_uj = [0] * len(self.zones)
        self._wraps = [0] * len(self.zones)
        self._max_gap = 0.0
        self._polls = 0
        self._poll_error_count = 0
        self._poll_errors: list[str] = []

    def start(self) -> None:
        if not self.zones:
            self._start_error = "no RAPL zones to read"
            return
        t = self._clock()
        values, error = _read_counters(self.zones, self._read_text)
        if values is None:
            self._start_error = error  # reported by stop(); start() does not abort the run
            return
        self._start_error = None
        self._t_start = self._t_last = t
        self._last = values
        self._thread = threading.Thread(target=self._poll_loop, name="rapl-poll", daemon=True)
        self._thread.start()

    def _poll_loop(self) -> None:
        while not self._stop_event.wait(self.poll_interval_seconds):
            self.poll()

    def poll(self) -> None:
        """Read every counter now and fold it in (the background thread's step; callable in tests)."""
        t = self._clock()
        values, error = _read_counters(self.zones, self._read_text)
        with self._lock:
            if self._stopping or self._start_error is not None:
                return  # outside the window: stop() takes the final values; before start() there is no base
            if values is None:
                # Keep the last good values: the next good read still gives the right delta, and the
                # gap check in stop() catches a gap long enough to hide a wrap.
                self._poll_error_count += 1
                if error not in self._poll_errors and len(self._poll_errors) < _MAX_KEPT_ERRORS:
                    self._poll_errors.append(error or "")
                return
            self._polls += 1
            self._advance(t, values)

    def _advance(self, t: float, values: list[int]) -> None:
        """Add the deltas since the last good read. Caller holds the lock."""
        self._max_gap = max(self._max_gap, t - self._t_last)
        for i, (zone, value) in enumerate(zip(self.zones, values)):
            delta = value - self._last[i]
            if delta < 0:
                # The counter passed max_energy_range_uj and restarted at 0. (The true modulus is
                # one hardware energy unit, ~15-61 uJ, larger; negligible against a wrap of ~262 kJ.)
                delta += zone.max_energy_range_uj
                self._wraps[i] += 1
            self._energy_uj[i] += delta
        self._last = values
        self._t_last = t

    def stop(self) -> EnergyMeasurement:
        with self._lock:
            self._stopping = True  # from here on the poller discards what it reads
        t = self._clock()
        values, error = (None, self._start_error) if self._start_error else _read_counters(self.zones, self._read_text)
        self.close()
        if values is None:
            return EnergyMeasurement(
                meter=self.name, method="counter", unavailable_reason=error, details=self._error_details()
            )
        with self._lock:
            self._advance(t, values)
            if self._max_gap > self.safe_gap_seconds:
                return EnergyMeasurement(
                    meter=self.name,
                    method="counter",
                    details=self._error_details(),
                    unavailable_reason=(
                        f"RAPL counters went unread for {self._max_gap:.1f} s, longer than the "
                        f"{self.safe_gap_seconds:.1f} s in which a counter could wrap more than once; "
                        "the energy cannot be known"
                    ),
                )
            return self._measurement(t - self._t_start)

    def _measurement(self, seconds: float) -> EnergyMeasurement:
        joules = [uj / 1e6 for uj in self._energy_uj]
        total = sum(j for j, zone in zip(joules, self.zones) if zone.in_total)
        zones = [
            {
                "zone": z.key,
                "path": str(z.path),
                "joules": j,
                "in_total": z.in_total,
                "wraps": w,
                "max_energy_range_uj": z.max_energy_range_uj,
            }
            for z, j, w in zip(self.zones, joules, self._wraps)
        ]
        return EnergyMeasurement(
            meter=self.name,
            method="counter",
            energy_joules=total,
            components_joules={z.key: j for z, j in zip(self.zones, joules)},
            mean_power_watts=total / seconds if seconds > 0 else None,
            details={
                "zones": zones,
                "wraps": sum(self._wraps),
                "window_seconds": seconds,
                "scope": _SCOPE,
                **self._error_details(),
            },
        )

    def _error_details(self) -> dict[str, object]:
        info: dict[str, object] = {"polls": self._polls, "poll_interval_seconds": self.poll_interval_seconds}
        if self._poll_error_count:
            info["poll_error_count"] = self._poll_error_count
            info["poll_errors"] = list(self._poll_errors)
        return info

    def close(self) -> None:
        self._stop_event.set()
        if self._thread is not None:
            self._thread.join(5.0)


class RaplMeterFactory(PowerMeterFactory):
    name = "rapl"
    description = "CPU package and DRAM energy from Intel/AMD RAPL counters (Linux powercap sysfs)"

    def __init__(self, root: Path = POWERCAP_ROOT, *, read_text: ReadText = _read_text) -> None:
        self.root = Path(root)
        self._read_text = read_text

    def reads(self, accelerator_name: str) -> bool:
        return accelerator_name == "cpu"

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

    def create(self, devices: list[DeviceRecord], config: RunConfig) -> PowerMeter:
        zones, reason = self._zones()
        if reason:
            return UnavailableMeter(self.name, reason)
        return RaplMeter(zones, read_text=self._read_text)
