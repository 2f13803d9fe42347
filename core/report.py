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

Everything a report shows comes from the database, so all of it is treated as untrusted text:
both renderings escape it (Markdown too: no raw HTML, no table or code-span breakage), file
names are slugs of the sweep names and must stay inside the output directory, and the files
are written whole or not at all (see :func:`write_report`).
"""

from __future__ import annotations

import base64
import hashlib
import html
import io
import math
import os
import re
import shutil
import sqlite3
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

from core.config import RunConfig
from core.errors import CoreError
from core.files import OutputError, check_writable, describe_os_error, write_atomically
from core.store import ResultStore, StoreError, SweepRecord
from core.summary import SPREAD_FLAG_FRACTION, CellSummary, summarise

REPORT_MARKDOWN = "report.md"
REPORT_HTML = "report.html"
PLOTS_DIRECTORY = "plots"
_BATCH = "micro_batch_size"
_DEVICE_OPTIONS = ("replicas", "devices_per_replica")
_MESSAGE_CHARS = 1200  # of a failure's message shown in the report (the database has all of it)
_TEXT_CHARS = 300  # of a label or an option value shown in a table or a paragraph
_PLOT_TEXT_CHARS = 60  # of a label in a plot's legend or annotation
_MAX_LEGEND_ENTRIES = 16  # lines named in a plot's legend before "... and N more"


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
class Code:
    """Literal text shown as code (a path, a label): a code span in Markdown, <code> in HTML."""

    text: str


Inline = str | Code


@dataclass(frozen=True)
class Paragraph:
    """Plain text and code spans; plain text is shown as it is, never read as markup."""

    parts: tuple[Inline, ...]

    def __init__(self, *parts: Inline) -> None:
        object.__setattr__(self, "parts", tuple(parts))


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
    return "n/a" if fraction is None or not math.isfinite(fraction) else f"{fraction * 100:.1f} %"


def shorten(text: str, limit: int = _TEXT_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


# Characters that no file may carry: C0 and C1 controls but tab and line ends, and lone surrogates
# (which cannot even be encoded as UTF-8). Newlines are folded where text must stay on one line.
_CONTROLS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x84\x86-\x9f\ud800-\udfff]")
_LINE_BREAKS = re.compile(r"[\t\n\r\x0b\x0c\x85\u2028\u2029]+")


def clean_text(text: Any) -> str:
    """Printable text: controls and lone surrogates become U+FFFD; tabs and line ends stay."""
    return _CONTROLS.sub("\ufffd", str(text))


def one_line(text: Any) -> str:
    """Printable text on one line: line breaks and tabs become spaces."""
    return clean_text(_LINE_BREAKS.sub(" ", str(text)))


# Markdown that inline text could start: code spans, emphasis, links, strikethrough, table cell
# breaks, math ($), headings' closing #; "_" only where it can open or close emphasis.
_MARKDOWN_SPECIALS = re.compile(r"[\\`*\[\]|~$#]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
_BLOCK_START = re.compile(r"([-+=]|\d+[.)])")


def markdown_text(text: Any, *, line_start: bool = False) -> str:
    """Untrusted text as literal Markdown on one line: HTML escaped, markup characters backslashed.

    ``line_start``: the text starts a line, where ``-``, ``+``, ``=`` or ``1.`` would begin a list
    or a heading underline; they are escaped there too.
    """
    text = html.escape(one_line(text), quote=False)
    text = _MARKDOWN_SPECIALS.sub(lambda match: "\\" + match.group(0), text)
    if line_start:
        text = text.lstrip()  # four spaces would start a code block
        start = _BLOCK_START.match(text)
        if start:
            text = start.group(0)[:-1] + "\\" + text[start.end() - 1:]
    return text


def markdown_code(text: Any) -> str:
    """A code span holding ``text`` literally, whatever backticks it contains."""
    text = one_line(text)
    if not text:
        return ""
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    padding = " " if text[0] in "` " or text[-1] in "` " else ""
    return f"{fence}{padding}{text}{padding}{fence}"


def markdown_block(text: Any) -> list[str]:
    """A fenced code block of ``text``: its fence is longer than any run of backticks inside."""
    text = clean_text(text).replace("\r\n", "\n").replace("\r", "\n")
    fence = "`" * max(3, max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    return [f"{fence}text", text, fence]


def _markdown_inline(parts: Sequence[Inline]) -> str:
    pieces = []
    for index, part in enumerate(parts):
        if isinstance(part, Code):
            pieces.append(markdown_code(part.text))
        else:
            pieces.append(markdown_text(part, line_start=index == 0))
    return "".join(pieces)


def _markdown_table(table: Table) -> list[str]:
    lines = ["| " + " | ".join(markdown_text(header) for _, header in table.columns) + " |",
             "|" + "|".join(" --- " for _ in table.columns) + "|"]
    for row in table.rows:
        lines.append("| " + " | ".join(markdown_text(value.text) for value in row) + " |")
    return lines + [""]


def render_markdown(title: str, blocks: Sequence[Block]) -> str:
    lines = [f"# {markdown_text(title)}", ""]
    for block in blocks:
        if isinstance(block, Heading):
            lines += [f"{'#' * block.level} {markdown_text(block.text)}", ""]
        elif isinstance(block, Paragraph):
            lines += [_markdown_inline(block.parts), ""]
        elif isinstance(block, Preformatted):
            lines += markdown_block(block.text) + [""]
        elif isinstance(block, Figure):
            caption = markdown_text(block.caption)
            lines += [f"![{caption}]({PLOTS_DIRECTORY}/{_checked_file_name(block.file_name)})", "", f"*{caption}*", ""]
        elif isinstance(block, Table):
            lines += _markdown_table(block)
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
td, p, code { overflow-wrap: anywhere; }
"""


