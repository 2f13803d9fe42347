"""A fake of gcipuinfo, the Graphcore IPU Info library's Python binding, over a simulated host.

Mirrors the documented behaviour (docs.graphcore.ai/projects/gcipuinfo, "Device attributes"):

- the ``gcipuinfo`` object queries every attribute of every device of the current partition when
  it is created, and later queries return that same data unless ``updateData()`` is called or
  ``setUpdateMode(True)`` makes every query refresh it (power readings stay stale otherwise);
- ``getDevices()`` returns one attribute map per device, ``getNamedAttributeForAll(name)`` one
  value per device in the same order, ``getNamedAttributeForDevice(id, name)`` one value;
- values are strings as ``gc-info`` prints them: ``"id"`` is ``"0"``, ``"ipu power"`` is
  ``"123.45W"`` or ``"N/A"``; ``"user process id"`` names the process attached to the IPU.

Tests drive ``machine``: its devices, each with a power trace (a function of the time, read from
``machine.clock`` (``time.monotonic`` unless a test simulates time), returning watts, None for
"N/A", or a raw string).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

IpuPower = "ipu power"
DiscoverActivePartitionIPUs = 0
DiscoverAllPartitionIPUs = 1

PowerTrace = Callable[[float], float | str | None]


@dataclass
class FakeIpu:
    device_id: int
    power: PowerTrace = lambda t: 100.0
    attributes: dict[str, str] = field(default_factory=dict)

    def snapshot(self, now: float) -> dict[str, str]:
        value = self.power(now)
        power = value if isinstance(value, str) else ("N/A" if value is None else f"{value:.2f}W")
        record = {
            "id": str(self.device_id),
            "board type": "M2000",
            "ipu architecture": "ipu2",
            "board ipu index": str(self.device_id % 4),
            IpuPower: power,
        }
        record.update(self.attributes)
        return record


@dataclass
class FakeMachine:
    ipus: list[FakeIpu] = field(default_factory=list)
    refreshes: list[float] = field(default_factory=list)  # clock time of each data refresh
    lock: threading.Lock = field(default_factory=threading.Lock)
    clock: Callable[[], float] = time.monotonic  # the time power traces are evaluated at

    @classmethod
    def with_ipus(cls, count: int, power: PowerTrace | None = None, **attributes: str) -> FakeMachine:
        return cls([FakeIpu(i, power or (lambda t: 100.0), dict(attributes)) for i in range(count)])


machine = FakeMachine()


class gcipuinfo:  # noqa: N801 - the real class name
    def __init__(self, discoveryMode: int = DiscoverActivePartitionIPUs) -> None:
        self._auto_update = False
        self._data: list[dict[str, str]] = []
        self.updateData()

    def updateData(self) -> bool:
        with machine.lock:
            now = machine.clock()
            machine.refreshes.append(now)
            self._data = [ipu.snapshot(now) for ipu in machine.ipus]
        return True

    def setUpdateMode(self, autoUpdate: bool) -> None:
        self._auto_update = bool(autoUpdate)

    def _query(self) -> list[dict[str, str]]:
        if self._auto_update:
            self.updateData()
        return self._data

    def getDevices(self) -> list[dict[str, str]]:
        return [dict(device) for device in self._query()]

    def getNamedAttributeForAll(self, attributeName: str) -> list[str]:
        return [device.get(attributeName, "") for device in self._query()]

    def getNamedAttributeForDevice(self, deviceId: int, attributeName: str) -> str:
        for device in self._query():
            if device["id"] == str(deviceId):
                return device.get(attributeName, "")
        raise RuntimeError(f"device id {deviceId} does not exist")


def reset(new_machine: FakeMachine | None = None) -> FakeMachine:
    global machine
    machine = new_machine or FakeMachine()
    return machine


__all__: list[Any] = ["IpuPower", "gcipuinfo", "machine", "FakeMachine", "FakeIpu", "reset"]
