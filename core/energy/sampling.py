"""Energy from power readings taken at a fixed rate: shared by every meter that can only read watts.

Vendor meters (NVML, gcipuinfo, ...) pass a ``read_watts`` callable that returns one reading per
component (device, rail); this module knows nothing about where the numbers come from.

The window is exactly [start, stop]: ``start()`` and ``stop()`` each take a reading synchronously,
so the first and last samples sit on the window's edges and no extrapolation is needed.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from core.base.results import EnergyMeasurement, PowerTimeline

# A reading: watts per component; None (or a missing key, or NaN) means "N/A" for that component.
Reading = Mapping[str, float | None]

_MAX_KEPT_ERRORS = 10  # distinct messages kept; a meter failing every 50 ms for hours must not grow memory
DEFAULT_TIMELINE_SPANS = 600  # 30 s at full resolution with the default 50 ms interval
_FULL = 1e-9  # relative tolerance under which coverage counts as the whole window (float sums of dt)


class StopFlag(Protocol):
    """What a clock's wait watches: ``threading.Event`` is one, :class:`StopSignal` a lighter one."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class StopSignal:
    """A stop flag whose wait is one call into C, a lock's timed acquire: the sampler waits on it
    every interval, in the process being measured, and ``threading.Event.wait`` runs a Condition's
    Python (a lock allocated, a waiter list kept) on each. Set once, it stays set."""

    def __init__(self) -> None:
        self._held = threading.Lock()
        self._held.acquire()  # released by set(): a waiter's acquire then succeeds at once
        self._setting = threading.Lock()
        self._set = False

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        with self._setting:
            if not self._set:
                self._set = True
                self._held.release()

    def wait(self, timeout: float | None = None) -> bool:
        if self._set:
            return True
        if self._held.acquire(timeout=-1 if timeout is None else timeout):
            self._held.release()  # for whoever waits next
            return True
        return self._set


class Clock(Protocol):
    """Time source and waiting primitive; injectable so tests can run the sampler in simulated time."""

    def now(self) -> float: ...

    def wait_until(self, deadline: float, stop: StopFlag) -> bool:
        """Return when the clock reads ``deadline`` (False) or as soon as ``stop`` is set (True)."""
        ...


class MonotonicClock:
    """The real clock: time.monotonic, waiting on the stop flag so stop() never waits a full interval."""

    def now(self) -> float:
        return time.monotonic()

    def wait_until(self, deadline: float, stop: StopFlag) -> bool:
        return stop.wait(max(0.0, deadline - time.monotonic()))


class _ReadClock:
    """A bare time function as a Clock: read for the timestamps, waited on in real time."""

    def __init__(self, read: Callable[[], float]) -> None:
        self._read = read

    def now(self) -> float:
        return self._read()

    def wait_until(self, deadline: float, stop: StopFlag) -> bool:
        return stop.wait(max(0.0, deadline - self._read()))


def as_clock(clock: Clock | Callable[[], float] | None) -> Clock:
    """The Clock a meter keeps: ``clock`` itself, a time function (``time.monotonic``) made one, or
    the real clock for None. One clock for a meter's timestamps, its sampling and its polling, so a
    test that moves it moves all three."""
    if clock is None:
        return MonotonicClock()
    if hasattr(clock, "wait_until") and hasattr(clock, "now"):
        return clock
    assert callable(clock)
    return _ReadClock(clock)


@dataclass
class _Span:
    """Consecutive readings' time [start, stop] with, per component, the energy integrated in it
    and the seconds it covered (less than the span where a reading was N/A)."""

    start: float
    stop: float
    joules: dict[str, float]
    covered_seconds: dict[str, float]
    intervals: int = 1  # sampling intervals merged into this span

    def absorb(self, later: _Span) -> None:
        self.intervals += later.intervals - 1
        self.absorb_interval(later.stop, later.joules, later.covered_seconds)

    def absorb_interval(self, stop: float, joules: dict[str, float], covered_seconds: dict[str, float]) -> None:
        """Add one sampling interval ending at ``stop`` (nothing allocated where the names are known)."""
        self.stop = stop
        self.intervals += 1
        own_joules, own_covered = self.joules, self.covered_seconds
        for name, added in joules.items():
            own_joules[name] = own_joules.get(name, 0.0) + added
            own_covered[name] = own_covered.get(name, 0.0) + covered_seconds[name]


