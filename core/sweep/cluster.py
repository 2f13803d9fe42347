"""A sweep on a Slurm cluster (``core sweep FILE --executor slurm``): the sweep loop's Slurm backend
(core.sweep.loop). Every pending repeat is a batch job running the same child a local sweep runs
(``python -m core.running.child REQUEST RESULT``, with the cell's validated plan), and the
submitting process commits each result, once, as its job ends.

The database stays the one record of results; the jobs in flight are listed in a ledger,
``<jobs directory>/<sweep>/jobs.json`` (written atomically after every submission, and once for
the jobs each poll found ended), so the submitting
process may be killed: ``--resume`` waits for the jobs still queued or running, records those that
ended, and submits again the repeats whose jobs were lost. A repeat is recorded before its ledger
entry is dropped, and an entry for a repeat the database already holds is dropped unread, so a kill
between the two never records a run twice. A job is listed (by its name and folder) before sbatch
is asked for it, so one whose answer never arrived (the sweep stopped while sbatch answered) is
found in Slurm and waited for, or cancelled, never left running unlisted.

Each job's folder (request.json, result.json and its .partial, the Slurm output, job-ended.json
written by the batch script) lives under the jobs directory, beside the database by default: on a
cluster, a filesystem the nodes share.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import shlex
import shutil
import sys
import tempfile
from collections import deque
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

from core.base.errors import CoreError
from core.base.files import OutputError, describe_os_error, parse_json, write_atomically
from core.base.results import RunResult, RunState, Status
from core.running import processes
from core.sweep.loop import EndedRepeat, Repeat, RepeatKey, SweepBackend, SweepNotStarted
from core.sweep.plan import Cell
from core.sweep.remote_plan import write_job_request
from core.sweep.site import JobLines, Site
from core.sweep.slurm_arrays import (
    ARRAY_FOLDER,
    abridged,
    array_job_id,
    array_option,
    arrays_refused,
    in_arrays,
    task_job_id,
    write_array_folder,
)
from core.sweep.slurm_jobs import (
    ACTIVE_STATES,
    Scheduler,
    SlurmError,
    SlurmScheduler,
    log_path_pattern,
    never_starts,
)
from core.sweep.slurm_logs import keep_log, logs_folder, prune_logs
from core.sweep.slurm_settings import SlurmSettings
from core.sweep.spec import SweepError, SweepSpec

#: how a cluster sweep reaches Slurm; a name of its own, so tests can swap in a simulated scheduler
make_scheduler: Callable[[], Scheduler] = SlurmScheduler

_log = logging.getLogger(__name__)
LEDGER_NAME = "jobs.json"
ENDED_NAME = "job-ended.json"  # the batch script's record of the worker's exit code and seconds
_OUTPUT_TAIL_CHARS = 4000
#: a job's folder in its sweep's folder: cell and repeat, and (since each submission has a folder of
#: its own) a token
_JOB_FOLDER = re.compile(r"cell[0-9]+-repeat[0-9]+(-[0-9a-f]+)?")
_PROBE_BYTES = 8192  # what the check of the jobs directory writes: about a job's request and script

#: how Slurm's final states that mean "ended from outside" are recorded (core's RunState values)
_ENDED_BY_SLURM = {
    "OUT_OF_MEMORY": (RunState.oom, "OutOfMemory", "Slurm ended the job: it used more memory than it asked for"),
    "CANCELLED": (RunState.killed, "JobCancelled", "the job was cancelled (scancel, or the cluster's administrator)"),
    "NODE_FAIL": (RunState.killed, "NodeFail", "a node of the job failed"),
    "BOOT_FAIL": (RunState.killed, "BootFail", "a node of the job failed to boot"),
    "PREEMPTED": (RunState.killed, "JobPreempted", "the job was preempted and not requeued"),
}


class NotSubmitted(SweepError, SweepNotStarted):
    """The sweep's jobs directory or ledger cannot take this sweep: nothing was submitted."""


class SubmissionRefused(NotSubmitted):
    """sbatch refused a job (a partition, account or option the cluster does not take), or the jobs
    directory cannot hold the sweep's folder: the jobs this call submitted before it were cancelled
    and their folders removed, so no half-made sweep stays."""


class SubmissionFailed(SlurmError, SweepNotStarted):
    """A job could not be submitted (sbatch gave no answer, its folder could not be written): as for
    :class:`SubmissionRefused`, nothing this call submitted stays."""


class SubmissionStopped(SweepError):
    """sbatch refused a job after jobs of this call had begun to measure (or ended): those stay in
    Slurm and in the ledger, for ``--resume`` to record; only the others were withdrawn."""


class SubmissionStoppedByFault(SlurmError):
    """As :class:`SubmissionStopped`, for a submission that failed rather than was refused."""


def jobs_directory(database: Path, settings: SlurmSettings) -> Path:
    """Where a cluster sweep's job folders and ledgers live: the table's, else ``<database>.jobs``;
    an absolute path (the nodes, and a resume from another folder, must find the same one)."""
    path = Path(settings.jobs_directory) if settings.jobs_directory else Path(f"{database}.jobs")
    return Path(os.path.abspath(path))


