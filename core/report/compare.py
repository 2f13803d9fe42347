"""Comparisons across platforms and hosts (the GH200 paper's Table I and II): the same work on
different machines, matched cell by cell, with percentage differences in the paper's words.

A *side* is where a cell ran: its host, its accelerator and device models (and the value of any
option the user chose not to match, such as ``replicas`` for "1x A100 against 4x A100"). Cells of
different sides are matched by what they ran: every option in :data:`MATCHED_OPTIONS` and every
workload option. What only says how a run was measured (steps, seeds, meters) or is the platform's
own (accelerator options, threads, rendezvous) is not matched.

Percentages are the paper's: "A is 32.3 % faster than B" means A needs 32.3 % less time for the
same work, i.e. 1 - (slower throughput / faster throughput); "B is 20.4 % slower than A" is the
same figure from the other side. Energy is worded the same way ("less energy", "more energy"
per sample: the difference over the larger of the two), and the plain ratio is shown beside it.

Provenance is kept: every matched cell remembers its database and sweep, the environment table
names them per side, and two cells of one side with the same configuration are either the same
runs read twice (kept once, and said so) or a conflict (shown as one, never averaged or picked).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from core.report.analysis import _plottable, _short, is_inference
from core.report.document import (
    Block,
    Figure,
    Heading,
    Paragraph,
    ReportError,
    Table,
    Value,
    format_number,
    one_line,
    shorten,
)
from core.report.plots import _png, _pyplot, plot_text
from core.report.tables import sample_unit
from core.storage.summary import CellSummary

# What makes two cells the same work. Not matched: accelerator and accelerator_options (the
# platform compared), steps, warmup_steps, seed, power_*, threads_per_replica, data_workers and
# rendezvous (how it was measured or placed on that host), epoch_definition (estimates only),
# global_batch_size (the micro-batch and accumulation it derives are matched: the same work either way).
MATCHED_OPTIONS = (
    "workload",
    "mode",
    "framework",
    "precision",
    "micro_batch_size",
    "gradient_accumulation",
    "replicas",
    "devices_per_replica",
    "nodes",
    "device_iterations",
    "compile",
    "data",
    "data_format",
    "scenario",
    "loadgen",
    "weights",
    "accuracy",
)
_MAX_PLOTTED_ROWS = 24  # configurations in the comparison plot; the table has all of them


@dataclass(frozen=True)
class SourcedCell:
    """A cell and where it was read: the database (as the user named it) and the sweep."""

    cell: CellSummary
    database: str
    sweep: str

    @property
    def source(self) -> str:
        return f"{self.database} (sweep {self.sweep}, cell {self.cell.cell_key})"


def _run_identity(cell: CellSummary) -> frozenset[tuple[Any, ...]]:
    """What tells the same runs apart from other runs: when they started, where, and what they measured."""
    return frozenset(
        (
            result.started_at.isoformat(),
            result.environment.hostname if result.environment else None,
            result.throughput_per_second,
        )
        for result in cell.results
    )


def host_of(cell: CellSummary) -> str:
    hosts = sorted({r.environment.hostname for r in cell.results if r.environment is not None})
    return ", ".join(hosts) if hosts else "unknown host"


def devices_of(cell: CellSummary) -> str:
    """``4x NVIDIA A100-SXM4-80GB``: the devices of the cell's first repeat, counted by model."""
    result = (cell.ok_results or cell.results)[0]
    counts: dict[str, int] = {}
    for device in result.devices:
        counts[device.name] = counts.get(device.name, 0) + 1
    return (
        " + ".join(f"{count}x {name}" for name, count in counts.items()) or f"{cell.devices}x {cell.config.accelerator}"
    )


@dataclass(frozen=True)
class Side:
    key: tuple[str, ...]
    label: str


def side_of(cell: CellSummary, ignored: Sequence[str]) -> Side:
    """Where the cell ran: host, accelerator, devices, and the options not matched."""
    host, devices, accelerator = host_of(cell), devices_of(cell), str(cell.config.accelerator)
    ignored_values = tuple(f"{_short(name)}={cell.option(name)}" for name in ignored)
    label = f"{host}: {devices} ({accelerator})" + "".join(f", {value}" for value in ignored_values)
    return Side((host, accelerator, devices, *ignored_values), label)


