"""The Slurm commands a cluster sweep uses: ``sbatch`` to submit a job, ``sacct`` to follow it (or,
where the cluster keeps no accounting, ``squeue --states=all``), ``scancel`` to stop it, and
``squeue`` to find a job whose ``sbatch`` answer was lost.

Facts relied on (Slurm 22.05): ``sbatch --parsable`` prints ``JOBID`` or ``JOBID;CLUSTER``;
``sacct`` exits non-zero with "Slurm accounting storage is disabled" where
``AccountingStorageType=accounting_storage/none``; ``squeue --states=all`` lists finished jobs too,
but only for ``MinJobAge`` seconds (default 300) after they end, and exits non-zero with "Invalid
job id specified" when it knows none of the ids asked for. A job Slurm no longer knows is reported
here as ``None``: its files say how it ended.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from core.base.errors import CoreError
from core.sweep.slurm_arrays import expand_job_ids, read_max_array_size

_STATE_NAME = re.compile(r"[A-Z][A-Z_]*")  # how Slurm spells a job state (squeue %T, sacct State)
#: states of a job that has not ended; any other state is final
ACTIVE_STATES = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "REQUEUED",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "RESIZING",
        "SUSPENDED",
        "SIGNALING",
        "STAGE_OUT",
        "STOPPED",
        "RESV_DEL_HOLD",  # held after its reservation was deleted (Slurm 23.02)
        "POWER_UP_NODE",  # waiting for a powered-down node to boot
        "UPDATE_DB",  # ending: its record is being sent to the database
    }
)
#: Why a pending job waits, where the reason means it never starts until an administrator changes the
#: cluster or the job is changed (Slurm's job reason codes, https://slurm.schedmd.com/job_reason_codes.html):
#: the job asks more than its partition, account or QOS allows any one job, names what the cluster does
#: not have, or waits for what will never happen. Limits on aggregates (AssocGrp*, QOSGrp*), on a user's
#: or an account's jobs together (*PerUser*, *PerAccount, AssocMaxJobsLimit), holds, down nodes and
#: partitions clear as other jobs end or an administrator's routine work is done: those are waited for.
#: Slurm sets such a reason on a job sbatch accepted where EnforcePartLimits=NO (the default) lets it.
NEVER_STARTS = {
    "PartitionNodeLimit": "it asks for more (or fewer) nodes than its partition allows a job",
    "PartitionTimeLimit": "its time limit exceeds its partition's",
    "PartitionConfig": "it violates a limit of its partition",
    "BadConstraints": "its requirements cannot be satisfied by any node of the cluster",
    "DependencyNeverSatisfied": "it depends on a job whose outcome can no longer satisfy it",
    "InvalidAccount": "its account is invalid",
    "InvalidQOS": "its QOS is invalid",
    "AccountNotAllowed": "its account may not use the partition",
    "QOSNotAllowed": "its QOS is not allowed by its association or partition",
    "ReservationDeleted": "the reservation it asks for no longer exists",
    "MaxMemPerLimit": "it asks for more memory per CPU or per node than the cluster allows",
}
#: a per-job (or per-node) maximum, or a minimum, of the job's association or QOS: AssocMaxNodePerJobLimit,
#: QOSMaxWallDurationPerJobLimit, AssocMaxCpuPerNode, QOSMinGRES... (not *PerUser*, *PerAccount, Grp*)
_PER_JOB_LIMIT = re.compile(r"(Assoc|QOS)Max\w*Per(Job|Node)\w*|QOSMin\w+")


#: added by :func:`pending_reasons` to a PartitionNodeLimit whose job fits its partition's limits:
#: Slurm gives that reason too while nodes the job needs are down or drained, which may come back
NODES_DOWN = "nodes down or drained"


def _reason_code(reason: str) -> str:
    """``ReqNodeNotAvail, UnavailableNodes:n1`` -> ``ReqNodeNotAvail``: the code before any detail."""
    return reason.split(",", 1)[0].strip()


def never_starts(reason: str | None) -> str | None:
    """What ``reason`` (squeue's ``%r`` of a pending job) means where the job can never start as it
    is (see :data:`NEVER_STARTS`); None where it may yet start."""
    if not reason:
        return None
    code = _reason_code(reason)
    if code == "PartitionNodeLimit" and NODES_DOWN in reason:
        return None
    if code in NEVER_STARTS:
        return NEVER_STARTS[code]
    if _PER_JOB_LIMIT.fullmatch(code):
        what = "association" if code.startswith("Assoc") else "QOS"
        return f"it asks for more (or less) than its {what} allows any one job"
    return None


#: sbatch's environment variables for options core sets itself or that break how a sweep follows its
#: jobs: they would apply to every job beside the command line's options (core passes its own)
_SBATCH_ENVIRONMENT_CORE_OVERRIDES = (
    "SBATCH_ARRAY_INX",
    "SBATCH_CLUSTERS",
    "SLURM_CLUSTERS",
    "SBATCH_ERROR",
    "SBATCH_OUTPUT",
    "SBATCH_WAIT",
)
_COMMAND_TIMEOUT_SECONDS = 60.0  # a busy slurmctld answers slowly; a dead one not at all
_STOPS = (signal.SIGINT, signal.SIGTERM)  # what stops a sweep (the CLI's SIGTERM raises KeyboardInterrupt too)
_ANSWER_AFTER_STOP_SECONDS = 10.0  # how long a stopped sweep still waits for sbatch's answer
_PROBE_TIMEOUT_SECONDS = 15.0  # whether Slurm answers at all
_IDS_PER_QUERY = 200  # keeps each command line short on a large grid


class SlurmError(CoreError):
    """A Slurm command failed: the message quotes what it printed.

    ``refused`` is True when the command answered with a refusal (a value the cluster does not
    take: bad input), False when it could not be asked (not installed, no answer: a fault).
    """

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


@functools.cache
def unavailable_reason() -> str | None:
    """None where this machine can submit Slurm jobs; else why not (no ``sinfo``, no controller).

    Asked once per process: sinfo retries an unreachable controller for up to a minute, so it is
    given :data:`_PROBE_TIMEOUT_SECONDS`.
    """
    sinfo = shutil.which("sinfo")
    if sinfo is None:
        return "Slurm's commands are not on PATH (no sinfo)"
    try:
        answered = subprocess.run(
            [sinfo, "--noheader", "--format=%P"], capture_output=True, text=True, timeout=_PROBE_TIMEOUT_SECONDS
        )
    except OSError as exc:
        return f"sinfo cannot run: {exc}"
    except subprocess.TimeoutExpired:
        return f"sinfo gave no answer in {_PROBE_TIMEOUT_SECONDS:g} s (is slurmctld running? SLURM_CONF?)"
    if answered.returncode != 0:
        said = " ".join(answered.stderr.split()) or f"exit code {answered.returncode}"
        return f"sinfo cannot reach slurmctld: {said}"
    if not answered.stdout.strip():
        return "sinfo lists no partition"
    return None


def _run(command: list[str], environment: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    try:
        # No standard input: sbatch reads a script from it when the command line names none.
        return subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=_COMMAND_TIMEOUT_SECONDS,
            stdin=subprocess.DEVNULL,
            env=environment,
        )
    except FileNotFoundError:
        raise SlurmError(f"{command[0]} is not on PATH: is this a Slurm cluster's login node?") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{command[0]} gave no answer in {_COMMAND_TIMEOUT_SECONDS:g} s") from None


def _run_to_its_end(command: list[str], environment: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``command`` (sbatch) run to its end even when the sweep is stopped meanwhile (Ctrl-C, SIGTERM):
    killed half-way, sbatch may leave a job slurmctld creates after the sweep looked for it, running
    unlisted. It runs in a session of its own, so a terminal's Ctrl-C reaches only the sweep, which
    hears sbatch's answer out (for :data:`_ANSWER_AFTER_STOP_SECONDS` at most), then stops."""
    # Ctrl-C and SIGTERM are noted while sbatch is started and handled once it runs, where its answer
    # is waited for: raised inside Popen, they would leave an sbatch running unknown to this process.
    noted: list[int] = []
    handlers: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():  # where Python runs signal handlers
        handlers = {stop: signal.signal(stop, lambda signum, frame: noted.append(signum)) for stop in _STOPS}
    try:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,  # sbatch reads a script from it when the command line names none
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=environment,
            start_new_session=True,
        )
    except FileNotFoundError:
        raise SlurmError(f"{command[0]} is not on PATH: is this a Slurm cluster's login node?") from None
    finally:
        for stop, handler in handlers.items():
            signal.signal(stop, handler)

    def handle_noted() -> None:
        for signum in noted[:1]:  # the sweep's own handler (Ctrl-C's: KeyboardInterrupt), as if it came now
            handler = handlers[signum]
            if callable(handler):
                handler(signum, None)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(signum)

    stdout, stderr = _hear_out(command[0], process, handle_noted)
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def _hear_out(program: str, process: subprocess.Popen[str], handle_noted: Callable[[], None]) -> tuple[str, str]:
    """What ``process`` prints, once it ended; a stop (KeyboardInterrupt) raised after it, or once
    it was killed past the time limit. ``handle_noted``: handles, here, a stop noted while the
    process started."""
    deadline = time.monotonic() + _COMMAND_TIMEOUT_SECONDS
    stopped: KeyboardInterrupt | None = None
    noted: Callable[[], None] | None = handle_noted
    while True:
        try:
            if noted is not None:
                once, noted = noted, None
                once()
            stdout, stderr = process.communicate(timeout=max(0.0, deadline - time.monotonic()))
            break
        except KeyboardInterrupt as stop:  # communicate() can be asked again: nothing read is lost
            if stopped is None:  # a stopped sweep waits a little for sbatch, not its whole time limit
                deadline = min(deadline, time.monotonic() + _ANSWER_AFTER_STOP_SECONDS)
            stopped = stop
        except subprocess.TimeoutExpired:
            # Its whole group (its session's): a child of sbatch's holding the pipes open would
            # keep communicate() waiting after sbatch itself was gone.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            if stopped is not None:
                raise stopped from None
            raise SlurmError(f"{program} gave no answer in {_COMMAND_TIMEOUT_SECONDS:g} s") from None
    if stopped is not None:
        raise stopped  # the job, if sbatch made one, is in Slurm now: found by its name and folder
    return stdout, stderr


