"""core_plugins.cpu.rapl against fake powercap sysfs trees laid out like the kernel's."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.base.config import RunConfig
from core.contract.meter import UnavailableMeter
from core.testing import SimulatedClock, run_context
from core_plugins.cpu.rapl import RaplMeter, RaplMeterFactory, RaplZone, discover_zones

MAX = 262143328850  # max_energy_range_uj of a typical Intel package (2^32 - 1 units of 61.035 uJ)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def zone_dir(path: Path, name: str, energy_uj: int, max_uj: int = MAX) -> Path:
    path.mkdir(parents=True)
    (path / "name").write_text(name + "\n")
    (path / "energy_uj").write_text(f"{energy_uj}\n")
    (path / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return path


def kernel_tree(tmp_path: Path) -> Path:
    """Two packages with core and dram subzones, plus psys and an MMIO duplicate of package 0, with the
    kernel's symlinks: class/powercap/intel-rapl:N[:M] and class/powercap/intel-rapl -> devices/..."""
    devices = tmp_path / "devices" / "virtual" / "powercap"
    ctl = devices / "intel-rapl"
    zone_dir(ctl / "intel-rapl:0", "package-0", 1_000_000)
    zone_dir(ctl / "intel-rapl:0" / "intel-rapl:0:0", "core", 500_000)
    zone_dir(ctl / "intel-rapl:0" / "intel-rapl:0:1", "dram", 200_000)
    zone_dir(ctl / "intel-rapl:1", "package-1", 3_000_000)
    zone_dir(ctl / "intel-rapl:1" / "intel-rapl:1:0", "dram", 0)
    zone_dir(ctl / "intel-rapl:2", "psys", 7_000_000)
    zone_dir(devices / "intel-rapl-mmio" / "intel-rapl-mmio:0", "package-0", 1_000_000)
    (ctl / "enabled").write_text("1\n")
    root = tmp_path / "class" / "powercap"
    root.mkdir(parents=True)
    (root / "intel-rapl").symlink_to(ctl)
    (root / "intel-rapl-mmio").symlink_to(devices / "intel-rapl-mmio")
    (root / "intel-rapl-mmio:0").symlink_to(devices / "intel-rapl-mmio" / "intel-rapl-mmio:0")
    for n in ("0", "1", "2"):
        (root / f"intel-rapl:{n}").symlink_to(ctl / f"intel-rapl:{n}")
    for n, m in (("0", "0"), ("0", "1"), ("1", "0")):
        (root / f"intel-rapl:{n}:{m}").symlink_to(ctl / f"intel-rapl:{n}" / f"intel-rapl:{n}:{m}")
    return root


def set_energy(root: Path, rel: str, energy_uj: int) -> None:
    (root / rel / "energy_uj").write_text(f"{energy_uj}\n")


def config() -> RunConfig:
    return RunConfig(workload="fcnn", accelerator="cpu")


# --- discovery ----------------------------------------------------------------------------------


def test_discovers_each_kernel_zone_once(tmp_path: Path) -> None:
    zones = discover_zones(kernel_tree(tmp_path))
    assert [(z.key, z.in_total) for z in zones] == [
        ("package-0", True),
        ("package-0/core", False),
        ("package-0/dram", True),
        ("package-1", True),
        ("package-1/dram", True),
        ("psys", False),
    ]  # no duplicate from the intel-rapl/ hierarchy, the flat subzone links, or intel-rapl-mmio
    assert all(z.max_energy_range_uj == MAX for z in zones)


def test_discovers_plain_nested_directories(tmp_path: Path) -> None:
    # Hierarchy only (no flat links), as some container sysfs views show it.
    zone_dir(tmp_path / "intel-rapl" / "intel-rapl:0", "package-0", 0)
    zone_dir(tmp_path / "intel-rapl" / "intel-rapl:0" / "intel-rapl:0:0", "dram", 0)
    assert [z.key for z in discover_zones(tmp_path)] == ["package-0", "package-0/dram"]