class PowerTimelineRecorder:
    """Power over the window at bounded memory: the integral's own segments, merged pairwise.

    Each interval between two readings is added as it is integrated. A span holds up to
    ``intervals_per_span`` of them; when ``max_spans`` would be exceeded, neighbouring spans are
    merged two by two and the intervals per span double, so spans stay even, resolution halves,
    memory stays bounded however long the window, and the spans' joules add up to the integral.
    """

    def __init__(self, max_spans: int) -> None:
        if max_spans < 1:
            raise ValueError(f"max_spans must be at least 1, got {max_spans!r}")
        self._max = max_spans
        self._intervals_per_span = 1
        self._spans: list[_Span] = []

    def add(self, start: float, stop: float, joules: dict[str, float], covered_seconds: dict[str, float]) -> None:
        """Add one interval. ``joules`` and ``covered_seconds`` are read, not kept: the caller may
        reuse them (a span of its own copies them)."""
        spans = self._spans
        if spans and spans[-1].intervals < self._intervals_per_span:
            spans[-1].absorb_interval(stop, joules, covered_seconds)
            return
        if len(spans) == self._max:
            self._halve()
            spans = self._spans
            if spans[-1].intervals < self._intervals_per_span:  # an odd count left a half-full last span
                spans[-1].absorb_interval(stop, joules, covered_seconds)
                return
        spans.append(_Span(start, stop, dict(joules), dict(covered_seconds)))

    def _halve(self) -> None:
        merged: list[_Span] = []
        for k in range(0, len(self._spans), 2):
            span = self._spans[k]
            if k + 1 < len(self._spans):
                span.absorb(self._spans[k + 1])
            merged.append(span)
        self._spans = merged
        self._intervals_per_span *= 2

    def timeline(self, origin: float, components: Sequence[str]) -> PowerTimeline | None:
        if not self._spans:
            return None
        watts: dict[str, list[float | None]] = {}
        for name in components:
            watts[name] = [
                span.joules[name] / span.covered_seconds[name] if span.covered_seconds.get(name) else None
                for span in self._spans
            ]
        return PowerTimeline(
            start_seconds=[span.start - origin for span in self._spans],
            stop_seconds=[span.stop - origin for span in self._spans],
            watts=watts,
        )


@dataclass(frozen=True)
class SampledEnergy:
    """The integral over [start_seconds, stop_seconds] (clock readings), and how trustworthy it is."""

    start_seconds: float
    stop_seconds: float
    components_joules: dict[str, float]  # only components with some valid coverage
    coverage: dict[str, float]  # fraction of the window each component was integrated over, in [0, 1]
    unavailable_components: tuple[str, ...]  # seen, but never two valid readings in a row
    total_joules: float | None  # sum of components_joules; None when nothing could be integrated
    unavailable_reason: str | None
    sample_count: int  # readings that returned (failed readings are counted in error_count)
    max_gap_seconds: float  # largest time between consecutive readings, failed ones included
    error_count: int
    errors: tuple[str, ...] = field(default=())  # first distinct messages only
    timeline: PowerTimeline | None = None  # mean power per span, seconds from the window's start

    @property
    def duration_seconds(self) -> float:
        return self.stop_seconds - self.start_seconds

    @property
    def mean_power_watts(self) -> float | None:
        if self.total_joules is None or self.duration_seconds <= 0:
            return None
        return self.total_joules / self.duration_seconds

    @property
    def complete(self) -> bool:
        """True when every component was integrated over the whole window."""
        return (
            self.total_joules is not None
            and not self.unavailable_components
            and self.complete_components() == set(self.coverage)
        )

    def complete_components(self) -> set[str]:
        """The components integrated over the whole window: the only ones whose energy is known.
        (The sampler sets coverage to exactly 1.0 within float tolerance; anything less is a gap.)"""
        return {name for name, c in self.coverage.items() if c == 1.0 and name not in self.unavailable_components}

    def to_measurement(self, meter: str, details: Mapping[str, object] | None = None) -> EnergyMeasurement:
        """An EnergyMeasurement for the result. Partial coverage gives no total: a partial integral
        is an underestimate, not the window's energy, so it is kept in details only."""
        info: dict[str, object] = {
            "sample_count": self.sample_count,
            "max_gap_seconds": self.max_gap_seconds,
            "coverage": dict(self.coverage),
            **(details or {}),
        }
        if self.unavailable_components:
            info["unavailable_components"] = list(self.unavailable_components)
        if self.error_count:
            info["error_count"] = self.error_count
            info["errors"] = list(self.errors)
        if self.total_joules is None:
            return EnergyMeasurement(
                meter=meter, method="sampled", unavailable_reason=self.unavailable_reason, details=info
            )
        if not self.complete:
            partial = {name: c for name, c in self.coverage.items() if c < 1.0}
            missing = list(self.unavailable_components)
            info["partial_components_joules"] = dict(self.components_joules)
            reason = "power readings were N/A for part of the window"
            if partial:
                reason += " (coverage: " + ", ".join(f"{n} {c:.0%}" for n, c in partial.items()) + ")"
            if missing:
                reason += f"; never readable: {', '.join(missing)}"
            return EnergyMeasurement(
                meter=meter, method="sampled", unavailable_reason=reason, details=info, power_timeline=self.timeline
            )
        return EnergyMeasurement(
            meter=meter,
            method="sampled",
            energy_joules=self.total_joules,
            components_joules=dict(self.components_joules),
            mean_power_watts=self.mean_power_watts,
            details=info,
            power_timeline=self.timeline,
        )