def _escape(text: Any) -> str:
    return html.escape(clean_text(text))


def _html_table(table: Table) -> list[str]:
    identifier = f' id="{_escape(table.identifier)}"' if table.identifier else ""
    parts = [f"<table{identifier}><thead><tr>"
             + "".join(f'<th data-column="{_escape(name)}">{_escape(header)}</th>' for name, header in table.columns)
             + "</tr></thead><tbody>"]
    for index, row in enumerate(table.rows):
        key = f' data-cell-key="{_escape(table.row_keys[index])}"' if index < len(table.row_keys) else ""
        cells = []
        for (name, _), value in zip(table.columns, row):
            number = f' data-value="{value.number!r}"' if value.number is not None else ""
            cells.append(f'<td data-column="{_escape(name)}"{number}>{_escape(value.text)}</td>')
        parts.append(f"<tr{key}>{''.join(cells)}</tr>")
    parts.append("</tbody></table>")
    return parts


def render_html(title: str, blocks: Sequence[Block]) -> str:
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
        f"<title>{_escape(title)}</title>",
        f"<style>{_STYLE}</style>",
        "</head>",
        "<body>",
        f"<h1>{_escape(title)}</h1>",
    ]
    for block in blocks:
        if isinstance(block, Heading):
            parts.append(f"<h{block.level}>{_escape(block.text)}</h{block.level}>")
        elif isinstance(block, Paragraph):
            parts.append("<p>" + "".join(f"<code>{_escape(part.text)}</code>" if isinstance(part, Code) else _escape(part)
                                         for part in block.parts) + "</p>")
        elif isinstance(block, Preformatted):
            parts.append(f"<pre>{_escape(block.text)}</pre>")
        elif isinstance(block, Figure):
            data = base64.b64encode(block.png).decode("ascii")
            parts.append(f'<figure><img src="data:image/png;base64,{data}" alt="{_escape(block.caption)}" '
                         f'data-file="{PLOTS_DIRECTORY}/{_escape(_checked_file_name(block.file_name))}">'
                         f"<figcaption>{_escape(block.caption)}</figcaption></figure>")
        elif isinstance(block, Table):
            parts += _html_table(block)
    parts += ["</body>", "</html>"]
    return "\n".join(parts) + "\n"


# --- file names from data -------------------------------------------------------------------------


# A sweep name used as it is in file names and HTML ids: letters, digits, "-" and "_", starting
# with a letter or digit. Anything else ("../x", "/some/where", "a b", "Ä") becomes a slug plus a
# hash of the name, so two names never share files and no name reaches outside plots/.
_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,120}\.png")


def _hashed_slug(name: str) -> str:
    readable = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:40].strip("-") or "sweep"
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return f"{readable}-{digest}"


def sweep_slugs(names: Sequence[str]) -> dict[str, str]:
    """Each sweep name's slug for file names and HTML ids: the name itself where it is plain and
    no other slug equals it (ignoring case, for case-insensitive file systems), else slug + hash."""
    slugs = {name: name if _PLAIN_NAME.fullmatch(name) else _hashed_slug(name) for name in names}
    lowered = [slug.lower() for slug in slugs.values()]
    for name, slug in slugs.items():
        if slug == name and lowered.count(slug.lower()) > 1:
            slugs[name] = _hashed_slug(name)
    return slugs


def list_names(names: Sequence[str]) -> str:
    """``a, b, '../x'``: plain names as they are, others quoted (control characters escaped)."""
    return ", ".join(name if _PLAIN_NAME.fullmatch(name) else repr(name) for name in names) or "none"


def _checked_file_name(name: str) -> str:
    """A plot's file name, refused unless it is one plain component (never a path)."""
    if not _FILE_NAME.fullmatch(name):
        raise ReportError(f"refusing plot file name {name!r}: not a plain file name")
    return name


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


def _batch_of(cell: CellSummary) -> int | None:
    """The cell's micro-batch size where it can be placed on a log axis, else None."""
    batch = cell.option(_BATCH)
    return batch if isinstance(batch, int) and not isinstance(batch, bool) and batch > 0 else None


# Figures a plot can place: beyond these a log axis overflows (its margins reach infinity), and
# no measured rate is anywhere near them: such a figure is damage, not data, and is not drawn.
_PLOT_RANGE = (1e-100, 1e100)


def _plottable(value: float | None, log: bool = True) -> bool:
    """Finite, within _PLOT_RANGE, and positive on a log axis."""
    if value is None or not math.isfinite(value):
        return False
    return _PLOT_RANGE[0] <= value <= _PLOT_RANGE[1] if log else abs(value) <= _PLOT_RANGE[1]


def _positive(value: float | None) -> bool:
    return _plottable(value)


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
    try:
        # metadata without the software version and date: the same data gives the same bytes.
        figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight", metadata={"Software": None})
    finally:
        _pyplot().close(figure)
    return buffer.getvalue()


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


