"""Reports: the database's sweeps as Markdown and a self-contained HTML page, with plots.

    from core.report import write_report
    files = write_report("results/core.db", "results/report")

For each sweep: a table of its cells (median of the repeats, spread, flag), a throughput table
by batch size (out-of-memory cells shown as such, as the blank cells of the AI4NP heatmap), and
five plots: throughput against batch size (log-log, one line per accelerator, precision and any
other option that varies), samples per Wh against batch size, scaling efficiency against device
count, MFU (or achieved FLOP/s where no peak is known) against batch size, and throughput against
samples per Wh with its Pareto front. A plot without data is not drawn; the report says why.

The plots are PNG files under ``plots/``, which report.md links; report.html embeds the same
bytes as data: URIs, so the page is one file that can be mailed or attached to a CI run.
matplotlib is imported here only (``pip install 'core[report]'``).
"""

from __future__ import annotations

import base64
import html
import io
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

from core.config import RunConfig
from core.errors import CoreError
from core.store import ResultStore, SweepRecord
from core.summary import SPREAD_FLAG_FRACTION, CellSummary, summarise

REPORT_MARKDOWN = "report.md"
REPORT_HTML = "report.html"
PLOTS_DIRECTORY = "plots"
_BATCH = "micro_batch_size"
_DEVICE_OPTIONS = ("replicas", "devices_per_replica")
_MESSAGE_CHARS = 1200  # of a failure's message shown in the report (the database has all of it)


class ReportError(CoreError):
    """Nothing to report, or matplotlib is missing."""


# --- the document: blocks rendered to Markdown and to HTML ------------------------------------


@dataclass(frozen=True)
class Value:
    """A table cell: its text, and the exact number behind it (HTML keeps it in data-value)."""

    text: str
    number: float | int | None = None


@dataclass(frozen=True)
class Table:
    columns: list[tuple[str, str]]  # (machine name, header text)
    rows: list[list[Value]]
    identifier: str = ""
    row_keys: list[str] = field(default_factory=list)  # each row's cell key (HTML data-cell-key)


@dataclass(frozen=True)
class Figure:
    file_name: str  # under plots/
    png: bytes
    caption: str


@dataclass(frozen=True)
class Heading:
    level: int
    text: str


@dataclass(frozen=True)
class Paragraph:
    text: str


@dataclass(frozen=True)
class Preformatted:
    text: str


Block = Heading | Paragraph | Table | Figure | Preformatted


def format_number(value: float | int | None) -> str:
    """Four significant digits, thousands separated from 1,000 up; ``n/a`` for None."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 1e-3:
        return f"{value:.4g}"
    return f"{value:.3e}"


def format_percent(fraction: float | None) -> str:
    return "n/a" if fraction is None else f"{fraction * 100:.1f} %"


def _markdown_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(title: str, blocks: Sequence[Block]) -> str:
    lines = [f"# {title}", ""]
    for block in blocks:
        if isinstance(block, Heading):
            lines += [f"{'#' * block.level} {block.text}", ""]
        elif isinstance(block, Paragraph):
            lines += [block.text, ""]
        elif isinstance(block, Preformatted):
            lines += ["```text", block.text, "```", ""]
        elif isinstance(block, Figure):
            lines += [f"![{block.caption}]({PLOTS_DIRECTORY}/{block.file_name})", "", f"*{block.caption}*", ""]
        elif isinstance(block, Table):
            lines.append("| " + " | ".join(_markdown_escape(header) for _, header in block.columns) + " |")
            lines.append("|" + "|".join(" --- " for _ in block.columns) + "|")
            for row in block.rows:
                lines.append("| " + " | ".join(_markdown_escape(value.text) for value in row) + " |")
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 72rem;
       padding: 0 1rem; color: #1d1d1f; line-height: 1.45; }
h1, h2, h3 { line-height: 1.2; }
table { border-collapse: collapse; margin: 0.5rem 0 1.5rem; font-size: 0.9rem; }
th, td { border: 1px solid #c8c8cc; padding: 0.25rem 0.6rem; text-align: left; vertical-align: top; }
td[data-value] { text-align: right; font-variant-numeric: tabular-nums; }
th { background: #f2f2f5; }
figure { margin: 1rem 0 2rem; }
figure img { max-width: 100%; height: auto; border: 1px solid #e0e0e4; }
figcaption { font-size: 0.9rem; color: #555; }
pre { background: #f6f6f8; padding: 0.6rem; overflow-x: auto; font-size: 0.8rem; white-space: pre-wrap; }
"""


