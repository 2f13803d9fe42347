"""A sweep on a Slurm cluster (``core sweep FILE --executor slurm``): every pending repeat is a
batch job running the same worker a local sweep runs as a child (``python -m core.sweep.worker
REQUEST RESULT``), and the submitting process commits each result, once, as its job ends.

The database stays the one record of results; the jobs in flight are listed in a ledger,
``<jobs directory>/<sweep>/jobs.json`` (written atomically after every change), so the submitting
process may be killed: ``--resume`` waits for the jobs still queued or running, records those that
ended, and submits again the repeats whose jobs were lost. A repeat is recorded before its ledger
entry is dropped, and an entry for a repeat the database already holds is dropped unread, so a kill
between the two never records a run twice.

Each job's folder (request.json, result.json and its .partial, the Slurm output, job-ended.json
written by the batch script) lives under the jobs directory, beside the database by default: on a
cluster, a filesystem the nodes share.
"""

from __future__ import annotations

import json
import logging
import shlex
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.running import processes
from core.storage.files import write_atomically
from core.storage.results import RunResult, RunState, Status
from core.storage.summary import summarise
from core.sweep.slurm_jobs import ACTIVE_STATES, JobStates, SlurmError, cancel, submit
from core.sweep.slurm_settings import SlurmSettings
from core.sweep.spec import SweepError

if TYPE_CHECKING:
    from core.storage.store import ResultStore
    from core.sweep.plan import Cell, SweepPlan
    from core.sweep.run import SweepObserver, SweepOutcome
    from core.sweep.spec import SweepSpec

_log = logging.getLogger(__name__)
LEDGER_NAME = "jobs.json"
ENDED_NAME = "job-ended.json"  # the batch script's record of the worker's exit code and seconds
_OUTPUT_TAIL_CHARS = 4000

#: how Slurm's final states that mean "ended from outside" are recorded (core's RunState values)
_ENDED_BY_SLURM = {
    "OUT_OF_MEMORY": (RunState.oom, "OutOfMemory", "Slurm ended the job: it used more memory than it asked for"),
    "CANCELLED": (RunState.killed, "JobCancelled", "the job was cancelled (scancel, or the cluster's administrator)"),
    "NODE_FAIL": (RunState.killed, "NodeFail", "a node of the job failed"),
    "BOOT_FAIL": (RunState.killed, "BootFail", "a node of the job failed to boot"),
    "PREEMPTED": (RunState.killed, "JobPreempted", "the job was preempted and not requeued"),
}
_TIMED_OUT = ("TIMEOUT", "DEADLINE")


def jobs_directory(database: Path, settings: SlurmSettings) -> Path:
    """Where a cluster sweep's job folders and ledgers live: the table's, else ``<database>.jobs``."""
    return Path(settings.jobs_directory) if settings.jobs_directory else Path(f"{database}.jobs")


@dataclass
class JobEntry:
    """One submitted repeat: its job, and the folder its files are in."""

    cell_key: str
    repeat: int
    job_id: str
    folder: str
    submitted_at: float  # time.time() at submission


class JobLedger:
    """The jobs a sweep has in flight, kept in a JSON file replaced whole on every change."""

    def __init__(self, path: Path, sweep: str) -> None:
        self.path = path
        self.sweep = sweep
        self.entries: dict[tuple[str, int], JobEntry] = {}

    @classmethod
    def load(cls, path: Path, sweep: str) -> JobLedger:
        ledger = cls(path, sweep)
        if not path.exists():
            return ledger
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
            for item in document["jobs"]:
                entry = JobEntry(**item)
                ledger.entries[(entry.cell_key, entry.repeat)] = entry
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SweepError(
                f"cannot read the sweep's job ledger {path}: {exc}; the jobs it listed are unknown to this "
                "sweep (see squeue); move it away to submit their repeats again"
            ) from None
        return ledger

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        document = {"sweep": self.sweep, "jobs": [asdict(entry) for entry in self.entries.values()]}
        write_atomically(self.path, json.dumps(document, indent=1) + "\n", "the sweep's job ledger")


