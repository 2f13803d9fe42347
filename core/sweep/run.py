"""Running a sweep: its checks, the database's lock and resume, then the one sweep loop
(core.sweep.loop) on a backend: here, one repeat after another in a child process
(:class:`LocalBackend`), or as Slurm jobs (core.sweep.cluster)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar, Literal

from core.running import processes
from core.storage.store import ResultStore, StoreError, default_database
from core.sweep.loop import (
    EndedRepeat,
    Repeat,
    RepeatKey,
    SweepBackend,
    SweepNotStarted,
    SweepObserver,
    SweepObservers,
    SweepOutcome,
    record_unsaved,
    run_repeats,
)
from core.sweep.loop import seconds_left as _seconds_left  # noqa: F401 - its name before the loop moved
from core.sweep.plan import Cell, SweepPlan, plan_sweep
from core.sweep.remote_plan import check_plan_runs_on, machine_of_file
from core.sweep.repeat import (
    DEFAULT_WORKER_START,
    WORKER_STARTS,
    WarmWorkers,
    WorkerStart,
    run_in_process,
    warm_workers,
)
from core.sweep.site import Site
from core.sweep.spec import SweepError, SweepSpec, load_sweep, make_sweep_spec

__all__ = [
    "EXECUTORS",
    "LocalBackend",
    "SweepObserver",
    "SweepOutcome",
    "run_sweep",
    "sweep_in_database",
    "unknown_sweep_message",
]

Executor = Literal["local", "slurm"]
EXECUTORS: tuple[Executor, ...] = ("local", "slurm")


def run_sweep(
    sweep: str | Path | SweepSpec | SweepPlan,
    *,
    database: str | Path | None = None,
    resume: bool = False,
    retry_failed: bool = False,
    repeats: int | None = None,
    timeout_seconds: float | None = None,
    skip_invalid: bool = False,
    observer: SweepObserver | None = None,
    executor: Executor = "local",
    workers: WorkerStart = DEFAULT_WORKER_START,
    site: Site | None = None,
) -> SweepOutcome:
    """Run every cell of a sweep ``repeats`` times, each repeat in its own process, storing each result.

    :param sweep: a sweep file, a SweepSpec, or a SweepPlan from :func:`plan_sweep`.
    :param database: the results database (default: ``$CORE_DATABASE`` or results/core.db).
    :param resume: continue a sweep already in the database, running only what is missing.
    :param retry_failed: with resume, run again the repeats recorded as failed (their rows are replaced).
    :param repeats: override the file's repeats per cell.
    :param timeout_seconds: override the file's per-repeat time limit.
    :param skip_invalid: run the valid cells even if validation refused some (otherwise refuse to start).
    :param executor: ``local``: one repeat after another in a child process here; ``slurm``: each
        pending repeat a Slurm job with the spec's ``[slurm]`` settings (core.sweep.cluster).
    :param workers: "warm" (default): fork each run from a parent that imported core and PyTorch once
        (core.running.forkserver) where that is safe, else a fresh interpreter; "fresh": always a fresh
        interpreter. Each result's ``process_start`` says which it got, and why. The warm parent
        starts before the sweep plans; inside :func:`core.sweep.keep_warm_workers` it is shared by
        the block's sweeps.
    :param site: a site file (core.sweep.site.find_site) whose defaults a Slurm sweep's jobs take
        where the spec's ``[slurm]`` leaves them; a local sweep ignores it.
    :raises SweepError: before anything runs, when cells are invalid or the database disagrees.
    :returns: what ran, and a summary of every cell.
    """
    if workers not in WORKER_STARTS:
        raise SweepError(f"invalid workers {workers!r}; allowed: {', '.join(WORKER_STARTS)}")
    if executor not in EXECUTORS:
        raise SweepError(f"invalid executor {executor!r}; allowed: {', '.join(EXECUTORS)}")
    # A local sweep's fork server imports while the sweep plans, validates and opens its database:
    # the first forked run then waits for what is left of its imports, not for all of them.
    warm_block: contextlib.AbstractContextManager[WarmWorkers | None] = (
        warm_workers(workers) if executor == "local" else contextlib.nullcontext(None)
    )
    with warm_block as warm:
        if warm is not None:
            warm.begin()
        return _run_sweep(
            sweep,
            database=database,
            resume=resume,
            retry_failed=retry_failed,
            repeats=repeats,
            timeout_seconds=timeout_seconds,
            skip_invalid=skip_invalid,
            observer=observer,
            executor=executor,
            workers=workers,
            warm=warm,
            site=site,
        )


def _run_sweep(
    sweep: str | Path | SweepSpec | SweepPlan,
    *,
    database: str | Path | None,
    resume: bool,
    retry_failed: bool,
    repeats: int | None,
    timeout_seconds: float | None,
    skip_invalid: bool,
    observer: SweepObserver | None,
    executor: Executor,
    workers: WorkerStart,
    warm: WarmWorkers | None,
    site: Site | None = None,
) -> SweepOutcome:
    plan = _plan_of(sweep, executor, site)
    if warm is not None:
        warm.drop_unless_needed(plan.valid_cells)
    spec = _spec_with(plan.spec, repeats=repeats, timeout_seconds=timeout_seconds)
    if site is not None and executor == "slurm":
        spec = site.applied_to(spec)  # ConfigError past the site's longest time limit, before anything runs
    _check_cells(plan, skip_invalid)
    database = Path(database) if database is not None else default_database()
    # SweepError: Slurm cannot be reached, its jobs directory
    backend = _backend(executor, spec, database, workers, warm, site)
    if resume and not database.exists():
        raise SweepError(f"--resume: no results database at {database}, so no sweep {spec.name!r} to resume")
    from core.contract.manager import get_plugin_manager
    from core.running.observe import PluginHooks

    # The plugins' lifecycle hooks hear of every repeat from here, the process that owns the sweep.
    observers = SweepObservers([PluginHooks(get_plugin_manager()), observer])
    store = ResultStore(database)  # StoreError, before anything runs: a directory, no database, a full disk
    try:
        # One sweep at a time on a database: a second one is refused (DatabaseInUseError), never
        # run beside the first. The kernel releases the lock however this process ends.
        with store.lock(spec.name):
            finished = _check_database(store, plan, resume)
            if executor == "local":
                _refuse_slurm_jobs_in_flight(database, spec)
            recorded = store.sweep(spec.name)

            def save_record() -> None:
                store.save_sweep(
                    spec.name, _spec_record(spec, recorded), [cell.describe() for cell in plan.cells], plan.source
                )

            if recorded is None:
                # A new sweep is recorded before anything is submitted, so that a sweep killed once
                # its jobs are in Slurm resumes (and waits for them).
                save_record()
            recovered = record_unsaved(store, plan, finished) if resume else 0
            try:
                # A resumed sweep's record (its repeats raised, the resume in its history) changes
                # only once the backend took the sweep: a refused resume leaves it as it was.
                resumed_record = save_record if recorded is not None else None
                outcome = run_repeats(
                    store, plan, spec, finished, retry_failed, observers, backend, on_accepted=resumed_record
                )
            except SweepNotStarted:
                if recorded is None:  # a new sweep none of whose repeats started is not begun: no record
                    store.forget_sweep(spec.name)
                raise
            outcome.runs_recovered = recovered
            return outcome
    finally:
        store.close()


def _plan_of(sweep: str | Path | SweepSpec | SweepPlan, executor: Executor, site: Site | None = None) -> SweepPlan:
    """The sweep's plan: each cell validated once, here, for every repeat to run as it is."""
    if isinstance(sweep, SweepPlan):
        check_plan_runs_on(sweep, executor)
        _check_planned_for(sweep, executor)
        return sweep
    spec = sweep if isinstance(sweep, SweepSpec) else load_sweep(sweep)
    source = None if isinstance(sweep, SweepSpec) else str(sweep)
    # A Slurm sweep is planned for the compute nodes the file names, where it names them.
    machine = (
        machine_of_file(spec, source, site.machines if site is not None else None) if executor == "slurm" else None
    )
    return plan_sweep(spec, source=source, machine=machine, executor=executor)


