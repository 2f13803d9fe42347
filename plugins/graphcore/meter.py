"""IPU energy from gcipuinfo's power readings, integrated over the window by core's shared meter.

gcipuinfo has no energy counter, only instantaneous power, as strings such as ``"123.45W"``,
``"12.6 W"`` or ``"N/A"``. Which attribute holds it depends on the card (Graphcore's command line
tools documentation, "Device attributes", shows gc-info's output of each):

- IPU-M2000 / Bow-2000: ``"ipu power"`` (``gcipuinfo.IpuPower``), each IPU's own power;
- C600 (PCIe, one IPU): ``"ipu power"`` is ``"N/A"``; ``"total board power"`` is the card's power;
- C2 (PCIe, two IPUs): no ``"ipu power"`` at all, only ``"total board power"``, the same card's
  power listed under each of its two IPUs.

So a board's IPUs (one ``"board serial number"``) are read by their own power where the card fills
it, else together as one board reading, counted once and never once per IPU. The result names the
attribute read for every component (``details["power_attribute"]``); a component read from board
power is the board's (``board-<serial>``), not an IPU's. Every reading is an ``EnergySource`` with
``read_power_watts`` only, and ``core.energy.meters.DeviceEnergyMeter`` samples them at a fixed
rate and integrates by the trapezoid rule: the result's method is ``"sampled"``, never ``"counter"``.

gcipuinfo reads every attribute once, when created, and keeps returning that data unless told
otherwise (docs.graphcore.ai/projects/gcipuinfo, "Querying attributes"): the meter turns update mode
on, so each query re-reads the devices. One query per sample (``getDevices()``) gives every reading
from the same refresh; readings are keyed by the ``"id"`` attribute, never by a device's position.

Which IPUs: those attached to this process (``"user process id"``), which are exactly the run's
IPUs, also when several poprun instances share a host. Where no IPU names this process, every IPU
gcipuinfo lists (the current partition) is read, and the result says so; with several instances that
would count IPUs twice, so the energy is reported unavailable instead.

A board whose other IPUs are attached to other processes (another instance of this run, or another
job) is shared, and its power is split evenly among the board's attached IPUs: this process counts
its own IPUs' part. The runner sums the instances' readings, so a C2 whose two IPUs serve two
instances of one run is counted once in all; the result marks such a board as shared. An IPU that no
process holds takes no part: an idle sibling's draw stays with the board and whoever uses it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, ClassVar

from core.plugin import (
    Availability,
    Clock,
    DeviceEnergyMeter,
    DeviceRecord,
    EnergyMeasurement,
    EnergySource,
    PowerMeter,
    PowerMeterFactory,
    RunContext,
    UnavailableMeter,
)

# Attribute key strings, as gc-info prints them and gcipuinfo's device maps hold them. Only
# "ipu power" has a constant we have seen used (gcipuinfo.IpuPower, in Graphcore's own examples).
IPU_POWER = "ipu power"
BOARD_POWER = "total board power"  # the whole card's power, listed under each of its IPUs
BOARD_SERIAL = "board serial number"  # the same for every IPU of one card
USER_PROCESS_ID = "user process id"

GCIPUINFO_MISSING = (
    "gcipuinfo is not installed: it ships with Graphcore's Poplar SDK; "
    "`pip install <sdk>/gcipuinfo-*.whl` (see README 'Graphcore')"
)


def import_gcipuinfo() -> Any:
    return importlib.import_module("gcipuinfo")


def list_devices(info: Any) -> list[dict[str, str]]:
    """``getDevices()`` as plain dicts. The binding may hand back SWIG ``std::map`` proxies, which
    have ``keys()`` and ``[]`` but no ``.get()`` (SWIG's ``Lib/python/std_map.i``); wandb's IPU
    monitor converts each entry with ``dict()`` the same way."""
    return [dict(device) for device in info.getDevices()]


def parse_power_watts(value: Any) -> float | None:
    """``"123.45W"`` / ``"12.6 W"`` -> the watts; ``"N/A"`` (or nothing) -> None; anything else raises."""
    if value is None:
        return None
    text = str(value).strip()
    if not text or text.upper() == "N/A":
        return None
    if text[-1:] in ("W", "w"):
        text = text[:-1].strip()
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"unexpected gcipuinfo power reading {value!r}") from None


def _readable(value: Any) -> bool:
    try:
        return parse_power_watts(value) is not None
    except ValueError:
        return False


def _holder(device: Mapping[str, str]) -> str | None:
    """The process attached to the IPU, or None where the attribute is absent or empty."""
    pid = str(device.get(USER_PROCESS_ID, "")).strip()
    return pid if pid.isdigit() and int(pid) > 0 else None


def _serial(device: Mapping[str, str]) -> str:
    return str(device.get(BOARD_SERIAL, "")).strip()


@dataclass(frozen=True)
class PowerReading:
    """One figure the meter samples: an IPU's own power, or its board's on a card that has only that."""

    key: str  # names the component in the result: "ipu3" or "board-0063.0063.822391"
    attribute: str  # the gcipuinfo attribute read
    read_from: str  # the id of the IPU whose entry holds it
    ipus: tuple[str, ...]  # this process's IPUs the reading stands for
    share: Fraction = Fraction(1)  # the part of the reading counted here (a shared board's)
    board_ipus: tuple[str, ...] = ()  # every IPU gcipuinfo lists on the board (board power only)
    other_processes: tuple[str, ...] = ()  # the processes attached to the board's other IPUs

    def describe_board(self) -> dict[str, Any]:
        idle = [ipu for ipu in self.board_ipus if ipu not in self.ipus]
        return {
            "ipus_on_board": list(self.board_ipus),
            "ipus_read_here": list(self.ipus),
            "share_counted_here": str(self.share),
            **({"other_ipus_on_board": idle} if idle else {}),
        }


def select_devices(devices: list[dict[str, str]], pid: int, power_attribute: str = IPU_POWER) -> tuple[list[str], str]:
    """The IPU ids to read (those attached to ``pid``, else all), and a description of the scope.

    Attached IPUs are read whatever they report, so one without power makes the energy unavailable
    rather than silently smaller. In the whole partition, an entry with no power attribute at all
    (a multi-IPU device) is not read."""
    own = [str(d["id"]) for d in devices if "id" in d and _holder(d) == str(pid)]
    if own:
        return own, f"the {len(own)} IPU(s) attached to this process (gcipuinfo 'user process id')"
    listed = [str(d["id"]) for d in devices if "id" in d and (power_attribute in d or BOARD_POWER in d)]
    return listed, f"every IPU gcipuinfo lists in the partition ({len(listed)}); none named this process"


def _no_reading(ipu: str, device: Mapping[str, str], power_attribute: str) -> str:
    seen = ", ".join(
        f"'{attribute}' {repr(device[attribute]) if attribute in device else 'absent'}"
        for attribute in (power_attribute, BOARD_POWER)
    )
    return f"IPU {ipu} ({device.get('board type', 'board type unknown')}): {seen}"


def plan_readings(
    devices: list[dict[str, str]], ids: list[str], power_attribute: str = IPU_POWER
) -> tuple[list[PowerReading], list[str]]:
    """What to sample for the IPUs ``ids``: (the readings, why some IPU has none).

    Per board: every IPU's own power where all of the board's IPUs read here report it, else the
    board's power once. A board's power is split evenly among its IPUs that some process holds;
    this process counts its own IPUs' part."""
    by_id = {str(d["id"]): d for d in devices if "id" in d}
    boards: dict[str, list[str]] = {}
    for ipu in ids:
        # An IPU without a serial is a board of its own: its power cannot be shared with anything.
        boards.setdefault(_serial(by_id[ipu]) or f"ipu{ipu}", []).append(ipu)
    readings: list[PowerReading] = []
    unreadable: list[str] = []
    for serial, own in boards.items():
        if all(_readable(by_id[ipu].get(power_attribute)) for ipu in own):
            readings += [PowerReading(f"ipu{ipu}", power_attribute, ipu, (ipu,)) for ipu in own]
            continue
        # Every IPU of a card lists the card's power; any one of them that has a number will do.
        listing = [ipu for ipu in own if _readable(by_id[ipu].get(BOARD_POWER))]
        if not _serial(by_id[own[0]]) or not listing:
            unreadable += [_no_reading(ipu, by_id[ipu], power_attribute) for ipu in own]
            continue
        on_board = tuple(ipu for ipu, device in by_id.items() if _serial(device) == serial)
        elsewhere = [ipu for ipu in on_board if ipu not in own and _holder(by_id[ipu]) is not None]
        readings.append(
            PowerReading(
                key=f"board-{serial}",
                attribute=BOARD_POWER,
                read_from=listing[0],
                ipus=tuple(own),
                share=Fraction(len(own), len(own) + len(elsewhere)),
                board_ipus=on_board,
                other_processes=tuple(sorted({str(_holder(by_id[ipu])) for ipu in elsewhere})),
            )
        )
    return readings, unreadable


class PowerSnapshot:
    """Every IPU's attributes from one gcipuinfo query, shared by the readings of one sample.

    The sampler reads sources one after another; the first source of a sample refreshes the
    snapshot and the others read the same refresh, so a sample costs one query, not one per reading.
    """

    def __init__(self, info: Any, readings: list[PowerReading]) -> None:
        self._info = info
        self._first_key = readings[0].key
        self._lock = threading.Lock()
        self._devices: dict[str, dict[str, str]] | None = None

    def read(self, reading: PowerReading) -> float | None:
        with self._lock:
            if reading.key == self._first_key or self._devices is None:
                self._devices = {str(d.get("id")): d for d in list_devices(self._info)}
            device = self._devices.get(reading.read_from)
        if device is None:
            raise LookupError(f"IPU {reading.read_from} is no longer listed by gcipuinfo")
        watts = parse_power_watts(device.get(reading.attribute))
        return None if watts is None else watts * float(reading.share)


def _reader(snapshot: PowerSnapshot, reading: PowerReading) -> Callable[[], float | None]:
    return lambda: snapshot.read(reading)


def _shared_warning(reading: PowerReading) -> str:
    others = [ipu for ipu in reading.board_ipus if ipu not in reading.ipus]
    return (
        f"{reading.key}: shared board: IPU(s) {', '.join(others)} on it are attached to other processes "
        f"({', '.join(reading.other_processes)}); '{BOARD_POWER}' is the whole card's, so it is split evenly "
        f"among the board's attached IPUs and this process counts {reading.share} of it (IPU(s) "
        f"{', '.join(reading.ipus)})"
    )


class GcipuinfoMeter(DeviceEnergyMeter):
    def __init__(
        self,
        info: Any,
        readings: list[PowerReading],
        scope: str,
        sample_interval_seconds: float,
        *,
        timeline_points: int,
        clock: Clock | None = None,
    ) -> None:
        snapshot = PowerSnapshot(info, readings)
        sources = [EnergySource(key=reading.key, read_power_watts=_reader(snapshot, reading)) for reading in readings]
        self._shared_warnings = [_shared_warning(reading) for reading in readings if reading.other_processes]
        details: dict[str, Any] = {
            "power_reading": "gcipuinfo (update mode on), trapezoid-integrated",
            "power_attribute": {reading.key: reading.attribute for reading in readings},
            "energy_counted": False,
            "scope": scope,
            "device_ids": [ipu for reading in readings for ipu in reading.ipus],
        }
        boards = {reading.key: reading.describe_board() for reading in readings if reading.attribute == BOARD_POWER}
        if boards:
            details["board_power"] = boards
            details["board_power_note"] = (
                f"'{BOARD_POWER}' is the whole card's power: a board-<serial> component is per board "
                "(its share counted here), not per IPU"
            )
        shared = {
            reading.key: {"other_processes": list(reading.other_processes), "share_counted_here": str(reading.share)}
            for reading in readings
            if reading.other_processes
        }
        if shared:
            details["shared_boards"] = shared
        super().__init__(
            "gcipuinfo",
            sources,
            sample_interval_seconds,
            sample_power=True,
            details=details,
            timeline_points=timeline_points,
            clock=clock,
        )

    def stop(self) -> EnergyMeasurement:
        measurement = super().stop()
        if self._shared_warnings:
            measurement = measurement.model_copy(update={"warnings": [*measurement.warnings, *self._shared_warnings]})
        return measurement


class GcipuinfoMeterFactory(PowerMeterFactory):
    name: ClassVar[str] = "gcipuinfo"
    description: ClassVar[str] = "Graphcore IPU power from gcipuinfo, sampled and integrated (no energy counter)"
    accelerators: ClassVar[tuple[str, ...]] = ("graphcore",)

    def __init__(self, *, clock: Clock | None = None) -> None:
        """:param clock: the meters' time (None: the real clock), for tests in simulated time."""
        self._clock = clock

    def availability(self) -> Availability:
        if importlib.util.find_spec("gcipuinfo") is None:
            return Availability.no(GCIPUINFO_MISSING)
        return Availability.yes()

    def meter_for(self, devices: list[DeviceRecord], context: RunContext) -> PowerMeter:
        from .accelerator import GraphcoreOptions
        from .placement import PoprunProcess

        config = context.config
        if context.accelerator_options_as(GraphcoreOptions).ipu_model:
            return UnavailableMeter(
                self.name, "the IPU Model is a simulator on the host CPU: there is no IPU power to read"
            )
        gcipuinfo = import_gcipuinfo()
        info = gcipuinfo.gcipuinfo()
        info.setUpdateMode(True)
        attribute = getattr(gcipuinfo, "IpuPower", IPU_POWER)
        listed = list_devices(info)
        ids, scope = select_devices(listed, os.getpid(), attribute)
        if not ids:
            return UnavailableMeter(
                self.name, f"gcipuinfo lists no IPU with a power reading ('{attribute}' or '{BOARD_POWER}')"
            )
        process = PoprunProcess.from_environment(os.environ)
        attached = "attached to this process" in scope
        if not attached and process is not None and process.instances > 1:
            return UnavailableMeter(
                self.name,
                (
                    f"no IPU names this process ({os.getpid()}) as its user, and with {process.instances} poprun "
                    "instances the partition's IPUs would be counted once per instance"
                ),
            )
        readings, unreadable = plan_readings(listed, ids, attribute)
        if unreadable:
            return UnavailableMeter(
                self.name,
                f"gcipuinfo gives no power for {'; '.join(unreadable)}, so the energy of these IPUs cannot be read",
            )
        return GcipuinfoMeter(
            info,
            readings,
            scope,
            config.power_sample_interval_seconds,
            timeline_points=config.power_timeline_points,
            clock=self._clock,
        )
