"""The AMD plugin: visibility, discovery, MI250 packages and modes, package energy, the missing
library, peaks.

Whatever reaches amdsmi runs the *real* amdsmi Python package (unpacked by
scripts/fetch-bindings.sh) over the simulated libamd_smi.so of tests/amdsmi_native.py: the newest
release where the release does not matter, every release at hand where keys or behaviour differ.
tests/test_amdsmi_binding.py holds the counter faults, MI100, MI300X and the library's failures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from amdsmi_native import VERSIONS, Clock, SimGcd, SimNode, kfd_topology, mi250x_node, real_amdsmi, xgmi_bandwidth

import core.workloads
from core import ConfigError, DeviceRecord, Framework, Precision, ProcessContext, RunConfig, hookimpl, make_config, run
from core.executors.base import Executor
from core.running.planning import plan_run
from core.testing import SimulatedExecutor, registered_plugins, run_context
from core_plugins.amd import smi
from core_plugins.amd.accelerator import AmdAccelerator
from core_plugins.amd.meter import AmdsmiMeter, AmdsmiMeterFactory
from core_plugins.amd.peaks import AMD_PEAKS, peak_flops
from core_plugins.amd.visibility import hip_visible, rocr_visible, visible_order
from core_plugins.probing import SdkProbe

# Every test here fails if it leaves the plugin's amdsmi session open.
pytestmark = pytest.mark.usefixtures("amdsmi_session_closed")

RES = 15.300000190734863  # what amdsmi returns for rocm_smi's 15.3 uJ: a C float
BDF_A0, BDF_A1, BDF_B0, BDF_B1 = "0000:c1:00.0", "0000:c6:00.0", "0000:c9:00.0", "0000:ce:00.0"
NEWEST = VERSIONS[-1]
# XGMI links between the GCDs of mi250x_node (indices A0 A1 B0 B1): four inside a package, one or
# two across (ROCm docs, MI250 architecture).
MI250X_LINKS = {(0, 1): 4, (2, 3): 4, (0, 2): 2, (1, 3): 2, (0, 3): 1, (1, 2): 1}
# amdsmi 6.3 and later give each GCD's compute units (110 tell an MI250X GCD) and gfx target.
DESCRIBES_THE_PART = {"6.0.2": False, "6.2.4": False, "6.3.0": True, "7.0.2": True}


# --- helpers ---------------------------------------------------------------------------------


@dataclass
class Simulated:
    """Two MI250X packages behind the real amdsmi, and the plugin's objects pointed at them."""

    node: SimNode
    probe: SdkProbe
    topology: Path  # the node's KFD topology in sysfs, which amdsmi 6.0-6.2 need for the HIP order

    def gcd(self, bdf: str) -> SimGcd:
        return next(g for g in self.node.gcds if g.bdf == bdf)

    def accelerator(self, **environment: str) -> AmdAccelerator:
        return AmdAccelerator(probe=self.probe, environment=environment, kfd_topology=self.topology)

    def factory(self) -> AmdsmiMeterFactory:
        """A meter factory whose validation sleeps run the simulated node, in simulated time."""
        clock = Clock(self.node)
        return AmdsmiMeterFactory(self.probe, clock=clock, sleep=clock.sleep, kfd_topology=self.topology)

    def open_meter(self, devices: list[DeviceRecord]) -> Any:
        return self.factory().meter_for(devices, run_context(config()))


@pytest.fixture
def simulate(probe: SdkProbe, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Callable[..., Simulated]]:
    """``simulate(version, **node_options)``: mi250x_node (XGMI links as MI250X_LINKS unless given)
    behind the real amdsmi ``version``, importable as ``amdsmi`` until the test ends."""
    with ExitStack() as stack:

        def start(version: str = NEWEST, **node_options: Any) -> Simulated:
            node_options.setdefault("bandwidth_mbs", xgmi_bandwidth(MI250X_LINKS))
            node = mi250x_node(**node_options)
            stack.enter_context(real_amdsmi(version, node, monkeypatch, tmp_path))
            return Simulated(node, probe, kfd_topology(tmp_path, node))

        yield start


