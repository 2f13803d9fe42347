"""Plugin loading: entry points, validation, failure isolation, allow/block switches."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest

from core import (
    Accelerator,
    Availability,
    DeviceRecord,
    PowerMeter,
    PowerMeterFactory,
    UnavailableMeter,
    Workload,
    hookimpl,
)
from core.contract.context import RunContext
from core.contract.manager import PluginManager, PluginState
from core.workloads.fcnn import Fcnn

HEAVY_MODULES = ("torch", "tensorflow", "pynvml", "amdsmi", "poptorch", "gcipuinfo", "torch_xla")


def core_cli(
    *arguments: str, env: dict[str, str] | None = None, check_light: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run the CLI in a fresh interpreter; optionally assert it imported no framework or SDK."""
    code = "import sys; from core.cli import main; rc = main(sys.argv[1:]); "
    if check_light:
        code += f"heavy = [m for m in {HEAVY_MODULES!r} if m in sys.modules]; assert not heavy, heavy; "
    code += "sys.exit(rc)"
    return subprocess.run(
        [sys.executable, "-c", code, *arguments],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=600,
    )


def test_plugins_json_lists_every_vendor_with_availability() -> None:
    completed = core_cli("plugins", "--json", check_light=True)
    assert completed.returncode == 0, completed.stderr
    rows = {row["name"]: row for row in json.loads(completed.stdout)}
    assert {"cpu", "nvidia", "amd", "graphcore", "workloads"} <= set(rows)
    accelerators = {entry["name"]: entry for row in rows.values() for entry in row["registers"].get("accelerators", [])}
    assert accelerators["cpu"]["available"] is True
    for vendor in ("nvidia", "amd", "graphcore"):
        assert accelerators[vendor]["available"] is False and accelerators[vendor]["reason"]
    # The dev extra installs nvidia-ml-py (tests/simnvml.py drives it); then the missing GPU is the reason.
    nvidia_hint = "no /dev/nvidia*" if importlib.util.find_spec("pynvml") else "pip install 'core[nvidia]'"
    assert nvidia_hint in accelerators["nvidia"]["reason"]
    assert "Poplar SDK" in accelerators["graphcore"]["reason"]
    assert rows["cpu"]["version"] and rows["cpu"]["state"] == "loaded"
    assert "core_register_accelerators" in rows["cpu"]["hooks"]


def test_help_imports_nothing_heavy() -> None:
    completed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from core.cli import main\ntry: main(['--help'])\nexcept SystemExit: pass\n"
            f"heavy = [m for m in {HEAVY_MODULES!r} if m in sys.modules]; assert not heavy, heavy",
        ],
        capture_output=True,
        text=True,
    )
    assert completed.returncode == 0, completed.stderr
    assert "run" in completed.stdout and "plugins" in completed.stdout


def make_distribution(root: Path, name: str, module_source: str) -> None:
    """A real installed distribution on sys.path: a module and a dist-info with a `core` entry point."""
    (root / f"{name}.py").write_text(module_source)
    info = root / f"{name}-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.2.3\n")
    (info / "entry_points.txt").write_text(f"[core]\n{name} = {name}\n")


@pytest.mark.slow
def test_a_plugin_that_raises_on_import_is_reported_and_the_rest_work(tmp_path: Path) -> None:
    make_distribution(tmp_path, "broken_plugin", "raise RuntimeError('vendor library exploded')\n")
    env = {"PYTHONPATH": str(tmp_path)}
    listing = core_cli("plugins", "--json", env=env)
    assert listing.returncode == 0, listing.stderr
    rows = {row["name"]: row for row in json.loads(listing.stdout)}
    assert rows["broken_plugin"]["state"] == "failed"
    assert (
        rows["broken_plugin"]["error"]
        == 'Error importing plugin "broken_plugin": RuntimeError: vendor library exploded'
    )
    assert rows["broken_plugin"]["version"] == "1.2.3"
    assert rows["cpu"]["state"] == "loaded"
    text = core_cli("plugins", env=env)
    assert "vendor library exploded" in text.stdout
    ran = core_cli(
        "run",
        "fcnn",
        "--accelerator",
        "cpu",
        "--steps",
        "2",
        "--warmup-steps",
        "0",
        "-o",
        "hidden_width=16",
        "--json",
        env=env,
    )
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["status"]["state"] == "ok"


class MisspelledHook:
    @hookimpl
    def core_register_acelerators(self, register: Any) -> None:  # typo on purpose
        pass


class WrongType:
    @hookimpl
    def core_register_workloads(self, register: Callable[[Workload], None]) -> None:
        register("not a workload")  # type: ignore[arg-type]