def log_path_pattern(folder: Path, name: str) -> str:
    """``folder/name`` as sbatch's ``--output`` takes it: sbatch expands ``%`` patterns (``%j`` the
    job id, ``%u`` the user...) anywhere in the path, so a ``%`` of the folder's own is written ``%%``
    and the log stays in ``folder``. ``name`` may use the patterns."""
    if "\\" in str(folder):
        # A backslash turns the patterns off (sbatch(1), "filename pattern"): the folder's name would
        # then be read literally but the log's name too; such folders are refused before this.
        raise ValueError(f"a job folder with a backslash: {folder}")
    return f"{str(folder).replace('%', '%%')}/{name}"


def submit(script: Path, options: Sequence[str], *, job_name: str, log: str, directory: Path) -> str:
    """Submit ``script`` as a batch job; returns its id.

    :param log: the job's standard output and error, as :func:`log_path_pattern` gives it.
    :param directory: the job's working directory (``--chdir``).
    :raises SlurmError: ``refused`` when sbatch said no (a partition, account, option the cluster
        does not take), else when sbatch could not be asked.
    """
    command = [
        "sbatch",
        "--parsable",
        f"--job-name={job_name}",
        f"--output={log}",
        f"--error={log}",  # named too, so no SBATCH_ERROR in the environment sends it elsewhere
        f"--chdir={directory}",
        *options,
        str(script),
    ]
    environment = {name: value for name, value in os.environ.items() if name not in _SBATCH_ENVIRONMENT_CORE_OVERRIDES}
    submitted = _run_to_its_end(command, environment)
    job_id = submitted.stdout.strip().split(";", 1)[0]
    if submitted.returncode != 0:
        said = submitted.stderr.strip() or submitted.stdout.strip() or f"exit code {submitted.returncode}"
        raise SlurmError(f"sbatch refused the job: {said}", refused=True)
    if not job_id.isdigit():
        said = submitted.stderr.strip() or "nothing"
        raise SlurmError(f"sbatch printed no job id ({submitted.stdout.strip()!r}; it said: {said})")
    return job_id


