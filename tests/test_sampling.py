"""core.energy.sampling: trapezoid integration and the fixed-rate sampler, in simulated and in real time."""

from __future__ import annotations

import math
import threading
import time

import pytest

from core.base.results import PowerTimeline
from core.energy.sampling import FixedRateSampler, MonotonicClock, PowerTimelineRecorder, SampledEnergy, StopSignal


class SimClock:
    """Simulated time: waiting jumps straight to the deadline; past ``limit`` the sampler thread parks
    until stop(), so the test decides exactly when the window closes."""

    def __init__(self, limit: float) -> None:
        self.t = 0.0
        self.limit = limit
        self.parked = threading.Event()

    def now(self) -> float:
        return self.t

    def wait_until(self, deadline: float, stop: threading.Event) -> bool:
        if stop.is_set():
            return True
        if deadline > self.limit:
            self.parked.set()
            stop.wait()
            return True
        self.t = max(self.t, deadline)
        return False


def run_simulated(read, interval: float, limit: float, stop_at: float, **options) -> SampledEnergy:
    clock = SimClock(limit)
    sampler = FixedRateSampler(lambda: read(clock), interval, clock=clock, **options)
    sampler.start()
    assert clock.parked.wait(10), "sampler thread never reached the end of simulated time"
    clock.t = stop_at
    return sampler.stop()


# --- accuracy -----------------------------------------------------------------------------------


def test_step_100_to_300_watts_within_one_percent() -> None:
    step = 0.3037  # deliberately off the sampling grid
    result = run_simulated(lambda c: {"dev0": 100.0 if c.t < step else 300.0}, 0.01, 0.995, 1.0)
    exact = 100.0 * step + 300.0 * (1.0 - step)
    assert result.total_joules == pytest.approx(exact, rel=0.01)
    assert result.components_joules["dev0"] == result.total_joules
    assert result.coverage == {"dev0": 1.0} and result.complete
    assert result.mean_power_watts == pytest.approx(exact / 1.0, rel=0.01)


def test_linear_ramp_and_two_components() -> None:
    result = run_simulated(lambda c: {"a": 50.0 + 400.0 * c.t, "b": 20.0}, 0.01, 1.995, 2.0)
    assert result.components_joules["a"] == pytest.approx(50 * 2 + 200 * 4, rel=1e-9)  # exact for a ramp
    assert result.components_joules["b"] == pytest.approx(40.0, rel=1e-9)
    assert result.total_joules == pytest.approx(940.0, rel=1e-9)


class StampingClock(MonotonicClock):
    """Real time, remembering per thread the time it last gave: a reading can be taken at exactly
    the instant the sampler stamped it with, however long a busy machine keeps the thread waiting."""

    def __init__(self) -> None:
        self._stamps = threading.local()

    def now(self) -> float:
        self._stamps.t = super().now()
        return self._stamps.t

    def stamp(self) -> float:
        return self._stamps.t


def test_window_is_exactly_start_to_stop_in_real_time() -> None:
    # Power as a readable function of real time: a ramp, which the trapezoid rule integrates exactly,
    # so any error would come from window edges or timestamps.
    clock = StampingClock()
    t0 = clock.now()
    sampler = FixedRateSampler(lambda: {"cpu": 100.0 + 1000.0 * (clock.stamp() - t0)}, 0.005, clock=clock)
    sampler.start()
    time.sleep(0.3)
    result = sampler.stop()
    a, b = result.start_seconds - t0, result.stop_seconds - t0
    exact = 100.0 * (b - a) + 500.0 * (b * b - a * a)
    assert result.duration_seconds >= 0.3  # a sleep lasts at least its time
    assert result.total_joules == pytest.approx(exact, rel=1e-9)
    assert result.sample_count >= 2 and result.error_count == 0  # start and stop, and what the thread read


# --- scheduling ---------------------------------------------------------------------------------


