"""Turns options into a validated plan, checking everything that can be checked without a device."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from core.config import Framework, RunConfig, make_config
from core.contract.accelerator import Accelerator, validate_run
from core.contract.context import RunContext, overrides_old_form
from core.contract.launcher import Launcher
from core.contract.manager import PluginManager
from core.contract.workload import FRAMEWORK_LIBRARIES, Workload, module_installed
from core.data import validate_data
from core.energy.meter import PowerMeterFactory
from core.errors import ConfigError
from core.running.distributed import SINGLE_PROCESS, ProcessContext


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

    def context(self, process: ProcessContext) -> RunContext:
        """What the plugins are handed in ``process``: the configuration and the parsed options."""
        return RunContext(self.config, self.workload_options, self.accelerator_options, process)

    @property
    def launches_processes(self) -> bool:
        """Whether a launcher starts the run's processes (torchrun: one per replica)."""
        return self.launcher is not None


def _choices(values: Any) -> str:
    return ", ".join(getattr(v, "value", str(v)) for v in values)


def plan_run(
    manager: PluginManager, workload: str | Workload, accelerator: str | Accelerator, options: dict[str, Any]
) -> RunPlan:
    """Validate a run. Raises ConfigError naming the field, the value and what is allowed."""
    workload_name = workload.name if isinstance(workload, Workload) else workload
    accelerator_name = accelerator.name if isinstance(accelerator, Accelerator) else accelerator
    config = make_config(workload=workload_name, accelerator=accelerator_name, **options)
    workload_obj = workload if isinstance(workload, Workload) else manager.workload(workload_name)
    accelerator_obj = accelerator if isinstance(accelerator, Accelerator) else manager.accelerator(accelerator_name)

    guard = manager.plugin_code
    availability = manager.availability(accelerator_obj)
    if not availability.available:
        raise ConfigError("accelerator", accelerator_name, f"not available here: {availability.reason}")
    framework = config.framework
    _check_framework(framework, workload_obj, accelerator_obj)
    with guard(accelerator_obj, f"{type(accelerator_obj).__name__}.precisions()"):
        precisions = accelerator_obj.precisions(framework)
    if config.precision not in precisions:
        raise ConfigError(
            "precision",
            config.precision.value,
            f"accelerator {accelerator_name!r} with {framework.value} supports: {_choices(precisions)}",
        )
    with guard(workload_obj, f"{type(workload_obj).__name__}.data_formats_for()"):
        readable = workload_obj.data_formats_for(framework)
    validate_data(config.data, config.data_format, framework, readable, workload_name)
    with guard(workload_obj, f"{type(workload_obj).__name__}.parse_options()"):
        workload_options = workload_obj.parse_options(dict(config.workload_options))
    with guard(workload_obj, f"{type(workload_obj).__name__}.missing_library()"):
        missing = workload_obj.missing_library(framework)
    if missing:
        raise ConfigError(
            "workload",
            workload_name,
            f"with {framework.value} it needs {missing}; "
            f"or choose another framework (supported: {_choices(workload_obj.frameworks)})",
        )
    with guard(accelerator_obj, f"{type(accelerator_obj).__name__}.parse_options()"):
        accelerator_options = accelerator_obj.parse_options(dict(config.accelerator_options))
    if config.micro_batch_size is None:
        config = config.model_copy(update={"micro_batch_size": workload_obj.default_micro_batch_size})

    _check_placement_limits(manager, accelerator_obj, config)
    plan = RunPlan(config, workload_obj, workload_options, accelerator_obj, accelerator_options, None, None)
    validating = "validate" if overrides_old_form(accelerator_obj, "validate_run", "validate") else "validate_run"
    with guard(accelerator_obj, f"{type(accelerator_obj).__name__}.{validating}()"):
        validate_run(accelerator_obj, plan.context(SINGLE_PROCESS))

    with guard(accelerator_obj, f"{type(accelerator_obj).__name__}.launcher_for()"):
        launcher = accelerator_obj.launcher_for(plan.context(SINGLE_PROCESS))
    if launcher is not None:
        check_findable_by_workers(manager, workload_obj, accelerator_obj, config)

    factory, meter_reason = _choose_meter(manager, accelerator_obj, config)
    return dataclasses.replace(plan, meter_factory=factory, meter_unavailable_reason=meter_reason, launcher=launcher)


def _check_framework(framework: Framework, workload: Workload, accelerator: Accelerator) -> None:
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
        raise ConfigError(
            "framework",
            framework.value,
            f"{framework_module} is not installed here; {install}, or choose another framework",
        )


def _check_placement_limits(manager: PluginManager, accelerator: Accelerator, config: RunConfig) -> None:
    with manager.plugin_code(accelerator, f"{type(accelerator).__name__}.max_replicas()"):
        max_replicas = accelerator.max_replicas(config)
    if config.replicas > max_replicas:
        raise ConfigError(
            "replicas", config.replicas, f"accelerator {accelerator.name!r} can place at most {max_replicas} here"
        )
    if config.devices_per_replica > accelerator.max_devices_per_replica:
        raise ConfigError(
            "devices_per_replica",
            config.devices_per_replica,
            f"accelerator {accelerator.name!r} places at most {accelerator.max_devices_per_replica} "
            "device(s) per replica",
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
    readers = [r.item for r in manager.power_meters.values() if manager.meter_reads(r.item, config.accelerator)]
    reasons = [
        f"{meter.name}: {availability.reason}"
        for meter in readers
        if not (availability := manager.availability(meter)).available
    ]
    return None, f"no available power meter reads accelerator {config.accelerator!r}" + (
        f" ({'; '.join(reasons)})" if reasons else ""
    )