def render_html(title: str, blocks: Sequence[Block]) -> str:
    escape = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        # Nothing may load from outside the page: what it shows is what the file contains.
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; img-src data:; "
        "style-src 'unsafe-inline'\">",
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<link rel="icon" href="data:,">',
        f"<title>{escape(title)}</title>",
        f"<style>{_STYLE}</style>",
        "</head>",
        "<body>",
        f"<h1>{escape(title)}</h1>",
    ]
    for block in blocks:
        if isinstance(block, Heading):
            parts.append(f"<h{block.level}>{escape(block.text)}</h{block.level}>")
        elif isinstance(block, Paragraph):
            parts.append(f"<p>{_inline_html(block.text)}</p>")
        elif isinstance(block, Preformatted):
            parts.append(f"<pre>{escape(block.text)}</pre>")
        elif isinstance(block, Figure):
            data = base64.b64encode(block.png).decode("ascii")
            parts.append(f'<figure><img src="data:image/png;base64,{data}" alt="{escape(block.caption)}" '
                         f'data-file="{PLOTS_DIRECTORY}/{escape(block.file_name)}">'
                         f"<figcaption>{escape(block.caption)}</figcaption></figure>")
        elif isinstance(block, Table):
            identifier = f' id="{escape(block.identifier)}"' if block.identifier else ""
            parts.append(f"<table{identifier}><thead><tr>"
                         + "".join(f'<th data-column="{escape(name)}">{escape(header)}</th>' for name, header in block.columns)
                         + "</tr></thead><tbody>")
            for index, row in enumerate(block.rows):
                key = f' data-cell-key="{escape(block.row_keys[index])}"' if index < len(block.row_keys) else ""
                cells = []
                for (name, _), value in zip(block.columns, row):
                    number = f' data-value="{value.number!r}"' if value.number is not None else ""
                    cells.append(f'<td data-column="{escape(name)}"{number}>{escape(value.text)}</td>')
                parts.append(f"<tr{key}>{''.join(cells)}</tr>")
            parts.append("</tbody></table>")
    parts += ["</body>", "</html>"]
    return "\n".join(parts) + "\n"


def _inline_html(text: str) -> str:
    """Markdown's `code` spans as <code>; everything else escaped."""
    pieces = text.split("`")
    return "".join(f"<code>{html.escape(piece)}</code>" if index % 2 else html.escape(piece)
                   for index, piece in enumerate(pieces))


# --- what varies in a sweep --------------------------------------------------------------------


_CONFIG_OPTIONS = tuple(name for name in RunConfig.model_fields if name not in ("workload_options", "accelerator_options"))


def option_names(cells: Sequence[CellSummary]) -> list[str]:
    """Every option of these cells: RunConfig fields, then ``workload_options.x`` / ``accelerator_options.x``."""
    names = list(_CONFIG_OPTIONS)
    for group in ("workload_options", "accelerator_options"):
        keys: list[str] = []
        for cell in cells:
            keys += [key for key in dict(getattr(cell.config, group)) if key not in keys]
        names += [f"{group}.{key}" for key in keys]
    return names


def varying_options(cells: Sequence[CellSummary]) -> list[str]:
    """The options whose value differs between cells: the sweep's axes, as the results show them."""
    return [name for name in option_names(cells) if len({repr(cell.option(name)) for cell in cells}) > 1]


