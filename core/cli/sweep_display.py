"""What ``core sweep`` shows: the cells of a plan (``--dry-run``), and, while it runs, the progress
on stderr (a status line on a terminal, a plain line every 30 s in a log; a Slurm sweep's queued,
running, done and failed jobs) and one line per finished run on stdout."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from core.cli.text import count
from core.sweep.loop import SweepObserver

if TYPE_CHECKING:
    from core.base.results import RunResult
    from core.running.progress import ProgressLine
    from core.sweep.loop import JobCounts
    from core.sweep.plan import Cell, SweepPlan


#: Slurm's reasons for a job that waits its turn (https://slurm.schedmd.com/job_reason_codes.html):
#: shown on the progress line only
_ORDINARY_QUEUE_REASONS = frozenset(
    {"None", "Priority", "Resources", "BeginTime", "Dependency", "Prolog", "Cleaning", "Licenses", "Reservation"}
)
#: what the common reasons mean, for a person who does not know Slurm's codes
_QUEUE_REASONS = {
    "Priority": "jobs of higher priority go first",
    "Resources": "the nodes it needs are busy",
    "None": "not yet considered by the scheduler",
    "JobHeldUser": "held by its user: scontrol release lets it start",
    "JobHeldAdmin": "held by an administrator",
    "PartitionDown": "its partition is down",
    "PartitionInactive": "its partition is inactive",
    "NodeDown": "a node it needs is down",
    "ReqNodeNotAvail": "a node it needs is unavailable (down, drained or reserved)",
}


class SweepDisplay(SweepObserver):
    """The sweep's progress line and a line per finished run: a sweep observer (core.sweep.SweepObserver)."""

    def __init__(self, *, quiet: bool = False, line: ProgressLine | None = None) -> None:
        """:param quiet: no progress on stderr (``--quiet``); the line per finished run still prints.
        :param line: where the progress goes (a test's, with its own stream and clock)."""
        from core.running.progress import ProgressLine

        self.line = line if line is not None else ProgressLine(enabled=not quiet)
        self._position = ""
        self._cells = 0
        self._told_pending: dict[str, str] = {}  # job -> the reason last printed for it
        self._counts = ""  # a cluster's last poll: queued, running, done, failed

    def started(self, plan: SweepPlan, runs_total: int, runs_finished: int, runs_recorded: int | None = None) -> None:
        self._cells = len(plan.valid_cells)
        beyond = max(0, (runs_recorded or 0) - runs_finished)
        if runs_finished or beyond:
            text = f"resuming sweep {plan.spec.name}: {runs_finished} of {count(runs_total, 'run')} already recorded"
            if beyond:
                text += (
                    f"; {beyond} more, beyond the {count(plan.spec.repeats, 'repeat')} per cell asked now, stay in "
                    "the database and count in its summaries"
                )
            self.line.print(text)

    def run_started(self, cell: Cell, repeat: int, runs_done: int, runs_total: int, seconds_left: float | None) -> None:
        from core.running.progress import format_duration

        self._position = (
            f"[{runs_done + 1}/{runs_total}] cell {cell.index + 1}/{self._cells} {cell.label} repeat {repeat + 1}"
        )
        # A cluster's jobs run side by side: no time left to estimate, its counts say how far it is.
        tail = f"~{format_duration(seconds_left)} left" if seconds_left is not None else self._counts
        self.line.show(f"{self._position} | {tail}" if tail else self._position)

    def waiting(self, cell: Cell, repeat: int, elapsed_seconds: float, seconds_left: float | None) -> None:
        from core.running.progress import format_duration

        self.line.show(
            f"{self._position} | {format_duration(elapsed_seconds)} in this run | ~{format_duration(seconds_left)} left"
        )

    def jobs_counted(self, counts: JobCounts) -> None:
        """The status line (a log's every 30 s) says how many of the sweep's jobs wait, run, are done."""
        failed = f" ({counts.failed} failed)" if counts.failed else ""
        self._counts = f"{counts.done}/{counts.total} done{failed}, {counts.running} running, {counts.queued} queued"
        self.line.show(f"sweep: {self._counts}")

    def queued(self, cell: Cell, repeat: int, job: str, reason: str) -> None:
        """The progress line says which job waits and why; a reason past the queue's ordinary
        waiting (a hold, a partition or node down...) is also printed once per job, so a sweep that
        waits on it is never silent, off a terminal too."""
        meaning = _QUEUE_REASONS.get(reason.split(",", 1)[0], "")
        said = f"Slurm job {job} pending: {reason}" + (f" ({meaning})" if meaning else "")
        self.line.show(f"[cell {cell.index + 1}/{self._cells} {cell.label} repeat {repeat + 1}] {said}")
        if reason.split(",", 1)[0] not in _ORDINARY_QUEUE_REASONS and self._told_pending.get(job) != reason:
            self._told_pending[job] = reason
            self.line.print(
                f"core: {cell.label} repeat {repeat + 1}: {said}; the sweep waits for it (scancel {job} stops it)",
                stream=sys.stderr,
            )

    def run_not_recorded(self, cell: Cell, repeat: int, result: RunResult, process_seconds: float) -> None:
        line = self._run_line(cell, repeat, result, process_seconds)
        self.line.print(f"{line}; not recorded: the database refused it (see below)")

    def run_finished(self, cell: Cell, repeat: int, result: RunResult, process_seconds: float) -> None:
        self.line.print(self._run_line(cell, repeat, result, process_seconds))

    @staticmethod
    def _run_line(cell: Cell, repeat: int, result: RunResult, process_seconds: float) -> str:
        from core.running.processes import summary_line

        outcome = result.to_target
        if result.status.ok and outcome is not None:  # trained to a target: no steady throughput
            time_to_target = outcome.time_to_target_seconds
            what = f"ok, {outcome.metric} {outcome.target:g} reached" + (
                f" in {time_to_target:.4g} s, {outcome.epochs:.4g} epochs" if time_to_target is not None else ""
            )
        elif result.status.ok and result.throughput_per_second is not None:
            what = f"ok, {result.throughput_per_second:.6g} {result.sample_unit or 'samples'}/s"
        elif result.status.ok:
            what = "ok"
        else:
            first_line = summary_line(result.status.message or "")
            where = f" in {result.status.phase}" if result.status.phase else ""
            what = f"{result.status.state.value}{where}" + (f": {first_line[:200]}" if first_line else "")
        took = f" ({process_seconds:.1f} s)" if process_seconds > 0 else ""  # 0: unknown (a job Slurm ended)
        return f"{cell.label} repeat {repeat + 1}: {what}{took}"


