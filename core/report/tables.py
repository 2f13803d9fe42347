"""The report's tables: a sweep's cells with their figures (training and inference apart), and
throughput by batch size. Each cell is a text and the exact number behind it (``Value``)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from core.report.analysis import _BATCH, _short, group_series, ran_loadgen
from core.report.axes import axis_value
from core.report.document import (
    Table,
    Value,
    format_duration,
    format_number,
    format_percent,
    one_line,
    shorten,
    without_empty_columns,
)
from core.storage.metrics import INFERENCE, TRAINING, Metric, Summary, reported
from core.storage.summary import SPREAD_FLAG_FRACTION, CellSummary


def _first_line(text: str | None, limit: int = 160) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _option_text(value: Any) -> str:
    return shorten(one_line(value))


_NOTE_CHARS = 90  # of a failure's message in a table's note (the Failures list has all of it)


def _cell_note(cell: CellSummary) -> str:
    if cell.failure is not None:
        message = _first_line(cell.failure.status.message, _NOTE_CHARS)
        more = " (see Failures)" if message != (cell.failure.status.message or "").strip() else ""
        return f"{cell.failure.status.phase or ''}: {message}{more}".strip(": ")
    if cell.flagged:
        return flag_reason(cell)
    return ""


def host_busy_runs(cell: CellSummary) -> tuple[int, int, list[str]]:
    """(runs whose host was busy, runs whose host load was recorded, what the busy ones read)."""
    loads = [result.host_load for result in cell.results if result.host_load is not None]
    busy = [load for load in loads if load.busy]
    return len(busy), len(loads), [load.describe() for load in busy]


def flag_reason(cell: CellSummary) -> str:
    """Why a cell is flagged, and whether its host was busy during its runs (the likely cause)."""
    spread = cell.spread_of("throughput_per_second")
    reason = f"spread {format_percent(spread)} > {format_percent(SPREAD_FLAG_FRACTION)}"
    busy, recorded, readings = host_busy_runs(cell)
    if not recorded:
        return f"{reason}; host load not recorded"
    if busy:
        return f"{reason}; host busy in {busy} of {recorded} runs ({readings[0]})"
    return f"{reason}; host not busy"


def sample_unit(cells: Sequence[CellSummary]) -> str:
    """What the cells' samples are ('images', 'sequences') where they agree, else 'samples'."""
    units = {cell.sample_unit for cell in cells}
    return units.pop() if len(units) == 1 else "samples"


def _number(value: float | None, scale: float = 1.0) -> Value:
    scaled = None if value is None else value * scale
    return Value(format_number(scaled), scaled)


@dataclass(frozen=True)
class _Column:
    key: str
    header: str
    value: Callable[[CellSummary], Value]


def singular(unit: str) -> str:
    """One of the samples: 'image' of 'images'; 'sample' where nothing is left."""
    return unit.removesuffix("s") or "sample"


def metric_value(cell: CellSummary, metric: Metric) -> Value:
    """A cell's figure as its declaration shows it: scaled, or as a percentage."""
    shown = metric.reported
    value = cell.figure(metric.name)
    number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if shown is not None and shown.percent:
        return Value(format_percent(number), number)
    if metric.summary is Summary.holds and number is not None:
        return Value(f"{number}/{cell.having(metric.name)}", number)
    if number is None and value is not None:
        return Value(_option_text(value))
    return _number(number, shown.scale if shown is not None else 1.0)


def metric_header(metric: Metric, unit: str, short: bool = False) -> str:
    """The declared header of a figure's column, in the cells' sample unit."""
    shown = metric.reported
    if shown is None:
        return metric.name
    text = (shown.short or shown.header) if short else shown.header
    return text.format(unit=unit, sample=singular(unit))


def _metric_columns(table: str, unit: str) -> list[_Column]:
    """The figures a table shows, as declared in core.storage.metrics, in order; a figure summarised
    with a spread is followed by its spread."""
    columns = []
    for metric in reported(table):
        columns.append(_figure_column(metric, unit))
        if metric.summary is Summary.median_spread:
            columns.append(_spread_column(metric.name))
    return columns


# A time's unit in a header ("(ms, median)"): the cells carry theirs (850 ms, 40.18 s, 2.3 h).
_TIME_UNIT = re.compile(r"\((?:ms|s), ")


