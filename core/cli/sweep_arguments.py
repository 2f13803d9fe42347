"""``core sweep``'s arguments, and which of them the printed resume command repeats."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _yes_or_no(value: str) -> bool:
    """A flag's yes or no (``--slurm-job-arrays no``); argparse names the flag where it is neither."""
    answers = {"yes": True, "true": True, "no": False, "false": False}
    if value.lower() not in answers:
        raise argparse.ArgumentTypeError(f"yes or no, not {value!r}")
    return answers[value.lower()]


DATABASE_HELP = "results database (default: $CORE_DATABASE, else results/core.db)"

#: (field of the [slurm] table, type, help) for each ``--slurm-*`` flag
SLURM_FLAGS: tuple[tuple[str, Callable[[str], Any], str], ...] = (
    ("partition", str, "sbatch --partition"),
    ("account", str, "sbatch --account"),
    ("time_limit_minutes", int, "sbatch --time of each job (default: the repeat's time limit, in minutes)"),
    ("gpus_per_node", int, "sbatch --gpus-per-node"),
    ("cpus_per_task", int, "sbatch --cpus-per-task"),
    ("memory_megabytes", int, "sbatch --mem, in megabytes"),
    ("poll_seconds", float, "how often the sweep asks Slurm about its jobs (default 10)"),
    ("job_arrays", _yes_or_no, "yes: submit the pending repeats as job arrays (default); no: one sbatch each"),
    ("array_throttle", int, "at most this many tasks of each job array at once (sbatch --array=0-N%%T)"),
    ("log_retention_days", float, "days each job's Slurm log is kept beside the database (default 14; 0: none)"),
    ("jobs_directory", str, "the jobs' folders, on a filesystem the nodes share (default: <database>.jobs)"),
)

#: ``core sweep`` options a resume command gives as they were given (dest -> flag); with ``file``,
#: ``--database``, ``--executor``, a Slurm sweep's ``--machine``, the ``--slurm-*`` flags and those
#: in NOT_RESUMED, every option of the command (tests/test_sweep_resume.py checks that none is forgotten)
RESUMED_FLAGS = {
    "toy": "--toy",
    "retry_failed": "--retry-failed",
    "skip_invalid": "--skip-invalid",
    "name": "--name",
    "repeats": "--repeats",
    "timeout_seconds": "--timeout-seconds",
    "workers": "--workers",
    "site": "--site",  # the site file found, by its absolute path (core/cli/sweep.py sets it)
    "quiet": "--quiet",
}
#: options a resume command leaves out: it resumes (--resume) and runs (not --dry-run, so no
#: --print-site)
NOT_RESUMED = frozenset({"command", "debug", "dry_run", "resume", "print_site"})


def add_sweep_arguments(sweep: argparse.ArgumentParser, machine_help: str) -> None:
    """The file, what to do with it (dry run, toy, resume), overrides of the file, and the Slurm jobs."""
    sweep.add_argument("file", metavar="FILE", type=Path, nargs="?", help="grid file (.toml, .yaml, .yml or .json)")
    sweep.add_argument("--dry-run", action="store_true", help="list the cells and validate them; run nothing")
    sweep.add_argument(
        "--machine",
        help=machine_help + "; with --executor slurm: plan the jobs for their compute nodes (docs/cluster.md"
        "#submitting-from-a-login-node); default: the file's `machine`",
    )
    sweep.add_argument(
        "--toy",
        action="store_true",
        help="the file's cells shrunk to run on this CPU in seconds, stored as NAME-toy (docs/sweeps.md#toy-scale)",
    )
    sweep.add_argument("--resume", action="store_true", help="continue a sweep already in the database")
    sweep.add_argument(
        "--retry-failed", action="store_true", help="with --resume, run failed repeats (oom, error, timeout) again"
    )
    sweep.add_argument("--database", type=Path, help=DATABASE_HELP)
    sweep.add_argument("--repeats", type=int, help="runs per cell (overrides the file; default 3)")
    sweep.add_argument("--timeout-seconds", type=float, help="time limit of one repeat (overrides the file)")
    sweep.add_argument("--skip-invalid", action="store_true", help="run the valid cells when some are invalid")
    sweep.add_argument(
        "--quiet",
        action="store_true",
        help="no progress on stderr (the status line, or in a log a status line every 30 s); "
        "the line per finished run still prints",
    )
    sweep.add_argument(
        "--workers",
        choices=("warm", "fresh"),
        help="local sweeps only. warm: fork each run from a parent that imported PyTorch once, where that is "
        "safe (default); fresh: a new interpreter per run (docs/sweeps.md#warm-workers)",
    )
    sweep.add_argument("--name", help="the sweep's name in the database (overrides the file)")
    sweep.add_argument(
        "--executor",
        choices=("local", "slurm"),
        default="local",
        help="local: one repeat after another on this machine (default); slurm: each repeat a Slurm job "
        "(docs/cluster.md#sweeps-on-a-cluster)",
    )
    sweep.add_argument(
        "--site",
        metavar="FILE",
        help="the site file (default: $CORE_SITE, else $XDG_CONFIG_HOME/core/site.toml, else /etc/core/site.toml; "
        "docs/cluster.md#site-file)",
    )
    sweep.add_argument(
        "--print-site", action="store_true", help="say which site file is found and what it sets; run nothing"
    )
    slurm = sweep.add_argument_group("Slurm jobs (override the sweep file's [slurm] table)")
    for flag, kind, what in SLURM_FLAGS:
        slurm.add_argument(f"--slurm-{flag.replace('_', '-')}", dest=f"slurm_{flag}", type=kind, help=what)
    slurm.add_argument(
        "--slurm-option",
        dest="slurm_extra_options",
        action="append",
        metavar="OPTION",
        help="a further sbatch option such as --slurm-option=--qos=high (repeatable)",
    )
