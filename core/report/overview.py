"""The report's first section: what ran, where, when, how busy the host was, and what to be wary of,
then the table of contents. A reader who stops here knows what the figures below are of."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from core.base.results import STEAL_BUSY_FRACTION, RunResult
from core.report.analysis import _short, option_names, varying_options
from core.report.document import Block, Code, Contents, Heading, Inline, Paragraph, format_duration, one_line, shorten
from core.report.tables import host_busy_runs
from core.storage.summary import SPREAD_FLAG_FRACTION, CellSummary

SUMMARY_TITLE = "Summary"
_LISTED = 12  # values of one kind named before "and N more"
_VALUE_CHARS = 60  # of one option's value in the summary
_RUN_WARNINGS = 5  # distinct run warnings quoted


def _listed(values: Sequence[str]) -> str:
    """``a, b and c``; past _LISTED, ``a, b, ... and 7 more``."""
    values = [shorten(one_line(value), _VALUE_CHARS) for value in values]
    if len(values) > _LISTED:
        values = values[: _LISTED - 1] + [f"{len(values) - _LISTED + 1} more"]
    return values[0] if len(values) == 1 else ", ".join(values[:-1]) + " and " + values[-1] if values else "none"


def _counted(counts: Counter[str]) -> str:
    """``fcnn (12 runs), resnet50 (4 runs)``, most first."""
    return _listed([f"{value} ({count} run{'s' if count != 1 else ''})" for value, count in counts.most_common()])


def _window(result: RunResult) -> str:
    """What one run timed: its window's steps (or duration) after its warm-up."""
    config = result.config
    if config.mode == "inference" and config.scenario != "loop":
        return f"a LoadGen {config.scenario} window"
    window = f"about {format_duration(config.duration_seconds)}" if config.duration_seconds else f"{config.steps} steps"
    return f"{window} after {config.warmup_steps} warm-up steps"


