"""A thin, lazy layer over pynvml (package nvidia-ml-py): device discovery and energy readers.

Units from NVML: energy counter in millijoules since the driver loaded (Volta and newer), power
in milliwatts, memory in bytes, power limits in milliwatts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

from core.sdk import SharedLibrarySession
from plugins.nvidia.visibility import visible_nvml_indices

def import_pynvml() -> Any:
    import pynvml  # from nvidia-ml-py; imported here so `core plugins` never loads it

    return pynvml


def _start_nvml() -> Any:
    pynvml = import_pynvml()
    pynvml.nvmlInit()
    return pynvml


# nvmlInit / nvmlShutdown once for all overlapping users: meters and discovery may overlap.
nvml_session = SharedLibrarySession(_start_nvml, lambda pynvml: pynvml.nvmlShutdown())


def _text(value: Any) -> str:
    # nvidia-ml-py before 11.515 returned bytes for names and UUIDs.
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class NvmlGpu:
    nvml_index: int
    uuid: str
    name: str
    memory_bytes: int
    compute_capability: str
    architecture: int | None
    power_limit_watts: float | None
    has_energy_counter: bool


def _optional(call: Callable[[], Any], pynvml: Any) -> Any:
    try:
        return call()
    except pynvml.NVMLError_NotSupported:
        return None


def describe(pynvml: Any, index: int) -> NvmlGpu:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
    architecture = _optional(lambda: pynvml.nvmlDeviceGetArchitecture(handle), pynvml)
    limit_mw = _optional(lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(handle), pynvml)
    return NvmlGpu(
        nvml_index=index,
        uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
        name=_text(pynvml.nvmlDeviceGetName(handle)),
        memory_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
        compute_capability=f"{major}.{minor}",
        architecture=architecture,
        power_limit_watts=limit_mw / 1000.0 if limit_mw is not None else None,
        # The total-energy counter exists from Volta on (nvmlDeviceGetTotalEnergyConsumption docs).
        has_energy_counter=architecture is not None and architecture >= pynvml.NVML_DEVICE_ARCH_VOLTA
        and architecture != pynvml.NVML_DEVICE_ARCH_UNKNOWN,
    )


def visible_gpus() -> list[NvmlGpu]:
    """The GPUs this process sees, in CUDA's order, honouring CUDA_VISIBLE_DEVICES."""
    with nvml_session() as pynvml:
        count = pynvml.nvmlDeviceGetCount()
        uuids = [_text(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))) for i in range(count)]
        order = visible_nvml_indices(os.environ.get("CUDA_VISIBLE_DEVICES"), uuids)
        return [describe(pynvml, index) for index in order]


def driver_versions() -> dict[str, str]:
    with nvml_session() as pynvml:
        versions = {"nvidia_driver": _text(pynvml.nvmlSystemGetDriverVersion())}
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()  # e.g. 12040 for CUDA 12.4
        versions["cuda_driver"] = f"{cuda // 1000}.{cuda % 1000 // 10}"
        return versions


def energy_counter_joules(pynvml: Any, handle: Any) -> float:
    return pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000.0


def instant_power_watts(pynvml: Any, handle: Any) -> float | None:
    """Instantaneous power; nvmlDeviceGetPowerUsage is a ~1 s running average on A100/H100 parts,
    so integrating it lags the truth. Falls back to the average where the field is missing."""
    value = pynvml.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_POWER_INSTANT])[0]
    if value.nvmlReturn == pynvml.NVML_SUCCESS:
        return value.value.uiVal / 1000.0
    return pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
