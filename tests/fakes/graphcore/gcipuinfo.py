"""A fake of gcipuinfo, the Graphcore IPU Info library's Python binding, over a simulated host.

Mirrors the documented behaviour (docs.graphcore.ai/projects/gcipuinfo, "Device attributes"):

- the ``gcipuinfo`` object queries every attribute of every device of the current partition when
  it is created, and later queries return that same data unless ``updateData()`` is called or
  ``setUpdateMode(True)`` makes every query refresh it (power readings stay stale otherwise);
- ``getDevices()`` returns one attribute map per device, ``getNamedAttributeForAll(name)`` one
  value per device in the same order, ``getNamedAttributeForDevice(id, name)`` one value;
- values are strings as ``gc-info`` prints them; ``"user process id"`` names the process attached
  to the IPU.

The cards differ in where their power is (docs.graphcore.ai/projects/command-line-tools, "Device
attributes", which prints ``gc-info -i -d 0`` on each):

- IPU-M2000 (``FakeMachine.with_ipus``, the example "from an IPU-Machine"): ``"ipu power"`` is each
  IPU's own, ``"123.45W"``; Graphcore's gc_power_consumption.py example reads ``gcipuinfo.IpuPower``
  on M2000s only, since "per-IPU power sensors ... are not available on C2 devices". gc-monitor's
  IPU-Machine example (same documentation, "gc-monitor") lists IPUs 0 and 1 under one serial number
  and IPUs 2 and 3 under another. Whether an M2000 also lists "total board power" is not shown: this
  fake leaves it out.
- C600 (``with_c600_cards``, the latest "C600-based system" example): one IPU per card,
  ``"ipu power: N/A"`` and ``"total board power: 12.6 W"``.
- C2 (``with_c2_cards``, the example in the 1.2.1 edition): two IPUs per card ("board ipu index" 0
  and 1), no ``"ipu power"`` attribute at all, ``"total board power: 99.5 W"`` (the card's power,
  the same under both IPUs).

``getDevices()`` returns plain dicts, or with ``machine.swig_maps`` set, ``SwigStringMap`` proxies
as a SWIG-wrapped ``std::map<std::string, std::string>`` is (no ``.get()``).

Tests drive ``machine``: its IPUs and boards, each with a power trace (a function of the time, read
from ``machine.clock`` (``time.monotonic`` unless a test simulates time), returning watts, None for
"N/A", or a raw string).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

IpuPower = "ipu power"
BoardType = "board type"  # gcipuinfo.BoardType, as Graphcore's gc_power_consumption.py example uses it
DiscoverActivePartitionIPUs = 0
DiscoverAllPartitionIPUs = 1

TOTAL_BOARD_POWER = "total board power"  # key string from gc-info's output; no constant is known

PowerTrace = Callable[[float], float | str | None]


def _constant(watts: float) -> PowerTrace:
    return lambda t: watts


def _format(value: float | str | None, unit: str) -> str:
    """gc-info's forms: "123.45W" for an M2000's IPU power, "12.6 W" for a PCIe card's board power."""
    if isinstance(value, str):
        return value
    if value is None:
        return "N/A"
    return f"{value:.2f}W" if unit == "W" else f"{value:.1f} W"


class SwigStringMap:
    """A ``std::map<std::string, std::string>`` as SWIG wraps it (swig/swig ``Lib/python/std_map.i``,
    ``%swig_map_common``): ``[]``, ``keys()``, ``values()``, ``items()``, ``has_key()``, ``in``,
    iteration over the keys and ``len()``; a missing key raises (``std::out_of_range``, which SWIG
    raises as IndexError); and no ``get()``, which is what breaks ``device.get(...)``."""

    def __init__(self, items: dict[str, str]) -> None:
        self._items = dict(items)

    def __getitem__(self, key: str) -> str:
        if key not in self._items:
            raise IndexError("key not found")
        return self._items[key]

    def keys(self) -> list[str]:
        return list(self._items)

    def values(self) -> list[str]:
        return list(self._items.values())

    def items(self) -> list[tuple[str, str]]:
        return list(self._items.items())

    def has_key(self, key: str) -> bool:
        return key in self._items

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)


