"""Running a sweep: one repeat after another, each result committed as it arrives, resumable, one
sweep per database at a time."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from core.running import processes
from core.storage.results import RunResult, RunState
from core.storage.store import ResultStore, StoreError, default_database, unsaved_directory
from core.storage.summary import CellSummary, summarise
from core.sweep.plan import Cell, SweepPlan, plan_sweep
from core.sweep.repeat import DEFAULT_WORKER_START, WORKER_STARTS, WorkerStart, run_in_process, warm_workers
from core.sweep.spec import SweepError, SweepSpec, UnsavedResultError, _shorten, load_sweep, make_sweep_spec
from core.sweep.toy import mark_toy_result


@dataclass
class SweepOutcome:
    """What a sweep did. ``cells`` summarises every cell of the sweep now in the database."""

    name: str
    database: Path
    runs_done: int  # runs this call recorded
    runs_already_finished: int  # found in the database and skipped (resume)
    skipped_invalid: list[Cell]
    cells: list[CellSummary] = field(default_factory=list)
    runs_recovered: int = 0  # results a failed write had left in <database>.unsaved/, now recorded


class SweepObserver(Protocol):
    """What a sweep tells whoever watches it (the CLI's progress line). Every method may be a no-op:
    subclass it to inherit the no-ops, or pass any object with these methods."""

    def started(self, plan: SweepPlan, runs_total: int, runs_finished: int, runs_recorded: int | None = None) -> None:
        """``runs_finished`` of ``runs_total`` asked for are recorded; ``runs_recorded`` counts the
        sweep's valid cells' runs in the database, those beyond a lowered ``repeats`` included."""
        return None

    def run_started(self, cell: Cell, repeat: int, runs_done: int, runs_total: int, seconds_left: float | None) -> None:
        return None

    def waiting(self, cell: Cell, repeat: int, elapsed_seconds: float, seconds_left: float | None) -> None:
        return None

    def run_finished(self, cell: Cell, repeat: int, result: RunResult, process_seconds: float) -> None:
        return None


class _Unobserved(SweepObserver):
    """No one watches."""


def _seconds_left(durations: list[float], runs_left: int, current_elapsed: float = 0.0) -> float | None:
    """Mean duration of finished runs times the runs left, less what the current one has used."""
    if not durations:
        return None
    return max(0.0, sum(durations) / len(durations) * runs_left - current_elapsed)


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
    executor: Literal["local", "slurm"] = "local",
    workers: WorkerStart = DEFAULT_WORKER_START,
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
        interpreter. Each result's ``process_start`` says which it got, and why.
    :raises SweepError: before anything runs, when cells are invalid or the database disagrees.
    :returns: what ran, and a summary of every cell.
    """
    if workers not in WORKER_STARTS:
        raise SweepError(f"invalid workers {workers!r}; allowed: {', '.join(WORKER_STARTS)}")
    plan = (
        sweep
        if isinstance(sweep, SweepPlan)
        else plan_sweep(
            sweep if isinstance(sweep, SweepSpec) else load_sweep(sweep),
            source=None if isinstance(sweep, SweepSpec) else str(sweep),
        )
    )
    spec = plan.spec
    updates = {
        key: value for key, value in (("repeats", repeats), ("timeout_seconds", timeout_seconds)) if value is not None
    }
    if updates:
        spec = make_sweep_spec({**spec.model_dump(), **updates})
    if plan.invalid_cells and not skip_invalid:
        raise SweepError(
            f"{len(plan.invalid_cells)} of {len(plan.cells)} cells are invalid (see --dry-run); "
            "fix the grid, add an exclude, or pass --skip-invalid:\n"
            + "\n".join(f"  {cell.label}: {cell.invalid_reason}" for cell in plan.invalid_cells)
        )
    observer = observer or _Unobserved()
    database = Path(database) if database is not None else default_database()
    if executor == "slurm":
        from core.sweep.cluster import check_jobs_directory
        from core.sweep.slurm_jobs import unavailable_reason
        from core.sweep.slurm_settings import SlurmSettings

        why = unavailable_reason()
        if why is not None:
            raise SweepError(f"--executor slurm: this machine cannot submit Slurm jobs: {why}")
        check_jobs_directory(database, spec.slurm or SlurmSettings())
    if resume and not database.exists():
        raise SweepError(f"--resume: no results database at {database}, so no sweep {spec.name!r} to resume")
    store = ResultStore(database)  # StoreError, before anything runs: a directory, no database, a full disk
    try:
        # One sweep at a time on a database: a second one is refused (DatabaseInUseError), never
        # run beside the first. The kernel releases the lock however this process ends.
        with store.lock(spec.name):
            finished = _check_database(store, plan, resume)
            if executor == "local":
                _refuse_slurm_jobs_in_flight(database, spec)
            recorded = store.sweep(spec.name)
            store.save_sweep(
                spec.name, _spec_record(spec, recorded), [cell.describe() for cell in plan.cells], plan.source
            )
            recovered = _record_unsaved(store, plan, finished) if resume else 0
            if executor == "slurm":
                outcome = _run_cells_on_slurm(
                    store, plan, spec, finished, retry_failed, observer, database, new=recorded is None
                )
            else:
                outcome = _run_cells(store, plan, spec, finished, retry_failed, observer, database, workers)
            outcome.runs_recovered = recovered
            return outcome
    finally:
        store.close()


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


def _run_cells_on_slurm(
    store: ResultStore,
    plan: SweepPlan,
    spec: SweepSpec,
    finished: dict[tuple[str, int], str],
    retry_failed: bool,
    observer: SweepObserver,
    database: Path,
    *,
    new: bool,
) -> SweepOutcome:
    """The sweep's repeats as Slurm jobs; a new sweep none of whose jobs could be submitted leaves
    no record in the database (its folders and ledger are gone too), so it is started, not resumed."""
    from core.sweep.cluster import NotSubmitted, SubmissionFailed, run_cells_on_slurm
    from core.sweep.slurm_settings import SlurmSettings

    settings = spec.slurm or SlurmSettings()
    try:
        return run_cells_on_slurm(store, plan, spec, finished, retry_failed, observer, database, settings)
    except (NotSubmitted, SubmissionFailed):
        if new:
            store.forget_sweep(spec.name)
        raise


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


def _unsaved_file(database: Path, sweep: str, cell: Cell, repeat: int) -> Path:
    return unsaved_directory(database) / f"{sweep}-cell{cell.index + 1}-repeat{repeat + 1}.json"


def _save_unsaved(path: Path, document: dict[str, Any]) -> str | None:
    """Write ``document`` whole to ``path`` (None) or say why it could not be written."""
    from core.storage.files import OutputError, write_atomically

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps(document, indent=1) + "\n", "unsaved result")
        return None
    except OutputError as error:
        why = str(error)
    except OSError as exc:
        from core.storage.files import describe_os_error

        why = f"cannot create {path.parent}: {describe_os_error(exc)}"
    try:
        path.parent.rmdir()  # only when empty: leave no folder that holds nothing
    except OSError:
        pass
    return why