def jobs_in_flight(database: Path, settings: SlurmSettings | None, sweep: str) -> tuple[Path, int] | None:
    """The ledger of sweep ``sweep`` and how many Slurm jobs it lists, where it lists any (in the
    ``[slurm]`` table's jobs directory, else beside the database); None where there is none."""
    path = jobs_directory(database, settings or SlurmSettings()) / sweep / LEDGER_NAME
    try:
        jobs = parse_json(path.read_text(encoding="utf-8"))["jobs"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return (path, len(jobs)) if isinstance(jobs, list) and jobs else None


def check_jobs_directory(database: Path, settings: SlurmSettings, sweep: str | None = None) -> None:
    """Refuse, before anything is written, a jobs directory that cannot hold the jobs' folders.

    The directory itself may be made, and the default one (``<database>.jobs``) with the database's
    folder; one the ``[slurm]`` table names must be inside a folder that exists, so a mistyped path
    on a shared filesystem is an error rather than a new tree. A link that leads nowhere (dangling,
    or a loop) is refused, as is sweep ``sweep``'s own folder in it where that is not a folder.

    :raises SweepError: naming the directory and what is wrong with it.
    """
    path = jobs_directory(database, settings)
    what = (
        f"slurm.jobs_directory {path}"
        if settings.jobs_directory
        else f"the jobs directory {path} (beside the database; --slurm-jobs-directory names another)"
    )
    if "\\" in str(path):
        raise SweepError(f"{what}: a path with a backslash, which sbatch's log paths cannot hold; choose another")
    try:
        # lexists: a link is there even where it leads nowhere, and mkdir would fail on it.
        existing = next(folder for folder in (path, *path.parents) if os.path.lexists(folder))
        _check_folder(what, existing)
        if sweep is not None and existing == path and os.path.lexists(path / sweep):
            _check_folder(f"{what}: the sweep's folder", path / sweep)
    except OSError as error:
        raise SweepError(f"{what}: cannot be looked at: {describe_os_error(error)}") from None
    if existing != path and settings.jobs_directory and existing != path.parent:
        raise SweepError(f"{what}: its folder {path.parent} does not exist; create it, on a filesystem every node sees")
    if sweep is not None and existing == path and os.path.isdir(path / sweep):
        existing = path / sweep  # where the sweep writes: its ledger and its jobs' folders
    _probe_folder(what, existing)


def _probe_folder(what: str, folder: Path) -> None:
    """Make and remove a folder with a file in ``folder``, as the sweep will: permission bits say
    nothing of what a filesystem refuses (root may "write" to /sys or /proc by os.access, and
    mkdir there fails), nor of a full disk or an exhausted quota. Leaves nothing behind."""
    try:
        probe = Path(tempfile.mkdtemp(prefix=".core-jobs-probe-", dir=folder))
    except OSError as error:
        raise SweepError(f"{what}: cannot make a folder in {folder}: {describe_os_error(error)}") from None
    try:
        # Some bytes, as a job's request and script are: an empty file takes no block of a full disk.
        (probe / "probe").write_bytes(b"\n" * _PROBE_BYTES)
    except OSError as error:
        raise SweepError(f"{what}: cannot write a file in {folder}: {describe_os_error(error)}") from None
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def _check_folder(what: str, folder: Path) -> None:
    """Refuse ``folder`` (which exists, as a link at least) where it is not a folder one can enter."""
    if folder.is_symlink() and not folder.exists():
        raise SweepError(
            f"{what}: {folder} is a link to {os.readlink(folder)}, which leads nowhere (a dangling link, or a loop "
            "of links); remove it or point it at a folder"
        )
    if not folder.is_dir():
        raise SweepError(f"{what}: {folder} is a file, not a folder")


@dataclass
class JobEntry:
    """One submitted repeat: its job, and the folder its files are in."""

    cell_key: str
    repeat: int
    #: None while sbatch has not answered: the entry is written before sbatch is asked, so a job
    #: whose answer is lost is looked up by its name and folder (SlurmBackend._find_unanswered)
    job_id: str | None
    folder: str
    submitted_at: float  # seconds since the epoch (the scheduler's clock) at submission
    job_name: str | None = None  # absent from a ledger written by an older core
    #: a task of a job array (core.sweep.slurm_arrays): the array's folder and the task's index;
    #: ``job_id`` is then Slurm's ``ARRAYID_TASK``, ``job_name`` the array's
    array_folder: str | None = None
    array_task: int | None = None

    def described(self) -> str:
        """The job as a person finds it in squeue: its id, or its name while sbatch has not answered."""
        return self.job_id if self.job_id is not None else f"{self.job_name} (sbatch gave no id)"


class JobLedger:
    """The jobs a sweep has in flight, kept in a JSON file replaced whole on every change.

    It names the database its results go to: two databases' sweeps of one name sharing a jobs
    directory would otherwise each take the other's jobs for theirs.
    """

    def __init__(self, path: Path, sweep: str, database: Path) -> None:
        self.path = path
        self.sweep = sweep
        self.database = os.path.realpath(database)
        self.entries: dict[tuple[str, int], JobEntry] = {}

    @classmethod
    def load(cls, path: Path, sweep: str, database: Path) -> JobLedger:
        ledger = cls(path, sweep, database)
        if not path.exists():
            return ledger
        try:
            document = parse_json(path.read_text(encoding="utf-8"))
            owner = document.get("database", ledger.database)
            for item in document["jobs"]:
                entry = JobEntry(**item)
                ledger.entries[(entry.cell_key, entry.repeat)] = entry
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise NotSubmitted(
                f"cannot read the sweep's job ledger {path}: {exc}; the jobs it listed are unknown to this "
                "sweep (see squeue); move it away to submit their repeats again"
            ) from None
        if owner != ledger.database:
            raise NotSubmitted(
                f"the job ledger {path} belongs to sweep {sweep!r} of another database, {owner}; give this "
                "sweep another jobs directory (--slurm-jobs-directory) or another name"
            )
        return ledger

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        document = {
            "sweep": self.sweep,
            "database": self.database,
            "jobs": [asdict(entry) for entry in self.entries.values()],
        }
        write_atomically(self.path, json.dumps(document, indent=1) + "\n", "the sweep's job ledger")


def batch_script(request: Path, result: Path, ended: Path, site: JobLines | None = None) -> str:
    """The job's script: the worker, then its exit code and seconds written beside the result.

    The interpreter is this process's: a cluster's nodes see the same installation (a shared
    filesystem), as they see the job's folder. A site file (core/sweep/site.py) adds its #SBATCH
    and setup lines, and may run the worker inside a container, with the container's interpreter.
    """
    site = site or JobLines()
    return (
        "#!/bin/bash\n"
        "# One repeat of a core sweep (core/sweep/cluster.py); the submitting sweep reads what it leaves.\n"
        f"{site.header()}"
        "started=$(date +%s%N)\n"
        f"{site.worker(['-m', 'core.running.child', str(request), str(result)])}\n"
        "code=$?\n"
        "ended=$(date +%s%N)\n"
        # A file the sweep reads only once it is whole: written aside, then renamed.
        f'printf \'{{"exit_code": %d, "seconds": %d.%03d}}\\n\' "$code" $(( (ended - started) / 1000000000 )) '
        f"$(( (ended - started) / 1000000 % 1000 )) > {shlex.quote(str(ended))}.tmp\n"
        f"mv {shlex.quote(str(ended))}.tmp {shlex.quote(str(ended))}\n"
        'exit "$code"\n'
    )


def _read_result(path: Path) -> RunResult | None:
    try:
        return RunResult.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _read_ended(path: Path) -> tuple[int, float] | None:
    try:
        document = parse_json(path.read_text(encoding="utf-8"))
        return int(document["exit_code"]), float(document["seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _output_tail(folder: Path, job_id: str) -> str:
    try:
        data = (folder / f"slurm-{job_id}.out").read_bytes()
    except OSError:
        return ""
    return data[-_OUTPUT_TAIL_CHARS:].decode("utf-8", errors="replace").strip()


def job_result(
    folder: Path, job_id: str, state: str | None, config: Any, time_limit_minutes: int
) -> tuple[RunResult, float | None]:
    """How an ended job is recorded: the worker's result where it wrote one (its run was over,
    whatever Slurm did to the job after); else the phases it measured (result.json.partial) with a
    status saying how the job ended.

    :param state: Slurm's final state, or None when Slurm no longer knows the job.
    """
    result = _read_result(folder / "result.json")
    partial = _read_result(folder / "result.json.partial")
    ended = _read_ended(folder / ENDED_NAME)
    seconds = ended[1] if ended is not None else None
    output = _output_tail(folder, job_id)
    base = partial or RunResult.of_config(config, world_size=config.replicas)
    phase = processes.phase_after(base)
    where = f"Slurm job {job_id}"
    if result is not None:
        return result, seconds
    if state == "TIMEOUT":
        base.status = processes.timeout_status(
            time_limit_minutes * 60.0,
            phase=phase,
            output=output,
            limit=f"{where} reached its time limit, --time={time_limit_minutes} (minutes), state {state}",
        )
        return base, seconds
    if state == "DEADLINE":
        base.status = Status(
            state=RunState.timeout,
            phase=phase,
            error_type="Deadline",
            message=f"{where} reached its deadline (sbatch --deadline) before it finished, state {state}. "
            f"{processes.describe_output(output)}",
        )
        return base, seconds
    if state in _ENDED_BY_SLURM:
        run_state, error_type, why = _ENDED_BY_SLURM[state]
        base.status = Status(
            state=run_state,
            phase=phase,
            error_type=error_type,
            message=f"{why} ({where}, state {state}). {processes.describe_output(output)}",
        )
        return base, seconds
    if partial is not None and not partial.status.ok:
        return partial, seconds  # the worker's own account of a failure (an interrupted run)
    if ended is None:
        base.status = Status(
            state=RunState.error,
            phase=phase,
            error_type="JobEnded",
            message=f"{where} ended ({state or 'Slurm no longer knows it'}) before its worker finished and "
            f"without a result. {processes.describe_output(output)}",
        )
        return base, seconds
    code = ended[0]
    # bash reports a worker killed by signal N as 128 + N; exit_status wants Popen's -N.
    returncode = -(code - 128) if 128 < code < 160 else code
    base.status = processes.exit_status(returncode, process=f"the worker of {where}", phase=phase, output=output)
    return base, seconds


def never_started(config: Any, job_id: str, reason: str, meaning: str) -> RunResult:
    """How a job that Slurm says can never start (pending for ``reason``) is recorded, once core has
    cancelled it: an error naming the job, Slurm's reason and what it means."""
    result = RunResult.of_config(config, world_size=config.replicas)
    result.status = Status(
        state=RunState.error,
        phase="setup",
        error_type="JobCannotStart",
        message=f"Slurm job {job_id} can never start: it is pending with reason {reason}: {meaning} "
        "(https://slurm.schedmd.com/job_reason_codes.html); core cancelled it. Change the cell (its nodes, the "
        "[slurm] table's time limit, partition, account or QOS) or ask the cluster's administrator",
    )
    return result


class SlurmBackend(SweepBackend):
    """The sweep's repeats as Slurm jobs: every pending repeat submitted at once, their states polled
    every ``poll_seconds``, a failed cell's jobs still running cancelled.

    The jobs in flight are kept in the ledger, so a sweep killed while they run waits for them when
    resumed. KeyboardInterrupt (and any error that stops the sweep) leaves the jobs running: the
    ledger lists them for ``--resume``, and a line on stderr names them.
    """

    reports_counts: ClassVar[bool] = True

    def __init__(
        self, spec: SweepSpec, database: Path, scheduler: Scheduler | None = None, site: Site | None = None
    ) -> None:
        self.spec, self.database, self.site = spec, database, site
        self.settings = spec.slurm or SlurmSettings()
        self.scheduler = scheduler or make_scheduler()
        self.jobs_root = jobs_directory(database, self.settings)
        self.root = self.jobs_root / spec.name
        self.time_limit = self.settings.job_time_limit_minutes(spec.timeout_seconds)
        self.ledger = JobLedger(self.root / LEDGER_NAME, spec.name, database)
        self.cells: Mapping[str, Cell] = {}
        self.made: list[Path] = []
        self._polled = False
        #: since when (the scheduler's clock) Slurm has answered without each job, poll after poll
        self._unknown_since: dict[RepeatKey, float] = {}
        self._max_array_size: int | None = None  # the cluster's, asked at the first submission
        self._ledger_behind = False  # entries forgotten since the ledger was last written

    @classmethod
    def checked(cls, spec: SweepSpec, database: Path, site: Site | None = None) -> SlurmBackend:
        """The backend for a sweep this machine can submit, its jobs directory able to hold the jobs'
        folders; SweepError otherwise, before anything is written."""
        from core.sweep.slurm_jobs import unavailable_reason

        why = unavailable_reason()
        if why is not None:
            raise SweepError(f"--executor slurm: this machine cannot submit Slurm jobs: {why}")
        check_jobs_directory(database, spec.slurm or SlurmSettings(), spec.name)
        return cls(spec, database, site=site)

    @contextmanager
    def running(self, settled: Collection[RepeatKey], cells: Mapping[str, Cell]) -> Iterator[None]:
        self.cells = cells
        # What existed before this call (a link counts, even one leading nowhere), so a refused
        # submission removes only what it made.
        made = (self.jobs_root, self.root, self.root / LEDGER_NAME)
        self.made = [path for path in made if not os.path.lexists(path)]
        self.ledger = JobLedger.load(self.root / LEDGER_NAME, self.spec.name, self.database)
        self._make_folder()
        self._find_unanswered()
        self._remove_unlisted_folders()
        prune_logs(
            logs_folder(self.jobs_root, self.spec.name),
            now=self.scheduler.now(),
            retention_days=self.settings.log_retention_days,
            in_flight={entry.job_id for entry in self.ledger.entries.values() if entry.job_id is not None},
        )
        try:
            self._forget_settled(settled)
        except OutputError as error:  # the ledger cannot be written (a full disk): nothing was submitted
            self._withdraw([])
            raise SubmissionFailed(f"sweep {self.spec.name} not submitted: {error}") from None
        try:
            yield
        except BaseException:  # Ctrl-C, SIGTERM, a result the database refused: the jobs go on
            self._tell_jobs_stay()
            raise
        self._save_ledger_if_behind()

    def _tell_jobs_stay(self) -> None:
        """On the way out of a stopped sweep: the ledger written as it stands (a stop may land
        between a submission and the ledger's update), and a line naming the jobs that go on."""
        if not self.ledger.entries and not self._ledger_behind:
            return
        try:
            self.ledger.save()
        except (OSError, CoreError) as error:
            _log.warning("core: warning: cannot write the sweep's job ledger %s: %s", self.ledger.path, error)
        entries = self.ledger.entries.values()
        if not entries:
            return
        print(
            f"core: {len(entries)} job(s) of sweep {self.spec.name} stay in Slurm "
            f"({', '.join(abridged([entry.described() for entry in entries]))}); --resume waits for them "
            "and records their results, scancel stops them",
            file=sys.stderr,
        )

    def _find_unanswered(self) -> None:
        """Entries whose sbatch never answered (the sweep stopped, or was killed, while it did):
        the job is looked up by its name and folder and waited for; where Slurm has none, the
        entry and its folder go and the repeat is submitted again."""
        unanswered = [key for key, entry in self.ledger.entries.items() if entry.job_id is None]
        for key in unanswered:
            entry = self.ledger.entries[key]
            try:
                found = self._lookup(entry)
            except SlurmError as error:
                raise SubmissionFailed(
                    f"sweep {self.spec.name} not resumed: cannot tell whether job {entry.job_name} (in "
                    f"{entry.folder}) was submitted: {error}; try again once Slurm answers"
                ) from None
            if found is None:
                self._drop(key)
            else:
                entry.job_id = found
        if unanswered:
            self._save_ledger()

    def _remove_unlisted_folders(self) -> None:
        """Remove the job folders the ledger does not list: left by a sweep that died between making
        one and listing it (its job was never submitted: an entry is written before sbatch is
        asked), or whose entry a refusal dropped. Each submission has a folder of its own, so
        these are never reused; only folders named as core names them go."""
        listed = {os.path.normpath(entry.folder) for entry in self.ledger.entries.values()}
        listed |= {os.path.normpath(entry.array_folder) for entry in self.ledger.entries.values() if entry.array_folder}
        try:
            children = list(self.root.iterdir())
        except OSError:
            return
        for child in children:
            core_named = _JOB_FOLDER.fullmatch(child.name) or ARRAY_FOLDER.fullmatch(child.name)
            if core_named and child.is_dir() and not child.is_symlink():
                if os.path.normpath(child.resolve()) not in listed and os.path.normpath(child) not in listed:
                    shutil.rmtree(child, ignore_errors=True)

    def _lookup(self, entry: JobEntry) -> str | None:
        """The id of ``entry``'s job where Slurm has it. An earlier job of the same folder (one a
        refusal withdrew, say) may still be listed beside it; Slurm numbers jobs in the order they
        are submitted, so the last is this one."""
        if entry.job_name is None:
            return None
        found = self.scheduler.find(entry.job_name, Path(entry.array_folder or entry.folder))
        if not found:
            return None
        latest = max(found, key=int)
        return latest if entry.array_task is None else task_job_id(latest, entry.array_task)

    def _make_folder(self) -> None:
        """The sweep's folder in the jobs directory (check_jobs_directory looked, this makes it)."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            self._withdraw([])
            raise SubmissionRefused(
                f"sweep {self.spec.name} not submitted: cannot make its folder {self.root} in the jobs directory: "
                f"{describe_os_error(error)}"
            ) from None

    def _forget_settled(self, settled: Collection[RepeatKey]) -> None:
        """Drop the ledger's entries for repeats the database holds (the sweep was killed between
        the commit and the ledger's update) or for cells the grid no longer runs."""
        stale = [key for key in self.ledger.entries if key in settled or key[0] not in self.cells]
        if stale:
            gone = [key for key in stale if key not in settled]
            self._cancel(self._job_ids(gone), "jobs of cells this sweep no longer runs")
            for key in stale:
                self._drop(key)
        self._save_ledger()

    def submit(self, repeats: Sequence[Repeat]) -> list[Repeat]:
        """Submit every repeat without a job (one listed in the ledger is waited for, not submitted
        again); on any failure, withdraw those this call submitted."""
        submitted: list[RepeatKey] = []
        batches = deque(self._batches([repeat for repeat in repeats if repeat.key not in self.ledger.entries]))
        while batches:
            batch = batches.popleft()
            try:
                if len(batch) == 1:
                    self._submit_one(batch[0])
                else:
                    self._submit_array(batch)
                submitted += [repeat.key for repeat in batch]
            except (SlurmError, OSError, CoreError) as error:
                if len(batch) > 1 and isinstance(error, SlurmError) and error.refused and arrays_refused(str(error)):
                    self._single_jobs_only(error)
                    batches = deque([[repeat] for repeat in (*batch, *(r for rest in batches for r in rest))])
                    continue
                # where sbatch's answer was lost and Slurm could not be asked, the entries stay
                submitted += [repeat.key for repeat in batch if repeat.key in self.ledger.entries]
                kept = self._withdraw(submitted)
                raise self._submission_error(error, batch, len(submitted) - len(kept), kept) from None
        return list(repeats)

    def _batches(self, repeats: list[Repeat]) -> list[list[Repeat]]:
        """``repeats`` as core submits them: in job arrays of those asking for the same job, at most
        the cluster's MaxArraySize tasks each; each alone where arrays are off (the table's
        ``job_arrays``, MaxArraySize 0 or 1)."""
        if not self.settings.job_arrays or len(repeats) < 2:
            return [[repeat] for repeat in repeats]
        if self._max_array_size is None:
            self._max_array_size = self.scheduler.max_array_size()
        if self._max_array_size < 2:
            return [[repeat] for repeat in repeats]
        return in_arrays(repeats, lambda repeat: tuple(self._sbatch_options(repeat)), self._max_array_size)

    def _single_jobs_only(self, error: SlurmError) -> None:
        _log.warning("core: warning: %s; submitting each repeat as a job of its own", error)
        self._max_array_size = 0

    def in_flight(self) -> bool:
        return bool(self.ledger.entries)

    def wait(
        self,
        on_wait: Callable[[Repeat, float], None],
        on_queued: Callable[[Repeat, str, str], None] | None = None,
        on_counts: Callable[[int, int], None] | None = None,
    ) -> list[EndedRepeat]:
        """Ask Slurm every ``poll_seconds`` until a poll finds jobs ended; every one of them. A job
        pending for a reason that means it can never start is cancelled and ends there, as an error;
        ``on_queued`` hears of every other pending job after each poll, with its id and Slurm's reason,
        and ``on_counts`` of how many jobs Slurm then listed as pending and as running."""
        while True:
            self._save_ledger_if_behind()
            if self._polled:
                self.scheduler.sleep(self.settings.poll_seconds)
            self._polled = True
            ended = self._poll(on_queued, on_counts)
            if ended:
                return ended

    def forget(self, ended: EndedRepeat) -> None:
        """Once its repeat is recorded, a job leaves the ledger (written before the next poll) and its
        folder goes, its log kept: a kill before the ledger is written leaves an entry the database
        holds, dropped unread on resume."""
        entry = self.ledger.entries[ended.repeat.key]
        if entry.job_id is not None and self.settings.log_retention_days > 0:
            keep_log(Path(entry.folder), entry.job_id, logs_folder(self.jobs_root, self.spec.name))
        self.ledger.entries.pop(ended.repeat.key)
        # Written once for all the jobs a poll found ended (before the next poll, or as the sweep
        # ends), not per job: on a grid of thousands each write is megabytes. A kill before leaves
        # entries of recorded repeats, which a resume drops unread.
        self._ledger_behind = True
        self._remove_folders(entry)

    def _save_ledger_if_behind(self) -> None:
        if self._ledger_behind:
            self._save_ledger()

    def _drop(self, key: RepeatKey) -> None:
        """Forget ``key``'s entry (the caller saves the ledger) and remove its folder, and its
        array's folder once no entry of the ledger is a task of that array."""
        self._remove_folders(self.ledger.entries.pop(key))

    def _remove_folders(self, entry: JobEntry) -> None:
        shutil.rmtree(entry.folder, ignore_errors=True)
        array = entry.array_folder
        if array is not None and all(other.array_folder != array for other in self.ledger.entries.values()):
            shutil.rmtree(array, ignore_errors=True)

    def cancel_cell(self, cell_key: str) -> None:
        """A failed repeat stops its cell: its jobs still running are cancelled and forgotten, never
        recorded. A job whose worker has already written its result is left to end and recorded."""
        doomed = [
            key
            for key, entry in self.ledger.entries.items()
            if key[0] == cell_key and not (Path(entry.folder) / "result.json").exists()
        ]
        if not doomed:
            return
        self._cancel(self._job_ids(doomed), "the failed cell's other jobs")
        for key in doomed:
            self._drop(key)
        self._save_ledger()

    def _poll(
        self,
        on_queued: Callable[[Repeat, str, str], None] | None = None,
        on_counts: Callable[[int, int], None] | None = None,
    ) -> list[EndedRepeat]:
        """Ask Slurm once: every job that ended, with how it is recorded (none when Slurm did not
        answer), and every pending job that can never start, cancelled."""
        try:
            answer = self.scheduler.states(self._job_ids(list(self.ledger.entries)))
        except SlurmError as error:
            _log.warning("core: warning: %s; asking again in %g s", error, self.settings.poll_seconds)
            return []
        ended = []
        pending: list[tuple[Repeat, str]] = []
        for (cell_key, index), entry in self.ledger.entries.items():
            if entry.job_id is None:
                continue  # found before the sweep waits (_find_unanswered), or the submission stopped it
            state = answer.get(entry.job_id)
            repeat = Repeat(self.cells[cell_key], index)
            if state == "PENDING":
                pending.append((repeat, entry.job_id))
            elif self._has_ended(state, entry, (cell_key, index)):
                result, seconds = job_result(
                    Path(entry.folder), entry.job_id, state, repeat.cell.config, self.time_limit
                )
                ended.append(EndedRepeat(repeat, result, seconds))
        never = self._never_starting(pending, on_queued)
        if on_counts is not None:
            states = [answer.get(entry.job_id) for entry in self.ledger.entries.values() if entry.job_id is not None]
            running = sum(1 for state in states if state in ACTIVE_STATES and state != "PENDING")
            on_counts(len(pending) - len(never), running)
        return ended + never

    def _never_starting(
        self, pending: list[tuple[Repeat, str]], on_queued: Callable[[Repeat, str, str], None] | None
    ) -> list[EndedRepeat]:
        """The pending jobs Slurm says can never start, cancelled, each as an ended repeat; the
        others are told to ``on_queued`` with their reason. Every PENDING job would otherwise keep
        the sweep waiting forever (a multi-node cell on a smaller partition, say), saying nothing."""
        if not pending:
            return []
        try:
            reasons = self.scheduler.pending_reasons([job_id for _, job_id in pending])
        except SlurmError as error:
            _log.warning("core: warning: cannot ask Slurm why jobs wait: %s", error)
            return []
        ended = []
        for repeat, job_id in pending:
            reason = reasons.get(job_id, "")
            meaning = never_starts(reason)
            if meaning is None:
                if on_queued is not None:
                    on_queued(repeat, job_id, reason or "None")
                continue
            try:
                self.scheduler.cancel([job_id])
            except SlurmError as error:  # left listed: cancelled at a later poll, never left pending unlisted
                _log.warning("core: warning: cannot cancel Slurm job %s, which can never start: %s", job_id, error)
                continue
            ended.append(EndedRepeat(repeat, never_started(repeat.cell.config, job_id, reason, meaning), None))
        return ended

    def _has_ended(self, state: str | None, entry: JobEntry, key: RepeatKey) -> bool:
        """Whether a job is over: Slurm says so, or it no longer knows the job."""
        if state is not None:
            self._unknown_since.pop(key, None)
        if state in ACTIVE_STATES:
            return False
        if state is None and not (Path(entry.folder) / ENDED_NAME).exists():
            # Forgotten by squeue (MinJobAge) with no end written: give a slow shared filesystem
            # another poll before calling the job lost, and an answer that left it out once (a
            # controller restarting, a garbled listing) the next: lost, its folder would go while it runs.
            now = self.scheduler.now()
            since = self._unknown_since.setdefault(key, now)
            window = 2 * self.settings.poll_seconds
            return now - entry.submitted_at >= window and now - since >= window
        return True

    def _submission_error(
        self, error: Exception, batch: Sequence[Repeat], withdrawn: int, kept: list[JobEntry]
    ) -> CoreError:
        repeat = batch[0]
        what = f"repeat {repeat.index + 1} of cell {repeat.cell.label!r}"
        if len(batch) > 1:
            what = f"a job array of {len(batch)} repeats, the first {what}"
        undone = ""
        if withdrawn:
            undone = f"; the {withdrawn} job(s) submitted before it were cancelled and their folders removed"
        detail = describe_os_error(error) if isinstance(error, OSError) else str(error)
        refused = isinstance(error, SlurmError) and error.refused
        if kept:
            # What a job measured is never thrown away: those jobs stay, and the sweep with them.
            message = (
                f"sweep {self.spec.name} stopped submitting: {what}: {detail}{undone}; the {len(kept)} job(s) "
                f"that had begun measuring or ended ({', '.join(entry.described() for entry in kept)}) stay in "
                "Slurm: --resume records them and submits the rest"
            )
            return SubmissionStopped(message) if refused else SubmissionStoppedByFault(message)
        message = f"sweep {self.spec.name} not submitted: {what}: {detail}{undone}"
        return SubmissionRefused(message) if refused else SubmissionFailed(message)

    def _withdraw(self, keys: list[RepeatKey]) -> list[JobEntry]:
        """Cancel the jobs of ``keys`` and remove their folders and entries, and whatever folder or
        ledger this call made that now holds nothing; returns the entries kept instead: jobs whose
        worker has left figures (its result, the phases measured so far, its end) or whose
        submission Slurm could not confirm either way."""
        kept = [self.ledger.entries[key] for key in keys if self._must_keep(self.ledger.entries[key])]
        withdrawn = [key for key in keys if self.ledger.entries[key] not in kept]
        self._cancel(self._job_ids(withdrawn), "the jobs submitted before the refusal")
        for key in withdrawn:
            self._drop(key)
        ledger_file = self.root / LEDGER_NAME
        try:
            if self.ledger.entries or ledger_file not in self.made:
                self._save_ledger()
            else:
                ledger_file.unlink(missing_ok=True)
            for folder in (self.root, self.jobs_root):
                # Only what this call made: absent before, and there now (a mkdir that failed made
                # nothing, or only the folders above the one it could not make).
                if folder in self.made and not self.ledger.entries and os.path.lexists(folder):
                    folder.rmdir()  # only when empty
        except (OSError, CoreError) as error:
            _log.warning("core: warning: cannot tidy the jobs directory %s: %s", self.jobs_root, error)
        return kept

    @staticmethod
    def _must_keep(entry: JobEntry) -> bool:
        folder = Path(entry.folder)
        measured = ("result.json", "result.json.partial", ENDED_NAME)
        return entry.job_id is None or any((folder / name).exists() for name in measured)

    def _job_ids(self, keys: list[RepeatKey]) -> list[str]:
        """The Slurm ids of the entries of ``keys`` that have one (sbatch answered)."""
        return [job_id for key in keys if (job_id := self.ledger.entries[key].job_id) is not None]

    def _cancel(self, job_ids: list[str], what: str) -> None:
        if not job_ids:
            return
        try:
            self.scheduler.cancel(job_ids)
        except SlurmError as error:
            _log.warning("core: warning: cannot cancel %s (%s): %s", what, ", ".join(job_ids), error)

    def _save_ledger(self) -> None:
        self._ledger_behind = False
        try:
            self.ledger.save()
        except OSError as error:
            raise OutputError(
                f"cannot write the sweep's job ledger {self.ledger.path}: {describe_os_error(error)}"
            ) from None

    def _make_job_folder(self, repeat: Repeat) -> Path:
        """A new folder for ``repeat``'s job. A folder of its own for each submission: an earlier job
        of the same name (a sweep of the same name run again, its jobs directory removed) still
        listed by squeue would otherwise be taken for this one where sbatch's answer is lost
        (_lookup finds jobs by name and folder)."""
        token = secrets.token_hex(3)
        folder = (self.root / f"cell{repeat.cell.index + 1}-repeat{repeat.index + 1}-{token}").resolve()
        folder.mkdir(parents=True)
        return folder

    def _write_job_files(self, repeat: Repeat, folder: Path) -> Path:
        """``repeat``'s request and batch script in ``folder``; returns the script."""
        assert repeat.cell.planned is not None, "only validated cells run"
        request, result, ended = folder / "request.json", folder / "result.json", folder / ENDED_NAME
        # with the cell's options, where it was planned for a profile; the repeat's seed (Cell.for_repeat)
        write_job_request(request, repeat.cell.for_repeat(repeat.index))
        script = folder / "job.sh"
        site = self._site_lines(repeat)
        # surrogateescape: a folder's bytes that are not UTF-8 are written back as they were
        script.write_text(batch_script(request, result, ended, site), encoding="utf-8", errors="surrogateescape")
        return script

    def _site_lines(self, repeat: Repeat) -> JobLines | None:
        """The site file's lines for ``repeat``'s job (its ``#SBATCH`` defaults, setup, container)."""
        assert repeat.cell.planned is not None, "only validated cells run"
        if self.site is None:
            return None
        return self.site.job_lines(repeat.cell.planned.config.accelerator, self.spec.slurm)

    def _sbatch_options(self, repeat: Repeat) -> list[str]:
        assert repeat.cell.planned is not None, "only validated cells run"
        return self.settings.sbatch_options(
            nodes=repeat.cell.planned.config.nodes, timeout_seconds=self.spec.timeout_seconds
        )

    def _submit_one(self, repeat: Repeat) -> None:
        """Write one repeat's folder (request, batch script), list it in the ledger and submit it.

        The entry is written before sbatch is asked and its id added once sbatch answers; where the
        answer is lost (Ctrl-C or SIGTERM while sbatch ran, no answer in time, no id printed), Slurm
        is asked for the job by its name and folder: found, it is the repeat's job, and a stop then
        leaves it listed for ``--resume``; not found, or refused, the entry and folder go.
        """
        cell = repeat.cell
        folder = self._make_job_folder(repeat)
        try:
            script = self._write_job_files(repeat, folder)
            options = self._sbatch_options(repeat)
            entry = JobEntry(
                cell_key=cell.key,
                repeat=repeat.index,
                job_id=None,
                folder=str(folder),
                submitted_at=self.scheduler.now(),
                job_name=f"core-{self.spec.name}-c{cell.index + 1}r{repeat.index + 1}"[:120],
            )
            self.ledger.entries[repeat.key] = entry
            self._save_ledger()
        except BaseException:
            self.ledger.entries.pop(repeat.key, None)
            shutil.rmtree(folder, ignore_errors=True)
            raise
        assert entry.job_name is not None
        try:
            entry.job_id = self.scheduler.submit(
                script, options, job_name=entry.job_name, log=log_path_pattern(folder, "slurm-%j.out"), directory=folder
            )
        except BaseException as error:
            if not self._adopt_unanswered([repeat.key], refused=isinstance(error, SlurmError) and error.refused):
                raise
            if not isinstance(error, Exception):
                raise  # stopped: the job found stays listed, and the sweep says so on its way out
        self._save_ledger()

    def _adopt_unanswered(self, keys: Sequence[RepeatKey], *, refused: bool) -> bool:
        """After sbatch gave no job id for the entries of ``keys`` (one job, or one array's tasks):
        whether Slurm has the job anyway (then the entries get their ids). Where it has none, or
        sbatch refused, the entries and folders go; where Slurm cannot be asked, the entries stay
        without an id, for ``--resume`` to look up."""
        entry = self.ledger.entries[keys[0]]
        found: str | None = None
        if not refused:
            try:
                found = self._lookup(entry)
            except SlurmError as error:
                _log.warning("core: warning: cannot ask Slurm for job %s: %s", entry.job_name, error)
                return False
        for key in keys:
            if found is None:
                self._drop(key)
            else:
                task = self.ledger.entries[key].array_task
                self.ledger.entries[key].job_id = found if task is None else task_job_id(array_job_id(found), task)
        self._save_ledger()
        return found is not None

    def _submit_array(self, batch: Sequence[Repeat]) -> None:
        """Submit ``batch`` (repeats asking for the same job) as one job array: each repeat's folder
        as for a single job, the array's folder (its index of those folders, its script) and every
        task's entry, all written before sbatch is asked; each task's id is then ``ARRAYID_TASK``. A
        lost answer is handled as for a single job (:meth:`_submit_one`), the array found by its
        name and folder."""
        token = secrets.token_hex(3)
        array_folder = (self.root / f"array-{token}").resolve()
        name = f"core-{self.spec.name}"[:110] + f"-a{token}"
        array_folder.mkdir(parents=True)
        keys: list[RepeatKey] = []
        try:
            now = self.scheduler.now()
            for task, repeat in enumerate(batch):
                folder = self._make_job_folder(repeat)
                self.ledger.entries[repeat.key] = JobEntry(
                    cell_key=repeat.cell.key,
                    repeat=repeat.index,
                    job_id=None,
                    folder=str(folder),
                    submitted_at=now,
                    job_name=name,
                    array_folder=str(array_folder),
                    array_task=task,
                )
                keys.append(repeat.key)
                self._write_job_files(repeat, folder)
            site = self._site_lines(batch[0])
            script = write_array_folder(
                array_folder,
                [Path(self.ledger.entries[key].folder) for key in keys],
                site.directives if site is not None else (),
            )
            self._save_ledger()
        except BaseException:
            for key in keys:
                self._drop(key)
            shutil.rmtree(array_folder, ignore_errors=True)
            raise
        options = [*self._sbatch_options(batch[0]), array_option(len(batch), self.settings.array_throttle)]
        log = log_path_pattern(array_folder, "slurm-%A_%a.out")  # the task's own goes to its repeat's folder
        try:
            array_id = self.scheduler.submit(script, options, job_name=name, log=log, directory=array_folder)
        except BaseException as error:
            if not self._adopt_unanswered(keys, refused=isinstance(error, SlurmError) and error.refused):
                raise
            if not isinstance(error, Exception):
                raise  # stopped: the array found stays listed, and the sweep says so on its way out
        else:
            for task, key in enumerate(keys):
                self.ledger.entries[key].job_id = task_job_id(array_id, task)
        self._save_ledger()
