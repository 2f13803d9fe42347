"""Graphcore plugin: IPUs through PopTorch (and the IPU build of TensorFlow), with replicas,
pipelining over IPUs, gradient accumulation, device iterations, poprun instances, the IPU Model,
and IPU power from gcipuinfo. See docs/graphcore.md.

Importing this module imports no SDK, no torch and no TensorFlow: ``core plugins`` lists the
accelerator (unavailable without the Poplar SDK, with the instruction) and the meter.
"""

from __future__ import annotations

from collections.abc import Callable

from core.plugin import Accelerator, MachineProfile, PowerMeterFactory, hookimpl

from .accelerator import POPLAR_SDK_INSTRUCTIONS, GraphcoreAccelerator
from .machines import graphcore_machines
from .meter import GcipuinfoMeterFactory

__all__ = ["GraphcoreAccelerator", "GcipuinfoMeterFactory", "POPLAR_SDK_INSTRUCTIONS"]


@hookimpl
def core_register_accelerators(register: Callable[[Accelerator], None]) -> None:
    register(GraphcoreAccelerator())


@hookimpl
def core_register_power_meters(register: Callable[[PowerMeterFactory], None]) -> None:
    register(GcipuinfoMeterFactory())


@hookimpl
def core_register_machines(register: Callable[[MachineProfile], None]) -> None:
    for profile in graphcore_machines():
        register(profile)


@hookimpl
def core_register_packages(register: Callable[[str], None]) -> None:
    register("poptorch")  # the Poplar SDK's PyTorch
