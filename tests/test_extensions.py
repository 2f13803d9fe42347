"""Extension points (issue 27, item 6), exercised by a third party's plugin: tests/third_party/
core_fake_gaudi, an Intel Gaudi-like accelerator written against the docs alone.

- a plugin adds ``core`` sub-commands (core_register_commands) and report sections
  (core_report_sections);
- an accelerator names its torch.compile backend and acts after each micro-step's backward
  (TorchDeviceHooks.compile_backend, .after_backward);
- a run reads node meters beside its device meter, summed without counting anything twice and
  itemised (RunConfig.node_meters, PowerMeterFactory.includes / .node_includes);
- core.testing.run_on_cpu_as runs core's real PyTorch loop for a device type this host lacks.

And a plugin that raises in any of them breaks nothing but its own part.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from synthetic import synthetic_result

from core import ConfigError, hookimpl, make_config, run
from core.base.results import RunResult
from core.cli import _COMMANDS, build_parser, format_result, main
from core.contract.commands import BUILTIN_COMMANDS, Command
from core.contract.manager import PluginManager, PluginState
from core.energy.combined import Covers, device_meter_counted
from core.plugin import (
    Accelerator,
    Availability,
    DeviceRecord,
    EnergyMeasurement,
    Figure,
    Heading,
    Paragraph,
    PowerMeter,
    PowerMeterFactory,
    RunContext,
    Table,
    Value,
)
from core.report import write_report
from core.storage.store import ResultStore
from core.testing import TINY_FCNN, registered_plugins, run_on_cpu_as, run_tiny

ROOT = Path(__file__).resolve().parent.parent
THIRD_PARTY = Path(__file__).resolve().parent / "third_party"
sys.path.insert(0, str(THIRD_PARTY))

import core_fake_gaudi as gaudi  # noqa: E402  (a third party's package, on the path above)

TINY = {"workload_options": TINY_FCNN}


@pytest.fixture
def fake_gaudi() -> Iterator[PluginManager]:
    gaudi.reset_events()
    with registered_plugins(gaudi) as manager:
        yield manager


def installed(tmp_path: Path, module: str = "core_fake_gaudi", name: str = "fake-gaudi") -> dict[str, str]:
    """An environment in which ``module`` is an installed distribution with a ``core`` entry point:
    found by core through importlib.metadata, as pip would leave it."""
    info = tmp_path / f"{module}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module.replace('_', '-')}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[core]\n{name} = {module}\n")
    environment = {k: v for k, v in os.environ.items() if not k.startswith("CORE_")}
    environment["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(THIRD_PARTY), str(ROOT)])
    return environment


def core_cli(environment: dict[str, str], *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "core.cli", *arguments], capture_output=True, text=True, env=environment, timeout=600
    )


class _Plugin:
    """A plugin object with the hook implementations a test gives it (a module would do as well)."""

    def __init__(self, **hooks: Callable[..., Any]) -> None:
        for name, function in hooks.items():
            setattr(self, name, hookimpl(function))


# --- the whole plugin together: core.run on the CPU standing in for an HPU ------------------------------


def test_the_fake_gaudi_plugin_runs_cores_loop_with_its_compile_backend_step_marks_and_node_meter(
    fake_gaudi: PluginManager,
) -> None:
    with run_on_cpu_as("hpu") as cpu:
        result = run_tiny(
            "fcnn",
            "fake-gaudi",
            compile=True,
            gradient_accumulation=2,
            power_meter="fake-gaudi-power",
            node_meters="fake-gaudi-bmc",
        )
    # The plugin's placement and hooks, in core's own loop:
    assert cpu.placed == ["hpu:0"] and result.executor_details["device"] == "cpu"
    assert cpu.compile_backends == ["hpu_backend"] and cpu.graphs_compiled >= 1
    assert result.executor_details["compile"] is True and result.executor_details["compile_backend"] == "hpu_backend"
    updates = 1 + 1 + 2  # first step, one warm-up step, two in the window
    assert gaudi.EVENTS["mark_step"] == updates * 2  # after each micro-step's backward
    assert gaudi.EVENTS["model_placed"] == 1 and gaudi.EVENTS["cut_graph"] >= updates
    # The node meter includes the devices: the run's energy is its figure, the devices' inside it.
    assert result.energy_joules == gaudi.BMC_JOULES
    energy = result.energy
    assert energy is not None and energy.meter == "fake-gaudi-power + fake-gaudi-bmc"
    device, node = energy.meters
    assert (device.meter, device.role, device.counted, device.energy_joules) == (
        "fake-gaudi-power",
        "device",
        False,
        gaudi.DEVICE_JOULES,
    )
    assert (node.meter, node.role, node.counted, node.energy_joules) == ("fake-gaudi-bmc", "node", True, 100.0)
    assert node.includes == ["devices", "cpu", "dram", "fans"]
    assert energy.components_joules == {"hpu0": gaudi.DEVICE_JOULES}  # the devices' own figures stay
    assert RunResult.model_validate_json(result.to_json()).energy == energy


def test_an_inference_run_compiles_with_the_devices_backend_and_marks_no_backward(fake_gaudi: PluginManager) -> None:
    with run_on_cpu_as("hpu") as cpu:
        result = run_tiny("fcnn", "fake-gaudi", mode="inference", compile=True)
    assert cpu.compile_backends == ["hpu_backend"] and result.executor_details["compile_backend"] == "hpu_backend"
    assert gaudi.EVENTS["mark_step"] == 0


def test_without_the_stand_in_an_hpu_placement_is_not_silently_run_on_the_cpu(fake_gaudi: PluginManager) -> None:
    with run_on_cpu_as("hpu"):
        pass
    result = run("fcnn", "fake-gaudi", steps=1, warmup_steps=0, micro_batch_size=4, power_meter="none", **TINY)
    assert result.status.state.value == "error" and result.status.phase == "setup"


@pytest.mark.parametrize("device_type", ["", "cpu", "hpu:0", 3])
def test_run_on_cpu_as_takes_a_device_type(device_type: Any) -> None:
    with pytest.raises(ValueError, match="device type"):
        with run_on_cpu_as(device_type):
            pass


# --- TorchDeviceHooks: compile backend and after_backward --------------------------------------------


def test_after_backward_costs_nothing_where_a_device_does_not_override_it() -> None:
    from core.executors.pytorch import TorchDeviceHooks, overridden_after_backward

    class Marks(TorchDeviceHooks):
        def after_backward(self) -> None:
            pass

    assert overridden_after_backward(TorchDeviceHooks()) is None
    assert overridden_after_backward(Marks()) is not None
    on_the_instance = TorchDeviceHooks()
    on_the_instance.after_backward = lambda: None  # type: ignore[method-assign]
    assert overridden_after_backward(on_the_instance) is on_the_instance.after_backward
    assert TorchDeviceHooks.compile_backend == "inductor"  # torch.compile's own default


class _CpuWithHooks(Accelerator):
    """The host CPU through core's executor, with the hooks a test gives it."""

    name = "cpu-with-hooks"
    hooks_factory: Callable[[], Any] = staticmethod(lambda: None)

    def availability(self) -> Availability:
        return Availability.yes()

    def precisions(self, framework: Any) -> tuple[Any, ...]:
        from core.plugin import Precision

        return (Precision.fp32,)

    def max_replicas(self, config: Any) -> int:
        return 1

    def devices(self) -> list[DeviceRecord]:
        return [DeviceRecord(index=0, name="cpu", kind=self.name)]

    def executor_for(self, workload: Any, context: RunContext) -> Any:
        from core.plugin import TorchPlacement, torch_executor

        placement = TorchPlacement(device="cpu", hooks=type(self).hooks_factory())
        spec = workload.build_torch(context.workload_options, context.config.seed)
        return torch_executor(spec, context.config, placement, context.process)


