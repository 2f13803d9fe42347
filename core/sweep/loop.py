"""The one sweep loop: which repeats are pending, each ended repeat recorded exactly once with its
phases, a failed cell stopped, a result the database refuses kept beside it, and who is told.

Where the repeats run is a :class:`SweepBackend`'s business, and all it does: it starts repeats
(:meth:`~SweepBackend.submit`), waits for some to end (:meth:`~SweepBackend.wait`) and stops a
cell's (:meth:`~SweepBackend.cancel_cell`). The local backend (core.sweep.run) runs one repeat at
a time in a child process here; the Slurm backend (core.sweep.cluster) submits every repeat as a
batch job and polls them. The lock, the database's checks and resume are run_sweep's
(core.sweep.run), before this loop starts.
"""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from core.base.files import parse_json
from core.base.results import RunResult, RunState
from core.running.observe import Observer, ObserverGroup
from core.storage.store import StoreError, unsaved_directory
from core.storage.summary import CellSummary, summarise
from core.sweep.spec import UnsavedResultError, _shorten
from core.sweep.toy import mark_toy_result

if TYPE_CHECKING:
    from core.storage.store import ResultStore
    from core.sweep.plan import Cell, SweepPlan
    from core.sweep.spec import SweepSpec

RepeatKey = tuple[str, int]  # (cell key, repeat index from 0): a repeat's identity in the database


#: the states of a repeat that ran to its end and measured what it set out to (a run to a target
#: that spent its budget included): the cell goes on to its next repeat, and nothing is retried
MEASURED = frozenset({RunState.ok.value, RunState.target_not_reached.value})


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
    #: database rows the summaries could not read (a result of a newer core, a damaged row), each
    #: as a line of text; each was also logged as a warning
    skipped_rows: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class JobCounts:
    """A cluster sweep's runs as its last poll found them: ``queued`` (pending in the scheduler),
    ``running``, ``done`` (recorded, whichever way they ended; ``failed`` of them did not end ok) of
    ``total`` asked for; runs not yet submitted are the rest."""

    queued: int
    running: int
    done: int
    failed: int
    total: int


class SweepObserver(Observer):
    """What a sweep tells whoever watches it (the CLI's progress line): the events of each run
    (:class:`core.running.observe.Observer`: the plugins' hooks hear of every repeat through them)
    and the sweep's own, below. Every method is a no-op: subclass it to inherit the no-ops, or pass
    any object with some of these methods."""

    def started(self, plan: SweepPlan, runs_total: int, runs_finished: int, runs_recorded: int | None = None) -> None:
        """``runs_finished`` of ``runs_total`` asked for are recorded; ``runs_recorded`` counts the
        sweep's valid cells' runs in the database, those beyond a lowered ``repeats`` included."""
        return None

    def run_started(self, cell: Cell, repeat: int, runs_done: int, runs_total: int, seconds_left: float | None) -> None:
        """Repeat ``repeat`` (from 0) of ``cell`` started (locally) or was submitted (a Slurm job);
        ``seconds_left`` is the sweep's estimate, None where there is none (a Slurm sweep's jobs
        run side by side)."""
        return None

    def waiting(self, cell: Cell, repeat: int, elapsed_seconds: float, seconds_left: float | None) -> None:
        """A repeat running here has run ``elapsed_seconds`` so far (told about twice a second)."""
        return None

    def queued(self, cell: Cell, repeat: int, job: str, reason: str) -> None:
        """Repeat ``repeat`` of ``cell`` waits in the cluster's queue as job ``job``, for ``reason``
        (Slurm's: ``Priority``, ``Resources``, ``JobHeldUser`` ...); told after every poll while it waits."""
        return None

    def jobs_counted(self, counts: JobCounts) -> None:
        """A cluster's poll (a Slurm sweep's): how many of the sweep's runs wait in the queue, run,
        are done and failed; told after every poll."""
        return None

    def run_finished(self, cell: Cell, repeat: int, result: RunResult, process_seconds: float) -> None:
        """A repeat ended and was recorded."""
        return None

    def run_not_recorded(self, cell: Cell, repeat: int, result: RunResult, process_seconds: float) -> None:
        """A repeat ended but the database refused its result (kept beside it; the sweep then stops).
        By default told as :meth:`run_finished`, as it was before this event existed."""
        self.run_finished(cell, repeat, result, process_seconds)