def _figure_column(metric: Metric, unit: str) -> _Column:
    key = (metric.reported.key if metric.reported is not None else None) or metric.name
    if metric.unit == "s":
        return _Column(key, _TIME_UNIT.sub("(", metric_header(metric, unit)), lambda cell: _time_value(cell, metric))
    return _Column(key, metric_header(metric, unit), lambda cell: metric_value(cell, metric))


def _time_value(cell: CellSummary, metric: Metric) -> Value:
    """A time with its unit in the cell; the number behind it as the declaration scales it (ms)."""
    value = metric_value(cell, metric)
    if value.number is None:
        return value
    scale = metric.reported.scale if metric.reported is not None else 1.0
    return Value(format_duration(value.number / scale), value.number)


def _spread_column(name: str) -> _Column:
    # Throughput's spread keeps the key it always had: the tests and the HTML ids know it.
    key = "spread" if name == "throughput_per_second" else f"{name}_spread"
    return _Column(key, "spread (max-min)/median", lambda cell: _spread_value(cell, name))


def _spread_value(cell: CellSummary, name: str) -> Value:
    spread = cell.spread_of(name)
    return Value(format_percent(spread), spread)


def _status_columns() -> list[_Column]:
    """What every cells table opens with: how the cell went."""
    return [
        _Column("status", "status", lambda cell: Value(cell.status + (" (flagged)" if cell.flagged else ""))),
        _Column(
            "repeats_ok",
            "repeats ok",
            lambda cell: Value(f"{cell.repeats_ok}/{cell.repeats_recorded}", cell.repeats_ok),
        ),
    ]


def _with_figures(columns: Sequence[_Column], optional: set[str], cells: Sequence[CellSummary]) -> list[_Column]:
    """``columns`` less the optional ones no cell has a figure for."""
    return [
        column
        for column in columns
        if column.key not in optional or any(column.value(cell).number is not None for cell in cells)
    ]


def _optional_keys(table: str) -> set[str]:
    return {
        metric.reported.key or metric.name
        for metric in reported(table)
        if metric.reported is not None and metric.reported.optional
    }


def _cell_columns(cells: Sequence[CellSummary]) -> list[_Column]:
    """The figures' columns, units in the headers. Optional columns (tokens, epochs) appear only
    where some cell has the figure, so a vision sweep's table does not carry empty token columns."""
    columns = [
        *_status_columns(),
        *_metric_columns(TRAINING, sample_unit(cells)),
        _Column("note", "note", lambda cell: Value(_cell_note(cell))),
    ]
    return _with_figures(columns, _optional_keys(TRAINING), cells)


def _option_headers(varying: Sequence[str], figures: Sequence[_Column]) -> list[tuple[str, str]]:
    """Options' short names as headers, or their full names where a short one is taken twice."""
    shorts = [_short(name) for name in varying] + [column.header for column in figures]
    return [(name, _short(name) if shorts.count(_short(name)) == 1 else name) for name in varying]


def _table(cells: Sequence[CellSummary], varying: Sequence[str], figures: Sequence[_Column], identifier: str) -> Table:
    """One row per cell: the options that vary, then the figures."""
    columns = _option_headers(varying, figures) + [(column.key, column.header) for column in figures]
    rows = [
        [Value(_option_text(cell.option(name))) for name in varying] + [column.value(cell) for column in figures]
        for cell in cells
    ]
    table = Table(columns=columns, rows=rows, identifier=identifier, row_keys=[cell.cell_key for cell in cells])
    return without_empty_columns(table)


def cells_table(cells: Sequence[CellSummary], varying: Sequence[str], identifier: str) -> Table:
    """Training cells: throughput, energy (J, Wh, per device, per epoch), FLOP/s and MFU."""
    return _table(cells, varying, _cell_columns(cells), identifier)


def _batch_sort_key(batch: Any) -> tuple[int, Any]:
    """Batch sizes in order; anything not a number (a missing one) after them."""
    if isinstance(batch, (int, float)) and not isinstance(batch, bool):
        return (0, batch)
    return (1, repr(batch))


def batch_table(
    cells: Sequence[CellSummary], series_names: Sequence[str], identifier: str, x_axis: str = _BATCH
) -> Table:
    """Median throughput by series (rows) and batch size (columns, on ``x_axis``: the micro-batch
    unless it names another); failed cells show their state."""
    batches = sorted({axis_value(cell, x_axis) for cell in cells}, key=_batch_sort_key)
    series = group_series(cells, series_names)
    columns = [("series", "series")] + [
        (f"{x_axis}={batch}", "unknown" if batch is None else str(batch)) for batch in batches
    ]
    rows = []
    for label, members in series.items():
        by_batch = {axis_value(cell, x_axis): cell for cell in members}
        row = [Value(_option_text(label))]
        for batch in batches:
            cell = by_batch.get(batch)
            if cell is None:
                row.append(Value("-"))
            elif cell.throughput_per_second is None:
                row.append(Value(cell.status))
            else:
                row.append(Value(format_number(cell.throughput_per_second), cell.throughput_per_second))
        rows.append(row)
    return Table(columns=columns, rows=rows, identifier=identifier)


