"""What ``core`` prints of a result: ``core run``'s text, generated line by line from the figures'
declarations (core.storage.metrics), and the plain-text table of cell summaries (``core results``,
the end of ``core sweep``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from core.base.units import JOULES_PER_WATT_HOUR

if TYPE_CHECKING:
    from core.base.results import RunResult, Status
    from core.storage.metrics import PrintedLine
    from core.storage.summary import CellSummary


def count(number: int, noun: str) -> str:
    """``1 run``, ``2 runs``: a count with its noun in the right number."""
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def _format_seconds(value: float | None, scale: float = 1.0, unit: str = "s") -> str:
    return "n/a" if value is None else f"{value * scale:.4g} {unit}"


def _joules_and_watt_hours(joules: float) -> str:
    return f"{joules:.4g} J = {joules / JOULES_PER_WATT_HOUR:.4g} Wh"


def _meter_lines(result: RunResult) -> list[str]:
    """Each meter of a run with node meters: its role, what it includes, its figure, and whether the
    total counts it (a node meter that includes the devices holds the device meter's figure; one read
    beside the devices under node_meters "auto" is itemised only)."""
    from core.report.document import one_line

    items = result.energy.meters if result.energy is not None else []
    lines = []
    for item in items:
        figure = (
            _joules_and_watt_hours(item.energy_joules)
            if item.energy_joules is not None
            else f"unavailable: {one_line(item.unavailable_reason or 'it read nothing')}"
        )
        if item.counted:
            counted = ""
        elif item.note is not None:
            counted = " (read beside, not counted)"
        else:
            counted = ", inside a node meter's figure (not added)"
        label = f"{item.role} meter"
        covers = one_line(", ".join(item.includes))
        lines.append(f"  {label:<15} {one_line(item.meter)} ({covers}): {figure}{counted}")
    return lines


def _component_lines(result: RunResult) -> list[str]:
    """The meter's figure per device or zone, where it has more than one."""
    components = result.energy.components_joules if result.energy is not None else {}
    if len(components) < 2:
        return []
    return [
        "  by component    "
        + ", ".join(f"{name} {joules / JOULES_PER_WATT_HOUR:.4g} Wh" for name, joules in components.items())
    ]


def _loadgen_lines(result: RunResult) -> list[str]:
    """LoadGen's verdict and its own figures, under core's (which count samples over the same window)."""
    figures = result.loadgen
    if figures is None or result.throughput_per_second is None:
        return []
    unit = result.sample_unit or "samples"
    verdict = "VALID" if figures.valid else f"INVALID: {figures.invalid_reason or 'see its summary'}"
    own = [f"{figures.query_count:,} queries"] if figures.query_count is not None else []
    if figures.samples_per_second is not None:
        own.append(f"{figures.samples_per_second:.6g} {unit}/s by its count")
    if figures.early_stopping_latency_seconds is not None:
        share = figures.settings.get("single_stream_target_latency_percentile", 0.9)
        own.append(
            f"early-stopping p{share * 100:g} {_format_seconds(figures.early_stopping_latency_seconds, 1e3, 'ms')}"
        )
    return [f"  loadgen         {figures.scenario}, {verdict}" + (f" ({', '.join(own)})" if own else "")]


#: evaluations ``core run`` lists one per line; a longer curve shows its first and last ones
_CURVE_LINES = 12


