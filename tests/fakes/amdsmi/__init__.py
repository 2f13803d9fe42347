"""A fake of AMD's ``amdsmi`` Python package (ROCm/amdsmi py-interface, ROCm 6.0 to 7.0).

Laid out like the real one: ``amdsmi_wrapper`` (the ctypes layer, which loads libamd_smi.so at
import and fails the same way when it is missing), ``amdsmi_interface`` (the functions),
``amdsmi_exception`` (the exception classes), all re-exported here. The simulated node, and what
each reading reproduces, is in ``amdsmi.fake`` (test-only). Tests put ``tests/fakes`` first on
sys.path, so ``import amdsmi`` finds this package.
"""

from ._version import __version__
from .amdsmi_exception import (
    AmdSmiBdfFormatException,
    AmdSmiException,
    AmdSmiKeyException,
    AmdSmiLibraryException,
    AmdSmiParameterException,
    AmdSmiRetryException,
    AmdSmiTimeoutException,
)
from .amdsmi_interface import (
    AmdSmiInitFlags,
    AmdSmiMemoryType,
    amdsmi_get_energy_count,
    amdsmi_get_gpu_asic_info,
    amdsmi_get_gpu_device_bdf,
    amdsmi_get_gpu_device_uuid,
    amdsmi_get_gpu_driver_info,
    amdsmi_get_gpu_memory_total,
    amdsmi_get_lib_version,
    amdsmi_get_minmax_bandwidth_between_processors,
    amdsmi_get_power_info,
    amdsmi_get_processor_handles,
    amdsmi_init,
    amdsmi_shut_down,
    amdsmi_topo_get_link_weight,
)
