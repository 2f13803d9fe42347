"""NVIDIA plugin: CUDA GPUs through core's shared GPU placement, NVML energy, datasheet peaks."""

from __future__ import annotations

from collections.abc import Callable

from core.plugin import Accelerator, PowerMeterFactory, hookimpl

from .accelerator import NvidiaAccelerator
from .meter import NvmlMeterFactory


@hookimpl
def core_register_accelerators(register: Callable[[Accelerator], None]) -> None:
    register(NvidiaAccelerator())


@hookimpl
def core_register_power_meters(register: Callable[[PowerMeterFactory], None]) -> None:
    register(NvmlMeterFactory())
