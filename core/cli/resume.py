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
    and every option that shapes the sweep or names where its state lives (the database, the jobs
    directory, the name; a Slurm sweep's --machine), paths made absolute, each word quoted for a shell
    (:func:`shell_word`). ``resume=False``: the command that starts it (a sweep stopped before it
    was recorded)."""
    words = [*core_program(), "sweep", os.path.abspath(args.file), *(["--resume"] if resume else [])]
    words += ["--database", os.path.abspath(database), "--executor", args.executor]
    if args.executor == "slurm" and args.machine is not None:
        # What the jobs' cells were planned for (core.sweep.remote_plan); a profile file made absolute.
        words.append(f"--machine={_machine_word(args.machine)}")
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
    return " ".join(shell_word(word) for word in words)


def _machine_word(machine: str) -> str:
    """``--machine``'s value for a resume from any folder: a profile file's absolute path; a
    shipped profile's name as it is (find_machine reads a name that is no file as a profile's)."""
    return os.path.abspath(machine) if machine.endswith(".toml") or os.path.exists(machine) else machine


def shell_word(word: str) -> str:
    """``word`` quoted for a shell, to be read back as it is: ``shlex.quote``'s single quotes, or,
    for a word with a character core prints escaped (a control character, a newline, a byte that is
    not UTF-8 in a path), ``$'...'`` with each such character's bytes as ``\\xHH``. In single
    quotes, the ``\\x1b`` core prints for ESC would be read as four characters, not ESC."""
    import shlex

    from core.running.progress import printable

    if printable(word) == word and "\n" not in word and "\t" not in word:
        return shlex.quote(word)
    quoted = []
    for character in word:
        if character in "\\'":
            quoted.append("\\" + character)
        elif character in "\n\t" or printable(character) != character:
            quoted.append(_escaped(character))
        else:
            quoted.append(character)
    return "$'" + "".join(quoted) + "'"


def _escaped(character: str) -> str:
    """``character``'s bytes in a path as ``$'...'`` writes them: a byte that was not UTF-8
    (os.fsencode gives back the byte Python's surrogateescape held it as) is that byte again."""
    try:
        data = os.fsencode(character)
    except UnicodeEncodeError:  # a lone surrogate no path can hold: written as the code point
        return f"\\u{ord(character):04x}"
    return "".join(f"\\x{byte:02x}" for byte in data)


def _jobs_directory_used(args: argparse.Namespace, database: Path, spec: SweepSpec) -> Path | None:
    """The jobs directory this Slurm sweep was given (by the flag or the file), absolute: the resumed
    sweep must find its jobs there from any working directory. None for the default, beside the
    database: the absolute ``--database`` finds it, and a path ``--slurm-jobs-directory`` refuses
    (a control character in the database's folder) is not repeated."""
    from core.sweep.cluster import jobs_directory
    from core.sweep.slurm_settings import SlurmSettings

    given = args.slurm_jobs_directory or (spec.slurm.jobs_directory if spec.slurm is not None else None)
    return jobs_directory(database, SlurmSettings(jobs_directory=given)) if given else None
