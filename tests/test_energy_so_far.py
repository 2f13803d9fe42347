"""The energy so far (PowerMeter.read_joules_so_far): a counter read, or the sampled integral up to a
reading taken now, without ending the window; a meter set's sum; and a run to a target quality whose
every evaluation carries the energy since the clock started (docs/to-target.md)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import ClassVar

import pytest

from core import hookimpl
from core.api import run_here
from core.base.config import RunConfig
from core.base.results import DeviceRecord, EnergyMeasurement, RunState
from core.contract.accelerator import Availability
from core.contract.meter import PowerMeter, PowerMeterFactory
from core.energy.combined import Covers, MeterSet
from core.energy.meters import DeviceEnergyMeter, EnergyCounter, EnergySource
from core.testing import SimulatedClock, registered_plugins


class Ticks:
    """A counter the test moves by hand, one joule a tick; ``fail`` makes the next read raise."""

    def __init__(self) -> None:
        self.value = 0
        self.fail = False

    def __call__(self) -> tuple[int, float]:
        if self.fail:
            raise OSError("counter went away")
        return self.value, 1.0


def _meter(clock: SimulatedClock, ticks: Ticks, watts: Callable[[], float | None]) -> DeviceEnergyMeter:
    """A device with a counter and one with power alone (sampled every 0.1 s)."""
    return DeviceEnergyMeter(
        "test",
        [EnergySource("gpu0", counters=(EnergyCounter(ticks),)), EnergySource("ipu0", read_power_watts=watts)],
        sample_interval_seconds=0.1,
        sample_power=False,
        clock=clock,
    )


def test_a_device_meter_reads_counters_and_sampled_power_so_far_and_its_window_goes_on() -> None:
    clock, ticks = SimulatedClock(), Ticks()
    meter = _meter(clock, ticks, lambda: 50.0)
    meter.start()
    clock.wait_for_waiters(1)  # the sampler's thread
    so_far = []
    for _ in range(3):
        ticks.value += 200
        clock.run_for(1.0, 0.1)
        so_far.append(meter.read_joules_so_far())
    ticks.value += 200
    clock.run_for(1.0, 0.1)
    measurement = meter.stop()
    meter.close()
    # Each second: 200 J counted, 50 J of sampled power; the readings so far cost the window nothing.
    assert so_far == pytest.approx([250.0, 500.0, 750.0])
    assert measurement.energy_joules == pytest.approx(1000.0)
    assert measurement.components_joules == pytest.approx({"gpu0": 800.0, "ipu0": 200.0})
    assert meter.read_joules_so_far() is None  # stopped: no window to read


def test_energy_so_far_is_unknown_after_a_power_gap_or_a_failed_counter_read() -> None:
    clock, ticks = SimulatedClock(), Ticks()
    meter = _meter(clock, ticks, lambda: None if 0.25 <= clock.now() <= 0.35 else 50.0)
    assert meter.read_joules_so_far() is None  # not started
    meter.start()
    clock.wait_for_waiters(1)
    clock.run_for(0.2, 0.1)
    assert meter.read_joules_so_far() == pytest.approx(10.0)  # before the gap: whole so far
    clock.run_for(0.8, 0.1)
    assert meter.read_joules_so_far() is None  # ipu0's power was N/A for part of the window
    ticks.fail = True
    assert meter.read_joules_so_far() is None
    ticks.fail = False
    measurement = meter.stop()
    meter.close()
    assert measurement.energy_joules is None  # as stop() says, for the same gap


class Fixed(PowerMeter):
    """A meter with a fixed energy so far, or, for ``joules=None``, one written before the method."""

    def __init__(self, name: str, joules: float | None) -> None:
        self.name, self.joules = name, joules

    def start(self) -> None:
        pass

    def stop(self) -> EnergyMeasurement:
        return EnergyMeasurement(meter=self.name, method="counter", energy_joules=self.joules or 1.0)

    def read_joules_so_far(self) -> float | None:
        return self.joules if self.joules is not None else super().read_joules_so_far()


def test_a_meter_set_adds_the_counted_meters_so_far_as_stop_adds_them() -> None:
    device = (Covers("gpu", "device", ("devices",)), Fixed("gpu", 30.0))
    node = (Covers("bmc", "node", ("cpu", "fans")), Fixed("bmc", 12.0))
    beside = (Covers("rapl", "node", ("cpu",)), Fixed("rapl", 1000.0))
    assert MeterSet(device, [node]).read_joules_so_far() == pytest.approx(42.0)
    assert MeterSet(device, [], beside=[beside]).read_joules_so_far() == pytest.approx(30.0)  # itemised only
    older = (Covers("old", "node", ("fans",)), Fixed("old", None))
    assert MeterSet(device, [older]).read_joules_so_far() is None  # the default: cannot tell
    assert MeterSet(None, [node], "no device meter").read_joules_so_far() is None  # devices unmeasured


# --- a run to a target, with a meter over the real clock ---------------------------------------

WATTS = 20.0  # the simulated CPU's counter, joules per second of the real clock


class CpuCounterFactory(PowerMeterFactory):
    """A meter for the CPU run whose counter moves with the real clock, WATTS joules a second."""

    name: ClassVar[str] = "simulated-counter"
    accelerators: ClassVar[tuple[str, ...]] = ("cpu",)
    legacy: ClassVar[bool] = False

    def availability(self) -> Availability:
        return Availability.yes()

    def create(self, devices: list[DeviceRecord], config: RunConfig) -> PowerMeter:
        meter = DeviceEnergyMeter(
            self.name,
            [EnergySource("package-0", read_counter_joules=lambda: WATTS * time.monotonic())],
            sample_interval_seconds=1.0,
        )
        return Legacy(meter) if self.legacy else meter


class Legacy(PowerMeter):
    """The same meter as a third party's written before read_joules_so_far: stop() only."""

    def __init__(self, inner: PowerMeter) -> None:
        self.name, self.inner = inner.name, inner

    def start(self) -> None:
        self.inner.start()

    def stop(self) -> EnergyMeasurement:
        return self.inner.stop()