def _short(name: str) -> str:
    return name.split(".", 1)[-1]


def series_label(cell: CellSummary, names: Sequence[str]) -> str:
    return " ".join(f"{_short(name)}={cell.option(name)}" for name in names) or f"{cell.config.workload} on {cell.config.accelerator}"


def group_series(cells: Sequence[CellSummary], names: Sequence[str]) -> dict[str, list[CellSummary]]:
    series: dict[str, list[CellSummary]] = {}
    for cell in cells:
        series.setdefault(series_label(cell, names), []).append(cell)
    return series


# --- plots ---------------------------------------------------------------------------------------


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ReportError("reports need matplotlib: pip install 'core[report]'") from None
    matplotlib.use("Agg")  # files only; never a window, also without a display
    import matplotlib.pyplot as pyplot

    return pyplot


def _png(figure: Any) -> bytes:
    buffer = io.BytesIO()
    # metadata without the software version and date: the same data gives the same bytes.
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight", metadata={"Software": None})
    _pyplot().close(figure)
    return buffer.getvalue()


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
    distinct = sorted(set(values))
    if 0 < len(distinct) <= 12:
        axis.set_xticks(distinct)
        axis.xaxis.set_minor_formatter(NullFormatter())
    axis.xaxis.set_major_formatter(FuncFormatter(lambda value, _position: count_label(value)))


def _failed_markers(axis: Any, cells: Sequence[CellSummary], color: Any) -> bool:
    """Cells without a figure (oom, error, timeout) as crosses along the bottom: data, not gaps."""
    failed = [cell.option(_BATCH) for cell in cells if cell.repeats_ok == 0]
    if failed:
        axis.plot(failed, [0.04] * len(failed), linestyle="none", marker="x", markersize=9, color=color,
                  transform=axis.get_xaxis_transform(), clip_on=False)
    return bool(failed)


def plot_against_batch(cells: Sequence[CellSummary], series_names: Sequence[str], figure_of: Callable[[CellSummary], float | None],
                       spread_of: Callable[[CellSummary], tuple[float, float] | None] | None,
                       ylabel: str, title: str, log_y: bool = True) -> bytes:
    pyplot = _pyplot()
    figure, axis = pyplot.subplots(figsize=(7.0, 4.4))
    any_failed = False
    xs: list[float] = []
    for index, (label, members) in enumerate(group_series(cells, series_names).items()):
        color = f"C{index % 10}"
        points = sorted((cell.option(_BATCH), figure_of(cell), cell) for cell in members if figure_of(cell) is not None)
        xs += [cell.option(_BATCH) for cell in members]
        if points:
            x = [point[0] for point in points]
            y = [point[1] for point in points]
            if spread_of is not None:
                bounds = [spread_of(point[2]) or (point[1], point[1]) for point in points]
                error = [[max(0.0, yi - low) for yi, (low, _) in zip(y, bounds)],
                         [max(0.0, high - yi) for yi, (_, high) in zip(y, bounds)]]
                axis.errorbar(x, y, yerr=error, marker="o", color=color, label=label, capsize=3)
            else:
                axis.plot(x, y, marker="o", color=color, label=label)
        any_failed |= _failed_markers(axis, members, color)
    _batch_axis(axis, xs)
    if log_y:
        axis.set_yscale("log")
    else:
        axis.set_ylim(bottom=0)
    axis.set_xlabel("micro-batch size (samples per device per micro-step)")
    axis.set_ylabel(ylabel)
    axis.set_title(title)
    axis.grid(True, which="both", alpha=0.3)
    if any_failed:
        axis.plot([], [], linestyle="none", marker="x", color="black", label="no figure (oom, error, timeout)")
    axis.legend(fontsize="small")
    return _png(figure)


