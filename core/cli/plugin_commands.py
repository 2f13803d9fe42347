"""The ``core`` sub-commands plugins add (core_register_commands): their parsers, and running one
so that whatever it raises is reported against its plugin, never as a bare traceback."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from core.base.errors import ConfigError
from core.cli.argparser import CoreParser
from core.cli.errors import FAULT, config_error, error

if TYPE_CHECKING:
    from core.cli.argparser import Subcommands

# Where a plugin command's parsed arguments say which command they are for: (name, the reason it
# cannot run or None).
PLUGIN_COMMAND = "_core_plugin_command"


def add_plugin_commands(commands: Subcommands, debug: CoreParser) -> None:
    """The commands plugins registered (core_register_commands), after core's own.

    A command whose ``add_arguments`` raises, or adds an argument argparse refuses (``--debug`` is
    core's), is still listed: invoking it says why it cannot run, and every other command works.
    """
    from core.contract.manager import PluginFault, get_plugin_manager
    from core.report.document import one_line

    manager = get_plugin_manager()
    for name, registered in sorted(manager.commands.items()):
        command = registered.item
        arguments = CoreParser(add_help=False)
        try:
            with manager.plugin_code(command, f"command {name!r}: add_arguments()"):
                if command.add_arguments is not None:
                    command.add_arguments(arguments)
            # argparse's own checks (an argument clashing with --debug), before the command is listed.
            argparse.ArgumentParser(parents=[arguments, debug])
        except (PluginFault, ConfigError, argparse.ArgumentError) as problem:
            why = str(problem) if isinstance(problem, PluginFault) else f"plugin {registered.plugin!r}: {problem}"
            broken = commands.add_parser(
                name, parents=[debug], help=f"(cannot run: {one_line(why)})".replace("%", "%%")
            )
            broken.set_defaults(**{PLUGIN_COMMAND: (name, why)})
            continue
        parser = commands.add_parser(
            name,
            parents=[arguments, debug],
            help=f"{command.help} (plugin {registered.plugin})".replace("%", "%%"),  # argparse %-formats help
            description=command.description or command.help,
        )
        parser.set_defaults(**{PLUGIN_COMMAND: (name, None)})


def is_plugin_command(args: argparse.Namespace) -> bool:
    """Whether the parsed arguments are a plugin command's: told by what core set on its parser,
    never by ``args.command``, which an argument of the plugin's own could overwrite."""
    return hasattr(args, PLUGIN_COMMAND)


def plugin_command_broken(args: argparse.Namespace) -> bool:
    """Whether the arguments are for a plugin command that cannot run (it says why when invoked)."""
    return getattr(args, PLUGIN_COMMAND, (None, None))[1] is not None


def command_of_plugin(args: argparse.Namespace) -> int:
    """Run a plugin's command: what it raises is reported against the plugin, never a bare traceback."""
    from core.contract.manager import PluginFault, get_plugin_manager

    name, broken = getattr(args, PLUGIN_COMMAND)
    if broken is not None:
        return error(f"command {name!r} cannot run: {broken}", code=FAULT)
    manager = get_plugin_manager()
    command = manager.commands[name].item
    try:
        with manager.plugin_code(command, f"command {name!r}"):
            code = command.run(args)
    except ConfigError as problem:
        return config_error(problem)
    except PluginFault as fault:
        if args.debug:
            print(fault.traceback_text, file=sys.stderr, end="")
        return error(f"{fault}{'' if args.debug else ' (core --debug shows the traceback)'}", code=FAULT)
    if code is None:
        return 0
    if isinstance(code, bool) or not isinstance(code, int) or not 0 <= code <= 255:
        plugin = manager.commands[name].plugin
        return error(f"plugin {plugin!r}: command {name!r} returned {code!r}, not an exit status 0-255", code=FAULT)
    return code
