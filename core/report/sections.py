"""One sweep's section of the report: its tables, its plots (or why one is not drawn) and its failures."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from core.report import axes
from core.report.analysis import (
    _BATCH,
    _MAX_POWER_TRACES,
    _SCENARIO,
    _pareto_cells,
    is_inference,
    power_traces,
    varying_options,
)
from core.report.document import (
    _TEXT_CHARS,
    Block,
    Code,
    Figure,
    Heading,
    Inline,
    Paragraph,
    Preformatted,
    ReportError,
    Table,
    Value,
    one_line,
    shorten,
    sweep_slugs,
)
from core.report.figures import figure_blocks
from core.report.heatmap import heatmap_blocks
from core.report.plotdata import against_batch_table, pareto_table, power_table
from core.report.plots import (
    _pyplot,
    drawable_against_batch,
    plot_against_batch,
    plot_pareto,
    plot_power_traces,
)
from core.report.references import reference_blocks
from core.report.roofline import roofline_blocks
from core.report.scaling import scaling_blocks
from core.report.tables import (
    _option_text,
    batch_table,
    cells_table,
    inference_table,
    latency_milliseconds,
    sample_unit,
)
from core.report.to_target import TITLE as TO_TARGET_TITLE
from core.report.to_target import to_target_blocks
from core.storage.store import SweepRecord
from core.storage.summary import SPREAD_FLAG_FRACTION, CellSummary
from core.sweep.reference import Reference
from core.sweep.report_spec import ReportSpec, read_report_spec

_MESSAGE_CHARS = 1200  # of a failure's message shown in the report (the database has all of it)

# --- one sweep's section ------------------------------------------------------------------------


def _energy_note(cells: Sequence[CellSummary]) -> list[Block]:
    """How to read the energy columns, naming the epoch definitions the cells used; nothing when no
    cell has an energy figure."""
    if all(cell.energy_joules is None for cell in cells):
        return []
    definitions = sorted({result.config.epoch.describe() for cell in cells for result in cell.results})
    note = Paragraph(
        "Energy is over the timed window, all devices measured, in J and Wh (1 Wh = 3600 J); per device: "
        "divided evenly over the devices each run used; per epoch: an estimate, extrapolated from the "
        "window's energy per sample, for an epoch defined as ",
        *_joined([Code(shorten(one_line(text))) for text in definitions]),
        ".",
    )
    return [note]


def _joined(parts: Sequence[Inline]) -> list[Inline]:
    joined: list[Inline] = []
    for index, part in enumerate(parts):
        if index:
            joined.append(" or " if index == len(parts) - 1 else ", ")
        joined.append(part)
    return joined


def _energy_reason(cells: Sequence[CellSummary]) -> str:
    reasons = sorted(
        {
            one_line(result.energy_unavailable_reason)
            for cell in cells
            for result in cell.ok_results
            if result.energy_unavailable_reason
        }
    )
    return shorten(reasons[0]) if reasons else "no successful run has an energy figure"


def _peak_reason(cells: Sequence[CellSummary]) -> str:
    accelerators = sorted({_option_text(cell.config.accelerator) for cell in cells})
    return (
        f"No datasheet peak is known for the devices of {', '.join(accelerators)}, so there is no MFU; "
        "the plot shows the achieved FLOP rate instead"
    )


@dataclass
class SweepData:
    """What one sweep's section is made of: its cells with results and what it asked for."""

    name: str
    slug: str
    cells: list[CellSummary]
    spec: dict[str, Any]  # the sweep's settings; {} where the database has none (or none readable)
    planned: list[dict[str, Any]]  # every cell the sweep asked for, refused ones included
    source: str | None
    # None: the sweep's cells as stored; "train" or "inference": that mode's cells only, whose
    # options that vary, series and titles are their own (see of_mode).
    mode: str | None = None
    other_mode_too: bool = False  # the sweep also has cells of the other mode: titles name this one
    varying: list[str] = field(init=False)
    series_names: list[str] = field(init=False)
    report: ReportSpec | None = field(init=False)  # the sweep file's [report] table; None: the defaults
    report_problem: str | None = field(init=False)  # why a stored [report] table was not used
    x_axis: str = field(init=False)  # the axis of the plots against batch

    def __post_init__(self) -> None:
        self.varying = varying_options(self.cells) if self.cells else []
        self.report, self.report_problem = _report_of(self.spec)
        self.x_axis = (self.report.x if self.report else None) or axes.default_x(self.cells)
        if self.report is not None and self.report.series is not None:
            self.series_names = [name for name in self.report.series if name != self.x_axis]
        else:
            self.series_names = axes.series_names(self.cells, self.varying, self.x_axis)
        if self.mode == "inference":
            # A loop's batch latency and a LoadGen query's are different figures: every label says which.
            self.series_names = [_SCENARIO, *(option for option in self.series_names if option != _SCENARIO)]

    @classmethod
    def of(cls, name: str, slug: str, cells: list[CellSummary], record: SweepRecord | None) -> SweepData:
        # The record is JSON from the database: anything may be in it.
        spec = record.spec if record is not None and isinstance(record.spec, dict) else {}
        planned = record.cells if record is not None and isinstance(record.cells, list) else []
        source = record.source if record is not None and record.source else None
        return cls(
            name=name,
            slug=slug,
            cells=cells,
            spec=spec,
            planned=[cell for cell in planned if isinstance(cell, dict)],
            source=source,
        )

    @property
    def refused(self) -> list[dict[str, Any]]:
        return [cell for cell in self.planned if cell.get("invalid_reason")]

    @property
    def batch_varies(self) -> bool:
        """Whether the plots' x axis (the batch axis the sweep varies, or the [report] table's) varies."""
        return axes.varies(self.cells, self.x_axis)

    def x_of(self, cell: CellSummary) -> float | None:
        return axes.position(cell, self.x_axis)

    @property
    def x_name(self) -> str:
        """The x axis in a title: "micro-batch size", "global batch"."""
        return axes.axis_label(self.x_axis).split(" (", 1)[0]

    def plotted(self) -> SweepData:
        """The sweep with the cells its [report] table's filter keeps: what the plots draw."""
        if self.report is None or not self.report.filter:
            return self
        return dataclasses.replace(self, cells=axes.keep(self.cells, self.report.filter))

    def draws(self, part: str) -> bool:
        """Whether the [report] table asks for the standard part (all are drawn without one)."""
        return self.report is None or self.report.plots is None or part in self.report.plots

    def of_mode(self, mode: str) -> SweepData:
        """The same sweep with only its training ("train") or its inference cells."""
        cells = [cell for cell in self.cells if is_inference(cell) == (mode == "inference")]
        return dataclasses.replace(self, cells=cells, mode=mode, other_mode_too=len(cells) < len(self.cells))

    def titled(self, title: str) -> str:
        """A heading of this sweep's part: naming the mode where the sweep has both (always for
        inference, whose parts follow training's and could be taken for more of them)."""
        if self.mode == "inference":
            return f"{title} (inference)"
        return f"{title} (training)" if self.other_mode_too else title

    def figure(self, kind: str, png: bytes, caption: str, data: Table | None = None) -> Figure:
        prefix = "inference-" if self.mode == "inference" else ""
        return Figure(f"{self.slug}-{prefix}{kind}.png", png, caption, data)

    @property
    def batch_label(self) -> str:
        """The x axis of a plot against batch size."""
        if self.mode == "inference" and self.x_axis == _BATCH:
            return "micro-batch size (samples per forward pass; under LoadGen, the most per batch)"
        return axes.axis_label(self.x_axis)


