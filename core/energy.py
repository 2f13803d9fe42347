"""A power meter built from per-device energy counters and/or instantaneous power readings.

Vendors differ in what their devices expose (NVML: a millijoule counter and instantaneous power;
amdsmi: an accumulator x resolution that can wrap, and power in whole watts; gcipuinfo: power
only), not in how a window's energy is measured. A vendor plugin describes each device as an
``EnergySource``; this meter does the rest, identically for all:

- a counter is read at the window's start and stop (wrap-corrected); it is the measurement;
- where power can be read, a fixed-rate sampler integrates it over the same window (trapezoid
  rule): the measurement for devices without a counter, a cross-check for those with one;
- the method is recorded per device, and the counter / sampled ratio where both exist.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from core.power import PowerMeter
from core.results import EnergyMeasurement
from core.sampling import DEFAULT_TIMELINE_SPANS, FixedRateSampler

# Counter and sampled integral further apart than this get a warning in the result. Both measure
# the same window; a gap this size means the window is short against the counter's update period,
# or power changes faster than the sampling interval (one vendor's averaged power lags, say).
CROSS_CHECK_TOLERANCE = 0.05


@dataclass(frozen=True)
class EnergySource:
    """One device (or package) as the meter reads it; the readers may raise on failure."""

    key: str  # "gpu0", "package-1", "ipu3": names the component in the result
    read_counter_joules: Callable[[], float] | None = None  # monotonically increasing energy counter
    counter_wrap_joules: float | None = None  # the counter restarts from 0 after this many joules
    read_power_watts: Callable[[], float | None] | None = None  # instantaneous power; None = "N/A"


def counter_delta(start: float, stop: float, wrap: float | None) -> float:
    """Energy between two counter reads; one wrap is undone where the counter's range is known."""
    if stop >= start:
        return stop - start
    if wrap is None:
        raise ValueError(f"energy counter went backwards ({start} -> {stop}) and its range is unknown")
    return stop + wrap - start


class DeviceEnergyMeter(PowerMeter):
    def __init__(
        self,
        name: str,
        sources: list[EnergySource],
        sample_interval_seconds: float,
        sample_power: bool = True,
        details: dict[str, Any] | None = None,
        timeline_points: int = DEFAULT_TIMELINE_SPANS,
    ) -> None:
        if not sources:
            raise ValueError("a device energy meter needs at least one source")
        self.name = name
        self._sources = sources
        self._details = dict(details or {})
        self._counters_at_start: dict[str, float] = {}
        self._counter_errors: dict[str, str] = {}
        self._started_at: float | None = None
        self._sampling = False
        powered = [s for s in sources if s.read_power_watts is not None]
        self._sampler = (
            FixedRateSampler(
                lambda: {s.key: s.read_power_watts() for s in powered},  # type: ignore[misc]
                sample_interval_seconds,
                timeline_spans=timeline_points,
            )
            if powered and (sample_power or any(s.read_counter_joules is None for s in powered))
            else None
        )

    def _read_counter(self, source: EnergySource) -> float | None:
        assert source.read_counter_joules is not None
        try:
            value = float(source.read_counter_joules())
        except Exception as exc:  # a failed read must never become a number
            self._counter_errors[source.key] = f"{type(exc).__name__}: {exc}"
            return None
        if not math.isfinite(value):
            self._counter_errors[source.key] = f"counter read {value}"
            return None
        return value

    def start(self) -> None:
        self._started_at = time.monotonic()
        for source in self._sources:
            if source.read_counter_joules is not None:
                value = self._read_counter(source)
                if value is not None:
                    self._counters_at_start[source.key] = value
        if self._sampler is not None:
            self._sampler.start()
            self._sampling = True

    def stop(self) -> EnergyMeasurement:
        counted: dict[str, float] = {}
        for source in self._sources:
            if source.read_counter_joules is None or source.key not in self._counters_at_start:
                continue
            value = self._read_counter(source)
            if value is None:
                continue
            try:
                counted[source.key] = counter_delta(
                    self._counters_at_start[source.key], value, source.counter_wrap_joules
                )
            except ValueError as exc:
                self._counter_errors[source.key] = str(exc)
        elapsed = time.monotonic() - self._started_at if self._started_at is not None else None
        sampled = self._stop_sampling()
        return self._measurement(counted, sampled, elapsed)

    def _measurement(self, counted: dict[str, float], sampled: Any, elapsed: float | None) -> EnergyMeasurement:
        components: dict[str, float] = {}
        methods: dict[str, str] = {}
        missing: list[str] = []
        sampled_joules = dict(sampled.components_joules) if sampled is not None else {}
        sampled_complete = {k for k, v in (sampled.coverage.items() if sampled is not None else ()) if v >= 0.999}
        for source in self._sources:
            if source.key in counted:
                components[source.key], methods[source.key] = counted[source.key], "counter"
            elif source.key in sampled_complete:
                components[source.key], methods[source.key] = sampled_joules[source.key], "sampled"
            else:
                missing.append(source.key)
        details: dict[str, Any] = {**self._details, "methods": methods}
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
        total = sum(components.values())
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

    def _stop_sampling(self) -> Any:
        if self._sampler is None or not self._sampling:
            return None
        self._sampling = False
        return self._sampler.stop()

    def close(self) -> None:
        self._stop_sampling()  # a window that failed half-way leaves no sampling thread behind