class DuplicateWorkload:
    """Registers a fresh name, then a name the built-ins already took: nothing may stay registered."""

    @hookimpl
    def core_register_workloads(self, register: Callable[[Workload], None]) -> None:
        class Other(Fcnn):
            name: ClassVar[str] = "other-fcnn"

        register(Other())
        register(Fcnn())


class RaisesInHook:
    @hookimpl
    def core_register_accelerators(self, register: Callable[[Accelerator], None]) -> None:
        raise ImportError("libvendor.so: cannot open shared object file")


@pytest.fixture
def manager() -> PluginManager:
    manager = PluginManager()
    manager.load_entry_points()
    return manager


@pytest.mark.parametrize(
    "plugin,message",
    [
        (MisspelledHook(), "unknown hook 'core_register_acelerators'"),
        (WrongType(), "expected a Workload instance, got str"),
        (DuplicateWorkload(), "Workload 'fcnn' is already registered by built-in plugin 'workloads'"),
        (RaisesInHook(), "ImportError: libvendor.so"),
    ],
)
def test_bad_plugins_fail_alone(manager: PluginManager, plugin: object, message: str) -> None:
    record = manager.register_plugin(plugin, name="bad")
    assert record.state is PluginState.failed and message in (record.error or ""), record.error
    assert "other-fcnn" not in manager.workloads
    assert manager._pluggy.get_plugin("bad") is None  # unregistered: its hooks no longer fire
    assert manager.workloads["fcnn"].plugin == "workloads"
    assert manager.accelerators["cpu"].plugin == "cpu"


def names_in_state(env: dict[str, str], state: str) -> set[str]:
    completed = core_cli("plugins", "--json", env=env)
    assert completed.returncode == 0, completed.stderr
    return {row["name"] for row in json.loads(completed.stdout) if row["state"] == state}


def test_block_allow_and_autoload_switches() -> None:
    assert {"nvidia", "amd"} <= names_in_state({"CORE_DISABLE_PLUGINS": "nvidia,amd"}, "blocked")
    assert names_in_state({"CORE_PLUGINS": "cpu,workloads"}, "loaded") == {"cpu", "workloads"}
    no_autoload = {"CORE_DISABLE_PLUGIN_AUTOLOAD": "1"}
    assert names_in_state(no_autoload, "loaded") == set()
    assert names_in_state({**no_autoload, "CORE_PLUGINS": "workloads"}, "loaded") == {"workloads"}


def test_a_second_plugin_under_a_taken_name_is_reported_not_swapped_in(manager: PluginManager) -> None:
    record = manager.register_plugin(RaisesInHook(), name="cpu")
    assert record.state is PluginState.failed and "the name is taken" in (record.error or "")
    assert manager.plugins["cpu"].state is PluginState.loaded
    assert manager.accelerators["cpu"].plugin == "cpu"


def test_registering_an_installed_plugin_again_is_harmless() -> None:
    import core_plugins.cpu
    from core.testing import registered_plugins

    with registered_plugins(core_plugins.cpu) as manager:
        assert manager.plugins["cpu"].state is PluginState.loaded
        assert not [r for r in manager.plugins.values() if r.state is PluginState.failed]


# --- what a plugin declares: the accelerators its meters read, the packages a result records ----


class DeclaredMeter(PowerMeterFactory):
    name: ClassVar[str] = "declared"
    accelerators: ClassVar[tuple[str, ...]] = ("cpu", "third-party-gpu")

    def availability(self) -> Availability:
        return Availability.yes()

    def meter_for(self, devices: list[DeviceRecord], context: RunContext) -> PowerMeter:
        return UnavailableMeter(self.name, "declared, not measuring")


class MeterPlugin:
    def __init__(self, *meters: PowerMeterFactory) -> None:
        self.meters = meters

    @hookimpl
    def core_register_power_meters(self, register: Callable[[PowerMeterFactory], None]) -> None:
        for meter in self.meters:
            register(meter)


def _meter(declared: Any, name: str = "bad-meter") -> PowerMeterFactory:
    return type("BadMeter", (DeclaredMeter,), {"name": name, "accelerators": declared})()


def test_a_meter_reads_the_accelerators_it_declares(manager: PluginManager) -> None:
    record = manager.register_plugin(MeterPlugin(DeclaredMeter()), name="meters")
    assert record.state is PluginState.loaded, record.error
    assert [m.name for m in manager.meters_reading("third-party-gpu")] == ["declared"]
    assert "declared" in [m.name for m in manager.meters_reading("cpu")]  # beside RAPL
    # NVML first (what `auto` picks), then the Grace Hopper module meter, asked for by name.
    assert manager.meters_reading("nvidia") == [manager.power_meters[name].item for name in ("nvml", "gh-module")]
    assert manager.meters_reading("cp") == [] and manager.meters_reading("CPU") == []  # names, not substrings
    # Each built-in meter declares the one accelerator it reads.
    assert {name: manager.power_meters[name].item.accelerators for name in ("nvml", "amdsmi", "rapl")} == {
        "nvml": ("nvidia",),
        "amdsmi": ("amd",),
        "rapl": ("cpu",),
    }


