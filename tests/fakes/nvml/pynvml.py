"""A fake of pynvml (nvidia-ml-py 13.x) over a simulated machine.

Mirrors the real module where the plugin touches it: function names, return types and units
(energy in mJ as int, power in mW, memory in bytes), NVML_* constants with their real values,
and the NVMLError hierarchy (NVMLError(code) maps to the NVMLError_<Name> subclass, str() gives
the real message). Tests drive the machine through ``machine``; the plugin sees only the API.
"""

from __future__ import annotations

import string
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

NVML_DEVICE_ARCH_KEPLER = 2
NVML_DEVICE_ARCH_MAXWELL = 3
NVML_DEVICE_ARCH_PASCAL = 4
NVML_DEVICE_ARCH_VOLTA = 5
NVML_DEVICE_ARCH_TURING = 6
NVML_DEVICE_ARCH_AMPERE = 7
NVML_DEVICE_ARCH_ADA = 8
NVML_DEVICE_ARCH_HOPPER = 9
NVML_DEVICE_ARCH_BLACKWELL = 10
NVML_DEVICE_ARCH_UNKNOWN = 0xFFFFFFFF

NVML_FI_DEV_POWER_INSTANT = 186
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_POWER_SCOPE_GPU = 0
NVML_POWER_SCOPE_MODULE = 1


class NVMLError(Exception):
    _valClassMapping: dict[int, type] = {}
    _errcode_to_string = {
        NVML_ERROR_UNINITIALIZED: "Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED: "Not Supported",
        NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
        NVML_ERROR_ALREADY_INITIALIZED: "Already Initialized",
        NVML_ERROR_NOT_FOUND: "Not Found",
        NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
        NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
        NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
        NVML_ERROR_GPU_IS_LOST: "GPU is lost",
        NVML_ERROR_UNKNOWN: "Unknown Error",
    }

    def __new__(typ, value: int) -> NVMLError:  # noqa: N804 - mirrors the real signature
        if typ == NVMLError:
            typ = NVMLError._valClassMapping.get(value, typ)
        obj = Exception.__new__(typ)
        obj.value = value
        return obj

    def __str__(self) -> str:
        return NVMLError._errcode_to_string.get(self.value, "NVML Error with code %d" % self.value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NVMLError) and self.value == other.value

    __hash__ = Exception.__hash__


def _extract_errors_as_classes() -> None:
    # Same naming rule as the real module: NVML_ERROR_GPU_IS_LOST -> NVMLError_GpuIsLost.
    module = sys.modules[__name__]
    for name in [n for n in dir(module) if n.startswith("NVML_ERROR_")]:
        class_name = "NVMLError_" + string.capwords(name.replace("NVML_ERROR_", ""), "_").replace("_", "")
        code = getattr(module, name)

        def make_new(val: int) -> Callable[..., Any]:
            def new(typ: type, *args: Any) -> NVMLError:
                return NVMLError.__new__(typ, val)

            return new

        cls = type(class_name, (NVMLError,), {"__new__": make_new(code)})
        cls.__module__ = __name__
        setattr(module, class_name, cls)
        NVMLError._valClassMapping[code] = cls


_extract_errors_as_classes()


@dataclass
class FakeGpu:
    name: str = "NVIDIA H200"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    memory_total: int = 150_754_820_096
    compute_capability: tuple[int, int] = (9, 0)
    architecture: int = NVML_DEVICE_ARCH_HOPPER
    power_limit_mw: int = 700_000
    power_watts: Callable[[float], float] = lambda t: 300.0  # instantaneous power at machine time t
    instant_power_supported: bool = True
    lost: bool = False  # every call on the device raises NVMLError_GpuIsLost

    def energy_mj(self, t: float, dt: float = 1e-3) -> int:
        # The counter is the integral of the power trace since "driver load" (t = 0).
        steps = int(t / dt)
        return int(sum(self.power_watts((k + 0.5) * dt) * dt for k in range(steps)) * 1000)


