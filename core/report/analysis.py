"""What a report reads out of a sweep's cells: safe file names, the options that vary, series,
scaling efficiency, the Pareto front and power traces. No plotting, no rendering."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import TypeGuard

from core.base.config import RunConfig
from core.storage.summary import CellSummary

_BATCH = "micro_batch_size"
# Where a cell ran, not what it ran: a scaling series is the cells that differ only in these.
_DEVICE_OPTIONS = ("replicas", "devices_per_replica", "nodes", "rendezvous")
_SCENARIO = "scenario"
_LOOP = "loop"  # core's own steady window; the other scenarios are LoadGen's

# --- what a cell ran ----------------------------------------------------------------------------


def is_inference(cell: CellSummary) -> bool:
    """Whether the cell ran inference (``mode = "inference"``). A training sample (forward, backward
    and update) and an inference sample (a forward pass) are not the same work, so the report never
    puts the two in one table, series or plot."""
    return cell.option("mode") == "inference"


def ran_loadgen(cell: CellSummary) -> bool:
    """Whether MLPerf LoadGen drove the cell (a scenario other than core's own loop)."""
    return is_inference(cell) and cell.option(_SCENARIO) != _LOOP


# --- what varies in a sweep --------------------------------------------------------------------


_CONFIG_OPTIONS = tuple(
    name for name in RunConfig.model_fields if name not in ("workload_options", "accelerator_options")
)


def option_names(cells: Sequence[CellSummary]) -> list[str]:
    """Every option of these cells: RunConfig fields, then ``workload_options.x`` / ``accelerator_options.x``."""
    names = list(_CONFIG_OPTIONS)
    for group in ("workload_options", "accelerator_options"):
        keys: list[str] = []
        for cell in cells:
            keys += [key for key in dict(getattr(cell.config, group)) if key not in keys]
        names += [f"{group}.{key}" for key in keys]
    return names


def varying_options(cells: Sequence[CellSummary]) -> list[str]:
    """The options whose value differs between cells: the sweep's axes, as the results show them."""
    return [name for name in option_names(cells) if len({repr(cell.option(name)) for cell in cells}) > 1]


def _short(name: str) -> str:
    return name.split(".", 1)[-1]


def series_label(cell: CellSummary, names: Sequence[str]) -> str:
    return (
        " ".join(f"{_short(name)}={cell.option(name)}" for name in names)
        or f"{cell.config.workload} on {cell.config.accelerator}"
    )


def group_series(cells: Sequence[CellSummary], names: Sequence[str]) -> dict[str, list[CellSummary]]:
    series: dict[str, list[CellSummary]] = {}
    for cell in cells:
        series.setdefault(series_label(cell, names), []).append(cell)
    return series


def _batch_of(cell: CellSummary) -> int | None:
    """The cell's micro-batch size where it can be placed on a log axis, else None."""
    batch = cell.option(_BATCH)
    return batch if isinstance(batch, int) and not isinstance(batch, bool) and batch > 0 else None


# Figures a plot can place: beyond these a log axis overflows (its margins reach infinity), and
# no measured rate is anywhere near them: such a figure is damage, not data, and is not drawn.
_PLOT_RANGE = (1e-100, 1e100)


def _plottable(value: float | None, log: bool = True) -> TypeGuard[float]:
    """Finite, within _PLOT_RANGE, and positive on a log axis."""
    if value is None or not math.isfinite(value):
        return False
    return _PLOT_RANGE[0] <= value <= _PLOT_RANGE[1] if log else abs(value) <= _PLOT_RANGE[1]


def _positive(value: float | None) -> TypeGuard[float]:
    return _plottable(value)


# --- what the plots draw -----------------------------------------------------------------------


_MOST_OPTIONS_SEARCHED = 12  # subsets of the options tried for co-variation: 2^12 groupings at most


def covarying_with_devices(cells: Sequence[CellSummary], names: Sequence[str]) -> list[str]:
    """The options of ``names`` that move with the device count, as part of the scaling axis.

    An option moves with the device count where, among the cells that share the options that do
    not, none of its values is found at every device count, and it takes more than one (ACES
    Table 1's instances: 1, 2, 4, 8, then 8 or 16 with 1..16 replicas; CARAML's accumulation at a
    fixed global batch). The largest such set of options is taken: each option tried alone would
    be judged among cells split by the others, which move with the devices too.
    """
    if len({cell.devices for cell in cells}) < 2 or not names:
        return []
    names = list(names)[:_MOST_OPTIONS_SEARCHED]
    for size in range(len(names), 0, -1):
        for moving in combinations(names, size):
            kept = [name for name in names if name not in moving]
            groups = [m for m in group_series(cells, kept).values() if len({c.devices for c in m}) > 1]
            if groups and all(_moves_with_devices(groups, name) for name in moving):
                return list(moving)
    return []


def _moves_with_devices(groups: Sequence[Sequence[CellSummary]], name: str) -> bool:
    """No value of the option at every device count of a group, and more than one value in one."""
    several = False
    for members in groups:
        counts = {cell.devices for cell in members}
        where: dict[str, set[int]] = {}
        for cell in members:
            where.setdefault(repr(cell.option(name)), set()).add(cell.devices)
        if any(found == counts for found in where.values()):
            return False  # a value at every count: the option varies beside the devices, not with them
        several |= len(where) > 1
    return several


def scaling_groups(
    cells: Sequence[CellSummary], varying: Sequence[str]
) -> tuple[dict[str, list[CellSummary]], list[str]]:
    """(series label -> its cells, the options that move with the device count): the series whose
    device count varies. A series is the cells that differ only in where they ran and in the options
    that move with the device count (see :func:`covarying_with_devices`), which are part of the
    scaling axis, not series of their own."""
    names = [name for name in varying if name not in _DEVICE_OPTIONS]
    moving = covarying_with_devices(cells, names)
    groups = group_series(cells, [name for name in names if name not in moving])
    return {label: members for label, members in groups.items() if len({c.devices for c in members}) > 1}, moving


def scaling_points(cells: Sequence[CellSummary], varying: Sequence[str]) -> dict[str, list[tuple[int, float, float]]]:
    """Series -> [(devices, throughput, efficiency)], where the device count varies within a series.

    efficiency(n) = (throughput(n) / n) / (throughput(n0) / n0), n0 the series' smallest device
    count with a figure (its best cell there): 1.0 is perfect scaling. With a fixed micro-batch per
    device the global batch grows with n (weak scaling), as in the papers' data-parallel tables.
    A series may hold two cells at one count (ACES Table 1's 16 replicas in 8 or 16 instances).
    """
    result: dict[str, list[tuple[int, float, float]]] = {}
    for label, members in scaling_groups(cells, varying)[0].items():
        points = sorted(
            (cell.devices, cell.throughput_per_second)
            for cell in members
            if _positive(cell.throughput_per_second) and cell.devices > 0
        )
        if len({devices for devices, _ in points}) < 2:
            continue
        base_devices = points[0][0]
        base_throughput = max(throughput for devices, throughput in points if devices == base_devices)
        result[label] = [
            (devices, throughput, (throughput / devices) / (base_throughput / base_devices))
            for devices, throughput in points
        ]
    return result


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both figures (both to be maximised)."""
    front = []
    for i, (x, y) in enumerate(points):
        if not any((ox >= x and oy >= y) and (ox > x or oy > y) for j, (ox, oy) in enumerate(points) if j != i):
            front.append(i)
    return sorted(front, key=lambda i: points[i][0])


def _pareto_cells(cells: Sequence[CellSummary]) -> list[CellSummary]:
    return [cell for cell in cells if _positive(cell.samples_per_watt_hour) and _positive(cell.throughput_per_second)]


_MAX_POWER_TRACES = 12  # lines in one plot before it stops being readable


@dataclass(frozen=True)
class PowerTrace:
    """One run's total power over its window: the sum of its components, per timeline span."""

    label: str
    start_seconds: list[float]
    stop_seconds: list[float]
    watts: list[float | None]  # None: some component had no reading in that span


def _span_total(columns: Sequence[Sequence[float | None]], index: int) -> float | None:
    values = [column[index] if index < len(column) else None for column in columns]
    if not values or any(value is None or not math.isfinite(value) for value in values):
        return None
    return sum(values)  # type: ignore[arg-type]


def power_traces(cells: Sequence[CellSummary]) -> list[PowerTrace]:
    """The first successful repeat with a power timeline of each cell, in the cells' order."""
    traces: list[PowerTrace] = []
    for cell in cells:
        timeline = next(
            (
                result.energy.power_timeline
                for result in cell.ok_results
                if result.energy is not None and result.energy.power_timeline is not None
            ),
            None,
        )
        if timeline is None:
            continue
        spans = [
            (start, stop)
            for start, stop in zip(timeline.start_seconds, timeline.stop_seconds)
            if math.isfinite(start) and math.isfinite(stop)
        ]
        if not spans or len(spans) != min(len(timeline.start_seconds), len(timeline.stop_seconds)):
            continue  # no span, or spans that cannot be placed: nothing to draw
        columns = list(timeline.watts.values())
        totals = [_span_total(columns, k) for k in range(len(spans))]
        traces.append(PowerTrace(cell.label, [start for start, _ in spans], [stop for _, stop in spans], totals))
    return traces
