"""Reports: the database's sweeps as Markdown and a self-contained HTML page, with plots.

    from core.report import write_report
    files = write_report("results/core.db", "results/report")

For each sweep: a table of its cells (median of the repeats, spread, flag), a throughput table
by batch size (out-of-memory cells shown as such, as the blank cells of the AI4NP heatmap), and
five plots: throughput against batch size (log-log, one line per accelerator, precision and any
other option that varies), samples per Wh against batch size, scaling efficiency against device
count, MFU (or achieved FLOP/s where no peak is known) against batch size, and throughput against
samples per Wh with its Pareto front. A plot without data is not drawn; the report says why.

Inference cells (``mode = "inference"``) are kept apart from training cells, whose samples are
different work: their own table (samples/s, latency p50/p90/p99, energy per sample, samples per
Wh, the epoch-time estimate, LoadGen's verdict where a LoadGen scenario ran) and two plots,
throughput and p90 latency against batch size, one line per series with the scenario in its label.

Single runs (``core run --database``, no sweep) have a section of their own after the sweeps':
one row per run with its figures (no repeats: no median, no spread), their failures and
environment; ``--sweep`` chooses sweeps, so it leaves them out.

The plots are PNG files under ``plots/``, which report.md links; report.html embeds the same
bytes as data: URIs, so the page is one file that can be mailed or attached to a CI run.
matplotlib is imported here only (``pip install 'core[report]'``).

Everything a report shows comes from the database, so all of it is treated as untrusted text:
both renderings escape it (Markdown too: no raw HTML, no table or code-span breakage), file
names are slugs of the sweep names and must stay inside the output directory, and the files
are written whole or not at all (see :func:`write_report`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from core.base.files import OutputError, check_writable, describe_os_error, write_atomically
from core.base.results import RunResult
from core.report.analysis import (
    group_series,
    is_inference,
    option_names,
    pareto_front,
    power_traces,
    scaling_points,
    series_label,
    varying_options,
)
from core.report.compare import ComparisonRequest, SourcedCell, comparison_blocks
from core.report.document import (
    _TEXT_CHARS,
    PLOTS_DIRECTORY,
    REPORT_HTML,
    REPORT_MARKDOWN,
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
    _checked_file_name,
    clean_text,
    format_number,
    format_percent,
    list_names,
    markdown_block,
    markdown_code,
    markdown_text,
    one_line,
    render_html,
    render_markdown,
    shorten,
    sweep_slugs,
)
from core.report.extensions import plugin_sections
from core.report.overview import overview_blocks
from core.report.plots import _pyplot, count_label, plot_against_batch, plot_pareto, plot_power_traces, plot_scaling
from core.report.references import check_own_references
from core.report.roof_sources import RoofRequest, make_request, roofs_in_force, with_measured
from core.report.sections import environment_table, sweep_section
from core.report.singles import SINGLE_RUNS_TITLE, single_runs_section
from core.report.tables import batch_table, cells_table, inference_table, loadgen_verdict
from core.report.to_train import TrainingPlan, time_to_train_measure, training_blocks
from core.storage.store import ResultStore
from core.storage.summary import CellSummary, summarise
from core.sweep.reference import SweptReference

# The package's modules, by concern (this one writes the files):
#   document  blocks, escaping, Markdown and HTML rendering, safe file names
#   analysis  what varies in a sweep, its series
#   plots     the PNG plots (matplotlib is imported there only) and the data they draw
#   tables    the cells tables (training; inference) and throughput by batch size
#   sections  one sweep's section: tables, plots or why not, failures
#   references  the papers' figures (and a user's own) beside the measured ones
__all__ = [
    "RoofRequest",
    "PLOTS_DIRECTORY",
    "REPORT_HTML",
    "REPORT_MARKDOWN",
    "Block",
    "Code",
    "Figure",
    "Heading",
    "Paragraph",
    "Preformatted",
    "ReportError",
    "ReportFiles",
    "ReportWriteError",
    "ComparisonRequest",
    "TrainingPlan",
    "Table",
    "Value",
    "batch_table",
    "build_report",
    "cells_table",
    "check_report_output",
    "clean_text",
    "count_label",
    "environment_table",
    "format_number",
    "format_percent",
    "group_series",
    "inference_table",
    "is_inference",
    "list_names",
    "loadgen_verdict",
    "markdown_block",
    "markdown_code",
    "markdown_text",
    "one_line",
    "option_names",
    "pareto_front",
    "plot_against_batch",
    "plot_pareto",
    "plot_power_traces",
    "plot_scaling",
    "power_traces",
    "render_html",
    "render_markdown",
    "scaling_points",
    "select_sources",
    "select_sweeps",
    "series_label",
    "shorten",
    "store_warnings",
    "sweep_section",
    "sweep_slugs",
    "varying_options",
    "write_report",
    "write_report_files",
]

# --- the report ---------------------------------------------------------------------------------


class ReportWriteError(OutputError):
    """The report was built but could not be written; the output directory was left as it was."""


@dataclass(frozen=True)
class ReportFiles:
    markdown: Path
    html: Path
    plots: list[Path]
    warnings: list[str] = field(default_factory=list)  # skipped database rows, plugin sections left out


_MAX_WARNINGS = 50  # shown in a report; the rest are counted


def store_warnings(store: ResultStore) -> list[str]:
    """The rows the store skipped so far because they cannot be parsed (``ResultStore.skipped_rows``),
    each as one line of text."""
    return [one_line(row) for row in getattr(store, "skipped_rows", ())]


def _nothing_to_report(where: str) -> ReportError:
    return ReportError(
        f"{where} no sweeps or single runs to report; run `core sweep FILE` or `core run ... --database` first"
    )


def select_sweeps(store: ResultStore, sweeps: Sequence[str] | None = None) -> list[str]:
    """The sweeps to report: those asked for, which must exist, else all of them (none where the
    database has only single runs, which the report shows without ``sweeps``)."""
    known = store.sweep_names()
    missing = [name for name in sweeps or () if not store.matching_sweeps(name)]
    if missing:
        raise ReportError(
            f"no sweep named {', '.join(repr(n) for n in missing)} in {store.path}; it has: {list_names(known)}"
        )
    names = _recorded_names(store, sweeps) if sweeps else known
    if not names and not store.count_single_runs():
        raise _nothing_to_report(f"{store.path} has")
    return names


def _recorded_names(store: ResultStore, sweeps: Sequence[str]) -> list[str]:
    """The names asked for as the database spells them (a decomposed "é" finds the composed one)."""
    return list(dict.fromkeys(known for name in sweeps for known in store.matching_sweeps(name)))


def _read_section(
    store: ResultStore,
    name: str,
    slug: str,
    training: TrainingPlan | None = None,
    references: Sequence[SweptReference] = (),
) -> tuple[list[Block], list[CellSummary]]:
    """One sweep's section and its cells; a sweep whose rows cannot be summarised is a note, not the
    end of the report. A damaged database is a ``StoreError`` that ends the report: a report
    that left out what the file could not give would look whole."""
    try:
        cells = summarise(store.runs(sweep=name))
    except ValueError as error:
        return [
            Heading(2, f"Sweep {shorten(one_line(name))}"),
            Paragraph(
                f"The runs of this sweep could not be read from the database, so it is left out: "
                f"{type(error).__name__}: {shorten(one_line(error))}."
            ),
        ], []
    notes: list[Block] = []
    try:
        record = store.sweep(name)
    except (ValueError, TypeError, KeyError) as error:
        record = None
        notes.append(
            Paragraph(
                f"The sweep's settings could not be read from the database ({type(error).__name__}: "
                f"{shorten(one_line(error))}); refused and missing cells are not shown."
            )
        )
    own = [reference for reference in references if reference.sweep == name]
    blocks = sweep_section(name, cells, record, store.path, slug, references=own)
    if training is not None:
        blocks = _before_environment(blocks, _training_blocks(cells, training, slug))
    return blocks[:1] + notes + blocks[1:], cells


def _training_blocks(cells: Sequence[CellSummary], training: TrainingPlan, slug: str) -> list[Block]:
    """Time and energy to train for the sweep's training cells (inference trains nothing)."""
    trained = [cell for cell in cells if not is_inference(cell)]
    if not trained:
        return []
    title = "Time and energy to train (estimate)"
    return training_blocks(title, trained, varying_options(trained), training, slug)


