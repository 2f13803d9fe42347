"""Power meters: the interface plugins implement, and the 'no meter' fallback.

A meter reads exactly the steady window: the runner calls ``start`` right after the
synchronisation that opens the window and ``stop`` right after the one that closes it. A run to a
target quality also asks, at each evaluation, for the energy so far (``read_joules_so_far``), which a
meter may decline.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

from core.base.config import RunConfig
from core.base.results import DeviceRecord, EnergyMeasurement
from core.contract.accelerator import Availability

if TYPE_CHECKING:
    from core.contract.context import RunContext


class PowerMeter(ABC):
    """One measurement session over a window."""

    name: str

    @abstractmethod
    def start(self) -> None:
        """Begin the window (read counters or start sampling)."""

    @abstractmethod
    def stop(self) -> EnergyMeasurement:
        """End the window and return the energy spent in it, or why it is unknown."""

    def read_joules_so_far(self) -> float | None:
        """The energy spent since :meth:`start`, read without ending the window: a run to a target
        quality reads it at each evaluation to draw its curve against energy.

        A counter reads its counter; a sampler integrates up to a reading taken now. Return None
        where the meter cannot tell before it stops, or the reading failed: the default, so a meter
        that does not implement it is read as before, at :meth:`stop` only. May be called from the
        run's thread while the meter's own threads sample; never before :meth:`start` or after
        :meth:`stop`.

        :returns: joules since :meth:`start`, covering what :meth:`stop` would (None: unknown now)
        """
        return None

    def close(self) -> None:
        """Release handles; called once, also after a failure."""


class PowerMeterFactory(ABC):
    """What plugins register: declares which accelerators it reads and makes meters for a run."""

    name: ClassVar[str]
    description: ClassVar[str] = ""
    #: the names of the accelerators whose devices this meter measures (``("nvidia",)``): core binds
    #: a meter to a run's accelerator by this list, checked when the meter registers
    accelerators: ClassVar[tuple[str, ...]] = ()
    #: what the meter's figure covers as a run's device meter: "devices" (the run's devices), and
    #: what else it measures with them (RAPL on the CPU: "cpu" and "dram")
    includes: ClassVar[tuple[str, ...]] = ("devices",)
    #: what its figure covers as a node meter (``RunConfig.node_meters``): "devices" where the run's
    #: devices are inside it (a node's wall plug or BMC), and "cpu", "dram", "fans", ...; empty (the
    #: default) where it cannot be one. The run adds no two meters that include the same thing.
    node_includes: ClassVar[tuple[str, ...]] = ()

    def reads(self, accelerator_name: str) -> bool:
        """Whether this meter measures devices of that accelerator: the form before ``accelerators``.

        Core reads the declared ``accelerators``; it calls this only for a meter class that
        overrides it (with a DeprecationWarning), as meters written before the declaration do.
        """
        return accelerator_name in self.accelerators

    @abstractmethod
    def availability(self) -> Availability:
        """Cheap check; a meter that is unavailable is recorded with this reason."""

    def meter_for(self, devices: list[DeviceRecord], context: RunContext) -> PowerMeter:
        """A meter for the devices of one run; ``context`` holds the options, parsed once.

        Meters written before 0.2 implement :meth:`create` instead, which this default calls.
        """
        return self.create(devices, context.config)

    def create(self, devices: list[DeviceRecord], config: RunConfig) -> PowerMeter:
        """The pre-0.2 form of :meth:`meter_for`; implement one of the two."""
        raise NotImplementedError(f"meter {self.name!r} implements neither meter_for nor create")


def meter_for(factory: PowerMeterFactory, devices: list[DeviceRecord], context: RunContext) -> PowerMeter:
    """Ask ``factory`` for a meter in whichever form of the method its class overrides last."""
    from core.contract.context import overrides_old_form

    if overrides_old_form(factory, "meter_for", "create"):
        return factory.create(devices, context.config)
    return factory.meter_for(devices, context)


class UnavailableMeter(PowerMeter):
    """Stands in when no energy can be measured; the result carries the reason, never a guess."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason

    def start(self) -> None:
        pass

    def stop(self) -> EnergyMeasurement:
        return EnergyMeasurement(meter=self.name, unavailable_reason=self.reason)