class SweepObservers(ObserverGroup, SweepObserver):
    """Several sweep observers (and run observers: the plugins' hooks), told of each event in turn."""

    def started(self, plan: SweepPlan, runs_total: int, runs_finished: int, runs_recorded: int | None = None) -> None:
        self.tell("started", plan, runs_total, runs_finished, runs_recorded)

    def run_started(self, cell: Cell, repeat: int, runs_done: int, runs_total: int, seconds_left: float | None) -> None:
        self.tell("run_started", cell, repeat, runs_done, runs_total, seconds_left)

    def waiting(self, cell: Cell, repeat: int, elapsed_seconds: float, seconds_left: float | None) -> None:
        self.tell("waiting", cell, repeat, elapsed_seconds, seconds_left)

    def queued(self, cell: Cell, repeat: int, job: str, reason: str) -> None:
        self.tell("queued", cell, repeat, job, reason)

    def jobs_counted(self, counts: JobCounts) -> None:
        self.tell("jobs_counted", counts)

    def run_finished(self, cell: Cell, repeat: int, result: RunResult, process_seconds: float) -> None:
        self.tell("run_finished", cell, repeat, result, process_seconds)

    def run_not_recorded(self, cell: Cell, repeat: int, result: RunResult, process_seconds: float) -> None:
        for observer in self.observers:
            # An observer written before this event hears of the run as finished, as it did then.
            method = getattr(observer, "run_not_recorded", None) or getattr(observer, "run_finished", None)
            if method is not None:
                method(cell, repeat, result, process_seconds)


class SweepNotStarted(Exception):  # noqa: N818 - a marker a backend's refusal also derives from
    """A backend's refusal that started none of the call's repeats (it withdrew what it had started):
    a new sweep then leaves no record in the database, so that it is started, not resumed, next time."""


@dataclass(frozen=True)
class Repeat:
    """One repeat of one cell: what a backend runs."""

    cell: Cell
    index: int  # from 0

    @property
    def key(self) -> RepeatKey:
        return (self.cell.key, self.index)


@dataclass(frozen=True)
class EndedRepeat:
    """A repeat a backend saw end, with its result (the phases it measured, however it ended)."""

    repeat: Repeat
    result: RunResult
    seconds: float | None  # the process's (or the job's) seconds, where known


class SweepBackend(ABC):
    """Where a sweep's repeats run. It starts them, waits for them and stops a failed cell's; the
    bookkeeping (what is pending, recording, stopping, the observers) is the loop's."""

    #: whether the mean duration of the finished runs times the runs left estimates the time left
    #: (true where repeats run one after another)
    estimates_time_left: ClassVar[bool] = False
    #: whether :meth:`wait` takes ``on_counts``, told (queued, running) after each poll of a cluster
    reports_counts: ClassVar[bool] = False

    @contextmanager
    def running(self, settled: Collection[RepeatKey], cells: Mapping[str, Cell]) -> Iterator[None]:
        """Whatever the backend holds while the sweep runs (a scratch folder, a fork server, a job
        ledger). ``settled`` are the repeats the database holds: what the backend still keeps of
        them (a job from before an interruption) is dropped; ``cells`` the grid's valid cells."""
        yield

    @abstractmethod
    def submit(self, repeats: Sequence[Repeat]) -> list[Repeat]:
        """Start what the backend takes of ``repeats`` (pending, in order); returns those it took,
        started now or found in flight already."""

    @abstractmethod
    def in_flight(self) -> bool:
        """Whether a repeat started (now or before this call) has not been seen to end."""

    @abstractmethod
    def wait(
        self, on_wait: Callable[[Repeat, float], None], on_queued: Callable[[Repeat, str, str], None] | None = None
    ) -> list[EndedRepeat]:
        """Wait until repeats in flight end; returns every one that did (at least one).

        :param on_wait: called while a repeat runs here, with its seconds so far.
        :param on_queued: called while a repeat's job waits in a cluster's queue, with the job's id
            and the scheduler's reason.
        """

    def forget(self, ended: EndedRepeat) -> None:
        """After the loop recorded ``ended``: drop what the backend kept of it (a job's folder)."""

    def cancel_cell(self, cell_key: str) -> None:
        """A repeat of the cell failed: stop its repeats in flight that have not ended."""


def seconds_left(durations: list[float], runs_left: int, current_elapsed: float = 0.0) -> float | None:
    """Mean duration of finished runs times the runs left, less what the current one has used."""
    if not durations:
        return None
    return max(0.0, sum(durations) / len(durations) * runs_left - current_elapsed)