def test_fixed_rate_does_not_drift_when_reads_are_slow() -> None:
    interval = 0.01
    times: list[float] = []

    def slow_read(clock: SimClock) -> dict[str, float]:
        times.append(clock.t)
        clock.t += 0.4 * interval  # each read costs 40% of the period
        return {"dev0": 1.0}

    result = run_simulated(slow_read, interval, 0.995, 1.0)
    # sleep(interval) after each read would sample every 14 ms (~72 readings); the grid keeps 10 ms.
    assert times[:-1] == pytest.approx([k * interval for k in range(100)])
    assert times[-1] == 1.0
    assert result.sample_count == 101
    assert result.max_gap_seconds == pytest.approx(interval)


def test_missed_deadlines_are_skipped_not_bunched() -> None:
    interval = 0.01
    times: list[float] = []

    def read(clock: SimClock) -> dict[str, float]:
        times.append(clock.t)
        if len(times) == 3:  # the reading at 20 ms takes 25 ms
            clock.t += 2.5 * interval
        return {"dev0": 1.0}

    run_simulated(read, interval, 0.095, 0.1)
    grid = [round(t / interval) for t in times[:-1]]
    assert grid == [0, 1, 2, 5, 6, 7, 8, 9]
    assert all(t == pytest.approx(k * interval) for t, k in zip(times, grid))


def test_stop_does_not_wait_for_the_next_interval() -> None:
    sampler = FixedRateSampler(lambda: {"x": 1.0}, 30.0)
    sampler.start()
    begun = time.monotonic()
    result = sampler.stop()
    assert time.monotonic() - begun < 15.0  # half the interval: stop() did not wait for the next reading
    assert result.sample_count == 2  # the synchronous start and stop readings


def test_start_stop_misuse() -> None:
    sampler = FixedRateSampler(lambda: {"x": 1.0}, 1.0)
    with pytest.raises(RuntimeError):
        sampler.stop()
    sampler.start()
    with pytest.raises(RuntimeError):
        sampler.start()
    sampler.stop()
    with pytest.raises(RuntimeError):
        sampler.stop()
    with pytest.raises(ValueError):
        FixedRateSampler(lambda: {}, 0.0)


# --- errors and N/A -----------------------------------------------------------------------------


def test_failing_reads_are_recorded_and_leave_a_hole() -> None:
    def read(clock: SimClock) -> dict[str, float]:
        if 0.5 <= clock.t < 0.53:  # readings at 0.50, 0.51, 0.52 fail
            raise OSError("driver hiccup")
        return {"dev0": 100.0}

    result = run_simulated(read, 0.01, 0.995, 1.0)
    assert result.error_count == 3
    assert result.errors == ("OSError: driver hiccup",)
    # segments 0.49-0.50 ... 0.52-0.53 touch a failed reading: 40 ms not integrated, never interpolated
    assert result.coverage["dev0"] == pytest.approx(0.96)
    assert result.components_joules["dev0"] == pytest.approx(96.0)
    assert not result.complete
    measurement = result.to_measurement("nvml")
    assert measurement.energy_joules is None
    assert "96%" in (measurement.unavailable_reason or "")
    assert measurement.details["error_count"] == 3


def test_reading_failing_for_the_whole_window_gives_no_total() -> None:
    def read() -> dict[str, float]:
        raise RuntimeError("NVML_ERROR_GPU_IS_LOST")

    sampler = FixedRateSampler(read, 0.005)
    sampler.start()
    time.sleep(0.05)
    result = sampler.stop()
    assert result.total_joules is None and result.sample_count == 0
    assert result.error_count >= 2
    assert "every power reading" in (result.unavailable_reason or "")
    assert "NVML_ERROR_GPU_IS_LOST" in (result.unavailable_reason or "")
    measurement = result.to_measurement("nvml")
    assert measurement.energy_joules is None and measurement.unavailable_reason == result.unavailable_reason


def test_na_components_partial_coverage_and_never_valid() -> None:
    def read(clock: SimClock) -> dict[str, float | None]:
        return {
            "gpu0": 200.0,
            "gpu1": 100.0 if clock.t < 0.5 else None,  # N/A for the second half
            "gpu2": None,  # never readable
            "gpu3": math.nan,  # NaN from a driver is N/A too
        }

    result = run_simulated(read, 0.01, 0.995, 1.0)
    assert result.components_joules == pytest.approx({"gpu0": 200.0, "gpu1": 49.0})
    assert result.coverage == pytest.approx({"gpu0": 1.0, "gpu1": 0.49})
    assert set(result.unavailable_components) == {"gpu2", "gpu3"}
    assert result.total_joules == pytest.approx(249.0)
    assert not result.complete
    measurement = result.to_measurement("nvml")
    assert measurement.energy_joules is None
    assert "gpu1 49%" in (measurement.unavailable_reason or "")
    assert "gpu2" in (measurement.unavailable_reason or "")


