"""Plugins get the options parsed once (RunContext), and plugins written for 0.1 or 0.2 keep working.

The current forms (``executor_for``, ``validate_run``, ``max_replicas_for``, ``devices_used``,
``configure_torch_for``, ``meter_for``, a meter's declared ``accelerators``) take the run context;
the older forms (``create_executor``, ``validate``, ``create`` from 0.1; ``max_replicas``,
``devices_for``, ``configure_torch``, ``reads`` from 0.2) take the raw configuration. core calls
whichever form a plugin's class overrides last, warns that the old one goes in 0.3, and refuses a
plugin that implements neither.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel, ConfigDict, field_validator

from core import ConfigError, make_config, run
from core.contract import context as context_module
from core.contract.accelerator import devices_used, max_replicas_for
from core.contract.launcher import Launcher, launcher_path, load_launcher
from core.contract.manager import PluginState
from core.plugin import (
    Accelerator,
    Availability,
    DeviceRecord,
    PowerMeter,
    PowerMeterFactory,
    ProcessContext,
    RunConfig,
    RunContext,
    UnavailableMeter,
    Workload,
    hookimpl,
)
from core.running.launch import TorchrunLauncher
from core.testing import TINY_FCNN, SimulatedExecutor, registered_plugins
from core_plugins.cpu.accelerator import CpuAccelerator

PARSES: list[dict[str, Any]] = []


class CountedOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lanes: int = 1

    @field_validator("lanes")
    @classmethod
    def _count(cls, lanes: int) -> int:
        PARSES.append({"lanes": lanes})
        return lanes


class ContextCpu(CpuAccelerator):
    """The 0.2 form: reads the parsed options from the context."""

    name: ClassVar[str] = "context-cpu"
    options_model: ClassVar[type[BaseModel]] = CountedOptions
    seen: ClassVar[list[RunContext]] = []

    def executor_for(self, workload: Workload, context: RunContext) -> Any:
        ContextCpu.seen.append(context)
        return SimulatedExecutor(lambda: None)

    def validate_run(self, context: RunContext) -> None:
        if context.accelerator_options_as(CountedOptions).lanes > 4:
            raise ConfigError("accelerator_options.lanes", context.accelerator_options_as(CountedOptions).lanes, "<= 4")


class OldStyleCpu(CpuAccelerator):
    """A 0.1 plugin: subclasses a base that implements executor_for, overrides create_executor."""

    name: ClassVar[str] = "old-style-cpu"
    calls: ClassVar[list[str]] = []

    def create_executor(self, workload: Workload, config: RunConfig, process: ProcessContext) -> Any:
        OldStyleCpu.calls.append(f"create_executor({config.workload}, rank {process.rank})")
        return SimulatedExecutor(lambda: None)

    def validate(self, config: RunConfig) -> None:
        if config.steps > 100:
            raise ConfigError("steps", config.steps, "at most 100 on the old-style CPU")


class OldStyleMeter(PowerMeterFactory):
    name: ClassVar[str] = "old-style-meter"
    created: ClassVar[list[int]] = []

    def reads(self, accelerator_name: str) -> bool:
        return accelerator_name == "old-style-cpu"

    def availability(self) -> Availability:
        return Availability.yes()

    def create(self, devices: list[DeviceRecord], config: RunConfig) -> PowerMeter:
        OldStyleMeter.created.append(config.steps)
        return UnavailableMeter(self.name, "the old-style meter reads nothing")


class Plugin:
    def __init__(self, *accelerators: Accelerator, meters: tuple[PowerMeterFactory, ...] = ()) -> None:
        self.accelerators, self.meters = accelerators, meters

    @hookimpl
    def core_register_accelerators(self, register: Callable[[Accelerator], None]) -> None:
        for accelerator in self.accelerators:
            register(accelerator)

    @hookimpl
    def core_register_power_meters(self, register: Callable[[PowerMeterFactory], None]) -> None:
        for meter in self.meters:
            register(meter)


def test_the_accelerator_options_are_parsed_once_and_handed_over_typed() -> None:
    PARSES.clear()
    ContextCpu.seen.clear()
    with registered_plugins(Plugin(ContextCpu())):
        result = run(
            "fcnn", "context-cpu", workload_options=TINY_FCNN, accelerator_options={"lanes": 3}, steps=2, warmup_steps=0
        )
    assert result.status.ok, result.status
    assert PARSES == [{"lanes": 3}]  # planning parsed them; validate_run and executor_for only read them
    (context,) = ContextCpu.seen
    assert isinstance(context.accelerator_options, CountedOptions) and context.accelerator_options.lanes == 3
    assert context.workload_options.hidden_width == TINY_FCNN["hidden_width"]  # type: ignore[attr-defined]
    assert context.config.micro_batch_size is not None  # resolved before the plugins see it
    with pytest.raises(TypeError, match="parsed as CountedOptions, not ConfigDictless"):
        context.accelerator_options_as(type("ConfigDictless", (BaseModel,), {}))


def test_validate_run_refuses_before_any_device_is_touched() -> None:
    ContextCpu.seen.clear()
    with registered_plugins(Plugin(ContextCpu())), pytest.raises(ConfigError) as refused:
        run("fcnn", "context-cpu", workload_options=TINY_FCNN, accelerator_options={"lanes": 5})
    assert refused.value.field == "accelerator_options.lanes"
    assert ContextCpu.seen == []


def test_a_0_1_plugin_keeps_its_own_create_executor_validate_and_meter_create() -> None:
    OldStyleCpu.calls.clear()
    OldStyleMeter.created.clear()
    context_module._warned.clear()  # once per class and method: this test must see the first time
    with registered_plugins(Plugin(OldStyleCpu(), meters=(OldStyleMeter(),))):
        with pytest.warns(DeprecationWarning) as deprecations:
            result = run("fcnn", "old-style-cpu", workload_options=TINY_FCNN, steps=3, warmup_steps=0)
        with pytest.raises(ConfigError, match="at most 100 on the old-style CPU"):
            run("fcnn", "old-style-cpu", workload_options=TINY_FCNN, steps=101)
    assert result.status.ok, result.status
    assert OldStyleCpu.calls == ["create_executor(fcnn, rank 0)"]  # not CpuAccelerator.executor_for
    assert OldStyleMeter.created == [3]
    assert result.energy.unavailable_reason == "the old-style meter reads nothing"
    # The plugin's author is told, through Python's warnings, and its user, in the result.
    warned = sorted(str(w.message).split("()")[0].rsplit(".", 1)[-1] for w in deprecations.list)
    # reads() is the form from before a meter declared its accelerators (0.2's), kept as long.
    assert warned == ["create", "create_executor", "reads", "validate"]
    assert sum("core 0.1's form" in warning and "removed in 0.3" in warning for warning in result.warnings) == 3
    assert sum("reads() is core 0.2's form" in warning for warning in result.warnings) == 1


class Incomplete(Accelerator):
    name: ClassVar[str] = "incomplete"

    def availability(self) -> Availability:
        return Availability.yes()

    def precisions(self, framework: Any) -> tuple[Any, ...]:
        return ()

    def max_replicas(self, config: RunConfig) -> int:
        return 1

    def devices(self) -> list[DeviceRecord]:
        return []


def test_an_accelerator_with_neither_executor_method_is_refused_at_registration() -> None:
    with registered_plugins(entry_points=False) as manager:
        manager.register_plugin(Plugin(Incomplete()), name="incomplete-plugin")
        record = manager.plugins["incomplete-plugin"]
    assert record.state is PluginState.failed
    assert "implements neither executor_for (core 0.2) nor create_executor" in (record.error or "")


def test_a_started_process_rebuilds_its_launcher_from_the_class_path() -> None:
    path = launcher_path(TorchrunLauncher())
    assert path == "core.running.launch:TorchrunLauncher"
    assert isinstance(load_launcher(path), TorchrunLauncher)
    with pytest.raises(ValueError, match="is not a Launcher class"):
        load_launcher("core.running.launch:launch")
    assert issubclass(TorchrunLauncher, Launcher)


def test_the_torchrun_launcher_reads_torchrun_s_variables() -> None:
    process = TorchrunLauncher().process_context(
        {"RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}
    )
    assert (process.rank, process.local_rank, process.world_size, process.local_world_size) == (2, 0, 4, 2)


def test_no_built_in_plugin_uses_an_old_form() -> None:
    from core.contract.context import ACCELERATOR_OLD_FORMS, METER_OLD_FORMS, old_form_warnings
    from core.contract.manager import get_plugin_manager

    manager = get_plugin_manager()
    accelerators = [registration.item for registration in manager.accelerators.values()]
    meters = [registration.item for registration in manager.power_meters.values()]
    assert {"cpu", "nvidia", "amd", "graphcore"} <= {a.name for a in accelerators}
    used = [m for a in accelerators for m in old_form_warnings(a, ACCELERATOR_OLD_FORMS)]
    used += [m for meter in meters for m in old_form_warnings(meter, METER_OLD_FORMS)]
    assert not used, used


# --- max_replicas and devices_for took the raw configuration until 0.2 ---------------------------


class PlacingCpu(CpuAccelerator):
    """The current forms: both read the parsed options from the context."""

    name: ClassVar[str] = "placing-cpu"
    options_model: ClassVar[type[BaseModel]] = CountedOptions
    asked: ClassVar[list[str]] = []

    def max_replicas_for(self, context: RunContext) -> int:
        PlacingCpu.asked.append(f"max_replicas_for(lanes={context.accelerator_options_as(CountedOptions).lanes})")
        return 1

    def devices_used(self, context: RunContext) -> list[DeviceRecord]:
        lanes = context.accelerator_options_as(CountedOptions).lanes
        PlacingCpu.asked.append(f"devices_used(lanes={lanes}, rank {context.process.rank})")
        return [DeviceRecord(index=0, name=f"{lanes}-lane CPU", kind=self.name)]

    def executor_for(self, workload: Workload, context: RunContext) -> Any:
        return SimulatedExecutor(lambda: None)


class PlacingCpu02(CpuAccelerator):
    """A plugin written against 0.2's docs: max_replicas(config) and devices_for(config, process)."""

    name: ClassVar[str] = "placing-cpu-0-2"

    def max_replicas(self, config: RunConfig) -> int:
        return 1

    def devices_for(self, config: RunConfig, process: ProcessContext) -> list[DeviceRecord]:
        return [DeviceRecord(index=0, name=f"CPU of {config.workload}", kind=self.name)]

    def executor_for(self, workload: Workload, context: RunContext) -> Any:
        return SimulatedExecutor(lambda: None)


