"""Scaling over devices (the ACES and GH200 scaling tables): throughput, speed-up and parallel
efficiency against the smallest device count of each series, beside the ideal line.

A series is the cells that differ only in where they ran (replicas, devices per replica and nodes)
and in the options that move with the device count within the sweep, such as ACES's poprun
instances and batch-norm span (analysis.scaling_groups finds them from the cells). For a series
whose smallest count is n0 with throughput T0:

    speed-up(n)    = T(n) / T0
    ideal speed-up = n / n0                      (perfect linear scaling)
    efficiency(n)  = speed-up(n) / (n / n0)      (1.0: every added device adds its full share)

With a fixed micro-batch per device the global batch grows with n: weak scaling, as in the papers'
data-parallel tables (ACES Table 1 and 3 keep the per-IPU batch fixed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from core.report.analysis import _positive, scaling_groups, series_label
from core.report.document import Block, Heading, Paragraph, Table, Value, format_number, format_percent
from core.report.plots import _batch_axis, _legend, _png, _pyplot, plot_text
from core.storage.summary import CellSummary


@dataclass(frozen=True)
class ScalingPoint:
    """One cell of a scaling series, against the series' smallest device count."""

    devices: int
    nodes: int
    throughput_per_second: float
    base_devices: int
    base_throughput_per_second: float
    detail: str = ""  # the values of the options that move with the device count ("instances=8")

    @property
    def speedup(self) -> float:
        return self.throughput_per_second / self.base_throughput_per_second

    @property
    def ideal_speedup(self) -> float:
        return self.devices / self.base_devices

    @property
    def efficiency(self) -> float:
        return self.speedup / self.ideal_speedup

    @property
    def ideal_throughput_per_second(self) -> float:
        """Where perfect linear scaling from the smallest count would put this count."""
        return self.base_throughput_per_second * self.ideal_speedup


def scaling_series(cells: Sequence[CellSummary], varying: Sequence[str]) -> dict[str, list[ScalingPoint]]:
    """Series label -> its points by device count (then throughput), for every series whose device
    count varies; the base is the best cell at the series' smallest count."""
    groups, moving = scaling_groups(cells, varying)
    series: dict[str, list[ScalingPoint]] = {}
    for label, members in groups.items():
        measured = sorted(
            (cell for cell in members if _positive(cell.throughput_per_second) and cell.devices > 0),
            key=lambda cell: (cell.devices, cell.throughput_per_second),
        )
        if len({cell.devices for cell in measured}) < 2:
            continue
        base = max((c for c in measured if c.devices == measured[0].devices), key=_throughput)
        series[label] = [
            ScalingPoint(
                cell.devices,
                cell.config.nodes,
                _throughput(cell),
                base.devices,
                _throughput(base),
                series_label(cell, moving) if moving else "",
            )
            for cell in measured
        ]
    return series


def _throughput(cell: CellSummary) -> float:
    return cell.throughput_per_second or 0.0


def _best_per_count(points: Sequence[ScalingPoint]) -> list[ScalingPoint]:
    """The line of a series: its best point at each device count (the others are drawn apart)."""
    best: dict[int, ScalingPoint] = {}
    for point in points:
        if point.devices not in best or point.throughput_per_second > best[point.devices].throughput_per_second:
            best[point.devices] = point
    return [best[devices] for devices in sorted(best)]


def scaling_table(series: dict[str, list[ScalingPoint]], unit: str, identifier: str) -> Table:
    """One row per point: the figures of the plot, exact numbers in each cell's value."""
    show_nodes = any(point.nodes != 1 for points in series.values() for point in points)
    show_detail = any(point.detail for points in series.values() for point in points)
    columns = [("series", "series"), ("devices", "devices")]
    columns += [("nodes", "nodes")] if show_nodes else []
    columns += [("with", "with (moves with the devices)")] if show_detail else []
    columns += [
        ("throughput_per_second", f"throughput ({unit}/s, median)"),
        ("ideal_throughput_per_second", f"ideal throughput ({unit}/s)"),
        ("speedup", "speed-up (x)"),
        ("ideal_speedup", "ideal speed-up (x)"),
        ("scaling_efficiency", "scaling efficiency"),
    ]
    rows = []
    for label, points in series.items():
        for point in points:
            row = [Value(label), Value(str(point.devices), point.devices)]
            row += [Value(str(point.nodes), point.nodes)] if show_nodes else []
            row += [Value(point.detail)] if show_detail else []
            row += [
                Value(format_number(point.throughput_per_second), point.throughput_per_second),
                Value(format_number(point.ideal_throughput_per_second), point.ideal_throughput_per_second),
                Value(f"{point.speedup:.2f}", point.speedup),
                Value(f"{point.ideal_speedup:.2f}", point.ideal_speedup),
                Value(format_percent(point.efficiency), point.efficiency),
            ]
            rows.append(row)
    return Table(columns=columns, rows=rows, identifier=identifier)


