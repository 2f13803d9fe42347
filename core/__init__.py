"""core: run one machine-learning workload unchanged on any accelerator, and measure it honestly.

    from core import run
    result = run("fcnn", "cpu", micro_batch_size=64, steps=20)
    print(result.throughput_per_second, result.energy_joules)

Importing core imports neither PyTorch nor TensorFlow nor any vendor SDK.
"""

from __future__ import annotations

from core import _moved
from core.api import run
from core.base.config import Framework, Precision, RunConfig, make_config
from core.base.distributed import ProcessContext
from core.base.errors import ConfigError, CoreError, DataError, NonFiniteLossError, PluginError, RegistrationError
from core.base.results import (
    SCHEMA_VERSION,
    DeviceRecord,
    EnergyMeasurement,
    EnvironmentInfo,
    RunResult,
    RunState,
    Status,
)
from core.contract.accelerator import Accelerator, Availability
from core.contract.hookspecs import hookimpl, hookspec
from core.contract.meter import PowerMeter, PowerMeterFactory, UnavailableMeter
from core.contract.workload import KerasTrainingSpec, TorchTrainingSpec, Workload
from core.storage.store import ResultStore
from core.sweep import SweepSpec, load_sweep, run_sweep

# Old module paths (before 0.2) keep working for a release, with a DeprecationWarning.
_moved.install()

__all__ = [
    "Accelerator",
    "Availability",
    "ConfigError",
    "CoreError",
    "DataError",
    "DeviceRecord",
    "EnergyMeasurement",
    "EnvironmentInfo",
    "Framework",
    "KerasTrainingSpec",
    "NonFiniteLossError",
    "PluginError",
    "PowerMeter",
    "PowerMeterFactory",
    "Precision",
    "ProcessContext",
    "RegistrationError",
    "ResultStore",
    "RunConfig",
    "RunResult",
    "RunState",
    "SCHEMA_VERSION",
    "Status",
    "SweepSpec",
    "TorchTrainingSpec",
    "UnavailableMeter",
    "Workload",
    "hookimpl",
    "hookspec",
    "load_sweep",
    "make_config",
    "run",
    "run_sweep",
]