def validate(amd: AmdAccelerator, config: RunConfig) -> None:
    amd.validate_run(run_context(config, amd))


def devices_used(amd: AmdAccelerator, config: RunConfig, process: ProcessContext) -> list[DeviceRecord]:
    return amd.devices_used(run_context(config, amd, process=process))


def config(**options: Any) -> RunConfig:
    return make_config(
        workload="fcnn", accelerator="amd", micro_batch_size=4, power_sample_interval_seconds=0.01, **options
    )


# --- visibility --------------------------------------------------------------------------------

NODE_UUIDS = ["GPU-babababababababa", "GPU-abbaabbaabbaabba", "GPU-babaabbaabbababa", "GPU-abbababababaabba"]


@pytest.mark.parametrize(
    "value,expected",
    [
        (None, [0, 1, 2, 3]),
        ("", []),  # set but empty: no GPU
        ("-1", []),
        ("GPU-XX", []),
        ("3,GPU-BABABABABABABABA,4", [3, 0]),  # the examples in ROCr's amd_filter_device.h
        ("1,GPU-ABBAABBAABBAABBA,GPU-XX", [1]),
        ("3,GPU-BABAABBA,GPU-XX", [3, 2]),
        ("gpu-abbab", [3]),  # upper-cased, and a unique prefix is enough
        ("0x2, 1", [2, 1]),  # strtol with base 0; tokens trimmed
        ("1,1,2", [1]),  # a repeated device ends the list
    ],
)
def test_rocr_visible_devices_follows_rocr(value: str | None, expected: list[int]) -> None:
    assert rocr_visible(value, NODE_UUIDS) == expected


@pytest.mark.parametrize(
    "value,expected",
    [
        (None, [0, 1, 2, 3]),
        ("", [0, 1, 2, 3]),  # empty filters nothing in HIP
        ("2,0", [2, 0]),
        ("0,0,1", [0, 1]),  # a repeated device is skipped, not an end
        ("1,9,0", [1]),  # the list ends at the first invalid entry
        ("01", []),  # an index must be a plain decimal
        ("GPU-abbaabbaabbaabba,3", [1, 3]),
    ],
)
def test_hip_visible_devices_follows_hip(value: str | None, expected: list[int]) -> None:
    assert hip_visible(value, NODE_UUIDS) == expected


def test_rocr_applies_first_then_hip_or_cuda() -> None:
    assert visible_order({"ROCR_VISIBLE_DEVICES": "2,3", "HIP_VISIBLE_DEVICES": "1"}, NODE_UUIDS) == [3]
    assert visible_order({"CUDA_VISIBLE_DEVICES": "3,1"}, NODE_UUIDS) == [3, 1]
    assert visible_order({"HIP_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": "3"}, NODE_UUIDS) == [0]
    assert visible_order({"HIP_VISIBLE_DEVICES": "", "CUDA_VISIBLE_DEVICES": "3"}, NODE_UUIDS) == [3]


# --- discovery and packages ---------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_two_mi250_packages_are_four_gcds_paired_by_xgmi_not_parity(
    version: str, simulate: Callable[..., Simulated]
) -> None:
    sim = simulate(version)
    amd = sim.accelerator()
    devices = amd.visible_devices()
    # HIP (KFD) order interleaves the packages: hip 0 and 2 share package A, 1 and 3 package B.
    assert [d.details["bdf"] for d in devices] == [BDF_A0, BDF_B0, BDF_A1, BDF_B1]
    assert [d.index for d in devices] == [0, 1, 2, 3]
    assert [d.details["package"] for d in devices] == ["package-0", "package-1", "package-0", "package-1"]
    assert devices[0].details["package_gcds"] == [BDF_A0, BDF_A1]
    assert "four XGMI links" in amd.node().packages[0].rule  # by bandwidth, not the link-weight fallback
    assert devices[0].details["market_name"] == "AMD Instinct MI250X / MI250"
    assert devices[0].memory_bytes == 68_702_699_520
    assert devices[3].details["uuid"] == "GPU-5a1f00000000bb02"
    if DESCRIBES_THE_PART[version]:
        # "AMD Instinct MI250X / MI250" is resolved by the GCD's 110 compute units.
        assert {d.name for d in devices} == {"AMD Instinct MI250X"}
        assert devices[0].details["gfx_target"] == "gfx90a" and devices[0].details["compute_units"] == 110
    else:  # no compute units: which of the two stays open (and so does its peak)
        assert {d.name for d in devices} == {"AMD Instinct MI250X / MI250"}
    assert sim.node.calls.count("amdsmi_init") == sim.node.calls.count("amdsmi_shut_down") == 1
    assert not sim.node.initialized


