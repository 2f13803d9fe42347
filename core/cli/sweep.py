"""``core sweep``: a grid file planned (the flags override the file), shown (``--dry-run``) or run
cell by cell into the results database; an interrupted or refused sweep prints its resume command."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.base.errors import ConfigError
from core.base.results import RunState
from core.cli.dry_run import load_machine_argument
from core.cli.errors import BAD_INPUT, FAULT, INTERRUPTED, TERMINATED, describe_config_error, error
from core.cli.resume import resume_command
from core.cli.sweep_arguments import SLURM_FLAGS
from core.cli.sweep_display import SweepDisplay, print_plan
from core.cli.text import count, format_cells

if TYPE_CHECKING:
    from collections.abc import Callable

    from core.machines import MachineProfile
    from core.sweep import SweepOutcome
    from core.sweep.plan import Cell, SweepPlan
    from core.sweep.site import Site
    from core.sweep.spec import SweepSpec


def sweep_overrides(args: argparse.Namespace, spec: SweepSpec) -> dict[str, Any]:
    """What the flags change in the sweep file: ``--repeats``, ``--name``..., ``--slurm-*`` as [slurm] fields."""
    overrides: dict[str, Any] = {
        key: value
        for key, value in (("repeats", args.repeats), ("timeout_seconds", args.timeout_seconds), ("name", args.name))
        if value is not None
    }
    fields = [flag for flag, _, _ in SLURM_FLAGS] + ["extra_options"]
    slurm = {name: getattr(args, f"slurm_{name}") for name in fields if getattr(args, f"slurm_{name}") is not None}
    if slurm:
        overrides["slurm"] = {**(spec.slurm.model_dump() if spec.slurm is not None else {}), **slurm}
    return overrides


def sweep_flags_given(args: argparse.Namespace) -> dict[str, str]:
    """The sweep file's fields the command line set, each with the flag that set it
    (``slurm.extra_options`` -> ``--slurm-option``)."""
    given = {
        field: f"--{field.replace('_', '-')}"
        for field in ("repeats", "timeout_seconds", "name")
        if getattr(args, field) is not None
    }
    for name, _, _ in SLURM_FLAGS:
        if getattr(args, f"slurm_{name}") is not None:
            given[f"slurm.{name}"] = f"--slurm-{name.replace('_', '-')}"
    if args.slurm_extra_options is not None:
        given["slurm.extra_options"] = "--slurm-option"
    return given


def _describe_sweep_error(args: argparse.Namespace, problem: ConfigError) -> str:
    """An invalid sweep: each field with the flag the user typed where a flag set it, else the file's."""
    given = sweep_flags_given(args)

    def flag(field: str) -> str | None:  # slurm.extra_options.0, an item of the list, is the flag's too
        return next((flag for name, flag in given.items() if field == name or field.startswith(f"{name}.")), None)

    described = describe_config_error(problem, flag)
    errors: list[ConfigError] = getattr(problem, "errors", [problem])
    if all(flag(field) for each in errors for field in getattr(each, "fields", (each.field,))):
        return described  # the command line's values, not the file's
    return f"{args.file}: {described}"


def _plan(args: argparse.Namespace, site: Site | None = None) -> tuple[SweepPlan, MachineProfile | None]:
    """The sweep file with the flags' overrides (and, for Slurm, the site's time limits), planned for
    --machine (or the file's ``machine``, in a dry run or for Slurm jobs: core.sweep.remote_plan; a
    site's profile by its name) or this host; a toy sweep for this CPU."""
    from core.sweep import load_sweep, make_sweep_spec, plan_sweep

    spec = load_sweep(args.file)
    overrides = sweep_overrides(args, spec)
    if overrides:
        spec = make_sweep_spec({**spec.model_dump(), **overrides})
    if site is not None and args.executor == "slurm":
        spec = site.applied_to(spec)
    for_jobs = args.executor == "slurm"
    from_file = args.machine is None and (args.dry_run or for_jobs) and not args.toy and spec.machine is not None
    if args.toy and args.machine is not None:
        raise ConfigError("--machine", args.machine, "a toy sweep runs on this CPU: leave --machine out")
    if args.machine is not None and not args.dry_run and not for_jobs:
        raise ConfigError(
            "--machine",
            args.machine,
            "plans for a machine not at hand: use it with --dry-run, or with --executor slurm (whose jobs run there)",
        )
    machine = load_machine_argument(
        args,
        relative_to=Path(args.file).parent if from_file else None,
        site_machines=site.machines if site is not None else None,
        name=spec.machine if from_file else None,
        runs_there=for_jobs,
    )
    return plan_sweep(spec, source=str(args.file), machine=machine, toy=args.toy, executor=args.executor), machine