def _record_unsaved(store: ResultStore, plan: SweepPlan, finished: dict[tuple[str, int], str]) -> int:
    """Record the results a failed write left in ``<database>.unsaved/`` for this sweep; returns how many.

    A file is removed once its run is in the database; one that cannot be read, belongs to a
    cell no longer in the grid, or whose repeat is already recorded stays, with a warning.
    """
    import logging

    directory = unsaved_directory(store.path)
    if not directory.is_dir():
        return 0
    log = logging.getLogger(__name__)
    cells = {cell.key: cell for cell in plan.valid_cells}
    name = plan.spec.name
    recovered = 0
    for path in sorted(directory.glob(f"{name}-cell*-repeat*.json")):
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
            if document.get("sweep") != name:
                continue  # another sweep whose name starts like this one's
            key, repeat = document["cell_key"], document["repeat"]
            result = RunResult.model_validate(document["result"])
            seconds = document.get("process_seconds")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("core: warning: cannot record %s: %s", path, _shorten(str(exc), 300))
            continue
        if key not in cells or not isinstance(repeat, int):
            log.warning("core: warning: %s is for a cell this sweep's grid does not have; left in place", path)
            continue
        if (key, repeat) in finished:
            log.warning(
                "core: warning: %s: repeat %d of %s is already recorded; left in place",
                path,
                repeat + 1,
                cells[key].label,
            )
            continue
        store.add(
            result,
            sweep=name,
            cell_key=key,
            cell_label=cells[key].label,
            repeat=repeat,
            process_seconds=seconds if isinstance(seconds, (int, float)) else None,
        )
        finished[(key, repeat)] = result.status.state.value
        recovered += 1
        path.unlink(missing_ok=True)
    try:
        directory.rmdir()  # only when empty
    except OSError:
        pass
    return recovered


def _check_database(store: ResultStore, plan: SweepPlan, resume: bool) -> dict[tuple[str, int], str]:
    name = plan.spec.name
    finished = store.finished(name)
    recorded = store.sweep(name)
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


def unknown_sweep_message(store: ResultStore, name: str) -> str:
    """What ``--resume`` of a sweep the database has never seen says, naming the sweeps it has."""
    names = store.sweep_names()
    has = f"it has {', '.join(repr(known) for known in names[:20])}" if names else "it has no sweep"
    if len(names) > 20:
        has += f" and {len(names) - 20} more"
    return f"--resume: no sweep {name!r} in {store.path} ({has}), so nothing to resume; leave out --resume to start it"


