"""CPU plugin: the CPU accelerator and the RAPL power meter."""

from __future__ import annotations

from typing import Callable

from core import Accelerator, PowerMeterFactory, hookimpl
from plugins.cpu.accelerator import CpuAccelerator
from plugins.cpu.rapl import RaplMeterFactory


@hookimpl
def core_register_accelerators(register: Callable[[Accelerator], None]) -> None:
    register(CpuAccelerator())


@hookimpl
def core_register_power_meters(register: Callable[[PowerMeterFactory], None]) -> None:
    register(RaplMeterFactory())
