"""One sweep's section of the report: its tables, its plots (or why one is not drawn) and its failures."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.report.analysis import (
    _BATCH,
    _MAX_POWER_TRACES,
    _pareto_cells,
    _short,
    group_series,
    power_traces,
    scaling_points,
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
    format_number,
    format_percent,
    one_line,
    shorten,
    sweep_slugs,
)
from core.report.plots import (
    _pyplot,
    drawable_against_batch,
    plot_against_batch,
    plot_pareto,
    plot_power_traces,
    plot_scaling,
)
from core.storage.store import SweepRecord
from core.storage.summary import SPREAD_FLAG_FRACTION, CellSummary

_MESSAGE_CHARS = 1200  # of a failure's message shown in the report (the database has all of it)

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


def _cell_columns(cells: Sequence[CellSummary]) -> list[_Column]:
    """The figures' columns, units in the headers. Token and epoch columns appear only where some
    cell has the figure, so a vision sweep's table does not carry empty token columns."""
    unit = sample_unit(cells)
    columns = [
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
    optional = {"tokens_per_second", "tokens_per_watt_hour", "energy_watt_hours_per_epoch"}
    return [
        column
        for column in columns
        if column.key not in optional or any(getattr(cell, column.key) is not None for cell in cells)
    ]


def _option_headers(varying: Sequence[str], figures: Sequence[_Column]) -> list[tuple[str, str]]:
    """Options' short names as headers, or their full names where a short one is taken twice."""
    shorts = [_short(name) for name in varying] + [column.header for column in figures]
    return [(name, _short(name) if shorts.count(_short(name)) == 1 else name) for name in varying]


def cells_table(cells: Sequence[CellSummary], varying: Sequence[str], identifier: str) -> Table:
    figures = _cell_columns(cells)
    columns = _option_headers(varying, figures) + [(column.key, column.header) for column in figures]
    rows = [
        [Value(_option_text(cell.option(name))) for name in varying] + [column.value(cell) for column in figures]
        for cell in cells
    ]
    return Table(columns=columns, rows=rows, identifier=identifier, row_keys=[cell.cell_key for cell in cells])


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
    varying: list[str] = field(init=False)
    series_names: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.varying = varying_options(self.cells) if self.cells else []
        self.series_names = [option for option in self.varying if option != _BATCH]

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
    facts: list[Inline] = [
        f"{len(cells)} cells with results "
        f"({', '.join(f'{count} {state}' for state, count in sorted(states.items())) or 'none'}), "
        f"{runs} runs"
    ]
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
        Heading(3, "Cells"),
        cells_table(sweep.cells, sweep.varying, f"cells-{sweep.slug}"),
        *_energy_note(sweep.cells),
    ]
    if sweep.batch_varies:
        blocks += [
            Heading(3, f"Throughput by batch size ({sample_unit(sweep.cells)}/s, median)"),
            batch_table(sweep.cells, sweep.series_names, f"batches-{sweep.slug}"),
        ]
    return blocks


def _throughput_blocks(sweep: SweepData) -> list[Block]:
    title = "Throughput against batch size"
    drawable = drawable_against_batch(sweep.cells, lambda cell: cell.throughput_per_second)
    if not (sweep.batch_varies and drawable):
        return _not_drawn(
            title,
            _no_figure_reason(sweep.cells, "throughput_per_second", "throughput")
            if not drawable
            else "the sweep does not vary the micro-batch size",
        )
    png = plot_against_batch(
        sweep.cells,
        sweep.series_names,
        lambda cell: cell.throughput_per_second,
        lambda cell: (
            (cell.throughput_min, cell.throughput_max)
            if cell.throughput_min is not None and cell.throughput_max is not None
            else None
        ),
        f"throughput ({sample_unit(sweep.cells)}/s)",
        "Throughput against micro-batch size (median, bars: min-max)",
    )
    return [
        Heading(3, title),
        sweep.figure(
            "throughput-vs-batch-size",
            png,
            "Throughput against micro-batch size, log-log; bars span the repeats; crosses mark cells without a figure",
        ),
    ]


def _energy_blocks(sweep: SweepData) -> list[Block]:
    title = "Samples per Wh against batch size"
    drawable = drawable_against_batch(sweep.cells, lambda cell: cell.samples_per_watt_hour)
    if not (sweep.batch_varies and drawable):
        return _not_drawn(
            title,
            f"no energy figures ({_energy_reason(sweep.cells)})"
            if not drawable
            else "the sweep does not vary the micro-batch size",
        )
    png = plot_against_batch(
        sweep.cells,
        sweep.series_names,
        lambda cell: cell.samples_per_watt_hour,
        None,
        f"{sample_unit(sweep.cells)} per Wh",
        "Energy efficiency against micro-batch size (median)",
    )
    return [
        Heading(3, title),
        sweep.figure("samples-per-wh-vs-batch-size", png, "Samples per Wh against micro-batch size, log-log"),
    ]