@dataclass
class FakeMachine:
    gpus: list[FakeGpu] = field(default_factory=list)
    library_present: bool = True
    driver_version: str = "570.124.06"
    cuda_driver_version: int = 12080
    calls: list[str] = field(default_factory=list)
    # Machine time is real time since the machine was made ("driver load"), so the meter's own
    # sampling thread and the counters agree, as on hardware.
    started: float = field(default_factory=time.monotonic)

    @property
    def time(self) -> float:
        return time.monotonic() - self.started


machine = FakeMachine()
_initialized = 0
_lock = threading.Lock()


def _check_init() -> None:
    if _initialized <= 0:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)


def _gpu(handle: Any) -> FakeGpu:
    _check_init()
    if not isinstance(handle, SimpleNamespace) or not hasattr(handle, "gpu"):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    if handle.gpu.lost:
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    return handle.gpu


def nvmlInit() -> None:
    global _initialized
    machine.calls.append("nvmlInit")
    if not machine.library_present:
        raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
    with _lock:
        _initialized += 1


def nvmlShutdown() -> None:
    global _initialized
    machine.calls.append("nvmlShutdown")
    _check_init()
    with _lock:
        _initialized -= 1


def nvmlSystemGetDriverVersion() -> str:
    _check_init()
    return machine.driver_version


def nvmlSystemGetCudaDriverVersion() -> int:
    _check_init()
    return machine.cuda_driver_version


def nvmlDeviceGetCount() -> int:
    _check_init()
    return len(machine.gpus)


def nvmlDeviceGetHandleByIndex(index: int) -> SimpleNamespace:
    _check_init()
    if not 0 <= index < len(machine.gpus):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return SimpleNamespace(gpu=machine.gpus[index])


def nvmlDeviceGetHandleByUUID(uuid: str | bytes) -> SimpleNamespace:
    _check_init()
    wanted = uuid.decode() if isinstance(uuid, bytes) else uuid
    for gpu in machine.gpus:
        if gpu.uuid == wanted:
            return SimpleNamespace(gpu=gpu)
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetName(handle: Any) -> str:
    return _gpu(handle).name


def nvmlDeviceGetUUID(handle: Any) -> str:
    return _gpu(handle).uuid


def nvmlDeviceGetMemoryInfo(handle: Any, version: Any = None) -> SimpleNamespace:
    total = _gpu(handle).memory_total
    return SimpleNamespace(total=total, free=total, used=0)


def nvmlDeviceGetCudaComputeCapability(handle: Any) -> tuple[int, int]:
    return _gpu(handle).compute_capability


def nvmlDeviceGetArchitecture(device: Any) -> int:
    return _gpu(device).architecture


def nvmlDeviceGetEnforcedPowerLimit(handle: Any) -> int:
    return _gpu(handle).power_limit_mw


def nvmlDeviceGetTotalEnergyConsumption(handle: Any) -> int:
    gpu = _gpu(handle)
    if gpu.architecture < NVML_DEVICE_ARCH_VOLTA:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    machine.calls.append("nvmlDeviceGetTotalEnergyConsumption")
    return gpu.energy_mj(machine.time)


def nvmlDeviceGetPowerUsage(handle: Any) -> int:
    gpu = _gpu(handle)
    return int(gpu.power_watts(machine.time) * 1000)


def nvmlDeviceGetFieldValues(handle: Any, fieldIds: list[Any]) -> list[SimpleNamespace]:  # noqa: N803
    gpu = _gpu(handle)
    values = []
    for field_id in fieldIds:
        fid, scope = field_id if isinstance(field_id, tuple) else (field_id, 0)
        supported = fid == NVML_FI_DEV_POWER_INSTANT and gpu.instant_power_supported
        values.append(
            SimpleNamespace(
                fieldId=fid,
                scopeId=scope,
                timestamp=int(machine.time * 1e6),
                latencyUsec=0,
                valueType=NVML_VALUE_TYPE_UNSIGNED_INT,
                nvmlReturn=NVML_SUCCESS if supported else NVML_ERROR_NOT_SUPPORTED,
                value=SimpleNamespace(
                    uiVal=int(gpu.power_watts(machine.time) * 1000) if supported else 0,
                    dVal=0.0,
                    ulVal=0,
                    ullVal=0,
                    sllVal=0,
                    siVal=0,
                    usVal=0,
                ),
            )
        )
    return values