def _before_environment(blocks: list[Block], extra: list[Block]) -> list[Block]:
    """``extra`` inserted before the section's closing environment table (at the end if it has none)."""
    index = next(
        (i for i, block in enumerate(blocks) if isinstance(block, Heading) and block.text == "Environment"),
        len(blocks),
    )
    return blocks[:index] + extra + blocks[index:]


def _warning_blocks(warnings: Sequence[str]) -> list[Block]:
    if not warnings:
        return []
    blocks: list[Block] = [
        Heading(2, "Database warnings"),
        Paragraph(f"{len(warnings)} rows of the database could not be read and are left out of this report:"),
    ]
    blocks += [Paragraph(shorten(warning, 4 * _TEXT_CHARS)) for warning in warnings[:_MAX_WARNINGS]]
    if len(warnings) > _MAX_WARNINGS:
        blocks.append(Paragraph(f"... and {len(warnings) - _MAX_WARNINGS} more."))
    return blocks


def _stores(stores: ResultStore | Sequence[ResultStore]) -> list[ResultStore]:
    return [stores] if isinstance(stores, ResultStore) else list(stores)


def select_sources(stores: Sequence[ResultStore], sweeps: Sequence[str] | None = None) -> list[list[str]]:
    """The sweeps to report of each database: with one database, :func:`select_sweeps`; with several,
    those asked for that each one has (every one of them must be in some database), else all."""
    if len(stores) == 1:
        return [select_sweeps(stores[0], sweeps)]
    check_named_once([store.path for store in stores])
    missing = [name for name in sweeps or () if not any(store.matching_sweeps(name) for store in stores)]
    if missing:
        raise ReportError(
            f"no sweep named {', '.join(repr(n) for n in missing)} in any of "
            f"{', '.join(str(store.path) for store in stores)}"
        )
    selected = [_recorded_names(store, sweeps) if sweeps else store.sweep_names() for store in stores]
    if not any(selected) and (sweeps or not any(store.count_single_runs() for store in stores)):
        raise _nothing_to_report("none of the databases has")
    return selected


