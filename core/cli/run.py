"""``core run``: one run, its progress on stderr, its result printed, written to ``--output``
and stored in ``--database``; a bad path is refused before the run, so it costs nothing measured."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from core.base.errors import ConfigError
from core.cli.errors import FAULT, INTERRUPTED, config_error, error
from core.cli.run_arguments import run_options
from core.cli.text import format_result

if TYPE_CHECKING:
    from core.base.results import RunResult
    from core.running.progress import ProgressLine, RunProgress
    from core.storage.single_runs import UnrecordedRunError


def command_run(args: argparse.Namespace) -> int:
    from core.base.files import OutputError, check_writable
    from core.cli.dry_run import command_run_dry

    try:
        options = run_options(args)
    except ConfigError as problem:
        return config_error(problem)
    if args.dry_run or args.machine is not None:
        return command_run_dry(args, options)
    if args.output is not None:
        # Before the run: a bad path must not cost what the run measures.
        try:
            check_writable(args.output, "--output")
        except OutputError as problem:
            return error(str(problem))
    from core.running.progress import ProgressLine

    line = ProgressLine(enabled=not args.quiet)
    try:
        return _run_and_show(args, options, line)
    finally:
        line.clear()


def _progress(args: argparse.Namespace, options: dict[str, Any], line: ProgressLine) -> RunProgress | None:
    """The run's progress on ``line`` (on stderr: a terminal's status line, or a log's lines), unless --quiet."""
    if not line.enabled:
        return None
    from core.base.config import RunConfig
    from core.running.progress import RunProgress

    fields = RunConfig.model_fields  # their defaults where the flags were not given
    steps = options.get("steps", fields["steps"].default)
    warmup = options.get("warmup_steps", fields["warmup_steps"].default)
    return RunProgress(line, f"{args.workload} on {args.accelerator}", steps, warmup)


def _run_and_show(args: argparse.Namespace, options: dict[str, Any], line: ProgressLine) -> int:
    """core.run with the command's options, then its result shown; what ends it before a result is
    bad input (exit 2), a plugin's fault (1) or an interrupt (130)."""
    from core.api import run
    from core.contract.manager import PluginFault
    from core.running.processes import Terminated, sigterm_exits
    from core.storage.single_runs import UnrecordedRunError
    from core.storage.store import StoreError

    unrecorded: UnrecordedRunError | None = None
    try:
        # SIGTERM (a batch system's time limit, kill) stops the run the way Ctrl-C does: its
        # executor, meter, loader workers and child processes are stopped before the command exits.
        with sigterm_exits():
            result = run(
                args.workload,
                args.accelerator,
                on_progress=_progress(args, options, line),
                timeout_seconds=args.timeout_seconds,
                database=args.database,
                **options,
            )
    except UnrecordedRunError as problem:  # measured, but the database refused it: print it all the same
        unrecorded, result = problem, problem.result
    except ConfigError as problem:
        line.clear()
        return config_error(problem)
    except PluginFault as fault:
        line.clear()
        if args.debug:
            print(fault.traceback_text, file=sys.stderr, end="")
        return error(f"{fault}{'' if args.debug else ' (core --debug shows the traceback)'}")
    except StoreError as problem:  # before the run: another sweep or run holds --database
        line.clear()
        return error(str(problem))
    except KeyboardInterrupt:
        line.clear()
        print(f"core: run of {args.workload} on {args.accelerator} interrupted; nothing was recorded", file=sys.stderr)
        return INTERRUPTED
    except Terminated as stop:
        line.clear()
        print(
            f"core: run of {args.workload} on {args.accelerator} stopped by SIGTERM; nothing was recorded",
            file=sys.stderr,
        )
        return int(stop.code or 0)
    line.clear()
    return show_run_result(args, result, unrecorded)


def show_run_result(args: argparse.Namespace, result: RunResult, unrecorded: UnrecordedRunError | None) -> int:
    """Print the result, write --output, and say what could not be kept where it was asked."""
    from core.base.files import OutputError, write_atomically

    text = result.to_json()
    # The result first: whatever happens to the files, what was measured reaches the terminal.
    print(text if args.json else format_result(result))
    if args.debug and result.status.traceback:
        print(result.status.traceback, file=sys.stderr, end="")
    problems = []
    written = False
    if args.output is not None:
        try:
            write_atomically(args.output, text + "\n", "--output")
            written = True
        except OutputError as problem:
            problems.append(str(problem))
    if unrecorded is not None:
        problems.append(f"--database {args.database}: {unrecorded}")
    if problems:
        kept = (
            f"the result is in {args.output}"
            if written
            else "the result is printed above" + ("" if args.json else " (--json prints it whole)")
        )
        return error(f"{'; '.join(problems)}; {kept}", code=FAULT)
    return 0 if result.status.ok else 1