def scaling_points(cells: Sequence[CellSummary], varying: Sequence[str]) -> dict[str, list[tuple[int, float, float]]]:
    """Series -> [(devices, throughput, efficiency)], where the device count varies within a series.

    efficiency(n) = (throughput(n) / n) / (throughput(n0) / n0), n0 the series' smallest device
    count with a figure: 1.0 is perfect scaling. With a fixed micro-batch per device the global
    batch grows with n (weak scaling), as in the papers' data-parallel tables.
    """
    names = [name for name in varying if name not in _DEVICE_OPTIONS]
    result: dict[str, list[tuple[int, float, float]]] = {}
    for label, members in group_series(cells, names).items():
        points = sorted((cell.devices, cell.throughput_per_second) for cell in members
                        if cell.throughput_per_second is not None)
        if len({devices for devices, _ in points}) < 2:
            continue
        base_devices, base_throughput = points[0]
        result[label] = [(devices, throughput, (throughput / devices) / (base_throughput / base_devices))
                         for devices, throughput in points]
    return result


def plot_scaling(points: dict[str, list[tuple[int, float, float]]]) -> bytes:
    pyplot = _pyplot()
    figure, axis = pyplot.subplots(figsize=(7.0, 4.4))
    devices: list[int] = []
    for index, (label, series) in enumerate(points.items()):
        axis.plot([p[0] for p in series], [p[2] * 100 for p in series], marker="o", color=f"C{index % 10}", label=label)
        devices += [p[0] for p in series]
    axis.axhline(100, color="grey", linestyle="--", linewidth=1, label="perfect scaling")
    _batch_axis(axis, devices)
    return _finish_from_zero(figure, axis, "devices (replicas x devices per replica)", "scaling efficiency (%)",
                             "Scaling efficiency against device count", "small")


def _finish_from_zero(figure: Any, axis: Any, xlabel: str, ylabel: str, title: str, legend_size: str) -> bytes:
    """Labels, a y axis from zero, a light grid and the legend; the PNG."""
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)
    axis.set_title(title)
    axis.set_ylim(bottom=0)
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=legend_size)
    return _png(figure)


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both figures (both to be maximised)."""
    front = []
    for i, (x, y) in enumerate(points):
        if not any((ox >= x and oy >= y) and (ox > x or oy > y) for j, (ox, oy) in enumerate(points) if j != i):
            front.append(i)
    return sorted(front, key=lambda i: points[i][0])


def plot_pareto(cells: Sequence[CellSummary], series_names: Sequence[str]) -> bytes:
    pyplot = _pyplot()
    figure, axis = pyplot.subplots(figsize=(7.0, 4.4))
    usable = [cell for cell in cells if cell.samples_per_watt_hour is not None and cell.throughput_per_second is not None]
    for index, (label, members) in enumerate(group_series(usable, series_names).items()):
        axis.scatter([cell.samples_per_watt_hour for cell in members], [cell.throughput_per_second for cell in members],
                     color=f"C{index % 10}", label=label, zorder=3)
    points = [(cell.samples_per_watt_hour, cell.throughput_per_second) for cell in usable]
    front = pareto_front(points)  # type: ignore[arg-type]
    if front:
        axis.plot([points[i][0] for i in front], [points[i][1] for i in front], color="black", linewidth=1,
                  linestyle="--", label="Pareto front", zorder=2)
        for i in front:
            axis.annotate(usable[i].label, points[i], textcoords="offset points", xytext=(4, 4), fontsize="x-small")
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("samples per Wh (median)")
    axis.set_ylabel("throughput (samples/s, median)")
    axis.set_title("Throughput against energy efficiency")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize="small")
    return _png(figure)


_MAX_POWER_TRACES = 12  # lines in one plot before it stops being readable


@dataclass(frozen=True)
class PowerTrace:
    """One run's total power over its window: the sum of its components, per timeline span."""

    label: str
    start_seconds: list[float]
    stop_seconds: list[float]
    watts: list[float | None]  # None: some component had no reading in that span


