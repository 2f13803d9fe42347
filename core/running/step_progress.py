"""Progress within a phase of many steps (the warm-up, the timed window), told from the step clock
the runner already marks: a count and a cheap time check per step, no synchronisation, no I/O
between reports. Where the run is in another process (a child, a launcher's rank 0), the reports
travel as a small file beside its partial result, read by the process that shows them.

Steps are counted as the host issues them; on a device that runs ahead of the host's queue a count
is the steps issued, a little ahead of those finished, which the phase's end corrects.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from core.executors.base import StepClock

#: how often a phase of many steps tells its progress (the display shows it at its own pace)
REPORT_SECONDS = 1.0


#: A child's request (core.running.launch.write_request) says under this key whether the process
#: that started it reads its steps' progress; where nothing does, the child counts no steps.
STEPS_PROGRESS_KEY = "steps_progress"


@dataclass(frozen=True)
class StepProgress:
    """``steps_done`` of the ``steps_total`` of ``phase`` ('warmup', 'window'), ``elapsed_seconds`` in."""

    phase: str
    steps_done: int
    steps_total: int
    elapsed_seconds: float

    def seconds_left(self) -> float | None:
        """The phase's pace so far times the steps left; None before a step is done."""
        if self.steps_done <= 0:
            return None
        return self.elapsed_seconds / self.steps_done * max(0, self.steps_total - self.steps_done)


StepProgressCallback = Callable[[StepProgress], None]


class ReportingStepClock(StepClock):
    """A step clock that passes each mark on to ``inner`` (None: marks are only counted) and tells
    ``report`` of the steps done every ``interval_seconds``. ``marks_before_first_step``: the window
    marks its start once before its first step."""

    def __init__(
        self,
        inner: StepClock | None,
        phase: str,
        steps_total: int,
        report: StepProgressCallback,
        *,
        marks_before_first_step: int = 0,
        interval_seconds: float = REPORT_SECONDS,
        now: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._inner, self._phase, self._total, self._report = inner, phase, steps_total, report
        self._marks = -marks_before_first_step
        self._interval, self._now = interval_seconds, now
        self._started = now()
        self._next_report = self._started + interval_seconds

    def mark(self) -> None:
        if self._inner is not None:
            self._inner.mark()
        self._marks += 1
        now = self._now()
        if now >= self._next_report:  # the only per-step work besides the count
            self._next_report = now + self._interval
            self._report(StepProgress(self._phase, max(0, self._marks), self._total, now - self._started))

    def intervals_seconds(self) -> list[float]:
        return [] if self._inner is None else self._inner.intervals_seconds()


def progress_path(result_path: Path) -> Path:
    """Where a process writing ``result_path`` (or its ``.partial``) puts its step progress."""
    return result_path.with_name(result_path.name + ".steps")


def write_progress(path: Path, progress: StepProgress) -> None:
    """Replace ``path`` with ``progress``: no fsync (a report lost in a crash is harmless), so no
    wait on the disk inside a timed window; a reader never sees half a file."""
    scratch = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        scratch.write_text(json.dumps(asdict(progress)), encoding="utf-8")
        os.replace(scratch, path)
    except OSError:
        scratch.unlink(missing_ok=True)  # progress is a courtesy: a full disk costs it, not the run


class ProgressFile:
    """Another process's step progress, read again whenever it changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._version: tuple[int, int, int] | None = None

    def refresh(self) -> StepProgress | None:
        """The progress written since the last call, or None."""
        try:
            stat = self.path.stat()
            version = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
            if version == self._version:
                return None
            document = json.loads(self.path.read_text(encoding="utf-8"))
            progress = StepProgress(
                phase=str(document["phase"]),
                steps_done=int(document["steps_done"]),
                steps_total=int(document["steps_total"]),
                elapsed_seconds=float(document["elapsed_seconds"]),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None
        self._version = version
        return progress
