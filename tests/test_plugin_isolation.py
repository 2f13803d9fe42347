"""A badly written plugin breaks nothing but itself: every call into plugin code is guarded.

Each test reproduces one way a reviewer broke core with a plugin (issue 11) and asserts what
core does now: the fault is reported against that plugin, and every other command and run works.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest

from core import Accelerator, Availability, ConfigError, PowerMeterFactory, hookimpl, make_config
from core.contract.manager import PluginFault, PluginManager, PluginState
from core.testing import TINY_FCNN, registered_plugins
from core.workloads.fcnn import Fcnn

CPU_SOURCE = "from core_plugins.cpu.accelerator import CpuAccelerator\n"


def core_cli(*arguments: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "core.cli", *arguments],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=600,
    )


def make_distribution(root: Path, name: str, module_source: str, entry_point: str | None = None) -> None:
    """An installed distribution on sys.path whose `core` entry point is ``entry_point`` (default: name)."""
    (root / f"{name}.py").write_text(module_source)
    info = root / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[core]\n{entry_point or name} = {name}\n")


# A plugin whose accelerator raises in availability() and devices(), and whose meter raises in
# availability() and reads(). Written as a third party would, against the documented imports.
BROKEN_SOURCE = """
from core import Accelerator, Availability, PowerMeterFactory, hookimpl

class BrokenAccelerator(Accelerator):
    name = "broken"
    def availability(self):
        raise RuntimeError("driver handshake failed")
    def precisions(self, framework):
        return ()
    def max_replicas(self, config):
        return 1
    def devices(self):
        raise OSError("no such device")
    def create_executor(self, workload, config, process):
        raise NotImplementedError

class ListsButCannotDescribe(BrokenAccelerator):
    name = "half-broken"
    def availability(self):
        return Availability.yes()

class BrokenMeter(PowerMeterFactory):
    name = "broken-meter"
    def reads(self, accelerator_name):
        return True
    def availability(self):
        raise RuntimeError("sensor bus timeout")
    def create(self, devices, config):
        raise RuntimeError("never")

@hookimpl
def core_register_accelerators(register):
    register(BrokenAccelerator())
    register(ListsButCannotDescribe())

@hookimpl
def core_register_power_meters(register):
    register(BrokenMeter())
