"""A sweep's runs trained to a target quality (``config.target``, issue 31): time, energy, epochs and
samples to the target over each cell's repeats, as MLPerf Training scores them (the olympic mean,
core.storage.summary.olympic_mean) beside their median, min and max and how many repeats reached it;
time and energy to target against the sweep's axis (a batch-size sweep's fall-then-rise: a larger
batch takes fewer, faster steps per epoch but more epochs); and the quality curves each run drew.

A sweep without such runs has no such part, and costs the report one look at each cell.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from core.base.results import RunState, TargetOutcome
from core.base.units import JOULES_PER_WATT_HOUR
from core.report import axes
from core.report.analysis import _short
from core.report.document import (
    Block,
    Heading,
    Paragraph,
    Table,
    Value,
    format_duration,
    format_number,
    one_line,
    shorten,
    without_empty_columns,
)
from core.report.plotdata import against_batch_table
from core.report.plots import plot_against_batch, plot_by_cell, plot_quality_curves
from core.storage.summary import OLYMPIC_MINIMUM_RUNS, CellSummary, ToTarget

if TYPE_CHECKING:
    from core.report.sections import SweepData

TITLE = "Time to target"


@dataclass(frozen=True)
class _Figure:
    """One figure to the target: its declared name, its words, and how a value reads in a table."""

    name: str
    words: str
    unit: str  # in a column's header ("" where the text carries it: a time)
    text: Callable[[float | None], str]


_FIGURES = (
    _Figure("time_to_target_seconds", "time to target", "", format_duration),
    _Figure("energy_to_target_joules", "energy to target", "J", format_number),
    _Figure("epochs_to_target", "epochs to target", "", format_number),
    _Figure("samples_to_target", "samples to target", "", format_number),
)
# The summaries a figure's columns show; the median, min and max of the time and the energy only.
_SUMMARIES: tuple[tuple[str, str, Callable[[ToTarget], float | None]], ...] = (
    ("olympic_mean", "olympic mean", lambda figure: figure.olympic_mean),
    ("median", "median", lambda figure: figure.median),
    ("min", "min", lambda figure: figure.minimum),
    ("max", "max", lambda figure: figure.maximum),
)
_SPREAD_FIGURES = {"time_to_target_seconds", "energy_to_target_joules"}


def trained_to_target(cells: Sequence[CellSummary]) -> list[CellSummary]:
    """The cells with a repeat that trained to a target (and measured it)."""
    return [cell for cell in cells if cell.trained_to_target]


def _outcomes(cell: CellSummary) -> list[tuple[int, TargetOutcome]]:
    """(repeat, outcome) of each measured repeat that trained to a target."""
    return [
        (run.repeat if run.repeat is not None else 0, run.result.to_target)
        for run in cell.runs
        if run.result.status.state in (RunState.ok, RunState.target_not_reached) and run.result.to_target is not None
    ]


def target_text(outcome: TargetOutcome) -> str:
    """The target in words: ``top1 >= 0.95``."""
    return f"{outcome.metric} {'>=' if outcome.higher_is_better else '<='} {outcome.target:g}"


def _targets(cell: CellSummary) -> str:
    return ", ".join(sorted({target_text(outcome) for _, outcome in _outcomes(cell)}))


def _final_value(cell: CellSummary) -> Value:
    value = cell.figure("target_final_value")
    return Value(format_number(value), value)


def _table(cells: Sequence[CellSummary], varying: Sequence[str], identifier: str) -> Table:
    """One row per cell: the options that vary, the target, reached k of n, and each figure's
    olympic mean, median, min and max (epochs and samples: the olympic mean and median)."""
    columns: list[tuple[str, str]] = [(name, _short(name)) for name in varying]
    columns += [("target", "target"), ("reached", "reached")]
    for figure in _FIGURES:
        unit = f" ({figure.unit})" if figure.unit else ""
        for key, words, _ in _SUMMARIES:
            if key in ("min", "max") and figure.name not in _SPREAD_FIGURES:
                continue
            columns.append((f"{figure.name}_{key}", f"{figure.words}{unit}, {words}"))
    columns.append(("target_final_value", "final metric (median)"))
    rows = []
    for cell in cells:
        row = [Value(shorten(one_line(cell.option(name)))) for name in varying]
        reached = cell.targets_reached
        row += [Value(shorten(one_line(_targets(cell)))), Value(f"{reached} of {cell.trained_to_target}", reached)]
        for figure in _FIGURES:
            summary = cell.to_target(figure.name)
            for key, _, read in _SUMMARIES:
                if key in ("min", "max") and figure.name not in _SPREAD_FIGURES:
                    continue
                value = read(summary)
                row.append(Value(figure.text(value), value))
        row.append(_final_value(cell))
        rows.append(row)
    table = Table(columns=columns, rows=rows, identifier=identifier, row_keys=[cell.cell_key for cell in cells])
    return without_empty_columns(table)


def _reading(cells: Sequence[CellSummary]) -> Paragraph:
    runs = sum(cell.trained_to_target for cell in cells)
    reached = sum(cell.targets_reached for cell in cells)
    return Paragraph(
        f"{runs} runs trained to a target quality; {reached} reached it. Each run's clock starts at its first "
        "training step (initialisation before it, reported apart) and runs, evaluations included, to the first "
        "evaluation that meets the target, as MLPerf Training times it. A cell's score is MLPerf's olympic mean: "
        "the fastest and the slowest repeat dropped, the rest averaged, where a repeat that did not reach the "
        f"target counts as the slowest; it needs at least {OLYMPIC_MINIMUM_RUNS} repeats and at most one that "
        "missed (n/a otherwise, as MLPerf has no valid result then). Median, min and max are over the repeats "
        "that reached the target. Energy is every measured device's, from the clock's start to that evaluation."
    )


# --- time and energy to target against the sweep's axis ----------------------------------------


def _numeric_axis(sweep: SweepData, cells: Sequence[CellSummary]) -> str | None:
    """The axis to draw against: the sweep's batch axis where it varies, else the device count; None
    where neither varies (precision alone: one bar per cell)."""
    if axes.varies(cells, sweep.x_axis):
        return sweep.x_axis
    if axes.varies(cells, axes.DEVICES):
        return axes.DEVICES
    return None


def _median_of(name: str, scale: float = 1.0) -> Callable[[CellSummary], float | None]:
    def read(cell: CellSummary) -> float | None:
        median = cell.to_target(name).median
        return None if median is None else median * scale

    return read


def _range_of(name: str, scale: float = 1.0) -> Callable[[CellSummary], tuple[float, float] | None]:
    def read(cell: CellSummary) -> tuple[float, float] | None:
        figure = cell.to_target(name)
        if figure.minimum is None or figure.maximum is None:
            return None
        return (figure.minimum * scale, figure.maximum * scale)

    return read


def _against_blocks(
    sweep: SweepData, cells: Sequence[CellSummary], name: str, words: str, ylabel: str, scale: float
) -> list[Block]:
    read = _median_of(name, scale)
    if not any(read(cell) is not None for cell in cells):
        return []
    kind = name.replace("_", "-").removesuffix("-seconds").removesuffix("-joules")
    caption_tail = (
        "median over the repeats that reached the target, bars from the fastest to the slowest of them; "
        "a cell none of whose repeats reached it has no point"
    )
    axis = _numeric_axis(sweep, cells)
    if axis is None:
        png = plot_by_cell(cells, read, _range_of(name, scale), ylabel, f"{words.capitalize()} by cell (median)")
        caption = f"{words.capitalize()} of each cell: {caption_tail}"
        data = _by_cell_table(cells, read, ylabel, f"{kind}-data-{sweep.slug}")
        return [Heading(4, f"{words.capitalize()} by cell"), sweep.figure(f"{kind}-by-cell", png, caption, data=data)]
    x_name = axes.axis_label(axis).split(" (", 1)[0]
    x_of = lambda cell: axes.position(cell, axis)  # noqa: E731 - the axis chosen above
    series = sweep.series_names if axis == sweep.x_axis else axes.series_names(cells, sweep.varying, axis)
    png = plot_against_batch(
        cells,
        series,
        read,
        _range_of(name, scale),
        ylabel,
        f"{words.capitalize()} against {x_name} (median, bars: min-max)",
        log_y=True,
        xlabel=axes.axis_label(axis) if axis != sweep.x_axis else sweep.batch_label,
        x_of=x_of,
    )
    data = against_batch_table(
        cells, series, read, ylabel + ", median", f"{kind}-data-{sweep.slug}", (axis, x_name, x_of)
    )
    caption = f"{words.capitalize()} against {x_name}, log-log: {caption_tail}"
    return [
        Heading(4, f"{words.capitalize()} against {x_name}"),
        sweep.figure(f"{kind}-vs-{axis.replace('_', '-').replace('.', '-')}", png, caption, data=data),
    ]


def _by_cell_table(
    cells: Sequence[CellSummary], read: Callable[[CellSummary], float | None], header: str, identifier: str
) -> Table:
    rows = []
    for cell in cells:
        value = read(cell)
        rows.append(
            [
                Value(shorten(one_line(cell.label))),
                Value(format_number(value) if value is not None else f"n/a ({cell.status})", value),
            ]
        )
    return Table(columns=[("cell", "cell"), ("value", header + ", median")], rows=rows, identifier=identifier)


# --- the quality curves --------------------------------------------------------------------------

# What a curve is drawn against: (key, the x axis' words, how a point gives it).
_CURVE_AXES: tuple[tuple[str, str, Callable[[Any], float | None]], ...] = (
    ("seconds", "training seconds (evaluations included)", lambda point: point.seconds),
    ("samples", "training samples", lambda point: float(point.samples)),
    ("joules", "energy (J, every device)", lambda point: point.joules),
)


def _curves(cells: Sequence[CellSummary]) -> list[tuple[str, list[tuple[int, TargetOutcome]]]]:
    return [(cell.label, outcomes) for cell in cells if (outcomes := _outcomes(cell))]


def _curve_table(
    cells: Sequence[CellSummary], x: Callable[[Any], float | None], x_key: str, x_header: str, identifier: str
) -> Table:
    """Every evaluation of every run drawn: cell, repeat, where on the x axis, the metric."""
    rows = []
    row_keys = []
    for cell in cells:
        for repeat, outcome in _outcomes(cell):
            for point in outcome.curve:
                position = x(point)
                if position is None:
                    continue
                rows.append(
                    [
                        Value(shorten(one_line(cell.label))),
                        Value(str(repeat), repeat),
                        Value(format_number(position), position),
                        Value(format_number(point.value), point.value),
                    ]
                )
                row_keys.append(cell.cell_key)
    return Table(
        columns=[("cell", "cell"), ("repeat", "repeat"), (x_key, x_header), ("value", "metric")],
        rows=rows,
        identifier=identifier,
        row_keys=row_keys,
    )


def _curve_blocks(sweep: SweepData, cells: Sequence[CellSummary]) -> list[Block]:
    curves = _curves(cells)
    outcomes = [outcome for _, members in curves for _, outcome in members]
    if not any(outcome.curve for outcome in outcomes):
        return [Paragraph("No run recorded an evaluation, so there are no quality curves.")]
    metrics = sorted({outcome.metric for outcome in outcomes})
    targets = sorted({outcome.target for outcome in outcomes})
    ylabel = ", ".join(metrics)
    blocks: list[Block] = []
    for key, words, x in _CURVE_AXES:
        if not any(x(point) is not None for outcome in outcomes for point in outcome.curve):
            if key == "joules":
                blocks.append(Paragraph("No run measured energy at its evaluations, so no curve against energy."))
            continue
        png = plot_quality_curves(curves, x, targets, words, ylabel, f"Quality against {words.split(' (')[0]}")
        caption = (
            f"{ylabel} at each evaluation against {words}: a colour per cell, a thin line per repeat; "
            "the dashed line is the target"
        )
        table = _curve_table(cells, x, key, words, f"quality-{key}-data-{sweep.slug}")
        blocks += [
            Heading(4, f"Quality against {words.split(' (')[0]}"),
            sweep.figure(f"quality-vs-{key}", png, caption, data=table),
        ]
    return blocks


def to_target_blocks(sweep: SweepData) -> list[Block]:
    """The sweep's "Time to target" part: its table, the plots against its axis, the quality curves;
    nothing where no cell trained to a target."""
    cells = trained_to_target(sweep.cells)
    if not cells:
        return []
    blocks: list[Block] = [
        Heading(3, sweep.titled(TITLE)),
        _reading(cells),
        _table(cells, sweep.varying, f"to-target-{sweep.slug}"),
    ]
    blocks += _against_blocks(sweep, cells, "time_to_target_seconds", "time to target", "time to target (s)", 1.0)
    blocks += _against_blocks(
        sweep, cells, "energy_to_target_joules", "energy to target", "energy to target (Wh)", 1 / JOULES_PER_WATT_HOUR
    )
    return blocks + _curve_blocks(sweep, cells)


# --- single runs ----------------------------------------------------------------------------------


def single_runs_target_table(cells: Sequence[CellSummary], identifier: str) -> Table | None:
    """Single runs trained to a target, one row each: its own time, energy, epochs and samples to the
    target (no repeats, so no olympic mean), whether it reached it and the metric where it ended."""
    rows = []
    keys = []
    for cell in cells:
        for _, outcome in _outcomes(cell):
            run = cell.runs[0]
            final = outcome.curve[-1].value if outcome.curve else None
            joules = outcome.energy_to_target_joules
            rows.append(
                [
                    Value(str(run.run_id), run.run_id),
                    Value(shorten(one_line(target_text(outcome)))),
                    Value("yes" if outcome.reached else f"no ({outcome.stopped_by})", int(outcome.reached)),
                    Value(format_duration(outcome.time_to_target_seconds), outcome.time_to_target_seconds),
                    Value(format_number(joules), joules),
                    Value(format_number(outcome.epochs_to_target), outcome.epochs_to_target),
                    Value(format_number(outcome.samples_to_target), outcome.samples_to_target),
                    Value(format_number(final), final),
                ]
            )
            keys.append(cell.cell_key)
    if not rows:
        return None
    columns = [
        ("run_id", "run"),
        ("target", "target"),
        ("reached", "reached"),
        ("time_to_target_seconds", "time to target"),
        ("energy_to_target_joules", "energy to target (J)"),
        ("epochs_to_target", "epochs to target"),
        ("samples_to_target", "samples to target"),
        ("target_final_value", "final metric"),
    ]
    return without_empty_columns(Table(columns=columns, rows=rows, identifier=identifier, row_keys=keys))