def run_repeats(
    store: ResultStore,
    plan: SweepPlan,
    spec: SweepSpec,
    finished: dict[RepeatKey, str],
    retry_failed: bool,
    observer: SweepObserver,
    backend: SweepBackend,
    on_accepted: Callable[[], None] | None = None,
) -> SweepOutcome:
    """Run every pending repeat of the plan's valid cells on ``backend``, recording each as it ends.

    A cell stops at its first failed repeat (an out-of-memory cell would fail every time): its
    repeats not yet started never start, and those in flight are cancelled. Every repeat seen to end
    is recorded once, with its phases, before any cell is stopped.

    :param finished: the repeats the database holds (their state), from resume's check.
    :param on_accepted: called once the backend's first :meth:`~SweepBackend.submit` returned (it
        took the sweep rather than refuse it), before anything is recorded.
    :raises UnsavedResultError: the database refused a result (saved beside it where it can be).
    """
    return _SweepLoop(store, plan, spec, finished, retry_failed, observer, backend).run(on_accepted)


class _SweepLoop:
    """One call's bookkeeping of a sweep, whatever its backend."""

    def __init__(
        self,
        store: ResultStore,
        plan: SweepPlan,
        spec: SweepSpec,
        finished: dict[RepeatKey, str],
        retry_failed: bool,
        observer: SweepObserver,
        backend: SweepBackend,
    ) -> None:
        self.store, self.plan, self.spec, self.finished = store, plan, spec, finished
        self.observer, self.backend = observer, backend
        self.cells = {cell.key: cell for cell in plan.valid_cells}
        # What stays recorded: a failed repeat to retry is pending again (its row replaced).
        self.recorded = {
            key: status for key, status in finished.items() if not (retry_failed and status not in MEASURED)
        }
        self.stopped = {cell_key for (cell_key, _), status in self.recorded.items() if status not in MEASURED}
        self.announced: dict[RepeatKey, int] = {}  # started, not yet ended -> the runs left when it started
        self.durations = store.process_seconds(spec.name) if backend.estimates_time_left else []
        self.runs_done = 0
        self.already = sum(
            1 for cell in plan.valid_cells for repeat in range(spec.repeats) if (cell.key, repeat) in self.recorded
        )

    def pending(self) -> list[Repeat]:
        """Each repeat neither recorded, nor started, nor of a stopped cell; in rounds (every cell
        once, then every cell again), so slow drift of the machine spreads over all cells."""
        return [
            Repeat(cell, repeat)
            for repeat in range(self.spec.repeats)
            for cell in self.plan.valid_cells
            if (cell.key, repeat) not in self.recorded
            and (cell.key, repeat) not in self.announced
            and cell.key not in self.stopped
        ]

    def run(self, on_accepted: Callable[[], None] | None = None) -> SweepOutcome:
        # The cells' runs in the database, those beyond a lowered --repeats too.
        in_database = sum(1 for cell_key, _ in self.recorded if cell_key in self.cells)
        with self.backend.running(set(self.finished), self.cells):
            self.observer.started(
                self.plan,
                runs_total=len(self.pending()) + self.already,
                runs_finished=self.already,
                runs_recorded=in_database,
            )
            while True:
                queue = self.pending()
                taken = self.backend.submit(queue)
                if on_accepted is not None:
                    accepted, on_accepted = on_accepted, None
                    accepted()
                self._announce(taken, len(queue))
                if not self.backend.in_flight():
                    break
                if self.backend.reports_counts:
                    ended = self.backend.wait(self._waiting, self._queued, on_counts=self._counted)  # type: ignore[call-arg]
                else:
                    ended = self.backend.wait(self._waiting, self._queued)
                failed = [item.repeat.cell.key for item in ended if not self._record(item)]
                for cell_key in dict.fromkeys(failed):
                    self.backend.cancel_cell(cell_key)
                    self.announced = {key: left for key, left in self.announced.items() if key[0] != cell_key}
        cells = summarise(self.store.runs(sweep=self.spec.name))
        # A row the summaries leave out (a newer core's result, a damaged row) is said, as core
        # results and core report say it, never dropped silently from a cell's counts.
        skipped = [str(row) for row in self.store.skipped_rows]
        for row in skipped:
            logging.getLogger(__name__).warning("core: warning: %s", row)
        return SweepOutcome(
            name=self.spec.name,
            database=self.store.path,
            runs_done=self.runs_done,
            runs_already_finished=self.already,
            skipped_invalid=self.plan.invalid_cells,
            cells=cells,
            skipped_rows=skipped,
        )

    def _announce(self, taken: list[Repeat], queued: int) -> None:
        done = self.already + self.runs_done
        total = done + len(self.announced) + queued
        left = self._seconds_left(queued)
        for repeat in taken:
            self.announced[repeat.key] = queued
            self.observer.run_started(repeat.cell, repeat.index, done, total, left)
            assert repeat.cell.config is not None, "only validated cells run"
            self.observer.run_starting(repeat.cell.config)

    def _seconds_left(self, runs_left: int, elapsed: float = 0.0) -> float | None:
        return seconds_left(self.durations, runs_left, elapsed) if self.backend.estimates_time_left else None

    def _waiting(self, repeat: Repeat, elapsed: float) -> None:
        left = self.announced.get(repeat.key, 1)
        self.observer.waiting(repeat.cell, repeat.index, elapsed, self._seconds_left(left, elapsed))

    def _queued(self, repeat: Repeat, job: str, reason: str) -> None:
        self.observer.queued(repeat.cell, repeat.index, job, reason)

    def _counted(self, queued: int, running: int) -> None:
        """The backend's poll found ``queued`` and ``running`` jobs: the sweep's counts, told."""
        asked = self.spec.repeats
        mine = [
            status for (cell_key, index), status in self.recorded.items() if cell_key in self.cells and index < asked
        ]
        done = len(mine)
        total = done + len(self.announced) + len(self.pending())
        failed = sum(1 for status in mine if status not in MEASURED)
        self.observer.jobs_counted(JobCounts(queued, running, done, failed, total))

    def _record(self, ended: EndedRepeat) -> bool:
        """Record one ended repeat, then let the backend forget it; returns whether it was ok."""
        cell, index, result = ended.repeat.cell, ended.repeat.index, ended.result
        if cell.toy:
            mark_toy_result(result)
        try:
            self.store.add(
                result,
                sweep=self.spec.name,
                cell_key=cell.key,
                cell_label=cell.label,
                repeat=index,
                process_seconds=ended.seconds,
                replace=ended.repeat.key in self.finished,
            )
        except StoreError as error:
            self.observer.result_ready(ended.result)
            self.observer.run_not_recorded(cell, index, result, ended.seconds or 0.0)
            raise unsaved_result(self.store.path, self.spec.name, ended, error) from None
        self.backend.forget(ended)
        self.announced.pop(ended.repeat.key, None)
        self.recorded[ended.repeat.key] = result.status.state.value
        if result.status.state.value not in MEASURED:
            self.stopped.add(cell.key)
        if ended.seconds is not None and self.backend.estimates_time_left:
            self.durations.append(ended.seconds)
        self.runs_done += 1
        self._tell_ended(ended)
        return result.status.ok

    def _tell_ended(self, ended: EndedRepeat) -> None:
        self.observer.result_ready(ended.result)
        self.observer.run_finished(ended.repeat.cell, ended.repeat.index, ended.result, ended.seconds or 0.0)


