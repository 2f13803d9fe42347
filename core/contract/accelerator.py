"""What an accelerator plugin provides: availability, devices, validation and an executor."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel

from core.base.config import Framework, Precision, RunConfig
from core.base.peaks import MemoryBandwidth
from core.base.precision import PrecisionPolicy
from core.base.results import DeviceRecord
from core.contract.workload import NoOptions, parse_plugin_options

if TYPE_CHECKING:
    from core.base.distributed import ProcessContext
    from core.contract.context import RunContext
    from core.contract.launcher import Launcher
    from core.contract.workload import Workload
    from core.executors.base import Executor


@dataclass(frozen=True)
class Availability:
    """Whether something can be used here, and if not, why (with what to install where that helps)."""

    available: bool
    reason: str | None = None

    @classmethod
    def yes(cls) -> Availability:
        return cls(True, None)

    @classmethod
    def no(cls, reason: str) -> Availability:
        return cls(False, reason)


def executor_for(accelerator: Accelerator, workload: Workload, context: RunContext) -> Executor:
    """Ask ``accelerator`` for an executor in whichever form of the method its class overrides last."""
    from core.contract.context import overrides_old_form

    if overrides_old_form(accelerator, "executor_for", "create_executor"):
        return accelerator.create_executor(workload, context.config, context.process)
    return accelerator.executor_for(workload, context)


def validate_run(accelerator: Accelerator, context: RunContext) -> None:
    """Let ``accelerator`` refuse the run, in whichever form of ``validate`` its class overrides last."""
    from core.contract.context import overrides_old_form

    if overrides_old_form(accelerator, "validate_run", "validate"):
        accelerator.validate(context.config)
    else:
        accelerator.validate_run(context)


def max_replicas_for(accelerator: Accelerator, context: RunContext) -> int:
    """``accelerator``'s most replicas for the run, in whichever form its class overrides last."""
    from core.contract.context import overrides_old_form

    if overrides_old_form(accelerator, "max_replicas_for", "max_replicas"):
        return accelerator.max_replicas(context.config)
    return accelerator.max_replicas_for(context)


def devices_used(accelerator: Accelerator, context: RunContext) -> list[DeviceRecord]:
    """The devices the run uses, asked of ``accelerator`` in whichever form its class overrides last."""
    from core.contract.context import overrides_old_form

    if overrides_old_form(accelerator, "devices_used", "devices_for"):
        return accelerator.devices_for(context.config, context.process)
    return accelerator.devices_used(context)


