"""A one-line progress display on a terminal: the current cell or phase and the time left; and
text printed safely (:func:`printable`, :class:`EscapingStream`).

Silent when the stream is not a terminal (CI logs, pipes, files), so that nothing but results
reaches them. The line is redrawn in place with a carriage return and cleared before any
other output is printed.
"""

from __future__ import annotations

import re
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from core.running.observe import Observer

_CLEAR_LINE = "\r\x1b[2K"

# What a terminal acts on instead of showing: C0 controls but tab and newline (ESC starts colour,
# cursor, title and hyperlink sequences; CR rewrites the line), DEL, C1 controls (CSI 0x9b is ESC [),
# the bidirectional overrides and isolates that show text in another order than it is, and lone
# surrogates, which cannot even be encoded. Names read from a database or a plugin can hold any.
_UNPRINTABLE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def escape_character(match: re.Match[str]) -> str:
    """The matched character written out (``\\x1b``, ``\\u202e``): the one spelling core shows a
    control character in, on a terminal and in a report (core.report.document.clean_text)."""
    code = ord(match.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with what a terminal would act on written out as ``\\x1b``, ``\\u202e``: shown, not obeyed."""
    return _UNPRINTABLE.sub(escape_character, text)


class EscapingStream:
    """A text stream that writes :func:`printable` text to ``stream``, for the ``core`` command's
    stdout and stderr: whatever a result, a database or a plugin hands over, and whichever print
    shows it, cannot move the cursor, recolour or retitle the terminal. A control sequence of
    core's own (the progress line's) goes through :meth:`write_control`."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        return self.stream.write(printable(text))

    def write_control(self, sequence: str) -> None:
        self.stream.write(sequence)

    def __getattr__(self, name: str) -> Any:  # flush, isatty, fileno, encoding, buffer...
        return getattr(self.stream, name)


@contextmanager
def escaping_standard_streams() -> Iterator[None]:
    """sys.stdout and sys.stderr as :class:`EscapingStream` for the duration of the block."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = EscapingStream(saved[0]), EscapingStream(saved[1])
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def _write_control(stream: TextIO, sequence: str) -> None:
    getattr(stream, "write_control", stream.write)(sequence)


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
        text = printable(text)
        if len(text) > width:
            text = text[: width - 3] + "..."
        _write_control(self.stream, _CLEAR_LINE)
        self.stream.write(text)
        self.stream.flush()
        self._shown = True

    def clear(self) -> None:
        if self._shown:
            _write_control(self.stream, _CLEAR_LINE)
            self.stream.flush()
            self._shown = False

    def print(self, text: str, stream: TextIO | None = None) -> None:
        """Print a permanent line (to stdout by default) without tearing the status line."""
        self.clear()
        print(printable(text), file=stream if stream is not None else sys.stdout, flush=True)


class RunProgress(Observer):
    """``core run``'s display: phases done so far, and the window's expected length after warm-up.
    A run's observer; called, it is ``core.run``'s ``on_progress``."""

    def __init__(self, line: ProgressLine, title: str, steps: int, warmup_steps: int) -> None:
        self._line, self._title, self._steps, self._warmup_steps = line, title, steps, warmup_steps

    def start(self) -> None:
        self._line.show(f"{self._title}: setting up")

    def __call__(self, result: Any) -> None:
        self.phase_ended(result)

    def phase_ended(self, result: Any) -> None:
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