class LegacyFactory(CpuCounterFactory):
    name: ClassVar[str] = "simulated-legacy"
    legacy: ClassVar[bool] = True


class MeterPlugin:
    @hookimpl
    def core_register_power_meters(self, register: Callable[[PowerMeterFactory], None]) -> None:
        register(CpuCounterFactory())
        register(LegacyFactory())


TARGET = {"metric": "top1", "value": 0.9, "max_epochs": 30, "evaluate_every_samples": 480}


@pytest.mark.slow
def test_every_evaluation_of_a_run_to_target_carries_the_energy_so_far() -> None:
    with registered_plugins(MeterPlugin()):
        result = run_here("digits", "cpu", power_meter="simulated-counter", target=TARGET)
    outcome = result.to_target
    assert result.status.state is RunState.ok and outcome is not None and outcome.reached
    assert len(outcome.curve) >= 2  # evaluations every 15 updates of 32: the target is not met at the first
    joules = [point.joules for point in outcome.curve]
    assert None not in joules
    assert joules == sorted(joules) and len(set(joules)) == len(joules)  # increasing
    assert joules[-1] == outcome.training_joules == outcome.energy_to_target_joules
    # The meter's total (the result's energy) spans the clock and the partial reports' pauses, which the
    # clock and the energy to target leave out (TargetOutcome.paused_joules, read from the same counter).
    assert outcome.paused_seconds > 0 and outcome.paused_joules is not None
    assert result.energy_joules == pytest.approx(outcome.training_joules + outcome.paused_joules)  # type: ignore[operator]
    assert result.energy_seconds == pytest.approx(outcome.training_seconds + outcome.paused_seconds)
    # The meter's span holds the clock's, so each reading is at least the counter's rate times the
    # point's seconds (a lower bound that holds however busy the machine is).
    for point in outcome.curve:
        assert point.joules is not None and point.joules >= WATTS * point.seconds * 0.999


@pytest.mark.slow
def test_a_meter_without_a_reading_so_far_gives_the_last_point_its_total_only() -> None:
    with registered_plugins(MeterPlugin()):
        result = run_here("digits", "cpu", power_meter="simulated-legacy", target=TARGET)
    outcome = result.to_target
    assert result.status.state is RunState.ok and outcome is not None and len(outcome.curve) >= 2
    assert all(point.joules is None for point in outcome.curve[:-1])
    assert outcome.curve[-1].joules == outcome.energy_to_target_joules == result.energy_joules is not None
