"""The papers' numbers beside a sweep's own: one table per sweep of its published reference figures
(the sweep file's ``[[reference]]`` tables, as the database recorded them, and a user's own from
``core report --reference``), each against the median of every cell it matches, in the paper's unit.

The recorded document is untrusted: each reference in it is validated again, and one that does not
validate is named, not shown.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from core.base.config import config_errors
from core.report.document import Block, Heading, Paragraph, ReportError, Table, Value, format_number, one_line, shorten
from core.storage.summary import CellSummary
from core.sweep.reference import Reference, in_paper_unit, matches

_MAX_CELLS = 12  # rows of one reference; the rest are counted
_NOTE_CHARS = 600  # of an assumptions note in the table (the sweep file has all of it)
_CITATION_CHARS = 600
_FROM_FILE = "sweep file"
_FROM_OPTION = "--reference"

_COLUMNS = [
    ("paper", "paper"),
    ("where", "table, row"),
    ("cell", "cell"),
    ("paper_value", "paper's value"),
    ("measured", "measured (median, paper's unit)"),
    ("ratio", "measured / paper"),
    ("status", "how the cell went"),
    ("assumptions", "assumptions (below)"),
    ("source", "from"),
]


@dataclass(frozen=True)
class _Candidate:
    """A cell a reference may match: planned (with its options), measured, or both."""

    key: str
    label: str
    options: Mapping[str, Any]
    refused: str | None
    cell: CellSummary | None


def recorded_references(spec: Mapping[str, Any]) -> tuple[list[Reference], list[str]]:
    """The references a sweep's recorded document holds, and a note for each that does not validate."""
    entries = spec.get("reference")
    if entries is None:
        return [], []
    if not isinstance(entries, list):
        return [], ["the recorded references are not a list, so none is shown"]
    references: list[Reference] = []
    problems: list[str] = []
    for position, entry in enumerate(entries):
        try:
            references.append(Reference.model_validate(entry))
        except ValidationError as error:
            described = "; ".join(
                f"{problem.field}: {problem.allowed}"
                for problem in config_errors(error, Reference, unknown="unknown key", prefix=f"reference.{position}")
            )
            problems.append(shorten(one_line(described)))
    return references, problems


def _candidates(planned: Sequence[Mapping[str, Any]], cells: Sequence[CellSummary]) -> list[_Candidate]:
    """Every planned cell with its measured one where it ran, then measured cells the plan lacks
    (a database without the sweep's record), matched by their configuration."""
    measured = {cell.cell_key: cell for cell in cells}
    candidates: list[_Candidate] = []
    for entry in planned:
        key, options = entry.get("key"), entry.get("options")
        if not isinstance(key, str) or not isinstance(options, Mapping):
            continue
        refused = entry.get("invalid_reason")
        label = entry.get("label")
        candidates.append(
            _Candidate(
                key,
                label if isinstance(label, str) else key,
                options,
                refused if isinstance(refused, str) and refused else None,
                measured.pop(key, None),
            )
        )
    for cell in measured.values():
        candidates.append(_Candidate(cell.cell_key, cell.label, cell.config.model_dump(mode="json"), None, cell))
    return candidates


def _ratio(measured: float | None, value: float) -> Value:
    if measured is None or not math.isfinite(measured):
        return Value("n/a")
    ratio = measured / value
    return Value(format_number(ratio), ratio)


def _status(candidate: _Candidate, measured: float | None, quantity: str) -> str:
    cell = candidate.cell
    if cell is None:
        return "refused by validation: " + shorten(one_line(candidate.refused)) if candidate.refused else "not run yet"
    if cell.status != "ok":
        return f"failed ({cell.status})"
    return "ok" if measured is not None else f"ok, but no {quantity} figure"


def _measured(candidate: _Candidate, reference: Reference) -> float | None:
    cell = candidate.cell
    if cell is None or cell.status != "ok":
        return None
    figure = cell.figure(reference.quantity)
    if not isinstance(figure, (int, float)) or isinstance(figure, bool) or not math.isfinite(figure):
        return None
    return in_paper_unit(float(figure), reference.quantity, reference.unit)


def _note_label(reference: Reference, notes: dict[str, str]) -> str:
    """The label (A1, A2, ...) of the reference's assumptions, listed once under the table: a
    file's references mostly share one long note, which repeated in every row hid the figures."""
    text = shorten(one_line(reference.assumptions or "not stated"), _NOTE_CHARS)
    return notes.setdefault(text, f"A{len(notes) + 1}")


