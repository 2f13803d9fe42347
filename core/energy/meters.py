"""A power meter built from per-device energy counters and/or instantaneous power readings.

Vendors differ in what their devices expose (NVML: a millijoule counter and instantaneous power;
amdsmi: an accumulator x resolution that can wrap, and power in whole watts; gcipuinfo: power
only), not in how a window's energy is measured. A vendor plugin describes each device as an
``EnergySource``; this meter does the rest, identically for all:

- a counter is read at the window's start and stop and, where it can wrap, polled in between often
  enough that no wrap is missed (:class:`EnergyCounter`); it is the measurement;
- where power can be read, a fixed-rate sampler integrates it over the same window (trapezoid
  rule): the measurement for devices without a counter, a cross-check for those with one;
- the method is recorded per device, and the counter / sampled ratio where both exist.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from core.base.results import EnergyMeasurement
from core.contract.meter import PowerMeter
from core.energy.sampling import DEFAULT_TIMELINE_SPANS, Clock, FixedRateSampler, as_clock

# Counter and sampled integral further apart than this get a warning in the result. Both measure
# the same window; a gap this size means the window is short against the counter's update period,
# or power changes faster than the sampling interval (one vendor's averaged power lags, say).
CROSS_CHECK_TOLERANCE = 0.05


# Longest wait between two polls of a counter that can wrap, whatever its range.
MAX_POLL_SECONDS = 10.0


class EnergyCounter:
    """One hardware energy accumulator, read as joules since :meth:`start`.

    ``read`` returns ``(ticks, joules per tick)``. A counter with a known range (it restarts at 0
    after ``range_ticks``) is polled often enough that it passes less than half its range
    between two reads, so a read below the previous one by more than half the range is one
    wrap, and a smaller step back is an error, never energy (amdsmi issue #115 reports counters
    that stepped back). ``max_power_watts`` bounds how fast the counter can move: with it, the
    meter knows how long a gap between reads is safe (:attr:`safe_gap_seconds`: less than half
    the range can pass), polls at half that, and reports a longer gap as unknown energy rather
    than guess (after such a gap a wrap could pass for a step back, and a later read for none).
    Counting is in ticks from the first read: a float of a counter's absolute value can be too
    coarse for the joules between two reads.
    Thread-safe: the meter's poller and the caller read it.
    """

    def __init__(
        self,
        read: Callable[[], tuple[int | float, float]],
        range_ticks: int | float | None = None,
        max_power_watts: float | None = None,
    ) -> None:
        self._read = read
        self.range_ticks = range_ticks
        self.max_power_watts = max_power_watts
        self.joules_per_tick: float | None = None
        self.wraps = 0
        self._first: int | float | None = None
        self._last: int | float | None = None
        self._lock = threading.Lock()

    @property
    def last_ticks(self) -> int | float | None:
        return self._last

    @property
    def safe_gap_seconds(self) -> float | None:
        """The longest time between reads in which the counter passes at most half its range."""
        if self.range_ticks is None or self.max_power_watts is None or self.joules_per_tick is None:
            return None
        return self.range_ticks * self.joules_per_tick / self.max_power_watts / 2

    def start(self) -> float:
        """Read the counter and count from here (what was counted before is dropped)."""
        with self._lock:
            self._first = self._last = None
            self.wraps = 0
        return self.read_joules()

    def read_joules(self) -> float:
        """Joules since :meth:`start` (or the first read). Raises if the read fails or the counter
        stepped back; the counter is then left as it was."""
        ticks, joules_per_tick = self._read()
        if isinstance(ticks, bool) or not math.isfinite(ticks) or not math.isfinite(joules_per_tick):
            raise ValueError(f"counter read {ticks!r} x {joules_per_tick!r} J")
        with self._lock:
            if self._last is not None and ticks < self._last:
                back = self._last - ticks
                if self.range_ticks is None:
                    raise ValueError(
                        f"energy counter went backwards ({self._last} -> {ticks}) and its range is unknown"
                    )
                if back <= self.range_ticks / 2:
                    raise ValueError(
                        f"energy counter went back by {back} ticks ({back * joules_per_tick:.3f} J), "
                        f"which is not a wrap of its range of {self.range_ticks} ticks"
                    )
                self.wraps += 1
            if self._first is None:
                self._first = ticks
            self._last = ticks
            self.joules_per_tick = joules_per_tick
            wrapped = self.wraps * self.range_ticks if self.wraps and self.range_ticks is not None else 0
            return (wrapped + ticks - self._first) * joules_per_tick


@dataclass(frozen=True)
class EnergySource:
    """One device (or package, or zone) as the meter reads it; the readers may raise on failure.

    The counter is ``counters`` (summed: a package whose dies each have one), or the shorthand
    ``read_counter_joules`` with ``counter_wrap_joules`` for a single counter read in joules.
    """

    key: str  # "gpu0", "package-1", "ipu3": names the component in the result
    read_counter_joules: Callable[[], float] | None = None  # monotonically increasing energy counter
    counter_wrap_joules: float | None = None  # the counter restarts from 0 after this many joules
    read_power_watts: Callable[[], float | None] | None = None  # instantaneous power; None = "N/A"
    counters: tuple[EnergyCounter, ...] = ()
    in_total: bool = True  # False for a component inside another one (a RAPL core zone in its package)

    def __post_init__(self) -> None:
        if self.read_counter_joules is not None:
            if self.counters:
                raise ValueError(f"{self.key}: give counters or read_counter_joules, not both")
            read = self.read_counter_joules
            counter = EnergyCounter(lambda: (float(read()), 1.0), range_ticks=self.counter_wrap_joules)
            object.__setattr__(self, "counters", (counter,))


class DeviceEnergyMeter(PowerMeter):
    def __init__(
        self,
        name: str,
        sources: list[EnergySource],
        sample_interval_seconds: float,
        sample_power: bool = True,
        details: dict[str, Any] | None = None,
        timeline_points: int = DEFAULT_TIMELINE_SPANS,
        *,
        clock: Clock | Callable[[], float] | None = None,
        max_poll_seconds: float = MAX_POLL_SECONDS,
    ) -> None:
        """:param clock: what reads the time and waits for it (a ``core.energy.sampling.Clock``, or a
        time function such as ``time.monotonic``); None: the real clock. The counters' timestamps,
        the power sampler and the counter poller all follow it, so a test in simulated time
        (``core.testing.SimulatedClock``) measures the same on a busy machine as on a quiet one."""
        if not sources:
            raise ValueError("a device energy meter needs at least one source")
        self.name = name
        self._sources = sources
        self._details = dict(details or {})
        self._clock = as_clock(clock)
        self._max_poll_seconds = max_poll_seconds
        self._counter_errors: dict[str, str] = {}
        self._counted: dict[str, float] = {}  # joules per source since start, at the last good read
        self._last_read_at: dict[str, float] = {}
        self._max_gap: dict[str, float] = {}
        self._started_at: float | None = None
        self._stopping = False
        self._sampling = False
        self._lock = threading.Lock()
        self._reading = threading.Lock()  # held while the counters are read between start and stop
        self._stop_polling = threading.Event()
        self._poller: threading.Thread | None = None
        self.poll_interval_seconds: float | None = None
        self._polls = 0
        self._poll_error_count = 0
        self._poll_errors: list[str] = []
        powered = [s for s in sources if s.read_power_watts is not None]
        self._sampler = (
            FixedRateSampler(
                lambda: {s.key: s.read_power_watts() for s in powered},  # type: ignore[misc]
                sample_interval_seconds,
                clock=self._clock,
                timeline_spans=timeline_points,
            )
            if powered and (sample_power or any(not s.counters for s in powered))
            else None
        )

    # --- counters ------------------------------------------------------------------------------

    def _read_source(self, source: EnergySource, first: bool) -> tuple[float | None, str | None]:
        """(joules since start, None) or (None, why not). A failed read must never become a number."""
        try:
            joules = sum(c.start() if first else c.read_joules() for c in source.counters)
        except Exception as exc:  # noqa: BLE001 - a vendor call may raise anything
            return None, f"{type(exc).__name__}: {exc}"
        if not math.isfinite(joules):
            return None, f"counter read {joules}"
        return joules, None

    def _fold(self, source: EnergySource, t: float, joules: float) -> None:
        """A good read at ``t``. Caller holds the lock."""
        self._max_gap[source.key] = max(self._max_gap.get(source.key, 0.0), t - self._last_read_at[source.key])
        self._last_read_at[source.key] = t
        self._counted[source.key] = joules

    def _poll_interval(self) -> float | None:
        """How often the counters that can wrap are read: within half their safe gap."""
        wrapping = [c for s in self._sources if s.key in self._counted for c in s.counters if c.range_ticks]
        if not wrapping:
            return None
        gaps = [c.safe_gap_seconds for c in wrapping if c.safe_gap_seconds is not None]
        return min([self._max_poll_seconds, *(gap / 2 for gap in gaps)])

    def poll(self) -> bool:
        """Read every counter now (the poller's step; tests call it): no wrap goes unseen.

        :returns: whether every counter read well (False also once stop() has begun)
        """
        # One reader at a time: a counter read by the poller before the run's thread read it, but
        # counted after, would look like a step back.
        with self._reading:
            return self._read_counters()

    def _read_counters(self) -> bool:
        t = self._clock.now()
        good = True
        for source in self._sources:
            if source.key not in self._counted:
                continue
            joules, error = self._read_source(source, first=False)
            with self._lock:
                if self._stopping:
                    return False  # stop() takes the final reading
                if joules is None:
                    # The last good read stays: the next one still gives the right total, and the
                    # gap check at stop() catches a gap long enough to hide a wrap.
                    self._poll_error_count += 1
                    message = f"{source.key}: {error}"
                    if message not in self._poll_errors and len(self._poll_errors) < 10:
                        self._poll_errors.append(message)
                    good = False
                    continue
                self._fold(source, t, joules)
        with self._lock:
            self._polls += 1
        return good

    def _poll_loop(self) -> None:
        assert self.poll_interval_seconds is not None
        while not self._clock.wait_until(self._clock.now() + self.poll_interval_seconds, self._stop_polling):
            self.poll()

    def _end_polling(self) -> None:
        self._stop_polling.set()
        if self._poller is not None:
            self._poller.join(5.0)
            self._poller = None

    # --- the window ----------------------------------------------------------------------------

    def start(self) -> None:
        self._stopping = False
        t = self._clock.now()
        self._started_at = t
        for source in self._sources:
            if not source.counters:
                continue
            joules, error = self._read_source(source, first=True)
            if joules is None:
                self._counter_errors[source.key] = error or "unreadable"
                continue
            self._counted[source.key], self._last_read_at[source.key] = joules, t
        self.poll_interval_seconds = self._poll_interval()
        if self.poll_interval_seconds is not None:
            self._poller = threading.Thread(target=self._poll_loop, name=f"{self.name}-counter-poll", daemon=True)
            self._poller.start()
        if self._sampler is not None:
            self._sampler.start()
            self._sampling = True

    def read_joules_so_far(self) -> float | None:
        """The window's energy up to now, as :meth:`stop` would count it, without ending the window:
        each counter read now, and the sampled integral up to a reading taken now for the sources
        without one. None where a source's energy is unknown now (a failed read, a power trace with
        a gap) or the window is not open."""
        if self._started_at is None or self._stopping:
            return None
        sampled = self._sampler.joules_so_far() if self._sampler is not None and self._sampling else None
        if not self.poll():
            return None
        with self._lock:
            counted = dict(self._counted)
        total = 0.0
        for source in self._sources:
            if source.key in counted:
                joules: float | None = counted[source.key]
            else:
                joules = None if sampled is None else sampled.get(source.key)
            if joules is None:
                return None
            if source.in_total:
                total += joules
        return total

    def stop(self) -> EnergyMeasurement:
        with self._lock:
            self._stopping = True  # from here on the poller discards what it reads
        self._end_polling()
        if self._started_at is None:
            self._stop_sampling()
            return EnergyMeasurement(meter=self.name, unavailable_reason="stop() was called before start()")
        t = self._clock.now()
        for source in self._sources:
            if source.key not in self._counted:
                continue
            joules, error = self._read_source(source, first=False)
            if joules is None:
                self._counter_errors[source.key] = error or "unreadable"
                del self._counted[source.key]
                continue
            with self._lock:
                self._fold(source, t, joules)
            safe = min((c.safe_gap_seconds for c in source.counters if c.safe_gap_seconds), default=None)
            if safe is not None and self._max_gap[source.key] > safe:
                self._counter_errors[source.key] = (
                    f"its counter went unread for {self._max_gap[source.key]:.1f} s, longer than the {safe:.1f} s "
                    "in which it can pass half its range, so a wrap could be missed; the energy cannot be known"
                )
                del self._counted[source.key]
        elapsed = t - self._started_at
        sampled = self._stop_sampling()
        if sampled is not None and not any(source.counters for source in self._sources):
            # Power alone: the window is the integral's own, from its first reading to its last, not
            # two other clock readings a busy host may have set apart from them.
            elapsed = sampled.duration_seconds
        return self._measurement(dict(self._counted), sampled, elapsed)

    def _measurement(self, counted: dict[str, float], sampled: Any, elapsed: float | None) -> EnergyMeasurement:
        components: dict[str, float] = {}
        methods: dict[str, str] = {}
        missing: list[str] = []
        sampled_joules = dict(sampled.components_joules) if sampled is not None else {}
        sampled_complete = sampled.complete_components() if sampled is not None else set()
        for source in self._sources:
            if source.key in counted:
                components[source.key], methods[source.key] = counted[source.key], "counter"
            elif source.key in sampled_complete:
                components[source.key], methods[source.key] = sampled_joules[source.key], "sampled"
            else:
                missing.append(source.key)
        details: dict[str, Any] = {**self._details, "methods": methods, "window_seconds": elapsed}
        timeline = sampled.timeline if sampled is not None else None
        warnings: list[str] = []
        if sampled is not None:
            details.update(
                sampled_joules=sampled_joules,
                power_samples=sampled.sample_count,
                max_sample_gap_seconds=sampled.max_gap_seconds,
            )
            ratios = {
                k: counted[k] / sampled_joules[k] for k in counted if k in sampled_complete and sampled_joules.get(k)
            }
            if ratios:
                details["counter_over_sampled"] = ratios
            warnings += [
                f"{key}: the energy counter and the sampled power integral differ by {abs(ratio - 1):.1%} "
                f"(counter / sampled = {ratio:.3f}) over a {elapsed or 0.0:.2f} s window; a longer window "
                "(more steps) or a shorter power sample interval tells whether the window is short against "
                "the counter's update period or power changes faster than the sampling"
                for key, ratio in ratios.items()
                if abs(ratio - 1) > CROSS_CHECK_TOLERANCE
            ]
            if sampled.errors:
                details["power_read_errors"] = list(sampled.errors)
        if self._counter_errors:
            details["counter_errors"] = dict(self._counter_errors)
        details.update(self._counter_details())
        if missing:
            reasons = "; ".join(
                f"{k}: {self._counter_errors.get(k, 'no counter and no complete power trace')}" for k in missing
            )
            return EnergyMeasurement(
                meter=self.name,
                unavailable_reason=f"energy unknown for {reasons}",
                components_joules=components,
                details=details,
                power_timeline=timeline,
                warnings=warnings,
            )
        total = sum(joules for s in self._sources if (joules := components.get(s.key)) is not None and s.in_total)
        kinds = set(methods.values())
        return EnergyMeasurement(
            meter=self.name,
            method=kinds.pop() if len(kinds) == 1 else "mixed",
            energy_joules=total,
            components_joules=components,
            details=details,
            mean_power_watts=total / elapsed if elapsed else None,
            power_timeline=timeline,
            warnings=warnings,
        )

    def _counter_details(self) -> dict[str, Any]:
        wrapping = [s for s in self._sources if any(c.range_ticks for c in s.counters)]
        if not wrapping:
            return {}
        info: dict[str, Any] = {
            "counter_wraps": {s.key: sum(c.wraps for c in s.counters) for s in wrapping},
            "counter_polls": self._polls,
            "counter_poll_interval_seconds": self.poll_interval_seconds,
        }
        if self._poll_error_count:
            info["poll_error_count"] = self._poll_error_count
            info["poll_errors"] = list(self._poll_errors)
        return info

    def _stop_sampling(self) -> Any:
        if self._sampler is None or not self._sampling:
            return None
        self._sampling = False
        return self._sampler.stop()

    def close(self) -> None:
        # A window that failed half-way leaves no polling or sampling thread behind.
        self._end_polling()
        self._stop_sampling()
