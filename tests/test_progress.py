"""Progress that works in logs (issue 30, item 6): a line per phase, the steps and an estimate that
updates, redrawn on a terminal and fitted to its width, plain lines every 30 s elsewhere; a Slurm
sweep's queued, running, done and failed jobs. And where a run ran: its Slurm job, a multi-node
run's hosts with no meter. Time is a SimulatedClock's throughout: nothing here reads the wall clock."""

from __future__ import annotations

import csv
import io
import json
import socket
from pathlib import Path
from typing import Any

import pytest

import core
import core.sweep
import core.sweep.cluster
import core.sweep.slurm_jobs
from core.base.distributed import ProcessContext
from core.base.results import RunResult, RunState
from core.cli import main
from core.cli.sweep_display import SweepDisplay
from core.running.progress import ProgressLine, RunProgress, fit_line
from core.running.step_progress import ProgressFile, ReportingStepClock, StepProgress, progress_path, write_progress
from core.sweep.loop import JobCounts
from core.testing import SimulatedClock
from tests.slurm_support import SimulatedSlurm

_CONTROL = ("\r", "\x1b")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _log_line(clock: SimulatedClock, stream: io.StringIO | None = None) -> ProgressLine:
    return ProgressLine(stream if stream is not None else io.StringIO(), clock=clock.now)


# --- the two forms -----------------------------------------------------------------------------


def test_off_a_terminal_the_status_is_a_plain_line_every_30_seconds() -> None:
    clock, log = SimulatedClock(), io.StringIO()
    line = _log_line(clock, log)
    assert not line.interactive
    line.show("window step 1/100 | ~99 s left")
    clock.advance(10)
    line.show("window step 10/100 | ~90 s left")  # 10 s after the last line: not yet
    clock.advance(20)
    line.show("window step 30/100 | ~70 s left")
    line.note("timed window 100 s (100 steps)")  # a phase's line prints at once, in both forms
    clock.advance(29)
    line.show("never printed")
    assert log.getvalue().splitlines() == [
        "window step 1/100 | ~99 s left",
        "window step 30/100 | ~70 s left",
        "timed window 100 s (100 steps)",
    ]
    assert not any(control in log.getvalue() for control in _CONTROL)


def test_a_log_line_writes_out_what_a_terminal_would_act_on() -> None:
    log = io.StringIO()
    ProgressLine(log, clock=SimulatedClock().now).show("cell\r\x1b[31mred")
    assert log.getvalue() == "cell\\x0d\\x1b[31mred\n"


def test_on_a_terminal_the_line_is_redrawn_and_fitted_keeping_the_time_left() -> None:
    terminal = _Terminal()
    line = ProgressLine(terminal, width=61, clock=SimulatedClock().now)
    assert line.interactive
    text = "fcnn on cpu -o layers=12 -o hidden_width=4096: timed window step 40/100 | ~1:30 left"
    line.show(text)
    line.show(text.replace("40/100", "41/100"))
    drawn = terminal.getvalue().split("\r\x1b[2K")[1:]
    assert len(drawn) == 2 and all(len(each) == 60 and each.endswith(" | ~1:30 left") for each in drawn)
    assert "\n" not in terminal.getvalue()


def test_fit_line_cuts_the_end_where_the_tail_alone_is_too_long() -> None:
    assert fit_line("short", 20) == "short"
    assert fit_line("a" * 30 + " | " + "b" * 30, 20) == "a" * 17 + "..."


def test_quiet_shows_nothing() -> None:
    log = io.StringIO()
    line = ProgressLine(log, enabled=False)
    line.show("status")
    line.note("phase")
    assert log.getvalue() == ""


# --- core run's progress -----------------------------------------------------------------------


def _partial(**measured: Any) -> RunResult:
    from core.base.config import RunConfig

    result = RunResult.of_config(
        RunConfig(workload="fcnn", accelerator="cpu", steps=100, warmup_steps=10, micro_batch_size=4), 1
    )
    for name, value in measured.items():
        setattr(result, name, value)
    return result


