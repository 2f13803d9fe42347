"""core.energy.meters: the one energy pipeline every vendor meter is built on (counters, wraps, polling,
the completeness rule), tested on its own."""

from __future__ import annotations

import threading

import pytest

from core.energy.meters import DeviceEnergyMeter, EnergyCounter, EnergySource
from core.energy.sampling import SampledEnergy


class Ticks:
    """A counter the test moves by hand: (ticks, joules per tick)."""

    def __init__(self, value: int, joules_per_tick: float = 1e-6) -> None:
        self.value, self.joules_per_tick = value, joules_per_tick

    def __call__(self) -> tuple[int, float]:
        return self.value, self.joules_per_tick


def test_a_counter_counts_from_start_and_undoes_a_wrap() -> None:
    ticks = Ticks(900)
    counter = EnergyCounter(ticks, range_ticks=1000)
    assert counter.start() == 0.0
    ticks.value = 300  # passed 1000 and restarted: 100 + 300 ticks
    assert counter.read_joules() == pytest.approx(400e-6)
    assert counter.wraps == 1
    assert counter.start() == 0.0 and counter.wraps == 0  # a new window counts afresh


def test_a_small_step_back_is_refused_and_leaves_the_count_as_it_was() -> None:
    ticks = Ticks(600)
    counter = EnergyCounter(ticks, range_ticks=1000)
    counter.start()
    ticks.value = 700
    assert counter.read_joules() == pytest.approx(100e-6)
    ticks.value = 500  # back by 200 of 1000: no wrap can look like this when polled as the meter polls
    with pytest.raises(ValueError, match="not a wrap"):
        counter.read_joules()
    ticks.value = 800
    assert counter.read_joules() == pytest.approx(200e-6) and counter.wraps == 0


def test_a_counter_without_a_range_never_wraps_and_garbage_is_refused() -> None:
    ticks = Ticks(10)
    counter = EnergyCounter(ticks)
    counter.start()
    ticks.value = 5
    with pytest.raises(ValueError, match="range is unknown"):
        counter.read_joules()
    ticks.value = float("nan")  # type: ignore[assignment]
    with pytest.raises(ValueError):
        counter.read_joules()


def test_a_huge_absolute_count_keeps_every_tick() -> None:
    # 2**63 ticks of 15.3 uJ is 1.4e14 J: a float of it could not hold the 3 ticks between two reads.
    ticks = Ticks(2**63, 15.3e-6)
    counter = EnergyCounter(ticks, range_ticks=2**64)
    counter.start()
    ticks.value = 2**63 + 3
    assert counter.read_joules() == pytest.approx(3 * 15.3e-6, rel=1e-12)


def test_the_safe_gap_is_the_time_half_the_range_takes_at_max_power() -> None:
    counter = EnergyCounter(Ticks(0), range_ticks=10_000_000, max_power_watts=25.0)
    assert counter.safe_gap_seconds is None  # the tick's size is known after a read
    counter.start()
    assert counter.safe_gap_seconds == pytest.approx(10.0 / 25.0 / 2)


def test_components_outside_the_total_are_reported_but_not_summed() -> None:
    package, core_zone = Ticks(0), Ticks(0)
    clock = [0.0]
    meter = DeviceEnergyMeter(
        "test",
        [
            EnergySource("package", counters=(EnergyCounter(package),)),
            EnergySource("package/core", counters=(EnergyCounter(core_zone),), in_total=False),
        ],
        sample_interval_seconds=1.0,
        clock=lambda: clock[0],
    )
    meter.start()
    package.value, core_zone.value, clock[0] = 5_000_000, 3_000_000, 2.0
    measurement = meter.stop()
    assert measurement.energy_joules == pytest.approx(5.0) and measurement.mean_power_watts == pytest.approx(2.5)
    assert measurement.components_joules == pytest.approx({"package": 5.0, "package/core": 3.0})


def test_read_counter_joules_is_shorthand_for_one_counter() -> None:
    source = EnergySource("gpu0", read_counter_joules=lambda: 12.5, counter_wrap_joules=100.0)
    assert len(source.counters) == 1 and source.counters[0].range_ticks == 100.0
    with pytest.raises(ValueError, match="not both"):
        EnergySource("gpu0", read_counter_joules=lambda: 1.0, counters=(EnergyCounter(Ticks(0)),))


def test_only_a_whole_window_of_power_readings_is_a_figure() -> None:
    # One rule for every meter: coverage short of the whole window, however little, is no total.
    sampled = SampledEnergy(
        start_seconds=0.0,
        stop_seconds=10.0,
        components_joules={"a": 100.0, "b": 99.9},
        coverage={"a": 1.0, "b": 0.9995},
        unavailable_components=(),
        total_joules=199.9,
        unavailable_reason=None,
        sample_count=10,
        max_gap_seconds=1.0,
        error_count=0,
    )
    assert sampled.complete_components() == {"a"} and not sampled.complete
    assert sampled.to_measurement("m").energy_joules is None


class TickingClock:
    """Time that moves by 1 ms every time it is read: two readings are never at one instant, as on a
    machine busy enough to keep a thread waiting between them."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        self.t += 0.001
        return self.t

    def wait_until(self, deadline: float, stop: threading.Event) -> bool:
        stop.wait()  # the window ends before any deadline: only start's and stop's readings
        return True


def test_one_clock_times_the_counters_the_sampler_and_a_power_only_window() -> None:
    clock = TickingClock()
    meter = DeviceEnergyMeter(
        "test",
        [EnergySource("dev0", read_power_watts=lambda: 100.0)],
        sample_interval_seconds=10.0,
        clock=clock,
    )
    meter.start()
    measurement = meter.stop()
    meter.close()
    # Power alone: the window is the integral's own (its first reading to its last), so energy,
    # window and mean power agree however far apart the meter's and the sampler's readings fell.
    window = measurement.details["window_seconds"]
    assert measurement.energy_joules == pytest.approx(100.0 * window, rel=1e-12)
    assert measurement.mean_power_watts == pytest.approx(100.0, rel=1e-12)