def test_a_reading_at_the_windows_end_adds_no_empty_span() -> None:
    # The sampler's last grid point falls on the instant stop() reads: a span of no length carries no
    # power, and would read as N/A in the timeline.
    result = run_simulated(lambda c: {"gpu0": 50.0}, 0.01, 1.0, 1.0)
    assert result.timeline is not None and result.sample_count == 102  # 0, 0.01, ..., 1.0 and stop's
    assert None not in result.timeline.watts["gpu0"] and len(result.timeline.start_seconds) == 100
    assert result.timeline.stop_seconds[-1] == pytest.approx(1.0)


def test_all_na_gives_no_total() -> None:
    result = run_simulated(lambda c: {"gpu0": None}, 0.01, 0.095, 0.1)
    assert result.total_joules is None
    assert "gpu0" in (result.unavailable_reason or "")


def test_complete_result_becomes_a_sampled_measurement() -> None:
    result = run_simulated(lambda c: {"gpu0": 150.0, "gpu1": 50.0}, 0.01, 0.995, 1.0)
    measurement = result.to_measurement("nvml", details={"devices": [0, 1]})
    assert measurement.method == "sampled"
    assert measurement.energy_joules == pytest.approx(200.0)
    assert measurement.components_joules == pytest.approx({"gpu0": 150.0, "gpu1": 50.0})
    assert measurement.mean_power_watts == pytest.approx(200.0)
    assert measurement.details["devices"] == [0, 1] and measurement.unavailable_reason is None


def test_a_hung_read_does_not_hang_stop() -> None:
    release = threading.Event()
    calls = {"n": 0}

    def read() -> dict[str, float]:
        calls["n"] += 1
        if calls["n"] == 2:  # the first background reading never returns (until the test ends)
            release.wait(10)
        return {"x": 10.0}

    sampler = FixedRateSampler(read, 0.01, join_timeout_seconds=0.2)
    sampler.start()
    while calls["n"] < 2:
        time.sleep(0.001)
    result = sampler.stop()
    release.set()
    assert result.total_joules == pytest.approx(10.0 * result.duration_seconds)
    assert any("still inside read_watts" in e for e in result.errors)


# --- power timeline -----------------------------------------------------------------------------


def timeline_joules(timeline: PowerTimeline, component: str) -> float:
    return sum(
        w * (stop - start)
        for w, start, stop in zip(timeline.watts[component], timeline.start_seconds, timeline.stop_seconds)
        if w is not None
    )


def test_timeline_tiles_the_window_and_adds_up_to_the_integral() -> None:
    step = 0.3037
    result = run_simulated(
        lambda c: {"gpu0": 100.0 if c.t < step else 300.0, "gpu1": 50.0 + 100.0 * c.t}, 0.01, 0.995, 1.0
    )
    timeline = result.timeline
    assert timeline is not None and len(timeline.start_seconds) == 100  # 1 s at 10 ms, under the 600 limit
    assert timeline.start_seconds[0] == 0.0 and timeline.stop_seconds[-1] == pytest.approx(1.0)
    assert all(a == b for a, b in zip(timeline.stop_seconds, timeline.start_seconds[1:]))  # contiguous
    for name in ("gpu0", "gpu1"):
        assert timeline_joules(timeline, name) == pytest.approx(result.components_joules[name], rel=1e-12)
    assert timeline.watts["gpu0"][0] == pytest.approx(100.0) and timeline.watts["gpu0"][-1] == pytest.approx(300.0)
    assert timeline.watts["gpu1"][50] == pytest.approx(50.0 + 100.0 * 0.505)  # mean of a ramp = its midpoint


