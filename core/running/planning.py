"""Turns options into a validated plan, checking everything that can be checked without a device."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from core.base.config import LOADGEN_SCENARIOS, Framework, RunConfig, make_config
from core.base.distributed import SINGLE_PROCESS, ProcessContext
from core.base.errors import ConfigError, did_you_mean
from core.base.machine import MachineProfile, check_detail, detail_type_name
from core.base.precision import Precision, PrecisionPolicy
from core.contract.accelerator import Accelerator, max_replicas_for, validate_run
from core.contract.context import (
    ACCELERATOR_OLD_FORMS,
    METER_OLD_FORMS,
    RunContext,
    old_form_class,
    old_form_warnings,
    overrides_old_form,
)
from core.contract.launcher import Launcher, class_path, launcher_path, load_class, load_launcher
from core.contract.manager import PluginManager
from core.contract.meter import PowerMeterFactory
from core.contract.pipeline import PipelineLayout
from core.contract.workload import FRAMEWORK_LIBRARIES, Workload, module_installed
from core.data import FORMAT_FRAMEWORKS, SYNTHETIC_SOURCES, validate_data
from core.energy.combined import Covers, device_meter_counted, devices_unmeasured
from core.running.replica_checks import check_torch_replica
from core.running.replica_plan import RECOMPUTE_CHOICES, ReplicaMemory, check_replica_split, replica_memory


@dataclass(frozen=True)
class RunPlan:
    config: RunConfig  # micro_batch_size resolved
    workload: Workload
    workload_options: BaseModel  # parsed by the workload's options_model, once
    accelerator: Accelerator
    accelerator_options: BaseModel  # parsed by the accelerator's options_model, once
    meter_factory: PowerMeterFactory | None
    meter_unavailable_reason: str | None
    launcher: Launcher | None = None  # starts the run's processes; None: it runs in this process
    machine: MachineProfile | None = None  # planned for this machine, not this host (a dry run)
    warnings: tuple[str, ...] = ()  # planning's warnings (a dry run shows them; a run keeps them)
    #: the workload's pipeline blocks, asked for when a replica spans several devices
    pipeline_layout: PipelineLayout | None = None
    #: the meters of the host read beside the device meter (config.node_meters), in that order
    node_meter_factories: tuple[PowerMeterFactory, ...] = ()
    #: the policy ``config.precision`` runs under: the registered one, or the accelerator's subclass
    #: of it (None only in a plan not made by plan_run: core's policy of that name then)
    precision_policy: type[PrecisionPolicy] | None = None
    #: the plugins' packages whose versions the result records (core_register_packages)
    packages: tuple[str, ...] = ()

    def context(self, process: ProcessContext) -> RunContext:
        """What the plugins are handed in ``process``: the configuration and the parsed options."""
        return RunContext(
            self.config,
            self.workload_options,
            self.accelerator_options,
            process,
            machine=self.machine,
            pipeline_layout=self.pipeline_layout,
            planned_precision=self.precision_policy,
        )

    @property
    def launches_processes(self) -> bool:
        """Whether a launcher starts the run's processes (torchrun: one per replica)."""
        return self.launcher is not None

    def document(self) -> PlannedRun:
        """This plan as a document that travels to the run's child process and ranks (as JSON):
        they rebuild the plan from it (:meth:`PlannedRun.rebuild`) instead of planning again."""
        return PlannedRun(
            config=self.config,
            workload_options=self.workload_options.model_dump(mode="json"),
            accelerator_options=self.accelerator_options.model_dump(mode="json"),
            meter=self.meter_factory.name if self.meter_factory is not None else None,
            meter_unavailable_reason=self.meter_unavailable_reason,
            launcher=launcher_path(self.launcher) if self.launcher is not None else None,
            machine=self.machine.name if self.machine is not None else None,
            warnings=self.warnings,
            pipeline_layout=self.pipeline_layout,
            node_meters=tuple(factory.name for factory in self.node_meter_factories),
            precision_policy=class_path(self.precision_policy) if self.precision_policy is not None else None,
            packages=self.packages,
        )


class PlannedRun(BaseModel):
    """A validated plan as a document: what :func:`plan_run` decided, for another process to run
    without planning again (a child process with a time limit, a sweep's repeat, a Slurm job, every
    rank of a launched run). The plugins are named, not sent: each process finds them by name.

    The options are the plugins' own models as parsed in planning (dumped as JSON, rebuilt by the
    same model): no plugin check runs again.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    config: RunConfig  # micro_batch_size resolved
    workload_options: dict[str, Any]  # the workload's options_model, as parsed
    accelerator_options: dict[str, Any]  # the accelerator's options_model, as parsed
    meter: str | None = None  # the power meter chosen in planning, by its registered name
    meter_unavailable_reason: str | None = None
    launcher: str | None = None  # ``module:Class`` of the launcher that starts the run's processes
    machine: str | None = None  # planned for this machine profile, not this host: a dry run's, not runnable
    warnings: tuple[str, ...] = ()
    pipeline_layout: PipelineLayout | None = None
    node_meters: tuple[str, ...] = ()  # the node meters chosen in planning, by their registered names
    #: ``module:Class`` of the policy chosen in planning (the accelerator's own subclass, where it has one)
    precision_policy: str | None = None
    packages: tuple[str, ...] = ()

    def rebuild(self, manager: PluginManager) -> RunPlan:
        """The plan again, in this process: the plugins looked up by name, their options rebuilt.

        :raises ConfigError: a plugin the plan names is not registered in this process (nor its
            launcher importable), its options do not fit the plugin's options model here, or the
            plan was made for a machine profile (a dry run), not for running here.
        """
        if self.machine is not None:
            raise ConfigError(
                "machine", self.machine, "a plan for this host (one made for a machine profile only validates)"
            )
        workload = manager.workload(self.config.workload)
        accelerator = manager.accelerator(self.config.accelerator)
        meter = _registered_meter(manager, self.meter, "power_meter") if self.meter is not None else None
        return RunPlan(
            config=self.config,
            workload=workload,
            workload_options=_rebuild_options(workload.options_model, self.workload_options, "workload_options"),
            accelerator=accelerator,
            accelerator_options=_rebuild_options(
                accelerator.options_model, self.accelerator_options, "accelerator_options"
            ),
            meter_factory=meter,
            meter_unavailable_reason=self.meter_unavailable_reason,
            launcher=_rebuild_launcher(self.launcher) if self.launcher is not None else None,
            warnings=self.warnings,
            pipeline_layout=self.pipeline_layout,
            node_meter_factories=tuple(_registered_meter(manager, name, "node_meters") for name in self.node_meters),
            precision_policy=rebuild_policy(self.precision_policy) if self.precision_policy is not None else None,
            packages=self.packages,
        )

    @classmethod
    def read(cls, text: str) -> PlannedRun:
        """A plan from its JSON text; ConfigError names what is wrong (a file damaged, or written by
        another version of core)."""
        try:
            return cls.model_validate_json(text)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "the document"
            raise ConfigError("plan", where, f"a validated plan as core writes it ({first['msg']})") from None


def _rebuild_options(model: type[BaseModel], dumped: dict[str, Any], field: str) -> BaseModel:
    """A plugin's options model from its own JSON dump (as JSON: enums, tuples and dates come back)."""
    try:
        return model.model_validate_json(json.dumps(dumped))
    except ValidationError as exc:  # the plugin's model changed since the plan was made
        raise ConfigError(field, dumped, f"options {model.__name__} takes here ({exc.errors()[0]['msg']})") from None