def _report_of(spec: dict[str, Any]) -> tuple[ReportSpec | None, str | None]:
    """The stored [report] table, validated again (the database is untrusted); why not, where not."""
    try:
        return read_report_spec(spec), None
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ()))
        return None, f"report.{where}: {first.get('msg', 'invalid')}" if where else str(first.get("msg", "invalid"))


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
    facts: list[Inline] = [
        f"{len(cells)} cells with results "
        f"({', '.join(f'{count} {state}' for state, count in sorted(states.items())) or 'none'}), "
        f"{runs} runs"
    ]
    repeats = sweep.spec.get("repeats")
    if repeats:
        facts.append(f"; {_option_text(repeats)} {'repeat' if repeats == 1 else 'repeats'} per cell asked")
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
    blocks.append(
        Paragraph(
            f"Figures are medians over a cell's successful repeats; spread is (max - min) / median of throughput, "
            f"and a cell is flagged when it exceeds {SPREAD_FLAG_FRACTION:.0%} ({flagged} flagged). "
            f"A cell stops at its first failed repeat. Database: ",
            Code(str(store_path)),
            ".",
        )
    )
    return blocks


def _table_blocks(sweep: SweepData) -> list[Block]:
    blocks: list[Block] = [
        Heading(3, sweep.titled("Cells")),
        cells_table(sweep.cells, sweep.varying, f"cells-{sweep.slug}"),
        *_energy_note(sweep.cells),
    ]
    if sweep.batch_varies:
        blocks += [
            Heading(3, sweep.titled(f"Throughput by batch size ({sample_unit(sweep.cells)}/s, median)")),
            batch_table(sweep.cells, sweep.series_names, f"batches-{sweep.slug}", sweep.x_axis),
        ]
    return blocks


