"""How ``core`` ends: what each kind of failure prints and its exit status.

Bad input (a configuration, a file, a flag) is exit 2, a fault (a run that failed, a plugin that
raised, a disk that refused a file) exit 1, an interrupt 130, SIGTERM 143 and a closed pipe 141, as a shell
reports them. A ConfigError names the ``core run`` flag that sets the field it is about.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from core.base.errors import ConfigError, shown_value

BAD_INPUT = 2
FAULT = 1
INTERRUPTED = 130  # 128 + SIGINT
TERMINATED = 143  # 128 + SIGTERM
BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a tool killed by the broken pipe

# `core run`'s arguments that are no RunConfig field, by the name core.run's errors give them.
_OTHER_RUN_FLAGS = {"database": "--database", "timeout_seconds": "--timeout-seconds"}


def error(message: str, code: int = BAD_INPUT) -> int:
    """Print ``core: error: message`` on stderr and return ``code`` (bad input by default)."""
    print(f"core: error: {message}", file=sys.stderr)
    return code


def flag_of(field: str) -> str | None:
    """The ``core run`` flag that sets ``field``: ``--batch-size``, ``-o layers`` (None: no flag)."""
    from core.cli.run_arguments import run_flags

    for prefix, short in (("workload_options.", "-o "), ("accelerator_options.", "-a "), ("loadgen.", "-l ")):
        if field.startswith(prefix):
            return short + field[len(prefix) :]
    return run_flags().get(field) or _OTHER_RUN_FLAGS.get(field)


def describe_config_error(problem: ConfigError, flags_of: Callable[[str], str | None] = flag_of) -> str:
    """One line per invalid field: its name, the flag that sets it, the value and what is allowed.

    :param flags_of: the flag that sets a field (``core run``'s by default; ``core sweep`` names its own).
    """
    errors: list[ConfigError] = getattr(problem, "errors", [problem])
    lines = []
    for each in errors:
        # A rule over several fields names each one's flag (getattr: a plugin's own subclass may lack fields).
        flags = ", ".join(flag for flag in map(flags_of, getattr(each, "fields", (each.field,))) if flag)
        lines.append(f"invalid {each.field}{f' ({flags})' if flags else ''}{shown_value(each)}: {each.allowed}")
    return "\n".join(lines)


def config_error(problem: ConfigError) -> int:
    """A ConfigError as bad input, each field named with its flag."""
    return error(describe_config_error(problem))


def run_guarded(command: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run one command: what it returns is the exit status; a closed pipe, an interrupt and an
    exception it lets through are each turned into theirs (``--debug`` shows the traceback)."""
    try:
        code = command(args)
        sys.stdout.flush()  # here, where a closed pipe can still be handled, not at interpreter exit
        return code
    except BrokenPipeError:
        # `core plugins | head`: the reader left. Point stdout at /dev/null so the interpreter's
        # final flush does not raise again, and end quietly, as other Unix tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return BROKEN_PIPE
    except KeyboardInterrupt:
        print(f"core: {args.command} interrupted", file=sys.stderr)
        return INTERRUPTED
    except Exception as raised:
        if args.debug:
            raise
        from core.base.errors import CoreError

        kind = "error" if isinstance(raised, CoreError) else f"internal error ({type(raised).__name__})"
        print(f"core: {kind}: {raised} (--debug shows the traceback)", file=sys.stderr)
        return FAULT
