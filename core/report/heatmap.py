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
from core.report.axes import axis_label, axis_value, best_per_place, keep, varies
from core.report.document import Block, Figure, Heading, Paragraph, Table, Value, format_percent, one_line, shorten
from core.report.plots import _png, _pyplot, plot_text
from core.storage.summary import CellSummary
from core.sweep.report_spec import DEFAULT_MAX_HEATMAPS, HeatmapSpec

if TYPE_CHECKING:
    from core.report.sections import SweepData

MAX_HEATMAPS = DEFAULT_MAX_HEATMAPS  # default maps per sweep and measure; the section names those left out
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
        key = tuple((name, axis_value(cell, name)) for name in others)
        groups.setdefault(key, []).append(cell)
    return sorted(groups.items(), key=lambda item: [_sort_key(value) for _, value in item[0]])


def build_heatmap(
    cells: Sequence[CellSummary],
    x_axis: str,
    y_axis: str,
    fixed: tuple[tuple[str, Any], ...],
    measure: str,
    best_of: Callable[[CellSummary], float | None] | None = None,
) -> Heatmap | None:
    """One map of ``cells`` (which share every other option shown); ``measure`` "mfu", "best" (the
    map's best cell is 1) or "group-best" (``best_of(cell)``, the best of the cell's group, is 1;
    without it, each row's best). Where several cells share a position (options folded), the best
    of them is shown. None where no cell of the map has the figure."""
    x_values = sorted({axis_value(cell, x_axis) for cell in cells}, key=_sort_key)
    y_values = sorted({axis_value(cell, y_axis) for cell in cells}, key=_sort_key)
    if measure == "mfu":
        figure_of: Callable[[CellSummary], float | None] = lambda cell: cell.model_flops_utilization  # noqa: E731
        name = "MFU (achieved FLOP/s / peak)"
    else:
        figure_of, what = _flops_or_throughput(cells)
        whose = "map" if measure == "best" else "group" if best_of is not None else "row"
        name = f"fraction of the {whose}'s best cell ({what})"
    shown = best_per_place(
        cells, lambda cell: (repr(axis_value(cell, y_axis)), repr(axis_value(cell, x_axis))), figure_of
    )
    by_position = {(repr(axis_value(cell, y_axis)), repr(axis_value(cell, x_axis))): cell for cell in shown}
    divisor = _divisor(shown, measure, figure_of, best_of, lambda cell: repr(axis_value(cell, y_axis)))
    if divisor is None:
        return None
    values: list[list[float | None]] = []
    states: list[list[str]] = []
    for y in y_values:
        row_values: list[float | None] = []
        row_states: list[str] = []
        for x in x_values:
            cell = by_position.get((repr(y), repr(x)))
            value = figure_of(cell) if cell is not None else None
            scale = divisor(cell) if cell is not None else None
            if cell is not None and _positive(value) and scale is not None:
                row_values.append(value / scale)
                row_states.append("")
            else:
                row_values.append(None)
                row_states.append("-" if cell is None or cell.status == "ok" else cell.status)
        values.append(row_values)
        states.append(row_states)
    if all(value is None for row in values for value in row):
        return None
    return Heatmap(x_axis, y_axis, fixed, x_values, y_values, values, states, name)


def _divisor(
    cells: Sequence[CellSummary],
    measure: str,
    figure_of: Callable[[CellSummary], float | None],
    best_of: Callable[[CellSummary], float | None] | None,
    row_of: Callable[[CellSummary], str],
) -> Callable[[CellSummary], float | None] | None:
    """What each cell's figure is divided by; None where the map has no figure at all."""
    if measure == "mfu":
        return lambda cell: 1.0
    if measure == "group-best":
        if best_of is not None:
            return best_of
        rows: dict[str, float] = {}
        for cell in cells:
            if _positive(value := figure_of(cell)):
                rows[row_of(cell)] = max(value, rows.get(row_of(cell), 0.0))
        return lambda cell: rows.get(row_of(cell))
    best = max((v for cell in cells if _positive(v := figure_of(cell))), default=None)
    return None if best is None else (lambda cell: best)


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
    return _AXIS_UNITS.get(name) or axis_label(name)


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


_SKIPPED = ("seed", "steps", "warmup_steps")
_NORMALISATIONS = {"mfu": "mfu", "map-best": "best", "group-best": "group-best"}


def spec_heatmaps(cells: Sequence[CellSummary], varying: Sequence[str], spec: HeatmapSpec) -> tuple[list[Heatmap], str]:
    """The maps a [[report.heatmaps]] entry asks for, every one of them; the measure's name."""
    chosen = keep(cells, spec.filter)
    others = [name for name in varying if name not in (spec.x, spec.y, *_SKIPPED) and varies(chosen, name)]
    facet = [name for name in spec.facet if varies(chosen, name)] if spec.facet is not None else others
    measure = _NORMALISATIONS[spec.normalise] if spec.normalise else _default_measure(chosen)
    best_of = _group_bests(chosen, spec.group) if measure == "group-best" and spec.group is not None else None
    found = []
    for fixed, members in _maps_for(chosen, spec.x, spec.y, facet):
        heatmap = build_heatmap(members, spec.x, spec.y, fixed, measure, best_of)
        if heatmap is not None:
            found.append(heatmap)
    return found, measure