def _accelerator_with(hooks: Callable[[], Any]) -> _CpuWithHooks:
    return type("CpuWithTheseHooks", (_CpuWithHooks,), {"hooks_factory": staticmethod(hooks)})()


def test_an_after_backward_that_raises_fails_that_run_in_its_phase_and_no_other() -> None:
    from core.plugin import TorchDeviceHooks

    class Broken(TorchDeviceHooks):
        def after_backward(self) -> None:
            raise RuntimeError("mark_step lost the device")

    with registered_plugins():
        failed = run("fcnn", _accelerator_with(Broken), steps=1, warmup_steps=0, micro_batch_size=4, **TINY)
        assert failed.status.state.value == "error" and failed.status.phase == "first_step"
        assert "mark_step lost the device" in (failed.status.message or "")
        assert failed.setup_seconds is not None  # what was measured before stays
        assert run_tiny("fcnn", "cpu").status.ok


def test_a_compile_backend_this_host_lacks_is_an_error_not_a_silent_eager_run() -> None:
    from core.plugin import TorchDeviceHooks

    class Unknown(TorchDeviceHooks):
        compile_backend = "no_such_backend"

    with registered_plugins():
        result = run(
            "fcnn", _accelerator_with(Unknown), compile=True, steps=1, warmup_steps=0, micro_batch_size=4, **TINY
        )
    assert not result.status.ok and "no_such_backend" in (result.status.message or "")


