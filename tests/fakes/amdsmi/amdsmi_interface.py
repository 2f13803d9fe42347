"""The functions of amdsmi_interface.py the plugin uses, over the simulated node.

Each mirrors the real binding: the handle type check (AmdSmiParameterException), the status
check (_check_res: AmdSmiRetryException, AmdSmiTimeoutException, else AmdSmiLibraryException),
and the returned dict's keys, units and "N/A" conventions of the installed version:

- amdsmi_get_energy_count: {'power', ...} until 6.2, both 'power' and 'energy_accumulator' in
  6.3, {'energy_accumulator', ...} from 6.4; counter_resolution is a c_float (uJ).
- amdsmi_get_power_info: whole watts; 0xFFFF becomes "N/A" from 6.1 (6.0 returned it raw);
  7.0 adds 'socket_power'.
- amdsmi_get_gpu_asic_info: device_id a hex string and asic_serial "0x%016X" from 6.1 (raw
  before); num_compute_units and target_graphics_version from 6.3.
- amdsmi_get_gpu_kfd_info (6.3+), amdsmi_get_gpu_enumeration_info (6.4+): see fake.install.
"""

from __future__ import annotations

import ctypes
import uuid as _uuid
from enum import IntEnum
from typing import Any

from . import amdsmi_wrapper
from .amdsmi_exception import (
    AmdSmiLibraryException,
    AmdSmiParameterException,
    AmdSmiRetryException,
    AmdSmiTimeoutException,
)


class AmdSmiInitFlags(IntEnum):
    INIT_ALL_PROCESSORS = amdsmi_wrapper.AMDSMI_INIT_ALL_PROCESSORS
    INIT_AMD_CPUS = amdsmi_wrapper.AMDSMI_INIT_AMD_CPUS
    INIT_AMD_GPUS = amdsmi_wrapper.AMDSMI_INIT_AMD_GPUS
    INIT_AMD_APUS = amdsmi_wrapper.AMDSMI_INIT_AMD_APUS
    INIT_NON_AMD_CPUS = amdsmi_wrapper.AMDSMI_INIT_NON_AMD_CPUS
    INIT_NON_AMD_GPUS = amdsmi_wrapper.AMDSMI_INIT_NON_AMD_GPUS


class AmdSmiMemoryType(IntEnum):
    VRAM = amdsmi_wrapper.AMDSMI_MEM_TYPE_VRAM
    VIS_VRAM = amdsmi_wrapper.AMDSMI_MEM_TYPE_VIS_VRAM
    GTT = amdsmi_wrapper.AMDSMI_MEM_TYPE_GTT


def _check_res(ret_code: int) -> None:
    if ret_code == amdsmi_wrapper.AMDSMI_STATUS_RETRY:
        raise AmdSmiRetryException()
    if ret_code == amdsmi_wrapper.AMDSMI_STATUS_TIMEOUT:
        raise AmdSmiTimeoutException()
    if ret_code != amdsmi_wrapper.AMDSMI_STATUS_SUCCESS:
        raise AmdSmiLibraryException(ret_code)


def _node() -> Any:
    node = amdsmi_wrapper.node
    if node is None:
        raise RuntimeError("fake amdsmi: no node installed (call amdsmi.fake.install)")
    return node


def _gcd(processor_handle: Any, function: str) -> Any:
    """The GCD behind a handle, after the checks every real function makes."""
    if not isinstance(processor_handle, amdsmi_wrapper.amdsmi_processor_handle):
        raise AmdSmiParameterException(processor_handle, amdsmi_wrapper.amdsmi_processor_handle)
    node = _node()
    node.calls.append(function)
    if not node.initialized:
        _check_res(amdsmi_wrapper.AMDSMI_STATUS_NOT_INIT)
    if not 0 <= processor_handle._index < len(node.gcds):
        _check_res(amdsmi_wrapper.AMDSMI_STATUS_NOT_FOUND)
    gcd = node.gcds[processor_handle._index]
    _check_res(gcd.failing.get(function, amdsmi_wrapper.AMDSMI_STATUS_SUCCESS))
    return gcd