def _failed_markers(axis: Any, cells: Sequence[CellSummary], color: Any) -> bool:
    """Cells without a figure (oom, error, timeout) as crosses along the bottom: data, not gaps."""
    failed = [batch for cell in cells if cell.repeats_ok == 0 and (batch := _batch_of(cell)) is not None]
    if failed:
        axis.plot(failed, [0.04] * len(failed), linestyle="none", marker="x", markersize=9, color=color,
                  transform=axis.get_xaxis_transform(), clip_on=False)
    return bool(failed)


def _batch_points(members: Sequence[CellSummary], figure_of: Callable[[CellSummary], float | None],
                  log_y: bool) -> list[tuple[int, float, CellSummary]]:
    """(batch, figure, cell) of the cells that can be drawn, by batch size."""
    points = []
    for cell in members:
        batch, value = _batch_of(cell), figure_of(cell)
        if batch is not None and _plottable(value, log_y):
            points.append((batch, value, cell))
    return sorted(points, key=lambda point: (point[0], point[1]))


def _drawable_bounds(bounds: tuple[float, float] | None, value: float) -> tuple[float, float]:
    """An error bar's (low, high), each kept only where it can be drawn."""
    low, high = bounds or (value, value)
    return (low if _plottable(low) else value, high if _plottable(high) else value)


def drawable_against_batch(cells: Sequence[CellSummary], figure_of: Callable[[CellSummary], float | None],
                           log_y: bool = True) -> bool:
    return bool(_batch_points(cells, figure_of, log_y))


def plot_against_batch(cells: Sequence[CellSummary], series_names: Sequence[str], figure_of: Callable[[CellSummary], float | None],
                       spread_of: Callable[[CellSummary], tuple[float, float] | None] | None,
                       ylabel: str, title: str, log_y: bool = True) -> bytes:
    pyplot = _pyplot()
    figure, axis = pyplot.subplots(figsize=(7.0, 4.4))
    any_failed = False
    xs: list[float] = []
    for index, (label, members) in enumerate(group_series(cells, series_names).items()):
        color = f"C{index % 10}"
        points = _batch_points(members, figure_of, log_y)
        xs += [batch for cell in members if (batch := _batch_of(cell)) is not None]
        if points:
            x = [point[0] for point in points]
            y = [point[1] for point in points]
            if spread_of is not None:
                bounds = [_drawable_bounds(spread_of(point[2]), point[1]) for point in points]
                error = [[max(0.0, yi - low) for yi, (low, _) in zip(y, bounds)],
                         [max(0.0, high - yi) for yi, (_, high) in zip(y, bounds)]]
                axis.errorbar(x, y, yerr=error, marker="o", color=color, label=plot_text(label), capsize=3)
            else:
                axis.plot(x, y, marker="o", color=color, label=plot_text(label))
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
    _legend(axis, "small")
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
                        if _positive(cell.throughput_per_second) and cell.devices > 0)
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
        axis.plot([p[0] for p in series], [p[2] * 100 for p in series], marker="o", color=f"C{index % 10}",
                  label=plot_text(label))
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
    _legend(axis, legend_size)
    return _png(figure)


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both figures (both to be maximised)."""
    front = []
    for i, (x, y) in enumerate(points):
        if not any((ox >= x and oy >= y) and (ox > x or oy > y) for j, (ox, oy) in enumerate(points) if j != i):
            front.append(i)
    return sorted(front, key=lambda i: points[i][0])


def _pareto_cells(cells: Sequence[CellSummary]) -> list[CellSummary]:
    return [cell for cell in cells if _positive(cell.samples_per_watt_hour) and _positive(cell.throughput_per_second)]


def plot_pareto(cells: Sequence[CellSummary], series_names: Sequence[str]) -> bytes:
    pyplot = _pyplot()
    figure, axis = pyplot.subplots(figsize=(7.0, 4.4))
    usable = _pareto_cells(cells)
    for index, (label, members) in enumerate(group_series(usable, series_names).items()):
        axis.scatter([cell.samples_per_watt_hour for cell in members], [cell.throughput_per_second for cell in members],
                     color=f"C{index % 10}", label=plot_text(label), zorder=3)
    points = [(cell.samples_per_watt_hour, cell.throughput_per_second) for cell in usable]
    front = pareto_front(points)  # type: ignore[arg-type]
    if front:
        axis.plot([points[i][0] for i in front], [points[i][1] for i in front], color="black", linewidth=1,
                  linestyle="--", label="Pareto front", zorder=2)
        for i in front:
            axis.annotate(plot_text(usable[i].label), points[i], textcoords="offset points", xytext=(4, 4),
                          fontsize="x-small")
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("samples per Wh (median)")
    axis.set_ylabel("throughput (samples/s, median)")
    axis.set_title("Throughput against energy efficiency")
    axis.grid(True, which="both", alpha=0.3)
    _legend(axis, "small")
    return _png(figure)


_MAX_POWER_TRACES = 12  # lines in one plot before it stops being readable


@dataclass(frozen=True)
class PowerTrace:
    """One run's total power over its window: the sum of its components, per timeline span."""

    label: str
    start_seconds: list[float]
    stop_seconds: list[float]
    watts: list[float | None]  # None: some component had no reading in that span


def _span_total(columns: Sequence[Sequence[float | None]], index: int) -> float | None:
    values = [column[index] if index < len(column) else None for column in columns]
    if not values or any(value is None or not math.isfinite(value) for value in values):
        return None
    return sum(values)  # type: ignore[arg-type]