def check_named_once(paths: Sequence[str | Path]) -> None:
    """Refuse one database file named twice (``a/core.db ./a/core.db``, a link to it, a hard link),
    naming the paths as given and the file they both are."""
    seen: dict[object, str | Path] = {}
    for path in paths:
        identity = _file_identity(Path(path))
        if identity in seen:
            first = seen[identity]
            raise ReportError(
                f"results database {first} and {path} are the same file ({Path(path).resolve()}); name each once"
            )
        seen[identity] = path


def _file_identity(path: Path) -> object:
    """What tells one file from another: its device and inode (links and other spellings alike),
    else, where it cannot be read, its resolved path."""
    try:
        status = path.stat()
    except OSError:
        return str(path.resolve())
    return (status.st_dev, status.st_ino)


def database_labels(paths: Sequence[Path]) -> list[str]:
    """A short name for each database that tells it from the others: its file stem, with as many
    of its folders in front as it takes (``a/core.db`` and ``b/core.db``, each host's default
    name, are ``a-core`` and ``b-core``); by position where even whole paths do not differ."""
    parts = [(*path.absolute().parent.parts[1:], path.stem) for path in paths]
    for depth in range(1, max(len(part) for part in parts) + 1):
        labels = ["-".join(part[-depth:]) for part in parts]
        if len({label.lower() for label in labels}) == len(labels):  # case-insensitive file systems too
            return labels
    return [f"database{position + 1}" for position in range(len(paths))]


def _section_slugs(stores: Sequence[ResultStore], selected: Sequence[Sequence[str]]) -> list[dict[str, str]]:
    """File-name slugs of each database's sweeps: the sweep's own with one database, else the
    database's label and the sweep (two databases often hold sweeps of the same name)."""
    if len(stores) == 1:
        return [sweep_slugs(selected[0])]
    labels = database_labels([store.path for store in stores])
    qualified = [[f"{label}-{name}" for name in names] for label, names in zip(labels, selected)]
    slugs = sweep_slugs([slug for names in qualified for slug in names])
    return [{name: slugs[slug] for name, slug in zip(names, slugs_of)} for names, slugs_of in zip(selected, qualified)]


def build_report(
    store: ResultStore | Sequence[ResultStore],
    sweeps: Sequence[str] | None = None,
    training: TrainingPlan | None = None,
    comparison: ComparisonRequest | None = None,
    references: Sequence[SweptReference] = (),
) -> tuple[str, list[Block]]:
    """The report's title and blocks: one section per sweep of each database, and where two
    platforms or hosts ran the same configurations, their comparison first (see compare.py);
    the sections plugins add (core_report_sections) last. ``references``: the user's own published
    figures (``core report --reference``), each shown in the section of the sweep it names."""
    title, blocks, _ = _build_report(store, sweeps, training, comparison, references)
    return title, blocks