def power_traces(cells: Sequence[CellSummary]) -> list[PowerTrace]:
    """The first successful repeat with a power timeline of each cell, in the cells' order."""
    traces: list[PowerTrace] = []
    for cell in cells:
        timeline = next((result.energy.power_timeline for result in cell.ok_results
                         if result.energy is not None and result.energy.power_timeline is not None), None)
        if timeline is None or not timeline.start_seconds:
            continue
        columns = list(timeline.watts.values())
        totals = [None if any(column[k] is None for column in columns) else sum(column[k] for column in columns)  # type: ignore[misc]
                  for k in range(len(timeline.start_seconds))]
        traces.append(PowerTrace(cell.label, list(timeline.start_seconds), list(timeline.stop_seconds), totals))
    return traces


def plot_power_traces(traces: Sequence[PowerTrace]) -> bytes:
    pyplot = _pyplot()
    figure, axis = pyplot.subplots(figsize=(7.0, 4.4))
    for index, trace in enumerate(traces):
        # Each span's mean drawn flat across the span: the data is a mean per span, not a point.
        xs = [x for start, stop in zip(trace.start_seconds, trace.stop_seconds) for x in (start, stop)]
        ys = [math.nan if w is None else w for w in trace.watts for _ in (0, 1)]
        axis.plot(xs, ys, color=f"C{index % 10}", linestyle="-" if index < 10 else "--", label=trace.label)
    return _finish_from_zero(figure, axis, "seconds from the start of the timed window",
                             "power (W, all devices measured)", "Power over the timed window", "x-small")


# --- one sweep's section ------------------------------------------------------------------------


def _first_line(text: str | None, limit: int = 160) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def cells_table(cells: Sequence[CellSummary], varying: Sequence[str], identifier: str) -> Table:
    columns = [(name, _short(name)) for name in varying] + [
        ("status", "status"), ("repeats_ok", "repeats ok"),
        ("throughput_per_second", "throughput (samples/s, median)"), ("spread", "spread (max-min)/median"),
        ("samples_per_watt_hour", "samples/Wh (median)"), ("flops_per_second", "TFLOP/s (median)"),
        ("model_flops_utilization", "MFU (median)"), ("note", "note"),
    ]
    rows = []
    for cell in cells:
        note = ""
        if cell.failure is not None:
            note = f"{cell.failure.status.phase or ''}: {_first_line(cell.failure.status.message)}".strip(": ")
        elif cell.flagged:
            note = f"spread above {SPREAD_FLAG_FRACTION:.0%}"
        flops = cell.flops_per_second
        row = [Value(str(cell.option(name))) for name in varying] + [
            Value(cell.status + (" (flagged)" if cell.flagged else "")),
            Value(f"{cell.repeats_ok}/{cell.repeats_recorded}", cell.repeats_ok),
            Value(format_number(cell.throughput_per_second), cell.throughput_per_second),
            Value(format_percent(cell.spread), cell.spread),
            Value(format_number(cell.samples_per_watt_hour), cell.samples_per_watt_hour),
            Value(format_number(None if flops is None else flops / 1e12), None if flops is None else flops / 1e12),
            Value(format_percent(cell.model_flops_utilization), cell.model_flops_utilization),
            Value(note),
        ]
        rows.append(row)
    return Table(columns=columns, rows=rows, identifier=identifier, row_keys=[cell.cell_key for cell in cells])


def batch_table(cells: Sequence[CellSummary], series_names: Sequence[str], identifier: str) -> Table:
    """Median throughput by series (rows) and batch size (columns); failed cells show their state."""
    batches = sorted({cell.option(_BATCH) for cell in cells})
    series = group_series(cells, series_names)
    columns = [("series", "series")] + [(f"{_BATCH}={batch}", str(batch)) for batch in batches]
    rows = []
    for label, members in series.items():
        by_batch = {cell.option(_BATCH): cell for cell in members}
        row = [Value(label)]
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