def find(job_name: str, directory: Path) -> list[str]:
    """The ids of this user's jobs named ``job_name`` that run in ``directory``: a job sbatch
    submitted although its answer never arrived (the sweep was interrupted while sbatch answered,
    or sbatch gave no answer in time). ``directory`` is the job's own folder, so no other sweep's
    job of the same name is taken for it.

    :raises SlurmError: when Slurm could not be asked.
    """
    listed = _run(
        [
            "squeue",
            "--noheader",
            "--states=all",
            f"--user={os.getuid()}",
            f"--name={job_name}",
            "--format=%F|%j|%Z",  # %F: an array's id (its tasks are ARRAYID_TASK); a job's own otherwise
        ]
    )
    if listed.returncode != 0:
        raise SlurmError(f"squeue failed: {listed.stderr.strip() or f'exit code {listed.returncode}'}")
    wanted = os.path.normpath(directory)
    found = []
    for line in listed.stdout.splitlines():
        job_id, name, work_directory = (line.strip().split("|", 2) + ["", ""])[:3]
        if job_id.isdigit() and name == job_name and os.path.normpath(work_directory) == wanted:
            if job_id not in found:  # an array's tasks are a line each
                found.append(job_id)
    return found


class JobStates:
    """Asks Slurm how jobs stand: sacct where the cluster keeps accounting, else squeue.

    The answer for a job is its state's name (``RUNNING``, ``COMPLETED``, ``TIMEOUT``, ``CANCELLED``
    ...), or None when Slurm no longer knows the job (squeue forgets it ``MinJobAge`` after it ends).
    """

    def __init__(self) -> None:
        self.accounting: bool | None = None  # learned on the first query

    def query(self, job_ids: Sequence[str]) -> dict[str, str | None]:
        """The state of each of ``job_ids``.

        :raises SlurmError: when Slurm could not be asked (a controller that does not answer): the
            caller asks again later rather than take a silent controller for ended jobs.
        """
        states: dict[str, str | None] = {}
        for start in range(0, len(job_ids), _IDS_PER_QUERY):
            chunk = list(job_ids[start : start + _IDS_PER_QUERY])
            answered = self._sacct(chunk) if self.accounting is not False else None
            if answered is None:
                answered = self._squeue(chunk)
            else:
                # sacct lists a job once slurmdbd has its record, which a busy one writes late:
                # squeue, which the controller answers, says whether such a job is queued.
                unlisted = [job_id for job_id, state in answered.items() if state is None]
                if unlisted:
                    answered.update(self._squeue(unlisted))
            states.update(answered)
        return states

    def _sacct(self, job_ids: list[str]) -> dict[str, str | None] | None:
        """sacct's answer, or None where the cluster keeps no accounting (squeue answers then)."""
        if shutil.which("sacct") is None:
            self.accounting = False
            return None
        listed = _run(
            [
                "sacct",
                "--noheader",
                "--parsable2",
                "--allocations",
                "--format=JobID,State",
                f"--jobs={','.join(job_ids)}",
            ]
        )
        if listed.returncode != 0:
            if "accounting storage is disabled" in listed.stderr.lower():
                self.accounting = False
                return None
            raise SlurmError(f"sacct failed: {listed.stderr.strip() or f'exit code {listed.returncode}'}")
        self.accounting = True
        states: dict[str, str | None] = dict.fromkeys(job_ids)
        for line in listed.stdout.splitlines():
            job_id, _, state = line.partition("|")
            _note_states(states, job_id, state)
        return states

    def _squeue(self, job_ids: list[str]) -> dict[str, str | None]:
        listed = _run(["squeue", "--noheader", "--states=all", "--format=%i|%T", f"--jobs={','.join(job_ids)}"])
        states: dict[str, str | None] = dict.fromkeys(job_ids)
        if listed.returncode != 0:
            if "invalid job id" in listed.stderr.lower():
                return states  # Slurm knows none of them any more
            raise SlurmError(f"squeue failed: {listed.stderr.strip() or f'exit code {listed.returncode}'}")
        for line in listed.stdout.splitlines():
            job_id, _, state = line.strip().partition("|")
            _note_states(states, job_id, state)
        return states