class Accelerator(ABC):
    """A kind of device that runs workloads. One instance is registered per plugin.

    ``availability`` must be cheap and import no framework or vendor SDK: ``core plugins`` calls it.
    Everything else may import what it needs, lazily.
    """

    name: ClassVar[str]
    description: ClassVar[str] = ""
    frameworks: ClassVar[tuple[Framework, ...]] = (Framework.torch,)
    # None: replicas run inside one process (or replicas must be 1). "torchrun": replicas > 1 run as
    # one process each under torch.distributed.run, with this torch.distributed backend.
    launcher: ClassVar[str | None] = None
    distributed_backend: ClassVar[str | None] = None
    # Pipelining a replica over several devices and running several updates per host call are
    # placement features only some accelerators have (Graphcore IPUs); the rest refuse them.
    max_devices_per_replica: ClassVar[int] = 1
    #: whether ``executor_for`` builds core's PyTorch executor (``core.executors.pytorch.torch_executor``)
    #: for PyTorch runs, one process per device under torchrun: it then applies the device mesh
    #: (``sharding``, ``tensor_parallel``, pipeline stages, ``recompute``), and planning lets them through
    applies_torch_parallelism: ClassVar[bool] = False
    #: the ``recompute`` choices (beside "none") this accelerator's own executor applies where core's
    #: PyTorch executor does not place the run (Graphcore: "full", its pipelined recomputation);
    #: planning refuses the others, naming ``recompute``
    own_recompute_choices: ClassVar[frozenset[str]] = frozenset()
    supports_device_iterations: ClassVar[bool] = False
    #: whether this accelerator's data loader reads a whole host call's samples at once
    #: (``samples_per_host_call``) and drops a partial one, as PopTorch's DataLoader does; planning
    #: then refuses data smaller than one host call, not only than a micro-batch per replica
    reads_data_by_host_call: ClassVar[bool] = False
    #: whether ``executor_for`` places ``mode="inference"`` runs (core's executors do: build them with
    #: ``core.executors.pytorch.torch_executor`` / ``core.executors.keras.keras_executor``); planning
    #: refuses inference on an accelerator that does not say so, rather than let it train instead
    supports_inference: ClassVar[bool] = False
    #: whether ``executor_for`` sets the host's compute threads from ``config.threads_per_replica``
    #: (``--threads``); planning refuses the option for an accelerator that does not say so, rather
    #: than let a run ignore it
    applies_threads_per_replica: ClassVar[bool] = False
    #: whether a sweep may fork this accelerator's single-process PyTorch runs from a warm parent
    #: that imported torch but touched no device (core.running.forkserver); say so only where a
    #: process that starts using the device after such a fork is as good as a fresh interpreter
    forks_from_warm_parent: ClassVar[bool] = False
    #: pydantic model (extra="forbid") of this accelerator's ``accelerator_options``
    options_model: ClassVar[type[BaseModel]] = NoOptions
    #: the keys of a machine profile's ``[details]`` this accelerator's rules read, with their
    #: types (``{"gcds_per_package": int}``), or a type with constraints
    #: (``Annotated[str, Field(pattern=..., description=...)]``, NVIDIA's compute_capability);
    #: planning refuses any other key, type or form, naming ``machine.details.<key>``
    machine_details: ClassVar[dict[str, Any]] = {}

    def parse_options(self, options: dict[str, Any]) -> BaseModel:
        """Validate accelerator_options; errors name ``accelerator_options.<key>``."""
        return parse_plugin_options(self.options_model, options, "accelerator_options", f"accelerator {self.name!r}")

    @abstractmethod
    def availability(self) -> Availability:
        """Can this accelerator run here? Imports nothing heavy."""

    @abstractmethod
    def precisions(self, framework: Framework) -> tuple[Precision, ...]:
        """The names of the precision policies this accelerator runs with that framework (core's
        ``Precision.fp32`` ..., or a name a plugin registered a policy for). Planning refuses a
        listed name that no registered policy has, rather than run it as fp32."""

    def precision_policy(self, policy: type[PrecisionPolicy], framework: Framework) -> type[PrecisionPolicy]:
        """The policy a run of ``policy.name`` uses here: the registered ``policy`` itself (the
        default), or a subclass of it that does the same in this device's own way (Graphcore's
        fp16 under PopTorch keeps the weights in fp16). Called in planning; touches no device.
        """
        return policy

    def max_replicas_for(self, context: RunContext) -> int:
        """The largest ``replicas`` this host can place for the run (``context.config`` and the
        parsed ``context.accelerator_options``). Called in planning, on this host only (a plan for
        a machine profile counts the profile's devices instead).

        Accelerators written before the run context implement :meth:`max_replicas` instead, which
        this default calls.
        """
        return self.max_replicas(context.config)

    def max_replicas(self, config: RunConfig) -> int:
        """The form of :meth:`max_replicas_for` before the run context (options unparsed); implement
        one of the two."""
        raise NotImplementedError(f"accelerator {self.name!r} implements neither max_replicas_for nor max_replicas")

    @abstractmethod
    def devices(self) -> list[DeviceRecord]:
        """The devices this host offers, for ``core devices`` and the result."""

    def executor_for(self, workload: Workload, context: RunContext) -> Executor:
        """Place the workload on this process's device(s) and return a ready executor.

        ``context`` holds the run's configuration, both plugins' options parsed once, and this
        process. Plugins written before 0.2 implement :meth:`create_executor` instead, which this
        default calls.
        """
        return self.create_executor(workload, context.config, context.process)

    def create_executor(self, workload: Workload, config: RunConfig, process: ProcessContext) -> Executor:
        """The pre-0.2 form of :meth:`executor_for` (options unparsed); implement one of the two."""
        raise NotImplementedError(f"accelerator {self.name!r} implements neither executor_for nor create_executor")

    def launcher_for(self, context: RunContext) -> Launcher | None:
        """The launcher that starts this run's processes, or None to run in this process.

        The default follows the ``launcher`` attribute: with "torchrun", a PyTorch run with
        ``replicas > 1`` runs one process per replica under torchrun, and so does a TensorFlow run
        under MultiWorkerMirroredStrategy (``config.tensorflow_multi_worker``: ``nodes > 1``, or
        ``tensorflow_strategy`` multi-worker). Called in planning, in the process that launches (a
        started process runs its share of the run, whatever this says).
        """
        config = context.config
        several = config.replicas > 1 or config.nodes > 1 or config.devices_per_replica > 1
        per_process = config.framework is Framework.torch or config.tensorflow_multi_worker
        if self.launcher == "torchrun" and several and per_process:
            # At call time: core's torchrun launcher is part of the running layer above the contract
            # (Slurm, the worker module), needed only once a run asks for several processes.
            from core.running.launch import TorchrunLauncher

            return TorchrunLauncher()
        return None

    def validate(self, config: RunConfig) -> None:
        """Raise ConfigError for options this accelerator cannot honour. Touches no device."""

    def validate_run(self, context: RunContext) -> None:
        """:meth:`validate` with the options parsed: the form to implement from 0.2 on.

        Called once, in planning, with the launching process's context; the default calls
        :meth:`validate`.
        """
        self.validate(context.config)

    def devices_used(self, context: RunContext) -> list[DeviceRecord]:
        """The devices the run uses in ``context.process``, as recorded in its result. Called once
        the executor is set up; the default calls :meth:`devices_for`, which accelerators written
        before the run context override instead."""
        return self.devices_for(context.config, context.process)

    def devices_for(self, config: RunConfig, process: ProcessContext) -> list[DeviceRecord]:
        """The form of :meth:`devices_used` before the run context: by default the first
        ``devices_per_node`` of :meth:`devices` (its replicas' devices, or its share of one that spans
        nodes)."""
        return self.devices()[: config.devices_per_node]

    def placement_summary(self, context: RunContext) -> dict[str, Any]:
        """What a dry run shows of this run's placement beyond replicas and devices per replica
        (Graphcore: instances, IPUs used and reserved). Called after ``validate_run``; probes nothing."""
        return {}

    def driver_versions(self) -> dict[str, str]:
        return {}

    def peak_flops_per_second(self, device: DeviceRecord, precision: Precision) -> tuple[float, str] | None:
        """Datasheet peak of one device at that precision, with its source; None where unknown."""
        return None

    def memory_bandwidth(self, device: DeviceRecord) -> MemoryBandwidth | None:
        """Peak memory bandwidth of one device (the roofline's slanted roof), with its source;
        None where unknown. A result records the sum over the devices a run used."""
        return None
