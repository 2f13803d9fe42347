"""The ``[slurm]`` table of a sweep file: what each repeat's Slurm job asks for.

Every value becomes an ``sbatch`` option on the command line (never a line of the batch script),
so a value cannot smuggle in a shell command; strings are still refused when they hold control
characters or spaces, which no partition, account or option needs.
"""

from __future__ import annotations

import math
import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

_LOGS = "core writes each job's output and errors to slurm-JOBID.out in the job's folder"
_FIELD = "the [slurm] table's {field} (--slurm-{flag}) sets it"
#: sbatch's long options a sweep's ``extra_options`` may not give, with what each collides with:
#: those core sets for every job, those a field of the table sets, and those that would break how
#: the sweep follows its jobs (one job per repeat, its id from sbatch, on this cluster).
RESERVED_OPTIONS: dict[str, str] = {
    "output": _LOGS,
    "error": _LOGS,
    "chdir": "core runs each job in its own folder under the jobs directory",
    "job-name": "core names each job after its sweep, cell and repeat",
    "parsable": "core reads each job's id from sbatch's answer",
    "array": "core puts the pending repeats in job arrays itself: the [slurm] table's job_arrays and "
    "array_throttle (--slurm-job-arrays, --slurm-array-throttle) set them",
    "wrap": "each job runs core's batch script",
    "nodes": "each cell's nodes set its job's --nodes",
    "ntasks": "core runs one task per node (the run's launcher, --ntasks-per-node=1)",
    "ntasks-per-node": "core runs one task per node (the run's launcher)",
    "time": _FIELD.format(field="time_limit_minutes", flag="time-limit-minutes"),
    "partition": _FIELD.format(field="partition", flag="partition"),
    "account": _FIELD.format(field="account", flag="account"),
    "gpus-per-node": _FIELD.format(field="gpus_per_node", flag="gpus-per-node"),
    "cpus-per-task": _FIELD.format(field="cpus_per_task", flag="cpus-per-task"),
    "mem": _FIELD.format(field="memory_megabytes", flag="memory-megabytes"),
    "exclusive": "the [slurm] table's exclusive sets it",
    "wait": "the sweep follows its jobs itself: sbatch must return at once",
    "test-only": "nothing would be submitted",
    "clusters": "the sweep follows its jobs on the cluster it submits from",
    "hold": "a held job never starts by itself, and the sweep would wait for it forever",
    "begin": "the sweep waits for its jobs from the moment it submits them: start the sweep itself later instead",
    # sbatch prints these and exits 0 without submitting anything: no job id, no job
    "help": "sbatch would print its help and submit nothing",
    "usage": "sbatch would print its usage and submit nothing",
    "version": "sbatch would print its version and submit nothing",
}
#: sbatch's one-letter forms of the reserved options (sbatch --help)
_SHORT_FORMS = {
    "o": "output",
    "e": "error",
    "D": "chdir",
    "J": "job-name",
    "a": "array",
    "N": "nodes",
    "n": "ntasks",
    "t": "time",
    "p": "partition",
    "A": "account",
    "c": "cpus-per-task",
    "W": "wait",
    "M": "clusters",
    "H": "hold",
    "b": "begin",
    "h": "help",
    "V": "version",
}
#: sbatch options whose whole name begins a reserved one's: given whole, sbatch takes them as they
#: are (getopt_long prefers an exact match), so they are no abbreviation
_WHOLE_NAMES_BEGINNING_RESERVED = frozenset({"gpus"})
_LONG_OPTION = re.compile(r"^--(?P<name>[A-Za-z0-9][A-Za-z0-9-]*)(?:=|$)")
_PLAIN_TEXT = re.compile(r"^[^\s\x00-\x1f\x7f]+$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def reserved_option_refusal(option: str) -> str | None:
    """Why ``option`` (one argument of ``extra_options``) may not be passed to sbatch; None if it may.

    sbatch takes any unique beginning of a long option for the whole (``--outp=`` is ``--output=``,
    ``--chd=`` is ``--chdir=``), and one-letter forms (``-o``): each is refused as what it stands for.
    """
    if option.startswith("-") and not option.startswith("--"):
        letter = option[1:2]
        if letter in _SHORT_FORMS:
            whole = _SHORT_FORMS[letter]
            return f"{option!r} is sbatch's -{letter}, short for --{whole}: {RESERVED_OPTIONS[whole]}; leave it out"
    match = _LONG_OPTION.match(option)
    if match is None or not _PLAIN_TEXT.match(option):
        return f"each option is one sbatch long option with its value after '=', such as '--qos=high'; got {option!r}"
    name = match.group("name")
    if name in _WHOLE_NAMES_BEGINNING_RESERVED:
        return None
    if name in RESERVED_OPTIONS:
        return f"--{name}: {RESERVED_OPTIONS[name]}; leave it out"
    begun = [reserved for reserved in RESERVED_OPTIONS if reserved.startswith(name)]
    if not begun:
        return None
    names = ", ".join(f"--{reserved}" for reserved in begun)
    return f"--{name} abbreviates {names} for sbatch: {RESERVED_OPTIONS[begun[0]]}; leave it out"


class SlurmSettings(BaseModel):
    """The Slurm parameters of a sweep's jobs (``[slurm]`` in the sweep file, ``--slurm-*`` flags).

    A cell's ``nodes`` sets its job's node count; everything else is the same for every job.
    """

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    partition: str | None = Field(default=None, description="sbatch --partition; None: the cluster's default")
    account: str | None = Field(default=None, description="sbatch --account")
    time_limit_minutes: int | None = Field(
        default=None,
        ge=1,
        le=365 * 24 * 60,
        description="sbatch --time of each job; None: the sweep's timeout_seconds rounded up to whole minutes "
        "(Slurm counts time limits in minutes)",
    )
    gpus_per_node: int | None = Field(default=None, ge=0, le=64, description="sbatch --gpus-per-node")
    cpus_per_task: int | None = Field(default=None, ge=1, le=4096, description="sbatch --cpus-per-task")
    memory_megabytes: int | None = Field(default=None, ge=1, le=1 << 30, description="sbatch --mem, per node")
    exclusive: bool = Field(
        default=True,
        description="sbatch --exclusive: a job holds its nodes alone, so no other job disturbs what it measures",
    )
    extra_options: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="further sbatch options, each one argument such as '--qos=high' or '--constraint=a100'",
    )
    poll_seconds: float = Field(default=10.0, gt=0, le=3600, description="how often the sweep asks Slurm for its jobs")
    job_arrays: bool = Field(
        default=True,
        description="submit the pending repeats that ask for the same job as job arrays (one sbatch each, at most "
        "the cluster's MaxArraySize tasks); false: one sbatch per repeat",
    )
    array_throttle: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="sbatch --array=0-N%T: at most this many tasks of each array run at once; None: no limit",
    )
    log_retention_days: float = Field(
        default=14.0,
        ge=0,
        le=3650,
        description="how long each recorded job's Slurm log is kept in <jobs directory>/_logs/<sweep>/, in days; "
        "0: not kept",
    )
    jobs_directory: str | None = Field(
        default=None,
        min_length=1,
        description="where each job's request, result and log live; on a filesystem every node sees. "
        "None: <database>.jobs/ beside the database",
    )

    @field_validator("partition", "account")
    @classmethod
    def _plain_name(cls, value: str | None) -> str | None:
        if value is not None and not _PLAIN_TEXT.match(value):
            raise ValueError("a Slurm name: no spaces or control characters, not empty")
        return value

    @field_validator("extra_options")
    @classmethod
    def _sbatch_options(cls, options: list[str]) -> list[str]:
        for option in options:
            refusal = reserved_option_refusal(option)
            if refusal is not None:
                raise ValueError(refusal)
        return options

    @field_validator("jobs_directory")
    @classmethod
    def _jobs_path(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if _CONTROL.search(value):
            raise ValueError("a folder's path, without control characters")
        if "\\" in value:
            raise ValueError("a folder's path without a backslash (sbatch then reads its log paths literally)")
        return value

    def job_time_limit_minutes(self, timeout_seconds: float) -> int:
        """The jobs' ``--time``: the table's, else the sweep's per-repeat limit in whole minutes."""
        if self.time_limit_minutes is not None:
            return self.time_limit_minutes
        return max(1, math.ceil(timeout_seconds / 60))

    def sbatch_options(self, *, nodes: int, timeout_seconds: float) -> list[str]:
        """The sbatch options of one job of ``nodes`` nodes (one task per node: the run's launcher)."""
        options = [
            f"--nodes={nodes}",
            "--ntasks-per-node=1",
            f"--time={self.job_time_limit_minutes(timeout_seconds)}",
        ]
        for flag, value in (
            ("--partition", self.partition),
            ("--account", self.account),
            ("--gpus-per-node", self.gpus_per_node),
            ("--cpus-per-task", self.cpus_per_task),
        ):
            if value is not None:
                options.append(f"{flag}={value}")
        if self.memory_megabytes is not None:
            options.append(f"--mem={self.memory_megabytes}M")
        if self.exclusive:
            options.append("--exclusive")
        return [*options, *self.extra_options]