def sweep_dry_run(args: argparse.Namespace, plan: SweepPlan, machine: MachineProfile | None, database: Path) -> int:
    """``core sweep --dry-run``: the cells, validated, and what the database already holds; what a
    sweep would refuse before running (its jobs directory, a --resume of an unknown sweep) too."""
    from core.storage.store import ResultStore, StoreError
    from core.sweep import SweepError
    from core.sweep.run import unknown_sweep_message

    spec = plan.spec
    finished: dict[tuple[str, int], str] = {}
    try:
        if args.executor == "slurm":
            from core.sweep.cluster import check_jobs_directory
            from core.sweep.slurm_settings import SlurmSettings

            check_jobs_directory(database, spec.slurm or SlurmSettings(), spec.name)
        if args.resume and not database.exists():
            raise SweepError(f"--resume: no results database at {database}, so no sweep {spec.name!r} to resume")
        if database.exists():
            with ResultStore(database, create=False) as store:  # read only: a dry run writes nothing
                finished = store.finished(spec.name)
                if args.resume and not finished and store.sweep(spec.name) is None:
                    raise SweepError(unknown_sweep_message(store, spec.name))
    except (StoreError, SweepError) as problem:
        return error(str(problem))
    target = f", planned for machine {machine.name!r}" if machine is not None else ""
    print(f"sweep {spec.name} ({args.file}), database {database}{target}")
    print_plan(plan, spec.repeats, finished, _memory_lines(machine))
    if plan.invalid_cells and not args.skip_invalid:
        return error(
            f"{count(len(plan.invalid_cells), 'invalid cell')}: fix the grid, exclude them, or pass --skip-invalid"
        )
    return 0


def _memory_lines(machine: MachineProfile | None) -> Callable[[Cell], list[str]] | None:
    """A cell's memory table, where the dry run plans for a machine (its memory per device)."""
    if machine is None or machine.memory_gib_per_device is None:
        return None
    from core.cli.dry_run import cell_memory_lines

    def lines(cell: Cell) -> list[str]:
        return cell_memory_lines(cell.planned, machine) if cell.planned is not None else []

    return lines


def command_sweep(args: argparse.Namespace) -> int:
    from core.storage.store import default_database
    from core.sweep import SweepError
    from core.sweep.site import describe_site

    try:
        site = _site(args)
    except ConfigError as problem:
        return error(describe_config_error(problem, lambda field: None))
    except SweepError as problem:
        return error(str(problem))
    if args.print_site:
        print("\n".join(describe_site(site)))
        return 0
    if args.file is None:
        return error("core sweep: FILE is required (the sweep file), except with --print-site")
    try:
        plan, machine = _plan(args, site)
    except ConfigError as problem:
        return error(_describe_sweep_error(args, problem))
    except SweepError as problem:
        return error(str(problem))
    if args.workers is not None and args.executor == "slurm":
        return error(
            f"--workers {args.workers}: a Slurm job runs its repeat in an interpreter of its own, so there is no "
            "warm or fresh start to choose; --workers applies to --executor local"
        )
    database = args.database or default_database()
    if args.dry_run:
        return sweep_dry_run(args, plan, machine, database)
    return _run(args, plan, database, site)


def _site(args: argparse.Namespace) -> Site | None:
    """The site file in force (--site, $CORE_SITE, the user's, the system's), validated; its
    accelerator names checked against the plugins'. A resume command names it by its absolute
    path, so a resume in another shell (without $CORE_SITE) uses the same file."""
    from core.contract.manager import get_plugin_manager
    from core.sweep.site import find_site

    site = find_site(args.site)
    if site is None:
        return None
    site.check_accelerators(get_plugin_manager().accelerators)
    args.site = os.path.abspath(site.path)
    return site