def _throughput_of(point: ScalingPoint) -> float:
    return point.throughput_per_second


def _efficiency_percent(point: ScalingPoint) -> float:
    return point.efficiency * 100


def plot_scaling_series(series: dict[str, list[ScalingPoint]], unit: str) -> bytes:
    """Two panels: throughput against devices with each series' ideal line (log-log), and the
    parallel efficiency against devices with the 100 % line."""
    pyplot = _pyplot()
    from matplotlib.ticker import FuncFormatter

    figure, (throughput_axis, efficiency_axis) = pyplot.subplots(1, 2, figsize=(11.0, 4.4))
    devices: list[int] = []
    for index, (label, points) in enumerate(series.items()):
        color = f"C{index % 10}"
        line = _best_per_count(points)
        counts = [point.devices for point in line]
        devices += counts
        name = plot_text(label)
        throughput_axis.plot(
            counts, [point.throughput_per_second for point in line], marker="o", color=color, label=name
        )
        throughput_axis.plot(
            counts, [point.ideal_throughput_per_second for point in line], linestyle="--", color=color, linewidth=1
        )
        efficiency_axis.plot(counts, [point.efficiency * 100 for point in line], marker="o", color=color, label=name)
        others = [point for point in points if point not in line]
        for axis, figure_of in ((throughput_axis, _throughput_of), (efficiency_axis, _efficiency_percent)):
            axis.plot(
                [point.devices for point in others],
                [figure_of(point) for point in others],
                linestyle="none",
                marker="o",
                markerfacecolor="none",
                color=color,
            )
    ideal = "ideal (linear from the smallest count)"
    throughput_axis.plot([], [], linestyle="--", color="grey", linewidth=1, label=ideal)
    efficiency_axis.axhline(100, color="grey", linestyle="--", linewidth=1, label="ideal (100 %)")
    for axis in (throughput_axis, efficiency_axis):
        _batch_axis(axis, devices)
        axis.set_xlabel("devices (replicas x devices per replica)")
        axis.grid(True, which="both", alpha=0.3)
    throughput_axis.set_yscale("log")
    # Plain figures (420, 1,000) on the log axis, not 4 x 10^2: they are read against the table.
    plain = FuncFormatter(lambda value, _position: format_number(value))
    throughput_axis.yaxis.set_major_formatter(plain)
    throughput_axis.yaxis.set_minor_formatter(plain)
    throughput_axis.set_ylabel(f"throughput ({unit}/s, median)")
    throughput_axis.set_title("Throughput against device count")
    efficiency_axis.set_ylim(bottom=0, top=max(110.0, *(p.efficiency * 105 for ps in series.values() for p in ps)))
    efficiency_axis.set_ylabel("parallel efficiency (%)")
    efficiency_axis.set_title("Parallel efficiency against device count")
    _legend(throughput_axis, "small")
    _legend(efficiency_axis, "small")
    figure.tight_layout()
    return _png(figure)


def scaling_blocks(
    title: str, cells: Sequence[CellSummary], varying: Sequence[str], unit: str, figure: Any, slug: str
) -> list[Block]:
    """The section's scaling part: a note, the plot and its table; a reason where there is no series.

    :param figure: makes the section's Figure from (kind, png, caption, data=table), so file names
        follow its mode; the table of the plotted figures travels with it.
    """
    series = scaling_series(cells, varying)
    if not series:
        return [
            Heading(3, title),
            Paragraph("Not drawn: no series of cells differs only in device count (replicas x devices per replica)."),
        ]
    moving = [detail for points in series.values() for point in points if (detail := point.detail)]
    note = Paragraph(
        "Speed-up is each series' throughput over its throughput at its smallest device count n0 (its best cell "
        "there); the ideal is n / n0 (perfect linear scaling); parallel efficiency is speed-up over ideal "
        "speed-up. The micro-batch per device is fixed, so the global batch grows with the devices (weak scaling)."
        + (
            " Options that move with the device count in this sweep are part of the scaling axis, not series "
            "(the table's 'with' column); the line joins each count's best cell, hollow markers are the others."
            if moving
            else ""
        )
    )
    png = plot_scaling_series(series, unit)
    caption = (
        "Left: throughput against device count, log-log, dashed: the ideal line of each series. Right: parallel "
        "efficiency (speed-up over ideal speed-up). The data behind the plot holds the figures."
    )
    return [Heading(3, title), note, figure("scaling-efficiency", png, caption, data=scaling_table(series, unit, slug))]