def _registered_meter(manager: PluginManager, name: str, field: str) -> PowerMeterFactory:
    if name not in manager.power_meters:
        raise ConfigError(field, name, f"a registered power meter ({', '.join(sorted(manager.power_meters))})")
    return manager.power_meters[name].item


def rebuild_policy(path: str) -> type[PrecisionPolicy]:
    try:
        policy = load_class(path)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError("precision", path, f"a precision policy class this process can import ({exc})") from None
    if not (isinstance(policy, type) and issubclass(policy, PrecisionPolicy)):
        raise ConfigError("precision", path, "a PrecisionPolicy class")
    return policy


def _rebuild_launcher(path: str) -> Launcher:
    try:
        return load_launcher(path)
    except (ImportError, AttributeError, ValueError, TypeError) as exc:
        raise ConfigError("launcher", path, f"a Launcher class this process can import ({exc})") from None


def _check_dataset_size(
    manager: PluginManager,
    workload: Workload,
    accelerator: Accelerator,
    options: BaseModel,
    config: RunConfig,
    data_format: str | None,
    warnings: list[str],
) -> None:
    """A dataset too small for one micro-batch per replica (or a token file shorter than one
    sequence) is bad input, refused here rather than in setup. WebDataset shards fewer than the
    replicas are shared between replicas, so some samples are read more than once an epoch: said
    in ``warnings``. ``data_format``: None for synthetic data."""
    from core.data.listing import check_dataset_size, shard_files

    if data_format is None or config.target is not None:  # a target's training split: against the global batch
        return
    if data_format == "webdataset" and (shards := len(shard_files(Path(config.data)))) < config.replicas:
        warnings.append(
            f"data {config.data!r} has {shards} WebDataset shard(s) for {config.replicas} replicas: shards are read "
            "whole, one replica's each, so replicas share them and some samples are read more than once per "
            "epoch; split the data into at least as many shards as replicas"
        )

    with manager.plugin_code(workload, f"{type(workload).__name__}.tokens_per_sample()"):
        tokens_per_sample = workload.tokens_per_sample(options)
    assert config.micro_batch_size is not None
    host_call = config.samples_per_host_call if accelerator.reads_data_by_host_call else None
    check_dataset_size(
        Path(config.data), data_format, config.micro_batch_size, config.replicas, tokens_per_sample, host_call
    )


def _choices(values: Any) -> str:
    return ", ".join(getattr(v, "value", str(v)) for v in values)