@pytest.mark.parametrize("version", VERSIONS)
def test_visibility_variables_select_and_order_gcds(version: str, simulate: Callable[..., Simulated]) -> None:
    sim = simulate(version)  # UUIDs: amdsmi_get_gpu_enumeration_info's hip_uuid (7.0), else asic_serial
    devices = sim.accelerator(
        ROCR_VISIBLE_DEVICES="GPU-5A1F00000000BB02,0,2", HIP_VISIBLE_DEVICES="2,0"
    ).visible_devices()
    assert [(d.index, d.details["bdf"], d.details["hip_index"]) for d in devices] == [(0, BDF_A1, 2), (1, BDF_B1, 3)]
    hidden = sim.accelerator(ROCR_VISIBLE_DEVICES="")
    assert hidden.max_replicas_for(run_context(config(), hidden)) == 0


def test_sibling_pairs_need_a_unique_mutual_strongest_link(simulate: Callable[..., Simulated]) -> None:
    links = {**MI250X_LINKS, (0, 2): 4}  # A0 now as strongly linked to B0 as to A1...
    sim = simulate(bandwidth_mbs=xgmi_bandwidth(links), hops=lambda a, b: 1)  # ...and every GCD one hop away
    amd = sim.accelerator()
    assert amd.node().package_error is not None and "0000:c1:00.0" in amd.node().package_error
    assert amd.visible_devices()[0].details["package"] is None
    with pytest.raises(ConfigError) as refused:
        validate(amd, config(replicas=2, accelerator_options={"mode": "package"}))
    assert refused.value.field == "accelerator_options.mode" and "XGMI" in str(refused.value)


def test_serial_and_silent_die_rules_pair_nothing_they_cannot_prove() -> None:
    dies = ["a0", "a1", "b0", "b1"]
    assert smi.pair_by_serial(dies, {"a0": "S1", "a1": "S1", "b0": "S2", "b1": "S2"}) == [("a0", "a1"), ("b0", "b1")]
    # A serial per die (the kernel's fallback to the die's unique id), a shared blank one, or one held by three.
    assert smi.pair_by_serial(dies, {d: d for d in dies}) == []
    assert smi.pair_by_serial(dies, {d: "" for d in dies}) == []
    assert smi.pair_by_serial(dies, {"a0": "S", "a1": "S", "b0": "S", "b1": "T"}) == []
    reports = {"a0": True, "a1": False, "b0": True, "b1": False}
    every = smi.pair_silent_with_reporting(dies, reports, lambda a, b: True)
    assert every == []  # a1 could be a0's or b0's
    only = smi.pair_silent_with_reporting(dies, reports, lambda a, b: {a[0], b[0]} != {"a", "b"} or a + b == "a0b0")
    assert only == [("a0", "a1"), ("b0", "b1")]
    assert smi.pair_silent_with_reporting(dies, {**reports, "b1": None}, lambda a, b: True) == []
    assert smi.pair_silent_with_reporting(dies, {**reports, "b1": True}, lambda a, b: True) == []


@pytest.mark.parametrize("version", ["6.0.2", "6.2.4"])  # later releases give the order themselves
def test_without_any_hip_order_source_the_guess_is_labelled(
    version: str, simulate: Callable[..., Simulated], tmp_path: Path
) -> None:
    sim = simulate(version)
    amd = AmdAccelerator(probe=sim.probe, environment={}, kfd_topology=tmp_path / "absent")
    assert [d.details["bdf"] for d in amd.visible_devices()] == [BDF_A0, BDF_A1, BDF_B0, BDF_B1]
    assert "unverified" in amd.node().hip_order


# --- modes ---------------------------------------------------------------------------------------


