"""The gcipuinfo power meter: update mode, readings keyed by device id, "N/A", the trapezoid
integral of sampled power within 1 % of the exact energy of a step and of a ramp, and the power
attribute each card fills: an M2000's "ipu power", a C600's or C2's "total board power", counted once
per board (tests/fakes/graphcore/gcipuinfo.py cites the gc-info output each fake card copies)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import pytest

from core import UnavailableMeter, make_config
from core.energy.sampling import FixedRateSampler
from core.testing import SimulatedClock, run_context
from core_plugins.graphcore.accelerator import GraphcoreAccelerator, count_ipus
from core_plugins.graphcore.meter import (
    BOARD_POWER,
    IPU_POWER,
    GcipuinfoMeter,
    GcipuinfoMeterFactory,
    PowerReading,
    PowerSnapshot,
    list_devices,
    parse_power_watts,
    plan_readings,
    select_devices,
)

pytestmark = pytest.mark.usefixtures("fake_sdk")


def config(**options: Any) -> Any:
    return make_config(workload="fcnn", accelerator="graphcore", **options)


def test_power_strings() -> None:
    assert parse_power_watts("123.45W") == 123.45
    assert parse_power_watts(" 99.5 W ") == 99.5
    assert parse_power_watts("12.6 W") == 12.6  # a C600's "total board power"
    assert parse_power_watts("N/A") is None and parse_power_watts("") is None and parse_power_watts(None) is None
    with pytest.raises(ValueError, match="unexpected gcipuinfo power reading 'hot'"):
        parse_power_watts("hot")


def test_without_update_mode_gcipuinfo_returns_stale_power(fake_sdk: Any) -> None:
    # Why the meter turns update mode on: the fake, like the library, caches what it read at creation.
    watts = [100.0]
    fake_sdk.gcipuinfo.reset(fake_sdk.gcipuinfo.FakeMachine.with_ipus(1, power=lambda t: watts[0]))
    info = fake_sdk.gcipuinfo.gcipuinfo()
    watts[0] = 250.0
    assert info.getNamedAttributeForAll(fake_sdk.gcipuinfo.IpuPower) == ["100.00W"]
    info.setUpdateMode(True)
    assert info.getNamedAttributeForAll(fake_sdk.gcipuinfo.IpuPower) == ["250.00W"]


def test_readings_are_keyed_by_device_id_not_position(fake_sdk: Any) -> None:
    gcipuinfo = fake_sdk.gcipuinfo
    machine = gcipuinfo.reset(
        gcipuinfo.FakeMachine([gcipuinfo.FakeIpu(3, lambda t: 30.0), gcipuinfo.FakeIpu(7, lambda t: 70.0)])
    )
    info = gcipuinfo.gcipuinfo()
    info.setUpdateMode(True)
    seven, three = (PowerReading(f"ipu{i}", IPU_POWER, i, (i,)) for i in ("7", "3"))
    snapshot = PowerSnapshot(info, [seven, three])
    assert (snapshot.read(seven), snapshot.read(three)) == (70.0, 30.0)
    machine.ipus.reverse()  # the library lists the devices in another order: the readings follow the ids
    assert (snapshot.read(seven), snapshot.read(three)) == (70.0, 30.0)
    machine.ipus[0].power = lambda t: "N/A"
    assert snapshot.read(seven) is None  # "N/A" is no reading, not zero
    before = len(machine.refreshes)
    snapshot.read(seven)
    snapshot.read(three)
    assert len(machine.refreshes) == before + 1  # one gcipuinfo query per sample, not one per IPU


def test_the_ipus_of_this_process_are_read(fake_sdk: Any) -> None:
    pid = str(os.getpid())
    devices = [
        {"id": "0", "ipu power": "1W", "user process id": "1"},
        {"id": "1", "ipu power": "1W", "user process id": pid},
        {"id": "2", "ipu power": "1W", "user process id": pid},
        {"id": "16"},
    ]
    ids, scope = select_devices(devices, int(pid))
    assert ids == ["1", "2"] and "attached to this process" in scope
    ids, scope = select_devices(devices[:1] + devices[3:], int(pid))
    assert ids == ["0"] and "every IPU" in scope  # no power attribute: a multi-IPU device, not read


def run_meter(fake_sdk: Any, power: Callable[[float], float], seconds: float, interval: float) -> tuple[Any, list]:
    gcipuinfo = fake_sdk.gcipuinfo
    gcipuinfo.reset(gcipuinfo.FakeMachine.with_ipus(2, power=power, **{"user process id": str(os.getpid())}))
    return run_factory_meter(fake_sdk, seconds, interval)


def run_factory_meter(fake_sdk: Any, seconds: float, interval: float) -> tuple[Any, list]:
    """The factory's meter over the fake's current machine for ``seconds`` of simulated time, from 0
    (the machine's power traces read the same clock): its measurement and the clock times of the
    gcipuinfo refreshes it made (its samples). What it reads does not depend on how busy the machine is."""
    machine = fake_sdk.gcipuinfo.machine
    clock = SimulatedClock()
    machine.clock = clock.now
    factory = GcipuinfoMeterFactory(clock=clock)
    assert factory.availability().available and factory.reads("graphcore")
    meter = factory.meter_for([], run_context(config(power_sample_interval_seconds=interval), GraphcoreAccelerator()))
    assert isinstance(meter, GcipuinfoMeter)
    first = len(machine.refreshes)
    meter.start()
    clock.wait_for_waiters(1)  # the power sampler
    clock.run_for(seconds, interval)
    measurement = meter.stop()
    meter.close()
    return measurement, machine.refreshes[first:]


def test_a_step_from_100_to_300_watts_is_integrated_within_one_percent(fake_sdk: Any) -> None:
    switch = 0.2537  # of simulated time, off the sampling grid
    measurement, refreshes = run_meter(fake_sdk, lambda t: 100.0 if t < switch else 300.0, 0.5, 0.005)
    start, stop = refreshes[0], refreshes[-1]
    assert (start, stop) == (0.0, 0.5)
    exact_per_ipu = 100.0 * (min(stop, switch) - start) + 300.0 * max(0.0, stop - max(start, switch))
    assert measurement.energy_joules is not None, measurement
    assert measurement.method == "sampled" and measurement.details["energy_counted"] is False
    assert set(measurement.components_joules) == {"ipu0", "ipu1"}
    assert measurement.energy_joules == pytest.approx(2 * exact_per_ipu, rel=0.01)


def test_a_ramp_is_integrated_exactly(fake_sdk: Any) -> None:
    def ramp(t: float) -> float:
        return 100.0 + 400.0 * t  # 100 W rising 400 W/s from simulated time 0

    measurement, refreshes = run_meter(fake_sdk, ramp, 0.4, 0.005)
    start, stop = refreshes[0], refreshes[-1]
    exact_per_ipu = 0.5 * (ramp(start) + ramp(stop)) * (stop - start)  # the trapezoid rule is exact for a ramp
    assert measurement.energy_joules == pytest.approx(2 * exact_per_ipu, rel=1e-9)
    assert measurement.mean_power_watts is not None


@pytest.mark.parametrize(
    "trace,exact",
    [
        (lambda t: 100.0 if t < 0.5 else 300.0, 100.0 * 0.5 + 300.0 * 0.5),  # a step at 0.5 s
        (lambda t: 100.0 + 200.0 * t, 200.0),  # a ramp from 100 W to 300 W
    ],
)
def test_sampled_integral_in_simulated_time_is_within_one_percent(
    fake_sdk: Any, trace: Callable[[float], float], exact: float
) -> None:
    gcipuinfo = fake_sdk.gcipuinfo
    clock = SimulatedClock()
    machine = gcipuinfo.reset(gcipuinfo.FakeMachine.with_ipus(1, power=trace))
    machine.clock = clock.now
    info = gcipuinfo.gcipuinfo()
    info.setUpdateMode(True)
    reading = PowerReading("ipu0", IPU_POWER, "0", ("0",))
    snapshot = PowerSnapshot(info, [reading])
    sampler = FixedRateSampler(lambda: {"ipu0": snapshot.read(reading)}, 0.03, clock=clock)
    sampler.start()
    clock.wait_for_waiters(1)
    clock.run_for(1.0, 0.03)
    energy = sampler.stop()
    assert energy.duration_seconds == 1.0 and energy.complete
    assert math.isclose(energy.total_joules, exact, rel_tol=0.01), energy


def test_na_for_part_of_the_window_gives_no_total(fake_sdk: Any) -> None:
    measurement, _ = run_meter(fake_sdk, lambda t: None if t > 0.1 else 120.0, 0.25, 0.01)
    assert measurement.energy_joules is None
    assert "energy unknown" in (measurement.unavailable_reason or "")


def test_ipu_model_and_shared_partitions_give_reasons_not_numbers(fake_sdk: Any, monkeypatch: Any) -> None:
    factory = GcipuinfoMeterFactory()
    meter = factory.meter_for([], run_context(config(accelerator_options={"ipu_model": True}), GraphcoreAccelerator()))
    assert isinstance(meter, UnavailableMeter) and "IPU Model" in meter.reason
    # No IPU names this process and poprun started 2 instances: each would read the whole partition.
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    meter = factory.meter_for([], run_context(config(), GraphcoreAccelerator()))
    assert isinstance(meter, UnavailableMeter) and "counted once per instance" in meter.reason
    monkeypatch.delenv("OMPI_COMM_WORLD_SIZE")
    meter = factory.meter_for([], run_context(config(), GraphcoreAccelerator()))
    assert isinstance(meter, GcipuinfoMeter)
    meter.close()


def test_meter_is_unavailable_without_gcipuinfo(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gcipuinfo" else real(name, *a))
    reason = GcipuinfoMeterFactory().availability().reason or ""
    assert "gcipuinfo is not installed" in reason and "gcipuinfo-*.whl" in reason


def test_a_run_records_sampled_ipu_energy(fake_sdk: Any) -> None:
    from core import run
    from core.testing import TINY_FCNN

    gcipuinfo = fake_sdk.gcipuinfo
    gcipuinfo.reset(gcipuinfo.FakeMachine.with_ipus(4, power=lambda t: 150.0, **{"user process id": str(os.getpid())}))
    result = run(
        "fcnn",
        "graphcore",
        workload_options=TINY_FCNN,
        micro_batch_size=4,
        replicas=2,
        steps=3,
        warmup_steps=0,
        power_sample_interval_seconds=0.005,
    )
    assert result.status.ok, result.status
    assert result.energy is not None and result.energy.meter == "gcipuinfo" and result.energy.method == "sampled"
    components = result.energy.components_joules
    assert set(components) == {"ipu0", "ipu1", "ipu2", "ipu3"}
    assert max(components.values()) == pytest.approx(min(components.values()), rel=1e-9)  # 150 W each
    # The meter's window holds the timed window (it starts just before the clock, stops just after).
    assert result.energy_joules >= 4 * 150.0 * result.window_seconds * 0.99
    assert result.samples_per_watt_hour is not None


# --- which attribute each card fills, and the board it belongs to ---------------------------------


def own(**attributes: str) -> dict[str, str]:
    return {"user process id": str(os.getpid()), **attributes}


def test_an_m2000_is_read_by_each_ipus_own_power(fake_sdk: Any) -> None:
    gcipuinfo = fake_sdk.gcipuinfo
    gcipuinfo.reset(gcipuinfo.FakeMachine.with_ipus(2, power=lambda t: 150.0, **own()))
    measurement, refreshes = run_factory_meter(fake_sdk, 0.3, 0.01)
    assert measurement.details["power_attribute"] == {"ipu0": IPU_POWER, "ipu1": IPU_POWER}
    assert "board_power" not in measurement.details and not measurement.warnings
    assert refreshes[-1] - refreshes[0] == pytest.approx(0.3, rel=1e-9)
    for key in ("ipu0", "ipu1"):  # 150 W x the window, per IPU
        assert measurement.components_joules[key] == pytest.approx(150.0 * 0.3, rel=1e-9)


def test_c600_cards_are_read_by_board_power_one_board_per_ipu(fake_sdk: Any) -> None:
    gcipuinfo = fake_sdk.gcipuinfo
    gcipuinfo.reset(gcipuinfo.FakeMachine.with_c600_cards(2, board_power=lambda t: 12.6, **own()))
    assert gcipuinfo.gcipuinfo().getDevices()[0][IPU_POWER] == "N/A"  # as the C600 example shows
    measurement, refreshes = run_factory_meter(fake_sdk, 0.3, 0.01)
    boards = {"board-0063.0000.822391", "board-0063.0001.822391"}
    assert measurement.energy_joules is not None, measurement.unavailable_reason
    assert set(measurement.components_joules) == boards and measurement.method == "sampled"
    assert measurement.details["power_attribute"] == dict.fromkeys(boards, BOARD_POWER)
    assert measurement.details["board_power"]["board-0063.0000.822391"]["ipus_read_here"] == ["0"]
    assert "per board" in measurement.details["board_power_note"]
    window = refreshes[-1] - refreshes[0]
    for key in boards:  # by hand: 12.6 W x the window seconds, per card
        assert measurement.components_joules[key] == pytest.approx(12.6 * window, rel=1e-9)
    assert measurement.energy_joules == pytest.approx(2 * 12.6 * 0.3, rel=1e-9)


def test_a_c2_cards_two_ipus_share_one_board_reading_counted_once(fake_sdk: Any) -> None:
    gcipuinfo = fake_sdk.gcipuinfo
    gcipuinfo.reset(gcipuinfo.FakeMachine.with_c2_cards(1, board_power=lambda t: 99.5, **own()))
    assert IPU_POWER not in gcipuinfo.gcipuinfo().getDevices()[1]  # as the C2 example shows
    measurement, refreshes = run_factory_meter(fake_sdk, 0.3, 0.01)
    board = "board-0340.0000.919062"
    assert measurement.energy_joules is not None, measurement.unavailable_reason
    assert list(measurement.components_joules) == [board]
    assert measurement.details["device_ids"] == ["0", "1"]
    assert measurement.details["board_power"][board] == {
        "ipus_on_board": ["0", "1"],
        "ipus_read_here": ["0", "1"],
        "share_counted_here": "1",
    }
    # By hand: 99.5 W x the window seconds, once for the board, not once per IPU (which would be 2x).
    assert measurement.energy_joules == pytest.approx(99.5 * (refreshes[-1] - refreshes[0]), rel=1e-9)


def test_swig_map_proxies_without_get_are_read(fake_sdk: Any) -> None:
    gcipuinfo = fake_sdk.gcipuinfo
    machine = gcipuinfo.reset(gcipuinfo.FakeMachine.with_c2_cards(2, board_power=lambda t: 99.5, **own()))
    machine.swig_maps = True
    entry = gcipuinfo.gcipuinfo().getDevices()[0]
    assert not hasattr(entry, "get") and entry["board type"] == "C2"  # what broke device.get(...)
    assert list_devices(gcipuinfo.gcipuinfo())[3]["id"] == "3"
    assert count_ipus() == 4
    records = GraphcoreAccelerator().devices()
    assert [r.details["board serial number"] for r in records][:2] == ["0340.0000.919062"] * 2
    measurement, refreshes = run_factory_meter(fake_sdk, 0.3, 0.01)
    assert measurement.energy_joules == pytest.approx(2 * 99.5 * (refreshes[-1] - refreshes[0]), rel=1e-9)


@pytest.mark.parametrize(
    "absent, board_power, expected",
    [
        ((IPU_POWER, BOARD_POWER), 99.5, "IPU 1 (C2): 'ipu power' absent, 'total board power' absent"),
        ((), None, "IPU 0 (C600): 'ipu power' 'N/A', 'total board power' 'N/A'"),
    ],
)
def test_a_card_with_no_power_attribute_gives_unavailable_energy_with_the_reason(
    fake_sdk: Any, absent: tuple[str, ...], board_power: float | None, expected: str
) -> None:
    gcipuinfo = fake_sdk.gcipuinfo
    card = gcipuinfo.FakeMachine.with_c2_cards if absent else gcipuinfo.FakeMachine.with_c600_cards
    machine = gcipuinfo.reset(card(1, board_power=lambda t: board_power, **own()))
    for ipu in machine.ipus:
        ipu.absent = absent
    meter = GcipuinfoMeterFactory().meter_for([], run_context(config(), GraphcoreAccelerator()))
    assert isinstance(meter, UnavailableMeter), meter
    assert expected in meter.reason and "cannot be read" in meter.reason


def test_a_board_shared_by_two_instances_is_split_so_their_sum_counts_it_once(fake_sdk: Any) -> None:
    # Two poprun instances (processes 4001 and 4002) each hold one IPU of one C2. Each counts half the
    # board; the runner sums the instances, so the board is counted once in all.
    gcipuinfo = fake_sdk.gcipuinfo
    machine = gcipuinfo.reset(gcipuinfo.FakeMachine.with_c2_cards(1, board_power=lambda t: 99.5))
    machine.ipus[0].attributes["user process id"] = "4001"
    machine.ipus[1].attributes["user process id"] = "4002"
    info = gcipuinfo.gcipuinfo()
    info.setUpdateMode(True)
    listed = list_devices(info)
    watts_per_instance = []
    for pid, other in ((4001, "4002"), (4002, "4001")):
        ids, scope = select_devices(listed, pid)
        readings, unreadable = plan_readings(listed, ids)
        assert not unreadable and len(readings) == 1
        (reading,) = readings
        assert (reading.key, str(reading.share), reading.other_processes) == ("board-0340.0000.919062", "1/2", (other,))
        clock = SimulatedClock()
        machine.clock = clock.now
        meter = GcipuinfoMeter(info, readings, scope, 0.01, timeline_points=100, clock=clock)
        first = len(machine.refreshes)
        meter.start()
        clock.wait_for_waiters(1)
        clock.run_for(0.2, 0.01)
        measurement = meter.stop()
        meter.close()
        window = machine.refreshes[-1] - machine.refreshes[first]
        assert window == pytest.approx(0.2, rel=1e-9)
        assert measurement.energy_joules == pytest.approx(99.5 / 2 * window, rel=1e-9)  # half the board
        watts_per_instance.append(measurement.energy_joules / window)
        assert measurement.details["shared_boards"] == {
            "board-0340.0000.919062": {"other_processes": [other], "share_counted_here": "1/2"}
        }
        assert any("shared board" in w and "counts 1/2" in w for w in measurement.warnings), measurement.warnings
    assert sum(watts_per_instance) == pytest.approx(99.5, rel=1e-9)  # once per board across instances


def test_board_power_is_read_from_any_of_the_boards_ipus_that_lists_it(fake_sdk: Any) -> None:
    gcipuinfo = fake_sdk.gcipuinfo
    machine = gcipuinfo.reset(gcipuinfo.FakeMachine.with_c2_cards(1, **own()))
    machine.ipus[0].absent = (BOARD_POWER,)
    listed = list_devices(gcipuinfo.gcipuinfo())
    readings, unreadable = plan_readings(listed, select_devices(listed, os.getpid())[0])
    assert not unreadable and [(r.key, r.read_from, r.ipus) for r in readings] == [
        ("board-0340.0000.919062", "1", ("0", "1"))
    ]


def test_an_idle_sibling_on_the_board_leaves_the_whole_board_to_the_process_using_it(fake_sdk: Any) -> None:
    gcipuinfo = fake_sdk.gcipuinfo
    machine = gcipuinfo.reset(gcipuinfo.FakeMachine.with_c2_cards(1))
    machine.ipus[0].attributes["user process id"] = "4001"  # IPU 1 is held by no process
    listed = list_devices(gcipuinfo.gcipuinfo())
    (reading,), _ = plan_readings(listed, select_devices(listed, 4001)[0])
    assert (reading.ipus, reading.share, reading.other_processes) == (("0",), 1, ())
    assert reading.describe_board()["other_ipus_on_board"] == ["1"]
    # With nobody named, the whole partition is read: each board once, whole.
    ids, scope = select_devices(listed, 1)
    assert ids == ["0", "1"] and "every IPU" in scope
    (reading,), _ = plan_readings(listed, ids)
    assert (reading.ipus, reading.share) == (("0", "1"), 1)


def test_a_run_on_c2_cards_records_board_energy_and_samples_per_watt_hour(fake_sdk: Any) -> None:
    from core import run
    from core.testing import TINY_FCNN

    gcipuinfo = fake_sdk.gcipuinfo
    gcipuinfo.reset(gcipuinfo.FakeMachine.with_c2_cards(2, board_power=lambda t: 99.5, **own()))
    result = run(
        "fcnn",
        "graphcore",
        workload_options=TINY_FCNN,
        micro_batch_size=4,
        replicas=2,
        steps=3,
        warmup_steps=0,
        power_sample_interval_seconds=0.005,
    )
    assert result.status.ok, result.status
    assert result.energy is not None and result.energy.meter == "gcipuinfo", result.energy_unavailable_reason
    # The fake lists 4 IPUs on 2 cards, all named this process's: both boards, each counted once.
    assert set(result.energy.components_joules) == {"board-0340.0000.919062", "board-0340.0001.919062"}
    # A sampled meter's window is its integral's (real time here: the run's own).
    assert result.energy_joules == pytest.approx(2 * 99.5 * result.energy.details["window_seconds"], rel=1e-9)
    assert result.samples_per_watt_hour is not None
