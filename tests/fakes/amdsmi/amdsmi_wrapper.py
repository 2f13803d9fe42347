"""Stands in for amdsmi_wrapper.py, the ctypes layer over ROCm's libamd_smi.so.

What the plugin can observe is mirrored: the status-code constants and enum values, the
``amdsmi_processor_handle`` type, and the way the real module loads the library at import time
(7.x ``find_smi_library``: $ROCM_HOME or $ROCM_PATH /lib, the linker's path, the package
directory, /opt/rocm/lib). When no libamd_smi.so is found the real module prints the loader's
error and a hint to stdout, then fails on its first symbol lookup with ``KeyError:
'libamd_smi.so'``; so does this one. A location counts as loadable when the file exists.

The C library's state (the simulated node) is ``node``, set by ``amdsmi.fake.install``.
"""

import os
from pathlib import Path

AMDSMI_STATUS_SUCCESS = 0
AMDSMI_STATUS_INVAL = 1
AMDSMI_STATUS_NOT_SUPPORTED = 2
AMDSMI_STATUS_NOT_YET_IMPLEMENTED = 3
AMDSMI_STATUS_FAIL_LOAD_MODULE = 4
AMDSMI_STATUS_FAIL_LOAD_SYMBOL = 5
AMDSMI_STATUS_DRM_ERROR = 6
AMDSMI_STATUS_API_FAILED = 7
AMDSMI_STATUS_TIMEOUT = 8
AMDSMI_STATUS_RETRY = 9
AMDSMI_STATUS_NO_PERM = 10
AMDSMI_STATUS_INTERRUPT = 11
AMDSMI_STATUS_IO = 12
AMDSMI_STATUS_ADDRESS_FAULT = 13
AMDSMI_STATUS_FILE_ERROR = 14
AMDSMI_STATUS_OUT_OF_RESOURCES = 15
AMDSMI_STATUS_INTERNAL_EXCEPTION = 16
AMDSMI_STATUS_INPUT_OUT_OF_BOUNDS = 17
AMDSMI_STATUS_INIT_ERROR = 18
AMDSMI_STATUS_REFCOUNT_OVERFLOW = 19
AMDSMI_STATUS_BUSY = 30
AMDSMI_STATUS_NOT_FOUND = 31
AMDSMI_STATUS_NOT_INIT = 32
AMDSMI_STATUS_NO_SLOT = 33
AMDSMI_STATUS_DRIVER_NOT_LOADED = 34
AMDSMI_STATUS_NO_DATA = 40
AMDSMI_STATUS_INSUFFICIENT_SIZE = 41
AMDSMI_STATUS_UNEXPECTED_SIZE = 42
AMDSMI_STATUS_UNEXPECTED_DATA = 43
AMDSMI_STATUS_FILE_NOT_FOUND = 52
AMDSMI_STATUS_MAP_ERROR = 4294967294
AMDSMI_STATUS_UNKNOWN_ERROR = 4294967295

AMDSMI_INIT_ALL_PROCESSORS = 4294967295
AMDSMI_INIT_AMD_CPUS = 1
AMDSMI_INIT_AMD_GPUS = 2
AMDSMI_INIT_NON_AMD_CPUS = 4
AMDSMI_INIT_NON_AMD_GPUS = 8
AMDSMI_INIT_AMD_APUS = 3

AMDSMI_MEM_TYPE_VRAM = 0
AMDSMI_MEM_TYPE_VIS_VRAM = 1
AMDSMI_MEM_TYPE_GTT = 2

# amdsmi_link_type_t as 7.x numbers it (6.4 used INTERNAL=0, XGMI=1, PCIE=2)
AMDSMI_LINK_TYPE_INTERNAL = 0
AMDSMI_LINK_TYPE_PCIE = 1
AMDSMI_LINK_TYPE_XGMI = 2
AMDSMI_LINK_TYPE_NOT_APPLICABLE = 3
AMDSMI_LINK_TYPE_UNKNOWN = 4


class amdsmi_processor_handle:  # noqa: N801 - the real one is ctypes.POINTER(None)
    """An opaque handle; the interface rejects anything else with AmdSmiParameterException."""

    def __init__(self, index: int) -> None:
        self.value = 0x5600_0000 + 0x100 * index  # an address, as a c_void_p would show
        self._index = index

    def __repr__(self) -> str:
        return f"<amdsmi.amdsmi_wrapper.LP_c_void_p object at {self.value:#x}>"


class _Library:
    """The loaded libamd_smi.so; attribute lookups are symbol lookups."""

    def __init__(self, location: str) -> None:
        self.location = location

    def __getattr__(self, symbol: str) -> str:
        return symbol


def find_smi_library():
    err = OSError("Could not load libamd_smi.so")
    possible_locations = []
    rocm_path = os.getenv("ROCM_HOME", os.getenv("ROCM_PATH"))
    if rocm_path:
        possible_locations.append(os.path.join(rocm_path, "lib/libamd_smi.so"))
    possible_locations.append("libamd_smi.so")
    possible_locations.append(Path(__file__).resolve().parent / "libamd_smi.so")
    possible_locations.append(Path(os.getenv("ROCM_PATH", "/opt/rocm")) / "lib" / "libamd_smi.so")
    for location in possible_locations:
        if os.path.isabs(str(location)) and Path(location).is_file():
            return _Library(str(location)), location
        err = OSError(f"{location}: cannot open shared object file: No such file or directory")
    raise err


_libraries = {}
try:
    _libraries["libamd_smi.so"], location = find_smi_library()
except OSError as e:
    print(e)
    print("Unable to find libamd_smi.so library try installing amd-smi-lib from your package manager")

amdsmi_free_name_value_pairs = _libraries["libamd_smi.so"].amdsmi_free_name_value_pairs

node = None  # the simulated node (amdsmi.fake.FakeNode); None until a test installs one
