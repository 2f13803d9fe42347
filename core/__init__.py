"""core: run one machine-learning workload unchanged on any accelerator, and measure it honestly.

    from core import run
    result = run("fcnn", "cpu", micro_batch_size=64, steps=20)
    print(result.throughput_per_second, result.energy_joules)

Importing core imports neither PyTorch nor TensorFlow nor any vendor SDK.
"""

from __future__ import annotations

from core.accelerator import Accelerator, Availability
from core.api import run
from core.config import Framework, Precision, RunConfig, make_config
from core.distributed import ProcessContext
from core.errors import ConfigError, CoreError, NonFiniteLossError, PluginError, RegistrationError
from core.hookspecs import hookimpl, hookspec
from core.power import PowerMeter, PowerMeterFactory, UnavailableMeter
from core.results import SCHEMA_VERSION, DeviceRecord, EnergyMeasurement, EnvironmentInfo, RunResult, RunState, Status
from core.store import ResultStore
from core.sweep import SweepSpec, load_sweep, run_sweep
from core.workload import KerasTrainingSpec, TorchTrainingSpec, Workload

__all__ = [
    "Accelerator",
    "Availability",
    "ConfigError",
    "CoreError",
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
