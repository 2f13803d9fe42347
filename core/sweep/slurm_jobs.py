"""The Slurm commands a cluster sweep uses: ``sbatch`` to submit a job, ``sacct`` to follow it (or,
where the cluster keeps no accounting, ``squeue --states=all``), ``scancel`` to stop it.

Facts relied on (Slurm 22.05): ``sbatch --parsable`` prints ``JOBID`` or ``JOBID;CLUSTER``;
``sacct`` exits non-zero with "Slurm accounting storage is disabled" where
``AccountingStorageType=accounting_storage/none``; ``squeue --states=all`` lists finished jobs too,
but only for ``MinJobAge`` seconds (default 300) after they end, and exits non-zero with "Invalid
job id specified" when it knows none of the ids asked for. A job Slurm no longer knows is reported
here as ``None``: its files say how it ended.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from core.errors import CoreError

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
    }
)
_COMMAND_TIMEOUT_SECONDS = 60.0  # a busy slurmctld answers slowly; a dead one not at all
_PROBE_TIMEOUT_SECONDS = 15.0  # whether Slurm answers at all
_IDS_PER_QUERY = 200  # keeps each command line short on a large grid


class SlurmError(CoreError):
    """A Slurm command failed: the message quotes what it printed."""


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


def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=_COMMAND_TIMEOUT_SECONDS)
    except FileNotFoundError:
        raise SlurmError(f"{command[0]} is not on PATH: is this a Slurm cluster's login node?") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{command[0]} gave no answer in {_COMMAND_TIMEOUT_SECONDS:g} s") from None


def submit(script: Path, options: Sequence[str], *, job_name: str, output: Path, directory: Path) -> str:
    """Submit ``script`` as a batch job; returns its id.

    :param output: the job's standard output and error (``%j`` is the job id).
    :param directory: the job's working directory (``--chdir``).
    """
    command = [
        "sbatch",
        "--parsable",
        f"--job-name={job_name}",
        f"--output={output}",
        f"--chdir={directory}",
        *options,
        str(script),
    ]
    submitted = _run(command)
    job_id = submitted.stdout.strip().split(";", 1)[0]
    if submitted.returncode != 0 or not job_id:
        said = submitted.stderr.strip() or submitted.stdout.strip() or f"exit code {submitted.returncode}"
        raise SlurmError(f"sbatch refused the job: {said}")
    return job_id


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
            states.update(answered if answered is not None else self._squeue(chunk))
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
            if job_id in states:
                states[job_id] = _state_name(state)
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
            if job_id in states:
                states[job_id] = _state_name(state)
        return states


def _state_name(state: str) -> str:
    """``CANCELLED by 0`` -> ``CANCELLED``: sacct appends who cancelled."""
    return state.strip().split(" ", 1)[0].rstrip("+")


def cancel(job_ids: Sequence[str]) -> None:
    """Ask Slurm to end ``job_ids``; best effort (a job that already ended is no error)."""
    if job_ids:
        _run(["scancel", *job_ids])
