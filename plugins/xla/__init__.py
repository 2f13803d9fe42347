"""XLA plugin: TPUs (and XLA's CUDA and CPU devices) through torch-xla's PJRT runtime, on core's
shared PyTorch executor, with replicas as processes (the ``xla`` backend) or SPMD, datasheet TPU
peaks for MFU, and the reason energy is unavailable. See docs/xla.md.

Importing this module imports neither torch nor torch-xla: ``core plugins`` lists the accelerator
with its availability (what is missing: torch-xla, a torch it accepts, a TPU or PJRT_DEVICE).
"""

from __future__ import annotations

from collections.abc import Callable

from core.plugin import Accelerator, PowerMeterFactory, hookimpl

from .accelerator import XlaAccelerator, XlaOptions
from .meter import XlaEnergyFactory

__all__ = ["XlaAccelerator", "XlaOptions", "XlaEnergyFactory"]


@hookimpl
def core_register_accelerators(register: Callable[[Accelerator], None]) -> None:
    register(XlaAccelerator())


@hookimpl
def core_register_power_meters(register: Callable[[PowerMeterFactory], None]) -> None:
    register(XlaEnergyFactory())


@hookimpl
def core_register_packages(register: Callable[[str], None]) -> None:
    register("torch-xla")