def test_a_run_prints_a_line_per_phase_and_an_estimate_that_updates() -> None:
    clock, log = SimulatedClock(), io.StringIO()
    progress = RunProgress(_log_line(clock, log), "fcnn on cpu", steps=100, warmup_steps=10)
    progress.run_starting(None)
    progress(_partial(setup_seconds=2.0))
    progress(_partial(setup_seconds=2.0, first_step_seconds=40.0))
    clock.advance(31)
    progress.steps_progress(StepProgress("warmup", 5, 10, 5.0))  # 1 s a step: 5 left, then 100
    progress(_partial(setup_seconds=2.0, first_step_seconds=40.0, warmup_seconds=10.0))
    clock.advance(31)
    progress.steps_progress(StepProgress("window", 20, 100, 40.0))  # 2 s a step: 80 left
    clock.advance(31)
    progress.steps_progress(StepProgress("window", 80, 100, 120.0))  # ... 20 left
    done = _partial(setup_seconds=2.0, first_step_seconds=40.0, warmup_seconds=10.0, window_seconds=150.0)
    done.window_steps, done.energy_joules = 100, 1234.5
    progress(done)
    progress(done)  # the final report: no phase told twice
    assert log.getvalue().splitlines() == [
        "fcnn on cpu: setting up",
        "fcnn on cpu: set-up 2 s; first step (compilation happens here)",
        "fcnn on cpu: first step 40 s; warm-up of 10 steps",
        "fcnn on cpu: warm-up step 5/10, 5 s in | ~1:45 left",
        "fcnn on cpu: warm-up 10 s; timed window of 100 steps",
        "fcnn on cpu: timed window step 20/100, 40 s in | ~2:40 left",
        "fcnn on cpu: timed window step 80/100, 2:00 in | ~30 s left",
        "fcnn on cpu: timed window 2:30 (100 steps), energy 1234 J",
    ]


def test_a_failed_run_says_where_it_failed() -> None:
    from core.base.results import Status

    log = io.StringIO()
    progress = RunProgress(_log_line(SimulatedClock(), log), "fcnn on cpu", steps=100, warmup_steps=10)
    failed = _partial(setup_seconds=1.0)
    failed.status = Status(state=RunState.oom, phase="first_step", message="out of memory")
    progress(failed)
    assert log.getvalue().splitlines()[-1] == "fcnn on cpu: oom in first_step"


# --- the step clock ----------------------------------------------------------------------------


class _Ticks:
    """A clock read once per mark: each read ``step`` seconds after the last."""

    def __init__(self, step: float) -> None:
        self.t, self.step = 0.0, step

    def __call__(self) -> float:
        value = self.t
        self.t += self.step
        return value


def test_the_step_clock_reports_about_once_an_interval_and_passes_each_mark_on() -> None:
    from core.executors.base import HostStepClock

    told: list[StepProgress] = []
    inner = HostStepClock()
    clock = ReportingStepClock(
        inner, "window", 10, told.append, marks_before_first_step=1, interval_seconds=1.0, now=_Ticks(0.25)
    )
    for _ in range(11):  # the start's mark, then one per step
        clock.mark()
    assert [(each.steps_done, each.elapsed_seconds) for each in told] == [(3, 1.0), (7, 2.0)]
    assert len(clock.intervals_seconds()) == 10  # the inner clock's figures, untouched


def test_progress_from_another_process_is_read_once_each_time_it_changes(tmp_path: Path) -> None:
    path = progress_path(tmp_path / "result.json.partial")
    reader = ProgressFile(path)
    assert reader.refresh() is None
    write_progress(path, StepProgress("window", 3, 10, 1.5))
    assert reader.refresh() == StepProgress("window", 3, 10, 1.5)
    assert reader.refresh() is None
    assert [entry.name for entry in tmp_path.iterdir()] == [path.name]  # no scratch file left