@dataclass(frozen=True)
class _BatchPlot:
    """A plot of each cell's figure against the micro-batch size, with the table of what it draws."""

    figure_of: Callable[[CellSummary], float | None]
    ylabel: str
    plot_title: str
    kind: str  # names the PNG: <slug>-<kind>.png
    caption: str
    header: str  # the data table's column
    table: str  # names the data table: <table>-<slug>
    spread_of: Callable[[CellSummary], tuple[float, float] | None] | None = None
    log_y: bool = True


def _against_batch_blocks(
    sweep: SweepData, title: str, plot: _BatchPlot, no_figure: Callable[[], str], *before: Block
) -> list[Block]:
    """``plot`` under ``title`` (``before`` between them), or why it is not drawn: ``no_figure()``
    where no cell has a figure to draw, or that the sweep does not vary the micro-batch size."""
    drawable = drawable_against_batch(sweep.cells, plot.figure_of, log_y=plot.log_y, x_of=sweep.x_of)
    if not (sweep.batch_varies and drawable):
        return _not_drawn(title, no_figure() if not drawable else f"the sweep does not vary the {sweep.x_name}")
    png = plot_against_batch(
        sweep.cells,
        sweep.series_names,
        plot.figure_of,
        plot.spread_of,
        plot.ylabel,
        plot.plot_title.replace("micro-batch size", sweep.x_name),
        log_y=plot.log_y,
        xlabel=sweep.batch_label,
        x_of=sweep.x_of,
    )
    x_axis = (sweep.x_axis, sweep.x_name, sweep.x_of)
    data = against_batch_table(
        sweep.cells, sweep.series_names, plot.figure_of, plot.header, f"{plot.table}-{sweep.slug}", x_axis
    )
    caption = plot.caption.replace("micro-batch size", sweep.x_name)
    return [Heading(3, title), *before, sweep.figure(plot.kind, png, caption, data=data)]


def _throughput_spread(cell: CellSummary) -> tuple[float, float] | None:
    if cell.throughput_min is None or cell.throughput_max is None:
        return None
    return (cell.throughput_min, cell.throughput_max)


def _throughput_blocks(sweep: SweepData) -> list[Block]:
    unit = sample_unit(sweep.cells)
    plot = _BatchPlot(
        lambda cell: cell.throughput_per_second,
        f"throughput ({unit}/s)",
        "Throughput against micro-batch size (median, bars: min-max)",
        "throughput-vs-batch-size",
        "Throughput against micro-batch size, log-log; bars span the repeats; crosses mark cells without a figure",
        f"throughput ({unit}/s, median)",
        "throughput-data",
        spread_of=_throughput_spread,
    )
    return _against_batch_blocks(
        sweep,
        sweep.titled("Throughput against batch size"),
        plot,
        lambda: _no_figure_reason(sweep.cells, "throughput_per_second", "throughput"),
    )


def _energy_blocks(sweep: SweepData) -> list[Block]:
    unit = sample_unit(sweep.cells)
    plot = _BatchPlot(
        lambda cell: cell.samples_per_watt_hour,
        f"{unit} per Wh",
        "Energy efficiency against micro-batch size (median)",
        "samples-per-wh-vs-batch-size",
        "Samples per Wh against micro-batch size, log-log",
        f"{unit} per Wh (median)",
        "energy-data",
    )
    return _against_batch_blocks(
        sweep,
        sweep.titled("Samples per Wh against batch size"),
        plot,
        lambda: f"no energy figures ({_energy_reason(sweep.cells)})",
    )