def _check_planned_for(plan: SweepPlan, executor: Executor) -> None:
    """A multi-node cell planned as a Slurm job of its own needs that job's allocation: run here,
    it would have neither an allocation nor a rendezvous."""
    if plan.executor == "slurm" and executor != "slurm":
        needing = [cell.label for cell in plan.valid_cells if cell.config is not None and cell.config.nodes > 1]
        if needing:
            raise SweepError(
                f"cells {', '.join(repr(label) for label in needing[:5])} were planned as Slurm jobs of several "
                f"nodes (plan_sweep(executor='slurm')), not for executor {executor!r}; plan the sweep again for it"
            )


def _spec_with(spec: SweepSpec, *, repeats: int | None, timeout_seconds: float | None) -> SweepSpec:
    """The spec with ``--repeats`` and ``--timeout-seconds`` applied (validated as the file's are)."""
    updates = {
        key: value for key, value in (("repeats", repeats), ("timeout_seconds", timeout_seconds)) if value is not None
    }
    return make_sweep_spec({**spec.model_dump(), **updates}) if updates else spec


def _check_cells(plan: SweepPlan, skip_invalid: bool) -> None:
    if plan.cells and len(plan.invalid_cells) == len(plan.cells):
        # --skip-invalid skips some cells; with none left, a sweep that ran nothing is no success.
        raise SweepError(
            f"every cell is invalid here ({len(plan.cells)} of {len(plan.cells)}), so nothing can run:\n"
            + "\n".join(f"  {cell.label}: {cell.invalid_reason}" for cell in plan.invalid_cells)
        )
    if plan.invalid_cells and not skip_invalid:
        raise SweepError(
            f"{len(plan.invalid_cells)} of {len(plan.cells)} cells are invalid (see --dry-run); "
            "fix the grid, add an exclude, or pass --skip-invalid:\n"
            + "\n".join(f"  {cell.label}: {cell.invalid_reason}" for cell in plan.invalid_cells)
        )