# --- inference ----------------------------------------------------------------------------------

_MILLISECONDS_PER_SECOND = 1e3


def latency_milliseconds(cell: CellSummary, field: str) -> float | None:
    """The median over the cell's repeats of one latency percentile (``step_seconds_*``), in ms."""
    seconds = cell.median(field)
    return None if seconds is None else seconds * _MILLISECONDS_PER_SECOND


def loadgen_verdict(cell: CellSummary) -> Value:
    """LoadGen's verdict over the cell's successful repeats: VALID when every one is; '-' where
    LoadGen did not run (the loop), or where no repeat got as far as its verdict."""
    verdicts = [result.loadgen.valid for result in cell.ok_results if result.loadgen is not None]
    invalid = verdicts.count(False)
    if not verdicts:
        return Value("-")
    if not invalid:
        return Value("VALID", len(verdicts))
    return Value("INVALID" if invalid == len(verdicts) else f"INVALID ({invalid} of {len(verdicts)} repeats)", 0)


def _inference_note(cell: CellSummary) -> str:
    """The cell's note, and why LoadGen judged it INVALID (in LoadGen's words) where it did."""
    reasons = [
        one_line(result.loadgen.invalid_reason or "no reason given")
        for result in cell.ok_results
        if result.loadgen is not None and not result.loadgen.valid
    ]
    notes = [_cell_note(cell)] + ([f"LoadGen: {_first_line(reasons[0])}"] if reasons else [])
    return "; ".join(note for note in notes if note)


def _inference_columns(cells: Sequence[CellSummary]) -> list[_Column]:
    """Samples/s, latency percentiles, energy per sample and per Wh, the epoch-time estimate where
    some cell has one (as core.storage.metrics declares them), and LoadGen's verdict where some
    cell ran under LoadGen."""
    columns = [
        *_status_columns(),
        *_metric_columns(INFERENCE, sample_unit(cells)),
        _Column("loadgen_verdict", "LoadGen", loadgen_verdict),
        _Column("note", "note", lambda cell: Value(_inference_note(cell))),
    ]
    columns = _with_figures(columns, _optional_keys(INFERENCE), cells)
    return [column for column in columns if column.key != "loadgen_verdict" or any(map(ran_loadgen, cells))]


def inference_table(cells: Sequence[CellSummary], varying: Sequence[str], identifier: str) -> Table:
    """Inference cells: samples/s, latency p50/p90/p99, energy per sample, samples/Wh, LoadGen's verdict."""
    return _table(cells, varying, _inference_columns(cells), identifier)


# --- single runs --------------------------------------------------------------------------------


def _started(cell: CellSummary) -> Value:
    started = cell.runs[0].result.started_at
    return Value(started.strftime("%Y-%m-%d %H:%M:%S %Z").strip())


def _own(header: str) -> str:
    """A cells table's header for one run's own figure: no median where there are no repeats."""
    return header.replace(", median)", ")").replace(" (median)", "")


def single_runs_table(cells: Sequence[CellSummary], identifier: str, inference: bool = False) -> Table:
    """Single runs (``core run --database``), one row each: its id, when it started, what ran, and the
    figures of the cells table of its mode, less what only repeats have (repeats, spread)."""
    figures = _inference_columns(cells) if inference else _cell_columns(cells)
    repeats_only = {"repeats_ok"} | {column.key for column in figures if column.header.startswith("spread")}
    columns = [
        _Column("run_id", "run", lambda cell: Value(str(cell.runs[0].run_id), cell.runs[0].run_id)),
        _Column("started_at", "started", _started),
        _Column("cell_label", "what ran", lambda cell: Value(_option_text(cell.label))),
        *(column for column in figures if column.key not in repeats_only),
    ]
    table = Table(
        columns=[(column.key, _own(column.header)) for column in columns],
        rows=[[column.value(cell) for column in columns] for cell in cells],
        identifier=identifier,
        row_keys=[cell.cell_key for cell in cells],
    )
    return without_empty_columns(table)
