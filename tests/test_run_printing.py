"""What `core run` prints (issue 26, item 9): every warning the result holds, only known reasons,
the fields a cross-field rule of a workload's options is about, and `--threads` honoured or refused.

In process (``core.cli.main``) with plugins of this file: nothing here needs a device or a subprocess.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel, ConfigDict, model_validator

from core import (
    Accelerator,
    Availability,
    ConfigError,
    DeviceRecord,
    EnergyMeasurement,
    Framework,
    PowerMeter,
    PowerMeterFactory,
    Precision,
    RunConfig,
    Workload,
    hookimpl,
)
from core.base.results import RunResult, RunState, Status
from core.cli import format_result, main
from core.contract.context import RunContext
from core.contract.manager import get_plugin_manager
from core.executors.base import Executor
from core.running.planning import plan_run
from core.testing import TINY_FCNN, SimulatedExecutor, registered_plugins

RECOMPILED = "recompiled 2 times in the window: the figures include compilation"
CROSS_CHECK = "dev0: the energy counter and the sampled power integral differ by 9.0%"


class RecompilingExecutor(SimulatedExecutor):
    def window_warnings(self) -> list[str]:
        return [RECOMPILED]


class PrintingAccelerator(Accelerator):
    """A device that runs nothing: its executor reports a recompilation in the window."""

    name: ClassVar[str] = "printing"

    def availability(self) -> Availability:
        return Availability.yes()

    def precisions(self, framework: Framework) -> tuple[Precision, ...]:
        return (Precision.fp32,)

    def max_replicas_for(self, context: RunContext) -> int:
        return 1

    def devices(self) -> list[DeviceRecord]:
        return [DeviceRecord(index=0, name="printing device", kind=self.name)]

    def executor_for(self, workload: Workload, context: RunContext) -> Executor:
        return RecompilingExecutor()


class OldFormAccelerator(PrintingAccelerator):
    """A core 0.1 plugin: ``validate`` instead of ``validate_run`` (a deprecation the run keeps)."""

    name: ClassVar[str] = "printing-old-form"

    def validate(self, config: RunConfig) -> None:
        pass


class BrokenInSetup(PrintingAccelerator):
    name: ClassVar[str] = "printing-broken"

    def executor_for(self, workload: Workload, context: RunContext) -> Executor:
        raise RuntimeError("no device handle")


class DisagreeingMeter(PowerMeter):
    name = "disagreeing"

    def start(self) -> None:
        pass

    def stop(self) -> EnergyMeasurement:
        return EnergyMeasurement(meter=self.name, method="counter", energy_joules=5.0, warnings=[CROSS_CHECK])


class DisagreeingMeterFactory(PowerMeterFactory):
    name: ClassVar[str] = "disagreeing"

    accelerators: ClassVar[tuple[str, ...]] = (
        "printing",
        "printing-old-form",
        "printing-broken",
        "printing-reasonless",
    )

    def availability(self) -> Availability:
        return Availability.yes()

    def meter_for(self, devices: list[DeviceRecord], context: RunContext) -> PowerMeter:
        return DisagreeingMeter()


class WidthOptions(BaseModel):
    """Options with a rule across two fields, as a third party's workload may write it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input_width: int = 8
    hidden_width: int = 16
    depth: int = 2

    @model_validator(mode="after")
    def _hidden_at_least_input(self) -> WidthOptions:
        if self.hidden_width < self.input_width:
            raise ValueError("hidden_width must be at least input_width")
        return self


class NamingOptions(WidthOptions):
    """The same rule, raised as a ConfigError that names the fields itself."""

    @model_validator(mode="after")
    def _hidden_at_least_input(self) -> NamingOptions:
        if self.hidden_width < self.input_width:
            raise ConfigError(
                "input_width",
                {"input_width": self.input_width, "hidden_width": self.hidden_width},
                "a hidden layer at least as wide as the input",
                fields=("input_width", "hidden_width"),
            )
        return self


class VagueOptions(WidthOptions):
    """A rule whose message names no field."""

    @model_validator(mode="after")
    def _hidden_at_least_input(self) -> VagueOptions:
        if self.hidden_width < self.input_width:
            raise ValueError("the layers do not fit together")
        return self