def power_traces(cells: Sequence[CellSummary]) -> list[PowerTrace]:
    """The first successful repeat with a power timeline of each cell, in the cells' order."""
    traces: list[PowerTrace] = []
    for cell in cells:
        timeline = next((result.energy.power_timeline for result in cell.ok_results
                         if result.energy is not None and result.energy.power_timeline is not None), None)
        if timeline is None:
            continue
        spans = [(start, stop) for start, stop in zip(timeline.start_seconds, timeline.stop_seconds)
                 if math.isfinite(start) and math.isfinite(stop)]
        if not spans or len(spans) != min(len(timeline.start_seconds), len(timeline.stop_seconds)):
            continue  # no span, or spans that cannot be placed: nothing to draw
        columns = list(timeline.watts.values())
        totals = [_span_total(columns, k) for k in range(len(spans))]
        traces.append(PowerTrace(cell.label, [start for start, _ in spans], [stop for _, stop in spans], totals))
    return traces


def plot_power_traces(traces: Sequence[PowerTrace]) -> bytes:
    pyplot = _pyplot()
    figure, axis = pyplot.subplots(figsize=(7.0, 4.4))
    for index, trace in enumerate(traces):
        # Each span's mean drawn flat across the span: the data is a mean per span, not a point.
        xs = [x for start, stop in zip(trace.start_seconds, trace.stop_seconds) for x in (start, stop)]
        ys = [math.nan if w is None else w for w in trace.watts for _ in (0, 1)]
        axis.plot(xs, ys, color=f"C{index % 10}", linestyle="-" if index < 10 else "--", label=plot_text(trace.label))
    return _finish_from_zero(figure, axis, "seconds from the start of the timed window",
                             "power (W, all devices measured)", "Power over the timed window", "x-small")


# --- one sweep's section ------------------------------------------------------------------------


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


_CELL_COLUMNS = [
    ("status", "status"), ("repeats_ok", "repeats ok"),
    ("throughput_per_second", "throughput (samples/s, median)"), ("spread", "spread (max-min)/median"),
    ("samples_per_watt_hour", "samples/Wh (median)"), ("flops_per_second", "TFLOP/s (median)"),
    ("model_flops_utilization", "MFU (median)"), ("note", "note"),
]


def _option_headers(varying: Sequence[str]) -> list[tuple[str, str]]:
    """Options' short names as headers, or their full names where a short one is taken twice."""
    shorts = [_short(name) for name in varying] + [header for _, header in _CELL_COLUMNS]
    return [(name, _short(name) if shorts.count(_short(name)) == 1 else name) for name in varying]


def cells_table(cells: Sequence[CellSummary], varying: Sequence[str], identifier: str) -> Table:
    columns = _option_headers(varying) + _CELL_COLUMNS
    rows = []
    for cell in cells:
        flops = cell.flops_per_second
        row = [Value(_option_text(cell.option(name))) for name in varying] + [
            Value(cell.status + (" (flagged)" if cell.flagged else "")),
            Value(f"{cell.repeats_ok}/{cell.repeats_recorded}", cell.repeats_ok),
            Value(format_number(cell.throughput_per_second), cell.throughput_per_second),
            Value(format_percent(cell.spread), cell.spread),
            Value(format_number(cell.samples_per_watt_hour), cell.samples_per_watt_hour),
            Value(format_number(None if flops is None else flops / 1e12), None if flops is None else flops / 1e12),
            Value(format_percent(cell.model_flops_utilization), cell.model_flops_utilization),
            Value(_cell_note(cell)),
        ]
        rows.append(row)
    return Table(columns=columns, rows=rows, identifier=identifier, row_keys=[cell.cell_key for cell in cells])


def _batch_sort_key(batch: Any) -> tuple[int, Any]:
    """Batch sizes in order; anything not a number (a missing one) after them."""
    if isinstance(batch, (int, float)) and not isinstance(batch, bool):
        return (0, batch)
    return (1, repr(batch))


def batch_table(cells: Sequence[CellSummary], series_names: Sequence[str], identifier: str) -> Table:
    """Median throughput by series (rows) and batch size (columns); failed cells show their state."""
    batches = sorted({cell.option(_BATCH) for cell in cells}, key=_batch_sort_key)
    series = group_series(cells, series_names)
    columns = [("series", "series")] + [(f"{_BATCH}={batch}", "unknown" if batch is None else str(batch)) for batch in batches]
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


def _energy_reason(cells: Sequence[CellSummary]) -> str:
    reasons = sorted({one_line(result.energy_unavailable_reason) for cell in cells for result in cell.ok_results
                      if result.energy_unavailable_reason})
    return shorten(reasons[0]) if reasons else "no successful run has an energy figure"


def _peak_reason(cells: Sequence[CellSummary]) -> str:
    accelerators = sorted({_option_text(cell.config.accelerator) for cell in cells})
    return (f"No datasheet peak is known for the devices of {', '.join(accelerators)}, so there is no MFU; "
            "the plot shows the achieved FLOP rate instead")


