"""The ``core`` command's argument tree: its sub-commands, core's own then the plugins'.

Parsing core's own commands loads no plugin and imports no framework (``core --help`` and ``core
plugins`` stay light); only a command word that is not core's, or none, loads the plugins for theirs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from core.cli.argparser import CoreParser, VersionAction
from core.cli.dry_run import MACHINE_HELP
from core.cli.listing import add_listing_commands
from core.cli.plugin_commands import add_plugin_commands
from core.cli.report import add_report_arguments
from core.cli.results import add_results_arguments
from core.cli.roofs import add_roofs_arguments
from core.cli.run_arguments import add_run_arguments, run_examples
from core.cli.sweep_arguments import add_sweep_arguments
from core.contract.commands import BUILTIN_COMMANDS

_DEBUG_HELP = "show tracebacks: where a failing run or plugin broke, and core's own errors"


def needs_plugin_commands(argv: Sequence[str] | None) -> bool:
    """Whether parsing ``argv`` needs the plugins' commands: not for one of core's own commands (``core
    results`` stays quick) nor for ``core --version``; for another word or none (``core --help``
    lists the plugins' commands)."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    words = [word for word in arguments if not word.startswith("-")]
    if words:
        return words[0] not in BUILTIN_COMMANDS
    return "--version" not in arguments


def build_parser(plugin_commands: bool = True) -> CoreParser:
    """The ``core`` command's parser; with ``plugin_commands``, the commands plugins add too (which
    loads the plugins)."""
    parser = CoreParser(prog="core", description="Run one ML workload on any accelerator and measure it.")
    parser.add_argument("--version", action=VersionAction, help="print core's version and exit")
    parser.add_argument("--debug", action="store_true", help=_DEBUG_HELP)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    # `core run ... --debug` as well as `core --debug run ...`: SUPPRESS keeps the top-level value.
    debug = CoreParser(add_help=False)
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=_DEBUG_HELP)

    run = commands.add_parser(
        "run",
        parents=[debug],
        help="run a workload and print its result",
        description="Run one workload on one accelerator and print (or store) its measured result.",
        epilog=run_examples(),
        formatter_class=argparse.RawDescriptionHelpFormatter,  # the examples keep their lines
    )
    add_run_arguments(run, MACHINE_HELP)
    add_listing_commands(commands, debug)
    sweep = commands.add_parser(
        "sweep",
        parents=[debug],
        help="run a grid of runs declared in a TOML or YAML file",
        description="Run every cell of a grid file, each repeat in its own process, "
        "and store every result. See docs/sweeps.md.",
    )
    add_sweep_arguments(sweep, MACHINE_HELP)
    report = commands.add_parser(
        "report", parents=[debug], help="write a Markdown and HTML report with plots from the database"
    )
    add_report_arguments(report)
    roofs = commands.add_parser(
        "roofs",
        parents=[debug],
        help="measure this host's memory bandwidth and matmul peaks for the report's roofline (a few seconds)",
    )
    add_roofs_arguments(roofs)
    results = commands.add_parser("results", parents=[debug], help="query or export the results database")
    add_results_arguments(results)
    if plugin_commands:
        add_plugin_commands(commands, debug)
    return parser