def _note_states(states: dict[str, str | None], listed: str, state: str) -> None:
    """``state`` for each job of ``states`` that ``listed`` (a job, an array's task, or its tasks
    still pending: ``123_[4-9%2]``) stands for."""
    for job_id in expand_job_ids(listed):
        if job_id in states:
            states[job_id] = _state_name(state)


def pending_reasons(job_ids: Sequence[str]) -> dict[str, str]:
    """Why each of ``job_ids`` that is pending waits: squeue's reason (``Priority``, ``Resources``,
    ``PartitionNodeLimit`` ...); jobs that are not pending, or that Slurm no longer knows, are left out.

    :raises SlurmError: when Slurm could not be asked.
    """
    reasons: dict[str, str] = {}
    partitions: dict[str, dict[str, str] | None] = {}
    for start in range(0, len(job_ids), _IDS_PER_QUERY):
        chunk = list(job_ids[start : start + _IDS_PER_QUERY])
        listed = _run(["squeue", "--noheader", "--states=PENDING", "--format=%i|%r|%P|%D", f"--jobs={','.join(chunk)}"])
        if listed.returncode != 0:
            if "invalid job id" in listed.stderr.lower():
                continue  # none of them is known any more
            raise SlurmError(f"squeue failed: {listed.stderr.strip() or f'exit code {listed.returncode}'}")
        for line in listed.stdout.splitlines():
            job_id, *fields = line.strip().split("|")
            # The partition and the node count end the line (a reason with a "|" in it stays whole).
            reason, partition, nodes = (
                ("|".join(fields[:-2]), *fields[-2:]) if len(fields) >= 3 else ("".join(fields), "", "")
            )
            for each in expand_job_ids(job_id):  # an array's tasks still pending are one line
                if each in chunk and reason.strip():
                    reasons[each] = _with_down_nodes(reason.strip(), partition.strip(), nodes.strip(), partitions)
    return reasons