def _scaling_blocks(sweep: SweepData) -> list[Block]:
    title = sweep.titled("Scaling against device count")
    return scaling_blocks(
        title, sweep.cells, sweep.varying, sample_unit(sweep.cells), sweep.figure, f"scaling-{sweep.slug}"
    )


def _mfu_percent(cell: CellSummary) -> float | None:
    return None if cell.model_flops_utilization is None else cell.model_flops_utilization * 100


def _teraflops(cell: CellSummary) -> float | None:
    return None if cell.flops_per_second is None else cell.flops_per_second / 1e12


_MFU_PLOT = _BatchPlot(
    _mfu_percent,
    "MFU (% of datasheet peak)",
    "Model FLOP utilisation against micro-batch size",
    "mfu-vs-batch-size",
    "MFU: achieved FLOP/s over the devices' datasheet peak",
    "MFU (%, median)",
    "mfu-data",
    log_y=False,
)
_FLOPS_PLOT = _BatchPlot(
    _teraflops,
    "achieved TFLOP/s",
    "Achieved FLOP rate against micro-batch size",
    "flops-vs-batch-size",
    "Achieved TFLOP/s against micro-batch size, log-log",
    "achieved TFLOP/s (median)",
    "flops-data",
)


def _mfu_blocks(sweep: SweepData) -> list[Block]:
    """MFU where the devices' peak is known, else the achieved FLOP rate, saying why."""
    title = sweep.titled("MFU against batch size")
    if sweep.batch_varies and drawable_against_batch(sweep.cells, _mfu_percent, log_y=False, x_of=sweep.x_of):
        return _against_batch_blocks(sweep, title, _MFU_PLOT, lambda: "")
    return _against_batch_blocks(
        sweep,
        title,
        _FLOPS_PLOT,
        lambda: _no_figure_reason(sweep.cells, "flops_per_second", "FLOP", " (the workload declares no FLOP count)"),
        Paragraph(_peak_reason(sweep.cells) + "."),
    )


def _pareto_blocks(sweep: SweepData) -> list[Block]:
    title = sweep.titled("Throughput against samples per Wh (Pareto view)")
    if not _pareto_cells(sweep.cells):
        return _not_drawn(title, f"no energy figures ({_energy_reason(sweep.cells)})")
    return [
        Heading(3, title),
        sweep.figure(
            "pareto",
            plot_pareto(sweep.cells, sweep.series_names, sample_unit(sweep.cells)),
            "Each cell's median throughput against its samples per Wh; the dashed "
            "line joins the cells no other cell beats on both",
            data=pareto_table(sweep.cells, sample_unit(sweep.cells), f"pareto-data-{sweep.slug}"),
        ),
    ]


def _power_blocks(sweep: SweepData) -> list[Block]:
    title = sweep.titled("Power over the timed window")
    traces = power_traces(sweep.cells)
    if not traces:
        return _not_drawn(
            title,
            "no run recorded a power timeline (a meter that samples power records one, a meter that "
            "reads energy counters only does not; --power-timeline-points 0 turns it off)",
        )
    shown = traces[:_MAX_POWER_TRACES]
    caption = (
        "Total sampled power of each cell's first successful repeat, one flat segment per timeline "
        "span (its mean power); gaps: a device had no reading"
    )
    if len(traces) > len(shown):
        caption += f"; the first {len(shown)} of {len(traces)} cells with a timeline"
    return [
        Heading(3, title),
        sweep.figure(
            "power-timeline", plot_power_traces(shown), caption, data=power_table(shown, f"power-data-{sweep.slug}")
        ),
    ]