def _curve_lines(result: RunResult) -> list[str]:
    """A run trained to a target: its evaluations, one a line (a long curve's first and last ones)."""
    outcome = result.to_target
    if outcome is None or not outcome.curve:
        return []
    curve = outcome.curve
    shown = curve if len(curve) <= _CURVE_LINES else [*curve[: _CURVE_LINES // 2], *curve[-_CURVE_LINES // 2 :]]
    lines = []
    for point in shown:
        if point is curve[-1] and len(curve) > len(shown):
            lines.append(f"{'':<18}... {len(curve) - len(shown)} more")
        lines.append(
            f"  {'curve' if point is curve[0] else '':<15} epoch {point.epoch:<6.3g} {point.seconds:>8.4g} s  "
            + ", ".join(f"{name} {value:.4g}" for name, value in point.metrics.items())
        )
    return lines


def _node_lines(result: RunResult) -> list[str]:
    if not result.nodes:
        return []
    each = ", ".join(
        f"node {node.node_rank} ({node.hostname}) "
        + (f"{node.energy_joules:.4g} J" if node.energy_joules is not None else "no energy")
        for node in result.nodes
    )
    return [f"  nodes           {len(result.nodes)}: {each}"]


def _target_lines(result: RunResult) -> list[str]:
    """A run trained to a target: whether it reached it, and in what time, energy, epochs and samples
    (MLPerf's clock: from the first step, evaluations included); then where training ended."""
    outcome = result.to_target
    if outcome is None:
        return []
    goal = f"{outcome.metric} {'>=' if outcome.higher_is_better else '<='} {outcome.target:g}"
    if outcome.reached:
        figures = [f"in {_format_seconds(outcome.time_to_target_seconds)}"]
        if outcome.energy_to_target_joules is not None:
            figures.append(_joules_and_watt_hours(outcome.energy_to_target_joules))
        if outcome.epochs_to_target is not None:
            figures.append(f"{outcome.epochs_to_target:.4g} epochs")
        if outcome.samples_to_target is not None:
            figures.append(f"{outcome.samples_to_target:,} samples")
        first = f"{goal} reached " + ", ".join(figures)
    else:
        first = f"{goal} not reached (stopped by {outcome.stopped_by})"
    timing = [f"evaluations {_format_seconds(outcome.evaluation_seconds)} inside"]
    if outcome.initialization_seconds is not None:
        timing.append(f"initialisation {_format_seconds(outcome.initialization_seconds)} before the clock")
    lines = [f"  to target       {first}", f"{'':<18}({', '.join(timing)})"]
    trained = [
        f"{outcome.epochs:.4g} epochs",
        f"{outcome.samples:,} samples",
        _format_seconds(outcome.training_seconds),
    ]
    if outcome.training_joules is not None:
        trained.append(f"{outcome.training_joules:.4g} J")
    final = f"{outcome.metric} {outcome.curve[-1].value:.4g} after " if outcome.curve else "no evaluation; "
    evaluations = f"{len(outcome.curve)} evaluation{'' if len(outcome.curve) == 1 else 's'}"
    lines.append(f"  trained         {final}{', '.join(trained)} ({evaluations}, stopped by {outcome.stopped_by})")
    return lines + _curve_lines(result)


def _warning_lines(result: RunResult) -> list[str]:
    """Every warning the result holds (recompilation, meter cross-check, deprecations), one line each."""
    from core.report.document import one_line

    return [f"  warning         {one_line(warning)}" for warning in result.warnings]


def status_lines(status: Status) -> list[str]:
    """What went wrong, where: the parts the status knows (a killed process may name no phase)."""
    from core.base.results import RunState

    if status.ok or status.state is RunState.target_not_reached:  # an outcome, which the target line says
        return []
    from core.report.document import clean_text

    where = f"in {status.phase}: " if status.phase else ""
    what = ": ".join(clean_text(part) for part in (status.error_type, status.message) if part) or status.state.value
    lines = [f"  error           {where}{what}"]
    if status.location:
        lines.append(f"  raised at       {status.location}")
    return lines


# The lines of `core run`'s text that show the result's structure rather than declared figures.
_STRUCTURAL_LINES: dict[str, Callable[[RunResult], list[str]]] = {
    "loadgen": _loadgen_lines,
    "components": _component_lines,
    "meters": _meter_lines,
    "nodes": _node_lines,
    "error": lambda result: status_lines(result.status),
    "warnings": _warning_lines,
    "to_target": _target_lines,
}


# How `core run` says the span its energy covers (config.energy_scope).
_SPANS = {"window": "the window", "steps": "every step (first, warm-up, window)", "run": "the run (set-up to window)"}


def text_context(result: RunResult) -> dict[str, Any]:
    """What the declared texts of `core run`'s figures may name besides their value."""
    unit = result.sample_unit or "samples"
    epoch = result.config.epoch
    method = result.energy.method if result.energy is not None else None
    return {
        "unit": unit,
        "sample": unit.removesuffix("s") or "sample",
        "passes": "batches" if result.config.mode == "inference" else "updates",
        "devices": len(result.devices),
        "method": f" ({method})" if method else "",
        # The span the energy covers (config.energy_scope), as the energy line says it.
        "span": _SPANS[result.config.energy_scope],
        "epoch": epoch.describe()
        if epoch.kind != "dataset" or result.samples_per_epoch is None
        else f"dataset ({result.samples_per_epoch:,} samples)",
    }


def _figure_parts(result: RunResult, line: str, context: dict[str, Any]) -> tuple[list[str], list[str], bool]:
    """The main parts and the asides of one declared line, and whether any figure had a value."""
    from core.storage.metrics import printed_on

    main: list[str] = []
    asides: list[str] = []
    measured = False
    for metric, part in printed_on(line):
        if part.shown is not None and not part.shown(result):
            continue
        value = metric.value(result)
        if value is None:
            if part.missing is None:
                continue
            text = part.missing
        else:
            measured = measured or not part.aside
            shown = value * part.scale if part.scale != 1.0 else value
            text = part.text.format(value=shown, **context)
        parts = asides if part.aside else main
        if part.attach and parts:
            parts[-1] += " " + text
        else:
            parts.append(text)
    return main, asides, measured


def _declared_line(result: RunResult, line: PrintedLine, context: dict[str, Any]) -> list[str]:
    if line.structural:
        return _STRUCTURAL_LINES[line.key](result)
    if line.shown is not None and not line.shown(result):
        return []
    main, asides, measured = _figure_parts(result, line.key, context)
    if not main or not (measured or line.always):
        return []
    label = line.label(result) if callable(line.label) else line.label
    text = f"  {label:<15} " + ", ".join(main) + (f" ({', '.join(asides)})" if asides else "")
    return [text] + ([f"{'':<18}{line.note}"] if line.note else [])


def _batch_line(result: RunResult) -> str:
    """How many samples a step (inference), a query (LoadGen's streams) or an update (training) is."""
    c = result.config
    if c.scenario in ("single-stream", "server"):
        return f"  samples/query   1; warm-up batches of {c.micro_batch_size}"
    if c.mode == "inference":
        return f"  samples/step    {result.samples_per_update} (micro {c.micro_batch_size} x replicas {c.replicas})"
    return (
        f"  samples/update  {result.samples_per_update} (micro {c.micro_batch_size} x accumulation "
        f"{c.gradient_accumulation} x replicas {c.replicas})"
    )


def _placement_lines(result: RunResult) -> list[str]:
    """Where a replica spans several devices, is sharded or recomputes: the mesh and what runs on it."""
    c = result.config
    if c.devices_per_replica == 1 and c.sharding == "none" and c.recompute == "none":
        return []
    parts = [
        f"data {c.replicas} x pipeline {c.pipeline_parallel} x tensor {c.tensor_parallel} "
        f"({result.world_size} process{'es' if result.world_size != 1 else ''})"
    ]
    if result.executor_details.get("sequence_parallel"):
        parts.append("sequence parallel")
    if c.sharding != "none":
        parts.append(f"sharding {c.sharding}")
    if c.recompute != "none":
        parts.append(f"recompute {c.recompute}")
    schedule = (result.executor_details.get("pipeline") or {}).get("schedule")
    if schedule:
        parts.append(f"schedule {schedule}")
    return ["  placement       " + ", ".join(parts)]


def format_result(result: RunResult) -> str:
    """`core run`'s text: a header, the batch arithmetic, then each figure as core.storage.metrics
    declares it (PRINTED_LINES and each metric's Printed), line by line."""
    from core.storage.metrics import PRINTED_LINES

    c = result.config
    lines = [
        f"{result.workload} on {result.accelerator} ({result.framework}, {c.precision.value}"
        + (", inference" if c.mode == "inference" else "")
        + f"): {result.status.state.value}",
        _batch_line(result),
        *_placement_lines(result),
    ]
    context = text_context(result)
    for line in PRINTED_LINES:
        lines += _declared_line(result, line, context)
    return "\n".join(lines)


def _common_unit(cells: Sequence[CellSummary]) -> str:
    """The cells' sample unit ('images') where they share one, else 'samples'."""
    units = {cell.sample_unit for cell in cells}
    return units.pop() if len(units) == 1 else "samples"


def format_cells(cells: Sequence[CellSummary], sweep_column: bool | None = None) -> str:
    """A plain-text table of cell summaries: state, repeats, and the figures core.storage.metrics
    declares for it (RESULTS: median throughput and its spread, samples per Wh, energy...).

    ``sweep_column``: show each cell's sweep first; by default only when the cells come from
    more than one sweep ("-" is a single run's). Text from the database is shown on one line,
    control characters escaped.
    """
    from core.report import format_percent, one_line
    from core.report.tables import metric_header, metric_value
    from core.storage.metrics import RESULTS, Summary, reported

    if sweep_column is None:
        sweep_column = len({cell.sweep for cell in cells}) > 1
    unit = _common_unit(cells)
    # An optional figure (the epoch estimate, those to a target) only where some cell has it.
    figures = [
        metric
        for metric in reported(RESULTS)
        if not (metric.reported is not None and metric.reported.optional)
        or any(cell.figure(metric.name) is not None for cell in cells)
    ]
    header: list[str] = ["sweep"] * sweep_column + ["cell", "status", "ok/runs"]
    for metric in figures:
        header.append(metric_header(metric, unit, short=True))
        if metric.summary is Summary.median_spread:
            header.append("spread")
    rows = [header]
    for cell in cells:
        row = ["-" if cell.sweep is None else one_line(cell.sweep)] * sweep_column
        row += [
            one_line(cell.label),
            cell.status + (" (flagged)" if cell.flagged else ""),
            f"{cell.repeats_ok}/{cell.repeats_recorded}",
        ]
        for metric in figures:
            row.append(metric_value(cell, metric).text)
            if metric.summary is Summary.median_spread:
                row.append(format_percent(cell.spread_of(metric.name)))
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(value.ljust(width) for value, width in zip(row, widths)).rstrip() for row in rows)