def _rows(
    reference: Reference, candidates: Sequence[_Candidate], source: str, notes: dict[str, str]
) -> list[list[Value]]:
    matched = [candidate for candidate in candidates if matches(reference.match, candidate.options)]
    where = reference.table + (f", {reference.row}" if reference.row else "")
    common = {
        "paper": Value(shorten(one_line(reference.paper))),
        "where": Value(shorten(one_line(where))),
        "paper_value": Value(f"{format_number(reference.value)} {one_line(reference.unit)}", reference.value),
        "assumptions": Value(_note_label(reference, notes)),
        "source": Value(source),
    }
    if not matched:
        row = {
            **common,
            "cell": Value("none"),
            "measured": Value("n/a"),
            "ratio": Value("n/a"),
            # A --toy sweep shrinks its cells (batch, model), so the paper's options match none of them.
            "status": Value("no cell of this sweep has these options (a --toy sweep's cells are shrunk)"),
        }
        return [[row[name] for name, _ in _COLUMNS]]
    rows = []
    for candidate in matched[:_MAX_CELLS]:
        measured = _measured(candidate, reference)
        row = {
            **common,
            "cell": Value(shorten(one_line(candidate.label))),
            "measured": Value(
                "n/a" if measured is None else f"{format_number(measured)} {one_line(reference.unit)}", measured
            ),
            "ratio": _ratio(measured, reference.value),
            "status": Value(_status(candidate, measured, reference.quantity)),
        }
        rows.append([row[name] for name, _ in _COLUMNS])
    if len(matched) > _MAX_CELLS:
        more = {**common, "cell": Value(f"and {len(matched) - _MAX_CELLS} more cells")}
        rows.append([more.get(name, Value("")) for name, _ in _COLUMNS])
    return rows


def reference_blocks(
    spec: Mapping[str, Any],
    planned: Sequence[Mapping[str, Any]],
    cells: Sequence[CellSummary],
    slug: str,
    own: Sequence[Reference] = (),
) -> list[Block]:
    """The sweep's published figures beside its measured ones: nothing where it has none.

    :param spec: the sweep's recorded document, whose ``reference`` list is read (and validated).
    :param own: the user's references for this sweep (``core report --reference``).
    """
    recorded, problems = recorded_references(spec)
    if not recorded and not own and not problems:
        return []
    candidates = _candidates(planned, cells)
    everyone = [*recorded, *own]
    if everyone and not any(matches(ref.match, one.options) for ref in everyone for one in candidates):
        # A --toy sweep shrinks its cells (batch, model, devices): a row per figure would say so each time.
        return [
            Heading(3, "Published figures beside these results"),
            Paragraph(
                f"None of the {len(everyone)} published figures the sweep carries matches one of its cells "
                "(a --toy sweep's cells are shrunk, so they match none), so none is compared."
            ),
            *[Paragraph(f"A recorded reference is not shown: {problem}.") for problem in problems],
        ]
    notes: dict[str, str] = {}  # assumptions text -> its label, in the order the rows name them
    rows = [row for reference in recorded for row in _rows(reference, candidates, _FROM_FILE, notes)]
    rows += [row for reference in own for row in _rows(reference, candidates, _FROM_OPTION, notes)]
    blocks: list[Block] = [
        Heading(3, "Published figures beside these results"),
        Paragraph(
            "Each row is a figure a paper (or you) published and the median of a cell it matches over "
            "its successful repeats, converted into the paper's unit; the ratio is measured / paper. "
            "The assumptions (listed under the table) say what separates the paper's measurement from "
            "core's: read a ratio with them."
        ),
    ]
    if rows:
        blocks.append(Table(columns=list(_COLUMNS), rows=rows, identifier=f"references-{slug}"))
    blocks += [Paragraph(f"{label}: {text}") for text, label in notes.items()]
    citations = dict.fromkeys((reference.paper, reference.citation) for reference in everyone if reference.citation)
    if citations:
        cited = "; ".join(f"{one_line(paper)}: {one_line(citation)}" for paper, citation in citations)
        blocks.append(Paragraph(shorten("Cited: " + cited, 4 * _CITATION_CHARS) + "."))
    blocks += [Paragraph(f"A recorded reference is not shown: {problem}.") for problem in problems]
    return blocks


def check_own_references(references: Sequence[Any], sweeps: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
    """Refuse, before any work, a ``--reference`` entry naming a sweep the report does not cover or
    matching none of its planned cells.

    :param references: the file's :class:`~core.sweep.reference.SweptReference` entries.
    :param sweeps: each reported sweep's planned cells (empty where the database has no record).
    """
    for position, reference in enumerate(references):
        if reference.sweep not in sweeps:
            listed = ", ".join(sorted(sweeps)) or "none"
            raise ReportError(
                f"--reference: reference.{position}.sweep = {shorten(one_line(reference.sweep), 80)!r}: "
                f"not a sweep of this report; its sweeps: {shorten(listed, 600)}"
            )
        planned = [entry.get("options") for entry in sweeps[reference.sweep]]
        options = [entry for entry in planned if isinstance(entry, Mapping)]
        if options and not any(matches(reference.match, entry) for entry in options):
            raise ReportError(
                f"--reference: reference.{position}.match = {shorten(one_line(reference.match), 200)}: "
                f"no planned cell of sweep {shorten(one_line(reference.sweep), 80)!r} has these options"
            )
