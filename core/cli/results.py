"""``core results``: the results database queried (``--sweep``, ``--status``) as a summary of cells
or exported whole (CSV, JSON, Parquet) to stdout or ``--output``, written whole or not at all."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from core.cli.errors import FAULT, error
from core.cli.sweep_arguments import DATABASE_HELP
from core.cli.text import format_cells

if TYPE_CHECKING:
    from core.storage.store import ResultStore


def add_results_arguments(results: argparse.ArgumentParser) -> None:
    results.add_argument("--database", type=Path, help=DATABASE_HELP)
    results.add_argument("--sweep", help="only this sweep")
    results.add_argument("--status", help="only runs in this state (ok, oom, error, timeout, ...)")
    results.add_argument(
        "--format",
        choices=("summary", "csv", "json", "parquet"),
        default="summary",
        help="summary (cells with median and spread; default), csv or json (one row per run), parquet",
    )
    results.add_argument("--output", type=Path, help="write to this file (required for parquet)")


def _check_status(status: str | None) -> None:
    """An unknown --status is an error listing the states a run can end in."""
    from core.base.errors import CoreError, did_you_mean
    from core.base.results import RunState

    allowed = [state.value for state in RunState]
    if status is not None and status not in allowed:
        hint = did_you_mean(status, allowed)
        raise CoreError(f"unknown --status {status!r}{hint}; a run's status is one of: {', '.join(allowed)}")


def _check_sweep(sweep: str | None, store: ResultStore) -> None:
    """An unknown --sweep is an error listing the sweeps in the database."""
    from core.base.errors import CoreError, did_you_mean
    from core.report import list_names

    if sweep is not None and not store.matching_sweeps(sweep):  # "é" composed or not, as --name
        names = store.sweep_names()
        hint = did_you_mean(sweep, names)
        raise CoreError(f"no sweep named {sweep!r}{hint} in {store.path}; it has: {list_names(names)}")


def _content(args: argparse.Namespace, store: ResultStore) -> tuple[str | bytes, int]:
    """The export of the runs --sweep and --status select, whole, in memory: (text or Parquet bytes, runs in it)."""
    import io
    import tempfile

    from core.storage.summary import summarise

    if args.format == "summary":
        cells = summarise(store.runs(sweep=args.sweep, status=args.status))
        return format_cells(cells, sweep_column=True) + "\n", sum(cell.repeats_recorded for cell in cells)
    if args.format == "parquet":
        # pyarrow writes to a path: a private temporary one beside the output, read back whole.
        with tempfile.TemporaryDirectory(prefix=".core-results-", dir=args.output.parent) as directory:
            path = Path(directory) / "runs.parquet"
            rows = store.export_parquet(path, sweep=args.sweep, status=args.status)
            return path.read_bytes(), rows
    stream = io.StringIO()
    export = store.export_csv if args.format == "csv" else store.export_json
    rows = export(stream, sweep=args.sweep, status=args.status)
    return stream.getvalue(), rows


def command_results(args: argparse.Namespace) -> int:
    from core.base.errors import CoreError
    from core.base.files import OutputError, check_writable, describe_os_error, write_atomically
    from core.report import store_warnings
    from core.storage.store import ResultStore, default_database

    database = args.database or default_database()
    if args.format == "parquet" and args.output is None:
        return error("--format parquet needs --output FILE")
    try:
        _check_status(args.status)
        with ResultStore(database, create=False) as store:
            _check_sweep(args.sweep, store)
            if args.output is not None:
                check_writable(args.output, "--output")  # before the query: a bad path costs nothing
            content, rows = _content(args, store)
            warnings = store_warnings(store)
            damaged = store.unreadable()
        if damaged is not None:  # every run asked for skipped: an empty listing would hide the damage
            for warning in warnings:
                print(f"core: warning: {warning}", file=sys.stderr)
            return error(damaged)
    except CoreError as problem:  # a bad filter or path, no or a damaged database, a missing library: nothing written
        return error(str(problem))
    except OSError as problem:  # the Parquet export's temporary file
        return error(f"cannot export to {args.output}: {describe_os_error(problem)}", code=FAULT)
    for warning in warnings:
        print(f"core: warning: {warning}", file=sys.stderr)
    if rows == 0:
        from core.report import list_names

        filters = (("sweep", args.sweep), ("status", args.status))
        asked = " ".join(f"--{key} {list_names([value])}" for key, value in filters if value is not None)
        print(f"core: no runs in {database}" + (f" match {asked}" if asked else ""), file=sys.stderr)
    if args.output is None:
        sys.stdout.write(content if isinstance(content, str) else "")
        return 0
    try:
        write_atomically(args.output, content, "--output")
    except OutputError as problem:
        return error(str(problem), code=FAULT)
    if args.format != "summary":
        print(f"wrote {rows} runs to {args.output}", file=sys.stderr)
    return 0
