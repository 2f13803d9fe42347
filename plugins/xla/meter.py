"""Why a run on an XLA device has no energy figure: said once, here, with the reason per device type.

Cloud TPU VMs give a guest no per-chip power or energy reading: libtpu and its monitoring
library (``tpu-info``: duty cycle, HBM use, TensorCore utilisation) report no power, and the
host's RAPL counters (where a VM exposes them) cover the host's CPU packages, not the TPU chips.
Google's TPU pages state power only as measured min/mean/max per chip for v2 to v4, a datasheet
figure, not a reading of this run. So energy is unavailable, and the result says why, rather
than approximated from a datasheet.

This factory reads the ``xla`` accelerator and is never available; core records its reason as
the run's ``energy_unavailable_reason``. A plugin with a real reading for one of these devices
registers its own meter, which ``core_select_power_meter`` then prefers over an unavailable one.
"""

from __future__ import annotations

from typing import ClassVar

from core.plugin import Availability, DeviceRecord, PowerMeter, PowerMeterFactory, RunContext, UnavailableMeter

from . import discovery

NO_TPU_POWER = (
    "Cloud TPU VMs expose no per-chip power or energy interface (libtpu and tpu-info report utilisation and "
    "memory, no power; RAPL, where present, covers the host CPU, not the chips)"
)
NO_XLA_CPU_POWER = (
    "XLA's CPU device runs on the host CPU, whose RAPL energy the cpu accelerator's meter reads for "
    "--accelerator cpu; this plugin attributes no host energy to an XLA run"
)
NO_XLA_CUDA_POWER = (
    "GPUs under PJRT_DEVICE=CUDA: NVML's energy counters are read by the nvidia accelerator's meter for "
    "--accelerator nvidia; this plugin does not read them"
)


def unavailable_reason(device: str | None) -> str:
    if device == "CPU":
        return NO_XLA_CPU_POWER
    if device == "CUDA":
        return NO_XLA_CUDA_POWER
    return NO_TPU_POWER


class XlaEnergyFactory(PowerMeterFactory):
    name: ClassVar[str] = "xla-energy"
    description: ClassVar[str] = "energy of XLA devices: none readable (Cloud TPU VMs have no per-chip power interface)"
    accelerators: ClassVar[tuple[str, ...]] = ("xla",)

    def availability(self) -> Availability:
        return Availability.no(unavailable_reason(discovery.pjrt_device()))

    def meter_for(self, devices: list[DeviceRecord], context: RunContext) -> PowerMeter:
        return UnavailableMeter(self.name, unavailable_reason(discovery.pjrt_device()))