def test_a_run_tells_its_steps_and_keeps_its_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    import functools

    import core.running.runner
    from core.running.observe import Observer

    # Every mark reports (an interval of 0): which steps are told is then the run's, not the clock's.
    every_mark = functools.partial(ReportingStepClock, interval_seconds=0.0)
    monkeypatch.setattr(core.running.runner, "ReportingStepClock", every_mark)

    class Watcher(Observer):
        def __init__(self) -> None:
            self.phases: list[StepProgress] = []

        def steps_progress(self, progress: StepProgress) -> None:
            self.phases.append(progress)

    watcher = Watcher()
    result = core.run(
        "fcnn",
        "cpu",
        steps=3,
        warmup_steps=2,
        micro_batch_size=4,
        workload_options={"layers": 1, "hidden_width": 8},
        on_progress=_Callback(watcher),
    )
    assert result.status.ok and result.window_steps == 3 and result.step_seconds_median is not None
    told = [(each.phase, each.steps_done, each.steps_total) for each in watcher.phases]
    assert told == [
        ("warmup", 1, 2),
        ("warmup", 2, 2),
        ("window", 0, 3),
        ("window", 1, 3),
        ("window", 2, 3),
        ("window", 3, 3),
    ]


def test_a_run_nobody_watches_step_by_step_counts_no_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    # A tiny model's step takes tens of microseconds: counting steps for no listener would cost
    # about one per cent of it. A callback without steps_progress, and the plugins' hooks, do not listen.
    import core.running.runner

    made: list[str] = []

    def recorded(inner: Any, phase: str, *arguments: Any, **named: Any) -> Any:
        made.append(phase)
        return ReportingStepClock(inner, phase, *arguments, **named)

    monkeypatch.setattr(core.running.runner, "ReportingStepClock", recorded)
    options: dict[str, Any] = {"steps": 3, "warmup_steps": 2, "micro_batch_size": 4}
    options["workload_options"] = {"layers": 1, "hidden_width": 8}
    assert core.run("fcnn", "cpu", on_progress=lambda partial: None, **options).status.ok
    assert core.run("fcnn", "cpu", **options).status.ok
    assert made == []
    watched = core.run("fcnn", "cpu", on_progress=_Callback(lambda progress: None), **options)
    assert watched.status.ok and made == ["warmup", "window"]


def test_a_run_in_a_child_process_counts_steps_only_where_its_parent_listens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A sweep's runs and a run with a time limit run in a child, which used to count steps always
    # (its result writer listened) though no one read them: the request now says whether anyone does.
    import core.running.launch
    from core.running.child import _PartialWriter
    from core.running.step_progress import STEPS_PROGRESS_KEY

    asked: list[bool] = []
    real = core.running.launch.write_request

    def recorded(path: Path, planned: Any, parent_pid: int | None, **named: Any) -> None:
        real(path, planned, parent_pid, **named)
        asked.append(json.loads(path.read_text())[STEPS_PROGRESS_KEY])

    monkeypatch.setattr(core.running.launch, "write_request", recorded)
    options: dict[str, Any] = {"steps": 2, "warmup_steps": 1, "micro_batch_size": 4, "timeout_seconds": 120}
    options["workload_options"] = {"layers": 1, "hidden_width": 8}
    assert core.run("fcnn", "cpu", **options).status.ok
    assert core.run("fcnn", "cpu", on_progress=_Callback(lambda progress: None), **options).status.ok
    assert asked == [False, True]
    # The child's side: a request without the key (an older core's parent) is read as listening.
    assert not _PartialWriter(tmp_path / "result.json", steps_progress=False).wants_steps_progress()
    assert _PartialWriter(tmp_path / "result.json").wants_steps_progress()


class _Callback:
    """An on_progress callback with a steps_progress of its own, as the CLI's RunProgress has."""

    def __init__(self, watcher: Any) -> None:
        self.steps_progress = getattr(watcher, "steps_progress", watcher)

    def __call__(self, partial: RunResult) -> None:
        pass


# --- a Slurm sweep's counts --------------------------------------------------------------------


def test_the_sweep_display_says_queued_running_done_and_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    clock, log = SimulatedClock(), io.StringIO()
    display = SweepDisplay(line=_log_line(clock, log))
    display.jobs_counted(JobCounts(queued=9, running=4, done=3, failed=1, total=16))
    clock.advance(30)
    display.jobs_counted(JobCounts(queued=5, running=4, done=7, failed=1, total=16))
    assert log.getvalue().splitlines() == [
        "sweep: 3/16 done (1 failed), 4 running, 9 queued",
        "sweep: 7/16 done (1 failed), 4 running, 5 queued",
    ]
    terminal = _Terminal()
    display = SweepDisplay(line=ProgressLine(terminal, width=200))
    display.jobs_counted(JobCounts(queued=2, running=1, done=0, failed=0, total=3))
    assert terminal.getvalue() == "\r\x1b[2Ksweep: 0/3 done, 1 running, 2 queued"