def _planned_cells(stores: Sequence[ResultStore], selected: Sequence[Sequence[str]]) -> dict[str, list[dict[str, Any]]]:
    """Each reported sweep's planned cells as its record lists them (none where it has no record)."""
    planned: dict[str, list[dict[str, Any]]] = {}
    for one, names in zip(stores, selected):
        for name in names:
            try:
                record = one.sweep(name)
            except (ValueError, TypeError, KeyError):  # the section says the record is unreadable
                record = None
            cells = record.cells if record is not None and isinstance(record.cells, list) else []
            planned.setdefault(name, []).extend(cell for cell in cells if isinstance(cell, dict))
    return planned


def _build_report(
    store: ResultStore | Sequence[ResultStore],
    sweeps: Sequence[str] | None = None,
    training: TrainingPlan | None = None,
    comparison: ComparisonRequest | None = None,
    references: Sequence[SweptReference] = (),
) -> tuple[str, list[Block], list[str]]:
    """:func:`build_report`, and the warnings of the plugin sections it left out."""
    stores = _stores(store)
    selected = select_sources(stores, sweeps)
    if references:
        check_own_references(references, _planned_cells(stores, selected))
    _pyplot()  # fail before any work when matplotlib is missing, plots or not
    sections: list[Block] = []
    sourced: list[SourcedCell] = []
    singles: list[int] = []
    single_cells: list[CellSummary] = []
    single_results: list[RunResult] = []  # for the plugins' sections: every run the report covers
    labels = database_labels([one.path for one in stores]) if len(stores) > 1 else [""]
    for one, names, slugs, label in zip(stores, selected, _section_slugs(stores, selected), labels):
        for name in names:
            section, cells = _read_section(one, name, slugs[name], training, references)
            if len(stores) > 1 and isinstance(section[0], Heading):
                section[0] = Heading(2, f"{section[0].text} ({shorten(one_line(one.path), 120)})")
            sections += section
            sourced += [SourcedCell(cell, str(one.path), name) for cell in cells]
        # --sweep chooses sweeps: single runs belong to none.
        single = summarise(one.runs(single=True)) if not sweeps else []
        singles.append(len(single))
        single_cells += single
        single_results += [run.result for cell in single for run in cell.runs]
        section = single_runs_section(single, one.path, f"-{label}" if label else "")
        if section and len(stores) > 1:
            section[0] = Heading(2, f"{SINGLE_RUNS_TITLE} ({shorten(one_line(one.path), 120)})")
        sections += section
    extra = [time_to_train_measure(training)] if training is not None else []
    compared = comparison_blocks(sourced, comparison or ComparisonRequest(), extra)
    generated = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    sources: list[Inline] = []
    for one, names, count in zip(stores, selected, singles):
        sources += ["; " if sources else "", Code(str(one.path))]
        listed = ", ".join(shorten(one_line(name), 80) for name in names)
        sources.append(f": sweeps {listed}" if listed else ": none asked for" if sweeps else ": no sweeps")
        if count:
            sources.append(f" and {count} single run{'' if count == 1 else 's'}")
    blocks: list[Block] = [Paragraph(f"Generated {generated} from ", *sources, ".")]
    warnings = [warning for one in stores for warning in store_warnings(one)]
    swept = [run.result for one in sourced for run in one.cell.runs]
    runs = sorted([*swept, *single_results], key=lambda result: result.started_at)
    figures = [block.file_name for block in [*compared, *sections] if isinstance(block, Figure)]
    extensions, left_out = plugin_sections(runs, figures)
    swept_cells = [one.cell for one in sourced]
    overview = overview_blocks(
        swept_cells + single_cells, sum(len(names) for names in selected), len(single_cells), len(warnings)
    )
    return (
        "core benchmark report",
        blocks + overview + _warning_blocks(warnings) + compared + sections + extensions,
        left_out,
    )


def check_report_output(output: str | Path) -> None:
    """Refuse, before any work, an output directory the report cannot be written to.

    Creates the directory (and its parents) when it is missing.

    :raises OutputError: naming the path and the reason.
    """
    output = Path(output)
    if output.exists() and not output.is_dir():
        raise OutputError(f"report output {output} is a file; give a directory for report.md, report.html and plots/")
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
    for name in (name for figure in figures for name in figure.files):
        target = plots_directory / _checked_file_name(name)
        if Path(os.path.normpath(target)).parent != Path(os.path.normpath(plots_directory)):
            raise ReportError(f"refusing to write {target}: outside {plots_directory}")
        os.replace(staging / name, target)
        plots.append(target)
    for name in (REPORT_MARKDOWN, REPORT_HTML):
        os.replace(staging / name, output / name)
    return plots


