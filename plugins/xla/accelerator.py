"""The XLA accelerator: TPUs (and XLA's CUDA and CPU devices) through torch-xla's PJRT runtime.

Replicas are data-parallel in one of two ways, both with the gradients averaged by torch-xla:

- ``processes``: one process per device under torchrun, joined by torch-xla's ``xla`` backend
  (``init_method="xla://"``, which also gives each process its chip); the gradients are
  all-reduced by ``xm.reduce_gradients``, the reduction ``xm.optimizer_step`` does. For TPU v4 and
  later (one XLA device per chip) and GPUs.
- ``spmd``: one process drives every device as one program (``torch_xla.runtime.use_spmd``); each
  micro-batch is sharded over a one-axis ``data`` mesh and XLA's partitioner inserts the gradient
  all-reduce. The only way on XLA's CPU device, whose client has no collectives between
  processes (two torchrun processes there each see a world of one and train alone), and the way
  for TPU v2/v3, whose chips hold two devices each.

``auto`` picks ``processes`` where the host has devices one process each can drive, ``spmd``
otherwise. See docs/xla.md.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict

from core.plugin import (
    SYNTHETIC_SOURCES,
    Accelerator,
    Availability,
    ConfigError,
    DeviceRecord,
    Framework,
    Launcher,
    MemoryBandwidth,
    Precision,
    RunConfig,
    RunContext,
    Workload,
)

from . import discovery
from .peaks import bandwidth_per_device, peak_per_device

if TYPE_CHECKING:
    from core.plugin import Executor

Parallelism = Literal["processes", "spmd"]

#: environment switches that make float32 tensors bfloat16 on the device behind the run's back
DOWNCASTING_VARIABLES = ("XLA_USE_BF16", "XLA_DOWNCAST_BF16")


class XlaOptions(BaseModel):
    """``accelerator_options`` of the xla accelerator."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: how replicas share the work: one process per device, one SPMD program, or the device's usual way
    parallelism: Literal["auto", "processes", "spmd"] = "auto"


def resolve_parallelism(options: XlaOptions, device: str | None, one_device_processes: int) -> Parallelism:
    """``auto`` as it resolves here: processes where the host has devices that one process each can
    drive (TPU v4 and later, GPUs), SPMD otherwise (XLA's CPU device, TPU v2/v3)."""
    if options.parallelism != "auto":
        return options.parallelism
    return "processes" if device != "CPU" and one_device_processes > 0 else "spmd"