"""


@pytest.fixture
def broken_plugin(tmp_path: Path) -> dict[str, str]:
    make_distribution(tmp_path, "broken_vendor", BROKEN_SOURCE)
    return {"PYTHONPATH": str(tmp_path)}


@pytest.mark.slow
def test_plugins_and_devices_list_everything_when_a_plugin_raises(broken_plugin: dict[str, str]) -> None:
    listing = core_cli("plugins", "--json", env=broken_plugin)
    assert listing.returncode == 0, listing.stderr
    rows = {row["name"]: row for row in json.loads(listing.stdout)}
    entries = {entry["name"]: entry for entry in rows["broken_vendor"]["registers"]["accelerators"]}
    assert entries["broken"]["available"] is False
    assert "plugin 'broken_vendor' raised in BrokenAccelerator.availability()" in entries["broken"]["reason"]
    assert "RuntimeError: driver handshake failed" in entries["broken"]["reason"]
    assert {"cpu", "nvidia", "amd", "graphcore", "workloads"} <= set(rows)

    text = core_cli("plugins", env=broken_plugin)
    assert text.returncode == 0 and "Traceback" not in text.stdout + text.stderr
    verbose = core_cli("plugins", "--verbose", env=broken_plugin)
    assert "Traceback (most recent call last)" in verbose.stdout and "driver handshake failed" in verbose.stdout

    devices = core_cli("devices", "--json", env=broken_plugin)
    assert devices.returncode == 0, devices.stderr
    listed = json.loads(devices.stdout)
    assert listed["cpu"] and listed["cpu"][0]["kind"] == "cpu"
    assert "OSError: no such device" in listed["half-broken"]["unavailable"]
    assert "driver handshake failed" in listed["broken"]["unavailable"]


@pytest.mark.slow
def test_a_meter_that_raises_in_availability_does_not_break_a_cpu_run(broken_plugin: dict[str, str]) -> None:
    ran = core_cli(
        "run",
        "fcnn",
        "--steps",
        "2",
        "--warmup-steps",
        "0",
        "--batch-size",
        "4",
        "-o",
        "hidden_width=16",
        "-o",
        "layers=2",
        "--json",
        env=broken_plugin,
    )
    assert ran.returncode == 0, ran.stderr
    result = json.loads(ran.stdout)
    assert result["status"]["state"] == "ok"
    # The broken meter claims to read every accelerator; it was passed over, not chosen.
    assert "broken-meter" not in (result["energy"] or {}).get("meter", "")


@pytest.mark.slow
def test_a_third_party_cannot_take_a_built_in_accelerator_name(tmp_path: Path) -> None:
    # "a_cpu" sorts before "cpu": before, it loaded first and `--accelerator cpu` ran the impostor.
    impostor = (
        CPU_SOURCE + "from core import hookimpl\n"
        "class Impostor(CpuAccelerator):\n    description = 'impostor'\n"
        "@hookimpl\ndef core_register_accelerators(register):\n    register(Impostor())\n"
    )
    make_distribution(tmp_path, "a_cpu", impostor)
    make_distribution(tmp_path, "cpu_again", "raise SystemExit('must not even be imported')\n", entry_point="cpu")
    env = {"PYTHONPATH": str(tmp_path)}
    listing = core_cli("plugins", "--json", env=env)
    rows = {row["name"]: row for row in json.loads(listing.stdout)}
    assert rows["cpu"]["state"] == "loaded" and rows["cpu"]["builtin"] is True
    assert rows["a_cpu"]["state"] == "failed"
    assert "Accelerator 'cpu' is already registered by built-in plugin 'cpu'" in rows["a_cpu"]["error"]
    clash = rows["cpu (cpu_again)"]
    assert clash["state"] == "failed" and '"cpu" is the name of a built-in plugin' in clash["error"]
    text = core_cli("plugins", env=env).stdout
    assert "a_cpu 1.0 [failed]" in text and "already registered by built-in plugin 'cpu'" in text


class _RaisingCpu(Accelerator):
    """An accelerator whose every planning method raises, to find each unguarded call."""

    name: ClassVar[str] = "raising"

    def __init__(self, failing: str) -> None:
        self.failing = failing

    def _maybe_fail(self, method: str) -> None:
        if method == self.failing:
            raise ZeroDivisionError(f"bug in {method}")

    def availability(self) -> Availability:
        self._maybe_fail("availability")
        return Availability.yes()

    def precisions(self, framework: Any) -> tuple[Any, ...]:
        from core import Precision

        self._maybe_fail("precisions")
        return (Precision.fp32,)

    def max_replicas(self, config: Any) -> int:
        self._maybe_fail("max_replicas")
        return 1

    def validate(self, config: Any) -> None:
        self._maybe_fail("validate")

    def devices(self) -> list[Any]:
        return []

    def create_executor(self, workload: Any, config: Any, process: Any) -> Any:
        raise NotImplementedError


class _Plugin:
    def __init__(self, accelerator: Accelerator) -> None:
        self.accelerator = accelerator

    @hookimpl
    def core_register_accelerators(self, register: Callable[[Accelerator], None]) -> None:
        register(self.accelerator)


@pytest.mark.parametrize("failing", ["precisions", "max_replicas", "validate"])
def test_planning_names_the_plugin_whose_method_raised(failing: str) -> None:
    from core.api import run

    with registered_plugins(_Plugin(_RaisingCpu(failing))) as manager:
        with pytest.raises(PluginFault) as raised:
            run("fcnn", "raising", steps=1, workload_options=TINY_FCNN)
        assert raised.value.plugin == "_Plugin"
        assert f"_RaisingCpu.{failing}()" in str(raised.value)
        assert "test_plugin_isolation.py" in (raised.value.location or "")
        assert manager.plugins["_Plugin"].faults[-1] is raised.value
        # The CPU is untouched by the other plugin's bug.
        assert manager.availability(manager.accelerator("cpu")).available


def test_an_accelerator_that_raises_in_availability_is_refused_with_the_reason() -> None:
    from core.api import run

    with registered_plugins(_Plugin(_RaisingCpu("availability"))):
        with pytest.raises(ConfigError) as raised:
            run("fcnn", "raising", steps=1)
    assert raised.value.field == "accelerator"
    assert "raised in _RaisingCpu.availability()" in raised.value.allowed


class _CpuOnlyMeter(PowerMeterFactory):
    name: ClassVar[str] = "gpu-only"

    def reads(self, accelerator_name: str) -> bool:
        return accelerator_name == "some-gpu"

    def availability(self) -> Availability:
        return Availability.yes()

    def create(self, devices: Any, config: Any) -> Any:
        raise AssertionError("must not be created for the CPU")


class _MeterPlugin:
    @hookimpl
    def core_register_power_meters(self, register: Callable[[PowerMeterFactory], None]) -> None:
        register(_CpuOnlyMeter())


def test_a_named_meter_that_does_not_read_the_accelerator_is_refused() -> None:
    from core.api import run

    with registered_plugins(_MeterPlugin()):
        with pytest.raises(ConfigError) as raised:
            run("fcnn", "cpu", steps=1, power_meter="gpu-only")
    assert raised.value.field == "power_meter" and raised.value.value == "gpu-only"
    assert "does not read accelerator 'cpu'" in raised.value.allowed
    assert "allowed: auto, none" in raised.value.allowed


class _RaisingSelection:
    @hookimpl
    def core_select_power_meter(self, accelerator: Any, config: Any, candidates: Any) -> Any:
        raise RuntimeError("selection bug")


def test_a_selection_hook_that_raises_is_passed_over_and_recorded() -> None:
    with registered_plugins(_RaisingSelection()) as manager:
        config = make_config(workload="fcnn", accelerator="cpu")
        chosen = manager.power_meter_factory(manager.accelerator("cpu"), config)
        assert chosen is None or chosen.name == "rapl"  # core's own choice (RAPL where the host has it)
        faults = manager.plugins["_RaisingSelection"].faults
        assert faults and "core_select_power_meter" in str(faults[0]) and "selection bug" in str(faults[0])


def test_a_failed_import_keeps_its_traceback_for_verbose(tmp_path: Path) -> None:
    make_distribution(tmp_path, "explodes", "def helper():\n    raise ValueError('deep inside')\nhelper()\n")
    sys.path.insert(0, str(tmp_path))
    try:
        manager = PluginManager()
        manager.load_entry_points()
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("explodes", None)
    record = manager.plugins["explodes"]
    assert record.state is PluginState.failed
    assert record.traceback and "explodes.py" in record.traceback and "in helper" in record.traceback


class _CountsBadly(Fcnn):
    """A workload whose bookkeeping raises: FLOPs and details are not the measurement."""

    name = "counts-badly"

    def flops_per_sample(self, options: Any) -> float | None:
        raise ZeroDivisionError("division by zero")

    def details(self, options: Any) -> dict[str, Any]:
        raise KeyError("layers")


class _WorkloadPlugin:
    @hookimpl
    def core_register_workloads(self, register: Callable[[Any], None]) -> None:
        register(_CountsBadly())


def test_a_workload_whose_figures_raise_still_runs_and_says_why() -> None:
    from core.api import run

    with registered_plugins(_WorkloadPlugin()):
        result = run("counts-badly", "cpu", steps=2, warmup_steps=0, power_meter="none", workload_options=TINY_FCNN)
    assert result.status.ok and result.throughput_per_second
    assert result.flops_per_sample is None and result.workload_details == {}
    figures, details = result.warnings[:2]
    assert "figures_for raised ZeroDivisionError" in figures and "test_plugin_isolation.py" in figures
    assert "details raised KeyError" in details


def test_a_progress_callback_that_raises_is_a_warning_not_a_fault() -> None:
    from core.api import run

    def observer(partial: Any) -> None:
        raise RuntimeError("dashboard is down")

    result = run(
        "fcnn", "cpu", steps=2, warmup_steps=0, power_meter="none", workload_options=TINY_FCNN, on_progress=observer
    )
    assert result.status.ok
    assert result.warnings.count("on_progress callback failed: RuntimeError: dashboard is down") == 1