class WidthWorkload(Workload):
    name: ClassVar[str] = "widths"
    default_micro_batch_size: ClassVar[int] = 4
    options_model: ClassVar[type[BaseModel]] = WidthOptions


class NamingWorkload(WidthWorkload):
    name: ClassVar[str] = "widths-naming"
    options_model: ClassVar[type[BaseModel]] = NamingOptions


class VagueWorkload(WidthWorkload):
    name: ClassVar[str] = "widths-vague"
    options_model: ClassVar[type[BaseModel]] = VagueOptions


class _Plugin:
    @hookimpl
    def core_register_accelerators(self, register: Callable[[Accelerator], None]) -> None:
        for accelerator in (PrintingAccelerator(), OldFormAccelerator(), BrokenInSetup()):
            register(accelerator)

    @hookimpl
    def core_register_power_meters(self, register: Callable[[PowerMeterFactory], None]) -> None:
        register(DisagreeingMeterFactory())

    @hookimpl
    def core_register_workloads(self, register: Callable[[Workload], None]) -> None:
        for workload in (WidthWorkload(), NamingWorkload(), VagueWorkload()):
            register(workload)


FCNN_RUN = ["fcnn", "--steps", "2", "--warmup-steps", "0", "--batch-size", "4"]
FCNN_RUN += [item for key, value in TINY_FCNN.items() for item in ("-o", f"{key}={value}")]


# --- warnings -----------------------------------------------------------------------------------


def test_the_results_warnings_are_printed_with_the_figures(capsys: pytest.CaptureFixture[str]) -> None:
    with registered_plugins(_Plugin()):
        code = main(["run", *FCNN_RUN, "--accelerator", "printing-old-form"])
        printed = capsys.readouterr().out
        assert main(["run", *FCNN_RUN, "--accelerator", "printing-old-form", "--json"]) == 0
        document = json.loads(capsys.readouterr().out)
    assert code == 0
    # Each warning the JSON holds is in the text: the recompilation, the cross-check, the deprecation.
    assert any("validate() is core 0.1's form" in warning for warning in document["warnings"])
    assert len(document["warnings"]) == 3
    for warning in document["warnings"]:
        assert f"  warning         {warning}" in printed
    assert f"warning         {RECOMPILED}" in printed and f"warning         energy: {CROSS_CHECK}" in printed


def test_a_warning_is_printed_on_one_line_with_controls_escaped() -> None:
    with registered_plugins(_Plugin()):
        from core.api import run

        result = run("fcnn", "printing", steps=1, warmup_steps=0, workload_options=TINY_FCNN)
    result.warnings.append("a plugin's note\nover two lines \x1b[2J")
    text = format_result(result)
    assert "\x1b" not in text and "a plugin's note over two lines \ufffd[2J" in text


# --- only what is known -------------------------------------------------------------------------


def test_a_run_that_fails_in_setup_prints_why_it_has_no_energy(capsys: pytest.CaptureFixture[str]) -> None:
    with registered_plugins(_Plugin()):
        code = main(["run", *FCNN_RUN, "--accelerator", "printing-broken"])
    printed = capsys.readouterr().out
    assert code == 1 and "error           in setup: RuntimeError: no device handle" in printed
    assert "None" not in printed
    energy = next(line for line in printed.splitlines() if line.startswith("  energy"))
    assert "unavailable: the window did not complete (error in setup)" in energy


def test_a_result_without_any_reason_prints_none_of_it() -> None:
    """A result read from elsewhere (a plugin's, an older core's) may carry no reason and no phase."""
    config = RunConfig(workload="fcnn", accelerator="cpu", micro_batch_size=4)
    result = RunResult.of_config(
        config, 1, status=Status(state=RunState.killed, error_type="ProcessKilled", message="killed by SIGKILL")
    )
    text = format_result(result)
    assert "None" not in text
    assert "  energy          not measured" in text
    assert "  error           ProcessKilled: killed by SIGKILL" in text