def _failure_blocks(sweep: SweepData) -> list[Block]:
    failures = [cell for cell in sweep.cells if cell.failure is not None]
    if not failures:
        return []
    blocks: list[Block] = [Heading(3, "Failures")]
    for cell in failures:
        status = cell.failure.status  # type: ignore[union-attr]
        blocks.append(
            Paragraph(
                Code(shorten(one_line(cell.label))),
                f": {status.state.value} in {_option_text(status.phase or 'an unknown phase')} "
                f"({_option_text(status.error_type or 'no type')})",
            )
        )
        message = status.message or ""
        blocks.append(
            Preformatted(
                message
                if len(message) <= _MESSAGE_CHARS
                else message[:_MESSAGE_CHARS] + "\n... (the database has the whole message)"
            )
        )
    return blocks


def _refused_blocks(sweep: SweepData) -> list[Block]:
    refused = sweep.refused
    if not refused:
        return []
    return [
        Heading(3, "Cells refused by validation"),
        Table(
            columns=[("cell", "cell"), ("reason", "reason")],
            rows=[
                [
                    Value(_option_text(cell.get("label") or cell.get("key") or "?")),
                    Value(_option_text(cell["invalid_reason"])),
                ]
                for cell in refused
            ],
        ),
    ]


# --- inference cells ---------------------------------------------------------------------------


def _modes_note(training: SweepData, inference: SweepData) -> Paragraph:
    return Paragraph(
        f"This sweep has {len(training.cells)} training and {len(inference.cells)} inference cells. A training "
        "sample (forward pass, backward pass and update) and an inference sample (a forward pass) are different "
        "work, so the two are never put in one table or plot: the training cells are under the headings marked "
        "(training), the inference cells under those marked (inference), by scenario."
    )


def _inference_reading(cells: Sequence[CellSummary]) -> Paragraph:
    """How to read the inference table: what a latency is in each scenario, and the estimates."""
    definitions = sorted({result.config.epoch.describe() for cell in cells for result in cell.results})
    return Paragraph(
        "Throughput is the window's samples over its seconds. Latency, in the loop (core's steady window "
        "of back-to-back micro-batches), is one micro-batch's time as the host timed it; under LoadGen's "
        "single-stream and server scenarios, one query's, issue to answer, as LoadGen measured it; "
        "offline sends every sample in a single query, so it has none (n/a). Energy per sample is the "
        "window's energy over its samples. The time per epoch (where shown) is an estimate, the epoch's "
        "samples over the throughput, for an epoch defined as ",
        *_joined([Code(shorten(one_line(text))) for text in definitions]),
        ". LoadGen (where shown) is its verdict on the cell's repeats; - where LoadGen did not run.",
    )


def _inference_table_blocks(sweep: SweepData) -> list[Block]:
    # The scenario always has a column: it says what the latencies are, even where it does not vary.
    options = [_SCENARIO, *(option for option in sweep.varying if option != _SCENARIO)]
    return [
        Heading(3, sweep.titled("Cells")),
        inference_table(sweep.cells, options, f"inference-{sweep.slug}"),
        _inference_reading(sweep.cells),
    ]


def _p90_milliseconds(cell: CellSummary) -> float | None:
    return latency_milliseconds(cell, "step_seconds_p90")


def _latency_blocks(sweep: SweepData) -> list[Block]:
    plot = _BatchPlot(
        _p90_milliseconds,
        "p90 latency (ms)",
        "p90 latency against micro-batch size (median of the repeats)",
        "p90-latency-vs-batch-size",
        "p90 latency against micro-batch size, log-log: in the loop a micro-batch's, under LoadGen's "
        "single-stream and server a query's; crosses mark cells without a figure",
        "p90 latency (ms, median)",
        "latency-data",
    )
    return _against_batch_blocks(
        sweep,
        sweep.titled("p90 latency against batch size"),
        plot,
        lambda: "no cell has a p90 latency that can be drawn (offline has none: LoadGen sends it a single query)",
    )


