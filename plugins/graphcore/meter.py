"""IPU energy from gcipuinfo's power readings, integrated over the window by core's shared meter.

gcipuinfo has no energy counter, only each IPU's instantaneous power (the ``"ipu power"``
attribute, a string such as ``"123.45W"`` or ``"N/A"``). So every IPU is an ``EnergySource`` with
``read_power_watts`` only, and ``core.energy.meters.DeviceEnergyMeter`` samples them at a fixed rate and
integrates by the trapezoid rule: the result's method is ``"sampled"``, never ``"counter"``.

gcipuinfo reads every attribute once, when created, and keeps returning that data unless told
otherwise (docs.graphcore.ai/projects/gcipuinfo, "Querying attributes"): the meter turns update mode
on, so each query re-reads the devices. One query per sample (``getDevices()``) gives every IPU's
id and power from the same refresh; readings are keyed by the ``"id"`` attribute, never by a
device's position in the list.

Which IPUs: those attached to this process (``"user process id"``), which are exactly the run's
IPUs, also when several poprun instances share a host. Where no IPU names this process, every IPU
gcipuinfo lists (the current partition) is read, and the result says so; with several instances that
would count IPUs twice, so the energy is reported unavailable instead.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import threading
from collections.abc import Callable
from typing import Any, ClassVar

from core.plugin import (
    Availability,
    DeviceEnergyMeter,
    DeviceRecord,
    EnergySource,
    PowerMeter,
    PowerMeterFactory,
    RunContext,
    UnavailableMeter,
)

POWER_ATTRIBUTE = "ipu power"  # gcipuinfo.IpuPower
GCIPUINFO_MISSING = (
    "gcipuinfo is not installed: it ships with Graphcore's Poplar SDK; "
    "`pip install <sdk>/gcipuinfo-*.whl` (see README 'Graphcore')"
)


def import_gcipuinfo() -> Any:
    return importlib.import_module("gcipuinfo")


def parse_power_watts(value: Any) -> float | None:
    """``"123.45W"`` / ``"123.45 W"`` -> 123.45; ``"N/A"`` (or nothing) -> None; anything else raises."""
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


class PowerSnapshot:
    """Every IPU's power from one gcipuinfo query, shared by the sources of one sample.

    The sampler reads sources one after another; the first source of a sample refreshes the
    snapshot and the others read the same refresh, so a sample costs one query, not one per IPU.
    """

    def __init__(self, info: Any, keys: list[str], power_attribute: str) -> None:
        self._info = info
        self._keys = keys
        self._attribute = power_attribute
        self._lock = threading.Lock()
        self._watts: dict[str, float | None] = {}

    def read(self, key: str) -> float | None:
        with self._lock:
            if key == self._keys[0] or key not in self._watts:
                self._watts = {
                    str(device.get("id")): parse_power_watts(device.get(self._attribute))
                    for device in self._info.getDevices()
                }
            if key not in self._watts:
                raise LookupError(f"IPU {key} is no longer listed by gcipuinfo")
            return self._watts[key]


def _reader(snapshot: PowerSnapshot, key: str) -> Callable[[], float | None]:
    return lambda: snapshot.read(key)


class GcipuinfoMeter(DeviceEnergyMeter):
    def __init__(
        self,
        info: Any,
        device_ids: list[str],
        scope: str,
        sample_interval_seconds: float,
        *,
        power_attribute: str = POWER_ATTRIBUTE,
        timeline_points: int,
    ) -> None:
        snapshot = PowerSnapshot(info, device_ids, power_attribute)
        sources = [
            EnergySource(key=f"ipu{device_id}", read_power_watts=_reader(snapshot, device_id))
            for device_id in device_ids
        ]
        super().__init__(
            "gcipuinfo",
            sources,
            sample_interval_seconds,
            sample_power=True,
            details={
                "power_reading": f"gcipuinfo '{power_attribute}' (update mode on), trapezoid-integrated",
                "energy_counted": False,
                "scope": scope,
                "device_ids": list(device_ids),
            },
            timeline_points=timeline_points,
        )


def select_devices(
    devices: list[dict[str, Any]], pid: int, power_attribute: str = POWER_ATTRIBUTE
) -> tuple[list[str], str]:
    """The IPU ids to read (those attached to ``pid``, else all), and a description of the scope."""
    listed = [str(d.get("id")) for d in devices if d.get("id") is not None and power_attribute in d]
    own = [
        str(d.get("id"))
        for d in devices
        if str(d.get("user process id", "")).strip() == str(pid) and str(d.get("id")) in listed
    ]
    if own:
        return own, f"the {len(own)} IPU(s) attached to this process (gcipuinfo 'user process id')"
    return listed, f"every IPU gcipuinfo lists in the partition ({len(listed)}); none named this process"


class GcipuinfoMeterFactory(PowerMeterFactory):
    name: ClassVar[str] = "gcipuinfo"
    description: ClassVar[str] = "Graphcore IPU power from gcipuinfo, sampled and integrated (no energy counter)"

    def reads(self, accelerator_name: str) -> bool:
        return accelerator_name == "graphcore"

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
        attribute = getattr(gcipuinfo, "IpuPower", POWER_ATTRIBUTE)
        listed = info.getDevices()
        ids, scope = select_devices(listed, os.getpid(), attribute)
        if not ids:
            return UnavailableMeter(self.name, "gcipuinfo lists no IPU with a power reading")
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
        return GcipuinfoMeter(
            info,
            ids,
            scope,
            config.power_sample_interval_seconds,
            power_attribute=attribute,
            timeline_points=config.power_timeline_points,
        )
