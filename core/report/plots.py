"""The report's plots, as PNG bytes. matplotlib is imported here only (``pip install 'core[report]'``)."""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Sequence
from typing import Any

from core.report.analysis import (
    PowerTrace,
    _batch_of,
    _pareto_cells,
    _plottable,
    _positive,
    group_series,
    pareto_front,
)
from core.report.document import PlotImage, ReportError, format_number, one_line, shorten
from core.storage.summary import CellSummary

_PLOT_TEXT_CHARS = 60  # of a label in a plot's legend or annotation
_MAX_LEGEND_ENTRIES = 16  # lines named in a plot's legend before "... and N more"

# --- plots ---------------------------------------------------------------------------------------


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ReportError("reports need matplotlib: pip install 'core[report]'") from None
    matplotlib.use("Agg")  # files only; never a window, also without a display
    import matplotlib.pyplot as pyplot

    return pyplot


# Each file's metadata without the software version and date: the same data gives the same bytes.
_SAVED_FORMATS: dict[str, dict[str, Any]] = {
    "png": {"dpi": 100, "metadata": {"Software": None}},
    "svg": {"metadata": {"Date": None, "Creator": None}},
    "pdf": {"metadata": {"CreationDate": None, "Creator": None, "Producer": None}},
}


def _png(figure: Any) -> bytes:
    """The figure as PNG bytes (the HTML embeds them) that carry it as SVG and PDF for print
    (:class:`~core.report.document.PlotImage`); log axes get plain tick labels first."""
    import matplotlib

    saved: dict[str, bytes] = {}
    try:
        plain_log_ticks(figure)
        # SVG ids from a fixed salt (else random per run); PDF text as TrueType, which a paper's editor
        # can still select and restyle (the default Type 3 glyphs cannot be).
        with matplotlib.rc_context({"svg.hashsalt": "core-report", "pdf.fonttype": 42}):
            for kind, options in _SAVED_FORMATS.items():
                buffer = io.BytesIO()
                figure.savefig(buffer, format=kind, bbox_inches="tight", **options)
                saved[kind] = buffer.getvalue()
    finally:
        _pyplot().close(figure)
    png = saved.pop("png")
    return PlotImage(png, saved)


def log_tick_label(value: float) -> str:
    """A log axis's tick text, plain: ``0.6``, ``2``, ``1000``, ``20k``, ``3M``, ``50µ``; never
    ``6x10^-1``."""
    if value == 0 or 1e-3 <= abs(value) < 1e4:
        return f"{value:g}"
    return format_number(value).replace(" ", "")


def plain_log_ticks(figure: Any) -> None:
    """Every log axis of ``figure`` still on matplotlib's default labels (``10^3``, ``6x10^-1``)
    labelled plainly instead, the same ticks labelled (:func:`log_tick_label`). Axes given labels
    of their own (the batch axis's counts) keep them."""
    from matplotlib.ticker import LogFormatter, LogFormatterSciNotation

    class PlainLogFormatter(LogFormatter):
        def _num_to_string(self, x: float, vmin: float, vmax: float) -> str:
            return log_tick_label(x)

    for axes in figure.axes:
        for axis in (axes.xaxis, axes.yaxis):
            for get, put in (
                (axis.get_major_formatter, axis.set_major_formatter),
                (axis.get_minor_formatter, axis.set_minor_formatter),
            ):
                old = get()
                if type(old) is LogFormatterSciNotation:
                    put(
                        PlainLogFormatter(
                            base=getattr(old, "_base", 10.0),
                            labelOnlyBase=old.labelOnlyBase,
                            minor_thresholds=old.minor_thresholds,
                            linthresh=getattr(old, "_linthresh", None),
                        )
                    )


def plot_text(text: Any) -> str:
    """Text for a legend or an annotation: one short line, ``$`` not read as mathtext, and not
    starting with ``_`` (which matplotlib takes for "leave out of the legend")."""
    text = shorten(one_line(text), _PLOT_TEXT_CHARS).replace("$", r"\$")
    return " " + text if text.startswith("_") else text


