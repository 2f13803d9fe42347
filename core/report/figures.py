"""The line plots a sweep file's ``[[report.figures]]`` ask for: a figure against any axis, a line
per series, a panel per facet value, over the cells a filter keeps (AI4NP's Fig. 4: achieved FLOP/s
against the batch, one panel per D_H level, a line per layer count).

Options that vary among the kept cells but sit on no axis of the figure are folded: each point is
the best of the cells that share its panel, series and x, and the figure's note names them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from core.report import axes
from core.report.analysis import _short, group_series, varying_options
from core.report.document import Block, Heading, Paragraph, Table, Value, format_number, one_line, shorten
from core.report.plots import _legend, _png, _pyplot, draw_against, plot_text
from core.report.tables import latency_milliseconds, sample_unit
from core.storage.summary import CellSummary
from core.sweep.report_spec import FigureSpec

if TYPE_CHECKING:
    from core.report.sections import SweepData

_SKIPPED = ("seed", "steps", "warmup_steps")
_PANELS_PER_ROW = 3
_TITLE_CHARS = 120  # of a figure's title over its panels (a paper's caption is long)
_MAX_PANELS = 12  # panels in one figure before it stops being readable; the rest are named


@dataclass(frozen=True)
class _Measure:
    figure_of: Callable[[CellSummary], float | None]
    label: str  # the y axis; {unit} is the cells' sample unit
    log_y: bool = True


def _scaled(read: Callable[[CellSummary], float | None], factor: float) -> Callable[[CellSummary], float | None]:
    def figure_of(cell: CellSummary) -> float | None:
        value = read(cell)
        return None if value is None else value * factor

    return figure_of


_MEASURES = {
    "throughput": _Measure(lambda cell: cell.throughput_per_second, "throughput ({unit}/s, median)"),
    "tokens_per_second": _Measure(lambda cell: cell.tokens_per_second, "throughput (tokens/s, median)"),
    "flops": _Measure(_scaled(lambda cell: cell.flops_per_second, 1e-12), "achieved TFLOP/s (median)"),
    "mfu": _Measure(_scaled(lambda cell: cell.model_flops_utilization, 100.0), "MFU (% of peak)", log_y=False),
    "samples_per_wh": _Measure(lambda cell: cell.samples_per_watt_hour, "{unit} per Wh (median)"),
    "p90_latency": _Measure(lambda cell: latency_milliseconds(cell, "step_seconds_p90"), "p90 latency (ms)"),
}


def _folded(cells: Sequence[CellSummary], shown: Sequence[str], place: Callable[[CellSummary], Any]) -> list[str]:
    """The options on no axis that differ between cells of one place: those a point is the best of."""
    names = [name for name in varying_options(cells) if name not in shown and name not in _SKIPPED]
    places: dict[Any, list[CellSummary]] = {}
    for cell in cells:
        places.setdefault(place(cell), []).append(cell)
    return [name for name in names if any(axes.varies(members, name) for members in places.values())]


def _panels(cells: Sequence[CellSummary], facet: str | None) -> list[tuple[str, list[CellSummary]]]:
    if facet is None:
        return [("", list(cells))]
    # Told apart by repr (1 and "1" are two panels), labelled as the series are: framework=torch.
    shown = {repr(axes.axis_value(cell, facet)): axes.axis_value(cell, facet) for cell in cells}
    values = sorted(shown, key=lambda text: _order(cells, facet, text))
    return [
        (f"{_short(facet)}={shown[text]}", [c for c in cells if repr(axes.axis_value(c, facet)) == text])
        for text in values
    ]


def _order(cells: Sequence[CellSummary], facet: str, text: str) -> tuple[int, Any]:
    value = next(axes.axis_value(c, facet) for c in cells if repr(axes.axis_value(c, facet)) == text)
    return (0, value) if isinstance(value, (int, float)) and not isinstance(value, bool) else (1, text)


def plot_panels(
    panels: Sequence[tuple[str, list[CellSummary]]],
    series: Sequence[str],
    measure: _Measure,
    x: str,
    ylabel: str,
    title: str,
) -> bytes:
    """One panel per facet value (a row of up to three), each a line per series against ``x``."""
    pyplot = _pyplot()
    columns = min(len(panels), _PANELS_PER_ROW)
    rows = math.ceil(len(panels) / columns)
    figure, grid = pyplot.subplots(rows, columns, figsize=(5.0 * columns, 4.0 * rows), squeeze=False)
    for index, (name, cells) in enumerate(panels):
        axis = grid[index // columns][index % columns]
        draw_against(axis, cells, series, measure.figure_of, None, measure.log_y, lambda c: axes.position(c, x))
        axis.set_xlabel(axes.axis_label(x))
        axis.set_ylabel(ylabel)
        if name:
            axis.set_title(plot_text(name), fontsize="medium")
        _legend(axis, "x-small")
    for index in range(len(panels), rows * columns):
        grid[index // columns][index % columns].set_visible(False)
    figure.suptitle(shorten(one_line(title), _TITLE_CHARS).replace("$", r"\$"))
    figure.tight_layout()
    return _png(figure)


def _table(
    panels: Sequence[tuple[str, list[CellSummary]]],
    series: Sequence[str],
    measure: _Measure,
    x: str,
    header: str,
    identifier: str,
) -> Table:
    rows = []
    for panel, cells in panels:
        for label, members in group_series(cells, series).items():
            for cell in sorted(members, key=lambda cell: axes.position(cell, x) or 0):
                value, place = measure.figure_of(cell), axes.axis_value(cell, x)
                rows.append(
                    [
                        Value(shorten(one_line(panel)) or "-"),
                        Value(shorten(one_line(label))),
                        Value(shorten(one_line(place)), place if isinstance(place, (int, float)) else None),
                        Value(format_number(value) if value is not None else f"n/a ({cell.status})", value),
                    ]
                )
    return Table(
        columns=[("panel", "panel"), ("series", "series"), (x, _short(x)), ("value", header)],
        rows=rows,
        identifier=identifier,
    )


def _figure(sweep: SweepData, spec: FigureSpec, number: int) -> list[Block]:
    cells = axes.keep(sweep.cells, spec.filter)
    measure = _MEASURES[spec.y]
    x = spec.x or sweep.x_axis
    title = spec.title or f"{spec.y} against {_short(x)}" + (
        f", one panel per {_short(spec.facet)}" if spec.facet else ""
    )
    heading = Heading(3, sweep.titled(shorten(one_line(title))))
    if not cells:
        return [heading, Paragraph("Not drawn: the figure's filter keeps no cell.")]
    varying = [name for name in varying_options(cells) if name != spec.facet]
    series = spec.series if spec.series is not None else axes.series_names(cells, varying, x)
    shown = [x, *([spec.facet] if spec.facet else []), *series]

    def place(cell: CellSummary) -> tuple[str, ...]:
        return tuple(repr(axes.axis_value(cell, name)) for name in shown)

    folded = _folded(cells, shown, place)
    kept = axes.best_per_place(cells, place, measure.figure_of) if folded else list(cells)
    panels = _panels(kept, spec.facet)
    blocks: list[Block] = [heading]
    if len(panels) > _MAX_PANELS:
        names = ", ".join(name for name, _ in panels[_MAX_PANELS:])
        blocks.append(Paragraph(f"The first {_MAX_PANELS} of {len(panels)} panels; left out: {shorten(names, 600)}."))
        panels = panels[:_MAX_PANELS]
    if not any(
        measure.figure_of(cell) is not None and axes.position(cell, x) for _, members in panels for cell in members
    ):
        return blocks + [Paragraph(f"Not drawn: no kept cell has a {spec.y} figure at a positive {_short(x)}.")]
    if folded:
        blocks.append(
            Paragraph(f"Each point is the best of the cells that share it, over {', '.join(map(_short, folded))}.")
        )
    ylabel = measure.label.format(unit=sample_unit(kept))
    png = plot_panels(panels, series, measure, x, ylabel, title)
    caption = f"{ylabel} against {axes.axis_label(x)}" + (
        f"; a line per {', '.join(map(_short, series))}" if series else ""
    )
    data = _table(panels, series, measure, x, ylabel, f"figure-{number}-{sweep.slug}")
    return blocks + [sweep.figure(f"figure-{number}", png, caption, data=data)]


def figure_blocks(sweep: SweepData) -> list[Block]:
    """The figures of the sweep's [report] table, in its order; nothing without one."""
    if sweep.report is None:
        return []
    blocks: list[Block] = []
    for number, spec in enumerate(sweep.report.figures, start=1):
        blocks += _figure(sweep, spec, number)
    return blocks
