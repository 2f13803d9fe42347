"""The report's section of single runs: runs stored with ``core run --database`` (or
``core.run(database=...)``), which belong to no sweep. Each is a row of its own (it has no
repeats, so no median and no spread); training and inference runs in tables apart; then their
failures and environment. No plots: single runs are no grid, nothing varies along an axis."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from core.report.analysis import is_inference
from core.report.document import Block, Code, Heading, Paragraph
from core.report.sections import SweepData, _failure_blocks, environment_table
from core.report.tables import single_runs_table
from core.report.to_target import TITLE as TO_TARGET_TITLE
from core.report.to_target import single_runs_target_table
from core.storage.summary import CellSummary

SINGLE_RUNS_TITLE = "Single runs"


def single_runs_section(cells: Sequence[CellSummary], store_path: Path, suffix: str = "") -> list[Block]:
    """The section of a database's single runs; nothing when it has none.

    :param suffix: added to the tables' identifiers where several databases are reported.
    """
    if not cells:
        return []
    states: dict[str, int] = {}
    for cell in cells:
        states[cell.status] = states.get(cell.status, 0) + 1
    blocks: list[Block] = [
        Heading(2, SINGLE_RUNS_TITLE),
        Paragraph(
            f"{len(cells)} run{'' if len(cells) == 1 else 's'} stored by ",
            Code("core run --database"),
            " ("
            + ", ".join(f"{count} {state}" for state, count in sorted(states.items()))
            + "), each on its own: a single run has no repeats, so its figures are its own, with no median "
            "or spread. Database: ",
            Code(str(store_path)),
            ".",
        ),
    ]
    training = [cell for cell in cells if not is_inference(cell)]
    inference = [cell for cell in cells if is_inference(cell)]
    both = bool(training) and bool(inference)
    if training:
        blocks += [
            *([Heading(3, f"{SINGLE_RUNS_TITLE} (training)")] if both else []),
            single_runs_table(training, f"single-runs{suffix}"),
        ]
    to_target = single_runs_target_table(training, f"single-runs-to-target{suffix}")
    if to_target is not None:  # runs trained to a target quality
        blocks += [Heading(3, f"{SINGLE_RUNS_TITLE}: {TO_TARGET_TITLE.lower()}"), to_target]
    if inference:
        blocks += [
            Heading(3, f"{SINGLE_RUNS_TITLE} (inference)"),
            single_runs_table(inference, f"single-runs-inference{suffix}", inference=True),
        ]
    data = SweepData.of(SINGLE_RUNS_TITLE, f"single-runs{suffix}", list(cells), None)
    return blocks + _failure_blocks(data) + [Heading(3, "Environment"), environment_table(cells)]