def _energy_reason(cells: Sequence[CellSummary]) -> str:
    reasons = sorted({result.energy_unavailable_reason for cell in cells for result in cell.ok_results
                      if result.energy_unavailable_reason})
    return reasons[0] if reasons else "no successful run has an energy figure"


def _peak_reason(cells: Sequence[CellSummary]) -> str:
    accelerators = sorted({cell.config.accelerator for cell in cells})
    return (f"No datasheet peak is known for the devices of {', '.join(accelerators)}, so there is no MFU; "
            "the plot shows the achieved FLOP rate instead")


def sweep_section(name: str, runs_cells: list[CellSummary], record: SweepRecord | None,
                  store_path: Path) -> list[Block]:
    blocks: list[Block] = [Heading(2, f"Sweep {name}")]
    slug = name
    spec = record.spec if record is not None else {}
    if spec.get("description"):
        blocks.append(Paragraph(str(spec["description"])))
    cells = runs_cells
    states: dict[str, int] = {}
    for cell in cells:
        states[cell.status] = states.get(cell.status, 0) + 1
    refused = [cell for cell in (record.cells if record is not None else []) if cell.get("invalid_reason")]
    runs = sum(cell.repeats_recorded for cell in cells)
    flagged = sum(1 for cell in cells if cell.flagged)
    facts = [f"{len(cells)} cells with results ({', '.join(f'{count} {state}' for state, count in sorted(states.items()))}), "
             f"{runs} runs"]
    if spec.get("repeats"):
        facts.append(f"{spec['repeats']} repeats per cell asked")
    if record is not None and record.source:
        facts.append(f"grid file `{record.source}`")
    if refused:
        facts.append(f"{len(refused)} cells refused by validation")
    if record is not None:
        expected = len(record.cells) - len(refused)
        if expected > len(cells):
            facts.append(f"{expected - len(cells)} cells not run yet (resume the sweep to run them)")
    blocks.append(Paragraph("; ".join(facts) + "."))
    blocks.append(Paragraph(
        f"Figures are medians over a cell's successful repeats; spread is (max - min) / median of throughput, "
        f"and a cell is flagged when it exceeds {SPREAD_FLAG_FRACTION:.0%} ({flagged} flagged). "
        f"A cell stops at its first failed repeat. Database: `{store_path}`."))
    if not cells:
        blocks.append(Paragraph("No results recorded for this sweep yet."))
        return blocks

    varying = varying_options(cells)
    blocks += [Heading(3, "Cells"), cells_table(cells, varying, f"cells-{slug}")]
    series_names = [option for option in varying if option != _BATCH]
    batch_varies = _BATCH in varying
    if batch_varies:
        blocks += [Heading(3, "Throughput by batch size (samples/s, median)"),
                   batch_table(cells, series_names, f"batches-{slug}")]

    def figure(kind: str, png: bytes, caption: str) -> Figure:
        return Figure(f"{slug}-{kind}.png", png, caption)

    def not_drawn(title: str, reason: str) -> list[Block]:
        return [Heading(3, title), Paragraph(f"Not drawn: {reason}.")]

    title = "Throughput against batch size"
    ok_cells = [cell for cell in cells if cell.throughput_per_second is not None]
    if batch_varies and ok_cells:
        png = plot_against_batch(
            cells, series_names, lambda cell: cell.throughput_per_second,
            lambda cell: (cell.throughput_min, cell.throughput_max) if cell.throughput_min is not None else None,
            "throughput (samples/s)", "Throughput against micro-batch size (median, bars: min-max)")
        blocks += [Heading(3, title), figure("throughput-vs-batch-size", png,
                                             "Throughput against micro-batch size, log-log; bars span the repeats; "
                                             "crosses mark cells without a figure")]
    else:
        blocks += not_drawn(title, "the sweep does not vary the micro-batch size" if ok_cells or not batch_varies
                            else "no cell has a throughput figure")

    title = "Samples per Wh against batch size"
    energy_cells = [cell for cell in cells if cell.samples_per_watt_hour is not None]
    if batch_varies and energy_cells:
        png = plot_against_batch(cells, series_names, lambda cell: cell.samples_per_watt_hour, None,
                                 "samples per Wh", "Energy efficiency against micro-batch size (median)")
        blocks += [Heading(3, title), figure("samples-per-wh-vs-batch-size", png,
                                             "Samples per Wh against micro-batch size, log-log")]
    else:
        blocks += not_drawn(title, f"no energy figures ({_energy_reason(cells)})" if not energy_cells
                            else "the sweep does not vary the micro-batch size")

    title = "Scaling efficiency against device count"
    scaling = scaling_points(cells, varying)
    if scaling:
        blocks += [Heading(3, title), figure("scaling-efficiency", plot_scaling(scaling),
                                             "Scaling efficiency: throughput per device relative to the smallest "
                                             "device count of each series")]
        blocks.append(Table(columns=[("series", "series"), ("devices", "devices"),
                                     ("throughput_per_second", "throughput (samples/s)"),
                                     ("scaling_efficiency", "scaling efficiency")],
                            rows=[[Value(label), Value(str(devices), devices), Value(format_number(throughput), throughput),
                                   Value(format_percent(efficiency), efficiency)]
                                  for label, series in scaling.items() for devices, throughput, efficiency in series],
                            identifier=f"scaling-{slug}"))
    else:
        blocks += not_drawn(title, "no series of cells differs only in device count (replicas x devices per replica)")

    mfu_cells = [cell for cell in cells if cell.model_flops_utilization is not None]
    flops_cells = [cell for cell in cells if cell.flops_per_second is not None]
    if batch_varies and mfu_cells:
        png = plot_against_batch(cells, series_names,
                                 lambda cell: None if cell.model_flops_utilization is None else cell.model_flops_utilization * 100,
                                 None, "MFU (% of datasheet peak)", "Model FLOP utilisation against micro-batch size",
                                 log_y=False)
        blocks += [Heading(3, "MFU against batch size"),
                   figure("mfu-vs-batch-size", png, "MFU: achieved FLOP/s over the devices' datasheet peak")]
    elif batch_varies and flops_cells:
        png = plot_against_batch(cells, series_names,
                                 lambda cell: None if cell.flops_per_second is None else cell.flops_per_second / 1e12,
                                 None, "achieved TFLOP/s", "Achieved FLOP rate against micro-batch size")
        blocks += [Heading(3, "MFU against batch size"), Paragraph(_peak_reason(cells) + "."),
                   figure("flops-vs-batch-size", png, "Achieved TFLOP/s against micro-batch size, log-log")]
    else:
        blocks += not_drawn("MFU against batch size", "no cell has a FLOP figure (the workload declares no FLOP count)"
                            if not flops_cells else "the sweep does not vary the micro-batch size")

    title = "Throughput against samples per Wh (Pareto view)"
    if energy_cells:
        blocks += [Heading(3, title), figure("pareto", plot_pareto(cells, series_names),
                                             "Each cell's median throughput against its samples per Wh; the dashed "
                                             "line joins the cells no other cell beats on both")]
    else:
        blocks += not_drawn(title, f"no energy figures ({_energy_reason(cells)})")

    title = "Power over the timed window"
    traces = power_traces(cells)
    if traces:
        shown = traces[:_MAX_POWER_TRACES]
        caption = ("Total sampled power of each cell's first successful repeat, one flat segment per timeline "
                   "span (its mean power); gaps: a device had no reading")
        if len(traces) > len(shown):
            caption += f"; the first {len(shown)} of {len(traces)} cells with a timeline"
        blocks += [Heading(3, title), figure("power-timeline", plot_power_traces(shown), caption)]
    else:
        blocks += not_drawn(title, "no run recorded a power timeline (meters that sample power record one: "
                                   "NVML, amdsmi, gcipuinfo; RAPL reads counters only; --power-timeline-points 0 "
                                   "turns it off)")

    failures = [cell for cell in cells if cell.failure is not None]
    if failures:
        blocks.append(Heading(3, "Failures"))
        for cell in failures:
            status = cell.failure.status  # type: ignore[union-attr]
            blocks.append(Paragraph(f"`{cell.label}`: {status.state.value} in {status.phase or 'an unknown phase'} "
                                    f"({status.error_type or 'no type'})"))
            message = status.message or ""
            blocks.append(Preformatted(message if len(message) <= _MESSAGE_CHARS
                                       else message[:_MESSAGE_CHARS] + "\n... (the database has the whole message)"))
    if refused:
        blocks.append(Heading(3, "Cells refused by validation"))
        blocks.append(Table(columns=[("cell", "cell"), ("reason", "reason")],
                            rows=[[Value(cell["label"]), Value(cell["invalid_reason"])] for cell in refused]))

    blocks += [Heading(3, "Environment"), environment_table(cells)]
    return blocks


