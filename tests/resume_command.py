"""The resume command a stopped sweep prints (core/cli/resume.py, resume_command), read back for the tests."""

from __future__ import annotations

import shlex


def printed_command(stderr: str, prefix: str = "Continue with: ") -> str:
    """The shell command after ``prefix`` on the line that has it."""
    lines = [line for line in stderr.splitlines() if prefix in line]
    assert lines, f"no {prefix!r} in: {stderr}"
    return lines[-1].split(prefix, 1)[1]


def resume_words(stderr: str, prefix: str = "Continue with: ") -> list[str]:
    """The printed command's words after the program (``core``, its path, or ``python -m core.cli``):
    what ``core.cli.main`` takes."""
    words = shlex.split(printed_command(stderr, prefix))
    return words[words.index("sweep") :]