# --- energy -------------------------------------------------------------------------------------


def test_two_packages_and_dram_match_a_hand_calculation(tmp_path: Path) -> None:
    root = kernel_tree(tmp_path)
    clock = Clock()
    meter = RaplMeter(discover_zones(root), clock=clock)
    meter.start()
    set_energy(root, "intel-rapl:0", 1_000_000 + 50_000_000)  # package-0: 50 J
    set_energy(root, "intel-rapl:0:0", 500_000 + 30_000_000)  # core: 30 J, inside package-0
    set_energy(root, "intel-rapl:0:1", 200_000 + 4_000_000)  # package-0 dram: 4 J
    set_energy(root, "intel-rapl:1", 3_000_000 + 40_000_000)  # package-1: 40 J
    set_energy(root, "intel-rapl:1:0", 6_000_000)  # package-1 dram: 6 J
    set_energy(root, "intel-rapl:2", 7_000_000 + 120_000_000)  # psys: 120 J, overlaps the packages
    clock.t += 2.0
    m = meter.stop()
    assert m.meter == "rapl" and m.method == "counter" and m.unavailable_reason is None
    assert m.energy_joules == pytest.approx(50 + 4 + 40 + 6)  # packages + dram; not core, not psys
    assert m.components_joules == pytest.approx(
        {
            "package-0": 50,
            "package-0/core": 30,
            "package-0/dram": 4,
            "package-1": 40,
            "package-1/dram": 6,
            "psys": 120,
        }
    )
    assert m.mean_power_watts == pytest.approx(50.0)
    assert m.details["wraps"] == 0
    assert [z["zone"] for z in m.details["zones"]][:3] == ["package-0", "package-0/core", "package-0/dram"]


def test_wrap_is_handled(tmp_path: Path) -> None:
    zone_dir(tmp_path / "intel-rapl:0", "package-0", MAX - 1_000_000)
    meter = RaplMeter(discover_zones(tmp_path))
    meter.start()
    set_energy(tmp_path, "intel-rapl:0", 2_500_000)  # end < start: passed MAX and restarted at 0
    m = meter.stop()
    assert m.energy_joules == pytest.approx(3.5)  # (MAX - (MAX - 1e6)) + 2.5e6 uJ
    assert m.details["wraps"] == 1 and m.details["zones"][0]["wraps"] == 1


def test_several_wraps_are_counted_by_polling(tmp_path: Path) -> None:
    start = MAX - 1_000_000
    zone_dir(tmp_path / "intel-rapl:0", "package-0", start)
    clock = Clock()
    meter = RaplMeter(discover_zones(tmp_path), clock=clock)
    meter.start()
    step_uj = 100_000_000_000  # 100 kJ per 200 s (500 W): under half the 262 kJ range between reads
    for k in (1, 2, 3):  # the counter wraps before the first and the third poll
        clock.t += 200.0  # inside the 262 s in which 500 W passes half the range
        set_energy(tmp_path, "intel-rapl:0", (start + k * step_uj) % MAX)
        meter.poll()
    clock.t += 200.0
    set_energy(tmp_path, "intel-rapl:0", (start + 4 * step_uj) % MAX)
    m = meter.stop()
    # 400 kJ, more than a whole range: reads at start and stop alone would have seen one wrap.
    assert m.details["wraps"] == 2 and m.details["polls"] == 3
    assert m.energy_joules == pytest.approx(4 * step_uj / 1e6)


def test_a_small_step_back_is_an_error_not_a_wrap(tmp_path: Path) -> None:
    # A counter that steps back by less than half its range did not wrap (polled as it is, it
    # cannot have passed half its range): the read is refused, never counted as energy.
    zone_dir(tmp_path / "intel-rapl:0", "package-0", 5_000_000_000)
    meter = RaplMeter(discover_zones(tmp_path))
    meter.start()
    set_energy(tmp_path, "intel-rapl:0", 4_000_000_000)
    m = meter.stop()
    assert m.energy_joules is None and "not a wrap" in (m.unavailable_reason or "")


