"""The AMD plugin through the real amdsmi Python package (6.0.2, 6.2.4, 6.3.0, 7.0.2), with only
libamd_smi.so simulated at the ctypes layer (tests/amdsmi_native.py)."""

from __future__ import annotations

import ctypes
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from amdsmi_native import (
    DRIVER_NOT_LOADED,
    NOT_SUPPORTED,
    RESOLUTION_UJ,
    UINT32_MAX,
    VERSIONS,
    Clock,
    SimNode,
    forget_amdsmi,
    kfd_topology,
    mi100_node,
    mi250x_node,
    mi300x_node,
    real_amdsmi,
    unpacked,
)

from core import ConfigError, RunConfig, make_config
from core.contract.meter import UnavailableMeter
from core.testing import run_context
from core_plugins.amd.accelerator import AmdAccelerator
from core_plugins.amd.meter import AmdsmiMeter, AmdsmiMeterFactory
from core_plugins.probing import SdkProbe

# Every test here fails if it leaves the plugin's amdsmi session open.
pytestmark = pytest.mark.usefixtures("amdsmi_session_closed")

A0, A1, B0, B1 = "0000:c1:00.0", "0000:c6:00.0", "0000:c9:00.0", "0000:ce:00.0"


def config() -> RunConfig:
    return make_config(workload="fcnn", accelerator="amd", micro_batch_size=4, power_sample_interval_seconds=0.01)


def measure_one_second(amdsmi: Any, node: SimNode, probe: SdkProbe, topology: Path) -> Any:
    clock = Clock(node)
    amd = AmdAccelerator(probe=probe, environment={}, kfd_topology=topology)
    devices = amd.visible_devices()
    meter = AmdsmiMeterFactory(probe, clock=clock, sleep=clock.sleep, kfd_topology=topology).meter_for(
        devices, run_context(config())
    )
    assert isinstance(meter, AmdsmiMeter), getattr(meter, "reason", meter)
    try:
        meter.start()
        node.advance(1.0)
        return meter.stop()
    finally:
        meter.close()


def linked(a: int, b: int) -> int:
    """Aldebaran XGMI bandwidth: four links inside a package, one across, 50000 MB/s each."""
    return 4 * 50_000 if a // 2 == b // 2 else 50_000


# Where each release's HIP order comes from: the newest call it has, else the KFD topology files.
HIP_ORDER_SOURCE = {
    "6.0.2": "KFD topology",
    "6.2.4": "KFD topology",
    "6.3.0": "amdsmi_get_gpu_kfd_info node_id",
    "7.0.2": "amdsmi_get_gpu_enumeration_info hip_id",
}