def plan_run(
    manager: PluginManager,
    workload: str | Workload,
    accelerator: str | Accelerator,
    options: dict[str, Any],
    machine: MachineProfile | None = None,
    *,
    in_slurm_job: bool = False,
) -> RunPlan:
    """Validate a run. Raises ConfigError naming the field, the value and what is allowed.

    :param machine: plan for the machine this profile describes instead of this host (a dry run):
        its devices, precisions and memory stand in for what would be probed here.
    :param in_slurm_job: the run will be a Slurm job of its own, of ``nodes`` nodes (a cell of a
        Slurm sweep): its nodes' agents meet inside that job's allocation, not this process's.
    """
    workload_name = workload.name if isinstance(workload, Workload) else workload
    accelerator_name = accelerator.name if isinstance(accelerator, Accelerator) else accelerator
    config = make_config(workload=workload_name, accelerator=accelerator_name, **options)
    workload_obj = workload if isinstance(workload, Workload) else manager.workload(workload_name)
    accelerator_obj = accelerator if isinstance(accelerator, Accelerator) else manager.accelerator(accelerator_name)
    warnings: list[str] = []

    guard = manager.plugin_code
    if machine is not None:
        check_machine(manager, machine)
    _check_available(manager, accelerator_obj, machine)
    framework = config.framework
    _check_framework(framework, workload_obj, accelerator_obj, machine, warnings)
    precision_policy = resolve_precision(manager, accelerator_obj, config, machine)
    with guard(workload_obj, f"{type(workload_obj).__name__}.data_formats_for()"):
        readable = workload_obj.data_formats_for(framework)
    config, supplied_later = _resolve_data_variable(config, machine, warnings)
    if supplied_later:  # planned for another machine, its folder named by a variable unset here
        data_format: str | None = _user_data_format(config, readable)
    else:
        data_format = _check_data(config, framework, readable, workload_name)
    with guard(workload_obj, f"{type(workload_obj).__name__}.parse_options()"):
        workload_options = workload_obj.parse_options(dict(config.workload_options))
    with guard(workload_obj, f"{type(workload_obj).__name__}.check_for_framework()"):
        workload_obj.check_for_framework(workload_options, framework)
    with guard(workload_obj, f"{type(workload_obj).__name__}.missing_library()"):
        missing = workload_obj.missing_library(framework)
    if missing:
        needs = f"its {framework.value} implementation needs {missing}"
        if machine is None:
            others = [f for f in workload_obj.frameworks if f is not framework]
            instead = f"; or choose another framework ({_choices(others)})" if others else ""
            raise ConfigError("workload", workload_name, needs + instead)
        warnings.append(f"not checked here, needed on {machine.name!r}: workload {workload_name!r}: {needs}")
    with guard(accelerator_obj, f"{type(accelerator_obj).__name__}.parse_options()"):
        accelerator_options = accelerator_obj.parse_options(dict(config.accelerator_options))
    _check_mode(config, accelerator_obj)
    if config.weights is not None:
        _check_weights(manager, config, workload_obj, workload_options)
    if config.micro_batch_size is None:
        config = config.model_copy(update={"micro_batch_size": workload_obj.default_micro_batch_size})
    with guard(workload_obj, f"{type(workload_obj).__name__}.samples_per_epoch()"):
        _check_target(config, workload_obj, workload_options, data_format)
    if config.scenario in LOADGEN_SCENARIOS:
        _check_loadgen(config, machine, warnings)
    _check_dataset_size(manager, workload_obj, accelerator_obj, workload_options, config, data_format, warnings)

    placing = RunContext(config, workload_options, accelerator_options, SINGLE_PROCESS, machine=machine)
    _check_placement_limits(manager, accelerator_obj, placing)
    # The split of a replica over devices, checked against the model's shape for every accelerator,
    # before whether this accelerator applies it: what the model cannot take is named first.
    with guard(workload_obj, f"{type(workload_obj).__name__}.transformer_shape()"):
        shape = workload_obj.transformer_shape(workload_options)
    warnings.extend(check_replica_split(shape, config, workload_name))
    _check_parallelism(config, accelerator_obj)
    _check_processes(accelerator_obj, config, machine, in_slurm_job)
    layout = _replica_layout(manager, workload_obj, workload_options, accelerator_obj, config, warnings, machine)
    plan = RunPlan(config, workload_obj, workload_options, accelerator_obj, accelerator_options, None, None)
    plan = dataclasses.replace(
        plan,
        machine=machine,
        pipeline_layout=layout,
        precision_policy=precision_policy,
        packages=tuple(manager.package_names()),
    )
    context = plan.context(SINGLE_PROCESS)
    context.warnings.extend(warnings)
    for message in old_form_warnings(accelerator_obj, ACCELERATOR_OLD_FORMS):
        context.warn(message)
    validating = "validate" if overrides_old_form(accelerator_obj, "validate_run", "validate") else "validate_run"
    with guard(accelerator_obj, f"{type(accelerator_obj).__name__}.{validating}()"):
        validate_run(accelerator_obj, context)

    with guard(accelerator_obj, f"{type(accelerator_obj).__name__}.launcher_for()"):
        launcher = accelerator_obj.launcher_for(context)
    if launcher is not None:
        check_findable_by_workers(manager, workload_obj, accelerator_obj, config)

    if machine is None:
        factory, meter_reason = _choose_meter(manager, accelerator_obj, config)
        for message in old_form_warnings(factory, METER_OLD_FORMS) if factory is not None else ():
            context.warn(message)
    else:
        _check_memory_fit(workload_obj, workload_options, config, machine, context, precision_policy)
        factory, meter_reason = None, f"planned for machine {machine.name!r}: its power meter is chosen there"
    node_meters = choose_node_meters(manager, config, factory, check_available=machine is None)
    if node_meters and machine is None and not config.node_meters_auto:
        device = None if factory is None else device_covers(factory)
        unmeasured = devices_unmeasured(device, [node_covers(meter) for meter in node_meters], meter_reason)
        if unmeasured:
            context.warn(f"energy_joules will be null: {unmeasured}")
    return dataclasses.replace(
        plan,
        meter_factory=factory,
        meter_unavailable_reason=meter_reason,
        launcher=launcher,
        warnings=tuple(context.warnings),
        node_meter_factories=node_meters,
    )


def device_covers(factory: PowerMeterFactory) -> Covers:
    """What the device meter covers, as its factory declares (``includes``; the devices by default)."""
    includes = getattr(factory, "includes", ("devices",))
    if not isinstance(includes, tuple) or not all(isinstance(name, str) and name for name in includes):
        raise ValueError(
            f"device meter {factory.name!r} declares includes={includes!r}, not a tuple of names: what it covers "
            "is unknown, so no node meter can be added to it"
        )
    return Covers(factory.name, "device", includes)


def node_covers(factory: PowerMeterFactory) -> Covers:
    """What a node meter covers, as its factory declares (``node_includes``, checked in planning)."""
    return Covers(factory.name, "node", tuple(factory.node_includes))


def _declares_node_includes(factory: PowerMeterFactory) -> bool:
    includes = getattr(factory, "node_includes", ())
    return isinstance(includes, tuple) and bool(includes) and all(isinstance(i, str) and i for i in includes)


def _node_meter(
    manager: PluginManager, name: str, device_meter: PowerMeterFactory | None, check_available: bool
) -> PowerMeterFactory:
    """The registered meter ``name`` as a node meter; ValueError saying why it cannot be one."""
    registered = manager.power_meters.get(name)
    if registered is None:
        known = ", ".join(sorted(manager.power_meters)) or "(none registered)"
        raise ValueError(
            f"{name!r} is no registered power meter{did_you_mean(name, manager.power_meters)}; registered: {known}"
        )
    factory = registered.item
    if factory is device_meter:
        raise ValueError(f"meter {name!r} is the run's device meter already; name it once")
    if not _declares_node_includes(factory):
        usable = [other for other, r in sorted(manager.power_meters.items()) if _declares_node_includes(r.item)]
        raise ValueError(
            f"meter {name!r} does not declare what it includes (node_includes), so it cannot be a node meter; "
            f"node meters: {', '.join(usable) or 'none registered'}"
        )
    if check_available and not (availability := manager.availability(factory)).available:
        raise ValueError(f"meter {name!r} is not available here: {availability.reason}")
    return factory


#: what a meter read beside the devices under ``node_meters = "auto"`` may include: the host's CPU
#: packages and DRAM (RAPL), never the devices (a BMC, the Grace-Hopper module meter)
HOST_PARTS = frozenset({"cpu", "dram"})


def choose_node_meters(
    manager: PluginManager, config: RunConfig, device_meter: PowerMeterFactory | None, check_available: bool = True
) -> tuple[PowerMeterFactory, ...]:
    """The node meters ``config.node_meters`` names: registered, declaring what they include,
    available here (``check_available``), none of them the device meter, and adding up without
    counting anything twice. Raises ConfigError naming node_meters otherwise. Under "auto", the
    meters :func:`auto_node_meters` finds (never an error)."""
    if config.node_meters_auto:
        return auto_node_meters(manager, device_meter) if check_available else ()
    if not config.node_meter_names:
        return ()
    try:
        chosen = tuple(_node_meter(manager, name, device_meter, check_available) for name in config.node_meter_names)
        device = None if device_meter is None else device_covers(device_meter)
        device_meter_counted(device, [node_covers(factory) for factory in chosen])
    except ValueError as error:
        raise ConfigError("node_meters", config.node_meters, str(error)) from None
    return chosen