def _legend(axis: Any, size: str) -> None:
    """The legend, naming at most _MAX_LEGEND_ENTRIES lines; a line for the rest."""
    handles, labels = axis.get_legend_handles_labels()
    if not handles:
        return
    if len(handles) > _MAX_LEGEND_ENTRIES:
        rest = len(handles) - (_MAX_LEGEND_ENTRIES - 1)
        handles, labels = handles[: _MAX_LEGEND_ENTRIES - 1], labels[: _MAX_LEGEND_ENTRIES - 1]
        handles.append(axis.plot([], [], linestyle="none")[0])
        labels.append(f"... and {rest} more")
    axis.legend(handles, labels, fontsize=size)


def count_label(value: float) -> str:
    """Tick text for a count: ``1024``; ``2^20`` for large powers of two; ``3e+07`` otherwise."""
    if value >= 1e5:
        exponent = math.log2(value)
        return f"2^{exponent:.0f}" if abs(exponent - round(exponent)) < 1e-9 else f"{value:.3g}"
    return f"{value:g}"


def _batch_axis(axis: Any, values: Sequence[float]) -> None:
    """Log base 2 (batch sizes and device counts double), ticks at the values swept, plain labels."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    axis.set_xscale("log", base=2)
    distinct = sorted({value for value in values if _positive(value)})
    if 0 < len(distinct) <= 12:
        axis.set_xticks(distinct)
        axis.xaxis.set_minor_formatter(NullFormatter())
    axis.xaxis.set_major_formatter(FuncFormatter(lambda value, _position: count_label(value)))


XOf = Callable[[CellSummary], "float | None"]  # a cell's place on the x axis (default: its micro-batch)


def _failed_markers(axis: Any, cells: Sequence[CellSummary], color: Any, x_of: XOf = _batch_of) -> bool:
    """Cells without a figure (oom, error, timeout) as crosses along the bottom: data, not gaps."""
    failed = [batch for cell in cells if cell.repeats_ok == 0 and (batch := x_of(cell)) is not None]
    if failed:
        axis.plot(
            failed,
            [0.04] * len(failed),
            linestyle="none",
            marker="x",
            markersize=9,
            color=color,
            transform=axis.get_xaxis_transform(),
            clip_on=False,
        )
    return bool(failed)


def _batch_points(
    members: Sequence[CellSummary], figure_of: Callable[[CellSummary], float | None], log_y: bool, x_of: XOf = _batch_of
) -> list[tuple[float, float, CellSummary]]:
    """(x, figure, cell) of the cells that can be drawn, by x (the batch size unless ``x_of`` says)."""
    points = []
    for cell in members:
        batch, value = x_of(cell), figure_of(cell)
        if batch is not None and _plottable(value, log_y):
            points.append((batch, value, cell))
    return sorted(points, key=lambda point: (point[0], point[1]))


def _drawable_bounds(bounds: tuple[float, float] | None, value: float) -> tuple[float, float]:
    """An error bar's (low, high), each kept only where it can be drawn."""
    low, high = bounds or (value, value)
    return (low if _plottable(low) else value, high if _plottable(high) else value)


def drawable_against_batch(
    cells: Sequence[CellSummary],
    figure_of: Callable[[CellSummary], float | None],
    log_y: bool = True,
    x_of: XOf = _batch_of,
) -> bool:
    return bool(_batch_points(cells, figure_of, log_y, x_of))


def plot_against_batch(
    cells: Sequence[CellSummary],
    series_names: Sequence[str],
    figure_of: Callable[[CellSummary], float | None],
    spread_of: Callable[[CellSummary], tuple[float, float] | None] | None,
    ylabel: str,
    title: str,
    log_y: bool = True,
    xlabel: str = "micro-batch size (samples per device per micro-step)",
    x_of: XOf = _batch_of,
) -> bytes:
    pyplot = _pyplot()
    figure, axis = pyplot.subplots(figsize=(7.0, 4.4))
    draw_against(axis, cells, series_names, figure_of, spread_of, log_y, x_of)
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)
    axis.set_title(title)
    _legend(axis, "small")
    return _png(figure)


