"""A thin, lazy layer over pynvml (package nvidia-ml-py): device discovery and energy readers.

Units from NVML: energy counter in millijoules since the driver loaded (Volta and newer), power
in milliwatts, memory in bytes, power limits in milliwatts.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from core.plugin import SharedLibrarySession

from .visibility import MigDevice, names_mig_devices, visible_placements


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
    #: For a MIG device: ``uuid``, ``name`` and ``memory_bytes`` are the MIG device's (what CUDA places
    #: work on); energy and power exist only for the whole GPU, whose UUID this is.
    mig_parent_uuid: str | None = None


def _optional(call: Callable[[], Any], pynvml: Any) -> Any:
    """The answer, or None where this device or driver has none.

    A query newer than the driver raises NVMLError_FunctionNotFound, not NotSupported (pynvml's
    _nvmlGetFunctionPointer: the symbol is missing from libnvidia-ml.so.1), as nvmlDeviceGetArchitecture
    is from older drivers. Virtualised GPUs answer NoPermission for some queries (power limits).
    """
    try:
        return call()
    except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound, pynvml.NVMLError_NoPermission):
        return None


def _volta_or_newer(pynvml: Any, architecture: int | None, major: int) -> bool:
    if architecture is not None and architecture != pynvml.NVML_DEVICE_ARCH_UNKNOWN:
        return bool(architecture >= pynvml.NVML_DEVICE_ARCH_VOLTA)
    return major >= 7  # Volta is compute capability 7.0: the answer where the driver cannot name the architecture


def describe(pynvml: Any, index: int, mig: MigDevice | None = None) -> NvmlGpu:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    placed = handle if mig is None else pynvml.nvmlDeviceGetHandleByUUID(mig.uuid)
    major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
    architecture = _optional(lambda: pynvml.nvmlDeviceGetArchitecture(handle), pynvml)
    limit_mw = _optional(lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(handle), pynvml)
    return NvmlGpu(
        nvml_index=index,
        uuid=_text(pynvml.nvmlDeviceGetUUID(placed)),
        name=_text(pynvml.nvmlDeviceGetName(placed)),
        memory_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(placed).total),
        compute_capability=f"{major}.{minor}",
        architecture=architecture,
        power_limit_watts=limit_mw / 1000.0 if limit_mw is not None else None,
        # The total-energy counter exists from Volta on (nvmlDeviceGetTotalEnergyConsumption docs).
        # Where it still fails (some virtualised GPUs), the meter falls back to sampled power.
        has_energy_counter=_volta_or_newer(pynvml, architecture, major),
        mig_parent_uuid=None if mig is None else _text(pynvml.nvmlDeviceGetUUID(handle)),
    )


def mig_devices(pynvml: Any, count: int) -> list[MigDevice]:
    """Every MIG device of the node (NVML: nvmlDeviceGetMigMode, GetMaxMigDeviceCount,
    GetMigDeviceHandleByIndex, which answers NotFound for an empty slot)."""
    found: list[MigDevice] = []
    for index in range(count):
        gpu = pynvml.nvmlDeviceGetHandleByIndex(index)
        mode = _optional(partial(pynvml.nvmlDeviceGetMigMode, gpu), pynvml)
        if not mode or mode[0] != pynvml.NVML_DEVICE_MIG_ENABLE:
            continue
        for slot in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(gpu)):
            try:
                device = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, slot)
            except pynvml.NVMLError_NotFound:
                continue
            found.append(
                MigDevice(
                    uuid=_text(pynvml.nvmlDeviceGetUUID(device)),
                    parent_index=index,
                    gpu_instance=pynvml.nvmlDeviceGetGpuInstanceId(device),
                    compute_instance=pynvml.nvmlDeviceGetComputeInstanceId(device),
                )
            )
    return found


def nvml_problem() -> str | None:
    """Why NVML cannot read a GPU on this host (it does not initialise, or sees none), or None.
    Asked only where the driver's device nodes exist: elsewhere NVML is never loaded."""
    try:
        with nvml_session() as pynvml:
            count = pynvml.nvmlDeviceGetCount()
    except Exception as error:  # NVMLError_LibraryNotFound, _DriverNotLoaded, _LibRmVersionMismatch, ...
        return (
            f"NVML does not initialise ({type(error).__name__}: {error}): the NVIDIA driver is not loaded, "
            "or its library does not match the kernel module"
        )
    return "NVML initialises but sees no GPU" if count == 0 else None