def batch_script(request: Path, result: Path, ended: Path) -> str:
    """The job's script: the worker, then its exit code and seconds written beside the result.

    The interpreter is this process's: a cluster's nodes see the same installation (a shared
    filesystem), as they see the job's folder.
    """
    python = shlex.quote(sys.executable)
    return (
        "#!/bin/bash\n"
        "# One repeat of a core sweep (core/sweep/cluster.py); the submitting sweep reads what it leaves.\n"
        "started=$(date +%s%N)\n"
        f"{python} -m core.sweep.worker {shlex.quote(str(request))} {shlex.quote(str(result))}\n"
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
        document = json.loads(path.read_text(encoding="utf-8"))
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
    """How an ended job is recorded: the worker's result where it wrote one and Slurm did not stop it;
    else the phases it measured (result.json.partial) with a status saying how the job ended.

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
    if state in _TIMED_OUT:
        base.status = processes.timeout_status(
            time_limit_minutes * 60.0,
            phase=phase,
            output=output,
            limit=f"{where} reached its time limit, --time={time_limit_minutes} (minutes)",
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
    if result is not None:
        return result, seconds
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


def run_cells_on_slurm(
    store: ResultStore,
    plan: SweepPlan,
    spec: SweepSpec,
    finished: dict[tuple[str, int], str],
    retry_failed: bool,
    observer: SweepObserver,
    database: Path,
    settings: SlurmSettings,
) -> SweepOutcome:
    """Submit every pending repeat as a Slurm job and record each result as its job ends.

    A cell stops at its first failed repeat, as in a local sweep: its other jobs are cancelled.
    KeyboardInterrupt leaves the jobs running (the ledger lists them for ``--resume``) and propagates.
    """
    from core.sweep.run import SweepOutcome, record_repeat

    cells = {cell.key: cell for cell in plan.valid_cells}
    ok = RunState.ok.value
    recorded = {key: status for key, status in finished.items() if not (retry_failed and status != ok)}
    stopped = {key for (key, _), status in recorded.items() if status != ok}
    root = jobs_directory(database, settings) / spec.name
    ledger = JobLedger.load(root / LEDGER_NAME, spec.name)
    for key in [key for key in ledger.entries if key in recorded or key[0] not in cells]:
        # Recorded already (the sweep was killed between the commit and this ledger's update), or
        # a cell the grid no longer has: nothing to read.
        entry = ledger.entries.pop(key)
        shutil.rmtree(entry.folder, ignore_errors=True)
    ledger.save()
    time_limit = settings.job_time_limit_minutes(spec.timeout_seconds)

    wanted = [
        (repeat, cell)
        for repeat in range(spec.repeats)
        for cell in plan.valid_cells
        if (cell.key, repeat) not in recorded and cell.key not in stopped
    ]
    already = sum(1 for cell in plan.valid_cells for repeat in range(spec.repeats) if (cell.key, repeat) in recorded)
    in_database = sum(1 for key, _ in recorded if key in cells)
    total = already + len(wanted)
    observer.started(plan, runs_total=total, runs_finished=already, runs_recorded=in_database)
    runs_done = 0
    try:
        for repeat, cell in wanted:
            if (cell.key, repeat) not in ledger.entries:
                ledger.entries[(cell.key, repeat)] = _submit(root, spec, cell, repeat, settings)
                ledger.save()
            observer.run_started(cell, repeat, already + runs_done, total, None)
        states = JobStates()
        while ledger.entries:
            try:
                answer = states.query([entry.job_id for entry in ledger.entries.values()])
            except SlurmError as error:
                _log.warning("core: warning: %s; asking again in %g s", error, settings.poll_seconds)
                time.sleep(settings.poll_seconds)
                continue
            for key, entry in list(ledger.entries.items()):
                state = answer.get(entry.job_id)
                folder = Path(entry.folder)
                if not _has_ended(state, folder, entry, settings.poll_seconds):
                    continue
                cell = cells[entry.cell_key]
                result, seconds = job_result(folder, entry.job_id, state, cell.config, time_limit)
                record_repeat(
                    store,
                    database,
                    spec.name,
                    cell,
                    entry.repeat,
                    result,
                    seconds,
                    replace=key in finished,
                    observer=observer,
                )
                del ledger.entries[key]
                ledger.save()
                shutil.rmtree(folder, ignore_errors=True)
                runs_done += 1
                observer.run_finished(cell, entry.repeat, result, seconds or 0.0)
                if not result.status.ok:
                    _stop_cell(ledger, cell.key)
            if ledger.entries:
                time.sleep(settings.poll_seconds)
    except KeyboardInterrupt:
        if ledger.entries:
            print(
                f"core: {len(ledger.entries)} job(s) of sweep {spec.name} stay in Slurm "
                f"({', '.join(entry.job_id for entry in ledger.entries.values())}); --resume waits for them "
                "and records their results, scancel stops them",
                file=sys.stderr,
            )
        raise
    return SweepOutcome(
        name=spec.name,
        database=database,
        runs_done=runs_done,
        runs_already_finished=already,
        skipped_invalid=plan.invalid_cells,
        cells=summarise(store.runs(sweep=spec.name)),
    )


def _has_ended(state: str | None, folder: Path, entry: JobEntry, poll_seconds: float) -> bool:
    """Whether a job is over: Slurm says so, or it no longer knows the job."""
    if state in ACTIVE_STATES:
        return False
    if state is None and not (folder / ENDED_NAME).exists():
        # Forgotten by squeue (MinJobAge) with no end written: give a slow shared filesystem
        # another poll before calling the job lost.
        return time.time() - entry.submitted_at >= 2 * poll_seconds
    return True


def _stop_cell(ledger: JobLedger, cell_key: str) -> None:
    """A failed repeat stops its cell: its other jobs are cancelled and forgotten, never recorded."""
    doomed = [key for key in ledger.entries if key[0] == cell_key]
    if not doomed:
        return
    try:
        cancel([ledger.entries[key].job_id for key in doomed])
    except SlurmError as error:
        _log.warning("core: warning: cannot cancel the failed cell's other jobs: %s", error)
    for key in doomed:
        shutil.rmtree(ledger.entries.pop(key).folder, ignore_errors=True)
    ledger.save()


def _submit(root: Path, spec: SweepSpec, cell: Cell, repeat: int, settings: SlurmSettings) -> JobEntry:
    """Write one repeat's folder (request, batch script) and submit it."""
    assert cell.config is not None, "only validated cells run"
    folder = (root / f"cell{cell.index + 1}-repeat{repeat + 1}").resolve()
    if folder.exists():
        shutil.rmtree(folder)  # a lost job's leftovers: its result must not pass for the new job's
    folder.mkdir(parents=True)
    request, result, ended = folder / "request.json", folder / "result.json", folder / ENDED_NAME
    request.write_text(json.dumps({"options": cell.options, "parent_pid": None}), encoding="utf-8")
    script = folder / "job.sh"
    script.write_text(batch_script(request, result, ended), encoding="utf-8")
    job_id = submit(
        script,
        settings.sbatch_options(nodes=cell.config.nodes, timeout_seconds=spec.timeout_seconds),
        job_name=f"core-{spec.name}-c{cell.index + 1}r{repeat + 1}"[:120],
        output=folder / "slurm-%j.out",
        directory=folder,
    )
    return JobEntry(cell_key=cell.key, repeat=repeat, job_id=job_id, folder=str(folder), submitted_at=time.time())
