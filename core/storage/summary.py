"""Repeats of one cell reduced to a median and a spread; a cell whose spread is too wide is flagged.

spread = (max - min) / median of throughput over the cell's successful repeats. The median, not
the mean, because one disturbed repeat (a page-cache miss, a clock change) should not move it.
A figure that is not a finite number (NaN or infinity in a damaged or hand-edited database) is
no measurement: it is left out as if the repeat had not recorded it.

How each figure summarises (median, median and spread, sum, first) is declared once with the figure
in core.storage.metrics; :meth:`CellSummary.figure` applies it to any declared figure by name.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from core.base.results import RunResult, RunState
from core.storage.metrics import METRICS, METRICS_BY_NAME, Metric, Summary
from core.storage.store import StoredRun

SPREAD_FLAG_FRACTION = 0.10  # a cell whose throughput spread exceeds 10 % is flagged


@dataclass(frozen=True)
class CellSummary:
    """One cell of a sweep: its options, how its repeats went, and the median of each figure."""

    sweep: str | None
    cell_key: str
    label: str
    runs: list[StoredRun] = field(repr=False)

    @property
    def results(self) -> list[RunResult]:
        return [run.result for run in self.runs]

    @property
    def ok_results(self) -> list[RunResult]:
        return [result for result in self.results if result.status.state is RunState.ok]

    @property
    def config(self) -> Any:
        return self.runs[0].result.config

    @property
    def failure(self) -> RunResult | None:
        """The first repeat that did not succeed, if any."""
        return next((result for result in self.results if result.status.state is not RunState.ok), None)

    @property
    def status(self) -> str:
        """``ok`` when every recorded repeat succeeded, else the first failure's state."""
        failure = self.failure
        return RunState.ok.value if failure is None else failure.status.state.value

    @property
    def repeats_recorded(self) -> int:
        return len(self.runs)

    @property
    def repeats_ok(self) -> int:
        return len(self.ok_results)

    def median(self, figure: str | Callable[[RunResult], float | None]) -> float | None:
        """Median of one figure over the successful repeats that have it; None when none has."""
        values = _values(self.ok_results, figure)
        return statistics.median(values) if values else None

    def figure(self, name: str) -> Any:
        """A declared figure (core.storage.metrics) summarised over the cell's repeats as its
        declaration says: the median (median and spread) or the first value over the successful
        repeats, the sum over every recorded one; None for a figure that is not summarised.

        :raises KeyError: for a name no metric declares.
        """
        metric = METRICS_BY_NAME[name]
        if metric.summary in (Summary.median, Summary.median_spread):
            return self._median_of(metric, self._ok_runs)
        if metric.summary is Summary.total:
            values = _numbers(metric.value_of_run(run) for run in self.runs)
            return math.fsum(values) if values else None
        if metric.summary is Summary.first:
            return next(
                (value for value in (metric.value_of_run(run) for run in self._ok_runs) if value is not None), None
            )
        return None

    def figures(self) -> dict[str, Any]:
        """Every summarised figure of the cell by name, as :meth:`figure` gives it."""
        return {metric.name: self.figure(metric.name) for metric in METRICS if metric.summary is not Summary.none}

    def spread_of(self, name: str) -> float | None:
        """(max - min) / median of a figure over the successful repeats; None with fewer than two."""
        values = _numbers(METRICS_BY_NAME[name].value_of_run(run) for run in self._ok_runs)
        if len(values) < 2:
            return None
        median = statistics.median(values)
        return (max(values) - min(values)) / median if median > 0 else None

    @property
    def _ok_runs(self) -> list[StoredRun]:
        return [run for run in self.runs if run.result.status.state is RunState.ok]

    @staticmethod
    def _median_of(metric: Metric, runs: list[StoredRun]) -> float | None:
        values = _numbers(metric.value_of_run(run) for run in runs)
        return statistics.median(values) if values else None

    # Typed shorthands for the figures the report reads by name.

    @property
    def throughput_per_second(self) -> float | None:
        return self.median("throughput_per_second")

    @property
    def throughput_min(self) -> float | None:
        values = _values(self.ok_results, "throughput_per_second")
        return min(values) if values else None

    @property
    def throughput_max(self) -> float | None:
        values = _values(self.ok_results, "throughput_per_second")
        return max(values) if values else None

    @property
    def spread(self) -> float | None:
        """(max - min) / median of throughput; None with fewer than two successful repeats."""
        return self.spread_of("throughput_per_second")

    @property
    def flagged(self) -> bool:
        spread = self.spread
        return spread is not None and spread > SPREAD_FLAG_FRACTION

    @property
    def samples_per_watt_hour(self) -> float | None:
        return self.median("samples_per_watt_hour")

    @property
    def energy_joules(self) -> float | None:
        return self.median("energy_joules")

    @property
    def energy_watt_hours(self) -> float | None:
        return self.median("energy_watt_hours")

    @property
    def energy_watt_hours_per_device(self) -> float | None:
        return self.median("energy_watt_hours_per_device")

    @property
    def energy_watt_hours_per_epoch(self) -> float | None:
        """Estimate (extrapolated from each repeat's window) under the cell's epoch definition."""
        return self.median("energy_watt_hours_per_epoch")

    @property
    def tokens_per_second(self) -> float | None:
        return self.median("tokens_per_second")

    @property
    def tokens_per_watt_hour(self) -> float | None:
        return self.median("tokens_per_watt_hour")

    @property
    def sample_unit(self) -> str:
        """What the cell's samples are ('images', 'sequences'); 'samples' when its results do not say."""
        units = {result.sample_unit for result in self.results if result.sample_unit}
        return units.pop() if len(units) == 1 else "samples"

    @property
    def flops_per_second(self) -> float | None:
        return self.median("flops_per_second")

    @property
    def model_flops_utilization(self) -> float | None:
        return self.median("model_flops_utilization")

    @property
    def arithmetic_intensity(self) -> float | None:
        """FLOPs per byte moved (the workload's counts: the same in every repeat of a cell)."""
        return self.median("arithmetic_intensity")

    @property
    def peak_flops_per_second(self) -> float | None:
        """Summed datasheet (or derived) peaks of the devices used."""
        return self.median("peak_flops_per_second")

    @property
    def memory_bandwidth_bytes_per_second(self) -> float | None:
        """Summed memory bandwidths of the devices used: the roofline's slope."""
        return self.median("memory_bandwidth_bytes_per_second")

    @property
    def devices(self) -> int:
        """Devices the cell trained on: replicas x devices per replica."""
        return self.config.replicas * self.config.devices_per_replica

    def option(self, name: str) -> Any:
        """A run option by name; ``workload_options.x`` and ``accelerator_options.x`` reach inside."""
        config = self.config
        if "." in name:
            group, key = name.split(".", 1)
            return dict(getattr(config, group)).get(key)
        return getattr(getattr(config, name), "value", getattr(config, name))


def _numbers(values: Iterable[Any]) -> list[float]:
    """The values that are measurements: finite numbers (not booleans, not text, not None)."""
    return [
        value
        for value in values
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ]


def _values(results: Iterable[RunResult], figure: str | Callable[[RunResult], float | None]) -> list[float]:
    if callable(figure):
        return _numbers(figure(result) for result in results)
    metric = METRICS_BY_NAME.get(figure)
    read = metric.value if metric is not None else (lambda result: getattr(result, figure, None))
    return _numbers(read(result) for result in results)


def summarise(runs: Iterable[StoredRun]) -> list[CellSummary]:
    """Group runs by (sweep, cell) in the order their cells first appear."""
    groups: dict[tuple[str | None, str], list[StoredRun]] = {}
    for run in runs:
        key = (run.sweep, run.cell_key if run.cell_key is not None else f"run-{run.run_id}")
        groups.setdefault(key, []).append(run)
    summaries = []
    for (sweep, cell_key), members in groups.items():
        members.sort(key=lambda run: (run.repeat if run.repeat is not None else 0, run.run_id))
        label = members[0].cell_label or cell_key
        summaries.append(CellSummary(sweep=sweep, cell_key=cell_key, label=label, runs=members))
    return summaries
