"""A run's device meter and its node meters, read over the one window and added without counting
anything twice (``RunConfig.node_meters``; docs/concepts.md#node-meters).

Each meter declares what its figure covers: a device meter ``PowerMeterFactory.includes`` (the
run's devices, and e.g. RAPL's DRAM with the CPU packages), a node meter ``node_includes`` ("cpu",
"dram", "fans", and "devices" where the run's devices are inside it, as behind a wall plug or a
BMC). Node meters cover nothing in common. A node meter that covers everything the device meter
covers holds it: the run's energy is then the node meter's, with the devices' figure itemised
inside it, not added; otherwise the figures are added. Anything else overlaps in part, which no
sum can undo: planning refuses it before any device is touched.

Meters read *beside* the devices (``node_meters = "auto"``: RAPL's CPU and DRAM on a GPU host) are
read over the same window and itemised with ``counted: false`` and a note, never added: the run's
energy stays the device meter's, and one that fails costs nothing but its own item.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from core.base.results import EnergyMeasurement, MeterEnergy
from core.contract.meter import PowerMeter, UnavailableMeter

DEVICES = "devices"

#: the note on the item of a meter read beside the devices (node_meters "auto"), not added
BESIDE_NOTE = (
    "read beside the devices over the same span, not added into energy_joules "
    "(node_meters = 'auto'; name it in node_meters to add it)"
)

Role = Literal["device", "node"]


@dataclass(frozen=True)
class Covers:
    """A meter by name, in its role, and what its figure covers."""

    name: str
    role: Role
    includes: tuple[str, ...]


def device_meter_counted(device: Covers | None, nodes: Sequence[Covers]) -> bool:
    """Whether the device meter's figure is added into the run's energy (False: a node meter holds
    it). Raises ValueError, saying which meters overlap and in what, where no sum is right."""
    for index, first in enumerate(nodes):
        for second in nodes[index + 1 :]:
            both = sorted(set(first.includes) & set(second.includes))
            if both:
                raise ValueError(
                    f"node meters {first.name!r} and {second.name!r} both include {', '.join(both)}: "
                    "their sum would count it twice; name one of them"
                )
    if device is None:
        return False
    for node in nodes:
        shared = set(device.includes) & set(node.includes)
        if shared and not set(device.includes) <= set(node.includes):
            raise ValueError(
                f"node meter {node.name!r} includes {', '.join(sorted(shared))} of what device meter "
                f"{device.name!r} measures ({', '.join(device.includes)}) but not all of it: their sum would count "
                "that twice and the one is not inside the other"
            )
        if shared:
            return False
    return True


def devices_unmeasured(device: Covers | None, nodes: Sequence[Covers], device_reason: str | None) -> str | None:
    """Why no meter measures the run's devices (then the run has no total), or None where one does."""
    if device is not None or any(DEVICES in node.includes for node in nodes):
        return None
    return (
        f"the devices were not measured ({device_reason or 'no device meter'}) and no node meter includes them; "
        "the node meters' figures are itemised in energy.meters"
    )


@dataclass
class _Slot:
    covers: Covers
    counted: bool
    meter: PowerMeter
    beside: bool = False  # read beside the devices, itemised only (node_meters "auto")


def _item(slot: _Slot, measurement: EnergyMeasurement) -> MeterEnergy:
    return MeterEnergy(
        meter=slot.covers.name,
        role=slot.covers.role,
        includes=list(slot.covers.includes),
        counted=slot.counted,
        method=measurement.method,
        energy_joules=measurement.energy_joules,
        unavailable_reason=measurement.unavailable_reason,
        components_joules=dict(measurement.components_joules),
        note=BESIDE_NOTE if slot.beside else None,
    )


