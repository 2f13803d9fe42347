"""NVIDIA GPUs: the shared CUDA-API placement of core.executors.gpu, discovered and described through NVML."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import Field

from core.plugin import (
    Availability,
    DeviceRecord,
    MemoryBandwidth,
    Precision,
    RunContext,
    TorchGpuAccelerator,
)

from ..probing import SdkProbe
from . import nvml
from .peaks import NVIDIA_PEAKS

PROBE = SdkProbe(
    module="pynvml",
    install_hint="nvidia-ml-py is not installed (pip install 'core[nvidia]')",
    device_globs=("/dev/nvidia[0-9]*",),
    device_hint="no NVIDIA GPU or driver found (no /dev/nvidia* device nodes)",
)


#: TF32 and bf16 arrived with Ampere, compute capability 8.0; older GPUs (a T4 is 7.5) compute fp32 and fp16
_AMPERE = (8, 0)
_ALL = (Precision.fp32, Precision.tf32, Precision.bf16, Precision.fp16, Precision.default)
_BEFORE_AMPERE = (Precision.fp32, Precision.fp16, Precision.default)


def precisions_for_compute_capability(capability: str) -> tuple[Precision, ...]:
    """The precisions a GPU of ``capability`` ("MAJOR.MINOR", as NVML reports it) computes."""
    major, _, minor = capability.partition(".")
    return _ALL if (int(major), int(minor or 0)) >= _AMPERE else _BEFORE_AMPERE


class NvidiaAccelerator(TorchGpuAccelerator):
    name: ClassVar[str] = "nvidia"
    description: ClassVar[str] = "NVIDIA GPUs through CUDA (PyTorch DDP/NCCL, TensorFlow MirroredStrategy), NVML energy"
    torch_build_attribute: ClassVar[str] = "cuda"
    #: "8.0" as NVML reports it (major.minor); tf32 and bf16 need 8.0 or newer
    machine_details: ClassVar[dict[str, Any]] = {
        "compute_capability": Annotated[
            str,
            Field(pattern=r"^[0-9]{1,2}\.[0-9]{1,2}$", description='MAJOR.MINOR as NVML reports it, e.g. "8.0"'),
        ]
    }

    def availability(self) -> Availability:
        missing = PROBE.missing()
        return Availability.no("; ".join(missing)) if missing else Availability.yes()

    def visible_devices(self) -> list[DeviceRecord]:
        return [
            DeviceRecord(
                index=position,
                name=gpu.name,
                kind=self.name,
                memory_bytes=gpu.memory_bytes,
                details={
                    "uuid": gpu.uuid,
                    "nvml_index": gpu.nvml_index,
                    "compute_capability": gpu.compute_capability,
                    "power_limit_watts": gpu.power_limit_watts,
                    "energy_counter": gpu.has_energy_counter,
                    **({"mig_parent_uuid": gpu.mig_parent_uuid} if gpu.mig_parent_uuid else {}),
                },
            )
            for position, gpu in enumerate(nvml.visible_gpus())
        ]

    def precisions(self, framework: Any) -> tuple[Precision, ...]:
        return _ALL

    def validate_run(self, context: RunContext) -> None:
        from core.plugin import ConfigError

        config = context.config
        if config.precision not in (Precision.tf32, Precision.bf16):
            return
        # TF32 and bf16 need Ampere (compute capability 8.0) or newer.
        if context.machine is not None:
            capability = context.machine.details.get("compute_capability")
            if capability is None:
                context.warn(
                    f"machine {context.machine.name!r} gives no compute_capability: "
                    f"{config.precision.value} support (compute capability 8.0 or newer) not checked"
                )
                return
            capabilities = [(context.machine.device, str(capability))]
        else:
            capabilities = [
                (d.name, str(d.details["compute_capability"])) for d in self.visible_devices()[: config.replicas]
            ]
        old = [
            (name, capability)
            for name, capability in capabilities
            if config.precision not in precisions_for_compute_capability(capability)
        ]
        if old:
            raise ConfigError(
                "precision",
                config.precision.value,
                f"{old[0][0]} (compute capability {old[0][1]}) supports fp32 and fp16; "
                "tf32 and bf16 need compute capability 8.0 or newer",
            )

    def configure_torch_for(self, context: RunContext) -> dict[str, Any]:
        import torch

        # cuDNN picks the fastest convolution algorithm once per shape: the first step pays for it.
        torch.backends.cudnn.benchmark = True
        return {"cudnn_benchmark": True, "cudnn_version": torch.backends.cudnn.version()}

    def driver_versions(self) -> dict[str, str]:
        try:
            return nvml.driver_versions()
        except Exception as exc:  # versions are informative; their absence must not fail a run
            return {"nvidia_driver": f"unknown ({type(exc).__name__}: {exc})"}

    def peak_flops_per_second(self, device: DeviceRecord, precision: Precision) -> tuple[float, str] | None:
        if device.details.get("mig_parent_uuid"):
            return None  # a MIG device has a fraction of the GPU's SMs; the datasheet peak is the whole GPU's
        entry = NVIDIA_PEAKS.entry_for(device.name)
        flops = NVIDIA_PEAKS.flops_per_second(device.name, precision)
        return (flops, entry.source) if entry is not None and flops is not None else None

    def memory_bandwidth(self, device: DeviceRecord) -> MemoryBandwidth | None:
        if device.details.get("mig_parent_uuid"):
            return None  # a MIG slice has a share of the memory system, which no datasheet gives
        return NVIDIA_PEAKS.memory_bandwidth(device.name)
