"""Everything a plugin for core imports, from one module: the plugin author's stable surface.

    from core.plugin import Accelerator, Availability, DeviceRecord, TorchGpuAccelerator, hookimpl

A name importable from here keeps working across releases; when one moves or is renamed, the
old name stays here for at least one release and warns (DeprecationWarning) when used. Anything
imported from another ``core.*`` module is internal and may move without notice: the built-in
plugins import nothing else (tests/test_plugin_surface.py enforces it). Tests of a plugin use
:mod:`core.testing` as well.

Importing this module imports no framework and no vendor SDK (``core plugins`` imports every
plugin): the executors that need PyTorch or TensorFlow load on first use of their names.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from core.base.config import Framework, Precision, RunConfig
from core.base.distributed import ProcessContext
from core.base.errors import ConfigError, NonFiniteLossError, PluginError, RegistrationError
from core.base.machine import MachineProfile
from core.base.peaks import GIGA, TERA, MemoryBandwidth, PeakEntry, PeakTable
from core.base.precision import (
    Bf16Policy,
    Fp16Policy,
    Fp32Policy,
    MixedPrecisionPolicy,
    PrecisionPolicy,
    Tf32Policy,
)
from core.base.results import DeviceRecord, EnergyMeasurement, RunResult
from core.base.roofs import ProfileRoofs
from core.contract.accelerator import Accelerator, Availability
from core.contract.commands import Command
from core.contract.context import RunContext
from core.contract.hookspecs import hookimpl
from core.contract.launcher import Launcher
from core.contract.meter import PowerMeter, PowerMeterFactory, UnavailableMeter
from core.contract.parallel import SequenceParallelPlan, TensorParallelPlan
from core.contract.pipeline import PipelineLayout, RecommendedSplit
from core.contract.sdk import SharedLibrarySession
from core.contract.shape import TransformerShape
from core.contract.workload import KerasTrainingSpec, TorchTrainingSpec, Workload, parse_plugin_options
from core.data import SYNTHETIC_SOURCES
from core.data import detect_format as detect_data_format
from core.data.tf_records import image_dataset as tfrecord_image_dataset
from core.energy.meters import DeviceEnergyMeter, EnergyCounter, EnergySource
from core.energy.sampling import Clock, FixedRateSampler, StopFlag
from core.executors.base import Executor, HostStepClock, StepClock
from core.executors.gpu import ALL_PRECISIONS, TorchGpuAccelerator
from core.report.document import Block, Code, Figure, Heading, Paragraph, Preformatted, Table, Value
from core.running.environment import processor_name

if TYPE_CHECKING:
    from core.data.epoch_order import EpochOrder
    from core.data.epoch_order import metrics_of as metrics_from_sums
    from core.data.epoch_order import shard as held_out_shard
    from core.data.torch_datasets import torch_dataset
    from core.executors.keras import (
        KerasExecutor,
        KerasPlacement,
        keras_executor,
        multi_worker_placement,
        quiet_tensorflow_startup,
        set_tensorflow_threads,
        split_host_cpu,
    )
    from core.executors.pytorch import TorchDeviceHooks, TorchExecutor, TorchPlacement, torch_executor
    from core.executors.torch_epochs import outcome_sums
    from core.running.launch import TorchrunLauncher

# Names whose modules import a framework (or change its start-up): loaded when first used.
_LAZY = {
    "TorchExecutor": "core.executors.pytorch",
    "TorchPlacement": "core.executors.pytorch",
    "TorchDeviceHooks": "core.executors.pytorch",
    "torch_executor": "core.executors.pytorch",
    "keras_executor": "core.executors.keras",
    "KerasExecutor": "core.executors.keras",
    "KerasPlacement": "core.executors.keras",
    "split_host_cpu": "core.executors.keras",
    "multi_worker_placement": "core.executors.keras",
    "set_tensorflow_threads": "core.executors.keras",
    "quiet_tensorflow_startup": "core.executors.keras",
    # core's readers of real datasets as PyTorch datasets (imports torch)
    "torch_dataset": "core.data.torch_datasets",
    # runs to a target: the epoch order and the held-out shards (numpy), a batch's sums (torch)
    "EpochOrder": "core.data.epoch_order",
    "held_out_shard": "core.data.epoch_order",
    "metrics_from_sums": "core.data.epoch_order",
    "outcome_sums": "core.executors.torch_epochs",
    # Not a framework, but the whole of core's running machinery: loaded when a plugin needs it.
    "TorchrunLauncher": "core.running.launch",
}

#: lazy names whose attribute in their module is called otherwise
_RENAMED = {"held_out_shard": "shard", "metrics_from_sums": "metrics_of"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'core.plugin' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), _RENAMED.get(name, name))
    globals()[name] = value  # later lookups skip this function
    return value


__all__ = [
    # registering and describing
    "hookimpl",
    "Accelerator",
    "Availability",
    "DeviceRecord",
    "Framework",
    "Precision",
    "ALL_PRECISIONS",
    # precision policies: subclass one to add a precision (core_register_precisions) or to run a
    # registered one in a device's own way (Accelerator.precision_policy)
    "PrecisionPolicy",
    "MixedPrecisionPolicy",
    "Fp32Policy",
    "Tf32Policy",
    "Bf16Policy",
    "Fp16Policy",
    "RunConfig",
    "ProcessContext",
    "RunContext",
    "MachineProfile",
    "ProfileRoofs",
    "ConfigError",
    "PluginError",
    "RegistrationError",
    "NonFiniteLossError",
    "parse_plugin_options",
    "SYNTHETIC_SOURCES",
    "processor_name",
    "SharedLibrarySession",
    # GPUs that PyTorch drives through its CUDA API (NVIDIA, AMD)
    "TorchGpuAccelerator",
    "PeakEntry",
    "PeakTable",
    "TERA",
    "GIGA",
    "MemoryBandwidth",
    # running: the executor contract and core's executors
    "Executor",
    "StepClock",
    "HostStepClock",
    "TorchExecutor",
    "TorchPlacement",
    "TorchDeviceHooks",
    "torch_executor",
    "KerasExecutor",
    "keras_executor",
    "KerasPlacement",
    "split_host_cpu",
    "multi_worker_placement",
    "set_tensorflow_threads",
    "quiet_tensorflow_startup",
    "tfrecord_image_dataset",
    "torch_dataset",
    "detect_data_format",
    # runs to a target (docs/to-target.md): the training split's epoch order, the held-out split's
    # shards and the sums an evaluation adds up
    "EpochOrder",
    "held_out_shard",
    "outcome_sums",
    "metrics_from_sums",
    # launching a run's processes (torchrun; the Graphcore plugin's poprun)
    "Launcher",
    "TorchrunLauncher",
    # workloads
    "Workload",
    "PipelineLayout",
    "SequenceParallelPlan",
    "TensorParallelPlan",
    "RecommendedSplit",
    "TransformerShape",
    "TorchTrainingSpec",
    "KerasTrainingSpec",
    # observing runs (core_run_started, core_result_ready)
    "RunResult",
    # extending the core command and its reports (core_register_commands, core_report_sections)
    "Command",
    "Block",
    "Heading",
    "Paragraph",
    "Code",
    "Preformatted",
    "Table",
    "Value",
    "Figure",
    # energy
    "PowerMeter",
    "PowerMeterFactory",
    "UnavailableMeter",
    "EnergyMeasurement",
    "DeviceEnergyMeter",
    "EnergySource",
    "EnergyCounter",
    "FixedRateSampler",
    "Clock",
    "StopFlag",
]