def print_plan(
    plan: SweepPlan,
    repeats: int,
    finished: dict[tuple[str, int], str],
    details: Callable[[Cell], list[str]] | None = None,
) -> None:
    """Each cell of the plan with what the database holds of it (and ``details`` of a valid one: a
    dry run's memory table on a machine), then the count of runs."""
    width = len(str(len(plan.cells)))
    for cell in plan.cells:
        done = sum(1 for repeat in range(repeats) if (cell.key, repeat) in finished)
        beyond = sum(1 for key, repeat in finished if key == cell.key and repeat >= repeats)
        state = (
            f"invalid: {cell.invalid_reason}"
            if not cell.valid
            else (f"{done}/{repeats} repeats recorded" if done else "to run")
        )
        if beyond and cell.valid:
            state += f", {beyond} more recorded beyond {repeats}"
        print(f"{cell.index + 1:>{width}}  {cell.label}  [{state}]")
        for line in details(cell) if details is not None and cell.valid else ():
            print(f"{'':>{width}}  {line}")
        for warning in cell.warnings:
            print(f"{'':>{width}}  warning: {warning}")
    valid = len(plan.valid_cells)
    print(
        f"{count(len(plan.cells), 'cell')} ({valid} valid, {len(plan.invalid_cells)} invalid) x "
        f"{count(repeats, 'repeat')} = {count(valid * repeats, 'run')}; "
        f"timeout {plan.spec.timeout_seconds:g} s per run"
    )