def test_a_meter_may_declare_what_it_reads_per_instance(manager: PluginManager) -> None:
    class Configurable(DeclaredMeter):
        name: ClassVar[str] = "configurable"
        accelerators: ClassVar[tuple[str, ...]] = ()

        def __init__(self, accelerators: tuple[str, ...]) -> None:
            self.accelerators = accelerators  # type: ignore[misc]

    record = manager.register_plugin(MeterPlugin(Configurable(("amd",))), name="meters")
    assert record.state is PluginState.loaded, record.error
    assert [m.name for m in manager.meters_reading("amd")] == ["amdsmi", "configurable"]


@pytest.mark.parametrize(
    "declared,says",
    [
        ((), "declares neither accelerators (core 0.2) nor reads"),
        ("cpu", "accelerators must be a tuple of accelerator names, e.g. ('nvidia',), not 'cpu'"),  # not c, p, u
        (["cpu"], "must be a tuple of accelerator names"),
        (("cpu", ""), "must be a tuple of accelerator names"),
        (("cpu", 3), "must be a tuple of accelerator names"),
    ],
)
def test_a_meter_that_declares_no_accelerators_is_refused(manager: PluginManager, declared: Any, says: str) -> None:
    record = manager.register_plugin(MeterPlugin(DeclaredMeter(), _meter(declared)), name="meters")
    assert record.state is PluginState.failed and says in (record.error or ""), record.error
    assert "declared" not in manager.power_meters


def test_a_meter_named_for_a_run_it_does_not_declare_is_refused() -> None:
    from core import ConfigError, make_config
    from core.testing import registered_plugins

    with registered_plugins(MeterPlugin(_meter(("nvidia",), name="gpu-only"))) as manager:
        config = make_config(workload="fcnn", accelerator="cpu", power_meter="gpu-only")
        with pytest.raises(ConfigError, match="meter 'gpu-only' does not read accelerator 'cpu'; allowed: auto, none"):
            manager.power_meter_factory(manager.accelerator("cpu"), config)


class PackagesPlugin:
    def __init__(self, *names: object) -> None:
        self.names = names

    @hookimpl
    def core_register_packages(self, register: Callable[[str], None]) -> None:
        for name in self.names:
            register(name)  # type: ignore[arg-type]


def test_each_vendor_registers_its_sdk_packages(manager: PluginManager) -> None:
    assert {name: manager.packages[name].plugin for name in manager.packages} == {
        "nvidia-ml-py": "nvidia",
        "amdsmi": "amd",
        "poptorch": "graphcore",
        "torch-xla": "xla",
    }


def test_a_result_records_the_packages_the_plugins_register() -> None:
    from core.testing import registered_plugins, run_tiny

    with registered_plugins(PackagesPlugin("pytest", "Not_Installed.Anywhere")):
        libraries = run_tiny("fcnn", "cpu").environment.library_versions  # type: ignore[union-attr]
    assert libraries["pytest"] == pytest.__version__  # a plugin's package, found without importing it
    assert "torch" in libraries and "pydantic" in libraries  # core's own
    assert not {"Not_Installed.Anywhere", "not-installed-anywhere"} & set(libraries)  # not installed: left out


def test_two_plugins_may_register_one_package(manager: PluginManager) -> None:
    first = manager.register_plugin(PackagesPlugin("pytest", "PyTest", "py_test"), name="first")
    second = manager.register_plugin(PackagesPlugin("pytest"), name="second")
    assert first.state is second.state is PluginState.loaded, (first.error, second.error)
    assert first.registered["packages"] == ["pytest", "py-test"] and second.registered["packages"] == ["pytest"]
    assert manager.packages["pytest"].plugin == "first"


@pytest.mark.parametrize("name", ["", "nvidia ml py", "../torch", "torch==2.0", "-torch", 3, None])
def test_a_package_that_is_no_distribution_name_is_refused(manager: PluginManager, name: object) -> None:
    record = manager.register_plugin(PackagesPlugin("pytest", name), name="packages")
    assert record.state is PluginState.failed, name
    assert "distribution name" in (record.error or "") or "a package name (a string)" in (record.error or "")
    assert manager.packages["torch-xla"].plugin == "xla" and "pytest" not in manager.packages
