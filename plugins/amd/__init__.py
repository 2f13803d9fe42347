"""AMD plugin. Its ROCm placement and amdsmi energy code is being written (see the AMD issue);
until then the accelerator is listed as unavailable with the exact reason."""

from __future__ import annotations

from typing import Callable, ClassVar

from core import Accelerator, hookimpl
from plugins.probing import PendingAccelerator, SdkProbe


class AmdAccelerator(PendingAccelerator):
    name: ClassVar[str] = "amd"
    description: ClassVar[str] = "AMD Instinct GPUs through ROCm (PyTorch RCCL, TensorFlow), amdsmi energy"
    probe: ClassVar[SdkProbe] = SdkProbe(
        module="amdsmi",
        install_hint="amdsmi is not installed (pip install 'core[amd]'; it also needs ROCm's libamd_smi)",
        device_globs=("/dev/kfd",),
        device_hint="no AMD GPU found (no /dev/kfd: the amdgpu/ROCm kernel driver is not loaded)",
    )
    pending_reason: ClassVar[str] = "the AMD placement is not implemented in this version of core"


@hookimpl
def core_register_accelerators(register: Callable[[Accelerator], None]) -> None:
    register(AmdAccelerator())