@pytest.mark.parametrize("version", VERSIONS)
def test_discovery_through_the_real_binding(
    version: str, probe: SdkProbe, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    node = mi250x_node(bandwidth_mbs=linked)
    with real_amdsmi(version, node, monkeypatch, tmp_path):
        amd = AmdAccelerator(probe=probe, environment={}, kfd_topology=kfd_topology(tmp_path, node))
        devices = amd.visible_devices()
        hip_order = amd.node().hip_order
    assert [d.details["bdf"] for d in devices] == [A0, B0, A1, B1]  # HIP (KFD) order
    assert hip_order.startswith(HIP_ORDER_SOURCE[version])
    assert [d.details["package"] for d in devices] == ["package-0", "package-1", "package-0", "package-1"]
    assert {d.name for d in devices} == {"AMD Instinct MI250X"} or version in ("6.0.2", "6.2.4")
    assert node.initialized == 0


@pytest.mark.parametrize("version", VERSIONS)
def test_package_energy_through_the_real_binding(
    version: str, probe: SdkProbe, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    node = mi250x_node(bandwidth_mbs=linked, not_available=0xFFFF)
    with real_amdsmi(version, node, monkeypatch, tmp_path) as amdsmi:
        measurement = measure_one_second(amdsmi, node, probe, kfd_topology(tmp_path, node))
    assert measurement.unavailable_reason is None and measurement.method == "counter"
    assert measurement.components_joules["package-0"] == pytest.approx(450.0, rel=1e-4)
    assert measurement.components_joules["package-1"] == pytest.approx(450.0, rel=1e-4)
    package = measurement.details["packages"]["package-0"]
    assert package["reporting_gcds"] == [A0] and package["silent_gcds"] == [A1]
    assert package["gcds"][A0]["power_field"] == "average_socket_power"


@pytest.mark.parametrize("version", VERSIONS)
def test_a_field_at_its_own_maximum_is_no_reading(
    version: str, probe: SdkProbe, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Newer libamd_smi marks a missing uint32 field 0xFFFFFFFF; amdsmi maps only 0xFFFF to "N/A",
    so current_socket_power arrives as 4294967295 W and must not be read as power."""
    node = mi250x_node(bandwidth_mbs=linked, not_available=UINT32_MAX)
    with real_amdsmi(version, node, monkeypatch, tmp_path) as amdsmi:
        measurement = measure_one_second(amdsmi, node, probe, kfd_topology(tmp_path, node))
    assert measurement.method == "counter" and "counters_not_used" not in measurement.details
    assert measurement.energy_joules == pytest.approx(900.0, rel=1e-4)
    package = measurement.details["packages"]["package-0"]
    assert package["gcds"][A0]["power_field"] == "average_socket_power"
    assert package["counter"].startswith("validated") and package["reporting_gcds"] == [A0]


# Board serials as the FRU EEPROM gives them, one per OAM (made up, in no real format).
BOARDS = ("OAM-SERIAL-0071", "OAM-SERIAL-0087")
PACKAGES_IN_HIP_ORDER = ["package-0", "package-1", "package-0", "package-1"]


def discover_and_measure(version: str, node: SimNode, probe: SdkProbe, monkeypatch: Any, tmp_path: Path) -> Any:
    with real_amdsmi(version, node, monkeypatch, tmp_path) as amdsmi:
        topology = kfd_topology(tmp_path, node)
        amd = AmdAccelerator(probe=probe, environment={}, kfd_topology=topology)
        devices, found = amd.visible_devices(), amd.node()
        measurement = measure_one_second(amdsmi, node, probe, topology)
    return devices, found, measurement


@pytest.mark.parametrize("version", VERSIONS)
def test_siblings_found_by_board_serial_where_every_bandwidth_is_0_and_every_weight_15(
    version: str, probe: SdkProbe, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A real MI250X node on a kernel that leaves the XGMI link count unset: bandwidth 0 for every
    pair, and weight 15 for every pair, since every die is directly linked to every other. The link
    weight cannot tell; the board serial both dies of an OAM read from its FRU does."""
    node = mi250x_node(boards=BOARDS)
    devices, found, measurement = discover_and_measure(version, node, probe, monkeypatch, tmp_path)
    assert found.package_error is None
    assert [d.details["package"] for d in devices] == PACKAGES_IN_HIP_ORDER
    assert devices[0].details["package_gcds"] == [A0, A1]
    assert "amdsmi_get_gpu_board_info" in found.packages[0].rule
    assert measurement.components_joules["package-0"] == pytest.approx(450.0, rel=1e-4)
    assert measurement.components_joules["package-1"] == pytest.approx(450.0, rel=1e-4)


@pytest.mark.parametrize("version", ["6.0.2", "7.0.2"])
def test_siblings_found_by_the_silent_die_where_only_one_matching_exists(
    version: str, probe: SdkProbe, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Bandwidth 0, per-die serials, and the packages linked primary to primary (A0-B0) and
    secondary to secondary (A1-B1) only: weight 15 to the sibling and to one die across, 30 to the
    other. Each silent die (A1, B1) is directly linked to one reporting die only, its sibling."""

    def hops(a: int, b: int) -> int:
        return 2 if {a, b} in ({0, 3}, {1, 2}) else 1

    node = mi250x_node(hops=hops)
    devices, found, measurement = discover_and_measure(version, node, probe, monkeypatch, tmp_path)
    assert found.package_error is None
    assert [d.details["package"] for d in devices] == PACKAGES_IN_HIP_ORDER
    assert "silent die" in found.packages[0].rule and "silent die" in found.packages[1].rule
    assert measurement.components_joules["package-0"] == pytest.approx(450.0, rel=1e-4)


@pytest.mark.parametrize("version", ["6.0.2", "7.0.2"])
def test_link_weight_pairs_only_where_it_is_unique_and_mutual(
    version: str, probe: SdkProbe, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Where the dies of different packages are two hops apart (weights 15 inside, 30 across), the
    lowest weight is unique and mutual, and it pairs."""
    node = mi250x_node(hops=lambda a, b: 1 if a // 2 == b // 2 else 2)
    devices, found, _ = discover_and_measure(version, node, probe, monkeypatch, tmp_path)
    assert [d.details["package"] for d in devices] == PACKAGES_IN_HIP_ORDER
    assert "amdsmi_topo_get_link_weight" in found.packages[0].rule


@pytest.mark.parametrize("version", ["6.0.2", "7.0.2"])
def test_a_weight_pair_of_two_reporting_dies_is_refused(
    version: str, probe: SdkProbe, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Weights that make A0-B0 and A1-B1 each other's unique lowest: the old rule paired two
    primaries and two secondaries. Each package has one die that reports and one that does not
    (aldebaran_ppt.c), so both pairs are refused, and nothing else tells."""
    node = mi250x_node(hops=lambda a, b: 1 if {a, b} in ({0, 2}, {1, 3}) else 2)
    with real_amdsmi(version, node, monkeypatch, tmp_path):
        amd = AmdAccelerator(probe=probe, environment={}, kfd_topology=kfd_topology(tmp_path, node))
        devices, error = amd.visible_devices(), amd.node().package_error
    assert [d.details["package"] for d in devices] == [None] * 4
    assert error is not None and f"weight paired {A0} with {B0}, but both show power or both none" in error


@pytest.mark.parametrize("version", ["6.0.2", "7.0.2"])
def test_no_package_when_nothing_tells(
    version: str, probe: SdkProbe, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Bandwidth 0, every weight 15, per-die serials, every die linked to every other: A1 could be
    A0's or B0's, and nothing is guessed."""
    node = mi250x_node()
    with real_amdsmi(version, node, monkeypatch, tmp_path):
        amd = AmdAccelerator(probe=probe, environment={}, kfd_topology=kfd_topology(tmp_path, node))
        error = amd.node().package_error
    assert error is not None
    for source in (
        "amdsmi_get_minmax_bandwidth_between_processors",
        "amdsmi_topo_get_link_weight",
        "amdsmi_get_gpu_board_info",
        "silent",
    ):
        assert source in error


# --- the counter's faults, through the real binding ----------------------------------------------

RES = ctypes.c_float(RESOLUTION_UJ).value  # the C float amdsmi hands back for 15.3 uJ


def open_meter(node: SimNode, probe: SdkProbe, topology: Path, first: int | None = None) -> AmdsmiMeter:
    """A meter over the node's GCDs in HIP order (the first ``first`` of them), validated in simulated time."""
    clock = Clock(node)
    devices = AmdAccelerator(probe=probe, environment={}, kfd_topology=topology).visible_devices()[:first]
    meter = AmdsmiMeterFactory(probe, clock=clock, sleep=clock.sleep, kfd_topology=topology).meter_for(
        devices, run_context(config())
    )
    assert isinstance(meter, AmdsmiMeter), getattr(meter, "reason", meter)
    return meter


@pytest.mark.parametrize("version", VERSIONS)
def test_a_64_bit_counter_wrap_is_undone(
    version: str, probe: SdkProbe, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    node = mi250x_node(bandwidth_mbs=linked)
    node.gcds[0].accumulator = (1 << 64) - 10_000_000  # 153 J below the top: the window's 450 J pass it
    with real_amdsmi(version, node, monkeypatch, tmp_path):
        meter = open_meter(node, probe, kfd_topology(tmp_path, node), first=1)
        try:
            meter.start()
            start = node.gcds[0].accumulator
            node.advance(1.0)
            assert node.gcds[0].accumulator < start  # it did pass 2**64
            measurement = meter.stop()
        finally:
            meter.close()
    assert measurement.details["counter_wraps"] == {"package-0": 1}
    assert measurement.components_joules["package-0"] == pytest.approx(450.0, rel=1e-6)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_32_bit_counter_is_polled_so_no_wrap_is_missed(
    version: str, probe: SdkProbe, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    node = mi100_node()  # MI100: 2**32 ticks are 65.7 kJ, 227 s at 290 W
    with real_amdsmi(version, node, monkeypatch, tmp_path):
        meter = open_meter(node, probe, kfd_topology(tmp_path, node))
        try:
            node.gcds[0].accumulator = (1 << 32) - 2_000  # the window starts just below the top
            meter.start()
            assert meter.poll_seconds == 10.0
            for _ in range(4):  # 400 s, 116 kJ: more than the counter's range, read every 100 s
                node.advance(100.0)
                meter.poll()
            measurement = meter.stop()
        finally:
            meter.close()
    assert measurement.details["counter_wraps"] == {"package-0": 2}
    # Start and stop alone would have seen 2**32 ticks fewer: one wrap, ~50 kJ.
    assert measurement.energy_joules == pytest.approx(290.0 * 400.0, rel=1e-6)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_counter_stepping_back_is_an_error_not_a_wrap(
    version: str, probe: SdkProbe, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    node = mi250x_node(bandwidth_mbs=linked)
    node.gcds[0].accumulator = 4_750_896_266
    with real_amdsmi(version, node, monkeypatch, tmp_path):
        meter = open_meter(node, probe, kfd_topology(tmp_path, node), first=1)
        try:
            meter.start()
            node.gcds[0].accumulator -= 13_952_475  # as in ROCm/amdsmi issue #115: ~213 J back
            measurement = meter.stop()
        finally:
            meter.close()
    # The counter's figure is refused; the window's sampled power stands in, and the result says why.
    assert measurement.method == "sampled" and measurement.details["methods"] == {"package-0": "sampled"}
    assert "not a wrap" in measurement.details["counter_errors"]["package-0"]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_counter_off_by_more_than_10x_is_replaced_by_sampling(
    version: str, probe: SdkProbe, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    node = mi250x_node(bandwidth_mbs=linked)
    node.gcds[0].counter_scale = 40.0  # package A's counter runs 40x fast
    with real_amdsmi(version, node, monkeypatch, tmp_path):
        meter = open_meter(node, probe, kfd_topology(tmp_path, node))
        try:
            meter.start()
            time.sleep(0.05)
            node.advance(1.0)
            measurement = meter.stop()
        finally:
            meter.close()
    assert measurement.unavailable_reason is None and measurement.method == "mixed"
    assert measurement.details["methods"] == {"package-0": "sampled", "package-1": "counter"}
    assert "rejected" in measurement.details["counters_not_used"]["package-0"]
    assert measurement.details["packages"]["package-0"]["ratio"] == pytest.approx(40.0, rel=1e-3)
    window = measurement.details["sampled_joules"]["package-0"] / 450.0  # A draws 250 + 200 W
    assert 0.04 < window < 300.0  # the sleep's 50 ms at least; the upper bound only guards nonsense
    assert measurement.components_joules["package-1"] == pytest.approx(450.0, rel=1e-6)


@pytest.mark.parametrize("version", VERSIONS)
def test_frozen_or_unreadable_counters_fall_back_to_sampling(
    version: str, probe: SdkProbe, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    node = mi250x_node(bandwidth_mbs=linked)
    node.gcds[0].counter_scale = 0.0  # frozen (ROCm/amdsmi issue #38)
    node.gcds[2].failing["amdsmi_get_energy_count"] = NOT_SUPPORTED
    with real_amdsmi(version, node, monkeypatch, tmp_path):
        meter = open_meter(node, probe, kfd_topology(tmp_path, node))
        try:
            meter.start()
            measurement = meter.stop()
        finally:
            meter.close()
    off = measurement.details["counters_not_used"]
    assert "ratio 0" in off["package-0"]
    assert "AMDSMI_STATUS_NOT_SUPPORTED" in off["package-1"]  # the real exception's text
    assert measurement.method == "sampled" and measurement.energy_joules is not None


@pytest.mark.parametrize("version", VERSIONS)
def test_power_that_is_not_available_either_leaves_no_energy(
    version: str, probe: SdkProbe, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    node = mi250x_node(bandwidth_mbs=linked)
    node.gcds[0].counter_scale = 0.0  # frozen: rejected at validation, so power is sampled...
    with real_amdsmi(version, node, monkeypatch, tmp_path):
        meter = open_meter(node, probe, kfd_topology(tmp_path, node), first=1)
        node.gcds[0].failing["amdsmi_get_power_info"] = NOT_SUPPORTED  # ...and then cannot be read
        try:
            meter.start()
            measurement = meter.stop()
        finally:
            meter.close()
    assert measurement.energy_joules is None and "no complete power trace" in (measurement.unavailable_reason or "")
    assert "package-0" in measurement.details["counters_not_used"]


@pytest.mark.parametrize("version", VERSIONS)
def test_mi300x_reports_current_power_and_is_its_own_package(
    version: str, probe: SdkProbe, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    node = mi300x_node()
    with real_amdsmi(version, node, monkeypatch, tmp_path) as amdsmi:
        topology = kfd_topology(tmp_path, node)
        (device,) = AmdAccelerator(probe=probe, environment={}, kfd_topology=topology).visible_devices()
        measurement = measure_one_second(amdsmi, node, probe, topology)
    assert device.details["package"] == "package-0"
    assert measurement.components_joules["package-0"] == pytest.approx(700.0, rel=1e-6)
    assert measurement.details["packages"]["package-0"]["gcds"]["0000:05:00.0"]["power_field"] == "current_socket_power"


@pytest.mark.parametrize("version", VERSIONS)
def test_driver_not_loaded(version: str, probe: SdkProbe, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    node = mi250x_node(init_status=DRIVER_NOT_LOADED)
    with real_amdsmi(version, node, monkeypatch, tmp_path):
        meter = AmdsmiMeterFactory(probe).meter_for([], run_context(config()))
    assert isinstance(meter, UnavailableMeter)
    assert "amdsmi_init failed" in meter.reason and "AMDSMI_STATUS_DRIVER_NOT_LOADED" in meter.reason


@pytest.mark.parametrize("version", VERSIONS)
def test_missing_libamd_smi_gives_a_clear_reason(
    version: str,
    probe: SdkProbe,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The real package without ROCm: it prints the loader's error and raises KeyError at import."""
    package = unpacked(version)
    monkeypatch.setenv("ROCM_PATH", str(tmp_path / "no-rocm"))
    monkeypatch.syspath_prepend(str(package))
    forget_amdsmi()
    assert AmdsmiMeterFactory(probe).availability().available  # cheap: it imports nothing
    meter = AmdsmiMeterFactory(probe).meter_for([], run_context(config()))
    assert isinstance(meter, UnavailableMeter)
    assert "cannot load ROCm's libamd_smi.so" in meter.reason and "ROCM_PATH" in meter.reason
    assert "Unable to find" in meter.reason  # what the module printed, kept as the reason
    with pytest.raises(ConfigError) as refused:
        amd = AmdAccelerator(probe=probe, environment={})
        amd.max_replicas_for(run_context(config(), amd))
    assert "libamd_smi.so" in refused.value.allowed
    assert capsys.readouterr().out == ""  # nothing leaks onto stdout (it may carry --json output)
    assert "amdsmi" not in sys.modules
