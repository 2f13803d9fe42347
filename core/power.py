"""Power meters: the interface plugins implement, and the 'no meter' fallback.

A meter reads exactly the steady window: the runner calls ``start`` right after the
synchronisation that opens the window and ``stop`` right after the one that closes it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from core.accelerator import Availability
from core.config import RunConfig
from core.results import DeviceRecord, EnergyMeasurement


class PowerMeter(ABC):
    """One measurement session over a window."""

    name: str

    @abstractmethod
    def start(self) -> None:
        """Begin the window (read counters or start sampling)."""

    @abstractmethod
    def stop(self) -> EnergyMeasurement:
        """End the window and return the energy spent in it, or why it is unknown."""

    def close(self) -> None:
        """Release handles; called once, also after a failure."""


class PowerMeterFactory(ABC):
    """What plugins register: knows which accelerators it reads and makes meters for a run."""

    name: ClassVar[str]
    description: ClassVar[str] = ""

    @abstractmethod
    def reads(self, accelerator_name: str) -> bool:
        """True if this meter measures devices of that accelerator."""

    @abstractmethod
    def availability(self) -> Availability:
        """Cheap check; a meter that is unavailable is recorded with this reason."""

    @abstractmethod
    def create(self, devices: list[DeviceRecord], config: RunConfig) -> PowerMeter:
        """A meter for the devices of one run."""


class UnavailableMeter(PowerMeter):
    """Stands in when no energy can be measured; the result carries the reason, never a guess."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason

    def start(self) -> None:
        pass

    def stop(self) -> EnergyMeasurement:
        return EnergyMeasurement(meter=self.name, unavailable_reason=self.reason)