def _backend(
    executor: Executor,
    spec: SweepSpec,
    database: Path,
    workers: WorkerStart,
    warm: WarmWorkers | None = None,
    site: Site | None = None,
) -> SweepBackend:
    """Where the repeats run; a Slurm sweep is refused here, before anything is written, where the
    machine cannot submit jobs or the jobs directory cannot hold them."""
    if executor == "local":
        return LocalBackend(spec.timeout_seconds, workers, warm)
    from core.sweep.cluster import SlurmBackend

    return SlurmBackend.checked(spec, database, site)


def _refuse_slurm_jobs_in_flight(database: Path, spec: SweepSpec) -> None:
    """A sweep whose Slurm jobs are still listed resumes with ``--executor slurm`` only: run here,
    its repeats would be measured twice, beside their own jobs."""
    from core.sweep.cluster import jobs_in_flight

    listed = jobs_in_flight(database, spec.slurm, spec.name)
    if listed is not None:
        ledger, count = listed
        raise SweepError(
            f"sweep {spec.name!r} has {count} Slurm job(s) in flight (listed in {ledger}); resume it with "
            "--executor slurm, which waits for them, or scancel them and move the ledger away"
        )


def _spec_record(spec: SweepSpec, recorded: Any) -> dict[str, Any]:
    """The spec to store: a new sweep's as given; a resumed one's as first recorded, never lowered.

    ``repeats`` becomes the larger of the recorded and the new value (the runs beyond a lowered
    ``--repeats`` stay in the database, and every summary counts them); a resume that changes
    ``repeats`` or ``timeout_seconds`` is added to ``resumed`` with its values.
    """
    asked = spec.model_dump(mode="json")
    if recorded is None:
        return asked
    stored = dict(recorded.spec)
    previous = stored.get("repeats")
    if isinstance(previous, int) and not isinstance(previous, bool):
        stored["repeats"] = max(previous, spec.repeats)
    else:
        stored["repeats"] = spec.repeats
    changes = {key: asked[key] for key in ("repeats", "timeout_seconds") if recorded.spec.get(key) != asked[key]}
    if changes:
        from datetime import datetime, timezone

        previous = stored.get("resumed")
        history: list[Any] = previous if isinstance(previous, list) else []
        stored["resumed"] = [*history, {"at": datetime.now(timezone.utc).isoformat(), **changes}]
    return stored