def auto_node_meters(manager: PluginManager, device_meter: PowerMeterFactory | None) -> tuple[PowerMeterFactory, ...]:
    """The meters ``node_meters = "auto"`` reads beside the device meter, in name order: each registered
    one that declares ``node_includes`` within the host's CPU and DRAM (:data:`HOST_PARTS`), covers
    nothing the device meter or an earlier one covers, and is available here. None without a device
    meter (its span is the one they are read over). What is left out is left out silently: these
    figures are itemised beside the devices', never added."""
    if device_meter is None:
        return ()
    try:
        taken = set(device_covers(device_meter).includes)
    except ValueError:
        return ()  # what the device meter covers is unknown: nothing can be said not to overlap it
    chosen: list[PowerMeterFactory] = []
    for name in sorted(manager.power_meters):
        factory = manager.power_meters[name].item
        if factory is device_meter or not _declares_node_includes(factory):
            continue
        includes = set(factory.node_includes)
        if not includes <= HOST_PARTS or includes & taken:
            continue
        if not manager.availability(factory).available:
            continue
        chosen.append(factory)
        taken |= includes
    return tuple(chosen)


def check_machine(manager: PluginManager, machine: MachineProfile) -> None:
    """A profile's accelerator is a registered one, and its ``[details]`` are the keys and types
    that accelerator's rules read: a typo there would otherwise pass every check unread. Errors name
    the profile's file, as those of reading it do."""
    try:
        _check_machine(manager, machine)
    except ConfigError as error:
        if not machine.in_file:
            raise
        raise ConfigError(error.field, error.value, error.allowed + machine.in_file) from None


def _check_machine(manager: PluginManager, machine: MachineProfile) -> None:
    if machine.accelerator not in manager.accelerators:
        raise ConfigError(
            "machine.accelerator",
            machine.accelerator,
            f"a registered accelerator ({', '.join(sorted(manager.accelerators)) or 'none'})"
            + did_you_mean(machine.accelerator, manager.accelerators),
        )
    expected = manager.accelerator(machine.accelerator).machine_details
    for key, value in machine.details.items():
        if key not in expected:
            allowed = ", ".join(f"{k} ({detail_type_name(t)})" for k, t in expected.items()) or "none"
            raise ConfigError(
                f"machine.details.{key}", value, f"a key accelerator {machine.accelerator!r} reads: {allowed}"
            )
        check_detail(key, value, expected[key])


def _check_processes(
    accelerator: Accelerator, config: RunConfig, machine: MachineProfile | None, in_slurm_job: bool
) -> None:
    """A TensorFlow run of one process per replica, and a run over several nodes, can be launched."""
    if config.tensorflow_multi_worker:
        _check_tensorflow_multi_worker(accelerator, config)
    if config.nodes > 1:
        _check_nodes(accelerator, config, machine, in_slurm_job)


def _check_nodes(
    accelerator: Accelerator, config: RunConfig, machine: MachineProfile | None, in_slurm_job: bool
) -> None:
    """A multi-node run starts torchrun agents, one per node, that meet at a rendezvous: inside a
    Slurm allocation of enough nodes (this process's, or the job the run will be), or at the
    endpoint the run names."""
    from core.running.slurm import SlurmAllocation

    if accelerator.launcher != "torchrun" or not (
        config.framework is Framework.torch or config.tensorflow_multi_worker
    ):
        raise ConfigError(
            "nodes",
            config.nodes,
            f"several nodes run as torchrun agents with PyTorch, or TensorFlow's MultiWorkerMirroredStrategy; "
            f"accelerator {accelerator.name!r} with {config.framework.value}: 1",
        )
    if machine is not None or in_slurm_job:
        return  # the allocation is the one it will run in: the machine's, or the job's own of `nodes` nodes
    allocation = SlurmAllocation.from_environment()
    if allocation is None:
        if config.rendezvous is None:
            raise ConfigError(
                "rendezvous",
                None,
                "HOST:PORT is required for several nodes outside a Slurm allocation: the first node's address, "
                "the same on every node, where each node runs the same `core run`",
            )
    elif allocation.node_count < config.nodes:
        raise ConfigError(
            "nodes",
            config.nodes,
            f"at most the {allocation.node_count} node(s) of Slurm job {allocation.job_id} ({allocation.nodelist})",
        )


def _check_tensorflow_multi_worker(accelerator: Accelerator, config: RunConfig) -> None:
    """A TensorFlow run as one process per replica: torchrun starts them (the accelerators whose
    ``launcher`` is torchrun build MultiWorkerMirroredStrategy in each), on the synthetic data."""
    field, value = (
        ("tensorflow_strategy", config.tensorflow_strategy)
        if config.tensorflow_strategy == "multi-worker"
        else ("nodes", config.nodes)
    )
    if accelerator.launcher != "torchrun":
        raise ConfigError(
            field,
            value,
            f"TensorFlow's MultiWorkerMirroredStrategy runs one process per replica under torchrun, which "
            f"accelerator {accelerator.name!r} does not launch; "
            + ("mirrored or auto" if field == "tensorflow_strategy" else "1"),
        )
    if config.data != "synthetic":
        raise ConfigError(
            "data",
            config.data,
            "synthetic (a multi-worker TensorFlow run shards core's synthetic pool per worker; a dataset's files "
            "are not sharded between TensorFlow's workers yet)",
        )


def _check_loadgen(config: RunConfig, machine: MachineProfile | None, warnings: list[str]) -> None:
    """A LoadGen scenario drives one process's PyTorch inference executor, with settings LoadGen
    accepts, and needs LoadGen installed (looked up, not imported)."""
    from core.running.loadgen.run import INSTALL_HINT
    from core.running.loadgen.settings import ADDRESS_SPACE_BYTES, settings_for_run

    if config.framework is not Framework.torch:
        raise ConfigError(
            "scenario",
            config.scenario,
            f"LoadGen drives the PyTorch inference executors; with {config.framework.value}: loop",
        )
    if config.replicas != 1:
        raise ConfigError(
            "replicas",
            config.replicas,
            f"LoadGen drives one process's model; with scenario {config.scenario!r}: 1 (replicas run with 'loop')",
        )
    # LoadGen's queries must fit in the memory of the host that will run: this one, or for a
    # machine profile (which does not say its host memory) whatever a process can address.
    settings_for_run(config, memory_bytes=ADDRESS_SPACE_BYTES if machine is not None else None)
    if not module_installed("mlperf_loadgen"):
        if machine is None:
            raise ConfigError("scenario", config.scenario, f"needs MLPerf LoadGen, not installed here: {INSTALL_HINT}")
        warnings.append(f"not checked here, needed on {machine.name!r}: MLPerf LoadGen ({INSTALL_HINT})")


