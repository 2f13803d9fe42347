"""Scaling over devices (the ACES and GH200 scaling tables): throughput, speed-up and parallel
efficiency against the smallest device count of each series, beside the ideal line.

A series is the cells that differ only in where they ran: replicas, devices per replica and nodes
(analysis.scaling_points groups them). For a series whose smallest count is n0 with throughput T0:

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

from core.report.analysis import _DEVICE_OPTIONS, group_series, scaling_points
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
    """Series label -> its points by device count, for every series whose device count varies.

    Built on :func:`~core.report.analysis.scaling_points` (which groups the series and picks their
    figures); the node count of each point is read back from the cells.
    """
    groups = group_series(cells, [name for name in varying if name not in _DEVICE_OPTIONS])
    series: dict[str, list[ScalingPoint]] = {}
    for label, points in scaling_points(cells, varying).items():
        base_devices, base_throughput, _ = points[0]
        nodes = {(cell.devices, cell.throughput_per_second): cell.config.nodes for cell in groups[label]}
        series[label] = [
            ScalingPoint(devices, nodes.get((devices, throughput), 1), throughput, base_devices, base_throughput)
            for devices, throughput, _ in points
        ]
    return series


def scaling_table(series: dict[str, list[ScalingPoint]], unit: str, identifier: str) -> Table:
    """One row per point: the figures of the plot, exact numbers in each cell's value."""
    show_nodes = any(point.nodes != 1 for points in series.values() for point in points)
    columns = [("series", "series"), ("devices", "devices")]
    columns += [("nodes", "nodes")] if show_nodes else []
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
            row += [
                Value(format_number(point.throughput_per_second), point.throughput_per_second),
                Value(format_number(point.ideal_throughput_per_second), point.ideal_throughput_per_second),
                Value(f"{point.speedup:.2f}", point.speedup),
                Value(f"{point.ideal_speedup:.2f}", point.ideal_speedup),
                Value(format_percent(point.efficiency), point.efficiency),
            ]
            rows.append(row)
    return Table(columns=columns, rows=rows, identifier=identifier)


def plot_scaling_series(series: dict[str, list[ScalingPoint]], unit: str) -> bytes:
    """Two panels: throughput against devices with each series' ideal line (log-log), and the
    parallel efficiency against devices with the 100 % line."""
    pyplot = _pyplot()
    from matplotlib.ticker import FuncFormatter

    figure, (throughput_axis, efficiency_axis) = pyplot.subplots(1, 2, figsize=(11.0, 4.4))
    devices: list[int] = []
    for index, (label, points) in enumerate(series.items()):
        color = f"C{index % 10}"
        counts = [point.devices for point in points]
        devices += counts
        name = plot_text(label)
        throughput_axis.plot(
            counts, [point.throughput_per_second for point in points], marker="o", color=color, label=name
        )
        throughput_axis.plot(
            counts, [point.ideal_throughput_per_second for point in points], linestyle="--", color=color, linewidth=1
        )
        efficiency_axis.plot(counts, [point.efficiency * 100 for point in points], marker="o", color=color, label=name)
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
    note = Paragraph(
        "Speed-up is each series' throughput over its throughput at its smallest device count n0; the ideal is "
        "n / n0 (perfect linear scaling); parallel efficiency is speed-up over ideal speed-up. The micro-batch "
        "per device is fixed, so the global batch grows with the devices (weak scaling)."
    )
    png = plot_scaling_series(series, unit)
    caption = (
        "Left: throughput against device count, log-log, dashed: the ideal line of each series. Right: parallel "
        "efficiency (speed-up over ideal speed-up). The data behind the plot holds the figures."
    )
    return [Heading(3, title), note, figure("scaling-efficiency", png, caption, data=scaling_table(series, unit, slug))]