class Plugin:
    def __init__(self, *items: Any) -> None:
        self.items = items

    @hookimpl
    def core_register_accelerators(self, register: Callable[[Any], None]) -> None:
        for item in self.items:
            if isinstance(item, AmdAccelerator):
                register(item)

    @hookimpl
    def core_register_power_meters(self, register: Callable[[Any], None]) -> None:
        for item in self.items:
            if isinstance(item, AmdsmiMeterFactory):
                register(item)


def plan(amd: AmdAccelerator, **options: Any) -> Any:
    with registered_plugins(core.workloads, Plugin(amd), entry_points=False) as manager:
        return plan_run(manager, "fcnn", "amd", {"micro_batch_size": 4, **options})


def test_mode_is_an_accelerator_option(simulate: Callable[..., Simulated]) -> None:
    amd = simulate().accelerator()
    with pytest.raises(ConfigError) as bad:
        plan(amd, accelerator_options={"mode": "gpu"})
    assert bad.value.field == "accelerator_options.mode" and "'gcd' or 'package'" in bad.value.allowed
    with pytest.raises(ConfigError) as unknown:
        plan(amd, accelerator_options={"gcds": 2})
    assert unknown.value.field == "accelerator_options.gcds" and "mode" in unknown.value.allowed
    assert plan(amd, accelerator_options={"mode": "package"}, replicas=4).config.replicas == 4
    with pytest.raises(ConfigError) as tf32:
        plan(amd, precision="tf32")
    assert tf32.value.field == "precision"


def test_package_mode_needs_whole_packages(simulate: Callable[..., Simulated]) -> None:
    sim = simulate()
    with pytest.raises(ConfigError) as split:  # hip 0 and 1 are GCDs of two different packages
        validate(sim.accelerator(), config(replicas=2, accelerator_options={"mode": "package"}))
    assert split.value.field == "replicas"
    assert "package-0 without 0000:c6:00.0" in split.value.allowed and "package-1" in split.value.allowed
    paired = sim.accelerator(HIP_VISIBLE_DEVICES="0,2,1,3")
    validate(paired, config(replicas=2, accelerator_options={"mode": "package"}))
    validate(sim.accelerator(), config(replicas=2))  # gcd mode takes any GCDs


def test_package_mode_records_packages_and_their_peaks(simulate: Callable[..., Simulated]) -> None:
    amd = simulate().accelerator()
    process = ProcessContext(rank=0, local_rank=0, world_size=4)
    packages = devices_used(amd, config(replicas=4, accelerator_options={"mode": "package"}), process)
    assert [(p.index, p.details["package"], p.details["unit"]) for p in packages] == [
        (0, "package-0", "package"),
        (1, "package-1", "package"),
    ]
    assert [g["bdf"] for g in packages[0].details["gcds"]] == [BDF_A0, BDF_A1]
    assert [g["cuda_index"] for g in packages[1].details["gcds"]] == [1, 3]
    assert packages[0].memory_bytes == 2 * 68_702_699_520
    gcds = devices_used(amd, config(replicas=4), process)
    assert len(gcds) == 4 and gcds[0].details["unit"] == "gcd"
    package_peak = amd.peak_flops_per_second(packages[0], Precision.bf16)
    gcd_peak = amd.peak_flops_per_second(gcds[0], Precision.bf16)
    assert package_peak is not None and package_peak[0] == pytest.approx(383.0e12)
    assert gcd_peak is not None and gcd_peak[0] == pytest.approx(191.5e12) and "1/2" in gcd_peak[1]


