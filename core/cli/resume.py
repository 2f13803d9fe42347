"""The command a stopped sweep prints to resume it: word for word what the user runs next."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from core.cli.sweep_arguments import RESUMED_FLAGS, SLURM_FLAGS

if TYPE_CHECKING:
    from core.sweep.spec import SweepSpec


def core_program() -> list[str]:
    """How to start this ``core`` again from a shell: ``core`` where that is the one on PATH, else
    this script's path, else this interpreter with ``-m core.cli`` (core run from Python)."""
    import shutil

    script = sys.argv[0] if sys.argv else ""
    if Path(script).name == "core":
        on_path = shutil.which("core")
        try:
            if on_path is not None and os.path.samefile(on_path, script):
                return ["core"]
        except OSError:
            pass
        if os.path.exists(script):
            return [os.path.abspath(script)]
    return [sys.executable, "-m", "core.cli"]


def resume_command(args: argparse.Namespace, database: Path, spec: SweepSpec, *, resume: bool = True) -> str:
    """The shell command that resumes this sweep, word for word: the same file, database, executor
    and every option that shapes the sweep, paths made absolute, each word quoted for a POSIX shell.
    ``resume=False``: the command that starts it (a sweep stopped before it was recorded)."""
    import shlex

    words = [*core_program(), "sweep", os.path.abspath(args.file), *(["--resume"] if resume else [])]
    words += ["--database", os.path.abspath(database), "--executor", args.executor]
    for dest, flag in RESUMED_FLAGS.items():
        if dest == "workers" and args.executor == "slurm":
            continue  # a Slurm job runs one repeat in its own interpreter: no fork server to choose
        value = getattr(args, dest)
        if value is True:
            words.append(flag)
        elif value not in (None, False):
            words.append(f"{flag}={value}")
    for name, _, _ in SLURM_FLAGS:
        value = getattr(args, f"slurm_{name}")
        if name == "jobs_directory" and args.executor == "slurm":
            value = _jobs_directory_used(args, database, spec)
        if value is not None:
            words.append(f"--slurm-{name.replace('_', '-')}={value}")
    words += [f"--slurm-option={option}" for option in args.slurm_extra_options or ()]
    return shlex.join(words)


def _jobs_directory_used(args: argparse.Namespace, database: Path, spec: SweepSpec) -> Path:
    """The jobs directory this Slurm sweep used (the flag's, the file's, or the default beside the
    database), absolute: the resumed sweep must find its jobs there from any working directory."""
    from core.sweep.cluster import jobs_directory
    from core.sweep.slurm_settings import SlurmSettings

    given = args.slurm_jobs_directory or (spec.slurm.jobs_directory if spec.slurm is not None else None)
    return jobs_directory(database, SlurmSettings(jobs_directory=given))