def _with_down_nodes(reason: str, partition: str, nodes: str, partitions: dict[str, dict[str, str] | None]) -> str:
    """``reason``, with :data:`NODES_DOWN` added where it is PartitionNodeLimit but the job's node
    count is within its partition's MinNodes, MaxNodes and TotalNodes: then nodes are down or
    drained (Slurm's job reason codes say PartitionNodeLimit "can also indicate that required nodes
    are DOWN or DRAINED"), and the job starts when they return. Where the job's partition or node
    count, or the partition's limits, cannot be read, down nodes cannot be ruled out: the job is
    waited for too (cancelled, it could not start when they return), the reason saying so."""
    if _reason_code(reason) != "PartitionNodeLimit":
        return reason
    unread = f"{reason}, {NODES_DOWN} perhaps (the limits of partition {partition or '?'} could not be read)"
    if not partition or not nodes.isdigit():
        return unread
    if partition not in partitions:
        partitions[partition] = _partition_settings(partition)
    settings = partitions[partition]
    if settings is None:
        return unread

    def limit(key: str, unlimited: int) -> int | None:
        value = settings.get(key, "")
        return unlimited if value == "UNLIMITED" else int(value) if value.isdigit() else None

    lowest, highest, total = limit("MinNodes", 0), limit("MaxNodes", 1 << 31), limit("TotalNodes", 1 << 31)
    if lowest is None or highest is None or total is None:
        return unread
    if not lowest <= int(nodes) <= min(highest, total):
        return reason
    return f"{reason}, {NODES_DOWN} in partition {partition} (its {nodes} node(s) are within the partition's limits)"