def test_a_slurm_sweep_counts_its_jobs_as_each_poll_finds_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slurm = SimulatedSlurm()
    monkeypatch.setattr(core.sweep.slurm_jobs, "unavailable_reason", lambda: None)
    monkeypatch.setattr(core.sweep.cluster, "make_scheduler", lambda: slurm)

    def poll(slurm: SimulatedSlurm, number: int) -> None:
        if number == 1:
            slurm.jobs[slurm.job(1, 1)]["state"] = "RUNNING"
        elif number == 2:
            slurm.end(slurm.job(1, 1), "FAILED", result="error", exit_code=1)  # stops cell 1
            slurm.jobs[slurm.job(2, 1)]["state"] = "RUNNING"
        elif number == 3:
            slurm.end(slurm.job(2, 1), "COMPLETED", result="ok", exit_code=0)
            slurm.end(slurm.job(3, 1), "COMPLETED", result="ok", exit_code=0)

    slurm.on_poll = poll
    sweep = tmp_path / "sim.toml"
    sweep.write_text(
        'name = "sim"\nrepeats = 1\ntimeout_seconds = 60\n[grid]\nworkload = "fcnn"\naccelerator = "cpu"\n'
        "steps = [2, 3, 4]\nmicro_batch_size = 4\nworkload_options = {layers = 1, hidden_width = 8}\n"
        "[slurm]\npoll_seconds = 5\n"
    )
    counted: list[JobCounts] = []

    class Watcher:
        def jobs_counted(self, counts: JobCounts) -> None:
            counted.append(counts)

    core.sweep.run_sweep(sweep, database=tmp_path / "results.db", executor="slurm", observer=Watcher())
    assert counted == [
        JobCounts(queued=2, running=1, done=0, failed=0, total=3),
        JobCounts(queued=1, running=1, done=0, failed=0, total=3),  # cell 1's end is recorded after the poll
        JobCounts(queued=0, running=0, done=1, failed=1, total=3),
    ]


# --- where a run ran ---------------------------------------------------------------------------

_SLURM_ENVIRONMENT = {
    "SLURM_JOB_ID": "4242",
    "SLURM_ARRAY_JOB_ID": "4200",
    "SLURM_ARRAY_TASK_ID": "42",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
    "SLURM_JOB_PARTITION": "booster",
}


