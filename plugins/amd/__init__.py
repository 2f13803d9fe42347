"""AMD plugin: Instinct GPUs through core's shared GPU placement (ROCm), MI250 GCD and package
modes, amdsmi energy per physical package, datasheet peaks. See docs/amd.md."""

from __future__ import annotations

from collections.abc import Callable

from core.plugin import Accelerator, MachineProfile, PowerMeterFactory, hookimpl

from .accelerator import AmdAccelerator
from .machines import amd_machines
from .meter import AmdsmiMeterFactory


@hookimpl
def core_register_accelerators(register: Callable[[Accelerator], None]) -> None:
    register(AmdAccelerator())


@hookimpl
def core_register_power_meters(register: Callable[[PowerMeterFactory], None]) -> None:
    register(AmdsmiMeterFactory())


@hookimpl
def core_register_machines(register: Callable[[MachineProfile], None]) -> None:
    for profile in amd_machines():
        register(profile)


@hookimpl
def core_register_packages(register: Callable[[str], None]) -> None:
    register("amdsmi")  # the ROCm SMI bindings the meter and the device listing use