def draw_against(
    axis: Any,
    cells: Sequence[CellSummary],
    series_names: Sequence[str],
    figure_of: Callable[[CellSummary], float | None],
    spread_of: Callable[[CellSummary], tuple[float, float] | None] | None,
    log_y: bool,
    x_of: XOf,
) -> None:
    """A line per series (a colour each, in order) on ``axis``, its x axis log 2, crosses for cells
    without a figure; no labels, no legend."""
    any_failed = False
    xs: list[float] = []
    for index, (label, members) in enumerate(group_series(cells, series_names).items()):
        color = f"C{index % 10}"
        points = _batch_points(members, figure_of, log_y, x_of)
        xs += [batch for cell in members if (batch := x_of(cell)) is not None]
        if points:
            x = [point[0] for point in points]
            y = [point[1] for point in points]
            if spread_of is not None:
                bounds = [_drawable_bounds(spread_of(point[2]), point[1]) for point in points]
                error = [
                    [max(0.0, yi - low) for yi, (low, _) in zip(y, bounds)],
                    [max(0.0, high - yi) for yi, (_, high) in zip(y, bounds)],
                ]
                axis.errorbar(x, y, yerr=error, marker="o", color=color, label=plot_text(label), capsize=3)
            else:
                axis.plot(x, y, marker="o", color=color, label=plot_text(label))
        any_failed |= _failed_markers(axis, members, color, x_of)
    _batch_axis(axis, xs)
    if log_y:
        axis.set_yscale("log")
    else:
        axis.set_ylim(bottom=0)
    axis.grid(True, which="both", alpha=0.3)
    if any_failed:
        axis.plot([], [], linestyle="none", marker="x", color="black", label="no figure (oom, error, timeout)")


def plot_scaling(points: dict[str, list[tuple[int, float, float]]]) -> bytes:
    pyplot = _pyplot()
    figure, axis = pyplot.subplots(figsize=(7.0, 4.4))
    devices: list[int] = []
    for index, (label, series) in enumerate(points.items()):
        axis.plot(
            [p[0] for p in series],
            [p[2] * 100 for p in series],
            marker="o",
            color=f"C{index % 10}",
            label=plot_text(label),
        )
        devices += [p[0] for p in series]
    axis.axhline(100, color="grey", linestyle="--", linewidth=1, label="perfect scaling")
    _batch_axis(axis, devices)
    return _finish_from_zero(
        figure,
        axis,
        "devices (replicas x devices per replica)",
        "scaling efficiency (%)",
        "Scaling efficiency against device count",
        "small",
    )


def _finish_from_zero(figure: Any, axis: Any, xlabel: str, ylabel: str, title: str, legend_size: str) -> bytes:
    """Labels, a y axis from zero, a light grid and the legend; the PNG."""
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)
    axis.set_title(title)
    axis.set_ylim(bottom=0)
    axis.grid(True, alpha=0.3)
    _legend(axis, legend_size)
    return _png(figure)


def plot_pareto(cells: Sequence[CellSummary], series_names: Sequence[str], unit: str = "samples") -> bytes:
    pyplot = _pyplot()
    figure, axis = pyplot.subplots(figsize=(7.0, 4.4))
    usable = _pareto_cells(cells)
    for index, (label, members) in enumerate(group_series(usable, series_names).items()):
        axis.scatter(
            [cell.samples_per_watt_hour for cell in members],
            [cell.throughput_per_second for cell in members],
            color=f"C{index % 10}",
            label=plot_text(label),
            zorder=3,
        )
    points = [(cell.samples_per_watt_hour, cell.throughput_per_second) for cell in usable]
    front = pareto_front(points)  # type: ignore[arg-type]
    if front:
        axis.plot(
            [points[i][0] for i in front],
            [points[i][1] for i in front],
            color="black",
            linewidth=1,
            linestyle="--",
            label="Pareto front",
            zorder=2,
        )
        for i in front:
            axis.annotate(
                plot_text(usable[i].label), points[i], textcoords="offset points", xytext=(4, 4), fontsize="x-small"
            )
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel(f"{unit} per Wh (median)")
    axis.set_ylabel(f"throughput ({unit}/s, median)")
    axis.set_title("Throughput against energy efficiency")
    axis.grid(True, which="both", alpha=0.3)
    _legend(axis, "small")
    return _png(figure)


