"""NVIDIA plugin. Its placement and NVML energy code is being written (see the NVIDIA issue);
until then the accelerator is listed as unavailable with the exact reason."""

from __future__ import annotations

from typing import Callable, ClassVar

from core import Accelerator, hookimpl
from plugins.probing import PendingAccelerator, SdkProbe


class NvidiaAccelerator(PendingAccelerator):
    name: ClassVar[str] = "nvidia"
    description: ClassVar[str] = "NVIDIA GPUs through CUDA (PyTorch DDP/NCCL, TensorFlow), NVML energy"
    probe: ClassVar[SdkProbe] = SdkProbe(
        module="pynvml",
        install_hint="nvidia-ml-py is not installed (pip install 'core[nvidia]')",
        device_globs=("/dev/nvidia[0-9]*", "/proc/driver/nvidia/version"),
        device_hint="no NVIDIA GPU or driver found (no /dev/nvidia* device nodes)",
    )
    pending_reason: ClassVar[str] = "the NVIDIA placement is not implemented in this version of core"


@hookimpl
def core_register_accelerators(register: Callable[[Accelerator], None]) -> None:
    register(NvidiaAccelerator())
