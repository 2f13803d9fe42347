"""The host's CPU and DRAM energy (RAPL) read beside any accelerator's devices by default
(``node_meters = "auto"``, issue 28): itemised with ``counted: false``, never added into
``energy_joules``, which stays the device meter's; named in node_meters it is added, as before.

The host is simulated: fake-gaudi's accelerator and device meter (40 J), and core_plugins' RAPL meter
on a powercap tree laid out as the kernel's (tests/test_rapl.py), whose counters tick on each read.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from synthetic import synthetic_result
from test_rapl import kernel_tree

from core import ConfigError, hookimpl, make_config
from core.base.results import RunResult
from core.cli import format_result
from core.energy.combined import MeterSet
from core.plugin import Accelerator, PowerMeterFactory
from core.testing import TINY_FCNN, registered_plugins, run_on_cpu_as, run_tiny
from core_plugins.cpu import CpuAccelerator
from core_plugins.cpu.rapl import RaplMeterFactory

sys.path.insert(0, str(Path(__file__).resolve().parent / "third_party"))

import core_fake_gaudi as gaudi  # noqa: E402  (a third party's package, on the path above)


class TickingCounters:
    """Reads the simulated tree, each energy_uj a joule further on at every read (so RAPL reads more
    than 0 J over any window); ``fail_from``: reads of package-1's counter from that one on raise."""

    def __init__(self, fail_from: int | None = None) -> None:
        self.reads = 0
        self.fail_from = fail_from
        self.package_1_reads = 0

    def __call__(self, path: Path) -> str:
        text = path.read_text()
        if path.name != "energy_uj":
            return text
        if path.parent.name == "intel-rapl:1":
            self.package_1_reads += 1
            if self.fail_from is not None and self.package_1_reads >= self.fail_from:
                raise OSError(f"simulated read error on {path}")
        self.reads += 1
        return str(int(text) + self.reads * 1_000_000)


class _Host:
    """A plugin registering a GPU-like accelerator with its device meter (fake-gaudi's, 40 J), the CPU
    accelerator, and RAPL on ``root`` (None: this host has no RAPL)."""

    def __init__(self, rapl: RaplMeterFactory | None, *others: PowerMeterFactory) -> None:
        self.rapl = rapl
        self.others = others

    @hookimpl
    def core_register_accelerators(self, register: Callable[[Accelerator], None]) -> None:
        register(gaudi.FakeGaudiAccelerator())
        register(CpuAccelerator())

    @hookimpl
    def core_register_power_meters(self, register: Callable[[PowerMeterFactory], None]) -> None:
        register(gaudi.GaudiPowerFactory())
        register(gaudi.GaudiBmcFactory())  # includes the devices: never read under auto
        if self.rapl is not None:
            register(self.rapl)
        for other in self.others:
            register(other)


def _rapl(tmp_path: Path, **counters: Any) -> RaplMeterFactory:
    return RaplMeterFactory(root=kernel_tree(tmp_path), read_text=TickingCounters(**counters))


def _run_gpu_like(host: _Host, **options: Any) -> RunResult:
    with registered_plugins(host, entry_points=False, builtin_workloads=True), run_on_cpu_as("hpu"):
        return run_tiny("fcnn", "fake-gaudi", power_meter="fake-gaudi-power", **options)


def test_auto_is_the_default_and_reads_rapl_beside_the_devices_itemised_not_counted(tmp_path: Path) -> None:
    assert make_config(workload="fcnn", accelerator="cpu").node_meters == "auto"
    result = _run_gpu_like(_Host(_rapl(tmp_path)))
    energy = result.energy
    assert energy is not None and result.config.node_meters == "auto"
    assert result.energy_joules == gaudi.DEVICE_JOULES  # the devices' figure, RAPL not added
    assert energy.meter == "fake-gaudi-power"  # the total's meters: the one read beside is itemised only
    device, rapl = energy.meters
    assert (device.meter, device.role, device.counted, device.note) == ("fake-gaudi-power", "device", True, None)
    assert (rapl.meter, rapl.role, rapl.counted, rapl.includes) == ("rapl", "node", False, ["cpu", "dram"])
    assert rapl.energy_joules is not None and rapl.energy_joules > 0 and rapl.unavailable_reason is None
    assert "read beside the devices" in (rapl.note or "") and "name it in node_meters" in (rapl.note or "")
    assert {"package-0", "package-1"} <= set(rapl.components_joules)
    assert result.samples_per_watt_hour == result.window_samples / (gaudi.DEVICE_JOULES / 3600.0)
    assert not [w for w in result.warnings if any(word in w for word in ("rapl", "RAPL", "node meter"))]
    text = format_result(result)
    assert "node meter      rapl (cpu, dram): " in text and "(read beside, not counted)" in text


def test_named_rapl_is_still_added_into_the_total(tmp_path: Path) -> None:
    host = _Host(_rapl(tmp_path))
    named = _run_gpu_like(host, node_meters="rapl")
    device, rapl = named.energy.meters  # type: ignore[union-attr]
    assert rapl.meter == "rapl" and rapl.counted and rapl.note is None and rapl.energy_joules
    assert named.energy_joules == pytest.approx(gaudi.DEVICE_JOULES + rapl.energy_joules)
    assert named.energy.meter == "fake-gaudi-power + rapl"  # type: ignore[union-attr]
    assert "(read beside, not counted)" not in format_result(named)
    # The same host under the default: the same meter, itemised only.
    beside = _run_gpu_like(host, node_meters="auto")
    assert beside.energy_joules == gaudi.DEVICE_JOULES and not beside.energy.meters[1].counted  # type: ignore[union-attr]