def _partition_settings(partition: str) -> dict[str, str] | None:
    """``scontrol show partition``'s KEY=VALUE settings of ``partition``; None where it cannot say."""
    shown = _run(["scontrol", "show", "partition", partition, "--oneliner"])
    if shown.returncode != 0:
        return None
    return dict(field.split("=", 1) for field in shown.stdout.split() if "=" in field)


def _state_name(state: str) -> str | None:
    """``CANCELLED by 0`` -> ``CANCELLED``: sacct appends who cancelled. None for what is no state's
    name (empty, garbled): the job is then as one the answer left out, not taken for ended."""
    name = state.strip().split(" ", 1)[0].rstrip("+")
    return name if _STATE_NAME.fullmatch(name) else None


def cancel(job_ids: Sequence[str]) -> None:
    """Ask Slurm to end ``job_ids``; best effort (a job that already ended is no error)."""
    if job_ids:
        _run(["scancel", *job_ids])


class Scheduler(Protocol):
    """What a cluster sweep asks of Slurm, and its clock: :class:`SlurmScheduler` on a cluster, a
    simulated one in the tests (tests/test_slurm_sweep.py), so the bookkeeping is tested without
    Slurm and without waiting."""

    def submit(self, script: Path, options: Sequence[str], *, job_name: str, log: str, directory: Path) -> str: ...

    def states(self, job_ids: Sequence[str]) -> dict[str, str | None]: ...

    def cancel(self, job_ids: Sequence[str]) -> None: ...

    def pending_reasons(self, job_ids: Sequence[str]) -> dict[str, str]:
        """Why each pending job of ``job_ids`` waits (see :func:`pending_reasons`)."""
        ...

    def find(self, job_name: str, directory: Path) -> list[str]:
        """The jobs named ``job_name`` running in ``directory`` (see :func:`find`)."""
        ...

    def now(self) -> float:
        """Seconds since the epoch (``JobEntry.submitted_at`` is on this clock)."""
        ...

    def max_array_size(self) -> int:
        """How many tasks one job array may have (MaxArraySize; 0: arrays are off)."""
        ...

    def sleep(self, seconds: float) -> None: ...


class SlurmScheduler:
    """The cluster's own Slurm: sbatch, sacct or squeue, scancel; the wall clock."""

    def __init__(self) -> None:
        self._states = JobStates()

    def submit(self, script: Path, options: Sequence[str], *, job_name: str, log: str, directory: Path) -> str:
        return submit(script, options, job_name=job_name, log=log, directory=directory)

    def states(self, job_ids: Sequence[str]) -> dict[str, str | None]:
        return self._states.query(job_ids)

    def cancel(self, job_ids: Sequence[str]) -> None:
        cancel(job_ids)

    def pending_reasons(self, job_ids: Sequence[str]) -> dict[str, str]:
        return pending_reasons(job_ids)

    def find(self, job_name: str, directory: Path) -> list[str]:
        return find(job_name, directory)

    def now(self) -> float:
        return time.time()

    def max_array_size(self) -> int:
        return read_max_array_size()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)
