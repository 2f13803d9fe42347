"""Sub-commands of ``core`` that plugins add (``core_register_commands``), as llm's
``register_commands(cli)`` and datasette's ``register_commands`` do for theirs.

A plugin hands core a :class:`Command`; core validates it when the plugin loads (a name no built-in
command and no other plugin uses), adds it to ``core``'s argument parser and calls it when it is
invoked. Nothing here imports argparse's users or a framework: ``core --help`` lists plugin
commands without running any of their code beyond the registration hook.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from dataclasses import dataclass

#: the commands of core itself: no plugin may register one of these names (core/cli/__init__.py's table of
#: commands is checked against it by tests/test_extensions.py)
BUILTIN_COMMANDS = frozenset(
    {"run", "machines", "plugins", "devices", "workloads", "sweep", "report", "results", "roofs"}
)

#: a command's name as typed after ``core``: lower-case letters, digits and '-', starting with a letter
COMMAND_NAME = re.compile(r"[a-z][a-z0-9-]{0,39}")


@dataclass(frozen=True)
class Command:
    """A ``core`` sub-command a plugin adds.

    :param name: what the user types after ``core`` (``core gaudi-info``).
    :param help: one line for ``core --help``.
    :param run: called with the parsed arguments when the command is invoked; returns the exit
        status (None: 0). Import what the command needs (a framework, an SDK) inside it: ``core
        --help`` must stay light. An exception it raises is reported against the plugin (exit 1);
        a :class:`core.plugin.ConfigError` is bad input (exit 2).
    :param add_arguments: called with the command's own ``argparse.ArgumentParser`` to add its
        arguments; ``--debug`` is core's and may not be redefined.
    :param description: the text of ``core NAME --help`` (default: ``help``).
    """

    name: str
    help: str
    run: Callable[[argparse.Namespace], int | None]
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None
    description: str | None = None


def command_problem(command: Command) -> str | None:
    """What is wrong with a registered command, or None: checked when its plugin registers it."""
    if not COMMAND_NAME.fullmatch(command.name):
        return (
            f"command name {command.name!r} is not lower-case letters, digits and '-' starting with a letter "
            "(at most 40 characters)"
        )
    if command.name in BUILTIN_COMMANDS:
        return f"command {command.name!r} is a built-in command of core; choose another name"
    if not isinstance(command.help, str):
        return f"command {command.name!r}: help is {type(command.help).__name__}, not text"
    if not callable(command.run):
        return f"command {command.name!r}: run is not callable"
    if command.add_arguments is not None and not callable(command.add_arguments):
        return f"command {command.name!r}: add_arguments is neither None nor callable"
    if command.description is not None and not isinstance(command.description, str):
        return f"command {command.name!r}: description is {type(command.description).__name__}, not text"
    return None