def _version() -> tuple[int, int, int]:
    return _node().version


def amdsmi_init(flag: AmdSmiInitFlags = AmdSmiInitFlags.INIT_AMD_GPUS) -> None:
    if not isinstance(flag, AmdSmiInitFlags):
        raise AmdSmiParameterException(flag, AmdSmiInitFlags)
    node = _node()
    node.calls.append("amdsmi_init")
    if node.initialized:  # amd_smi.cc: a second init is a no-op, not counted
        return
    _check_res(node.init_status)
    node.initialized = True


def amdsmi_shut_down() -> None:
    node = _node()
    node.calls.append("amdsmi_shut_down")
    node.initialized = False  # amd_smi.cc: one shut-down ends the library, however many inits


def amdsmi_get_processor_handles() -> list[Any]:
    node = _node()
    node.calls.append("amdsmi_get_processor_handles")
    if not node.initialized:
        _check_res(amdsmi_wrapper.AMDSMI_STATUS_NOT_INIT)
    return [amdsmi_wrapper.amdsmi_processor_handle(index) for index in range(len(node.gcds))]


def amdsmi_get_gpu_device_bdf(processor_handle: Any) -> str:
    return _gcd(processor_handle, "amdsmi_get_gpu_device_bdf").bdf


def amdsmi_get_gpu_device_uuid(processor_handle: Any) -> str:
    # Real: amdsmi_uuid_gen(asic_serial, device_id, 0xff), a generated RFC 4122 string.
    gcd = _gcd(processor_handle, "amdsmi_get_gpu_device_uuid")
    return str(_uuid.UUID(int=(gcd.unique_id << 64) | (gcd.device_id << 16) | 0xFF))


def amdsmi_get_gpu_asic_info(processor_handle: Any) -> dict[str, Any]:
    gcd = _gcd(processor_handle, "amdsmi_get_gpu_asic_info")
    info: dict[str, Any] = {
        "market_name": gcd.market_name,
        "vendor_id": 0x1002,
        "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
        "subvendor_id": 0x1002,
        "device_id": gcd.device_id,
        "rev_id": 0x1,
        "asic_serial": f"{gcd.unique_id:016x}",
        "oam_id": gcd.kfd_node,
    }
    if _version() >= (6, 1, 0):
        for key in ("vendor_id", "subvendor_id", "device_id"):
            info[key] = hex(info[key])
        info["rev_id"] = "0x01"
        info["asic_serial"] = "0x{:016X}".format(int(info["asic_serial"], 16))
    if _version() >= (6, 3, 0):
        info["num_compute_units"] = gcd.compute_units
        info["target_graphics_version"] = gcd.gfx
    return info


def _amdsmi_get_gpu_kfd_info(processor_handle: Any) -> dict[str, Any]:
    gcd = _gcd(processor_handle, "amdsmi_get_gpu_kfd_info")
    return {"kfd_id": 40000 + gcd.kfd_node, "node_id": gcd.kfd_node, "current_partition_id": 0}


def _amdsmi_get_gpu_enumeration_info(processor_handle: Any) -> dict[str, Any]:
    gcd = _gcd(processor_handle, "amdsmi_get_gpu_enumeration_info")
    smallest = min(g.kfd_node for g in _node().gcds)  # real: node_id minus the smallest KFD GPU node id
    return {
        "drm_render": 128 + _node().gcds.index(gcd),
        "drm_card": _node().gcds.index(gcd),
        "hsa_id": gcd.kfd_node,
        "hip_id": gcd.kfd_node - smallest,
        "hip_uuid": gcd.uuid,
    }