def test_a_run_in_a_slurm_job_records_the_job_and_shows_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from core.cli.text import format_result
    from core.storage.metrics import METRICS_BY_NAME

    for name, value in _SLURM_ENVIRONMENT.items():
        monkeypatch.setenv(name, value)
    result = core.run("fcnn", "cpu", steps=2, warmup_steps=1, micro_batch_size=4, database=tmp_path / "r.db")
    assert result.slurm is not None and result.slurm.model_dump() == {
        "job_id": "4242",
        "array_job_id": "4200",
        "array_task_id": 42,
        "nodelist": "gpu[07-08]",
        "partition": "booster",
    }
    assert "  slurm           job 4242, array 4200 task 42, on gpu[07-08], partition booster" in format_result(result)
    assert RunResult.model_validate_json(result.to_json()).slurm == result.slurm  # read back as written
    # core results exports the columns
    assert main(["results", "--database", str(tmp_path / "r.db"), "--format", "csv"]) == 0
    row = next(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert {name: row[name] for name in row if name.startswith("slurm_")} == {
        "slurm_job_id": "4242",
        "slurm_array_job_id": "4200",
        "slurm_array_task_id": "42",
        "slurm_nodelist": "gpu[07-08]",
        "slurm_partition": "booster",
    }
    assert METRICS_BY_NAME["slurm_job_id"].description


def test_outside_slurm_a_run_records_no_job_and_an_odd_array_index_is_left_out() -> None:
    from core.running.slurm import slurm_job

    assert slurm_job({}) is None
    odd = slurm_job({"SLURM_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "x", "SLURM_JOB_PARTITION": " "})
    assert odd is not None and (odd.array_task_id, odd.partition, odd.nodelist) == (None, None, None)


def test_an_older_result_without_a_slurm_job_still_reads() -> None:
    document = json.loads(_partial().to_json())
    document.pop("slurm")
    document["schema_version"] = "1.10"
    assert RunResult.model_validate(document).slurm is None


def test_a_multi_node_run_without_a_meter_records_its_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    from core.contract.manager import get_plugin_manager
    from core.running.planning import plan_run
    from core.running.runner import execute

    plan = plan_run(
        get_plugin_manager(),
        "fcnn",
        "cpu",
        {"steps": 2, "warmup_steps": 1, "micro_batch_size": 4, "power_meter": "none", "node_meters": ""},
    )
    # Rank 0 of two, one per node: the other node's share as a gather would bring it.
    other = {
        "node": {"node_rank": 1, "hostname": "node-b", "devices": 1},
        "devices": [{"index": 0, "name": "cpu", "kind": "cpu", "details": {}}],
        "window_energy_joules": None,
    }
    from core.testing import SimulatedExecutor

    class TwoNodes(SimulatedExecutor):
        def gather_objects(self, value: object) -> list[object]:
            return [value, other]

    monkeypatch.setattr("core.running.runner.executor_for", lambda accelerator, workload, context: TwoNodes())
    process = ProcessContext(rank=0, local_rank=0, world_size=2, local_world_size=1, node_rank=0)
    result = execute(plan, process)
    assert result.status.ok, result.status
    assert [(node.node_rank, node.hostname, node.meter) for node in result.nodes] == [
        (0, socket.gethostname(), None),
        (1, "node-b", None),
    ]
    assert result.energy_joules is None and result.energy_unavailable_reason


def test_a_run_to_a_target_says_its_evaluations_at_most_once_a_second_and_how_it_ended() -> None:
    from core.base.config import make_config
    from core.base.results import QualityPoint, TargetOutcome

    clock, log = SimulatedClock(), io.StringIO()
    progress = RunProgress(_log_line(clock, log), "digits on cpu", steps=100, warmup_steps=10, clock=clock.now)
    target = {"metric": "top1", "value": 0.9, "max_epochs": 30}
    result = RunResult.of_config(
        make_config(workload="digits", accelerator="cpu", micro_batch_size=32, target=target), 1
    )
    progress.run_starting(None)
    result.setup_seconds = 2.0
    progress(result)
    result.to_target = TargetOutcome(
        metric="top1",
        target=0.9,
        higher_is_better=True,
        reached=False,
        stopped_by="max_epochs",
        training_seconds=0.0,
        evaluation_seconds=0.0,
        epochs=0.0,
        samples=0,
    )
    # Evaluations 0.3 s apart: a line for the first, then for the first a second after it, and the last.
    for number, value in enumerate([0.5, 0.7, 0.8, 0.85, 0.88, 0.91], start=1):
        clock.advance(0.3)
        point = QualityPoint(
            epoch=number, samples=1000 * number, seconds=0.3 * number, value=value, evaluation_seconds=0.01
        )
        result.to_target.curve.append(point)
        if value >= 0.9:
            result.to_target.reached, result.to_target.stopped_by = True, "target"
            result.to_target.time_to_target_seconds, result.to_target.epochs = point.seconds, point.epoch
        progress(result)
    progress(result)  # the final report: nothing told twice
    assert log.getvalue().splitlines() == [
        "digits on cpu: setting up",
        "digits on cpu: set-up 2 s; training to top1 >= 0.9, evaluating every epoch, at most 30 epochs",
        "digits on cpu: evaluation 1: epoch 1, top1 0.5, 0 s in",
        "digits on cpu: evaluation 5: epoch 5, top1 0.88, 2 s in",
        "digits on cpu: evaluation 6: epoch 6, top1 0.91, 2 s in",
        "digits on cpu: top1 >= 0.9 reached in 2 s, 6 epochs (6 evaluations)",
    ]
    assert "first step" not in log.getvalue() and "warm-up" not in log.getvalue()