def _check_mode(config: RunConfig, accelerator: Accelerator) -> None:
    if config.mode == "inference" and not accelerator.supports_inference:
        raise ConfigError(
            "mode",
            config.mode,
            f"accelerator {accelerator.name!r} places training runs only (its plugin does not declare "
            "supports_inference); allowed: train",
        )
    if config.accuracy and config.framework is not Framework.torch:
        raise ConfigError(
            "accuracy",
            True,
            f"top-1 accuracy is measured by the PyTorch inference executor; framework {Framework.torch.value}",
        )


#: ``data`` naming an environment variable, ``$NAME`` or ``${NAME}``: a data set the user supplies (a
#: paper's images that are not public, or too large to ship: docs/seeds.md), read from the variable
DATA_VARIABLE = re.compile(r"^\$(?:\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)\}|(?P<plain>[A-Za-z_][A-Za-z0-9_]*))$")


def _resolve_data_variable(
    config: RunConfig, machine: MachineProfile | None, warnings: list[str]
) -> tuple[RunConfig, bool]:
    """``data = "$NAME"``: the path in the environment variable NAME, checked as any path is; unset
    here, a refusal naming ``data``, except where the run is planned for another machine (a dry run:
    the folder is on that machine), which warns and leaves it to be checked there. Returns the config
    (with the path in ``data`` where the variable is set) and whether the data is left unchecked."""
    match = DATA_VARIABLE.match(config.data)
    if match is None:
        return config, False
    name = match.group("braced") or match.group("plain")
    value = os.environ.get(name, "")
    if value:
        return config.model_copy(update={"data": value}), False
    if machine is None:
        raise ConfigError(
            "data",
            config.data,
            f"the environment variable {name} is not set: set it to the path of your data set "
            f"(a run to a target reads one split into train/ and val/; docs/seeds.md#data-you-supply)",
        )
    warnings.append(
        f"not checked here, needed on {machine.name!r}: data {config.data} ({name} is not set on this host; "
        "set it to your data set's path where the sweep runs)"
    )
    return config, True


def _user_data_format(config: RunConfig, readable: tuple[str, ...] | None) -> str:
    """The format data the user supplies later is planned as: the one given, else the first the workload
    reads (an image folder for the zoo's classifiers)."""
    if config.data_format != "auto":
        return config.data_format
    return readable[0] if readable else "image-folder"


#: the frameworks whose core executor evaluates a run to a target (``Executor.evaluate``)
TARGET_FRAMEWORKS = (Framework.torch, Framework.tensorflow)


def _check_data(config: RunConfig, framework: Framework, readable: tuple[str, ...] | None, workload: str) -> str | None:
    """The data's format (None: synthetic), checked as the run will read it; ConfigError otherwise."""
    if config.target is not None and config.data not in SYNTHETIC_SOURCES:
        return _check_target_data(config, framework, readable, workload)
    return validate_data(config.data, config.data_format, framework, readable, workload)


def _check_target_data(config: RunConfig, framework: Framework, readable: tuple[str, ...] | None, workload: str) -> str:
    """A run to a target reads its splits from files laid out as DATA/train and DATA/val, each a data
    set of one format the run reads (core.data.listing.target_splits, TARGET_SPLIT_FORMATS); returns
    the format. Others are refused naming ``data``."""
    from core.data.listing import SPLIT_LAYOUT, TARGET_SPLIT_FORMATS, target_splits
    from core.data.split_index import split_samples

    path = Path(config.data)
    if not path.exists():
        raise ConfigError(
            "data",
            config.data,
            f"no such folder; with a target: synthetic (the workload's own splits) or {SPLIT_LAYOUT}",
        )
    found, *splits = target_splits(path, config.data_format)
    if framework not in FORMAT_FRAMEWORKS[found]:
        readers = ", ".join(f.value for f in FORMAT_FRAMEWORKS[found])
        instead = [name for name in TARGET_SPLIT_FORMATS if framework in FORMAT_FRAMEWORKS[name]]
        raise ConfigError(
            "data",
            config.data,
            f"{found} splits, which a run to a target reads with {readers} only; with {framework.value} it reads "
            f"{_either(instead)} splits",
        )
    for split in splits:
        validate_data(str(split), found, framework, readable, workload)
        # Indexed now (shards' member headers, records' framing), so a split that cannot be read by
        # offset is refused here; setup in this process reuses the cached index.
        if found != "tokens":  # a token file is counted in sequences of the workload's length (_check_target)
            split_samples(split, found)
    return found


def _check_head_classes(workload: Workload, options: BaseModel, training: Path) -> None:
    """An image folder's classes (its class folders, numbered in sorted order) fit the classifier's
    head: a label past it would break the loss mid-run. Shards and records carry their labels inside
    their samples, read as they are trained on (a label past the head then ends the run as a fault)."""
    from core.data.listing import image_folder

    head = workload.head_classes(options)
    classes = len(image_folder(training)[0])
    if head is not None and classes > head:
        field = "workload_options.num_classes" if "num_classes" in type(options).model_fields else "data"
        value = getattr(options, "num_classes", None) if field != "data" else str(training)
        raise ConfigError(
            field,
            value,
            f"a head of at least {classes} classes: {training} holds {classes} class folders, and workload "
            f"{workload.name!r} predicts {head} (set workload_options.num_classes, or its dataset)"
            if field != "data"
            else f"at most {head} class folders, which workload {workload.name!r} predicts; {training} holds {classes}",
        )