# --- a result the database refused: saved beside it, recorded on resume -----------------------


def _unsaved_file(database: Path, sweep: str, cell: Cell, repeat: int) -> Path:
    return unsaved_directory(database) / f"{sweep}-cell{cell.index + 1}-repeat{repeat + 1}.json"


def _save_unsaved(path: Path, document: dict[str, Any]) -> str | None:
    """Write ``document`` whole to ``path`` (None) or say why it could not be written."""
    from core.base.files import OutputError, write_atomically

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps(document, indent=1) + "\n", "unsaved result")
        return None
    except OutputError as error:
        why = str(error)
    except OSError as exc:
        from core.base.files import describe_os_error

        why = f"cannot create {path.parent}: {describe_os_error(exc)}"
    try:
        path.parent.rmdir()  # only when empty: leave no folder that holds nothing
    except OSError:
        pass
    return why


def unsaved_result(database: Path, sweep: str, ended: EndedRepeat, error: StoreError) -> UnsavedResultError:
    """The error that stops a sweep whose database refused a result, after saving the result if it can."""
    cell, repeat, seconds = ended.repeat.cell, ended.repeat.index, ended.seconds or 0.0
    document = {
        "sweep": sweep,
        "cell_key": cell.key,
        "cell_label": cell.label,
        "repeat": repeat,
        "process_seconds": seconds,
        "result": ended.result.model_dump(mode="json"),
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


def record_unsaved(store: ResultStore, plan: SweepPlan, finished: dict[RepeatKey, str]) -> int:
    """Record the results a failed write left in ``<database>.unsaved/`` for this sweep; returns how many.

    A file is removed once its run is in the database; one that cannot be read, belongs to a
    cell no longer in the grid, or whose repeat is already recorded stays, with a warning.
    """
    directory = unsaved_directory(store.path)
    if not directory.is_dir():
        return 0
    log = logging.getLogger(__name__)
    cells = {cell.key: cell for cell in plan.valid_cells}
    name = plan.spec.name
    recovered = 0
    for path in sorted(directory.glob(f"{name}-cell*-repeat*.json")):
        try:
            document = parse_json(path.read_text(encoding="utf-8"))
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