def _run(args: argparse.Namespace, plan: SweepPlan, database: Path, site: Site | None = None) -> int:
    """Run the sweep with its progress shown; a result the database refused is printed, an interrupt
    or a refusal says how to resume."""
    import signal

    from core.storage.store import StoreError
    from core.sweep import SweepError, UnsavedResultError, run_sweep
    from core.sweep.cluster import SubmissionStopped, SubmissionStoppedByFault
    from core.sweep.repeat import DEFAULT_WORKER_START
    from core.sweep.run import sweep_in_database

    spec = plan.spec
    # SIGTERM ends the sweep the way Ctrl-C does (the running cell is stopped, nothing half-done is
    # stored), and the exit status says which it was: 143, as `core run` and a shell report it.
    terminated: list[int] = []

    def stop(signum: int, frame: Any) -> None:
        terminated.append(signum)
        raise KeyboardInterrupt

    previous_handler = signal.signal(signal.SIGTERM, stop)
    display = SweepDisplay(quiet=args.quiet)
    try:
        outcome = run_sweep(
            plan,
            database=database,
            resume=args.resume,
            retry_failed=args.retry_failed,
            skip_invalid=args.skip_invalid,
            observer=display,
            executor=args.executor,
            workers=args.workers or DEFAULT_WORKER_START,
            site=site,
        )
    except UnsavedResultError as problem:  # mid-sweep, the database refused a result: keep what was measured
        display.line.clear()
        if problem.saved_to is None:
            from core.base.files import json_text

            print(json_text(problem.document), flush=True)  # JSON any reader takes: null, never NaN
        return error(f"{problem}. Once the database can be written: {resume_command(args, database, spec)}", FAULT)
    except (SubmissionStopped, SubmissionStoppedByFault) as problem:  # jobs that measured stay in Slurm
        code = FAULT if isinstance(problem, SubmissionStoppedByFault) else BAD_INPUT
        return error(f"{problem}. Continue with: {resume_command(args, database, spec)}", code)
    except (SweepError, StoreError) as problem:  # before anything ran: the grid, the database, its lock
        return error(str(problem))
    except KeyboardInterrupt:
        display.line.clear()
        how, code = ("stopped by SIGTERM", TERMINATED) if terminated else ("interrupted", INTERRUPTED)
        if not sweep_in_database(database, spec.name):  # stopped before it was recorded: nothing to resume
            command = resume_command(args, database, spec, resume=False)
            print(
                f"core: sweep {spec.name} {how} before it was recorded in {database}; start it with: {command}",
                file=sys.stderr,
            )
            return code
        print(
            f"core: sweep {spec.name} {how}; finished runs are in {database}. "
            f"Continue with: {resume_command(args, database, spec)}",
            file=sys.stderr,
        )
        return code
    finally:
        display.line.clear()
        signal.signal(signal.SIGTERM, previous_handler)
    _print_outcome(outcome)
    return 0


def _print_outcome(outcome: SweepOutcome) -> None:
    """What the sweep recorded: results recovered from an earlier run, each cell's summary, the counts."""
    if outcome.runs_recovered:
        print(
            f"recorded {outcome.runs_recovered} result(s) that an earlier run of this sweep could not write to "
            f"{outcome.database}"
        )
    print()
    print(format_cells(outcome.cells))
    # A cell none of whose repeats reached its target measured that: it is counted apart, not as failed.
    missed = sum(1 for cell in outcome.cells if cell.status == RunState.target_not_reached.value)
    failed = sum(1 for cell in outcome.cells if cell.status not in ("ok", RunState.target_not_reached.value))
    print(
        f"sweep {outcome.name}: {count(outcome.runs_done, 'run')} now, {outcome.runs_already_finished} before; "
        f"{count(len(outcome.cells), 'cell')}, {failed} failed, "
        + (f"{missed} missed their target, " if missed else "")
        + f"{sum(c.flagged for c in outcome.cells)} flagged; results in {outcome.database}"
    )