# --- energy --------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)  # the accumulator's key and the "N/A" marks differ
def test_energy_per_package_equals_a_hand_calculation_from_the_counters(
    version: str, simulate: Callable[..., Simulated]
) -> None:

    sim = simulate(version)
    sim.node.gcds[0].primary, sim.node.gcds[1].primary = False, True  # package A reports on A1, B on B0
    a1, b0 = sim.gcd(BDF_A1), sim.gcd(BDF_B0)
    meter = sim.open_meter(sim.accelerator().visible_devices())
    assert isinstance(meter, AmdsmiMeter)
    try:
        meter.start()
        a_start, b_start = a1.accumulator, b0.accumulator
        a1.accumulator += 29_411_764  # ~450 J
        b0.accumulator += 19_607_843  # ~300 J
        measurement = meter.stop()
    finally:
        meter.close()
    assert measurement.unavailable_reason is None and measurement.method == "counter"
    expected_a = ((a_start + 29_411_764) - a_start) * RES / 1e6
    expected_b = ((b_start + 19_607_843) - b_start) * RES / 1e6
    assert measurement.components_joules["package-0"] == pytest.approx(expected_a, rel=1e-12)
    assert measurement.components_joules["package-1"] == pytest.approx(expected_b, rel=1e-12)
    assert measurement.energy_joules == pytest.approx(expected_a + expected_b, rel=1e-12)
    assert measurement.details["shared_packages"] == {}
    package_a = measurement.details["packages"]["package-0"]
    assert package_a["reporting_gcds"] == [BDF_A1] and package_a["silent_gcds"] == [BDF_A0]
    assert package_a["counter"].startswith("validated") and package_a["ratio"] == pytest.approx(1.0, rel=1e-3)
    assert package_a["gcds"][BDF_A0]["power_field"] == "average_socket_power"  # current power is not available
    assert package_a["gcds"][BDF_A1]["counter_resolution_uj"] == pytest.approx(RES, rel=1e-12)
    assert package_a["gcds"][BDF_A1]["counter_bits"] == 64
    assert not sim.node.initialized


def test_a_run_on_the_silent_sibling_reports_its_package_flagged_shared(simulate: Callable[..., Simulated]) -> None:
    sim = simulate()  # A0 is primary, A1 the silent secondary
    silent = [d for d in sim.accelerator().visible_devices() if d.details["bdf"] == BDF_A1]
    meter = sim.open_meter(silent)
    try:
        meter.start()
        sim.gcd(BDF_A0).accumulator += 10_000_000
        measurement = meter.stop()
    finally:
        meter.close()
    assert sim.gcd(BDF_A1).accumulator == 0  # the die itself reads nothing...
    assert measurement.components_joules == {"package-0": pytest.approx(10_000_000 * RES / 1e6)}  # ...its package does
    assert BDF_A0 in measurement.details["shared_packages"]["package-0"]
    assert measurement.details["packages"]["package-0"]["gcds"][BDF_A1]["in_run"] is True


def test_both_gcds_of_a_package_are_counted_once(simulate: Callable[..., Simulated]) -> None:
    sim = simulate()
    gcds = [d for d in sim.accelerator().visible_devices() if d.details["package"] == "package-1"]
    meter = sim.open_meter(gcds)
    try:
        meter.start()
        sim.gcd(BDF_B0).accumulator += 1_000_000
        measurement = meter.stop()
    finally:
        meter.close()
    assert list(measurement.components_joules) == ["package-1"]
    assert measurement.energy_joules == pytest.approx(1_000_000 * RES / 1e6)
    assert measurement.details["shared_packages"] == {}


def test_package_records_feed_the_meter(simulate: Callable[..., Simulated]) -> None:
    sim = simulate()
    packages = devices_used(
        sim.accelerator(HIP_VISIBLE_DEVICES="0,2"),
        config(replicas=2, accelerator_options={"mode": "package"}),
        ProcessContext(rank=0, local_rank=0, world_size=2),
    )
    meter = sim.open_meter(packages)
    try:
        meter.start()
        sim.gcd(BDF_A0).accumulator += 2_000_000
        measurement = meter.stop()
    finally:
        meter.close()
    assert measurement.components_joules == {"package-0": pytest.approx(2_000_000 * RES / 1e6)}
    assert measurement.details["shared_packages"] == {}


# --- unavailable ---------------------------------------------------------------------------------


def test_amdsmi_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    with pytest.raises(smi.AmdsmiUnavailable) as missing:
        smi.import_amdsmi()
    assert "pip install 'core[amd]'" in str(missing.value)