def match_key(cell: CellSummary, ignored: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """What the cell ran, as (option, value) pairs, less the options the user chose not to match."""
    names = [name for name in MATCHED_OPTIONS if name not in ignored]
    names += sorted(
        f"workload_options.{key}"
        for key in dict(cell.config.workload_options)
        if f"workload_options.{key}" not in ignored
    )
    return tuple((name, repr(cell.option(name))) for name in names)


@dataclass
class ComparedRow:
    """One configuration: its cell on each side (None: that side did not run it)."""

    key: tuple[tuple[str, str], ...]
    cells: dict[Side, SourcedCell] = field(default_factory=dict)
    conflicts: dict[Side, list[SourcedCell]] = field(default_factory=dict)

    def cell(self, side: Side) -> CellSummary | None:
        sourced = self.cells.get(side)
        return None if sourced is None or side in self.conflicts else sourced.cell


@dataclass
class Comparison:
    sides: list[Side]  # the baseline first
    rows: list[ComparedRow]
    varying: list[str]  # the matched options that differ between rows: each row's label
    same_runs: list[str]  # the same runs read from two places, counted once
    conflicts: list[str]  # one side, one configuration, different runs

    def label(self, row: ComparedRow) -> str:
        values = dict(row.key)
        text = " ".join(f"{_short(name)}={values[name]}" for name in self.varying if name in values)
        return text.replace("'", "") or values.get("workload", "all").strip("'")


def _add(row: ComparedRow, side: Side, sourced: SourcedCell, same_runs: list[str]) -> None:
    known = row.cells.get(side)
    if known is None:
        row.cells[side] = sourced
    elif _run_identity(known.cell) == _run_identity(sourced.cell):
        same_runs.append(f"{sourced.source} holds the same runs as {known.source}: counted once")
    else:
        row.conflicts.setdefault(side, [known]).append(sourced)


def compare(
    cells: Sequence[SourcedCell], ignored: Sequence[str] = (), baseline: str | None = None
) -> Comparison | None:
    """Match the cells of every side; None when fewer than two sides share a configuration.

    :param ignored: options not matched, which become part of the side instead (``replicas``).
    :param baseline: the side whose label contains this text is the baseline; else the first side read.
    """
    rows: dict[tuple[tuple[str, str], ...], ComparedRow] = {}
    sides: dict[Side, None] = {}
    same_runs: list[str] = []
    for sourced in cells:
        if not sourced.cell.ok_results:
            continue  # no figure to compare
        side = side_of(sourced.cell, ignored)
        sides.setdefault(side)
        key = match_key(sourced.cell, ignored)
        _add(rows.setdefault(key, ComparedRow(key)), side, sourced, same_runs)
    shared = [row for row in rows.values() if len(row.cells) >= 2]
    if not shared:
        return None
    ordered = [side for side in sides if any(side in row.cells for row in shared)]
    chosen = baseline_side(ordered, baseline) if baseline is not None else None
    if chosen is not None:
        ordered = [chosen] + [side for side in ordered if side != chosen]
    varying = [
        name
        for name in dict.fromkeys(name for row in shared for name, _ in row.key)
        if len({dict(row.key).get(name) for row in shared}) > 1
    ]
    comparison = Comparison(ordered, shared, varying, same_runs, [])
    comparison.conflicts = [
        f"{side.label}, {comparison.label(row)}: "
        + "; ".join(f"{c.source} at {format_number(c.cell.throughput_per_second)}/s" for c in members)
        for row in shared
        for side, members in row.conflicts.items()
    ]
    return comparison


def baseline_side(sides: Sequence[Side], baseline: str) -> Side | None:
    """The side ``--baseline`` names: the one whose label is ``baseline``, else the one whose label
    contains it; None when none does. Several that contain it are an error naming them: picking
    the first would compare against a side the user may not have meant."""
    exact = [side for side in sides if side.label == baseline]
    matching = exact or [side for side in sides if baseline in side.label]
    if len(matching) > 1:
        raise ReportError(
            f"--baseline {baseline!r} matches {len(matching)} sides: "
            + "; ".join(repr(side.label) for side in matching)
            + ". Give more of the label, enough to name one"
        )
    return matching[0] if matching else None


def relative(figure: float, baseline: float, better: str, worse: str) -> tuple[str, float]:
    """The paper's wording of a higher-is-better figure against the baseline's, and its signed fraction.

    Better: 1 - baseline / figure (``32.3 % faster``); worse: 1 - figure / baseline (``20.4 % slower``).
    """
    if figure >= baseline:
        fraction = 1 - baseline / figure
        return f"{fraction * 100:.1f} % {better}", fraction
    fraction = 1 - figure / baseline
    return f"{fraction * 100:.1f} % {worse}", -fraction


@dataclass(frozen=True)
class Measure:
    """A figure compared: how to read it from a cell, whether higher is better, and its words."""

    key: str
    header: str  # with its unit
    figure: Callable[[CellSummary], float | None]
    higher_is_better: bool
    better: str
    worse: str
    format: Callable[[float], str] = format_number


def _usable(value: float | None) -> TypeGuard[float]:
    return _plottable(value)


def comparison_table(comparison: Comparison, measure: Measure, identifier: str) -> Table:
    """Rows: configurations. Columns: the figure on each side, then each side against the baseline."""
    baseline, others = comparison.sides[0], comparison.sides[1:]
    columns = [("configuration", "configuration")]
    # The headers name the sides only (the heading above names the figure and its unit): the
    # machine names are long, and a header per side and figure made the columns unreadably narrow.
    columns += [(f"{measure.key}:{side.label}", side.label) for side in comparison.sides]
    columns += [(f"versus:{side.label}", f"{side.label} against the baseline") for side in others]
    rows = []
    for row in comparison.rows:
        values = {side: row.cell(side) for side in comparison.sides}
        figures = {side: (measure.figure(cell) if cell is not None else None) for side, cell in values.items()}
        line = [Value(comparison.label(row))]
        for side in comparison.sides:
            figure = figures[side]
            text = "conflict" if side in row.conflicts else "-" if side not in row.cells else "n/a"
            line.append(Value(measure.format(figure), figure) if _usable(figure) else Value(text))
        base = figures[baseline]
        for side in others:
            figure = figures[side]
            if not (_usable(figure) and _usable(base)):
                line.append(Value("-"))
                continue
            # A lower-is-better figure (a time) compared as its rate: the same words, the same arithmetic.
            ours, theirs = (figure, base) if measure.higher_is_better else (1 / figure, 1 / base)
            words, fraction = relative(ours, theirs, measure.better, measure.worse)
            line.append(Value(f"{words} ({figure / base:.2f}x)", fraction))
        rows.append(line)
    return Table(columns=columns, rows=rows, identifier=identifier)


def _join(values: set[str]) -> str:
    return ", ".join(sorted(values)) if values else "not recorded"


def _note_environment(facts: dict[str, set[str]], sourced: SourcedCell) -> None:
    def note(name: str, value: Any) -> None:
        if value:
            facts.setdefault(name, set()).add(shorten(one_line(value)))

    note("database", sourced.database)
    note("sweeps", sourced.sweep)
    note("devices", devices_of(sourced.cell))
    for result in sourced.cell.results:
        environment = result.environment
        note("accelerator", result.accelerator)
        if environment is None:
            continue
        note("host", environment.hostname)
        note("processor", environment.processor)
        note("platform", environment.platform)
        for name, version in environment.driver_versions.items():
            note("drivers", f"{name} {version}")
        note("framework", f"{result.framework} {environment.framework_version or ''}".strip())
        for name, version in environment.library_versions.items():
            note("libraries", f"{name} {version}")
        note("python", environment.python_version)
        note("core", environment.core_version)


def environment_comparison(comparison: Comparison, cells: Sequence[SourcedCell], ignored: Sequence[str]) -> Table:
    """Each side's machine and software, side by side: what the percentages compare."""
    facts: dict[Side, dict[str, set[str]]] = {side: {} for side in comparison.sides}
    for sourced in cells:
        side = side_of(sourced.cell, ignored)
        if side in facts:
            _note_environment(facts[side], sourced)
    names = list(dict.fromkeys(name for side_facts in facts.values() for name in side_facts))
    return Table(
        columns=[("fact", "fact")] + [(f"side:{side.label}", side.label) for side in comparison.sides],
        rows=[
            [Value(name)] + [Value(_join(facts[side].get(name, set()))) for side in comparison.sides] for name in names
        ],
        identifier="compare-environment",
    )


def plot_comparison(comparison: Comparison, measure: Measure, title: str) -> bytes:
    """Grouped horizontal bars: one group per configuration, one bar per side."""
    pyplot = _pyplot()
    rows = comparison.rows[:_MAX_PLOTTED_ROWS]
    sides = comparison.sides
    height = 0.8 / len(sides)
    figure_height = 1.2 + 0.32 * len(rows) * len(sides) + 0.25 * len(sides)
    figure, axis = pyplot.subplots(figsize=(9.0, figure_height))
    drawn: list[float] = []
    for index, side in enumerate(sides):
        positions, widths = [], []
        for position, row in enumerate(rows):
            cell = row.cell(side)
            value = measure.figure(cell) if cell is not None else None
            if _usable(value):
                positions.append(position + (index - (len(sides) - 1) / 2) * height)
                widths.append(value)
        drawn += widths
        axis.barh(positions, widths, height=height * 0.95, color=f"C{index % 10}", label=plot_text(side.label))
    axis.set_yticks(range(len(rows)))
    axis.set_yticklabels([plot_text(comparison.label(row)) for row in rows], fontsize="small")
    axis.invert_yaxis()  # the first configuration on top, as in the table
    if drawn and max(drawn) / min(drawn) > 100:
        axis.set_xscale("log")
    axis.set_xlabel(measure.header)
    axis.set_title(title)
    axis.grid(True, axis="x", which="both", alpha=0.3)
    # Below the axes and their label (0.65 inch, as a fraction of the axes' height): inside, the
    # legend covered the longest bars.
    below = 0.65 / max(0.5, figure_height - 1.0)
    axis.legend(loc="upper center", bbox_to_anchor=(0.5, -below), fontsize="small")
    figure.tight_layout()
    return _png(figure)


def throughput_measure(cells: Sequence[CellSummary]) -> Measure:
    unit = sample_unit(cells)
    return Measure(
        "throughput_per_second",
        f"throughput ({unit}/s, median)",
        lambda cell: cell.throughput_per_second,
        True,
        "faster",
        "slower",
    )


ENERGY_MEASURE = Measure(
    "samples_per_watt_hour",
    "samples per Wh (median)",
    lambda cell: cell.samples_per_watt_hour,
    True,
    "less energy",
    "more energy",
)


@dataclass(frozen=True)
class ComparisonRequest:
    """What the user asked of a comparison (``core report --compare-ignore/--baseline``)."""

    ignored: tuple[str, ...] = ()
    baseline: str | None = None

    def __post_init__(self) -> None:
        unknown = [name for name in self.ignored if name not in MATCHED_OPTIONS and not _workload_option(name)]
        if unknown:
            raise ReportError(
                f"cannot leave {', '.join(repr(name) for name in unknown)} unmatched: the options compared cells "
                f"are matched on are {', '.join(MATCHED_OPTIONS)} and workload_options.NAME"
            )


def _workload_option(name: str) -> bool:
    group, _, key = name.partition(".")
    return group == "workload_options" and bool(key)


def _conflict_blocks(comparison: Comparison) -> list[Block]:
    blocks: list[Block] = []
    if comparison.conflicts:
        blocks += [
            Heading(3, "Conflicting duplicates"),
            Paragraph(
                "These configurations were run more than once on the same side, with different runs; the "
                "comparison shows them as 'conflict' rather than pick one. Report one sweep of each "
                "(--sweep) or delete the runs that do not belong:"
            ),
        ]
        blocks += [Paragraph(shorten(one_line(text), 1200)) for text in comparison.conflicts]
    if comparison.same_runs:
        blocks.append(Paragraph("Read twice: " + "; ".join(shorten(one_line(t), 600) for t in comparison.same_runs)))
    return blocks


def comparison_blocks(
    cells: Sequence[SourcedCell],
    request: ComparisonRequest,
    extra_measures: Sequence[Measure] = (),
    figure_name: str = "compare",
) -> list[Block]:
    """The report's comparison section; nothing when fewer than two sides ran a configuration alike.

    Training and inference cells are compared apart (their samples are different work).
    """
    blocks: list[Block] = []
    compared: list[Comparison] = []
    for mode, members in (
        ("training", [c for c in cells if not is_inference(c.cell)]),
        ("inference", [c for c in cells if is_inference(c.cell)]),
    ):
        comparison = compare(members, request.ignored, request.baseline)
        if comparison is None:
            continue
        compared.append(comparison)
        blocks += _mode_blocks(comparison, members, request, mode, extra_measures, f"{figure_name}-{mode}")
    if request.baseline is not None:
        _check_baseline(request.baseline, compared, cells, request.ignored)
    if not blocks:
        return []
    return [Heading(2, "Comparison across platforms and hosts"), *blocks]


def _check_baseline(
    baseline: str, compared: Sequence[Comparison], cells: Sequence[SourcedCell], ignored: Sequence[str]
) -> None:
    """``--baseline`` that names no side of any comparison is an error naming the sides there are,
    not a report silently compared against another side."""
    if any(baseline_side(comparison.sides, baseline) is not None for comparison in compared):
        return
    if compared:
        sides = list(dict.fromkeys(side.label for comparison in compared for side in comparison.sides))
        raise ReportError(
            f"--baseline {baseline!r} matches no side compared; the sides are: "
            + "; ".join(repr(label) for label in sides)
        )
    seen = list(dict.fromkeys(side_of(c.cell, ignored).label for c in cells if c.cell.ok_results))
    raise ReportError(
        f"--baseline {baseline!r}: this report compares no sides (no configuration ran on two of them"
        + (f"; its cells ran on: {'; '.join(repr(label) for label in seen)}" if seen else "")
        + "), so there is no baseline to choose"
    )


def _mode_blocks(
    comparison: Comparison,
    cells: Sequence[SourcedCell],
    request: ComparisonRequest,
    mode: str,
    extra_measures: Sequence[Measure],
    slug: str,
) -> list[Block]:
    baseline = comparison.sides[0].label
    matched = [name for name in MATCHED_OPTIONS if name not in request.ignored]
    blocks: list[Block] = [
        Heading(3, f"Environments compared ({mode})"),
        Paragraph(
            f"{len(comparison.sides)} sides (host, accelerator and devices"
            + (f", {', '.join(request.ignored)}" if request.ignored else "")
            + f"), {len(comparison.rows)} configurations run on at least two of them. Cells are matched on "
            + ", ".join(matched)
            + " and every workload option. Percentages are against the baseline "
            + f"{baseline}{_baseline_note(comparison, request)}, in the GH200 paper's terms: 'x % faster' "
            "is x % less time for the same work (1 - slower throughput / faster throughput), 'x % slower' "
            "the same from the other side; the ratio in brackets is the figure over the baseline's."
        ),
        environment_comparison(comparison, cells, request.ignored),
        *_conflict_blocks(comparison),
    ]
    unit_cells = [c.cell for c in cells]
    measures = [throughput_measure(unit_cells), ENERGY_MEASURE, *extra_measures]
    for measure in measures:
        table = comparison_table(comparison, measure, f"{slug}-{measure.key.replace('_', '-')}")
        if not any(value.number is not None for row in table.rows for value in row[1:]):
            continue  # no side has this figure (no power meter): no empty table
        title = f"{measure.header[0].upper()}{measure.header[1:]} by platform ({mode})"
        png = plot_comparison(comparison, measure, title)
        caption = f"{title}: one bar per side, one group per configuration; the data behind it holds the figures"
        blocks += [Heading(3, title), Figure(f"{slug}-{measure.key.replace('_', '-')}.png", png, caption, table)]
    return blocks


def _baseline_note(comparison: Comparison, request: ComparisonRequest) -> str:
    """Where --baseline names a side of the report but not of this comparison, say so."""
    if request.baseline is None or baseline_side(comparison.sides, request.baseline) is not None:
        return ""
    return f" (--baseline {request.baseline!r} ran none of these configurations)"
