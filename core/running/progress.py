"""A one-line progress display on a terminal: the current cell or phase and the time left.

Silent when the stream is not a terminal (CI logs, pipes, files), so that nothing but results
reaches them. The line is redrawn in place with a carriage return and cleared before any
other output is printed.
"""

from __future__ import annotations

import shutil
import sys
from typing import Any, TextIO

_CLEAR_LINE = "\r\x1b[2K"


def format_duration(seconds: float | None) -> str:
    """``45 s``, ``3:07``, ``1:02:03``; ``?`` when unknown."""
    if seconds is None:
        return "?"
    whole = int(round(seconds))
    if whole < 60:
        return f"{whole} s"
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class ProgressLine:
    """A status line that rewrites itself; does nothing unless ``stream`` is a terminal."""

    def __init__(self, stream: TextIO | None = None, *, enabled: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled
        self._shown = False

    def show(self, text: str) -> None:
        if not self.enabled:
            return
        width = max(20, shutil.get_terminal_size((100, 20)).columns - 1)
        if len(text) > width:
            text = text[: width - 3] + "..."
        self.stream.write(_CLEAR_LINE + text)
        self.stream.flush()
        self._shown = True

    def clear(self) -> None:
        if self._shown:
            self.stream.write(_CLEAR_LINE)
            self.stream.flush()
            self._shown = False

    def print(self, text: str, stream: TextIO | None = None) -> None:
        """Print a permanent line (to stdout by default) without tearing the status line."""
        self.clear()
        print(text, file=stream if stream is not None else sys.stdout, flush=True)


class RunProgress:
    """``core run``'s display: phases done so far, and the window's expected length after warm-up."""

    def __init__(self, line: ProgressLine, title: str, steps: int, warmup_steps: int) -> None:
        self._line, self._title, self._steps, self._warmup_steps = line, title, steps, warmup_steps

    def start(self) -> None:
        self._line.show(f"{self._title}: setting up")

    def __call__(self, result: Any) -> None:
        done = [
            f"{name} {seconds:.3g} s"
            for name, seconds in (
                ("setup", result.setup_seconds),
                ("first step", result.first_step_seconds),
                ("warm-up", result.warmup_seconds),
            )
            if seconds is not None
        ]
        if result.window_seconds is not None or not result.status.ok:
            self._line.clear()
            return
        if result.warmup_seconds is not None:
            estimate = (result.warmup_seconds / self._warmup_steps * self._steps) if self._warmup_steps else None
            doing = f"timed window of {self._steps} steps, ~{format_duration(estimate)} left"
        elif result.first_step_seconds is not None:
            doing = f"warm-up ({self._warmup_steps} steps)"
        else:
            doing = "first step (compilation happens here)"
        self._line.show(f"{self._title}: {' | '.join(done)} | {doing}")