def _in_order(value: Any) -> tuple[int, Any]:
    """Numbers by size, then anything else by its text."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, value)
    return (1, str(value))


def _plural(count: int, what: str) -> str:
    return f"{count} {what}{'' if count == 1 else 's'}"


def _option_text(cell: CellSummary, name: str) -> str:
    return shorten(one_line(cell.option(name)), _VALUE_CHARS)


def _what_ran(cells: Sequence[CellSummary], results: Sequence[RunResult], sweeps: int, singles: int) -> list[Block]:
    modes = Counter("inference" if result.config.mode == "inference" else "training" for result in results)
    text = (
        f"What ran: {len(results)} runs in {len(cells)} cells"
        + (f" of {sweeps} sweep{'s' if sweeps != 1 else ''}" if sweeps else "")
        + (f" ({singles} single runs)" if singles else "")
        + f"; {_counted(modes)}; workloads {_counted(Counter(result.workload for result in results))}; "
        f"timed windows of {_counted(Counter(_window(result) for result in results))}; data "
        f"{_counted(Counter(result.config.data for result in results))}."
    )
    blocks: list[Block] = [Paragraph(text)]
    varying = varying_options(cells)
    if varying:
        parts: list[Inline] = ["Options that vary: "]
        for index, name in enumerate(varying):
            distinct = {repr(cell.option(name)): cell.option(name) for cell in cells}.values()
            values = [shorten(one_line(value), _VALUE_CHARS) for value in sorted(distinct, key=_in_order)]
            parts += ["; " if index else "", Code(_short(name)), f" ({_listed(values)})"]
        blocks.append(Paragraph(*parts, "."))
    fixed = [
        name for name in option_names(cells) if name not in varying and cells[0].option(name) not in (None, "", {})
    ]
    if fixed:
        parts = ["The same in every cell: "]
        for index, name in enumerate(fixed):
            parts += [", " if index else "", Code(f"{_short(name)}={_option_text(cells[0], name)}")]
        blocks.append(Paragraph(*parts, "."))
    return blocks


def _where(results: Sequence[RunResult]) -> Paragraph:
    hosts = Counter(result.environment.hostname for result in results if result.environment is not None)
    devices = Counter(device.name for result in results for device in result.devices)
    accelerators = Counter(result.accelerator for result in results)
    processors = {
        result.environment.processor for result in results if result.environment and result.environment.processor
    }
    text = f"Where: accelerators {_counted(accelerators)}; devices {_listed(sorted(devices))}"
    text += f"; hosts {_counted(hosts)}" if hosts else "; hosts not recorded"
    if processors:
        text += f"; processors {_listed(sorted(processors))}"
    return Paragraph(text + ".")


def _when(results: Sequence[RunResult]) -> Paragraph:
    times = sorted(result.started_at for result in results)

    def shown(moment: datetime) -> str:
        return moment.strftime("%Y-%m-%d %H:%M:%S %Z").strip()

    if len(times) == 1:
        return Paragraph(f"When: one run, started {shown(times[0])}.")
    return Paragraph(f"When: the first run started {shown(times[0])}, the last {shown(times[-1])}.")


def _host_load(results: Sequence[RunResult], cells: Sequence[CellSummary]) -> Paragraph:
    """How busy the host was over the runs' windows, and over the flagged cells' runs."""
    loads = [result.host_load for result in results if result.host_load is not None]
    if not loads:
        return Paragraph(
            "Host load: not recorded (results written before schema 1.10, or a host without /proc/loadavg)."
        )
    busy = [load for load in loads if load.busy]
    peak = max(loads, key=lambda load: load.load_average or 0.0)
    cpus = f" on {peak.cpu_count} CPUs" if peak.cpu_count else ""
    steal = [load.steal_fraction for load in loads if load.steal_fraction is not None]
    text = (
        f"Host load during the timed windows: the 1-minute load average peaked at {peak.load_average or 0:.2f}{cpus}"
        + (f"; CPU steal up to {max(steal):.1%}" if steal else "")
        + f"; the host was busy (load above its CPU count, or steal above {STEAL_BUSY_FRACTION:.0%}) "
        f"during {len(busy)} of the {len(loads)} runs that recorded it."
    )
    flagged = [cell for cell in cells if cell.flagged]
    if flagged:
        busy_flagged = sum(1 for cell in flagged if host_busy_runs(cell)[0])
        text += (
            f" {len(flagged)} of {len(cells)} cells are flagged (throughput spread above {SPREAD_FLAG_FRACTION:.0%}); "
            f"the host was busy during the runs of {busy_flagged} of them"
            + (
                ", so their spread may be the host's, not the benchmark's: rerun them on an idle host."
                if busy_flagged
                else "."
            )
        )
    return Paragraph(text)


def _warnings(cells: Sequence[CellSummary], results: Sequence[RunResult], database_warnings: int) -> list[Block]:
    failed = [cell for cell in cells if cell.failure is not None]
    flagged = sum(1 for cell in cells if cell.flagged)
    counted = Counter(one_line(warning) for result in results for warning in result.warnings)
    facts = [
        _plural(len(failed), "failed cell") if failed else "",
        _plural(flagged, "flagged cell") if flagged else "",
        _plural(database_warnings, "unreadable database row") if database_warnings else "",
        f"{_plural(sum(counted.values()), 'run warning')} ({len(counted)} distinct)" if counted else "",
    ]
    facts = [fact for fact in facts if fact]
    blocks: list[Block] = [Paragraph(f"Warnings: {'; '.join(facts) if facts else 'none'}.")]
    for warning, count in counted.most_common(_RUN_WARNINGS):
        blocks.append(Paragraph(f"{count} run{'s' if count != 1 else ''}: ", Code(shorten(warning))))
    if len(counted) > _RUN_WARNINGS:
        blocks.append(Paragraph(f"... and {len(counted) - _RUN_WARNINGS} more kinds; each cell's runs keep theirs."))
    return blocks


def overview_blocks(cells: Sequence[CellSummary], sweeps: int, singles: int, database_warnings: int) -> list[Block]:
    """The summary of everything the report covers (``cells``: every sweep's and single run's;
    ``singles`` of them single runs), then the table of contents."""
    results = [run.result for cell in cells for run in cell.runs]
    if not results:
        return [Contents()]
    return [
        Heading(2, SUMMARY_TITLE),
        *_what_ran(cells, results, sweeps, singles),
        _where(results),
        _when(results),
        _host_load(results, cells),
        *_warnings(cells, results, database_warnings),
        Contents(),
    ]