def combine(
    readings: Sequence[tuple[MeterEnergy, EnergyMeasurement]], unmeasured_devices: str | None
) -> EnergyMeasurement:
    """The run's energy from each meter's reading: the counted ones summed, every one itemised in
    ``meters``; the devices' per-device figures and power timeline are the device meter's. A meter
    read beside the devices (its item has a ``note``) is itemised only: ``meter`` and ``method``
    name the others, and its failure is its item's alone."""
    items = [item for item, _ in readings]
    counted = [item for item in items if item.counted]
    named = [item for item in items if item.note is None]
    reasons = [
        f"{item.role} meter {item.meter!r}: {item.unavailable_reason or 'it read nothing'}"
        for item in counted
        if item.energy_joules is None
    ]
    if unmeasured_devices:
        reasons.append(unmeasured_devices)
    device = next((measurement for item, measurement in readings if item.role == "device"), None)
    methods = {item.method for item in named if item.method is not None}
    return EnergyMeasurement(
        meter=" + ".join(item.meter for item in named),
        method=methods.pop() if len(methods) == 1 else ("mixed" if methods else None),
        energy_joules=None if reasons else sum(item.energy_joules or 0.0 for item in counted),
        unavailable_reason="; ".join(reasons) or None,
        components_joules=dict(device.components_joules) if device is not None else {},
        details={
            **(device.details if device is not None else {}),
            "node_meters": {item.meter: m.details for item, m in readings if item.role == "node"},
        },
        power_timeline=device.power_timeline if device is not None else None,
        warnings=[f"{item.meter}: {warning}" for item, m in readings for warning in m.warnings],
        meters=items,
    )


class MeterSet(PowerMeter):
    """The device meter (where there is one), the node meters and the meters read beside the devices
    as one meter for the runner: each started and stopped in turn at the window's ends; one that
    fails costs its own figure only. ``beside`` meters (node_meters "auto") are itemised, not added."""

    def __init__(
        self,
        device: tuple[Covers, PowerMeter] | None,
        nodes: Sequence[tuple[Covers, PowerMeter]],
        device_reason: str | None = None,
        beside: Sequence[tuple[Covers, PowerMeter]] = (),
    ) -> None:
        node_covers = [covers for covers, _ in nodes]
        device_counted = device_meter_counted(device[0] if device else None, node_covers)
        self._slots = (
            ([_Slot(device[0], device_counted, device[1])] if device else [])
            + [_Slot(covers, True, meter) for covers, meter in nodes]
            + [_Slot(covers, False, meter, beside=True) for covers, meter in beside]
        )
        self._unmeasured = devices_unmeasured(device[0] if device else None, node_covers, device_reason)
        self.name = " + ".join(slot.covers.name for slot in self._slots if not slot.beside)

    def start(self) -> None:
        for slot in self._slots:
            try:
                slot.meter.start()
            except Exception as exc:  # a meter that cannot start costs its own figure
                slot.meter = UnavailableMeter(slot.covers.name, f"meter failed to start: {type(exc).__name__}: {exc}")

    def read_joules_so_far(self) -> float | None:
        """The counted meters' energy so far, added as :meth:`stop` adds them; None where one of them
        cannot tell now, or nothing measures the devices (the run's total would be None too)."""
        if self._unmeasured:
            return None
        total = 0.0
        for slot in self._slots:
            if not slot.counted:
                continue
            try:
                joules = slot.meter.read_joules_so_far()
            except Exception:  # a meter that fails to read costs this reading only
                return None
            if joules is None:
                return None
            total += joules
        return total

    def stop(self) -> EnergyMeasurement:
        readings = []
        for slot in self._slots:
            try:
                measurement = slot.meter.stop()
                if not isinstance(measurement, EnergyMeasurement):
                    raise TypeError(f"stop() returned {type(measurement).__name__}, not an EnergyMeasurement")
            except Exception as exc:
                measurement = EnergyMeasurement(
                    meter=slot.covers.name, unavailable_reason=f"meter failed: {type(exc).__name__}: {exc}"
                )
            readings.append((_item(slot, measurement), measurement))
        return combine(readings, self._unmeasured)

    def close(self) -> None:
        for slot in self._slots:
            try:
                slot.meter.close()
            except Exception:  # closing one must not leave the others open
                pass
