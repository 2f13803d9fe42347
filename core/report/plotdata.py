"""The data behind the report's plots, as tables shown with them (``Figure.data``): what a reader
copies into a spreadsheet to redraw or check a plot."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from core.report.analysis import _BATCH, PowerTrace, _batch_of, _pareto_cells, group_series, pareto_front
from core.report.document import Table, Value, format_number, one_line, shorten
from core.storage.summary import CellSummary


def _text(text: object) -> str:
    """A label from the database, on one line and of a length a table can show."""
    return shorten(one_line(text))


def against_batch_table(
    cells: Sequence[CellSummary],
    series_names: Sequence[str],
    figure_of: Callable[[CellSummary], float | None],
    header: str,
    identifier: str,
    x_axis: tuple[str, str, Callable[[CellSummary], float | None]] = (_BATCH, "micro-batch", _batch_of),
) -> Table:
    """One row per cell: series, its x (the micro-batch size unless ``x_axis`` names another as
    (name, header, value)), the plotted figure (n/a and the state where none)."""
    x_name, x_header, x_of = x_axis
    rows = []
    for label, members in group_series(cells, series_names).items():
        for cell in sorted(members, key=lambda cell: x_of(cell) or 0):
            batch, value = x_of(cell), figure_of(cell)
            rows.append(
                [
                    Value(_text(label)),
                    Value("n/a" if batch is None else str(batch), batch),
                    Value(format_number(value) if value is not None else f"n/a ({cell.status})", value),
                ]
            )
    return Table(
        columns=[("series", "series"), (x_name, x_header), ("value", header)],
        rows=rows,
        identifier=identifier,
    )


def pareto_table(cells: Sequence[CellSummary], unit: str, identifier: str) -> Table:
    usable = _pareto_cells(cells)
    front = set(pareto_front([(c.samples_per_watt_hour, c.throughput_per_second) for c in usable]))  # type: ignore[misc]
    return Table(
        columns=[
            ("cell", "cell"),
            ("samples_per_watt_hour", f"{unit} per Wh"),
            ("throughput_per_second", f"throughput ({unit}/s)"),
            ("pareto_front", "on the front"),
        ],
        rows=[
            [
                Value(_text(cell.label)),
                Value(format_number(cell.samples_per_watt_hour), cell.samples_per_watt_hour),
                Value(format_number(cell.throughput_per_second), cell.throughput_per_second),
                Value("yes" if index in front else "no"),
            ]
            for index, cell in enumerate(usable)
        ],
        identifier=identifier,
    )


def power_table(traces: Sequence[PowerTrace], identifier: str) -> Table:
    return Table(
        columns=[("cell", "cell"), ("start_seconds", "from (s)"), ("stop_seconds", "to (s)"), ("watts", "power (W)")],
        rows=[
            [
                Value(_text(trace.label)),
                Value(format_number(start), start),
                Value(format_number(stop), stop),
                Value(format_number(watts), watts),
            ]
            for trace in traces
            for start, stop, watts in zip(trace.start_seconds, trace.stop_seconds, trace.watts)
        ],
        identifier=identifier,
    )