@dataclass
class SweepData:
    """What one sweep's section is made of: its cells with results and what it asked for."""

    name: str
    slug: str
    cells: list[CellSummary]
    spec: dict[str, Any]  # the sweep's settings; {} where the database has none (or none readable)
    planned: list[dict[str, Any]]  # every cell the sweep asked for, refused ones included
    source: str | None
    varying: list[str] = field(init=False)
    series_names: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.varying = varying_options(self.cells) if self.cells else []
        self.series_names = [option for option in self.varying if option != _BATCH]

    @classmethod
    def of(cls, name: str, slug: str, cells: list[CellSummary], record: SweepRecord | None) -> "SweepData":
        # The record is JSON from the database: anything may be in it.
        spec = record.spec if record is not None and isinstance(record.spec, dict) else {}
        planned = record.cells if record is not None and isinstance(record.cells, list) else []
        source = record.source if record is not None and record.source else None
        return cls(name=name, slug=slug, cells=cells, spec=spec,
                   planned=[cell for cell in planned if isinstance(cell, dict)], source=source)

    @property
    def refused(self) -> list[dict[str, Any]]:
        return [cell for cell in self.planned if cell.get("invalid_reason")]

    @property
    def batch_varies(self) -> bool:
        return _BATCH in self.varying

    def figure(self, kind: str, png: bytes, caption: str) -> Figure:
        return Figure(f"{self.slug}-{kind}.png", png, caption)


def _no_figure_reason(cells: Sequence[CellSummary], figure: str, what: str, why: str = "") -> str:
    if all(getattr(cell, figure) is None for cell in cells):
        return f"no cell has a {what} figure{why}"
    return f"no cell has a {what} figure that can be drawn (positive and finite)"


def _not_drawn(title: str, reason: str) -> list[Block]:
    return [Heading(3, title), Paragraph(f"Not drawn: {reason}.")]


def _summary_blocks(sweep: SweepData, store_path: Path) -> list[Block]:
    blocks: list[Block] = []
    if sweep.spec.get("description"):
        blocks.append(Paragraph(shorten(one_line(sweep.spec["description"]), 4 * _TEXT_CHARS)))
    cells = sweep.cells
    states: dict[str, int] = {}
    for cell in cells:
        states[cell.status] = states.get(cell.status, 0) + 1
    runs = sum(cell.repeats_recorded for cell in cells)
    facts: list[Inline] = [f"{len(cells)} cells with results "
                           f"({', '.join(f'{count} {state}' for state, count in sorted(states.items())) or 'none'}), "
                           f"{runs} runs"]
    if sweep.spec.get("repeats"):
        facts.append(f"; {_option_text(sweep.spec['repeats'])} repeats per cell asked")
    if sweep.source:
        facts += ["; grid file ", Code(shorten(one_line(sweep.source)))]
    refused = sweep.refused
    if refused:
        facts.append(f"; {len(refused)} cells refused by validation")
    expected = len(sweep.planned) - len(refused)
    if expected > len(cells):
        facts.append(f"; {expected - len(cells)} cells not run yet (resume the sweep to run them)")
    blocks.append(Paragraph(*facts, "."))
    flagged = sum(1 for cell in cells if cell.flagged)
    blocks.append(Paragraph(
        f"Figures are medians over a cell's successful repeats; spread is (max - min) / median of throughput, "
        f"and a cell is flagged when it exceeds {SPREAD_FLAG_FRACTION:.0%} ({flagged} flagged). "
        f"A cell stops at its first failed repeat. Database: ", Code(str(store_path)), "."))
    return blocks


def _table_blocks(sweep: SweepData) -> list[Block]:
    blocks: list[Block] = [Heading(3, "Cells"), cells_table(sweep.cells, sweep.varying, f"cells-{sweep.slug}")]
    if sweep.batch_varies:
        blocks += [Heading(3, "Throughput by batch size (samples/s, median)"),
                   batch_table(sweep.cells, sweep.series_names, f"batches-{sweep.slug}")]
    return blocks


def _throughput_blocks(sweep: SweepData) -> list[Block]:
    title = "Throughput against batch size"
    drawable = drawable_against_batch(sweep.cells, lambda cell: cell.throughput_per_second)
    if not (sweep.batch_varies and drawable):
        return _not_drawn(title, _no_figure_reason(sweep.cells, "throughput_per_second", "throughput") if not drawable
                          else "the sweep does not vary the micro-batch size")
    png = plot_against_batch(
        sweep.cells, sweep.series_names, lambda cell: cell.throughput_per_second,
        lambda cell: (cell.throughput_min, cell.throughput_max) if cell.throughput_min is not None else None,
        "throughput (samples/s)", "Throughput against micro-batch size (median, bars: min-max)")
    return [Heading(3, title), sweep.figure("throughput-vs-batch-size", png,
                                            "Throughput against micro-batch size, log-log; bars span the repeats; "
                                            "crosses mark cells without a figure")]


def _energy_blocks(sweep: SweepData) -> list[Block]:
    title = "Samples per Wh against batch size"
    drawable = drawable_against_batch(sweep.cells, lambda cell: cell.samples_per_watt_hour)
    if not (sweep.batch_varies and drawable):
        return _not_drawn(title, f"no energy figures ({_energy_reason(sweep.cells)})" if not drawable
                          else "the sweep does not vary the micro-batch size")
    png = plot_against_batch(sweep.cells, sweep.series_names, lambda cell: cell.samples_per_watt_hour, None,
                             "samples per Wh", "Energy efficiency against micro-batch size (median)")
    return [Heading(3, title), sweep.figure("samples-per-wh-vs-batch-size", png,
                                            "Samples per Wh against micro-batch size, log-log")]