class XlaAccelerator(Accelerator):
    name: ClassVar[str] = "xla"
    description: ClassVar[str] = (
        "TPUs (and XLA's CUDA and CPU devices) through torch-xla's PJRT runtime; replicas as processes or SPMD"
    )
    frameworks: ClassVar[tuple[Framework, ...]] = (Framework.torch,)
    launcher: ClassVar[str | None] = "torchrun"
    distributed_backend: ClassVar[str | None] = "xla"
    options_model: ClassVar[type[BaseModel]] = XlaOptions
    # Inference: core's PyTorch inference executor with torch-xla's hooks (placement.py).
    supports_inference: ClassVar[bool] = True

    def availability(self) -> Availability:
        reasons = discovery.missing()
        return Availability.no("; ".join(reasons)) if reasons else Availability.yes()

    def precisions(self, framework: Framework) -> tuple[Precision, ...]:
        # XLA's autocast lowers to bfloat16 only (torch_xla/amp/autocast_mode.py refuses float16 on
        # TPU), and tf32 is an NVIDIA tensor-core mode: fp32 and bf16 are what XLA devices do.
        return (Precision.fp32, Precision.bf16)

    def _device(self) -> str | None:
        return discovery.pjrt_device()

    def _parallelism(self, options: XlaOptions, machine: bool = False) -> Parallelism:
        """How this run's replicas are placed; planned for a machine profile (a TPU host), probing nothing."""
        if machine:
            return resolve_parallelism(options, "TPU", 1)
        device = self._device()
        return resolve_parallelism(options, device, discovery.processes_possible(device or ""))

    def max_replicas_for(self, context: RunContext) -> int:
        # The devices there are; what a placement needs beyond that, validate_run says with the reason.
        device = self._device()
        return max(1, discovery.device_count(device)) if device is not None else 1

    def validate_run(self, context: RunContext) -> None:
        config = context.config
        options = context.accelerator_options_as(XlaOptions)
        if config.compile:
            raise ConfigError(
                "compile",
                True,
                "False: torch-xla traces each update and compiles it as one XLA graph already "
                "(torch.compile's openxla backend is not placed by this plugin)",
            )
        for variable in DOWNCASTING_VARIABLES:
            if os.environ.get(variable, "0") not in ("", "0"):
                raise ConfigError(
                    "precision",
                    config.precision.value,
                    f"a run without {variable} set: it makes every float32 tensor bfloat16 on the device, so "
                    "fp32 would not be fp32; unset it and ask for precision=bf16 (autocast) instead",
                )
        if config.nodes > 1:
            raise ConfigError("nodes", config.nodes, "1: this plugin places the XLA devices of one host")
        device = "TPU" if context.machine is not None else self._device()
        if config.replicas == 1:
            return
        parallelism = self._parallelism(options, machine=context.machine is not None)
        if parallelism == "processes" and device == "CPU":
            raise ConfigError(
                "accelerator_options.parallelism",
                options.parallelism,
                "spmd (or auto) on PJRT_DEVICE=CPU: torch-xla's CPU client has no collectives between processes, "
                "so each process would train alone",
            )
        if parallelism == "processes" and device == "TPU" and context.machine is None:
            if discovery.processes_possible("TPU") < config.replicas:
                raise ConfigError(
                    "accelerator_options.parallelism",
                    options.parallelism,
                    "spmd here: one process per device needs TPU chips of one device each (v4 and later); "
                    "this host's chips hold two devices each (v2/v3) or are too few",
                )
        if parallelism == "spmd":
            self._validate_spmd(config, device, context)

    def _validate_spmd(self, config: RunConfig, device: str | None, context: RunContext) -> None:
        if config.data not in SYNTHETIC_SOURCES:
            raise ConfigError(
                "data",
                config.data,
                f"synthetic data ({', '.join(sorted(SYNTHETIC_SOURCES))}) with SPMD replicas: the file readers "
                "deal one process's share, and an SPMD process holds every replica's",
            )
        if device != "CPU" and context.machine is None:
            devices = discovery.device_count(device or "")
            if devices != config.replicas:
                raise ConfigError(
                    "replicas",
                    config.replicas,
                    f"{devices}: an SPMD program spans every device of the runtime ({devices} here); "
                    "fewer replicas take parallelism=processes",
                )

    def placement_summary(self, context: RunContext) -> dict[str, Any]:
        options = context.accelerator_options_as(XlaOptions)
        device = "TPU" if context.machine is not None else self._device()
        summary: dict[str, Any] = {"pjrt_device": device}
        if context.config.replicas > 1:
            summary["parallelism"] = self._parallelism(options, machine=context.machine is not None)
        return summary

    def launcher_for(self, context: RunContext) -> Launcher | None:
        config = context.config
        if config.replicas == 1:
            return None  # this process drives its one device
        parallelism = self._parallelism(context.accelerator_options_as(XlaOptions), context.machine is not None)
        if parallelism == "spmd":
            from .launcher import XlaSpmdLauncher

            return XlaSpmdLauncher()
        from core.plugin import TorchrunLauncher

        return TorchrunLauncher()

    def devices(self) -> list[DeviceRecord]:
        from .devices import probed_devices

        return probed_devices()

    def devices_used(self, context: RunContext) -> list[DeviceRecord]:
        from .devices import run_devices

        replicas = context.config.replicas
        parallelism = self._parallelism(context.accelerator_options_as(XlaOptions)) if replicas > 1 else None
        return run_devices(replicas, parallelism)

    def executor_for(self, workload: Workload, context: RunContext) -> Executor:
        from .placement import xla_executor

        parallelism = self._parallelism(context.accelerator_options_as(XlaOptions))
        return xla_executor(workload, context, parallelism if context.config.replicas > 1 else None)

    def driver_versions(self) -> dict[str, str]:
        versions = {
            name: version
            for name in ("torch-xla", "libtpu", "torch_xla_cuda_plugin")
            if (version := discovery.installed_version(name)) is not None
        }
        versions["pjrt_device"] = self._device() or "none"
        return versions

    def peak_flops_per_second(self, device: DeviceRecord, precision: Precision) -> tuple[float, str] | None:
        if device.details.get("pjrt_device") != "TPU":
            return None  # XLA's CPU device has no datasheet peak; a GPU's table is the nvidia plugin's
        return peak_per_device(device.name, int(device.details.get("devices_per_chip", 1)), precision)

    def memory_bandwidth(self, device: DeviceRecord) -> MemoryBandwidth | None:
        if device.details.get("pjrt_device") != "TPU":
            return None
        return bandwidth_per_device(device.name, int(device.details.get("devices_per_chip", 1)))
