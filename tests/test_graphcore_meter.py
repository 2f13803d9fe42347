"""The gcipuinfo power meter: update mode, readings keyed by device id, "N/A", and the trapezoid
integral of sampled power within 1 % of the exact energy of a step and of a ramp."""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from core import UnavailableMeter, make_config
from core.energy.sampling import FixedRateSampler
from core.testing import run_context
from core_plugins.graphcore.accelerator import GraphcoreAccelerator
from core_plugins.graphcore.meter import (
    GcipuinfoMeter,
    GcipuinfoMeterFactory,
    PowerSnapshot,
    parse_power_watts,
    select_devices,
)

pytestmark = pytest.mark.usefixtures("fake_sdk")


def config(**options: Any) -> Any:
    return make_config(workload="fcnn", accelerator="graphcore", **options)


def test_power_strings() -> None:
    assert parse_power_watts("123.45W") == 123.45
    assert parse_power_watts(" 99.5 W ") == 99.5
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
    snapshot = PowerSnapshot(info, ["7", "3"], gcipuinfo.IpuPower)
    assert (snapshot.read("7"), snapshot.read("3")) == (70.0, 30.0)
    machine.ipus.reverse()  # the library lists the devices in another order: the readings follow the ids
    assert (snapshot.read("7"), snapshot.read("3")) == (70.0, 30.0)
    machine.ipus[0].power = lambda t: "N/A"
    assert snapshot.read("7") is None  # "N/A" is no reading, not zero
    before = len(machine.refreshes)
    snapshot.read("7")
    snapshot.read("3")
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
    machine = gcipuinfo.reset(gcipuinfo.FakeMachine.with_ipus(2, power=power, **{"user process id": str(os.getpid())}))
    factory = GcipuinfoMeterFactory()
    assert factory.availability().available and factory.reads("graphcore")
    meter = factory.meter_for([], run_context(config(power_sample_interval_seconds=interval), GraphcoreAccelerator()))
    assert isinstance(meter, GcipuinfoMeter)
    first = len(machine.refreshes)
    meter.start()
    time.sleep(seconds)
    measurement = meter.stop()
    meter.close()
    return measurement, machine.refreshes[first:]


def test_a_step_from_100_to_300_watts_is_integrated_within_one_percent(fake_sdk: Any) -> None:
    switch = time.monotonic() + 0.25
    measurement, refreshes = run_meter(fake_sdk, lambda t: 100.0 if t < switch else 300.0, 0.5, 0.005)
    start, stop = refreshes[0], refreshes[-1]
    exact_per_ipu = 100.0 * (min(stop, switch) - start) + 300.0 * max(0.0, stop - max(start, switch))
    assert measurement.energy_joules is not None, measurement
    assert measurement.method == "sampled" and measurement.details["energy_counted"] is False
    assert set(measurement.components_joules) == {"ipu0", "ipu1"}
    assert measurement.energy_joules == pytest.approx(2 * exact_per_ipu, rel=0.01)


def test_a_ramp_is_integrated_within_one_percent(fake_sdk: Any) -> None:
    origin = time.monotonic()

    def ramp(t: float) -> float:
        return 100.0 + 400.0 * (t - origin)  # 100 W rising 400 W/s

    measurement, refreshes = run_meter(fake_sdk, ramp, 0.4, 0.005)
    start, stop = refreshes[0], refreshes[-1]
    exact_per_ipu = 0.5 * (ramp(start) + ramp(stop)) * (stop - start)
    assert measurement.energy_joules == pytest.approx(2 * exact_per_ipu, rel=0.01)
    assert measurement.mean_power_watts is not None


class SimulatedClock:
    """Time that moves only when the test says so; the sampler thread waits for it."""

    def __init__(self) -> None:
        self.t = 0.0
        self.target = 0.0
        self.waiting_for: float | None = None
        self._cond = threading.Condition()

    def now(self) -> float:
        return self.t

    def wait_until(self, deadline: float, stop: threading.Event) -> bool:
        with self._cond:
            self.waiting_for = deadline
            self._cond.notify_all()
            while deadline > self.target and not stop.is_set():
                self._cond.wait(0.01)
            if stop.is_set():
                return True
            self.t = deadline
            return False

    def advance_to(self, target: float) -> None:
        with self._cond:
            self.target = target
            self._cond.notify_all()
            while self.waiting_for is None or self.waiting_for <= target:
                self._cond.wait(0.01)
            self.t = target


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
    snapshot = PowerSnapshot(info, ["0"], gcipuinfo.IpuPower)
    sampler = FixedRateSampler(lambda: {"ipu0": snapshot.read("0")}, 0.03, clock=clock)
    sampler.start()
    clock.advance_to(1.0)
    energy = sampler.stop()
    assert energy.duration_seconds == 1.0 and energy.complete
    assert math.isclose(energy.total_joules, exact, rel_tol=0.01), energy


def test_na_for_part_of_the_window_gives_no_total(fake_sdk: Any) -> None:
    switch = time.monotonic() + 0.1
    measurement, _ = run_meter(fake_sdk, lambda t: None if t > switch else 120.0, 0.25, 0.01)
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