@pytest.mark.parametrize("state", [RunState.timeout, RunState.killed])
def test_a_stopped_run_explains_its_missing_energy(state: RunState) -> None:
    config = RunConfig(workload="fcnn", accelerator="cpu", micro_batch_size=4)
    result = RunResult.of_config(config, 1, setup_seconds=1.0, status=Status(state=state, phase="first_step"))
    result.explain_missing_energy()
    assert result.energy_unavailable_reason == f"the window did not complete ({state.value} in first_step): " + (
        "no energy was measured"
    )
    measured = RunResult.of_config(config, 1, energy_joules=3.0, status=Status(state=state, phase="accuracy"))
    measured.explain_missing_energy()
    assert measured.energy_unavailable_reason is None  # the window's energy stands


def test_an_unavailable_plugin_without_a_reason_is_not_printed_as_none(capsys: pytest.CaptureFixture[str]) -> None:
    class Reasonless(PrintingAccelerator):
        name: ClassVar[str] = "printing-reasonless"

        def availability(self) -> Availability:
            return Availability(False)

    class Plugin:
        @hookimpl
        def core_register_accelerators(self, register: Callable[[Accelerator], None]) -> None:
            register(Reasonless())

    with registered_plugins(Plugin()):
        assert main(["plugins"]) == 0
        listing = capsys.readouterr().out
        assert main(["run", *FCNN_RUN, "--accelerator", "printing-reasonless"]) == 2
        refusal = capsys.readouterr().err
    line = next(line for line in listing.splitlines() if "printing-reasonless" in line)
    assert "None" not in line and "gives no reason" in line
    assert "None" not in refusal and "gives no reason" in refusal


# --- a rule across several workload options -----------------------------------------------------


def test_a_cross_field_rule_names_its_fields_and_their_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with registered_plugins(_Plugin()):
        code = main(["run", "widths", "--accelerator", "printing", "-o", "hidden_width=4"])
    error = capsys.readouterr().err
    assert code == 2
    assert "?" not in error
    assert (
        "invalid workload_options.input_width, workload_options.hidden_width (-o input_width, -o hidden_width) = "
        "{'input_width': 8, 'hidden_width': 4}: hidden_width must be at least input_width"
    ) in error


def test_a_rule_raising_a_config_error_names_the_fields_it_gives() -> None:
    with registered_plugins(_Plugin()), pytest.raises(ConfigError) as raised:
        plan_run(get_plugin_manager(), "widths-naming", "printing", {"workload_options": {"input_width": 32}})
    assert raised.value.fields == ("workload_options.input_width", "workload_options.hidden_width")
    assert raised.value.value == {"input_width": 32, "hidden_width": 16}
    assert raised.value.allowed == "a hidden layer at least as wide as the input"


def test_a_rule_whose_message_names_no_field_names_the_options_given(capsys: pytest.CaptureFixture[str]) -> None:
    with registered_plugins(_Plugin()):
        code = main(["run", "widths-vague", "--accelerator", "printing", "-o", "input_width=64", "-o", "depth=3"])
    error = capsys.readouterr().err
    assert code == 2 and "?" not in error
    assert "(-o input_width, -o depth) = {'input_width': 64, 'depth': 3}: the layers do not fit together" in error


