"""The ``core`` command (``core = "core.cli:main"``; ``python -m core.cli``). ``core --help``,
``core --version`` and ``core plugins`` import no framework or vendor SDK.

One module per concern: ``parser`` (the argument tree: core's commands, then the plugins'),
``argparser`` (argparse with "did you mean" and ``--version``), ``run_arguments`` (``core run``'s
flags, generated from RunConfig, in groups), ``run`` and ``dry_run`` (one run, or its plan),
``sweep`` with ``sweep_arguments``, ``sweep_display`` and ``resume``, ``report``, ``results``,
``listing`` (plugins, devices, workloads, machines), ``plugin_commands`` (the sub-commands plugins
add), ``text`` (a result and cell summaries as text) and ``errors`` (what each failure prints, and
its exit status).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from core.cli.argparser import core_version
from core.cli.dry_run import describe_plan
from core.cli.errors import describe_config_error, run_guarded
from core.cli.listing import (
    command_devices,
    command_machines,
    command_plugins,
    command_workloads,
    plugin_report,
    workload_report,
)
from core.cli.parser import build_parser, needs_plugin_commands
from core.cli.plugin_commands import command_of_plugin, is_plugin_command, plugin_command_broken
from core.cli.report import command_report
from core.cli.results import command_results
from core.cli.resume import core_program, resume_command
from core.cli.roofs import command_roofs
from core.cli.run import command_run
from core.cli.run_arguments import _OWN_SYNTAX, run_flags, run_options
from core.cli.sweep import command_sweep
from core.cli.sweep_arguments import NOT_RESUMED, RESUMED_FLAGS, SLURM_FLAGS
from core.cli.sweep_display import SweepDisplay
from core.cli.text import format_cells, format_result, text_context

#: core's own commands (core.contract.commands.BUILTIN_COMMANDS names the same: a test keeps them equal)
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": command_run,
    "machines": command_machines,
    "plugins": command_plugins,
    "devices": command_devices,
    "workloads": command_workloads,
    "sweep": command_sweep,
    "report": command_report,
    "results": command_results,
    "roofs": command_roofs,
}

# The names this module had before it became a package, which tests and plugins' tests import.
_COMMANDS = COMMANDS
_run_options = run_options
_text_context = text_context
_SweepDisplay = SweepDisplay
_RESUMED_FLAGS = RESUMED_FLAGS
_NOT_RESUMED = NOT_RESUMED
_SLURM_FLAGS = SLURM_FLAGS
_core_program = core_program
_describe_config_error = describe_config_error

__all__ = [
    "COMMANDS",
    "build_parser",
    "core_version",
    "describe_plan",
    "format_cells",
    "format_result",
    "main",
    "plugin_report",
    "resume_command",
    "run_flags",
    "workload_report",
    "_OWN_SYNTAX",
]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``core`` command with ``argv`` (default: the process's arguments); returns the exit status."""
    from core.running.progress import escaping_standard_streams

    # Everything the command prints goes through one filter (argparse's messages too): a name from a
    # database, a plugin, a file or the command line with ESC or another control character in it is
    # shown escaped, never obeyed by the terminal.
    with escaping_standard_streams():
        parser = build_parser(plugin_commands=needs_plugin_commands(argv))
        args, unrecognized = parser.parse_known_args(argv)
        if unrecognized and not plugin_command_broken(args):  # a broken plugin command says why instead
            parser.refuse_unrecognized(args, unrecognized)
        command = command_of_plugin if is_plugin_command(args) else COMMANDS[args.command]
        return run_guarded(command, args)
