"""The report's tables: a sweep's cells with their figures (training and inference apart), and
throughput by batch size. Each cell is a text and the exact number behind it (``Value``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from core.report.analysis import _BATCH, _short, group_series, ran_loadgen
from core.report.document import Table, Value, format_number, format_percent, one_line, shorten
from core.storage.summary import SPREAD_FLAG_FRACTION, CellSummary


def _first_line(text: str | None, limit: int = 160) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _option_text(value: Any) -> str:
    return shorten(one_line(value))


def _cell_note(cell: CellSummary) -> str:
    if cell.failure is not None:
        return f"{cell.failure.status.phase or ''}: {_first_line(cell.failure.status.message)}".strip(": ")
    if cell.flagged:
        return f"spread above {SPREAD_FLAG_FRACTION:.0%}"
    return ""


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


def _leading_columns(unit: str) -> list[_Column]:
    """What every cells table opens with: how the cell went, and its throughput."""
    return [
        _Column("status", "status", lambda cell: Value(cell.status + (" (flagged)" if cell.flagged else ""))),
        _Column(
            "repeats_ok",
            "repeats ok",
            lambda cell: Value(f"{cell.repeats_ok}/{cell.repeats_recorded}", cell.repeats_ok),
        ),
        _Column(
            "throughput_per_second", f"throughput ({unit}/s, median)", lambda cell: _number(cell.throughput_per_second)
        ),
        _Column("spread", "spread (max-min)/median", lambda cell: Value(format_percent(cell.spread), cell.spread)),
    ]


def _with_figures(columns: Sequence[_Column], optional: set[str], cells: Sequence[CellSummary]) -> list[_Column]:
    """``columns`` less the optional ones no cell has a figure for."""
    return [
        column
        for column in columns
        if column.key not in optional or any(column.value(cell).number is not None for cell in cells)
    ]


def _cell_columns(cells: Sequence[CellSummary]) -> list[_Column]:
    """The figures' columns, units in the headers. Token and epoch columns appear only where some
    cell has the figure, so a vision sweep's table does not carry empty token columns."""
    unit = sample_unit(cells)
    columns = [
        *_leading_columns(unit),
        _Column("tokens_per_second", "tokens/s (median)", lambda cell: _number(cell.tokens_per_second)),
        _Column("energy_joules", "energy (J, median)", lambda cell: _number(cell.energy_joules)),
        _Column("energy_watt_hours", "energy (Wh, median)", lambda cell: _number(cell.energy_watt_hours)),
        _Column(
            "energy_watt_hours_per_device",
            "energy per device (Wh, median)",
            lambda cell: _number(cell.energy_watt_hours_per_device),
        ),
        _Column("samples_per_watt_hour", f"{unit}/Wh (median)", lambda cell: _number(cell.samples_per_watt_hour)),
        _Column("tokens_per_watt_hour", "tokens/Wh (median)", lambda cell: _number(cell.tokens_per_watt_hour)),
        _Column(
            "energy_watt_hours_per_epoch",
            "energy per epoch (Wh, estimate, median)",
            lambda cell: _number(cell.energy_watt_hours_per_epoch),
        ),
        _Column("flops_per_second", "TFLOP/s (median)", lambda cell: _number(cell.flops_per_second, 1e-12)),
        _Column(
            "model_flops_utilization",
            "MFU (median)",
            lambda cell: Value(format_percent(cell.model_flops_utilization), cell.model_flops_utilization),
        ),
        _Column("note", "note", lambda cell: Value(_cell_note(cell))),
    ]
    return _with_figures(columns, {"tokens_per_second", "tokens_per_watt_hour", "energy_watt_hours_per_epoch"}, cells)


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
    return Table(columns=columns, rows=rows, identifier=identifier, row_keys=[cell.cell_key for cell in cells])


def cells_table(cells: Sequence[CellSummary], varying: Sequence[str], identifier: str) -> Table:
    """Training cells: throughput, energy (J, Wh, per device, per epoch), FLOP/s and MFU."""
    return _table(cells, varying, _cell_columns(cells), identifier)


def _batch_sort_key(batch: Any) -> tuple[int, Any]:
    """Batch sizes in order; anything not a number (a missing one) after them."""
    if isinstance(batch, (int, float)) and not isinstance(batch, bool):
        return (0, batch)
    return (1, repr(batch))


def batch_table(cells: Sequence[CellSummary], series_names: Sequence[str], identifier: str) -> Table:
    """Median throughput by series (rows) and batch size (columns); failed cells show their state."""
    batches = sorted({cell.option(_BATCH) for cell in cells}, key=_batch_sort_key)
    series = group_series(cells, series_names)
    columns = [("series", "series")] + [
        (f"{_BATCH}={batch}", "unknown" if batch is None else str(batch)) for batch in batches
    ]
    rows = []
    for label, members in series.items():
        by_batch = {cell.option(_BATCH): cell for cell in members}
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
# The percentiles of the window's latencies, by the RunResult field that holds each. In the loop a
# latency is one micro-batch's (step) time; under LoadGen's single-stream and server one query's,
# issue to answer; offline sends a single query, so it has none.
LATENCY_PERCENTILES = (("p50", "step_seconds_median"), ("p90", "step_seconds_p90"), ("p99", "step_seconds_p99"))


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


def _latency_column(name: str, field: str) -> _Column:
    return _Column(
        f"latency_{name}_milliseconds",
        f"latency {name} (ms, median)",
        lambda cell: _number(latency_milliseconds(cell, field)),
    )


def _inference_columns(cells: Sequence[CellSummary]) -> list[_Column]:
    """Samples/s, latency percentiles, energy per sample and per Wh, the epoch-time estimate where
    some cell has one, and LoadGen's verdict where some cell ran under LoadGen."""
    unit = sample_unit(cells)
    latencies = [_latency_column(name, field) for name, field in LATENCY_PERCENTILES]
    columns = [
        *_leading_columns(unit),
        *latencies,
        _Column(
            "energy_joules_per_sample",
            f"energy per {unit.removesuffix('s') or 'sample'} (J, median)",
            lambda cell: _number(cell.median("energy_joules_per_sample")),
        ),
        _Column("samples_per_watt_hour", f"{unit}/Wh (median)", lambda cell: _number(cell.samples_per_watt_hour)),
        _Column(
            "epoch_seconds", "time per epoch (s, estimate, median)", lambda cell: _number(cell.median("epoch_seconds"))
        ),
        _Column("loadgen_verdict", "LoadGen", loadgen_verdict),
        _Column("note", "note", lambda cell: Value(_inference_note(cell))),
    ]
    columns = _with_figures(columns, {"epoch_seconds"}, cells)
    return [column for column in columns if column.key != "loadgen_verdict" or any(map(ran_loadgen, cells))]


def inference_table(cells: Sequence[CellSummary], varying: Sequence[str], identifier: str) -> Table:
    """Inference cells: samples/s, latency p50/p90/p99, energy per sample, samples/Wh, LoadGen's verdict."""
    return _table(cells, varying, _inference_columns(cells), identifier)