def test_without_rapl_auto_reads_nothing_and_says_nothing(tmp_path: Path) -> None:
    empty = tmp_path / "powercap"
    empty.mkdir()
    for host in (_Host(None), _Host(RaplMeterFactory(root=empty)), _Host(RaplMeterFactory(root=tmp_path / "no"))):
        result = _run_gpu_like(host, node_meters="auto")
        assert result.energy_joules == gaudi.DEVICE_JOULES and result.energy is not None
        assert [item.meter for item in result.energy.meters] in ([], ["fake-gaudi-power"])
        assert result.energy.meter == "fake-gaudi-power"
        said = [w for w in result.warnings if any(word in w for word in ("rapl", "RAPL", "powercap", "node meter"))]
        assert not said, said


def test_a_cpu_run_whose_device_meter_is_rapl_reads_it_once(tmp_path: Path) -> None:
    from core.running.planning import auto_node_meters

    rapl = _rapl(tmp_path)
    with registered_plugins(_Host(rapl), entry_points=False, builtin_workloads=True) as manager:
        assert auto_node_meters(manager, rapl) == ()
        assert [factory.name for factory in auto_node_meters(manager, gaudi.GaudiPowerFactory())] == ["rapl"]
        result = run_tiny("fcnn", "cpu", power_meter="auto", node_meters="auto")
    energy = result.energy
    assert energy is not None and energy.meter == "rapl"
    assert [item.meter for item in energy.meters] in ([], ["rapl"])
    assert result.energy_joules is not None and result.energy_joules > 0


def test_auto_never_reads_a_meter_that_includes_the_devices_nor_one_overlapping_another(tmp_path: Path) -> None:
    class CpuOnly(gaudi.GaudiHostFactory):
        name = "a-cpu-meter"
        node_includes = ("cpu",)

    from core.running.planning import auto_node_meters

    host = _Host(_rapl(tmp_path), CpuOnly())
    with registered_plugins(host, entry_points=False, builtin_workloads=True) as manager:
        chosen = auto_node_meters(manager, gaudi.GaudiPowerFactory())
        assert auto_node_meters(manager, None) == ()  # no device meter: no span to read them over
    # fake-gaudi-bmc includes the devices: never; rapl includes the cpu "a-cpu-meter" (first by name) reads.
    assert [factory.name for factory in chosen] == ["a-cpu-meter"]


def test_a_failing_rapl_under_auto_leaves_the_devices_total(tmp_path: Path) -> None:
    # Availability reads each counter once; package-1's next read (the window's start) fails.
    result = _run_gpu_like(_Host(_rapl(tmp_path, fail_from=2)), node_meters="auto")
    assert result.status.ok and result.energy_joules == gaudi.DEVICE_JOULES
    assert result.energy_unavailable_reason is None
    _, rapl = result.energy.meters  # type: ignore[union-attr]
    assert rapl.meter == "rapl" and not rapl.counted and rapl.energy_joules is None
    assert "simulated read error" in (rapl.unavailable_reason or "")
    assert "unavailable: " in format_result(result) and "(read beside, not counted)" in format_result(result)


@pytest.mark.parametrize(("value", "stored"), [("auto", "auto"), (" auto ", "auto"), ("none", ""), ("", "")])
def test_node_meters_auto_and_none_have_one_spelling(value: str, stored: str) -> None:
    config = make_config(workload="fcnn", accelerator="cpu", node_meters=value)
    assert config.node_meters == stored and config.node_meter_names == ()
    assert config.node_meters_auto is (stored == "auto")


@pytest.mark.parametrize("value", ["auto,rapl", "rapl,auto", "none,rapl"])
def test_auto_and_none_stand_alone(value: str) -> None:
    with pytest.raises(ConfigError, match="alone"):
        make_config(workload="fcnn", accelerator="cpu", node_meters=value)


def test_an_older_result_without_node_meters_read_none() -> None:
    document = synthetic_result().model_dump(mode="json")
    del document["config"]["node_meters"]
    document["schema_version"] = "1.8"
    assert RunResult.model_validate(document).config.node_meters == ""  # what it read: none
    assert RunResult.model_validate(synthetic_result().model_dump(mode="json")).config.node_meters == "auto"


@pytest.mark.parametrize(("node_meters", "warned"), [("auto", False), ("rapl", True)])
def test_poprun_instances_read_no_node_meter_and_say_so_only_where_one_was_named(
    tmp_path: Path, node_meters: str, warned: bool
) -> None:
    from core.base.distributed import ProcessContext
    from core.running.planning import plan_run
    from core.running.runner import _open_meters

    with registered_plugins(_Host(_rapl(tmp_path)), entry_points=False, builtin_workloads=True) as manager:
        options = {"power_meter": "fake-gaudi-power", "node_meters": node_meters, "workload_options": TINY_FCNN}
        plan = plan_run(manager, "fcnn", "fake-gaudi", options)
        assert [factory.name for factory in plan.node_meter_factories] == ["rapl"]
        devices = gaudi.FakeGaudiAccelerator().devices()
        result = synthetic_result()
        result.warnings = []
        instance = ProcessContext(rank=1, world_size=2, meter_per_process=True)
        meter = _open_meters(plan, devices, result, instance)
        assert meter is not None and meter.name == "fake-gaudi-power"  # the instance's devices only
        assert bool([w for w in result.warnings if "poprun" in w]) is warned
        # One process per node (local rank 0 of a multi-replica run): the device meter with RAPL beside.
        node = _open_meters(plan, devices, result, ProcessContext(rank=0, world_size=2, local_world_size=2))
        assert node is not None and node.name == (
            "fake-gaudi-power" if node_meters == "auto" else "fake-gaudi-power + rapl"
        )
        assert isinstance(node, MeterSet) and [slot.covers.name for slot in node._slots] == ["fake-gaudi-power", "rapl"]
        for opened in (meter, node):
            opened.close()