def _either(names: list[str]) -> str:
    """'a', 'a or b', 'a, b or c' ('no' for none)."""
    if not names:
        return "no"
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def _check_target(config: RunConfig, workload: Workload, options: BaseModel, data_format: str | None) -> None:
    """A target must be judgeable: a workload whose held-out split is labelled real data, a metric its
    evaluation gives, a framework whose executor evaluates (:data:`TARGET_FRAMEWORKS`), a global batch
    the training split holds."""
    target = config.target
    if target is None:
        return
    declared = dict(workload.evaluation_metrics_for(options, data_format))
    if not declared:
        raise ConfigError(
            "target",
            target.model_dump(exclude_none=True),
            f"a workload with a labelled held-out split of real data (e.g. digits); workload {workload.name!r} "
            "has none: its data is synthetic, with random labels, and a target on it cannot be judged",
        )
    if target.metric not in declared:
        raise ConfigError(
            "target.metric", target.metric, f"a metric workload {workload.name!r} evaluates: {', '.join(declared)}"
        )
    if config.framework not in TARGET_FRAMEWORKS:
        raise ConfigError(
            "framework",
            config.framework.value,
            "a framework whose core executor evaluates a run to a target: "
            + ", ".join(framework.value for framework in TARGET_FRAMEWORKS),
        )
    training_samples = workload.samples_per_epoch(options)
    if config.data not in SYNTHETIC_SOURCES and not DATA_VARIABLE.match(config.data):
        from core.data.listing import check_token_vocabulary, dataset_samples, target_splits
        from core.data.split_index import split_samples

        found, training, held_out = target_splits(Path(config.data), config.data_format)
        if found == "tokens":
            tokens_per_sample = workload.tokens_per_sample(options)
            training_samples = dataset_samples(training, found, tokens_per_sample)
            # A held-out token file shorter than one sequence holds nothing to evaluate: refused, naming it.
            dataset_samples(held_out, found, tokens_per_sample)
            vocabulary = workload.token_vocabulary(options)
            if vocabulary is not None:
                for split in (training, held_out):
                    check_token_vocabulary(split, vocabulary, workload.name)
        else:
            training_samples = split_samples(training, found)
        if found == "image-folder":
            _check_head_classes(workload, options, training)
    if training_samples is not None and config.samples_per_update > training_samples:
        raise ConfigError(
            "micro_batch_size",
            config.micro_batch_size,
            f"a global batch ({config.samples_per_update} samples: micro-batch x accumulation x replicas) the "
            f"training split of {training_samples} samples holds",
        )


def _check_weights(manager: PluginManager, config: RunConfig, workload: Workload, options: BaseModel) -> None:
    """The weights file fits the model: names and shapes from its header against the model built on
    the meta device. Nothing is loaded and no device is touched."""
    from core.executors.weights import check_weights_file

    assert config.weights is not None
    if config.framework is not Framework.torch:
        raise ConfigError(
            "weights",
            config.weights,
            f"a weights file is read by the PyTorch executors only; framework {Framework.torch.value}",
        )
    with manager.plugin_code(workload, f"{type(workload).__name__}.torch_state_shapes()"):
        shapes = workload.torch_state_shapes(options)
    with manager.plugin_code(workload, f"{type(workload).__name__}.torch_state_dtypes()"):
        dtypes = workload.torch_state_dtypes(options)
    check_weights_file(config.weights, shapes, dtypes)


def _check_available(manager: PluginManager, accelerator: Accelerator, machine: MachineProfile | None) -> None:
    if machine is None:
        availability = manager.availability(accelerator)
        if not availability.available:
            raise ConfigError("accelerator", accelerator.name, f"not available here: {availability.reason}")
    elif machine.accelerator != accelerator.name:
        raise ConfigError(
            "accelerator",
            accelerator.name,
            f"machine {machine.name!r} has {machine.device} devices, driven by accelerator {machine.accelerator!r}",
        )


def resolve_precision(
    manager: PluginManager, accelerator: Accelerator, config: RunConfig, machine: MachineProfile | None = None
) -> type[PrecisionPolicy]:
    """The policy the run's precision runs under, or a ConfigError naming ``precision``: the name
    must be one the accelerator lists (and the machine has), and a registered policy must have it
    (a listed name without one would run as fp32 under another name), with the run's framework."""
    framework = config.framework
    with manager.plugin_code(accelerator, f"{type(accelerator).__name__}.precisions()"):
        # A misspelt name in the list is the plugin's fault, reported against it.
        listed = tuple(Precision(name) for name in accelerator.precisions(framework))
    where = f"accelerator {config.accelerator!r} with {framework.value}"
    if machine is not None:
        listed = tuple(p for p in listed if p in machine.precisions)
        where += f" on {machine.name!r} ({machine.device})"
    runnable = tuple(p for p in listed if _runs_with(manager.precision_policy(p), framework))
    requested = config.precision
    policy = manager.precision_policy(requested)
    supports = f"{where} supports: {_choices(runnable) or 'none'}"
    if requested not in listed:
        unknown = (
            f"no precision policy has this name (registered: {_choices(manager.precisions)}); "
            if policy is None
            else ""
        )
        raise ConfigError("precision", requested.value, unknown + supports)
    if policy is None:
        raise ConfigError(
            "precision",
            requested.value,
            f"{where} lists it, but no precision policy of that name is registered (registered: "
            f"{_choices(manager.precisions)}), so nothing would compute in it; it supports: "
            f"{_choices(runnable) or 'none'}",
        )
    if not _runs_with(policy, framework):
        raise ConfigError(
            "precision",
            requested.value,
            f"its policy ({policy.__module__}.{policy.__qualname__}) has no Keras policy, so it runs with torch "
            f"only; {supports}",
        )
    call = f"{type(accelerator).__name__}.precision_policy()"
    with manager.plugin_code(accelerator, call):
        chosen = accelerator.precision_policy(policy, framework)
        # A refinement runs the same precision its own way: same name, same compute dtype.
        same = isinstance(chosen, type) and issubclass(chosen, policy)
        if not same or (chosen.name, chosen.compute_dtype) != (policy.name, policy.compute_dtype):
            raise TypeError(
                f"{call} returned {chosen!r}: {policy.__qualname__} or a subclass of it with its name "
                f"({policy.name!r}) and compute dtype ({policy.compute_dtype}) is required"
            )
    return chosen


def _runs_with(policy: type[PrecisionPolicy] | None, framework: Framework) -> bool:
    """Whether ``policy`` exists and has a path for ``framework`` (every policy has PyTorch's)."""
    return policy is not None and (framework is not Framework.tensorflow or policy.keras_policy is not None)


def memory_estimate(
    workload: Workload,
    options: Any,
    config: RunConfig,
    precision_policy: type[PrecisionPolicy] | None = None,
    machine: MachineProfile | None = None,
) -> ReplicaMemory | None:
    """What one device of the run keeps (core.running.replica_plan: the model's state, and where the
    workload gives its transformer shape, its activations), or None where the workload does not know
    its parameter count. Inference keeps the fp32 weights only."""
    parameters = workload.parameter_count(options)
    if not parameters:
        return None
    shape = workload.transformer_shape(options)
    declared = None if config.mode == "inference" else workload.optimizer_state_per_parameter(options)
    activation_bytes = precision_policy.activation_bytes() if precision_policy is not None else 4
    device = machine.memory_bytes_per_device if machine is not None else None
    plan = workload.tensor_parallel_plan(options) if config.tensor_parallel > 1 else None
    sequence_parallel = plan is not None and plan.sequence_parallel is not None
    return replica_memory(parameters, shape, config, declared, activation_bytes, device, sequence_parallel)


