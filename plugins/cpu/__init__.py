"""CPU plugin: the CPU accelerator and the RAPL power meter."""

from __future__ import annotations

from collections.abc import Callable

from core.plugin import Accelerator, PowerMeterFactory, hookimpl

from .accelerator import CpuAccelerator
from .rapl import RaplMeterFactory


@hookimpl
def core_register_accelerators(register: Callable[[Accelerator], None]) -> None:
    register(CpuAccelerator())


@hookimpl
def core_register_power_meters(register: Callable[[PowerMeterFactory], None]) -> None:
    register(RaplMeterFactory())