def _scaling_blocks(sweep: SweepData) -> list[Block]:
    title = "Scaling efficiency against device count"
    scaling = scaling_points(sweep.cells, sweep.varying)
    if not scaling:
        return _not_drawn(title, "no series of cells differs only in device count (replicas x devices per replica)")
    table = Table(
        columns=[
            ("series", "series"),
            ("devices", "devices"),
            ("throughput_per_second", f"throughput ({sample_unit(sweep.cells)}/s)"),
            ("scaling_efficiency", "scaling efficiency"),
        ],
        rows=[
            [
                Value(_option_text(label)),
                Value(str(devices), devices),
                Value(format_number(throughput), throughput),
                Value(format_percent(efficiency), efficiency),
            ]
            for label, series in scaling.items()
            for devices, throughput, efficiency in series
        ],
        identifier=f"scaling-{sweep.slug}",
    )
    return [
        Heading(3, title),
        sweep.figure(
            "scaling-efficiency",
            plot_scaling(scaling),
            "Scaling efficiency: throughput per device relative to the smallest device count of each series",
        ),
        table,
    ]


def _mfu_percent(cell: CellSummary) -> float | None:
    return None if cell.model_flops_utilization is None else cell.model_flops_utilization * 100


def _teraflops(cell: CellSummary) -> float | None:
    return None if cell.flops_per_second is None else cell.flops_per_second / 1e12


def _mfu_blocks(sweep: SweepData) -> list[Block]:
    title = "MFU against batch size"
    if sweep.batch_varies and drawable_against_batch(sweep.cells, _mfu_percent, log_y=False):
        png = plot_against_batch(
            sweep.cells,
            sweep.series_names,
            _mfu_percent,
            None,
            "MFU (% of datasheet peak)",
            "Model FLOP utilisation against micro-batch size",
            log_y=False,
        )
        return [
            Heading(3, title),
            sweep.figure("mfu-vs-batch-size", png, "MFU: achieved FLOP/s over the devices' datasheet peak"),
        ]
    drawable = drawable_against_batch(sweep.cells, _teraflops)
    if sweep.batch_varies and drawable:
        png = plot_against_batch(
            sweep.cells,
            sweep.series_names,
            _teraflops,
            None,
            "achieved TFLOP/s",
            "Achieved FLOP rate against micro-batch size",
        )
        return [
            Heading(3, title),
            Paragraph(_peak_reason(sweep.cells) + "."),
            sweep.figure("flops-vs-batch-size", png, "Achieved TFLOP/s against micro-batch size, log-log"),
        ]
    return _not_drawn(
        title,
        _no_figure_reason(sweep.cells, "flops_per_second", "FLOP", " (the workload declares no FLOP count)")
        if not drawable
        else "the sweep does not vary the micro-batch size",
    )


def _pareto_blocks(sweep: SweepData) -> list[Block]:
    title = "Throughput against samples per Wh (Pareto view)"
    if not _pareto_cells(sweep.cells):
        return _not_drawn(title, f"no energy figures ({_energy_reason(sweep.cells)})")
    return [
        Heading(3, title),
        sweep.figure(
            "pareto",
            plot_pareto(sweep.cells, sweep.series_names, sample_unit(sweep.cells)),
            "Each cell's median throughput against its samples per Wh; the dashed "
            "line joins the cells no other cell beats on both",
        ),
    ]


def _power_blocks(sweep: SweepData) -> list[Block]:
    title = "Power over the timed window"
    traces = power_traces(sweep.cells)
    if not traces:
        return _not_drawn(
            title,
            "no run recorded a power timeline (meters that sample power record one: "
            "NVML, amdsmi, gcipuinfo; RAPL reads counters only; --power-timeline-points 0 "
            "turns it off)",
        )
    shown = traces[:_MAX_POWER_TRACES]
    caption = (
        "Total sampled power of each cell's first successful repeat, one flat segment per timeline "
        "span (its mean power); gaps: a device had no reading"
    )
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


def sweep_section(
    name: str, runs_cells: list[CellSummary], record: SweepRecord | None, store_path: Path, slug: str | None = None
) -> list[Block]:
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
        return Table(
            columns=[("fact", "fact"), ("values", "values")], rows=[[Value("environment"), Value("not recorded")]]
        )
    return Table(
        columns=[("fact", "fact"), ("values", "values")],
        rows=[[Value(name), Value(", ".join(sorted(values)))] for name, values in facts.items()],
    )