def _run_cells(
    store: ResultStore,
    plan: SweepPlan,
    spec: SweepSpec,
    finished: dict[tuple[str, int], str],
    retry_failed: bool,
    observer: SweepObserver,
    database: Path,
    workers: WorkerStart,
) -> SweepOutcome:
    cells = plan.valid_cells
    ok = RunState.ok.value
    recorded = {key: status for key, status in finished.items() if not (retry_failed and status != ok)}
    # A cell stops at its first failed repeat: an out-of-memory cell would fail every time.
    stopped = {key for (key, _), status in recorded.items() if status != ok}

    def pending() -> list[tuple[int, Cell]]:
        # Rounds: every cell once, then every cell again, so slow drift spreads over all cells.
        return [
            (repeat, cell)
            for repeat in range(spec.repeats)
            for cell in cells
            if (cell.key, repeat) not in recorded and cell.key not in stopped
        ]

    already = sum(1 for cell in cells for repeat in range(spec.repeats) if (cell.key, repeat) in recorded)
    valid_keys = {cell.key for cell in cells}
    in_database = sum(1 for key, _ in recorded if key in valid_keys)  # beyond a lowered --repeats too
    durations = store.process_seconds(spec.name)
    runs_done = 0
    observer.started(plan, runs_total=len(pending()) + already, runs_finished=already, runs_recorded=in_database)
    # Removed on every way out; one left by a sweep that was killed (-9) goes at the next sweep's start.
    # The fork server (if a run may be forked) starts with the first such run and ends with the sweep;
    # the runs it forked are killed with it.
    with processes.work_directory("core-sweep-") as scratch, warm_workers(workers, Path(scratch)) as warm:
        while True:
            queue = pending()
            if not queue:
                break
            repeat, cell = queue[0]
            total = already + runs_done + len(queue)
            observer.run_started(cell, repeat, already + runs_done, total, _seconds_left(durations, len(queue)))

            def waiting(elapsed: float, cell: Cell = cell, repeat: int = repeat, left: int = len(queue)) -> None:
                observer.waiting(cell, repeat, elapsed, _seconds_left(durations, left, elapsed))

            result, seconds = run_in_process(
                cell,
                timeout_seconds=spec.timeout_seconds,
                work_dir=Path(scratch) / f"cell-{cell.index}-repeat-{repeat}",
                on_wait=waiting,
                workers=warm,
            )
            record_repeat(
                store,
                database,
                spec.name,
                cell,
                repeat,
                result,
                seconds,
                replace=(cell.key, repeat) in finished,
                observer=observer,
            )
            recorded[(cell.key, repeat)] = result.status.state.value
            if not result.status.ok:
                stopped.add(cell.key)
            durations.append(seconds)
            runs_done += 1
            observer.run_finished(cell, repeat, result, seconds)
    return SweepOutcome(
        name=spec.name,
        database=database,
        runs_done=runs_done,
        runs_already_finished=already,
        skipped_invalid=plan.invalid_cells,
        cells=summarise(store.runs(sweep=spec.name)),
    )


def record_repeat(
    store: ResultStore,
    database: Path,
    sweep: str,
    cell: Cell,
    repeat: int,
    result: RunResult,
    seconds: float | None,
    *,
    replace: bool,
    observer: SweepObserver,
) -> None:
    """Store one repeat's result, wherever it ran (a toy cell's marked as one). A database that
    refuses it stops the sweep with UnsavedResultError, the result saved beside the database."""
    if cell.toy:
        mark_toy_result(result)
    try:
        store.add(
            result,
            sweep=sweep,
            cell_key=cell.key,
            cell_label=cell.label,
            repeat=repeat,
            process_seconds=seconds,
            replace=replace,
        )
    except StoreError as error:
        observer.run_finished(cell, repeat, result, seconds or 0.0)
        raise _unsaved(database, sweep, cell, repeat, result, seconds or 0.0, error) from None


def _unsaved(
    database: Path, sweep: str, cell: Cell, repeat: int, result: RunResult, seconds: float, error: StoreError
) -> UnsavedResultError:
    """The error that stops a sweep whose database refused a result, after saving the result if it can."""
    document = {
        "sweep": sweep,
        "cell_key": cell.key,
        "cell_label": cell.label,
        "repeat": repeat,
        "process_seconds": seconds,
        "result": result.model_dump(mode="json"),
    }
    path = _unsaved_file(database, sweep, cell, repeat)
    save_error = _save_unsaved(path, document)
    what = f"repeat {repeat + 1} of cell {cell.label!r}"
    if save_error is None:
        kept = f"its result is saved in {path}, which the sweep records when resumed"
    else:
        kept = (
            f"its result could not be saved beside the database either ({save_error}), so it is printed "
            "as JSON on standard output"
        )
    message = f"the sweep stopped: cannot record {what}: {error}; {kept}"
    return UnsavedResultError(message, document, None if save_error else path, save_error)