def environment_table(cells: Sequence[CellSummary]) -> Table:
    facts: dict[str, set[str]] = {}

    def note(name: str, value: Any) -> None:
        if value:
            facts.setdefault(name, set()).add(str(value))

    for cell in cells:
        for result in cell.results:
            environment = result.environment
            if environment is None:
                continue
            note("host", environment.hostname)
            note("processor", environment.processor)
            note("platform", environment.platform)
            note("python", environment.python_version)
            note("core", environment.core_version)
            note(f"{result.framework}", environment.framework_version)
            for device in result.devices:
                note("devices", device.name)
    return Table(columns=[("fact", "fact"), ("values", "values")],
                 rows=[[Value(name), Value(", ".join(sorted(values)))] for name, values in facts.items()])


# --- the report ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReportFiles:
    markdown: Path
    html: Path
    plots: list[Path]


def build_report(store: ResultStore, sweeps: Sequence[str] | None = None) -> tuple[str, list[Block]]:
    names = list(sweeps) if sweeps else store.sweep_names()
    known = set(store.sweep_names())
    missing = [name for name in names if name not in known]
    if missing:
        raise ReportError(f"no sweep named {', '.join(repr(n) for n in missing)} in {store.path}; "
                          f"it has: {', '.join(sorted(known)) or 'none'}")
    if not names:
        raise ReportError(f"{store.path} has no sweeps to report; run `core sweep FILE` first")
    _pyplot()  # fail before any work when matplotlib is missing, plots or not
    generated = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    blocks: list[Block] = [Paragraph(f"Generated {generated} from `{store.path}`: sweeps {', '.join(names)}.")]
    for name in names:
        cells = summarise(store.runs(sweep=name))
        blocks += sweep_section(name, cells, store.sweep(name), store.path)
    return "core benchmark report", blocks


def write_report(database: str | Path | ResultStore, output: str | Path,
                 sweeps: Sequence[str] | None = None) -> ReportFiles:
    """Write report.md, report.html and plots/*.png under ``output``; returns their paths."""
    store = database if isinstance(database, ResultStore) else ResultStore(database, create=False)
    try:
        title, blocks = build_report(store, sweeps)
    finally:
        if not isinstance(database, ResultStore):
            store.close()
    output = Path(output)
    plots_directory = output / PLOTS_DIRECTORY
    plots_directory.mkdir(parents=True, exist_ok=True)
    plots = []
    for block in blocks:
        if isinstance(block, Figure):
            path = plots_directory / block.file_name
            path.write_bytes(block.png)
            plots.append(path)
    markdown, page = output / REPORT_MARKDOWN, output / REPORT_HTML
    _write_atomically(markdown, render_markdown(title, blocks))
    _write_atomically(page, render_html(title, blocks))
    return ReportFiles(markdown=markdown, html=page, plots=plots)


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text, encoding="utf-8")
    temporary.replace(path)