def visible_gpus() -> list[NvmlGpu]:
    """The GPUs this process sees, in CUDA's order, honouring CUDA_VISIBLE_DEVICES."""
    variable = os.environ.get("CUDA_VISIBLE_DEVICES")
    with nvml_session() as pynvml:
        count = pynvml.nvmlDeviceGetCount()
        uuids = [_text(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))) for i in range(count)]
        migs = mig_devices(pynvml, count) if names_mig_devices(variable) else []
        return [describe(pynvml, p.nvml_index, p.mig) for p in visible_placements(variable, uuids, migs)]


def driver_versions() -> dict[str, str]:
    with nvml_session() as pynvml:
        versions = {"nvidia_driver": _text(pynvml.nvmlSystemGetDriverVersion())}
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()  # e.g. 12040 for CUDA 12.4
        versions["cuda_driver"] = f"{cuda // 1000}.{cuda % 1000 // 10}"
        return versions


def energy_counter_joules(pynvml: Any, handle: Any) -> float:
    return pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000.0


INSTANT_POWER = "NVML_FI_DEV_POWER_INSTANT"
# NVML's nvmlDeviceGetPowerUsage documentation: "On Ampere (except GA100) or newer GPUs, the API
# returns power averaged over a 1 sec interval. On GA100 and older architectures, instantaneous power
# is returned." So an A100 is instantaneous here; H100/H200 and Ampere consumer parts are averaged.
AVERAGED_POWER = "nvmlDeviceGetPowerUsage (a 1 s average on Ampere except GA100, and newer)"

# The member of the c_nvmlValue_t union that each NVML_VALUE_TYPE_* names (nvml.h, nvmlValueType_t).
_VALUE_MEMBERS = {
    "NVML_VALUE_TYPE_DOUBLE": "dVal",
    "NVML_VALUE_TYPE_UNSIGNED_INT": "uiVal",
    "NVML_VALUE_TYPE_UNSIGNED_LONG": "ulVal",
    "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG": "ullVal",
    "NVML_VALUE_TYPE_SIGNED_LONG_LONG": "sllVal",
    "NVML_VALUE_TYPE_SIGNED_INT": "siVal",
    "NVML_VALUE_TYPE_UNSIGNED_SHORT": "usVal",
}


def power_reader(pynvml: Any, handle: Any) -> tuple[Callable[[], float | None], str]:
    """The best power reading this device and this nvidia-ml-py offer, and its name for the result.

    Chosen once per device, not per sample: an integral that mixed instantaneous and averaged
    readings would be neither. nvmlDeviceGetPowerUsage lags the truth where it is a 1 s average, so
    the instantaneous field is preferred where the driver has it.
    """
    # NVML_FI_DEV_POWER_INSTANT (186) is in every nvidia-ml-py this project supports (11.525.150
    # has it); the getattr keeps an older or trimmed binding working on the averaged reading.
    field = getattr(pynvml, INSTANT_POWER, None)
    if field is not None:
        try:
            _field_watts(pynvml, handle, field, probe=True)
            supported = True
        except pynvml.NVMLError:
            supported = False
        if supported:
            return (lambda: _field_watts(pynvml, handle, field)), INSTANT_POWER
    return (lambda: pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0), AVERAGED_POWER


def _field_watts(pynvml: Any, handle: Any, field: int, probe: bool = False) -> float | None:
    value = pynvml.nvmlDeviceGetFieldValues(handle, [field])[0]
    if value.nvmlReturn != pynvml.NVML_SUCCESS:
        if probe:
            raise pynvml.NVMLError(value.nvmlReturn)
        return None  # no reading this time: a hole in the integral, which the sampler reports as such
    # The value is a union: read the member valueType names (a double read as uiVal is garbage).
    member = next(
        (m for name, m in _VALUE_MEMBERS.items() if getattr(pynvml, name, None) == value.valueType),
        None,
    )
    if member is None:
        if probe:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        return None
    return float(getattr(value.value, member)) / 1000.0  # milliwatts