# Each part of a section with plots, in order. A part that raises is replaced by a note: one
# odd result must not cost the rest of the report.
_PLOT_PARTS: tuple[tuple[str, Callable[[SweepData], list[Block]]], ...] = (
    ("Throughput against batch size", _throughput_blocks),
    ("Samples per Wh against batch size", _energy_blocks),
    ("Scaling against device count", _scaling_blocks),
    ("MFU against batch size", _mfu_blocks),
    ("Roofline", roofline_blocks),
    ("Utilisation heatmaps", heatmap_blocks),
    ("Throughput against samples per Wh (Pareto view)", _pareto_blocks),
    ("Power over the timed window", _power_blocks),
    ("Figures of the report table", figure_blocks),
)
_INFERENCE_PARTS: tuple[tuple[str, Callable[[SweepData], list[Block]]], ...] = (
    ("Throughput against batch size", _throughput_blocks),
    ("p90 latency against batch size", _latency_blocks),
    ("Figures of the report table", figure_blocks),
)
# The name a [report] table's `plots` gives each standard part (the table's own figures always draw).
_PART_NAMES = {
    "Throughput against batch size": "throughput",
    "Samples per Wh against batch size": "energy",
    "Scaling against device count": "scaling",
    "MFU against batch size": "mfu",
    "Roofline": "roofline",
    "Utilisation heatmaps": "heatmaps",
    "Throughput against samples per Wh (Pareto view)": "pareto",
    "Power over the timed window": "power",
    "p90 latency against batch size": "latency",
}


def _plot_blocks(sweep: SweepData, parts: Sequence[tuple[str, Callable[[SweepData], list[Block]]]]) -> list[Block]:
    """The parts the sweep's [report] table asks for (all without one), over the cells its filter keeps."""
    plotted = sweep.plotted()
    blocks: list[Block] = []
    if sweep.report_problem:
        blocks.append(Paragraph(f"The stored [report] table is not used ({shorten(sweep.report_problem)}): defaults."))
    if sweep.report is not None and sweep.report.filter:
        blocks.append(
            Paragraph(
                f"The plots draw the {len(plotted.cells)} of {len(sweep.cells)} cells the [report] "
                "table's filter keeps; the tables above have them all."
            )
        )
    for title, part in parts:
        if title in _PART_NAMES and not sweep.draws(_PART_NAMES[title]):
            continue
        blocks += _guarded(title, part, plotted)
    return blocks


def _guarded(title: str, part: Callable[[SweepData], list[Block]], sweep: SweepData) -> list[Block]:
    try:
        return part(sweep)
    except ReportError:
        raise
    except Exception as error:  # noqa: BLE001 - a plot that cannot be drawn is reported, not fatal
        _pyplot().close("all")
        return _not_drawn(
            sweep.titled(title), f"drawing it failed ({type(error).__name__}: {shorten(one_line(error))})"
        )


def sweep_section(
    name: str,
    runs_cells: list[CellSummary],
    record: SweepRecord | None,
    store_path: Path,
    slug: str | None = None,
    references: Sequence[Reference] = (),
) -> list[Block]:
    """One sweep's part of the report: summary, the published figures beside the measured ones,
    tables, plots, failures, refused cells, environment; the training cells' tables and plots apart
    from the inference cells'. ``references``: the user's own for this sweep (``--reference``)."""
    sweep = SweepData.of(name, slug if slug is not None else sweep_slugs([name])[name], runs_cells, record)
    blocks: list[Block] = [Heading(2, f"Sweep {shorten(one_line(name))}"), *_summary_blocks(sweep, store_path)]
    if not sweep.cells:
        return blocks + [Paragraph("No results recorded for this sweep yet.")] + _refused_blocks(sweep)
    training, inference = sweep.of_mode("train"), sweep.of_mode("inference")
    if training.cells and inference.cells:
        blocks.append(_modes_note(training, inference))
    blocks += reference_blocks(sweep.spec, sweep.planned, sweep.cells, sweep.slug, references)
    if training.cells:
        blocks += _table_blocks(training)
        if any(cell.trained_to_target for cell in training.cells):  # runs trained to a target quality
            blocks += _guarded(TO_TARGET_TITLE, to_target_blocks, training)
        blocks += _plot_blocks(training, _PLOT_PARTS)
    if inference.cells:
        blocks += _inference_table_blocks(inference) + _plot_blocks(inference, _INFERENCE_PARTS)
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
        return Table(
            columns=[("fact", "fact"), ("values", "values")], rows=[[Value("environment"), Value("not recorded")]]
        )
    return Table(
        columns=[("fact", "fact"), ("values", "values")],
        rows=[[Value(name), Value(", ".join(sorted(values)))] for name, values in facts.items()],
    )