def test_core_plugins_lists_amd_unavailable_with_the_reason() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = (
        "import json, sys; from core.cli import main; main(['plugins', '--json']); "
        "assert 'amdsmi' not in sys.modules and 'torch' not in sys.modules"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert completed.returncode == 0, completed.stderr
    row = next(r for r in json.loads(completed.stdout) if r["name"] == "amd")
    (accelerator_entry,) = row["registers"]["accelerators"]
    (meter_entry,) = row["registers"]["power_meters"]
    assert accelerator_entry["available"] is False and "/dev/kfd" in accelerator_entry["reason"]
    assert meter_entry["name"] == "amdsmi" and meter_entry["available"] is False and meter_entry["reason"]


# --- peaks ---------------------------------------------------------------------------------------


def test_peak_table_has_a_source_for_every_entry_and_part() -> None:
    models = {entry.model for entry in AMD_PEAKS.entries}
    assert models == {"MI100", "MI210", "MI250", "MI250X", "MI300X"}
    assert all(entry.source for entry in AMD_PEAKS.entries)
    assert peak_flops("AMD Instinct MI250X", Precision.fp32) == pytest.approx(95.7e12)
    assert peak_flops("AMD Instinct MI250", Precision.fp16) == pytest.approx(362.1e12)
    assert peak_flops("AMD Instinct MI250X", Precision.bf16, per_gcd=True) == pytest.approx(191.5e12)
    assert peak_flops("AMD Instinct MI100", Precision.bf16) == pytest.approx(92.3e12)
    assert peak_flops("AMD Instinct MI210", Precision.fp16) == pytest.approx(181.0e12)
    assert peak_flops("AMD Instinct MI250X / MI250", Precision.fp16) is None  # which of the two is unknown
    assert peak_flops("AMD Instinct MI250X", Precision.tf32) is None
    assert AmdAccelerator().precisions(Framework.torch) == (
        Precision.fp32,
        Precision.bf16,
        Precision.fp16,
        Precision.default,
    )


# --- running -------------------------------------------------------------------------------------


def test_a_pytorch_without_rocm_is_refused_with_the_reason(simulate: Callable[..., Simulated]) -> None:
    sim = simulate()
    from core.workloads.fcnn import Fcnn

    with pytest.raises(RuntimeError, match=r"torch.version.hip is None"):
        amd = sim.accelerator()
        amd.executor_for(Fcnn(), run_context(config(), amd, Fcnn()))


class SimulatedAmd(AmdAccelerator):
    def __init__(self, node: SimNode, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.simulated_node = node

    def create_executor(self, workload: Any, config: RunConfig, process: ProcessContext) -> Executor:
        # Each update lets the simulated node run 10 ms at its draw: the device's only sign of work.
        return SimulatedExecutor(lambda: self.simulated_node.advance(0.01))


def test_a_package_mode_run_reports_packages_energy_and_peaks(simulate: Callable[..., Simulated]) -> None:
    sim = simulate(driver_version="6.10.5")
    amd = SimulatedAmd(sim.node, probe=sim.probe, environment={}, kfd_topology=sim.topology)
    with registered_plugins(core.workloads, Plugin(amd, sim.factory()), entry_points=False):
        result = run(
            "fcnn",
            "amd",
            framework="tensorflow",
            replicas=4,
            steps=5,
            warmup_steps=0,
            micro_batch_size=4,
            power_sample_interval_seconds=0.01,
            accelerator_options={"mode": "package"},
        )
    assert result.status.ok, result.status
    assert [d.details["package"] for d in result.devices] == ["package-0", "package-1"]
    ticks = round(450.0 * 0.01 * 1e6 / RES)  # per update and package: A draws 250 + 200 W, B 300 + 150 W
    assert result.energy is not None and result.energy.method == "counter"
    assert result.energy.components_joules == {
        "package-0": pytest.approx(5 * ticks * RES / 1e6),
        "package-1": pytest.approx(5 * ticks * RES / 1e6),
    }
    assert result.energy_joules == pytest.approx(10 * ticks * RES / 1e6)
    assert result.energy.details["shared_packages"] == {}
    assert result.peak_flops_per_second == pytest.approx(2 * 95.7e12)  # fp32: two MI250X packages
    assert result.environment is not None and result.environment.driver_versions["amdgpu_driver"] == "6.10.5"
    assert not sim.node.initialized