def _scaling_blocks(sweep: SweepData) -> list[Block]:
    title = "Scaling efficiency against device count"
    scaling = scaling_points(sweep.cells, sweep.varying)
    if not scaling:
        return _not_drawn(title, "no series of cells differs only in device count (replicas x devices per replica)")
    table = Table(columns=[("series", "series"), ("devices", "devices"),
                           ("throughput_per_second", "throughput (samples/s)"),
                           ("scaling_efficiency", "scaling efficiency")],
                  rows=[[Value(_option_text(label)), Value(str(devices), devices),
                         Value(format_number(throughput), throughput), Value(format_percent(efficiency), efficiency)]
                        for label, series in scaling.items() for devices, throughput, efficiency in series],
                  identifier=f"scaling-{sweep.slug}")
    return [Heading(3, title), sweep.figure("scaling-efficiency", plot_scaling(scaling),
                                            "Scaling efficiency: throughput per device relative to the smallest "
                                            "device count of each series"), table]


def _mfu_percent(cell: CellSummary) -> float | None:
    return None if cell.model_flops_utilization is None else cell.model_flops_utilization * 100


def _teraflops(cell: CellSummary) -> float | None:
    return None if cell.flops_per_second is None else cell.flops_per_second / 1e12


def _mfu_blocks(sweep: SweepData) -> list[Block]:
    title = "MFU against batch size"
    if sweep.batch_varies and drawable_against_batch(sweep.cells, _mfu_percent, log_y=False):
        png = plot_against_batch(sweep.cells, sweep.series_names, _mfu_percent, None, "MFU (% of datasheet peak)",
                                 "Model FLOP utilisation against micro-batch size", log_y=False)
        return [Heading(3, title), sweep.figure("mfu-vs-batch-size", png,
                                                "MFU: achieved FLOP/s over the devices' datasheet peak")]
    drawable = drawable_against_batch(sweep.cells, _teraflops)
    if sweep.batch_varies and drawable:
        png = plot_against_batch(sweep.cells, sweep.series_names, _teraflops, None, "achieved TFLOP/s",
                                 "Achieved FLOP rate against micro-batch size")
        return [Heading(3, title), Paragraph(_peak_reason(sweep.cells) + "."),
                sweep.figure("flops-vs-batch-size", png, "Achieved TFLOP/s against micro-batch size, log-log")]
    return _not_drawn(title, _no_figure_reason(sweep.cells, "flops_per_second", "FLOP",
                                               " (the workload declares no FLOP count)") if not drawable
                      else "the sweep does not vary the micro-batch size")


def _pareto_blocks(sweep: SweepData) -> list[Block]:
    title = "Throughput against samples per Wh (Pareto view)"
    if not _pareto_cells(sweep.cells):
        return _not_drawn(title, f"no energy figures ({_energy_reason(sweep.cells)})")
    return [Heading(3, title), sweep.figure("pareto", plot_pareto(sweep.cells, sweep.series_names),
                                            "Each cell's median throughput against its samples per Wh; the dashed "
                                            "line joins the cells no other cell beats on both")]


def _power_blocks(sweep: SweepData) -> list[Block]:
    title = "Power over the timed window"
    traces = power_traces(sweep.cells)
    if not traces:
        return _not_drawn(title, "no run recorded a power timeline (meters that sample power record one: "
                                 "NVML, amdsmi, gcipuinfo; RAPL reads counters only; --power-timeline-points 0 "
                                 "turns it off)")
    shown = traces[:_MAX_POWER_TRACES]
    caption = ("Total sampled power of each cell's first successful repeat, one flat segment per timeline "
               "span (its mean power); gaps: a device had no reading")
    if len(traces) > len(shown):
        caption += f"; the first {len(shown)} of {len(traces)} cells with a timeline"
    return [Heading(3, title), sweep.figure("power-timeline", plot_power_traces(shown), caption)]


def _failure_blocks(sweep: SweepData) -> list[Block]:
    failures = [cell for cell in sweep.cells if cell.failure is not None]
    if not failures:
        return []
    blocks: list[Block] = [Heading(3, "Failures")]
    for cell in failures:
        status = cell.failure.status  # type: ignore[union-attr]
        blocks.append(Paragraph(Code(shorten(one_line(cell.label))),
                                f": {status.state.value} in {_option_text(status.phase or 'an unknown phase')} "
                                f"({_option_text(status.error_type or 'no type')})"))
        message = status.message or ""
        blocks.append(Preformatted(message if len(message) <= _MESSAGE_CHARS
                                   else message[:_MESSAGE_CHARS] + "\n... (the database has the whole message)"))
    return blocks


def _refused_blocks(sweep: SweepData) -> list[Block]:
    refused = sweep.refused
    if not refused:
        return []
    return [Heading(3, "Cells refused by validation"),
            Table(columns=[("cell", "cell"), ("reason", "reason")],
                  rows=[[Value(_option_text(cell.get("label") or cell.get("key") or "?")),
                         Value(_option_text(cell["invalid_reason"]))] for cell in refused])]