def test_long_windows_are_merged_to_a_bounded_timeline_without_losing_energy() -> None:
    result = run_simulated(lambda c: {"gpu0": 200.0 + 100.0 * math.sin(c.t)}, 0.01, 9.995, 10.0, timeline_spans=64)
    timeline = result.timeline
    assert timeline is not None and 32 <= len(timeline.start_seconds) <= 64  # 1000 readings merged pairwise
    widths = [b - a for a, b in zip(timeline.start_seconds, timeline.stop_seconds)]
    # Halving keeps the spans even on a fixed grid; only the last may be part-filled when the window ends.
    assert max(widths[:-1]) == pytest.approx(min(widths[:-1]), rel=1e-6) and widths[-1] <= widths[0] * (1 + 1e-6)
    assert timeline_joules(timeline, "gpu0") == pytest.approx(result.total_joules, rel=1e-12)
    # Each span holds its own mean, so the curve keeps the sine's shape at the coarser resolution.
    middle = len(widths) // 2
    centre = (timeline.start_seconds[middle] + timeline.stop_seconds[middle]) / 2
    assert timeline.watts["gpu0"][middle] == pytest.approx(200.0 + 100.0 * math.sin(centre), abs=2.0)


def test_timeline_marks_na_spans_and_can_be_turned_off() -> None:
    result = run_simulated(lambda c: {"gpu0": 200.0, "gpu1": 100.0 if c.t < 0.5 else None}, 0.01, 0.995, 1.0)
    timeline = result.timeline
    assert timeline is not None
    assert timeline.watts["gpu1"][10] == pytest.approx(100.0) and timeline.watts["gpu1"][80] is None
    assert timeline_joules(timeline, "gpu1") == pytest.approx(result.components_joules["gpu1"])
    assert result.to_measurement("nvml").power_timeline == timeline  # kept with a partial result too
    off = run_simulated(lambda c: {"gpu0": 200.0}, 0.01, 0.995, 1.0, timeline_spans=0)
    assert off.timeline is None and off.total_joules == pytest.approx(200.0)


def test_timeline_recorder_rejects_a_zero_bound() -> None:
    with pytest.raises(ValueError, match="max_spans"):
        PowerTimelineRecorder(0)


# --- the sampler's thread stays light (issue 34) -------------------------------------------------


def test_the_stop_signal_waits_set_and_stays_set() -> None:
    signal = StopSignal()
    assert not signal.is_set() and signal.wait(0.0) is False and signal.wait(0.01) is False
    waited: list[bool] = []
    waiter = threading.Thread(target=lambda: waited.append(signal.wait(60.0)))
    waiter.start()
    signal.set()
    signal.set()  # harmless
    waiter.join(10)
    assert waited == [True] and signal.is_set()
    assert signal.wait(0.0) and signal.wait(None) and signal.wait(5.0)  # every later wait returns at once
    assert MonotonicClock().wait_until(time.monotonic() + 60.0, signal) is True


def test_the_timeline_does_not_keep_the_dicts_an_interval_came_in() -> None:
    # The sampler reuses one pair of dicts for every interval (no allocation per sample): the
    # recorder must copy what it keeps, in a new span and in one it adds to.
    recorder = PowerTimelineRecorder(max_spans=1)
    joules, covered = {"dev0": 10.0}, {"dev0": 0.1}
    recorder.add(0.0, 0.1, joules, covered)
    joules["dev0"], covered["dev0"] = 1e9, 1e9
    recorder.add(0.1, 0.2, {"dev0": 30.0}, {"dev0": 0.1})
    joules["dev0"], covered["dev0"] = 2e9, 2e9
    timeline = recorder.timeline(0.0, ["dev0"])
    assert timeline is not None and timeline.watts["dev0"] == [pytest.approx(200.0)]


def test_many_intervals_through_reused_dicts_keep_each_spans_energy() -> None:
    result = run_simulated(lambda c: {"dev0": 100.0 if c.t < 0.5 else 300.0, "dev1": 50.0}, 0.1, 0.95, 1.0)
    assert result.timeline is not None
    assert result.timeline.watts["dev1"] == [pytest.approx(50.0)] * 10
    assert result.timeline.watts["dev0"] == [pytest.approx(w) for w in [100.0] * 4 + [200.0] + [300.0] * 5]
    assert result.total_joules == pytest.approx(0.4 * 100.0 + 0.1 * 200.0 + 0.5 * 300.0 + 50.0)