def _check_database(store: ResultStore, plan: SweepPlan, resume: bool) -> dict[tuple[str, int], str]:
    name = plan.spec.name
    finished = store.finished(name)
    recorded = store.sweep(name)
    unreadable = [row for row in store.skipped_rows if row.table == "sweeps" and row.row == name]
    if recorded is None and unreadable:
        # Written by a newer core, or damaged: running would overwrite it with this core's record.
        raise SweepError(
            f"sweep {name!r} has a record in {store.path} that cannot be read ({unreadable[-1].reason}); it is "
            "left as it is: run the sweep with the core that wrote it, or give it another name (--name)"
        )
    if (finished or recorded is not None) and not resume:
        raise SweepError(
            f"sweep {name!r} already has {len(finished)} run(s) in {store.path}; pass --resume to "
            "continue it, or give the sweep another name"
        )
    if resume and not finished and recorded is None:
        raise SweepError(unknown_sweep_message(store, name))
    if recorded is not None:
        before = {cell["key"] for cell in recorded.cells}
        now = {cell.key for cell in plan.cells}
        if before != now:
            raise SweepError(
                f"sweep {name!r} in {store.path} was started with a different grid "
                f"({len(before - now)} cell(s) gone, {len(now - before)} new); "
                "resume it with its original file, or give the changed grid another name"
            )
    return finished


def sweep_in_database(database: Path, name: str) -> bool:
    """Whether ``--resume`` finds sweep ``name`` in ``database`` (its record or a run of it): a sweep
    stopped before it was recorded is started again, not resumed. A database that cannot be read
    counts as holding it (resume then says what is wrong with the file)."""
    if not database.exists():
        return False
    try:
        with ResultStore(database, create=False) as store:
            return bool(store.finished(name)) or store.sweep(name) is not None
    except StoreError:
        return True


def unknown_sweep_message(store: ResultStore, name: str) -> str:
    """What ``--resume`` of a sweep the database has never seen says, naming the sweeps it has."""
    names = store.sweep_names()
    has = f"it has {', '.join(repr(known) for known in names[:20])}" if names else "it has no sweep"
    if len(names) > 20:
        has += f" and {len(names) - 20} more"
    return f"--resume: no sweep {name!r} in {store.path} ({has}), so nothing to resume; leave out --resume to start it"


class LocalBackend(SweepBackend):
    """Repeats one after another, each in a child process here (core.sweep.repeat): forked from the
    sweep's fork server where that is safe, else a fresh interpreter, with the spec's time limit."""

    estimates_time_left: ClassVar[bool] = True

    def __init__(
        self, timeout_seconds: float, workers: WorkerStart = DEFAULT_WORKER_START, warm: WarmWorkers | None = None
    ) -> None:
        self.timeout_seconds = timeout_seconds
        self.workers = workers
        self._given_warm = warm  # run_sweep's, begun while it planned; None: the backend's own
        self._next: Repeat | None = None
        self._scratch: Path | None = None
        self._warm: WarmWorkers | None = None

    @contextmanager
    def running(self, settled: Collection[RepeatKey], cells: Mapping[str, Cell]) -> Iterator[None]:
        # Removed on every way out; one left by a sweep that was killed (-9) goes at the next sweep's
        # start. The fork server (if a run may be forked) started while the sweep planned, or starts
        # with the first such run, and ends with the sweep; the runs it forked are killed with it.
        with contextlib.ExitStack() as stack:
            scratch = stack.enter_context(processes.work_directory("core-sweep-"))
            warm = self._given_warm
            if warm is None:
                warm = stack.enter_context(warm_workers(self.workers))
            self._scratch, self._warm = Path(scratch), warm
            try:
                yield
            finally:
                self._scratch = self._warm = None

    def submit(self, repeats: Sequence[Repeat]) -> list[Repeat]:
        """One repeat at a time: the next is chosen after this one ended (a failed cell's are not)."""
        if self._next is not None or not repeats:
            return []
        self._next = repeats[0]
        return [self._next]

    def in_flight(self) -> bool:
        return self._next is not None

    def wait(
        self, on_wait: Callable[[Repeat, float], None], on_queued: Callable[[Repeat, str, str], None] | None = None
    ) -> list[EndedRepeat]:
        del on_queued  # a repeat here starts at once: nothing waits in a queue
        repeat, self._next = self._next, None
        assert repeat is not None and self._scratch is not None, "wait() follows submit(), while running()"
        result, seconds = run_in_process(
            repeat.cell.for_repeat(repeat.index),
            timeout_seconds=self.timeout_seconds,
            work_dir=self._scratch / f"cell-{repeat.cell.index}-repeat-{repeat.index}",
            on_wait=lambda elapsed: on_wait(repeat, elapsed),
            workers=self._warm,
        )
        return [EndedRepeat(repeat, result, seconds)]
