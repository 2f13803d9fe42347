"""Progress as a run or a sweep goes: the current phase or cell, its steps and the time left; and
text printed safely (:func:`printable`, :class:`EscapingStream`).

Two forms, one content (:class:`ProgressLine`): on a terminal, one status line redrawn in place and
fitted to the terminal's width, cleared before any other output is printed; elsewhere (a batch job's
log, nohup, a pipe) plain lines, no carriage return nor escape sequence, the status at most every
``interval_seconds``. A line that marks a phase (:meth:`ProgressLine.note`) is printed in both.
Progress goes to stderr: stdout keeps the results, whole.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from core.base.config import HIGHER_IS_BETTER_METRICS
from core.running.observe import Observer
from core.running.step_progress import StepProgress

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


#: how often a log (output that is no terminal) gets the status line: often enough to see a run
#: move, seldom enough that a day-long sweep's log stays readable
LOG_INTERVAL_SECONDS = 30.0
#: the parts of a status line, the last one (the time left) kept whole when the line is cut
SEPARATOR = " | "


def fit_line(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, shortening its front parts, so that its last part (the
    time left) stays whole where it fits."""
    if len(text) <= width:
        return text
    head, separator, tail = text.rpartition(SEPARATOR)
    room = width - len(separator) - len(tail) - 3
    if separator and room >= 10:
        return head[:room] + "..." + separator + tail
    return text[: max(0, width - 3)] + "..."