def test_placement_reads_the_parsed_options_from_the_context() -> None:
    PARSES.clear()
    PlacingCpu.asked.clear()
    with registered_plugins(Plugin(PlacingCpu())):
        result = run("fcnn", "placing-cpu", workload_options=TINY_FCNN, accelerator_options={"lanes": 2}, steps=2)
        with pytest.raises(ConfigError, match="can place at most 1 here"):
            run("fcnn", "placing-cpu", workload_options=TINY_FCNN, replicas=2)
    assert result.status.ok, result.status
    assert PARSES == [{"lanes": 2}]  # parsed once, in planning
    assert PlacingCpu.asked == [
        "max_replicas_for(lanes=2)",
        "devices_used(lanes=2, rank 0)",
        "max_replicas_for(lanes=1)",
    ]
    assert result.devices[0].name == "2-lane CPU"
    assert not [w for w in result.warnings if "form" in w]


def test_a_0_2_plugin_keeps_its_max_replicas_and_devices_for() -> None:
    context_module._warned.clear()
    with registered_plugins(Plugin(PlacingCpu02())):
        with pytest.warns(DeprecationWarning) as deprecations:
            result = run("fcnn", "placing-cpu-0-2", workload_options=TINY_FCNN, steps=2, warmup_steps=0)
        with pytest.raises(ConfigError, match="can place at most 1 here"):
            run("fcnn", "placing-cpu-0-2", workload_options=TINY_FCNN, replicas=2)
    assert result.status.ok, result.status
    assert result.devices[0].name == "CPU of fcnn"  # its own devices_for, not CpuAccelerator's devices_used
    warned = sorted(str(w.message).split("()")[0].rsplit(".", 1)[-1] for w in deprecations.list)
    assert warned == ["devices_for", "max_replicas"]
    moved = [w for w in result.warnings if "core 0.2's form" in w and "removed in 0.3" in w]
    assert len(moved) == 2 and any("implement max_replicas_for() instead" in w for w in moved), result.warnings