def plot_power_traces(traces: Sequence[PowerTrace]) -> bytes:
    pyplot = _pyplot()
    figure, axis = pyplot.subplots(figsize=(7.0, 4.4))
    for index, trace in enumerate(traces):
        # Each span's mean drawn flat across the span: the data is a mean per span, not a point.
        xs = [x for start, stop in zip(trace.start_seconds, trace.stop_seconds) for x in (start, stop)]
        ys = [math.nan if w is None else w for w in trace.watts for _ in (0, 1)]
        axis.plot(xs, ys, color=f"C{index % 10}", linestyle="-" if index < 10 else "--", label=plot_text(trace.label))
    return _finish_from_zero(
        figure,
        axis,
        "seconds from the start of the timed window",
        "power (W, all devices measured)",
        "Power over the timed window",
        "x-small",
    )


def plot_by_cell(
    cells: Sequence[CellSummary],
    figure_of: Callable[[CellSummary], float | None],
    spread_of: Callable[[CellSummary], tuple[float, float] | None],
    ylabel: str,
    title: str,
) -> bytes:
    """One bar per cell (a sweep over an axis that is no number, as precision), bars spanning the
    repeats; a cell without a figure keeps its place, empty."""
    pyplot = _pyplot()
    figure, axis = pyplot.subplots(figsize=(7.0, 4.4))
    labels = [plot_text(cell.label) for cell in cells]
    heights = [value if _plottable(value := figure_of(cell), False) else 0.0 for cell in cells]
    low, high = [], []
    for cell, height in zip(cells, heights):
        bounds = spread_of(cell) if height else None
        low.append(max(0.0, height - bounds[0]) if bounds else 0.0)
        high.append(max(0.0, bounds[1] - height) if bounds else 0.0)
    positions = list(range(len(cells)))
    axis.bar(positions, heights, yerr=[low, high], capsize=3, color=[f"C{i % 10}" for i in positions])
    axis.set_xticks(positions)
    axis.set_xticklabels(labels, rotation=30, ha="right", fontsize="small")
    return _finish_from_zero(figure, axis, "cell", ylabel, title, "small")


def plot_quality_curves(
    curves: Sequence[tuple[str, Sequence[tuple[int, Any]]]],
    x_of: Callable[[Any], float | None],
    targets: Sequence[float],
    xlabel: str,
    ylabel: str,
    title: str,
) -> bytes:
    """Quality curves: each cell a colour, each of its repeats a thin line of its evaluations
    (``outcome.curve``, read on x by ``x_of``); each target a dashed horizontal line.

    :param curves: (cell label, [(repeat, TargetOutcome)]) per cell, in order.
    """
    pyplot = _pyplot()
    figure, axis = pyplot.subplots(figsize=(7.0, 4.4))
    for index, (label, outcomes) in enumerate(curves):
        color = f"C{index % 10}"
        named = False
        for _, outcome in outcomes:
            points = [(x, point.value) for point in outcome.curve if (x := x_of(point)) is not None]
            if not points:
                continue
            axis.plot(
                [point[0] for point in points],
                [point[1] for point in points],
                color=color,
                linewidth=1.0,
                alpha=0.7,
                marker=".",
                label=None if named else plot_text(label),
            )
            named = True
    for target in targets:
        axis.axhline(target, color="black", linestyle="--", linewidth=1)
    if targets:
        axis.plot([], [], color="black", linestyle="--", linewidth=1, label="target")
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)
    axis.set_title(title)
    axis.set_xlim(left=0)
    axis.grid(True, alpha=0.3)
    _legend(axis, "small")
    return _png(figure)