def _group_bests(cells: Sequence[CellSummary], group: Sequence[str]) -> Callable[[CellSummary], float | None]:
    """Each cell's group's best figure (FLOP/s or throughput, as the maps measure), by the group's options."""
    figure_of, _ = _flops_or_throughput(cells)

    def key(cell: CellSummary) -> str:
        return repr([axis_value(cell, name) for name in group])

    bests: dict[str, float] = {}
    for cell in cells:
        if _positive(value := figure_of(cell)):
            bests[key(cell)] = max(value, bests.get(key(cell), 0.0))
    return lambda cell: bests.get(key(cell))


def _default_measure(cells: Sequence[CellSummary]) -> str:
    measured = [cell for cell in cells if _positive(cell.throughput_per_second)]
    every_mfu = bool(measured) and all(_positive(cell.model_flops_utilization) for cell in measured)
    return "mfu" if every_mfu else "best"


def _map_figure(sweep: SweepData, heatmap: Heatmap, kind: str, identifier: str) -> Block:
    return sweep.figure(kind, plot_heatmap(heatmap), heatmap.title, data=heatmap_table(heatmap, identifier))


def _asked_blocks(sweep: SweepData, specs: Sequence[HeatmapSpec]) -> list[Block]:
    """Every map the [report] table asks for: no cap."""
    blocks: list[Block] = []
    for number, spec in enumerate(specs, start=1):
        maps, measure = spec_heatmaps(sweep.cells, sweep.varying, spec)
        chosen = keep(sweep.cells, spec.filter)
        shown = {spec.x, spec.y, *(spec.facet if spec.facet is not None else sweep.varying)}
        folded = [
            _short(name)
            for name in sweep.varying
            if name not in shown and name not in _SKIPPED and varies(chosen, name)
        ]
        blocks.append(Heading(4, spec.title or f"{_short(spec.y)} x {_short(spec.x)}"))
        if folded:
            blocks.append(
                Paragraph(
                    f"Each position shows its best cell over {', '.join(folded)} (options on no axis of the map)."
                )
            )
        if not maps:
            blocks.append(Paragraph("Not drawn: no cell of these maps has a figure."))
        for index, heatmap in enumerate(maps, start=1):
            kind = f"heatmap-{number}-{measure}-{index}"
            blocks.append(_map_figure(sweep, heatmap, kind, f"{kind}-{sweep.slug}"))
    return blocks


def _default_blocks(sweep: SweepData, cap: int) -> list[Block]:
    """The maps of the sweep's axis pairs, at most ``cap``; the ones left out named."""
    blocks: list[Block] = []
    measure = _default_measure(sweep.cells)
    maps = heatmaps(sweep.cells, sweep.varying, measure)
    for index, heatmap in enumerate(maps[:cap]):
        identifier = f"heatmap-{measure}-{sweep.slug}-{index + 1}"
        blocks.append(_map_figure(sweep, heatmap, f"heatmap-{measure}-{index + 1}", identifier))
    left = maps[cap:]
    if left:
        named = "; ".join(heatmap.title for heatmap in left[:_LEFT_OUT_NAMED])
        more = f"; and {len(left) - _LEFT_OUT_NAMED} more" if len(left) > _LEFT_OUT_NAMED else ""
        blocks.append(
            Paragraph(
                f"... and {len(left)} more {measure} maps, left out (a [report] table's max_heatmaps or heatmaps "
                f"draws them): {shorten(one_line(named), 1000)}{more}."
            )
        )
    return blocks


_LEFT_OUT_NAMED = 12  # maps named in the note on those left out


def heatmap_blocks(sweep: SweepData) -> list[Block]:
    """The sweep's normalised heatmaps, each with its data: those its [report] table asks for, else
    the default pairs (capped); or why none is drawn."""
    title = sweep.titled("Utilisation heatmaps")
    asked = sweep.report.heatmaps if sweep.report is not None else None
    if asked is None and not axis_pairs(sweep.varying, sweep.cells):
        return [Heading(3, title), Paragraph("Not drawn: the sweep varies fewer than two options.")]
    blocks: list[Block] = [
        Heading(3, title),
        Paragraph(
            "Two axes of the sweep against MFU (100 % is the devices' peak) where every cell has one, else "
            "against the fraction of the map's best cell (100 % is the best cell); a [report] table may ask for "
            "each group's best instead, as AI4NP's Fig. 3. One map per value of the other options that vary. "
            "Colours span 0 to the map's largest value; the numbers are percentages. Blank cells name their "
            "state (oom: out of memory; -: not run)."
        ),
    ]
    cap = sweep.report.max_heatmaps if sweep.report is not None else MAX_HEATMAPS
    drawn = _asked_blocks(sweep, asked) if asked is not None else _default_blocks(sweep, cap)
    if not any(isinstance(block, Figure) for block in drawn):
        return [Heading(3, title), Paragraph("Not drawn: no cell has an MFU or a throughput figure.")]
    return blocks + drawn
