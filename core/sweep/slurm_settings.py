"""The ``[slurm]`` table of a sweep file: what each repeat's Slurm job asks for.

Every value becomes an ``sbatch`` option on the command line (never a line of the batch script),
so a value cannot smuggle in a shell command; strings are still refused when they hold control
characters or spaces, which no partition, account or option needs.
"""

from __future__ import annotations

import math
import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: sbatch's own options that core sets itself: a sweep file naming them in ``extra_options`` is refused
_OPTIONS_CORE_SETS = ("--output", "--error", "--chdir", "--parsable", "--job-name", "--wrap", "--array")
_PLAIN_TEXT = re.compile(r"^[^\s\x00-\x1f\x7f]+$")


class SlurmSettings(BaseModel):
    """The Slurm parameters of a sweep's jobs (``[slurm]`` in the sweep file, ``--slurm-*`` flags).

    A cell's ``nodes`` sets its job's node count; everything else is the same for every job.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

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
            if not option.startswith("--") or not _PLAIN_TEXT.match(option):
                raise ValueError(f"each option is one sbatch long option such as '--qos=high'; got {option!r}")
            if option.split("=", 1)[0] in _OPTIONS_CORE_SETS:
                raise ValueError(f"{option.split('=', 1)[0]} is set by core for each job; leave it out")
        return options

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
