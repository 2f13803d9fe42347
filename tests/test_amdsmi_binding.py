"""The AMD plugin through the real amdsmi Python package (6.0.2, 6.2.4, 6.3.0, 7.0.2), with only
libamd_smi.so simulated at the ctypes layer (tests/amdsmi_native.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from amdsmi_native import UINT32_MAX, VERSIONS, SimNode, mi250x_node, real_amdsmi

from core import RunConfig, make_config
from core.testing import run_context
from core_plugins.amd import smi
from core_plugins.amd.accelerator import AmdAccelerator
from core_plugins.amd.meter import AmdsmiMeter, AmdsmiMeterFactory
from core_plugins.probing import SdkProbe

A0, A1, B0, B1 = "0000:c1:00.0", "0000:c6:00.0", "0000:c9:00.0", "0000:ce:00.0"


def config() -> RunConfig:
    return make_config(workload="fcnn", accelerator="amd", micro_batch_size=4, power_sample_interval_seconds=0.01)


@pytest.fixture(autouse=True)
def _no_leaked_amdsmi_session() -> Any:
    yield
    assert smi.amdsmi_session.users == 0, "an amdsmi session was left open"


@pytest.fixture
def probe(tmp_path: Path) -> SdkProbe:
    (tmp_path / "kfd").write_text("")
    return SdkProbe(
        module="amdsmi", install_hint=smi.INSTALL_HINT, device_globs=(str(tmp_path / "kfd"),), device_hint="no /dev/kfd"
    )


class Clock:
    """Simulated time: sleeping runs the simulated node."""

    def __init__(self, node: SimNode) -> None:
        self.t, self.node = 1000.0, node

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds
        self.node.advance(seconds)


def kfd_topology(tmp_path: Path, node: SimNode) -> Path:
    """/sys/class/kfd/kfd/topology/nodes for amdsmi 6.0-6.2, which give no HIP order themselves."""
    root = tmp_path / "nodes"
    (root / "0").mkdir(parents=True)
    (root / "0" / "properties").write_text("cpu_cores_count 64\nsimd_count 0\n")
    for gcd in node.gcds:
        domain, bus, rest = gcd.bdf.split(":")
        device, function = (int(x, 16) for x in rest.split("."))
        location = (int(bus, 16) << 8) | (device << 3) | function
        (root / str(gcd.kfd_node)).mkdir()
        (root / str(gcd.kfd_node) / "properties").write_text(
            f"simd_count 440\nlocation_id {location}\ndomain {int(domain, 16)}\n"
        )
    return root


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


@pytest.mark.parametrize("version", VERSIONS)
def test_discovery_through_the_real_binding(
    version: str, probe: SdkProbe, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    node = mi250x_node(bandwidth_mbs=linked)
    with real_amdsmi(version, node, monkeypatch, tmp_path):
        amd = AmdAccelerator(probe=probe, environment={}, kfd_topology=kfd_topology(tmp_path, node))
        devices = amd.visible_devices()
    assert [d.details["bdf"] for d in devices] == [A0, B0, A1, B1]  # HIP (KFD) order
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


@pytest.mark.parametrize("version", VERSIONS)
def test_siblings_found_by_link_weight_when_every_xgmi_bandwidth_reads_zero(
    version: str, probe: SdkProbe, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    node = mi250x_node()  # bandwidth 0 for every pair; weights 15 inside a package, 30 across
    with real_amdsmi(version, node, monkeypatch, tmp_path) as amdsmi:
        topology = kfd_topology(tmp_path, node)
        devices = AmdAccelerator(probe=probe, environment={}, kfd_topology=topology).visible_devices()
        measurement = measure_one_second(amdsmi, node, probe, topology)
    assert [d.details["package"] for d in devices] == ["package-0", "package-1", "package-0", "package-1"]
    assert measurement.components_joules["package-0"] == pytest.approx(450.0, rel=1e-4)
    assert measurement.components_joules["package-1"] == pytest.approx(450.0, rel=1e-4)
    assert "amdsmi_topo_get_link_weight" in measurement.details["packages"]["package-0"]["rule"]


@pytest.mark.parametrize("version", ["6.0.2", "7.0.2"])
def test_no_package_when_neither_bandwidth_nor_weight_tells(
    version: str, probe: SdkProbe, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    node = mi250x_node(hops=lambda a, b: 1)
    with real_amdsmi(version, node, monkeypatch, tmp_path):
        amd = AmdAccelerator(probe=probe, environment={}, kfd_topology=kfd_topology(tmp_path, node))
        error = amd.node().package_error
    assert error is not None and "amdsmi_topo_get_link_weight" in error