def write_report_files(output: str | Path, title: str, blocks: Sequence[Block]) -> list[Path]:
    """Write report.md, report.html and the plots (each as PNG, SVG and PDF) under ``output``, all
    of them or none.

    Every file is first written (and flushed to disk) in a hidden staging directory inside
    ``output``; only when all are whole are they renamed into place. A failure (a full disk)
    removes the staging directory and leaves ``output`` as it was. Plots of earlier reports that
    this one does not replace are left alone. Returns the plots' paths.

    :raises ReportWriteError: when a file cannot be written.
    """
    output = Path(output)
    figures = [block for block in blocks if isinstance(block, Figure)]
    names = [_checked_file_name(name).lower() for figure in figures for name in figure.files]
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
                for name, content in figure.files.items():
                    write_atomically(staging / name, content, "report plot")
            for name, text in documents.items():
                write_atomically(staging / name, text, "report file")
        except OutputError as error:
            reason = describe_os_error(error.__context__) if isinstance(error.__context__, OSError) else str(error)
            raise ReportWriteError(
                f"cannot write the report in {output}: {reason}; nothing in it was changed"
            ) from None
        try:
            return _commit(staging, output, figures)
        except OSError as error:  # a rename refused: rare (the checks ran), but then say what is left
            raise ReportWriteError(
                f"cannot move the report into {output}: {describe_os_error(error)}; the report "
                "there may be incomplete: run `core report` again"
            ) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def write_report(
    database: str | Path | ResultStore | Sequence[str | Path | ResultStore],
    output: str | Path,
    sweeps: Sequence[str] | None = None,
    training: TrainingPlan | None = None,
    comparison: ComparisonRequest | None = None,
    references: Sequence[SweptReference] = (),
    roofs: RoofRequest | None = None,
) -> ReportFiles:
    """Write report.md, report.html and plots/*.png (each with .svg and .pdf) under ``output``; returns their paths.

    ``database`` is one database or several (their sweeps side by side, and compared where they
    ran the same configurations on different platforms or hosts). The output directory is checked
    before any plot is drawn (:class:`~core.base.files.OutputError`), and the files are written
    whole or not at all (:class:`ReportWriteError`). ``references``: the user's own published figures
    (:func:`core.sweep.reference.load_reference_file`), refused before any work where one names a
    sweep the report does not cover or matches none of its planned cells.
    """
    output = Path(output)
    given = [database] if isinstance(database, (str, Path, ResultStore)) else list(database)
    stores: list[ResultStore] = []
    # Folders this report may create (plots/, the output, missing parents), innermost first.
    created = [directory for directory in (output / PLOTS_DIRECTORY, output, *output.parents) if not directory.exists()]
    try:
        # As typed (a/core.db, ./a/core.db), before ResultStore's Path makes them one spelling.
        check_named_once([one.path if isinstance(one, ResultStore) else one for one in given])
        for one in given:
            stores.append(one if isinstance(one, ResultStore) else ResultStore(one, create=False))
        select_sources(stores, sweeps)
        _pyplot()
        check_report_output(output)
        # The rooflines' request, with the roofs `core roofs` recorded in any of the databases.
        request = with_measured(roofs or make_request(), [one.host_roofs() for one in stores])
        with roofs_in_force(request):
            title, blocks, left_out = _build_report(stores, sweeps, training, comparison, references)
        # A database of which every run read was damaged would give a report without its sweeps.
        damaged = next((problem for one in stores if (problem := one.unreadable()) is not None), None)
        if damaged is not None:
            raise ReportError(damaged)
        warnings = [warning for one in stores for warning in store_warnings(one)] + left_out + request.notes
        plots = write_report_files(output, title, blocks)
    except BaseException:
        _remove_empty_directories(created)
        raise
    finally:
        for store in stores:
            if not any(store is one for one in given):  # opened here: closed here
                store.close()
    return ReportFiles(markdown=output / REPORT_MARKDOWN, html=output / REPORT_HTML, plots=plots, warnings=warnings)


def _remove_empty_directories(directories: Sequence[Path]) -> None:
    """Undo the folders this report created when it failed: only where they are still empty."""
    for directory in directories:
        try:
            directory.rmdir()
        except OSError:
            pass