class NoReplicas(Incomplete):
    name: ClassVar[str] = "no-replicas"
    max_replicas = Accelerator.max_replicas  # as if it never implemented it

    def executor_for(self, workload: Workload, context: RunContext) -> Any:
        return SimulatedExecutor(lambda: None)


def test_an_accelerator_with_neither_max_replicas_method_is_refused_at_registration() -> None:
    with registered_plugins(entry_points=False) as manager:
        record = manager.register_plugin(Plugin(NoReplicas()), name="no-replicas-plugin")
    assert record.state is PluginState.failed
    assert "implements neither max_replicas_for (core 0.2) nor max_replicas" in (record.error or ""), record.error


def test_a_gpu_plugin_written_for_0_2_keeps_its_configure_torch_and_super_calls() -> None:
    from core.executors.gpu import TorchGpuAccelerator, configure_torch_for
    from core.testing import run_context

    class Gpu02(TorchGpuAccelerator):
        name: ClassVar[str] = "gpu-0-2"

        def availability(self) -> Availability:
            return Availability.yes()

        def visible_devices(self) -> list[DeviceRecord]:
            return [DeviceRecord(index=i, name="GPU", kind=self.name) for i in range(3)]

        def max_replicas(self, config: RunConfig) -> int:
            return min(super().max_replicas(config), 2)  # the base's old form still answers

        def devices_for(self, config: RunConfig, process: ProcessContext) -> list[DeviceRecord]:
            return super().devices_for(config, process)[:1]

        def configure_torch(self, config: RunConfig) -> dict[str, Any]:
            return {"vendor_switch": config.workload}

    gpu = Gpu02()
    context = run_context(make_config(workload="fcnn", accelerator="gpu-0-2", replicas=3), gpu)
    context_module._warned.clear()
    with pytest.warns(DeprecationWarning, match="configure_torch\\(\\) is core 0.2's form"):
        assert configure_torch_for(gpu, context) == {"vendor_switch": "fcnn"}
    assert max_replicas_for(gpu, context) == 2
    assert [d.index for d in devices_used(gpu, context)] == [0]