# --- node meters ------------------------------------------------------------------------------------


def test_a_node_meter_without_the_devices_is_added_to_the_device_meter(fake_gaudi: PluginManager) -> None:
    with run_on_cpu_as("hpu"):
        result = run_tiny("fcnn", "fake-gaudi", power_meter="fake-gaudi-power", node_meters="fake-gaudi-host")
    assert result.energy_joules == gaudi.DEVICE_JOULES + gaudi.HOST_JOULES
    assert [(item.meter, item.counted) for item in result.energy.meters] == [  # type: ignore[union-attr]
        ("fake-gaudi-power", True),
        ("fake-gaudi-host", True),
    ]
    assert result.samples_per_watt_hour == result.window_samples / ((40.0 + 25.0) / 3600.0)


@pytest.mark.parametrize(
    ("node_meters", "allowed"),
    [
        ("fake-gaudi-bmc,fake-gaudi-host", "both include cpu, dram"),
        ("no-such-meter", "no registered power meter; registered: "),
        ("fake-gaudi-power", "is the run's device meter already"),
        ("rapl-or-not,fake-gaudi-bmc", "no registered power meter"),
    ],
)
def test_node_meters_that_would_count_twice_or_do_not_exist_are_refused_before_the_run(
    fake_gaudi: PluginManager, node_meters: str, allowed: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        run("fcnn", "fake-gaudi", power_meter="fake-gaudi-power", node_meters=node_meters, **TINY)
    assert raised.value.field == "node_meters" and raised.value.value == node_meters
    assert allowed in str(raised.value)


class _Meter(PowerMeterFactory):
    """A node meter a test shapes: what it includes, whether it is available, what it raises."""

    name = "test-node"
    node_includes: Any = ("cpu",)
    available = True
    raises_in = ""

    def reads(self, accelerator_name: str) -> bool:
        return False

    def availability(self) -> Availability:
        return Availability.yes() if self.available else Availability.no("its sensor is unplugged")

    def meter_for(self, devices: list[DeviceRecord], context: RunContext) -> PowerMeter:
        if self.raises_in == "meter_for":
            raise OSError("no IPMI device")
        outer = self

        class Reading(PowerMeter):
            name = "test-node"

            def start(self) -> None:
                if outer.raises_in == "start":
                    raise OSError("BMC busy")

            def stop(self) -> EnergyMeasurement:
                if outer.raises_in == "stop":
                    raise OSError("BMC gone")
                if outer.raises_in == "nonsense":
                    return 12.0  # type: ignore[return-value]
                return EnergyMeasurement(meter="test-node", method="sampled", energy_joules=7.0)

        return Reading()


def _meter_plugin(**attributes: Any) -> Any:
    factory = type("ShapedMeter", (_Meter,), attributes)()
    return _Plugin(core_register_power_meters=lambda register: register(factory))


@pytest.mark.parametrize(
    ("attributes", "allowed"),
    [
        ({"node_includes": ()}, "does not declare what it includes (node_includes)"),
        ({"node_includes": ["cpu"]}, "does not declare what it includes"),
        ({"node_includes": ("cpu", "")}, "does not declare what it includes"),
        ({"available": False}, "not available here: its sensor is unplugged"),
    ],
)
def test_a_node_meter_must_declare_what_it_includes_and_be_available(attributes: dict[str, Any], allowed: str) -> None:
    with registered_plugins(gaudi, _meter_plugin(**attributes)):
        with pytest.raises(ConfigError, match="node_meters") as raised:
            run("fcnn", "fake-gaudi", power_meter="fake-gaudi-power", node_meters="test-node", **TINY)
    assert allowed in str(raised.value)


@pytest.mark.parametrize("raises_in", ["meter_for", "start", "stop", "nonsense"])
def test_a_node_meter_that_fails_costs_the_total_not_the_run_nor_the_devices_figure(raises_in: str) -> None:
    with registered_plugins(gaudi, _meter_plugin(raises_in=raises_in)), run_on_cpu_as("hpu"):
        result = run_tiny("fcnn", "fake-gaudi", power_meter="fake-gaudi-power", node_meters="test-node")
    assert result.status.ok and result.throughput_per_second
    assert result.energy_joules is None and result.samples_per_watt_hour is None
    assert "node meter 'test-node'" in (result.energy_unavailable_reason or "")
    device, node = result.energy.meters  # type: ignore[union-attr]
    assert device.energy_joules == gaudi.DEVICE_JOULES and node.energy_joules is None and node.unavailable_reason


def test_without_a_device_meter_the_total_needs_a_node_meter_that_includes_the_devices(
    fake_gaudi: PluginManager,
) -> None:
    with run_on_cpu_as("hpu"):
        host_only = run_tiny("fcnn", "fake-gaudi", power_meter="none", node_meters="fake-gaudi-host")
        whole_node = run_tiny("fcnn", "fake-gaudi", power_meter="none", node_meters="fake-gaudi-bmc")
    assert host_only.energy_joules is None and "the devices were not measured" in str(
        host_only.energy_unavailable_reason
    )
    assert host_only.energy.meters[0].energy_joules == gaudi.HOST_JOULES  # type: ignore[union-attr]
    assert any("energy_joules will be null" in warning for warning in host_only.warnings)
    assert whole_node.energy_joules == gaudi.BMC_JOULES


def test_a_partial_overlap_with_the_device_meter_is_refused_and_a_whole_one_holds_it() -> None:
    rapl_on_a_cpu = Covers("rapl", "device", ("devices", "cpu", "dram"))
    assert device_meter_counted(rapl_on_a_cpu, [Covers("bmc", "node", ("devices", "cpu", "dram", "fans"))]) is False
    assert device_meter_counted(Covers("nvml", "device", ("devices",)), [Covers("rapl", "node", ("cpu", "dram"))])
    with pytest.raises(ValueError, match="includes cpu of what device meter 'rapl' measures"):
        device_meter_counted(rapl_on_a_cpu, [Covers("cpu-only", "node", ("cpu",))])


def test_rapl_declares_what_it_includes_as_device_and_as_node_meter() -> None:
    from core_plugins.cpu.rapl import RaplMeterFactory

    assert RaplMeterFactory.includes == ("devices", "cpu", "dram")
    assert RaplMeterFactory.node_includes == ("cpu", "dram")


@pytest.mark.parametrize(
    ("value", "stored"),
    [("", ""), ("a", "a"), (" a , b ", "a,b"), ("b,a", "b,a"), (["b", "a"], "b,a"), (("a",), "a"), ("  ", "")],
)
def test_node_meters_has_one_spelling(value: Any, stored: str) -> None:
    config = make_config(workload="fcnn", accelerator="cpu", node_meters=value)
    assert config.node_meters == stored and config.node_meter_names == (tuple(stored.split(",")) if stored else ())


@pytest.mark.parametrize("value", ["a,,b", "a,", "a,a", "x,auto", "x,none", 3, True, ["a", 1], None])
def test_node_meters_refuses_what_names_no_meter_once(value: Any) -> None:
    with pytest.raises(ConfigError) as raised:
        make_config(workload="fcnn", accelerator="cpu", node_meters=value)
    assert raised.value.field == "node_meters"


def test_core_run_takes_node_meters_and_prints_each_meter(fake_gaudi: PluginManager) -> None:
    args = build_parser().parse_args(["run", "fcnn", "--node-meters", "fake-gaudi-bmc"])
    assert args.node_meters == "fake-gaudi-bmc"
    with run_on_cpu_as("hpu"):
        result = run_tiny("fcnn", "fake-gaudi", power_meter="fake-gaudi-power", node_meters="fake-gaudi-bmc")
    text = format_result(result)
    assert "device meter    fake-gaudi-power (devices): 40 J" in text and "(not added)" in text
    assert "node meter      fake-gaudi-bmc (devices, cpu, dram, fans): 100 J" in text


def test_a_dry_run_names_the_node_meters(fake_gaudi: PluginManager, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "fcnn", "--accelerator", "fake-gaudi", "--node-meters", "fake-gaudi-bmc", "--dry-run"])
    assert code == 0 and "node meters" in capsys.readouterr().out