@dataclass
class FakeBoard:
    """A PCIe card: its serial number and the power its sensors report for the whole card."""

    serial: str
    board_type: str  # "C600" or "C2"
    power: PowerTrace = _constant(12.6)


@dataclass
class FakeIpu:
    device_id: int
    power: PowerTrace = _constant(100.0)  # the IPU's own power, where its card reports one
    attributes: dict[str, str] = field(default_factory=dict)
    board: FakeBoard | None = None  # None: an IPU of an IPU-M2000
    board_ipu_index: int = 0
    absent: tuple[str, ...] = ()  # attributes this IPU's entry leaves out (a card that reports no power)

    def snapshot(self, now: float) -> dict[str, str]:
        if self.board is None:
            record = {
                "id": str(self.device_id),
                "target": "Fabric",
                "board type": "M2000",
                "board serial number": f"0024.{1 + self.device_id // 2 % 2:04d}.{8203321 + self.device_id // 4}",
                "ipu architecture": "ipu2",
                "board ipu index": str(self.device_id % 4),
                IpuPower: _format(self.power(now), "W"),
            }
        else:
            record = {
                "id": str(self.device_id),
                "target": "PCIe",
                "board type": self.board.board_type,
                "board serial number": self.board.serial,
                "ipu architecture": "ipu21" if self.board.board_type == "C600" else "ipu1",
                "board ipu index": str(self.board_ipu_index),
                TOTAL_BOARD_POWER: _format(self.board.power(now), "board"),
            }
            if self.board.board_type == "C600":
                record[IpuPower] = "N/A"  # the C600 example: the attribute is there, without a value
        record.update(self.attributes)
        return {key: value for key, value in record.items() if key not in self.absent}


@dataclass
class FakeMachine:
    ipus: list[FakeIpu] = field(default_factory=list)
    refreshes: list[float] = field(default_factory=list)  # clock time of each data refresh
    lock: threading.Lock = field(default_factory=threading.Lock)
    clock: Callable[[], float] = time.monotonic  # the time power traces are evaluated at
    swig_maps: bool = False  # getDevices() hands out SwigStringMap proxies instead of dicts

    @classmethod
    def with_ipus(cls, count: int, power: PowerTrace | None = None, **attributes: str) -> FakeMachine:
        """IPU-M2000s: ``count`` IPUs, each reporting its own ``"ipu power"``."""
        return cls([FakeIpu(i, power or _constant(100.0), dict(attributes)) for i in range(count)])

    @classmethod
    def with_c600_cards(cls, count: int, board_power: PowerTrace | None = None, **attributes: str) -> FakeMachine:
        """``count`` C600 cards of one IPU each: ``"ipu power"`` is "N/A", the card's power is board power."""
        boards = [FakeBoard(f"0063.{i:04d}.822391", "C600", board_power or _constant(12.6)) for i in range(count)]
        return cls([FakeIpu(i, _constant(0.0), dict(attributes), board) for i, board in enumerate(boards)])

    @classmethod
    def with_c2_cards(cls, count: int, board_power: PowerTrace | None = None, **attributes: str) -> FakeMachine:
        """``count`` C2 cards of two IPUs each: no ``"ipu power"``; both IPUs list the card's power."""
        boards = [FakeBoard(f"0340.{i:04d}.919062", "C2", board_power or _constant(99.5)) for i in range(count)]
        return cls(
            [
                FakeIpu(2 * b + index, _constant(0.0), dict(attributes), board, board_ipu_index=index)
                for b, board in enumerate(boards)
                for index in (0, 1)
            ]
        )


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

    def getDevices(self) -> list[Any]:
        if machine.swig_maps:
            return [SwigStringMap(device) for device in self._query()]
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


__all__: list[Any] = [
    "IpuPower",
    "BoardType",
    "gcipuinfo",
    "machine",
    "FakeMachine",
    "FakeIpu",
    "FakeBoard",
    "SwigStringMap",
    "reset",
]
