"""Repeats of one cell reduced to a median and a spread; a cell whose spread is too wide is flagged.

spread = (max - min) / median of throughput over the cell's successful repeats. The median, not
the mean, because one disturbed repeat (a page-cache miss, a clock change) should not move it.
A figure that is not a finite number (NaN or infinity in a damaged or hand-edited database) is
no measurement: it is left out as if the repeat had not recorded it.

How each figure summarises (median, median and spread, sum, first, olympic mean, count) is declared
once with the figure in core.storage.metrics; :meth:`CellSummary.figure` applies it to any declared
figure by name.

A repeat that trained to a target and ended without reaching it (``target_not_reached``) is a
measured outcome, not a fault: its figures count like a successful repeat's, it is no cell's
failure, and the figures to the target count it as a run that did not converge (:func:`olympic_mean`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from core.base.results import RunResult, RunState
from core.storage.metrics import METRICS, METRICS_BY_NAME, Metric, Summary
from core.storage.store import StoredRun

SPREAD_FLAG_FRACTION = 0.10  # a cell whose throughput spread exceeds 10 % is flagged

# The states of a repeat that measured what it set out to: its figures are summarised.
MEASURED_STATES = frozenset({RunState.ok, RunState.target_not_reached})

# MLPerf Training's score of a set of runs (training_policies, training_rules.adoc, "Benchmark
# Results"): "Each benchmark result is computed by dropping the fastest and slowest runs, then taking
# the mean of the remaining times. For this purpose, a single non-converging run may be treated as
# the slowest run and dropped. A benchmark result is invalid if there is more than one non-converging
# run." Its smallest required number of runs is 3 (the LLM pretraining benchmarks; most need 10).
OLYMPIC_MINIMUM_RUNS = 3
OLYMPIC_MOST_NOT_REACHED = 1


def olympic_mean(reached: Sequence[float], not_reached: int = 0) -> float | None:
    """MLPerf Training's olympic mean of the runs' figures: drop the fastest and the slowest, average
    the rest. A run that did not reach the target is the slowest and the one dropped at that end.

    :param reached: the figure (time, energy, epochs, samples to target) of each run that reached it.
    :param not_reached: how many runs ended without reaching it.
    :returns: the mean; None with fewer than 3 runs in all, or more than one that did not reach it
        (MLPerf: no valid result).
    """
    if not_reached > OLYMPIC_MOST_NOT_REACHED or len(reached) + not_reached < OLYMPIC_MINIMUM_RUNS:
        return None
    ordered = sorted(reached)
    kept = ordered[1:] if not_reached else ordered[1:-1]
    return math.fsum(kept) / len(kept)


@dataclass(frozen=True)
class ToTarget:
    """One figure to the target (time, energy, epochs, samples) over a cell's repeats that trained to it.

    :param values: each reached repeat's figure, in repeat order (a reached repeat without it, such as
        energy without a meter, is not among them).
    :param reached: repeats that reached the target; ``trained``: repeats that trained to it (measured).
    """

    values: tuple[float, ...]
    reached: int
    trained: int

    @property
    def not_reached(self) -> int:
        return self.trained - self.reached

    @property
    def olympic_mean(self) -> float | None:
        """MLPerf's olympic mean over the repeats that have the figure and those that did not reach."""
        return olympic_mean(self.values, self.not_reached)

    @property
    def median(self) -> float | None:
        return statistics.median(self.values) if self.values else None

    @property
    def minimum(self) -> float | None:
        return min(self.values) if self.values else None

    @property
    def maximum(self) -> float | None:
        return max(self.values) if self.values else None

    @property
    def spread(self) -> float | None:
        """(max - min) / median over the reached repeats; None with fewer than two."""
        median = self.median
        if len(self.values) < 2 or median is None or median <= 0:
            return None
        return (max(self.values) - min(self.values)) / median


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
        """The repeats that measured what they set out to (ok, or trained without reaching a target)."""
        return [result for result in self.results if result.status.state in MEASURED_STATES]

    @property
    def config(self) -> Any:
        return self.runs[0].result.config

    @property
    def failure(self) -> RunResult | None:
        """The first repeat that did not succeed, if any (a target not reached is an outcome, no failure)."""
        return next((result for result in self.results if result.status.state not in MEASURED_STATES), None)

    @property
    def status(self) -> str:
        """``ok`` when every recorded repeat succeeded, else the first failure's state; a cell whose
        repeats all trained to a target and none reached it: ``target_not_reached``."""
        failure = self.failure
        if failure is not None:
            return failure.status.state.value
        if self.results and all(result.status.state is RunState.target_not_reached for result in self.results):
            return RunState.target_not_reached.value
        return RunState.ok.value

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
        if metric.summary is Summary.olympic_mean:
            return self.to_target(name).olympic_mean if self.trained_to_target else None
        if metric.summary is Summary.holds:
            flags = [value for value in (metric.value_of_run(run) for run in self._ok_runs) if isinstance(value, bool)]
            return sum(flags) if flags else None
        return None

    def having(self, name: str) -> int:
        """How many successful repeats have a declared figure (a count's "of how many")."""
        metric = METRICS_BY_NAME[name]
        return sum(1 for run in self._ok_runs if metric.value_of_run(run) is not None)

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
        return [run for run in self.runs if run.result.status.state in MEASURED_STATES]

    @property
    def trained_to_target(self) -> int:
        """The measured repeats that trained to a target quality (``to_target``); 0 for other cells."""
        return sum(1 for result in self.ok_results if result.to_target is not None)

    @property
    def targets_reached(self) -> int:
        """The measured repeats that reached their target."""
        return sum(1 for result in self.ok_results if result.to_target is not None and result.to_target.reached)

    def to_target(self, name: str) -> ToTarget:
        """A declared figure to the target (``time_to_target_seconds``...) over the measured repeats that
        trained to it: each reached one's value, and how many reached of how many trained.

        :raises KeyError: for a name no metric declares.
        """
        metric = METRICS_BY_NAME[name]
        trained = [run for run in self._ok_runs if run.result.to_target is not None]
        reached = [run for run in trained if run.result.to_target is not None and run.result.to_target.reached]
        values = _numbers(metric.value_of_run(run) for run in reached)
        return ToTarget(values=tuple(values), reached=len(reached), trained=len(trained))

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