# --- CLI commands ------------------------------------------------------------------------------------


def test_core_knows_its_own_commands() -> None:
    assert set(_COMMANDS) == BUILTIN_COMMANDS


def test_a_plugin_command_runs_through_core(fake_gaudi: PluginManager, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gaudi-info", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"accelerator": "fake-gaudi", "devices": 1}
    assert fake_gaudi.commands["gaudi-info"].plugin == "core_fake_gaudi"
    assert "gaudi-info" in build_parser().format_help()


def _command_plugin(command: Command) -> Any:
    return _Plugin(core_register_commands=lambda register: register(command))


@pytest.mark.parametrize(
    ("command", "error"),
    [
        (Command("run", "mine", lambda args: 0), "'run' is a built-in command of core"),
        (Command("Gaudi Info", "x", lambda args: 0), "is not lower-case letters"),
        (Command("-x", "x", lambda args: 0), "is not lower-case letters"),
        (Command("ok-name", "x", "not callable"), "run is not callable"),  # type: ignore[arg-type]
        (Command("ok-name", 3, lambda args: 0), "help is int, not text"),  # type: ignore[arg-type]
        ("gaudi-info", "expected a Command instance"),
    ],
)
def test_a_bad_command_fails_its_plugin_only(command: Any, error: str) -> None:
    manager = PluginManager()
    record = manager.register_plugin(_command_plugin(command), name="bad-commands")
    assert record.state is PluginState.failed and error in (record.error or "")
    assert not manager.commands


def test_two_plugins_cannot_register_one_command_name(fake_gaudi: PluginManager) -> None:
    record = fake_gaudi.register_plugin(_command_plugin(Command("gaudi-info", "mine", lambda a: 0)), name="second")
    assert record.state is PluginState.failed and "already registered by plugin 'core_fake_gaudi'" in str(record.error)


def _raises(*_: Any) -> Any:
    raise RuntimeError("the SDK is missing")


@pytest.mark.parametrize(
    "command",
    [
        Command("broken", "x", lambda args: 0, add_arguments=_raises),
        Command("broken", "x", lambda args: 0, add_arguments=lambda parser: parser.add_argument("--debug")),
    ],
    ids=["add_arguments raises", "redefines --debug"],
)
def test_a_command_that_cannot_be_set_up_breaks_no_other_command(
    command: Command, capsys: pytest.CaptureFixture[str]
) -> None:
    with registered_plugins(gaudi, _command_plugin(command), entry_points=False):
        assert "broken" in build_parser().format_help()
        assert main(["gaudi-info"]) == 0
        assert main(["broken", "--anything"]) == 1
    err = capsys.readouterr().err
    assert "command 'broken' cannot run" in err and "_Plugin" in err


@pytest.mark.parametrize(
    ("outcome", "code", "message"),
    [
        (_raises, 1, "plugin '_Plugin' raised in command 'mine'"),
        (lambda args: "done", 1, "returned 'done', not an exit status"),
        (lambda args: 256, 1, "not an exit status"),
        (lambda args: True, 1, "not an exit status"),
        (lambda args: 3, 3, ""),
        (lambda args: None, 0, ""),
    ],
)
def test_what_a_plugin_command_returns_or_raises_is_its_exit_status(
    outcome: Callable[..., Any], code: int, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with registered_plugins(_command_plugin(Command("mine", "x", outcome)), entry_points=False):
        assert main(["mine"]) == code
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_what_a_plugin_command_names_cannot_break_core_help_nor_reach_another_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def positional(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("command")  # the top level's own dest

    command = Command("pct", "100% of the %(prog)s devices", lambda args: 7, add_arguments=positional)
    with registered_plugins(_command_plugin(command)):
        assert "100% of the %(prog)s devices" in build_parser().format_help()
        assert main(["pct", "run"]) == 7  # the plugin's command, not `core run`


def test_a_command_refusing_its_input_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    def refuses(args: argparse.Namespace) -> int:
        raise ConfigError("device", "hpu9", "hpu0 to hpu7")

    with registered_plugins(_command_plugin(Command("mine", "x", refuses)), entry_points=False):
        assert main(["mine"]) == 2
    assert "hpu9" in capsys.readouterr().err


def test_a_registration_hook_that_raises_fails_its_plugin_and_core_goes_on(capsys: pytest.CaptureFixture[str]) -> None:
    with registered_plugins(_Plugin(core_register_commands=_raises)) as manager:
        assert main(["workloads"]) == 0
        failed = [record for record in manager.plugins.values() if record.state is PluginState.failed]
    assert [record.name for record in failed] == ["_Plugin"] and "the SDK is missing" in str(failed[0].error)


@pytest.mark.slow
def test_an_installed_plugins_command_runs_and_core_help_stays_light(tmp_path: Path) -> None:
    environment = installed(tmp_path)
    completed = core_cli(environment, "gaudi-info", "--json")
    assert completed.returncode == 0, completed.stderr
    assert json.loads(completed.stdout)["accelerator"] == "fake-gaudi"
    heavy = ("torch", "tensorflow", "numpy", "matplotlib")
    code = (
        "import sys\nfrom core.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        f"print('LOADED', [m for m in {heavy!r} if m in sys.modules])"
    )
    helped = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment, timeout=300)
    assert "gaudi-info" in helped.stdout and "LOADED []" in helped.stdout, helped.stdout + helped.stderr
    listed = json.loads(core_cli(environment, "plugins", "--json").stdout)
    plugin = next(row for row in listed if row["name"] == "fake-gaudi")
    assert plugin["registers"]["commands"] == [{"name": "gaudi-info"}]
    assert "core_register_commands" in plugin["hooks"] and "core_report_sections" in plugin["hooks"]


# --- report sections ---------------------------------------------------------------------------------


@pytest.fixture
def database(tmp_path: Path) -> Path:
    path = tmp_path / "results.db"
    with ResultStore(path) as store:
        for index, accelerator in enumerate(("cpu", "fake-gaudi", "fake-gaudi")):
            store.add(
                synthetic_result(accelerator=accelerator, micro_batch_size=8 * (index + 1)),
                sweep="s",
                cell_key=f"c{index}",
                repeat=0,
            )
    return path


def test_a_plugin_adds_a_report_section(fake_gaudi: PluginManager, database: Path, tmp_path: Path) -> None:
    files = write_report(database, tmp_path / "report")
    markdown = files.markdown.read_text(encoding="utf-8")
    assert "## Gaudi runs" in markdown and "2 of the 3 runs in this report ran on a Gaudi." in markdown
    assert markdown.index("## Gaudi runs") > markdown.index("## Sweep s")  # after core's own sections
    html = files.html.read_text(encoding="utf-8")
    assert re.search(r'<h2 id="[\w-]+">Gaudi runs</h2>', html) and 'id="gaudi-runs"' in html
    assert not files.warnings


def test_a_plugins_report_section_sees_the_single_runs_too(
    fake_gaudi: PluginManager, database: Path, tmp_path: Path
) -> None:
    # `core run --database` stores a run of no sweep; the report shows it, so the hook's runs hold it
    # ("every run the report covers"): it saw only the sweeps' runs.
    with ResultStore(database) as store:
        store.add(synthetic_result(accelerator="fake-gaudi", micro_batch_size=4))
    markdown = write_report(database, tmp_path / "report").markdown.read_text(encoding="utf-8")
    assert "3 of the 4 runs in this report ran on a Gaudi." in markdown


def _sections(*sections: tuple[str, Sequence[Any]], then_raise: bool = False) -> Any:
    def core_report_sections(runs: Sequence[RunResult], add_section: Callable[[str, Sequence[Any]], None]) -> None:
        for title, blocks in sections:
            add_section(title, blocks)
        if then_raise:
            raise RuntimeError("lost the thread")

    return _Plugin(core_report_sections=core_report_sections)


PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 16


@pytest.mark.parametrize(
    "bad",
    [
        _sections(("Good first", [Paragraph("kept?")]), then_raise=True),
        _sections(("Bad", ["a bare string"])),
        _sections(("Bad", "not a list")),
        _sections(("", [Paragraph("no title")])),
        _sections(("Bad", [Heading(2, "as high as core's")])),
        _sections(("Bad", [Table([("a", "A")], [[Value("1"), Value("2")]])])),
        _sections(("Bad", [Table([("a", "A")], [[Value("x", float("nan"))]])])),
        _sections(("Bad", [Figure("../escape.png", PNG, "caption")])),
        _sections(("Bad", [Paragraph(3)])),  # type: ignore[arg-type]
        _sections(("Bad", [Figure("a" * 110 + ".png", PNG, "too long once prefixed")])),
        _sections(("Bad", [Figure("plot.png", PNG, "one"), Figure("PLOT.png", PNG, "the same file")])),
        _Plugin(core_report_sections=lambda runs, add_section: [Paragraph("returned, not added")]),
    ],
    ids=[
        "raises after adding",
        "str block",
        "str blocks",
        "empty title",
        "level 2",
        "ragged",
        "nan",
        "path",
        "int",
        "long name",
        "same file",
        "returns",
    ],
)
def test_a_faulty_report_section_is_left_out_and_the_rest_is_written(
    bad: Any, fake_gaudi: PluginManager, database: Path, tmp_path: Path
) -> None:
    fake_gaudi.register_plugin(bad, name="faulty-sections")
    files = write_report(database, tmp_path / "report")
    markdown = files.markdown.read_text(encoding="utf-8")
    assert "## Gaudi runs" in markdown and "## Sweep s" in markdown
    assert "Good first" not in markdown and "kept?" not in markdown  # a plugin's sections, all or none
    assert "## Plugin sections left out" in markdown and "faulty-sections" in markdown
    assert any("faulty-sections" in warning for warning in files.warnings)


def test_plugin_figures_get_file_names_of_their_own(fake_gaudi: PluginManager, database: Path, tmp_path: Path) -> None:
    fake_gaudi.register_plugin(_sections(("One", [Figure("plot.png", PNG, "first")])), name="first")
    fake_gaudi.register_plugin(_sections(("Two", [Figure("plot.png", PNG, "second")])), name="second")
    files = write_report(database, tmp_path / "report")
    ours = [path.name for path in files.plots if path.name.endswith("-plot.png")]
    assert len(ours) == 2 and len(set(ours)) == 2 and all(name.startswith("plugin-") for name in ours)


def test_report_section_blocks_are_escaped_like_the_rest(
    fake_gaudi: PluginManager, database: Path, tmp_path: Path
) -> None:
    fake_gaudi.register_plugin(_sections(("<script>x</script>", [Paragraph("<b>|`")])), name="hostile")
    files = write_report(database, tmp_path / "report")
    html = files.html.read_text(encoding="utf-8")
    assert "<script>x" not in html and "&lt;script&gt;" in html and "<b>|" not in html


@pytest.mark.slow
def test_core_report_shows_an_installed_plugins_section(tmp_path: Path, database: Path) -> None:
    completed = core_cli(installed(tmp_path), "report", str(database), "--output", str(tmp_path / "out"))
    assert completed.returncode == 0, completed.stderr
    assert "## Gaudi runs" in (tmp_path / "out" / "report.md").read_text(encoding="utf-8")


def test_a_sweep_cell_has_one_spelling_of_its_node_meters() -> None:
    from core.sweep.plan import expand_cells
    from core.sweep.spec import make_sweep_spec

    shared = make_sweep_spec({"name": "s", "grid": {"workload": "fcnn", "node_meters": "rapl, bmc"}})
    assert [cell.options["node_meters"] for cell in expand_cells(shared)] == ["bmc,rapl"]
    with pytest.raises(ConfigError, match="node_meters"):
        make_sweep_spec({"name": "s", "grid": {"workload": "fcnn", "node_meters": ["rapl,bmc", "bmc, rapl"]}})


def test_a_toy_sweep_reads_no_node_meters() -> None:
    from core.sweep.toy import toy_cell_options

    with registered_plugins() as manager:
        assert toy_cell_options({"workload": "fcnn", "node_meters": "rapl"}, manager)["node_meters"] == ""