def test_a_cross_field_rule_in_a_sweep_cell_names_its_fields(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    grid = tmp_path / "grid.toml"
    grid.write_text(
        'name = "widths"\n[grid]\nworkload = "widths"\naccelerator = "printing"\n'
        "[grid.workload_options]\nhidden_width = [4, 32]\n"
    )
    with registered_plugins(_Plugin()):
        code = main(["sweep", str(grid), "--dry-run", "--database", str(tmp_path / "core.db")])
    shown = capsys.readouterr()
    assert code == 2
    assert "workload_options.input_width, workload_options.hidden_width = " in shown.out
    assert ".?" not in shown.out


# --- --threads ----------------------------------------------------------------------------------


@pytest.mark.parametrize("accelerator", ["printing", "printing-old-form"])
def test_threads_an_accelerator_does_not_set_are_refused(accelerator: str, capsys: pytest.CaptureFixture[str]) -> None:
    with registered_plugins(_Plugin()):
        code = main(["run", *FCNN_RUN, "--accelerator", accelerator, "--threads", "2"])
        dry = main(["run", *FCNN_RUN, "--accelerator", accelerator, "--threads", "2", "--dry-run"])
    error = capsys.readouterr().err
    assert code == dry == 2
    assert f"invalid threads_per_replica (--threads) = 2: accelerator {accelerator!r} does not set host threads" in (
        error
    )
    assert "leave it unset" in error


def test_the_builtin_accelerators_say_whether_they_set_threads() -> None:
    from core.executors.gpu import TorchGpuAccelerator
    from core_plugins.cpu.accelerator import CpuAccelerator
    from core_plugins.graphcore.accelerator import GraphcoreAccelerator
    from core_plugins.xla.accelerator import XlaAccelerator

    assert CpuAccelerator.applies_threads_per_replica and TorchGpuAccelerator.applies_threads_per_replica
    # PopTorch and torch-xla compute on their own runtimes' threads: --threads is refused there.
    assert not GraphcoreAccelerator.applies_threads_per_replica and not XlaAccelerator.applies_threads_per_replica


def test_threads_on_the_cpu_are_applied_and_recorded() -> None:
    import torch

    before = torch.get_num_threads()
    try:
        with registered_plugins():
            from core.api import run

            result = run("fcnn", "cpu", steps=1, warmup_steps=0, micro_batch_size=4, threads_per_replica=1, **TINY)
        assert result.status.ok, result.status
        assert result.environment is not None and result.environment.host_threads["intra_op_threads"] == 1
        assert result.devices[0].details["threads_per_replica"] == 1
    finally:
        torch.set_num_threads(before)


TINY = {"workload_options": TINY_FCNN, "power_meter": "none"}


def test_threads_on_a_gpu_are_applied_to_pytorch(monkeypatch: pytest.MonkeyPatch) -> None:
    """TorchGpuAccelerator (NVIDIA, AMD) sets PyTorch's threads in the placement's configure step,
    which the executor calls in the run's process; the GPU itself is not needed to see it."""
    import torch

    import core.executors.pytorch as pytorch_executors
    from core.base.distributed import SINGLE_PROCESS
    from core.executors.gpu import TorchGpuAccelerator

    class FakeGpu(TorchGpuAccelerator):
        name: ClassVar[str] = "fake-gpu"

        def availability(self) -> Availability:
            return Availability.yes()

        def visible_devices(self) -> list[DeviceRecord]:
            return [DeviceRecord(index=0, name="fake", kind=self.name)]

    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(pytorch_executors, "torch_executor", lambda model, config, placement, process: placement)
    monkeypatch.setattr(WidthWorkload, "build_torch", lambda self, options, seed: None, raising=False)
    before = torch.get_num_threads()
    try:
        for threads, expected in ((1, 1), (None, 2)):
            config = RunConfig(
                workload="widths", accelerator="fake-gpu", micro_batch_size=4, threads_per_replica=threads
            )
            placement = FakeGpu().executor_for(
                WidthWorkload(), RunContext(config, WidthOptions(), WidthOptions(), SINGLE_PROCESS)
            )
            torch.set_num_threads(2)
            recorded = placement.configure(config)
            assert torch.get_num_threads() == expected  # unset: PyTorch's own choice stands
            assert recorded.get("threads_per_replica") == threads
    finally:
        torch.set_num_threads(before)


def test_a_sweeps_run_line_without_a_phase_prints_none_of_it(capsys: pytest.CaptureFixture[str]) -> None:
    from core.cli import _SweepDisplay

    config = RunConfig(workload="fcnn", accelerator="cpu", micro_batch_size=4)
    result = RunResult.of_config(config, 1, status=Status(state=RunState.killed))

    class Cell:
        label = "micro_batch_size=4"

    _SweepDisplay().run_finished(Cell(), 0, result, 1.0)
    line = capsys.readouterr().out.strip()
    assert line == "micro_batch_size=4 repeat 1: killed (1.0 s)"
