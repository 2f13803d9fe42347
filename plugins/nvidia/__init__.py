"""NVIDIA plugin: CUDA GPUs through core's shared GPU placement, NVML energy, datasheet peaks."""

from __future__ import annotations

from collections.abc import Callable

from core.plugin import Accelerator, MachineProfile, PowerMeterFactory, hookimpl

from .accelerator import NvidiaAccelerator
from .grace_hopper import GraceHopperModuleMeterFactory
from .machines import nvidia_machines
from .meter import NvmlMeterFactory


@hookimpl
def core_register_accelerators(register: Callable[[Accelerator], None]) -> None:
    register(NvidiaAccelerator())


@hookimpl
def core_register_power_meters(register: Callable[[PowerMeterFactory], None]) -> None:
    register(NvmlMeterFactory())
    # After NVML, which `auto` picks first: the module meter is asked for by name (CARAML's GH200 rows).
    register(GraceHopperModuleMeterFactory())


@hookimpl
def core_register_machines(register: Callable[[MachineProfile], None]) -> None:
    for profile in nvidia_machines():
        register(profile)


@hookimpl
def core_register_packages(register: Callable[[str], None]) -> None:
    register("nvidia-ml-py")  # pynvml, the NVML bindings the meter and the device listing use