# Each part of a section with plots, in order. A part that raises is replaced by a note: one
# odd result must not cost the rest of the report.
_PLOT_PARTS: tuple[tuple[str, Callable[[SweepData], list[Block]]], ...] = (
    ("Throughput against batch size", _throughput_blocks),
    ("Samples per Wh against batch size", _energy_blocks),
    ("Scaling efficiency against device count", _scaling_blocks),
    ("MFU against batch size", _mfu_blocks),
    ("Throughput against samples per Wh (Pareto view)", _pareto_blocks),
    ("Power over the timed window", _power_blocks),
)


def _guarded(title: str, part: Callable[[SweepData], list[Block]], sweep: SweepData) -> list[Block]:
    try:
        return part(sweep)
    except ReportError:
        raise
    except Exception as error:  # noqa: BLE001 - a plot that cannot be drawn is reported, not fatal
        _pyplot().close("all")
        return _not_drawn(title, f"drawing it failed ({type(error).__name__}: {shorten(one_line(error))})")


def sweep_section(name: str, runs_cells: list[CellSummary], record: SweepRecord | None,
                  store_path: Path, slug: str | None = None) -> list[Block]:
    """One sweep's part of the report: summary, tables, plots, failures, refused cells, environment."""
    sweep = SweepData.of(name, slug if slug is not None else sweep_slugs([name])[name], runs_cells, record)
    blocks: list[Block] = [Heading(2, f"Sweep {shorten(one_line(name))}"), *_summary_blocks(sweep, store_path)]
    if not sweep.cells:
        return blocks + [Paragraph("No results recorded for this sweep yet.")] + _refused_blocks(sweep)
    blocks += _table_blocks(sweep)
    for title, part in _PLOT_PARTS:
        blocks += _guarded(title, part, sweep)
    blocks += _failure_blocks(sweep) + _refused_blocks(sweep)
    return blocks + [Heading(3, "Environment"), environment_table(sweep.cells)]


def environment_table(cells: Sequence[CellSummary]) -> Table:
    facts: dict[str, set[str]] = {}

    def note(name: str, value: Any) -> None:
        if value:
            facts.setdefault(name, set()).add(_option_text(value))

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
            note(_option_text(result.framework), environment.framework_version)
            for device in result.devices:
                note("devices", device.name)
    if not facts:
        return Table(columns=[("fact", "fact"), ("values", "values")],
                     rows=[[Value("environment"), Value("not recorded")]])
    return Table(columns=[("fact", "fact"), ("values", "values")],
                 rows=[[Value(name), Value(", ".join(sorted(values)))] for name, values in facts.items()])


# --- the report ---------------------------------------------------------------------------------


class ReportWriteError(OutputError):
    """The report was built but could not be written; the output directory was left as it was."""


@dataclass(frozen=True)
class ReportFiles:
    markdown: Path
    html: Path
    plots: list[Path]
    warnings: list[str] = field(default_factory=list)  # what the database could not give (skipped rows)


_MAX_WARNINGS = 50  # shown in a report; the rest are counted


def store_warnings(store: ResultStore) -> list[str]:
    """The rows the store skipped so far because they cannot be parsed (``ResultStore.skipped_rows``),
    each as one line of text."""
    return [one_line(row) for row in getattr(store, "skipped_rows", ())]


def select_sweeps(store: ResultStore, sweeps: Sequence[str] | None = None) -> list[str]:
    """The sweeps to report: those asked for, which must exist, else all of them."""
    known = store.sweep_names()
    names = list(dict.fromkeys(sweeps)) if sweeps else known
    missing = [name for name in names if name not in known]
    if missing:
        raise ReportError(f"no sweep named {', '.join(repr(n) for n in missing)} in {store.path}; "
                          f"it has: {list_names(known)}")
    if not names:
        raise ReportError(f"{store.path} has no sweeps to report; run `core sweep FILE` first")
    return names


def _read_section(store: ResultStore, name: str, slug: str) -> list[Block]:
    """One sweep's section; a sweep whose rows cannot be read is a note, not the end of the report."""
    try:
        cells = summarise(store.runs(sweep=name))
    except (ValueError, sqlite3.DatabaseError, StoreError) as error:
        return [Heading(2, f"Sweep {shorten(one_line(name))}"),
                Paragraph(f"The runs of this sweep could not be read from the database, so it is left out: "
                          f"{type(error).__name__}: {shorten(one_line(error))}.")]
    notes: list[Block] = []
    try:
        record = store.sweep(name)
    except (ValueError, TypeError, KeyError, sqlite3.DatabaseError, StoreError) as error:
        record = None
        notes.append(Paragraph(f"The sweep's settings could not be read from the database ({type(error).__name__}: "
                               f"{shorten(one_line(error))}); refused and missing cells are not shown."))
    blocks = sweep_section(name, cells, record, store.path, slug)
    return blocks[:1] + notes + blocks[1:]


def _warning_blocks(warnings: Sequence[str]) -> list[Block]:
    if not warnings:
        return []
    blocks: list[Block] = [Heading(2, "Database warnings"),
                           Paragraph(f"{len(warnings)} rows of the database could not be read and are left out of "
                                     "this report:")]
    blocks += [Paragraph(shorten(warning, 4 * _TEXT_CHARS)) for warning in warnings[:_MAX_WARNINGS]]
    if len(warnings) > _MAX_WARNINGS:
        blocks.append(Paragraph(f"... and {len(warnings) - _MAX_WARNINGS} more."))
    return blocks