def test_background_thread_polls_fast_enough_for_small_ranges() -> None:
    # A 10 J counter at 20 W wraps every 0.5 s; with max_power_watts=25 half its range passes in 0.2 s at
    # the most, so the meter polls every 0.1 s (room for scheduling delays) and both wraps in 1.2 s count.
    # In simulated time: the poller's waits and the counter follow the test's clock, not the machine's load.
    zone = RaplZone("package-0", Path("/fake/intel-rapl:0"), 10_000_000, True)
    clock = SimulatedClock()

    def read_text(path: Path) -> str:  # 20 W from time 0, in the counter's microjoules
        return str(round(20e6 * clock.now()) % 10_000_000)

    meter = RaplMeter([zone], read_text=read_text, max_power_watts=25.0, clock=clock)
    assert meter.poll_interval_seconds == pytest.approx(0.1)
    meter.start()
    clock.wait_for_waiters(1)  # the poller
    clock.run_for(1.2, 0.05)
    m = meter.stop()
    assert m.unavailable_reason is None, m.unavailable_reason
    assert m.details["wraps"] == 2 and m.details["polls"] >= 11
    assert m.details["window_seconds"] == pytest.approx(1.2, rel=1e-9)
    assert m.energy_joules == pytest.approx(24.0, rel=1e-9)


def test_a_gap_long_enough_to_hide_a_wrap_is_unavailable(tmp_path: Path) -> None:
    zone_dir(tmp_path / "intel-rapl:0", "package-0", 0)
    clock = Clock()
    meter = RaplMeter(discover_zones(tmp_path), clock=clock)  # 262 kJ at 500 W: ~524 s per wrap
    meter.start()
    clock.t += 600.0  # the poller never ran (suspended host, say)
    set_energy(tmp_path, "intel-rapl:0", 1_000_000)
    m = meter.stop()
    assert m.energy_joules is None
    assert "600.0 s" in (m.unavailable_reason or "") and "wrap" in (m.unavailable_reason or "")


# --- failures are reasons, never numbers --------------------------------------------------------


def test_failed_read_at_stop_is_unavailable_not_a_wrap(tmp_path: Path) -> None:
    root = kernel_tree(tmp_path)
    meter = RaplMeter(discover_zones(root))
    meter.start()
    energy = tmp_path / "devices/virtual/powercap/intel-rapl/intel-rapl:1/energy_uj"
    energy.unlink()
    energy.mkdir()  # reading it now raises IsADirectoryError (chmod 000 would not stop root)
    m = meter.stop()
    # No total; the zones that were read keep their figures, the failed one has none.
    assert m.energy_joules is None and "package-1" not in m.components_joules
    assert m.components_joules["package-0"] == 0.0
    assert "intel-rapl:1/energy_uj" in (m.unavailable_reason or "")
    assert "IsADirectoryError" in (m.unavailable_reason or "")


def test_garbage_counter_at_stop_is_unavailable(tmp_path: Path) -> None:
    zone_dir(tmp_path / "intel-rapl:0", "package-0", 5_000_000)
    meter = RaplMeter(discover_zones(tmp_path))
    meter.start()
    set_energy(tmp_path, "intel-rapl:0", 0)
    (tmp_path / "intel-rapl:0" / "energy_uj").write_text("")  # empty: must not read as 0, i.e. a wrap
    m = meter.stop()
    assert m.energy_joules is None and "ValueError" in (m.unavailable_reason or "")


