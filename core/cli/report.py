"""``core report``: a Markdown and HTML report with plots from one or several results databases."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from core.cli.errors import FAULT, error
from core.cli.sweep_arguments import DATABASE_HELP

ROOFS_HELP = (
    "where the roofline's roofs come from: datasheet (the vendor's figures the runs recorded), machine (a "
    "shipped machine profile of the same device, e.g. a paper's Table 1; machine:NAME or machine:FILE.toml "
    "for one profile), measured (measured on the run's host: `core roofs`, or probed now for this host's "
    "CPU), or auto (default: measured, else datasheet, else machine)"
)


def add_report_arguments(report: argparse.ArgumentParser) -> None:
    report.add_argument(
        "databases",
        nargs="*",
        type=str,  # as typed: a database named twice is refused naming both spellings
        metavar="DATABASE",
        help="results databases to report together, compared where they ran the same configurations on "
        "different platforms or hosts (default: --database, else $CORE_DATABASE, else results/core.db)",
    )
    report.add_argument("--database", type=str, help=DATABASE_HELP)
    report.add_argument(
        "--epochs",
        type=int,
        help="add the estimated time and energy to train this many epochs (and the measured ones where a run "
        "did whole epochs)",
    )
    report.add_argument(
        "--epoch-definition",
        metavar="DEFINITION",
        help="with --epochs: what an epoch is (dataset, samples:N, global-batches:N, host-calls:N); default: "
        "each run's own epoch_definition",
    )
    report.add_argument(
        "--compare-ignore",
        action="append",
        default=[],
        metavar="OPTION",
        help="an option not matched when comparing platforms, which becomes part of what is compared, e.g. "
        "replicas for 1x A100 against 4x A100 (repeatable)",
    )
    report.add_argument(
        "--baseline", metavar="TEXT", help="compare against the side whose label (host: devices) contains TEXT"
    )
    report.add_argument(
        "--sweep",
        action="append",
        dest="sweeps",
        metavar="NAME",
        help="report this sweep (repeatable; default: every sweep)",
    )
    report.add_argument("--roofs", default="auto", metavar="SOURCE", help=ROOFS_HELP)
    report.add_argument(
        "--reference",
        action="append",
        dest="references",
        default=[],
        type=Path,
        metavar="FILE",
        help="a TOML (or YAML, JSON) file of published figures to show beside the measured ones: [[reference]] "
        "tables as a sweep file's, each naming its sweep (docs/sweeps.md); repeatable",
    )
    report.add_argument(
        "--output",
        type=Path,
        default=Path("results") / "report",
        help="directory for report.md, report.html and plots/ (default: results/report)",
    )


def command_report(args: argparse.Namespace) -> int:
    from core.base.errors import ConfigError
    from core.base.files import OutputError
    from core.report import ComparisonRequest, ReportError, ReportWriteError, TrainingPlan, write_report
    from core.report.roof_sources import roof_request
    from core.storage.store import StoreError, default_database
    from core.sweep.plan import describe_config_error
    from core.sweep.reference import load_reference_file
    from core.sweep.spec import SweepError

    databases = ([args.database] if args.database is not None else []) + list(args.databases)
    database = databases or [default_database()]
    if args.epoch_definition is not None and args.epochs is None:
        return error("--epoch-definition needs --epochs N")
    if args.baseline is not None and not args.baseline.strip():
        # An empty text is "in" every label: it would match every side, not name one.
        return error("--baseline '': give a text that one side's label (host: devices) contains")
    try:
        training = None if args.epochs is None else TrainingPlan(args.epochs, args.epoch_definition)
    except ValueError as problem:
        return error(f"--epochs {args.epochs} --epoch-definition {args.epoch_definition}: {problem}")
    references = []
    for path in args.references:
        try:
            references += load_reference_file(path)
        except ConfigError as problem:
            return error(f"--reference {path}: {describe_config_error(problem)}")
        except SweepError as problem:
            return error(f"--reference: {problem}")
    try:
        roofs = roof_request(args.roofs)
    except (ValueError, ConfigError) as problem:
        return error(str(problem))
    try:
        comparison = ComparisonRequest(tuple(args.compare_ignore), args.baseline)
        files = write_report(
            database, args.output, args.sweeps, training, comparison, references=references, roofs=roofs
        )
    except ReportWriteError as problem:  # after the work: the report was built, the disk refused it
        return error(str(problem), code=FAULT)
    except (ReportError, StoreError, OutputError) as problem:  # before the work, or a damaged database
        return error(str(problem))
    for warning in files.warnings:
        print(f"core: warning: {warning}", file=sys.stderr)
    print(f"wrote {files.markdown}, {files.html} and {len(files.plots)} plots in {files.markdown.parent / 'plots'}")
    return 0