@dataclass
class _Component:
    last_watts: float | None = None  # at the previous accepted reading
    joules: float = 0.0
    covered_seconds: float = 0.0


class FixedRateSampler:
    """Reads power at start, every ``interval_seconds`` on a fixed grid, and at stop; integrates it.

    Deadlines are start + k * interval (not sleep(interval) after each read), so a slow read does not
    stretch the period; deadlines missed entirely (a read slower than the interval) are skipped, not
    caught up in a burst. Incremental integration keeps memory constant however long the window.

    ``read_watts`` may run in the sampling thread and in the caller's thread at once (stop() reads
    without waiting for an in-flight background read, so the window's end is exact): it must be
    thread-safe, or take its own lock. Exceptions it raises are recorded, never propagated.
    """

    def __init__(
        self,
        read_watts: Callable[[], Reading],
        interval_seconds: float,
        *,
        clock: Clock | None = None,
        join_timeout_seconds: float = 5.0,
        timeline_spans: int = DEFAULT_TIMELINE_SPANS,
    ) -> None:
        if not interval_seconds > 0 or not math.isfinite(interval_seconds):
            raise ValueError(f"interval_seconds must be a positive number, got {interval_seconds!r}")
        self._read = read_watts
        self._interval = float(interval_seconds)
        self._clock: Clock = clock or MonotonicClock()
        self._join_timeout = join_timeout_seconds
        self._lock = threading.Lock()
        self._stop_event = StopSignal()
        self._thread: threading.Thread | None = None
        self._started = False
        self._stopping = False
        self._start_t = 0.0
        self._last_t: float | None = None
        self._components: dict[str, _Component] = {}
        self._sample_count = 0
        self._max_gap = 0.0
        self._error_count = 0
        self._errors: list[str] = []
        # 0 turns the timeline off; the integral does not depend on it.
        self._timeline = PowerTimelineRecorder(timeline_spans) if timeline_spans > 0 else None
        self._span_joules: dict[str, float] = {}  # one interval's, reused (see _accept)
        self._span_covered: dict[str, float] = {}

    # --- reading --------------------------------------------------------------------------------
    def _take(self) -> tuple[float, Reading | None, str | None]:
        """(time, reading or None, error). Reads outside the lock: a slow driver call must not block stop()."""
        t = self._clock.now()
        try:
            return t, self._read(), None
        except Exception as exc:  # noqa: BLE001 - any failure of a vendor call must be recorded, not raised
            return t, None, f"{type(exc).__name__}: {exc}"

    def _record_error(self, message: str) -> None:
        """Caller holds the lock."""
        self._error_count += 1
        if message not in self._errors and len(self._errors) < _MAX_KEPT_ERRORS:
            self._errors.append(message)

    def _accept(self, t: float, reading: Reading | None, error: str | None) -> None:
        """Integrate one reading. Caller holds the lock. A failed reading (None) is a hole for all.

        It runs once per interval in the measured process, so it allocates nothing once the
        components are known (the interval's energy goes through two dicts it reuses)."""
        if error is not None:
            self._record_error(error)
        last_t = self._last_t
        dt = 0.0 if last_t is None else t - last_t
        if dt < 0:
            return  # out of order (cannot happen with the stopping flag; guard the integral anyway)
        if dt > self._max_gap:
            self._max_gap = dt
        components = self._components
        if reading is not None:
            self._sample_count += 1
            if not reading.keys() <= components.keys():
                for name in reading:
                    components.setdefault(name, _Component())
        span_joules, span_covered = self._span_joules, self._span_covered
        span_joules.clear()
        span_covered.clear()
        for name, comp in components.items():
            watts = _valid(reading.get(name)) if reading is not None else None
            last_watts = comp.last_watts
            if last_watts is not None and watts is not None and last_t is not None:
                joules = 0.5 * (last_watts + watts) * dt
                comp.joules += joules
                comp.covered_seconds += dt
                span_joules[name] = joules
                span_covered[name] = dt
            comp.last_watts = watts
        if self._timeline is not None and last_t is not None and dt > 0:
            # A reading at the same moment as the last (the final one, where a sample fell on the
            # window's end) adds no energy: no span of no length, which would read as N/A power.
            self._timeline.add(last_t, t, span_joules, span_covered)
        self._last_t = t

    # --- window ---------------------------------------------------------------------------------
    def start(self) -> None:
        if self._started:
            raise RuntimeError("FixedRateSampler.start() called twice")
        self._started = True
        t, reading, error = self._take()
        with self._lock:
            self._start_t = t
            self._accept(t, reading, error)
        self._thread = threading.Thread(target=self._run, name="power-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # Names bound once: this loop runs in the measured process, every interval.
        clock, stop_event, lock, take, accept = self._clock, self._stop_event, self._lock, self._take, self._accept
        start_t, interval, floor = self._start_t, self._interval, math.floor
        k = 1
        while True:
            if clock.wait_until(start_t + k * interval, stop_event):
                return
            t, reading, error = take()
            with lock:
                if self._stopping:
                    return  # stop() has taken (or is taking) the final reading; later ones are outside the window
                accept(t, reading, error)
            # Next grid point strictly after now: skips deadlines a slow read overran, without drift.
            k = max(k + 1, floor((clock.now() - start_t) / interval) + 1)

    def stop(self) -> SampledEnergy:
        if not self._started or self._thread is None:
            raise RuntimeError("FixedRateSampler.stop() called before start()")
        # Set the flag before the final reading: every sample integrated so far was read before it.
        with self._lock:
            if self._stopping:
                raise RuntimeError("FixedRateSampler.stop() called twice")
            self._stopping = True
        t, reading, error = self._take()
        self._stop_event.set()
        self._thread.join(self._join_timeout)
        with self._lock:
            self._accept(t, reading, error)
            if self._thread.is_alive():  # a read_watts call hung; it is a daemon and its result is discarded
                self._record_error(f"sampling thread still inside read_watts after {self._join_timeout} s")
            return self._result(t)

    def joules_so_far(self) -> dict[str, float] | None:
        """The integral from start to a reading taken now, per component integrated over all of that
        time (the others are left out: a partial integral is an underestimate); the window goes on.
        None once stop() has begun. Safe beside the sampling thread: a background reading taken
        before this one but integrated after it is dropped as out of order, costing no energy."""
        if not self._started:
            raise RuntimeError("FixedRateSampler.joules_so_far() called before start()")
        t, reading, error = self._take()
        with self._lock:
            if self._stopping:
                return None
            self._accept(t, reading, error)
            now = self._last_t if self._last_t is not None else t
            return {
                name: comp.joules
                for name, comp in self._components.items()
                if self._coverage(comp, now - self._start_t) == 1.0
            }

    @staticmethod
    def _coverage(comp: _Component, duration: float) -> float:
        """The fraction of ``duration`` (from the start) the component was integrated over."""
        if duration > 0:
            frac = min(1.0, comp.covered_seconds / duration)
            return 1.0 if frac >= 1.0 - _FULL else frac
        return 1.0 if comp.last_watts is not None else 0.0  # zero-length: covered if the reading was valid

    def _result(self, stop_t: float) -> SampledEnergy:
        duration = stop_t - self._start_t
        joules: dict[str, float] = {}
        coverage: dict[str, float] = {}
        missing: list[str] = []
        for name, comp in self._components.items():
            frac = self._coverage(comp, duration)
            if frac <= 0.0:
                missing.append(name)
                continue
            joules[name] = comp.joules
            coverage[name] = frac
        total: float | None = sum(joules.values()) if joules else None
        reason: str | None = None
        if total is None:
            if self._sample_count == 0:
                last = self._errors[-1] if self._errors else "no reading returned"
                reason = f"every power reading in the window failed ({self._error_count} errors; e.g. {last})"
            elif not self._components:
                reason = "power readings named no component"
            else:
                reason = "no component had two consecutive valid power readings (all N/A): " + ", ".join(missing)
                if self._error_count:
                    reason += f"; {self._error_count} readings failed, e.g. {self._errors[-1]}"
        return SampledEnergy(
            start_seconds=self._start_t,
            stop_seconds=stop_t,
            components_joules=joules,
            coverage=coverage,
            unavailable_components=tuple(missing),
            total_joules=total,
            unavailable_reason=reason,
            sample_count=self._sample_count,
            max_gap_seconds=self._max_gap,
            error_count=self._error_count,
            errors=tuple(self._errors),
            timeline=self._timeline.timeline(self._start_t, list(self._components)) if self._timeline else None,
        )


def _valid(value: object) -> float | None:
    """A finite number of watts, or None ("N/A"); NaN/inf from a driver are N/A, not power."""
    if type(value) is float:  # the usual reading: no conversion, one test (NaN and inf are not < inf)
        return value if -math.inf < value < math.inf else None
    if value is None or isinstance(value, bool):
        return None
    try:
        watts = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return watts if math.isfinite(watts) else None
