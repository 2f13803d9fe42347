"""Normalised heatmaps (AI4NP Fig. 3): two axes of a sweep against MFU or against the best cell.

For every pair of axes that vary (those with the micro-batch size as x where it varies), one
heatmap per combination of the other varying options, so a map never mixes cells that differ
elsewhere. A map is normalised to peak, MFU (achieved FLOP/s over the devices' peak: 100 % is
the hardware's limit), where every measured cell has an MFU; otherwise to the map's best cell
(achieved FLOP/s where every cell has it, as the paper does, else throughput: the best is 100 %). A cell that ran
out of memory or failed is left blank and marked with its state, as the paper's blank cells are.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import TYPE_CHECKING, Any

from core.report.analysis import _BATCH, _positive, _short
from core.report.document import Block, Heading, Paragraph, Table, Value, format_percent, one_line, shorten
from core.report.plots import _png, _pyplot, plot_text
from core.storage.summary import CellSummary

if TYPE_CHECKING:
    from core.report.sections import SweepData

MAX_HEATMAPS = 8  # per sweep and measure: beyond these the section says how many were left out
_MAX_AXIS_VALUES = 24  # an axis with more values than this is not readable as rows or columns


@dataclass(frozen=True)
class Heatmap:
    """One map: rows (y) by columns (x) of normalised values; None where a cell has no figure."""

    x_axis: str
    y_axis: str
    fixed: tuple[tuple[str, Any], ...]  # the other varying options' values shared by the map's cells
    x_values: list[Any]
    y_values: list[Any]
    values: list[list[float | None]]  # [row][column], a fraction (1.0 = 100 %)
    states: list[list[str]]  # "" where a value is shown; the cell's state ("oom") or "-" where none
    measure: str  # "MFU" or "fraction of the best cell (...)"

    @property
    def title(self) -> str:
        return f"{self.measure}: {_short(self.y_axis)} x {_short(self.x_axis)}" + (
            f" ({self.fixed_text})" if self.fixed else ""
        )

    @property
    def fixed_text(self) -> str:
        return ", ".join(f"{_short(name)}={value}" for name, value in self.fixed)


def _sort_key(value: Any) -> tuple[int, Any]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, value)
    return (1, repr(value))


def axis_pairs(varying: Sequence[str], cells: Sequence[CellSummary]) -> list[tuple[str, str]]:
    """(x, y) pairs of the options that vary, each with at most _MAX_AXIS_VALUES values; the
    micro-batch size is always x where it is one of them (AI4NP's maps run along the batch)."""
    usable = [
        name
        for name in varying
        if 1 < len({repr(cell.option(name)) for cell in cells}) <= _MAX_AXIS_VALUES
        and name not in ("seed", "steps", "warmup_steps")
    ]
    pairs = [(second, first) if second == _BATCH else (first, second) for first, second in combinations(usable, 2)]
    # Along the batch where it varies (AI4NP's maps are): the other pairs would multiply the maps
    # without showing what the batch does, which is what a sweep over it is for.
    along_batch = [pair for pair in pairs if pair[0] == _BATCH]
    return along_batch or pairs


def _flops_or_throughput(cells: Sequence[CellSummary]) -> tuple[Callable[[CellSummary], float | None], str]:
    """What "the best cell" is best at: achieved FLOP/s where every cell with a throughput has it
    (cells of different models compare by work done), else throughput."""
    measured = [cell for cell in cells if _positive(cell.throughput_per_second)]
    if measured and all(_positive(cell.flops_per_second) for cell in measured):
        return (lambda cell: cell.flops_per_second), "achieved FLOP/s"
    return (lambda cell: cell.throughput_per_second), "throughput"


def _maps_for(
    cells: Sequence[CellSummary], x_axis: str, y_axis: str, others: Sequence[str]
) -> list[tuple[tuple[tuple[str, Any], ...], list[CellSummary]]]:
    groups: dict[tuple[tuple[str, Any], ...], list[CellSummary]] = {}
    for cell in cells:
        key = tuple((name, cell.option(name)) for name in others)
        groups.setdefault(key, []).append(cell)
    return sorted(groups.items(), key=lambda item: [_sort_key(value) for _, value in item[0]])


def build_heatmap(
    cells: Sequence[CellSummary],
    x_axis: str,
    y_axis: str,
    fixed: tuple[tuple[str, Any], ...],
    measure: str,
) -> Heatmap | None:
    """One map of ``cells`` (which share every other option); ``measure`` "mfu" or "best".
    None where no cell of the map has the figure."""
    x_values = sorted({cell.option(x_axis) for cell in cells}, key=_sort_key)
    y_values = sorted({cell.option(y_axis) for cell in cells}, key=_sort_key)
    by_position = {(cell.option(y_axis), cell.option(x_axis)): cell for cell in cells}
    if measure == "mfu":
        figure_of: Callable[[CellSummary], float | None] = lambda cell: cell.model_flops_utilization  # noqa: E731
        scale, name = 1.0, "MFU (achieved FLOP/s / peak)"
    else:
        figure_of, what = _flops_or_throughput(cells)
        best = max((v for cell in cells if _positive(v := figure_of(cell))), default=None)
        if best is None:
            return None
        scale, name = 1.0 / best, f"fraction of the best cell ({what})"
    values: list[list[float | None]] = []
    states: list[list[str]] = []
    for y in y_values:
        row_values: list[float | None] = []
        row_states: list[str] = []
        for x in x_values:
            cell = by_position.get((y, x))
            value = figure_of(cell) if cell is not None else None
            if cell is not None and _positive(value):
                row_values.append(value * scale)
                row_states.append("")
            else:
                row_values.append(None)
                row_states.append("-" if cell is None or cell.status == "ok" else cell.status)
        values.append(row_values)
        states.append(row_states)
    if all(value is None for row in values for value in row):
        return None
    return Heatmap(x_axis, y_axis, fixed, x_values, y_values, values, states, name)


def heatmaps(cells: Sequence[CellSummary], varying: Sequence[str], measure: str) -> list[Heatmap]:
    """Every map of the sweep's axis pairs (see the module's docstring) that has a figure."""
    found = []
    usable = [name for name in varying if name not in ("seed", "steps", "warmup_steps")]
    for x_axis, y_axis in axis_pairs(usable, cells):
        others = [name for name in usable if name not in (x_axis, y_axis)]
        for fixed, members in _maps_for(cells, x_axis, y_axis, others):
            heatmap = build_heatmap(members, x_axis, y_axis, fixed, measure)
            if heatmap is not None:
                found.append(heatmap)
    return found


def _tick(value: Any) -> str:
    return shorten(one_line(value), 16)


def plot_heatmap(heatmap: Heatmap) -> bytes:
    """The map, one colour per cell from 0 to the larger of 100 % and its largest value, each
    cell's percentage written in it, blank cells named by their state."""
    pyplot = _pyplot()
    columns, rows = len(heatmap.x_values), len(heatmap.y_values)
    figure, axis = pyplot.subplots(figsize=(min(12.0, 2.2 + 0.9 * columns), min(9.0, 1.8 + 0.55 * rows)))
    grid = [[math.nan if value is None else value * 100 for value in row] for row in heatmap.values]
    # The colours span 0 to the map's largest value (at least 1 %): an MFU map of a few per cent
    # drawn against 100 % would be one colour; the numbers in the cells stay absolute.
    top = max(1.0, max((v for row in grid for v in row if not math.isnan(v)), default=100.0))
    colours = pyplot.get_cmap("viridis").with_extremes(bad="white")
    image = axis.imshow(grid, cmap=colours, vmin=0, vmax=top, aspect="auto", origin="lower")
    for row in range(rows):
        for column in range(columns):
            value = grid[row][column]
            text = heatmap.states[row][column] if math.isnan(value) else f"{value:.3g}"
            dark = not math.isnan(value) and value < top * 0.6
            axis.text(column, row, text, ha="center", va="center", fontsize="small", color="white" if dark else "black")
    axis.set_xticks(range(columns), [_tick(value) for value in heatmap.x_values])
    axis.set_yticks(range(rows), [_tick(value) for value in heatmap.y_values])
    axis.set_xlabel(_axis_label(heatmap.x_axis))
    axis.set_ylabel(_axis_label(heatmap.y_axis))
    # Two lines, each kept short on its own: what is measured, then which cells.
    which = f"{_short(heatmap.y_axis)} x {_short(heatmap.x_axis)}" + (
        f", {heatmap.fixed_text}" if heatmap.fixed else ""
    )
    axis.set_title(f"{plot_text(heatmap.measure)}\n{plot_text(which)}", fontsize="medium")
    bar = figure.colorbar(image, ax=axis)
    bar.set_label(f"{heatmap.measure.split(' (')[0]} (%)")
    return _png(figure)


_AXIS_UNITS = {
    _BATCH: "micro-batch size (samples per device per micro-step)",
    "workload_options.hidden_width": "hidden width D_H (nodes per layer)",
    "workload_options.layers": "hidden layers l",
    "workload_options.input_width": "input width D_I (features)",
    "workload_options.output_width": "output width D_O (classes)",
    "replicas": "replicas (devices in data parallel)",
    "gradient_accumulation": "gradient accumulation (micro-steps per update)",
}


def _axis_label(name: str) -> str:
    return _AXIS_UNITS.get(name, _short(name))


def heatmap_table(heatmap: Heatmap, identifier: str) -> Table:
    """The map as rows and columns, percentages as text, fractions behind them."""
    columns = [(heatmap.y_axis, f"{_short(heatmap.y_axis)} \\ {_short(heatmap.x_axis)}")] + [
        (f"{heatmap.x_axis}={value}", _tick(value)) for value in heatmap.x_values
    ]
    rows = []
    for y, values, states in zip(heatmap.y_values, heatmap.values, heatmap.states):
        rows.append(
            [Value(_tick(y))]
            + [Value(state if value is None else format_percent(value), value) for value, state in zip(values, states)]
        )
    return Table(columns=columns, rows=rows, identifier=identifier)


def heatmap_blocks(sweep: SweepData) -> list[Block]:
    """The sweep's normalised heatmaps, MFU first, each with its data; or why none is drawn."""
    title = sweep.titled("Utilisation heatmaps")
    if not axis_pairs(sweep.varying, sweep.cells):
        return [Heading(3, title), Paragraph("Not drawn: the sweep varies fewer than two options.")]
    blocks: list[Block] = [
        Heading(3, title),
        Paragraph(
            "Two axes of the sweep against MFU (100 % is the devices' peak) where every cell has one, else "
            "against the fraction of the map's best cell (100 % is the best cell), as AI4NP's Fig. 3; one map "
            "per value of the other options that vary. Colours span 0 to the map's largest value; the numbers "
            "are percentages. Blank cells name their state (oom: out of memory; -: not run)."
        ),
    ]
    drawn = 0
    measured = [cell for cell in sweep.cells if _positive(cell.throughput_per_second)]
    every_mfu = bool(measured) and all(_positive(cell.model_flops_utilization) for cell in measured)
    for measure in ("mfu",) if every_mfu else ("best",):
        maps = heatmaps(sweep.cells, sweep.varying, measure)
        for index, heatmap in enumerate(maps[:MAX_HEATMAPS]):
            drawn += 1
            blocks.append(
                sweep.figure(
                    f"heatmap-{measure}-{index + 1}",
                    plot_heatmap(heatmap),
                    heatmap.title,
                    data=heatmap_table(heatmap, f"heatmap-{measure}-{sweep.slug}-{index + 1}"),
                )
            )
        if len(maps) > MAX_HEATMAPS:
            blocks.append(Paragraph(f"... and {len(maps) - MAX_HEATMAPS} more {measure} maps, left out."))
    if not drawn:
        return [Heading(3, title), Paragraph("Not drawn: no cell has an MFU or a throughput figure.")]
    return blocks