def build_report(store: ResultStore, sweeps: Sequence[str] | None = None) -> tuple[str, list[Block]]:
    names = select_sweeps(store, sweeps)
    _pyplot()  # fail before any work when matplotlib is missing, plots or not
    slugs = sweep_slugs(names)
    sections: list[Block] = []
    for name in names:
        sections += _read_section(store, name, slugs[name])
    generated = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    blocks: list[Block] = [Paragraph(f"Generated {generated} from ", Code(str(store.path)),
                                     f": sweeps {', '.join(shorten(one_line(name), 80) for name in names)}.")]
    return "core benchmark report", blocks + _warning_blocks(store_warnings(store)) + sections


def check_report_output(output: str | Path) -> None:
    """Refuse, before any work, an output directory the report cannot be written to.

    Creates the directory (and its parents) when it is missing.

    :raises OutputError: naming the path and the reason.
    """
    output = Path(output)
    if output.exists() and not output.is_dir():
        raise OutputError(f"report output {output} is a file; give a directory for report.md, report.html "
                          "and plots/")
    for name in (REPORT_MARKDOWN, REPORT_HTML, PLOTS_DIRECTORY):
        target = output / name
        if name == PLOTS_DIRECTORY:
            if target.exists() and not target.is_dir():
                raise OutputError(f"cannot write the report's plots: {target} is in the way and is not a directory")
            if target.is_dir() and not os.access(target, os.W_OK | os.X_OK):
                raise OutputError(f"cannot write the report's plots: no permission to write in {target}")
        elif target.is_dir():
            raise OutputError(f"cannot write the report: {target} is a directory")
        else:
            check_writable(target, "report file")


def _commit(staging: Path, output: Path, figures: Sequence[Figure]) -> list[Path]:
    """Move the staged files into place: renames in one directory, which need no space."""
    plots_directory = output / PLOTS_DIRECTORY
    plots = []
    for figure in figures:
        target = plots_directory / _checked_file_name(figure.file_name)
        if Path(os.path.normpath(target)).parent != Path(os.path.normpath(plots_directory)):
            raise ReportError(f"refusing to write {target}: outside {plots_directory}")
        os.replace(staging / figure.file_name, target)
        plots.append(target)
    for name in (REPORT_MARKDOWN, REPORT_HTML):
        os.replace(staging / name, output / name)
    return plots


def write_report_files(output: str | Path, title: str, blocks: Sequence[Block]) -> list[Path]:
    """Write report.md, report.html and the plots under ``output``, all of them or none.

    Every file is first written (and flushed to disk) in a hidden staging directory inside
    ``output``; only when all are whole are they renamed into place. A failure (a full disk)
    removes the staging directory and leaves ``output`` as it was. Plots of earlier reports that
    this one does not replace are left alone. Returns the plots' paths.

    :raises ReportWriteError: when a file cannot be written.
    """
    output = Path(output)
    figures = [block for block in blocks if isinstance(block, Figure)]
    names = [_checked_file_name(figure.file_name).lower() for figure in figures]
    if len(set(names)) != len(names):
        raise ReportError("two plots of this report would share a file name")
    documents = {REPORT_MARKDOWN: render_markdown(title, blocks), REPORT_HTML: render_html(title, blocks)}
    try:
        (output / PLOTS_DIRECTORY).mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".report.", suffix=".partial", dir=output))
    except OSError as error:
        raise ReportWriteError(f"cannot write the report in {output}: {describe_os_error(error)}") from None
    try:
        try:
            for figure in figures:
                write_atomically(staging / figure.file_name, figure.png, "report plot")
            for name, text in documents.items():
                write_atomically(staging / name, text, "report file")
        except OutputError as error:
            reason = describe_os_error(error.__context__) if isinstance(error.__context__, OSError) else str(error)
            raise ReportWriteError(f"cannot write the report in {output}: {reason}; nothing in it was changed") from None
        try:
            return _commit(staging, output, figures)
        except OSError as error:  # a rename refused: rare (the checks ran), but then say what is left
            raise ReportWriteError(f"cannot move the report into {output}: {describe_os_error(error)}; the report "
                                   "there may be incomplete: run `core report` again") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def write_report(database: str | Path | ResultStore, output: str | Path,
                 sweeps: Sequence[str] | None = None) -> ReportFiles:
    """Write report.md, report.html and plots/*.png under ``output``; returns their paths.

    The output directory is checked before any plot is drawn (:class:`~core.files.OutputError`),
    and the files are written whole or not at all (:class:`ReportWriteError`).
    """
    output = Path(output)
    store = database if isinstance(database, ResultStore) else ResultStore(database, create=False)
    # Folders this report may create (plots/, the output, missing parents), innermost first.
    created = [directory for directory in (output / PLOTS_DIRECTORY, output, *output.parents) if not directory.exists()]
    try:
        select_sweeps(store, sweeps)
        _pyplot()
        check_report_output(output)
        title, blocks = build_report(store, sweeps)
        warnings = store_warnings(store)
        plots = write_report_files(output, title, blocks)
    except BaseException:
        _remove_empty_directories(created)
        raise
    finally:
        if not isinstance(database, ResultStore):
            store.close()
    return ReportFiles(markdown=output / REPORT_MARKDOWN, html=output / REPORT_HTML, plots=plots, warnings=warnings)


def _remove_empty_directories(directories: Sequence[Path]) -> None:
    """Undo the folders this report created when it failed: only where they are still empty."""
    for directory in directories:
        try:
            directory.rmdir()
        except OSError:
            pass
