"""What ``core sweep`` shows: the cells of a plan (``--dry-run``), and, while it runs, the progress
line on stderr (terminals only) and one line per finished run on stdout."""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.cli.text import count
from core.sweep.loop import SweepObserver

if TYPE_CHECKING:
    from core.base.results import RunResult
    from core.sweep.plan import Cell, SweepPlan


class SweepDisplay(SweepObserver):
    """The sweep's progress line and a line per finished run: a sweep observer (core.sweep.SweepObserver)."""

    def __init__(self) -> None:
        from core.running.progress import ProgressLine

        self.line = ProgressLine()
        self._position = ""
        self._cells = 0

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
        self.line.show(f"{self._position} | ~{format_duration(seconds_left)} left")

    def waiting(self, cell: Cell, repeat: int, elapsed_seconds: float, seconds_left: float | None) -> None:
        from core.running.progress import format_duration

        self.line.show(
            f"{self._position} | {format_duration(elapsed_seconds)} in this run | ~{format_duration(seconds_left)} left"
        )

    def run_finished(self, cell: Cell, repeat: int, result: RunResult, process_seconds: float) -> None:
        from core.running.processes import summary_line

        if result.status.ok:
            what = f"ok, {result.throughput_per_second:.6g} {result.sample_unit or 'samples'}/s"
        else:
            first_line = summary_line(result.status.message or "")
            where = f" in {result.status.phase}" if result.status.phase else ""
            what = f"{result.status.state.value}{where}" + (f": {first_line[:200]}" if first_line else "")
        took = f" ({process_seconds:.1f} s)" if process_seconds > 0 else ""  # 0: unknown (a job Slurm ended)
        self.line.print(f"{cell.label} repeat {repeat + 1}: {what}{took}")


def print_plan(plan: SweepPlan, repeats: int, finished: dict[tuple[str, int], str]) -> None:
    """Each cell of the plan with what the database holds of it, then the count of runs."""
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
        for warning in cell.warnings:
            print(f"{'':>{width}}  warning: {warning}")
    valid = len(plan.valid_cells)
    print(
        f"{count(len(plan.cells), 'cell')} ({valid} valid, {len(plan.invalid_cells)} invalid) x "
        f"{count(repeats, 'repeat')} = {count(valid * repeats, 'run')}; "
        f"timeout {plan.spec.timeout_seconds:g} s per run"
    )