def _size_field(config: RunConfig) -> tuple[str, Any]:
    """The option a memory refusal names: the workload options that sized the model where given."""
    if config.workload_options:
        return "workload_options", dict(config.workload_options)
    return "workload", config.workload


def _memory_fix(
    workload: Workload, options: Any, config: RunConfig, policy: type[PrecisionPolicy] | None, machine: MachineProfile
) -> tuple[str, Any] | None:
    """The first of the run's own fields that, changed alone, makes it fit (recomputation, sharding,
    a smaller micro-batch), as (field, value); None where none does."""
    memory = machine.memory_bytes_per_device
    assert memory is not None
    tries: list[tuple[str, Any]] = [("recompute", "selective"), ("recompute", "full")]
    if config.replicas > 1:
        tries.append(("sharding", "fsdp"))
    tries.append(("sharding", "fsdp-offload"))
    micro = config.micro_batch_size or 1
    tries += [("micro_batch_size", micro // 2**k) for k in range(1, micro.bit_length()) if micro // 2**k >= 1]
    order = {"recompute": RECOMPUTE_CHOICES, "sharding": ("none", "fsdp", "fsdp-offload")}
    for field, value in tries:
        current = getattr(config, field)
        if field in order and order[field].index(value) <= order[field].index(current):
            continue  # no saving over what the run already asks
        if field == "micro_batch_size" and value >= current:
            continue
        changed = config.model_copy(update={field: value})
        estimate = memory_estimate(workload, options, changed, policy, machine)
        if estimate is not None and estimate.total_bytes <= memory:
            return field, value
    return None


def _check_memory_fit(
    workload: Workload,
    options: Any,
    config: RunConfig,
    machine: MachineProfile,
    context: RunContext,
    policy: type[PrecisionPolicy] | None = None,
) -> None:
    """Refuse a model whose weights and gradients alone exceed a device's memory. Where the workload
    gives its transformer shape, the activations are counted too, and a run that does not fit is
    refused naming the field that would make it fit; without one, the optimizer's state is warned of."""
    memory = machine.memory_bytes_per_device
    estimate = memory_estimate(workload, options, config, policy, machine)
    if memory is None or estimate is None:
        return
    gib = 1024**3
    parameters = estimate.parameters
    needed = estimate.weights_bytes + estimate.gradients_bytes
    on = f"{machine.name!r}, {memory / gib:.1f} GiB per device"
    if needed > memory and estimate.activation_bytes is None:
        field, value = _size_field(config)
        raise ConfigError(
            field,
            value,
            f"a model that fits {machine.name!r}: these {parameters:,} parameters need {needed / gib:.1f} GiB per "
            f"device for {estimate.kept} alone, and it has {memory / gib:.1f} GiB per device",
        )
    if estimate.activation_bytes is not None:
        if estimate.total_bytes <= memory:
            return
        fix = _memory_fix(workload, options, config, policy, machine)
        what = f"{estimate.total_bytes / gib:.1f} GiB per device ({_memory_parts(estimate)}), more than the {on}"
        if fix is not None:
            field, value = fix
            raise ConfigError(field, getattr(config, field), f"{value!r} (which fits; the run as planned needs {what})")
        raise ConfigError(
            "devices_per_replica",
            config.devices_per_replica,
            f"more devices per replica (tensor_parallel or pipeline stages), or more replicas with sharding: "
            f"the run as planned needs {what}, and neither recomputation, sharding nor a smaller micro-batch "
            "alone makes it fit",
        )
    with_state = needed + estimate.optimizer_state_bytes
    if with_state > memory:
        optimizer = (
            "an optimizer state like Adam's (the workload does not declare its own)"
            if estimate.optimizer_state_assumed
            else f"the optimizer's state ({estimate.optimizer_state_values_per_parameter} value(s) per parameter)"
        )
        context.warn(
            f"{parameters:,} parameters need {with_state / gib:.1f} GiB per device with {optimizer}, more than the "
            f"{memory / gib:.1f} GiB of {machine.name!r} (activations not counted)"
        )


def _memory_parts(estimate: ReplicaMemory) -> str:
    gib = 1024**3
    parts = [
        f"weights {estimate.weights_bytes / gib:.1f} GiB",
        f"gradients {estimate.gradients_bytes / gib:.1f} GiB",
        f"optimizer state {estimate.optimizer_state_bytes / gib:.1f} GiB",
    ]
    if estimate.activation_bytes is not None:
        parts.append(
            f"activations {estimate.activation_bytes / gib:.1f} GiB with recompute {estimate.recompute!r} and "
            f"{estimate.micro_batches_in_flight} micro-batch(es) in flight"
        )
    return ", ".join(parts) + f"; pipeline stage {estimate.stage + 1}"


def _check_framework(
    framework: Framework,
    workload: Workload,
    accelerator: Accelerator,
    machine: MachineProfile | None = None,
    warnings: list[str] | None = None,
) -> None:
    if framework not in accelerator.frameworks:
        raise ConfigError(
            "framework",
            framework.value,
            f"accelerator {accelerator.name!r} supports: {_choices(accelerator.frameworks)}",
        )
    if framework not in workload.frameworks:
        raise ConfigError(
            "framework", framework.value, f"workload {workload.name!r} supports: {_choices(workload.frameworks)}"
        )
    # Installed libraries are looked up (find_spec), never imported: planning stays light.
    framework_module, install = FRAMEWORK_LIBRARIES[framework]
    if not module_installed(framework_module):
        if machine is not None and warnings is not None:
            warnings.append(f"not checked here, needed on {machine.name!r}: {framework_module} ({install})")
            return
        raise ConfigError(
            "framework",
            framework.value,
            f"{framework_module} is not installed here; {install}, or choose another framework",
        )


#: how a replica may be split and its memory saved, where no executor does it yet (issue 32: PyTorch's
#: FSDP2, DTensor and pipelining): refused in planning, never ignored
_NOT_PLACED_YET = {"tensor_parallel": 1, "sharding": "none", "recompute": "none"}


def _check_parallelism(config: RunConfig, accelerator: Accelerator) -> None:
    """Tensor parallelism, sharding and recomputation: refused where no executor applies them, so a
    run never silently trains as a plain data-parallel one. A pipeline schedule is for pipelines only.
    Core's PyTorch executor applies them (``applies_torch_parallelism``): checked with the workload
    then (core.running.replica_checks)."""
    if config.pipeline_schedule is not None and config.pipeline_parallel == 1:
        raise ConfigError(
            "pipeline_schedule",
            config.pipeline_schedule,
            "unset (None) without pipeline stages (devices_per_replica / tensor_parallel is 1)",
        )
    if accelerator.applies_torch_parallelism and config.framework is Framework.torch:
        return
    for field, plain in _NOT_PLACED_YET.items():
        value = getattr(config, field)
        if field == "recompute" and value in accelerator.own_recompute_choices:
            continue
        if value != plain:
            raise ConfigError(
                field,
                value,
                f"{plain!r} (accelerator {accelerator.name!r}, framework {config.framework.value}, does not apply "
                f"{field.replace('_', ' ')} yet)",
            )
    if config.pipeline_schedule is not None:
        raise ConfigError(
            "pipeline_schedule",
            config.pipeline_schedule,
            f"unset (None): accelerator {accelerator.name!r} pipelines with its own schedule",
        )


def _replica_layout(
    manager: PluginManager,
    workload: Workload,
    options: BaseModel,
    accelerator: Accelerator,
    config: RunConfig,
    warnings: list[str],
    machine: MachineProfile | None,
) -> PipelineLayout | None:
    """The workload's pipeline layout where a replica spans several devices (else None), and the
    checks of core's PyTorch device mesh where the accelerator's executor is core's: in a plan for a
    machine profile, what the executor does not run yet is a warning (the split's rules and memory
    are what such a plan is for), here a refusal."""
    layout = None
    if config.devices_per_replica > 1:
        with manager.plugin_code(workload, f"{type(workload).__name__}.pipeline_layout()"):
            layout = workload.pipeline_layout(options, config.framework)
    if accelerator.applies_torch_parallelism and config.framework is Framework.torch:
        with manager.plugin_code(workload, f"{type(workload).__name__}.tensor_parallel_plan()"):
            warnings.extend(
                check_torch_replica(config, workload, options, layout, planned_elsewhere=machine is not None)
            )
    return layout


def _check_devices_fit_nodes(config: RunConfig, machine: MachineProfile) -> None:
    """A replica larger than a node: replicas x devices_per_replica fit nodes x the machine's devices
    (replicas within a node are counted against its devices as before)."""
    devices = config.replicas * config.devices_per_replica
    if config.devices_per_replica > machine.devices and devices > config.nodes * machine.devices:
        nodes_needed = -(-devices // machine.devices)
        raise ConfigError(
            "nodes",
            config.nodes,
            f"at least {nodes_needed}: {config.replicas} replica(s) x {config.devices_per_replica} device(s) are "
            f"{devices} devices, and {machine.name!r} has {machine.devices} per node",
        )


def _check_placement_limits(manager: PluginManager, accelerator: Accelerator, context: RunContext) -> None:
    config, machine = context.config, context.machine
    if machine is None:
        form = "max_replicas" if old_form_class(accelerator, "max_replicas_for", "max_replicas") else "max_replicas_for"
        with manager.plugin_code(accelerator, f"{type(accelerator).__name__}.{form}()"):
            max_replicas = max_replicas_for(accelerator, context)
        where = "here"
    else:
        max_replicas = machine.devices // config.devices_per_replica
        where = f"on {machine.name!r} ({machine.devices} devices, {config.devices_per_replica} per replica)"
        _check_devices_fit_nodes(config, machine)
    spans_nodes = machine is not None and config.devices_per_replica > machine.devices
    if config.replicas_per_node > max_replicas and not spans_nodes:
        per_node = (
            f" per node ({config.replicas_per_node} of them on each of {config.nodes})" if config.nodes > 1 else ""
        )
        raise ConfigError(
            "replicas",
            config.replicas,
            f"accelerator {accelerator.name!r} can place at most {max_replicas} {where}{per_node}",
        )
    if config.devices_per_replica > accelerator.max_devices_per_replica:
        raise ConfigError(
            "devices_per_replica",
            config.devices_per_replica,
            f"accelerator {accelerator.name!r} places at most {accelerator.max_devices_per_replica} "
            "device(s) per replica",
        )
    if config.threads_per_replica is not None and not accelerator.applies_threads_per_replica:
        raise ConfigError(
            "threads_per_replica",
            config.threads_per_replica,
            f"accelerator {accelerator.name!r} does not set host threads (its plugin does not declare "
            "applies_threads_per_replica); allowed: leave it unset (None)",
        )
    if config.device_iterations > 1 and not accelerator.supports_device_iterations:
        raise ConfigError(
            "device_iterations",
            config.device_iterations,
            f"accelerator {accelerator.name!r} runs one update per host call; allowed: 1",
        )


def check_findable_by_workers(
    manager: PluginManager,
    workload: Workload,
    accelerator: Accelerator,
    config: RunConfig,
    field: str = "replicas",
    value: object = None,
    why: str = "replicas > 1 start one process each",
) -> None:
    """Refuse a run whose processes could not find its workload and accelerator: they look them up
    again by name, through the plugins, so objects passed to run() do not reach them."""
    registered_workload = manager.workloads.get(config.workload)
    registered_accelerator = manager.accelerators.get(config.accelerator)
    if (
        registered_workload is None
        or registered_workload.item is not workload
        or registered_accelerator is None
        or registered_accelerator.item is not accelerator
    ):
        raise ConfigError(
            field,
            config.replicas if value is None else value,
            f"{why}, which needs the workload and accelerator registered through a plugin (objects "
            "passed to run() exist in this process only)",
        )


def _choose_meter(
    manager: PluginManager, accelerator: Accelerator, config: RunConfig
) -> tuple[PowerMeterFactory | None, str | None]:
    """The meter for the run, or None and why the run will have no energy figure."""
    factory = manager.power_meter_factory(accelerator, config)
    if factory is not None:
        meter_availability = manager.availability(factory)
        if meter_availability.available:
            return factory, None
        if config.power_meter != "auto":
            raise ConfigError("power_meter", config.power_meter, f"not available here: {meter_availability.reason}")
        return None, f"meter {factory.name!r} unavailable: {meter_availability.reason}"
    if config.power_meter == "none":
        return None, "energy measurement disabled (power_meter='none')"
    readers = manager.meters_reading(config.accelerator)
    reasons = [
        f"{meter.name}: {availability.reason}"
        for meter in readers
        if not (availability := manager.availability(meter)).available
    ]
    return None, f"no available power meter reads accelerator {config.accelerator!r}" + (
        f" ({'; '.join(reasons)})" if reasons else ""
    )