def amdsmi_get_gpu_memory_total(processor_handle: Any, mem_type: AmdSmiMemoryType) -> int:
    gcd = _gcd(processor_handle, "amdsmi_get_gpu_memory_total")
    if not isinstance(mem_type, AmdSmiMemoryType):
        raise AmdSmiParameterException(mem_type, AmdSmiMemoryType)
    return gcd.vram_bytes if mem_type == AmdSmiMemoryType.VRAM else 0


def amdsmi_get_power_info(processor_handle: Any) -> dict[str, Any]:
    gcd = _gcd(processor_handle, "amdsmi_get_power_info")
    node = _node()
    watts = 0xFFFF if gcd.power_na else int(round(node.reported_watts(gcd)))
    info: dict[str, Any] = {
        "current_socket_power": watts if gcd.current_power_supported else 0xFFFF,
        "average_socket_power": watts,
        "gfx_voltage": 781,
        "soc_voltage": 0xFFFF,
        "mem_voltage": 0xFFFF,
        "power_limit": 560,
    }
    if _version() >= (7, 0, 0):
        info = {"socket_power": watts, **info}
    if _version() >= (6, 1, 0):
        info = {key: ("N/A" if value == 0xFFFF else value) for key, value in info.items()}
    return info


def amdsmi_get_energy_count(processor_handle: Any) -> dict[str, Any]:
    gcd = _gcd(processor_handle, "amdsmi_get_energy_count")
    if not gcd.energy_supported:
        _check_res(amdsmi_wrapper.AMDSMI_STATUS_NOT_SUPPORTED)
    accumulator = ctypes.c_uint64(gcd.accumulator).value
    resolution = ctypes.c_float(gcd.counter_resolution).value
    timestamp = _node().timestamp_ns
    if _version() < (6, 3, 0):
        return {"power": accumulator, "counter_resolution": resolution, "timestamp": timestamp}
    if _version() < (6, 4, 0):
        return {
            "power": accumulator,
            "energy_accumulator": accumulator,
            "counter_resolution": resolution,
            "timestamp": timestamp,
        }
    return {"energy_accumulator": accumulator, "counter_resolution": resolution, "timestamp": timestamp}


def amdsmi_get_minmax_bandwidth_between_processors(
    processor_handle_src: Any, processor_handle_dst: Any
) -> dict[str, int]:
    src = _gcd(processor_handle_src, "amdsmi_get_minmax_bandwidth_between_processors")
    dst = _gcd(processor_handle_dst, "amdsmi_get_minmax_bandwidth_between_processors")
    if src is dst:
        _check_res(amdsmi_wrapper.AMDSMI_STATUS_INVAL)
    links = _node().links_between(src, dst)
    if links == 0:  # rsmi_minmax_bandwidth_get answers only for a direct XGMI link
        _check_res(amdsmi_wrapper.AMDSMI_STATUS_NOT_SUPPORTED)
    from .fake import LINK_MBPS

    return {"min_bandwidth": LINK_MBPS, "max_bandwidth": links * LINK_MBPS}


def amdsmi_topo_get_link_weight(processor_handle_src: Any, processor_handle_dst: Any) -> int:
    """KFD io-link weight: KFD_CRAT_XGMI_WEIGHT (15) x XGMI hops (kfd_crat.c); one hop per direct link."""
    src = _gcd(processor_handle_src, "amdsmi_topo_get_link_weight")
    dst = _gcd(processor_handle_dst, "amdsmi_topo_get_link_weight")
    return 15 if _node().links_between(src, dst) else 30


def amdsmi_get_gpu_driver_info(processor_handle: Any) -> dict[str, Any]:
    _gcd(processor_handle, "amdsmi_get_gpu_driver_info")
    return {"driver_name": "amdgpu", "driver_version": _node().driver_version, "driver_date": "2015/01/01 00:00"}


def amdsmi_get_lib_version() -> dict[str, Any]:
    major, minor, release = _version()
    return {
        "major": 25 if major >= 7 else 24,
        "minor": minor,
        "release": release,
        "build": ".".join(str(p) for p in _version()),
    }