def terminal_width(stream: TextIO) -> int:
    """The columns of the terminal ``stream`` writes to (its own, not stdout's, which may be a file);
    $COLUMNS first, as shutil reads it."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return shutil.get_terminal_size((100, 20)).columns


class ProgressLine:
    """A status line that rewrites itself on a terminal, and prints plain lines elsewhere.

    :param enabled: False shows nothing (``--quiet``); permanent lines (:meth:`print`) still print.
    :param interactive: whether ``stream`` is a terminal (default: ask it).
    :param interval_seconds: off a terminal, the least time between two status lines.
    :param clock: seconds, for the interval (a test's SimulatedClock.now).
    :param width: the terminal's width (default: asked of the terminal at each redraw).
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        enabled: bool = True,
        interactive: bool | None = None,
        interval_seconds: float = LOG_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        width: int | None = None,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        if interactive is None:
            isatty = getattr(self.stream, "isatty", None)
            interactive = bool(isatty and isatty())
        self.enabled = enabled
        self.interactive = interactive
        self._interval, self._clock, self._width = interval_seconds, clock, width
        self._shown = False
        self._last_logged: float | None = None

    def show(self, text: str) -> None:
        """The status now: redrawn on a terminal; in a log, a line if none came for ``interval_seconds``."""
        if not self.enabled:
            return
        if not self.interactive:
            now = self._clock()
            if self._last_logged is None or now - self._last_logged >= self._interval:
                self._log(text, now)
            return
        width = max(20, (self._width or terminal_width(self.stream)) - 1)
        _write_control(self.stream, _CLEAR_LINE)
        self.stream.write(fit_line(printable(text), width))
        self.stream.flush()
        self._shown = True

    def note(self, text: str) -> None:
        """A line that stays, on the progress stream: a phase begun or ended. In a log it restarts the
        interval, so that the next status line follows it by ``interval_seconds``."""
        if not self.enabled:
            return
        self.clear()
        if self.interactive:
            print(printable(text), file=self.stream, flush=True)
        else:
            self._log(text, self._clock())

    def _log(self, text: str, now: float) -> None:
        # One plain line: what a terminal would act on (a carriage return included) is written out.
        print(printable(text), file=self.stream, flush=True)
        self._last_logged = now

    def clear(self) -> None:
        if self._shown:
            _write_control(self.stream, _CLEAR_LINE)
            self.stream.flush()
            self._shown = False

    def print(self, text: str, stream: TextIO | None = None) -> None:
        """Print a permanent line (to stdout by default) without tearing the status line."""
        self.clear()
        print(printable(text), file=stream if stream is not None else sys.stdout, flush=True)


_PHASE_NAMES = {"warmup": "warm-up", "window": "timed window"}

#: the least time between two evaluations' lines of a run to a target (a line that stays); the
#: evaluations between them redraw the status line on a terminal only
EVALUATION_LINE_SECONDS = 1.0


class RunProgress(Observer):
    """``core run``'s display: a line as each phase ends (set-up, first step, warm-up, the window with
    its energy, the accuracy pass), and within the warm-up and the window their steps done and the
    time left, from the pace so far. A run to a target quality says its own phases instead: set-up,
    then training to the target, an evaluation's epoch and metric at most every
    ``EVALUATION_LINE_SECONDS`` (the last one always), and how training ended. A run's observer;
    called, it is ``core.run``'s ``on_progress``.

    :param clock: seconds, for the evaluations' interval (a test's SimulatedClock.now).
    """

    def __init__(
        self,
        line: ProgressLine,
        title: str,
        steps: int,
        warmup_steps: int,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._line, self._title, self._steps, self._warmup_steps = line, title, steps, warmup_steps
        self._told: set[str] = set()
        self._clock = clock
        self._evaluations_told = 0  # the curve's points seen
        self._evaluation_noted_at: float | None = None

    def run_starting(self, config: Any) -> None:
        """The configuration is valid and the run sets up its devices (a refusal prints no line)."""
        self._line.note(f"{self._title}: setting up")

    def __call__(self, result: Any) -> None:
        self.phase_ended(result)

    def phase_ended(self, result: Any) -> None:
        if result.config.target is not None:
            self._target_progress(result)
            return
        for phase, line in self._phase_lines(result):
            if phase not in self._told:
                self._told.add(phase)
                self._line.note(f"{self._title}: {line}")
        if result.window_seconds is not None or not result.status.ok:
            return
        if result.warmup_seconds is not None:
            estimate = result.warmup_seconds / self._warmup_steps * self._steps if self._warmup_steps else None
            self._line.show(
                f"{self._title}: timed window of {self._steps} steps{SEPARATOR}~{format_duration(estimate)} left"
            )
        elif result.first_step_seconds is not None:
            self._line.show(f"{self._title}: warm-up ({self._warmup_steps} steps)")
        else:
            self._line.show(f"{self._title}: first step (compilation happens here)")

    def _phase_lines(self, result: Any) -> list[tuple[str, str]]:
        """(phase, its line) for each phase the partial result has ended."""
        lines = []
        if result.setup_seconds is not None:
            lines.append(
                ("setup", f"set-up {format_duration(result.setup_seconds)}; first step (compilation happens here)")
            )
        if result.first_step_seconds is not None:
            lines.append(
                (
                    "first_step",
                    f"first step {format_duration(result.first_step_seconds)}; warm-up of {self._warmup_steps} steps",
                )
            )
        if result.warmup_seconds is not None:
            lines.append(
                ("warmup", f"warm-up {format_duration(result.warmup_seconds)}; timed window of {self._steps} steps")
            )
        if result.window_seconds is not None:
            lines.append(("window", self._window_line(result)))
        if not result.status.ok:
            where = f" in {result.status.phase}" if result.status.phase else ""
            lines.append(("status", f"{result.status.state.value}{where}"))
        return lines

    def _target_progress(self, result: Any) -> None:
        """A run to a target: set-up, its evaluations as they come, and how training ended."""
        target, outcome = result.config.target, result.to_target
        goal = f"{target.metric} {_direction(result)} {target.value:g}"
        if result.setup_seconds is not None:
            self._note_once(
                "setup", f"set-up {format_duration(result.setup_seconds)}; training to {goal}, {_schedule(target)}"
            )
        ended = outcome is not None and (outcome.reached or result.status.state.value == "target_not_reached")
        curve = outcome.curve if outcome is not None else []
        for index in range(self._evaluations_told, len(curve)):
            text = f"{self._title}: {_evaluation_line(index + 1, curve[index], target.metric)}"
            now = self._clock()
            last = ended and index == len(curve) - 1
            noted = self._evaluation_noted_at
            if last or noted is None or now - noted >= EVALUATION_LINE_SECONDS:
                self._line.note(text)
                self._evaluation_noted_at = now
            else:
                self._line.show(text)
        self._evaluations_told = len(curve)
        if ended:
            assert outcome is not None
            if outcome.reached:
                how = (
                    f"{goal} reached in {format_duration(outcome.time_to_target_seconds)}, {outcome.epochs:.4g} epochs"
                )
            else:
                how = f"{goal} not reached after {outcome.epochs:.4g} epochs ({outcome.stopped_by} spent)"
            self._note_once("training", f"{how} ({len(curve)} evaluation{'' if len(curve) == 1 else 's'})")
        elif not result.status.ok:
            where = f" in {result.status.phase}" if result.status.phase else ""
            self._note_once("status", f"{result.status.state.value}{where}")
        elif result.setup_seconds is not None and not curve:
            self._line.show(f"{self._title}: training to {goal} (first step and first evaluation)")

    def _note_once(self, phase: str, text: str) -> None:
        if phase not in self._told:
            self._told.add(phase)
            self._line.note(f"{self._title}: {text}")

    def _window_line(self, result: Any) -> str:
        line = f"timed window {format_duration(result.window_seconds)} ({result.window_steps} steps)"
        if result.energy_joules is not None:
            line += f", energy {result.energy_joules:.4g} J"
        if result.config.accuracy:
            line += "; accuracy pass"
        return line

    def steps_progress(self, progress: StepProgress) -> None:
        done, total = progress.steps_done, progress.steps_total
        left = progress.seconds_left()
        if progress.phase == "warmup" and left is not None and done:
            left += progress.elapsed_seconds / done * self._steps  # the window to come, at the warm-up's pace
        name = _PHASE_NAMES.get(progress.phase, progress.phase)
        self._line.show(
            f"{self._title}: {name} step {done}/{total}, {format_duration(progress.elapsed_seconds)} in"
            f"{SEPARATOR}~{format_duration(left)} left"
        )


def _direction(result: Any) -> str:
    """'>=' or '<=': how the target is met (the outcome's, once known; before it, core's own metrics'
    direction: 'loss' and 'perplexity' go down)."""
    outcome = result.to_target
    if outcome is not None:
        return ">=" if outcome.higher_is_better else "<="
    return ">=" if HIGHER_IS_BETTER_METRICS.get(result.config.target.metric, True) else "<="


def _schedule(target: Any) -> str:
    """How often a run to a target evaluates, and its budget: 'evaluating every epoch, at most 30 epochs'."""
    every = target.epochs_between_evaluations
    if every is not None:
        evaluate = "evaluating every epoch" if every == 1 else f"evaluating every {every} epochs"
    else:
        evaluate = f"evaluating every {target.evaluate_every_samples:,} samples"
    budget = []
    if target.max_epochs is not None:
        budget.append(f"{target.max_epochs} epochs")
    if target.max_seconds is not None:
        budget.append(format_duration(target.max_seconds))
    return f"{evaluate}, at most {' or '.join(budget)}" if budget else evaluate


def _evaluation_line(number: int, point: Any, metric: str) -> str:
    """One evaluation: 'evaluation 3: epoch 2.94, top1 0.875, 2 s in'."""
    return (
        f"evaluation {number}: epoch {point.epoch:.3g}, {metric} {point.value:.4g}, {format_duration(point.seconds)} in"
    )