def test_failed_read_at_start_is_reported_at_stop(tmp_path: Path) -> None:
    zone_dir(tmp_path / "intel-rapl:0", "package-0", 0)

    def deny(path: Path) -> str:
        raise PermissionError(13, "Permission denied", str(path))

    meter = RaplMeter(discover_zones(tmp_path), read_text=deny)
    meter.start()
    m = meter.stop()
    assert m.energy_joules is None and "Permission denied" in (m.unavailable_reason or "")


def test_stop_without_start_is_unavailable(tmp_path: Path) -> None:
    zone_dir(tmp_path / "intel-rapl:0", "package-0", 0)
    m = RaplMeter(discover_zones(tmp_path)).stop()
    assert m.energy_joules is None and "before start()" in (m.unavailable_reason or "")


def test_failed_poll_is_recorded_and_the_next_read_still_counts(tmp_path: Path) -> None:
    zone_dir(tmp_path / "intel-rapl:0", "package-0", 0)
    fail = {"now": False}

    def read_text(path: Path) -> str:
        if fail["now"] and path.name == "energy_uj":
            raise OSError(5, "Input/output error")
        return path.read_text()

    meter = RaplMeter(discover_zones(tmp_path), read_text=read_text)
    meter.start()
    set_energy(tmp_path, "intel-rapl:0", 3_000_000)
    fail["now"] = True
    meter.poll()
    fail["now"] = False
    set_energy(tmp_path, "intel-rapl:0", 8_000_000)
    m = meter.stop()
    assert m.energy_joules == pytest.approx(8.0)
    assert m.details["poll_error_count"] == 1 and "Input/output error" in m.details["poll_errors"][0]


# --- factory ------------------------------------------------------------------------------------


def test_factory_reads_cpu_and_creates_a_meter(tmp_path: Path) -> None:
    factory = RaplMeterFactory(root=kernel_tree(tmp_path))
    assert factory.name == "rapl" and factory.reads("cpu") and not factory.reads("nvidia")
    assert factory.availability().available
    meter = factory.meter_for([], run_context(config()))
    assert isinstance(meter, RaplMeter) and len(meter.zones) == 6


@pytest.mark.parametrize("make_root", [lambda p: p / "missing", lambda p: p])
def test_no_zones_is_unavailable(tmp_path: Path, make_root) -> None:
    factory = RaplMeterFactory(root=make_root(tmp_path))
    availability = factory.availability()
    assert not availability.available and "no RAPL zones" in (availability.reason or "")
    meter = factory.meter_for([], run_context(config()))
    assert isinstance(meter, UnavailableMeter)
    m = meter.stop()
    assert m.energy_joules is None and "no RAPL zones" in (m.unavailable_reason or "")


def test_permission_denied_explains_the_fix(tmp_path: Path) -> None:
    root = kernel_tree(tmp_path)

    def read_text(path: Path) -> str:
        if path.name == "energy_uj":  # what a non-root user gets since the CVE-2020-8694 fix
            raise PermissionError(13, "Permission denied", str(path))
        return path.read_text()

    availability = RaplMeterFactory(root=root, read_text=read_text).availability()
    assert not availability.available
    reason = availability.reason or ""
    assert "permission denied" in reason and "intel-rapl:0/energy_uj" in reason
    assert "root" in reason and "CVE-2020-8694" in reason and "chmod" in reason


def test_unreadable_counter_is_unavailable(tmp_path: Path) -> None:
    zone_dir(tmp_path / "intel-rapl:0", "package-0", 0)
    (tmp_path / "intel-rapl:0" / "energy_uj").unlink()
    (tmp_path / "intel-rapl:0" / "energy_uj").mkdir()
    availability = RaplMeterFactory(root=tmp_path).availability()
    assert not availability.available and "energy_uj" in (availability.reason or "")


def test_psys_only_is_unavailable(tmp_path: Path) -> None:
    zone_dir(tmp_path / "intel-rapl:0", "psys", 0)
    availability = RaplMeterFactory(root=tmp_path).availability()
    assert not availability.available and "package" in (availability.reason or "")
