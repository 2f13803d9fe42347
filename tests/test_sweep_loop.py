"""The one sweep loop (core.sweep.loop) and the plan that travels: a sweep's bookkeeping is the same
whatever backend runs its repeats, and a cell is planned once, here, for every repeat, child process
and rank (core.running.child and core.running.worker rebuild the plan they are given)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel

import core.running.planning
import core.sweep.run
from core.base.config import Precision
from core.base.errors import ConfigError
from core.base.results import RunResult, RunState, Status
from core.contract.manager import get_plugin_manager
from core.plugin import Availability, PowerMeterFactory, hookimpl
from core.running.child import main as child_main
from core.running.launch import child_command, write_request
from core.running.planning import PlannedRun, plan_run
from core.storage.store import ResultStore
from core.sweep import SweepError, SweepObserver, make_sweep_spec, plan_sweep, run_sweep
from core.sweep.loop import EndedRepeat, Repeat, SweepBackend, run_repeats
from core.testing import TINY_FCNN, registered_plugins
from core.workloads.fcnn import Fcnn, FcnnOptions

TINY = {"steps": 2, "warmup_steps": 1, "power_meter": "none", "threads_per_replica": 1, "workload_options": TINY_FCNN}


def _spec(name: str, batches: list[int], repeats: int = 2, **grid: Any) -> Any:
    return make_sweep_spec(
        {"name": name, "repeats": repeats, "grid": {"workload": "fcnn", "micro_batch_size": batches, **TINY, **grid}}
    )


def _result(repeat: Repeat, state: str = "ok") -> RunResult:
    config = repeat.cell.config
    assert config is not None
    result = RunResult.of_config(config, 1, setup_seconds=float(10 * repeat.cell.index + repeat.index))
    if state == "ok":
        result.window_seconds, result.throughput_per_second = 1.0, 100.0
    else:
        result.status = Status(state=RunState(state), phase="window", message="made up")
    return result


# --- the loop with a backend of the test's own -----------------------------------------------------


class ScriptedBackend(SweepBackend):
    """Takes every repeat at once (as Slurm's does) and ends them as ``script`` says, call by call:
    each item of ``script`` is what one wait() sees end, as {(cell index, repeat): state}."""

    def __init__(self, script: list[dict[tuple[int, int], str]]) -> None:
        self.script = script
        self.flight: dict[tuple[int, int], Repeat] = {}
        self.submitted: list[tuple[int, int]] = []
        self.forgotten: list[tuple[int, int]] = []
        self.cancelled: list[str] = []

    def submit(self, repeats: Sequence[Repeat]) -> list[Repeat]:
        for repeat in repeats:
            self.flight[(repeat.cell.index, repeat.index)] = repeat
            self.submitted.append((repeat.cell.index, repeat.index))
        return list(repeats)

    def in_flight(self) -> bool:
        return bool(self.flight)

    def wait(
        self, on_wait: Callable[[Repeat, float], None], on_queued: Callable[[Repeat, str, str], None] | None = None
    ) -> list[EndedRepeat]:
        ending = self.script.pop(0)
        return [
            EndedRepeat(self.flight[where], _result(self.flight[where], state), 1.5)
            for where, state in ending.items()
            if where in self.flight
        ]

    def forget(self, ended: EndedRepeat) -> None:
        where = (ended.repeat.cell.index, ended.repeat.index)
        self.forgotten.append(where)
        del self.flight[where]

    def cancel_cell(self, cell_key: str) -> None:
        self.cancelled.append(cell_key)
        for where in [where for where, repeat in self.flight.items() if repeat.cell.key == cell_key]:
            del self.flight[where]


class Events(SweepObserver):
    """Every event of a sweep and of its runs, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def started(self, plan: Any, runs_total: int, runs_finished: int, runs_recorded: int | None = None) -> None:
        self.events.append(("started", runs_total, runs_finished))

    def run_started(self, cell: Any, repeat: int, runs_done: int, runs_total: int, seconds_left: float | None) -> None:
        self.events.append(("run_started", cell.index, repeat, runs_done, runs_total))

    def run_starting(self, config: Any) -> None:
        self.events.append(("run_starting", config.micro_batch_size))

    def result_ready(self, result: RunResult) -> None:
        self.events.append(("result_ready", result.config.micro_batch_size, result.status.state.value))

    def run_finished(self, cell: Any, repeat: int, result: RunResult, process_seconds: float) -> None:
        self.events.append(("run_finished", cell.index, repeat, result.status.state.value))


def test_the_loop_records_every_ended_repeat_once_and_stops_a_failed_cell_on_any_backend(tmp_path: Path) -> None:
    # Two cells of three repeats, all in flight at once. The first wait sees cell 0's first repeat
    # fail and cell 1's first end well: both are recorded before cell 0's other repeats are cancelled.
    plan = plan_sweep(_spec("scripted", [8, 16], repeats=3))
    backend = ScriptedBackend([{(0, 0): "oom", (1, 0): "ok"}, {(1, 1): "ok", (1, 2): "ok"}])
    observer = Events()
    with ResultStore(tmp_path / "r.db") as store:
        outcome = run_repeats(store, plan, plan.spec, {}, False, observer, backend)
        recorded = sorted((run.cell_label, run.repeat, run.result.status.state.value) for run in store.runs())

    assert recorded == [
        ("micro_batch_size=16", 0, "ok"),
        ("micro_batch_size=16", 1, "ok"),
        ("micro_batch_size=16", 2, "ok"),
        ("micro_batch_size=8", 0, "oom"),
    ]
    assert outcome.runs_done == 4 and outcome.runs_already_finished == 0
    assert backend.submitted == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]  # in rounds, each once
    assert backend.forgotten == [(0, 0), (1, 0), (1, 1), (1, 2)]  # forgotten only once recorded
    assert backend.cancelled == [plan.cells[0].key]
    kinds = [event[0] for event in observer.events]
    assert kinds[:1] == ["started"] and kinds.count("run_started") == 6 == kinds.count("run_starting")
    assert kinds.count("result_ready") == 4 == kinds.count("run_finished")
    # Each ended run is told as a run (the plugins' core_result_ready) and then as the sweep's.
    assert observer.events[-2:] == [("result_ready", 16, "ok"), ("run_finished", 1, 2, "ok")]


def test_the_loop_resumes_without_running_what_the_database_holds(tmp_path: Path) -> None:
    plan = plan_sweep(_spec("resumed", [8, 16], repeats=2))
    finished = {(plan.cells[0].key, 0): "ok", (plan.cells[1].key, 0): "error"}
    backend = ScriptedBackend([{(0, 1): "ok"}])
    with ResultStore(tmp_path / "r.db") as store:
        outcome = run_repeats(store, plan, plan.spec, dict(finished), False, SweepObserver(), backend)
    # The failed cell stays stopped; only the missing repeat of the good one runs.
    assert backend.submitted == [(0, 1)] and outcome.runs_already_finished == 2 and outcome.runs_done == 1


# --- the plan travels: planned once for the whole sweep ---------------------------------------------

COUNTING_SITE = """
import os

# Counts core's planning in every Python process of the test's sweep (children, torchrun's ranks).
if os.environ.get("CORE_TEST_PLAN_LOG"):
    import core.running.planning as _planning

    _real_plan_run = _planning.plan_run

    def _counted(manager, workload, accelerator, options, machine=None):
        planned = _real_plan_run(manager, workload, accelerator, options, machine=machine)
        with open(os.environ["CORE_TEST_PLAN_LOG"], "a", encoding="utf-8") as log:
            log.write(f"{os.getpid()} replicas={planned.config.replicas}\\n")
        return planned

    _planning.plan_run = _counted
"""


@pytest.fixture
def plan_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where each plan_run call, in this process or any process it starts, writes a line."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(COUNTING_SITE, encoding="utf-8")
    log = tmp_path / "plans.log"
    log.touch()
    monkeypatch.setenv("CORE_TEST_PLAN_LOG", str(log))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    real = core.running.planning.plan_run

    def counted(*args: Any, **kwargs: Any) -> Any:
        planned = real(*args, **kwargs)
        with log.open("a", encoding="utf-8") as out:
            out.write(f"{os.getpid()} replicas={planned.config.replicas}\n")
        return planned

    monkeypatch.setattr(core.running.planning, "plan_run", counted)
    return log


def _plans(log: Path) -> list[tuple[str, str]]:
    """(where, which cell) of every planning: "here" (this process) or "child"."""
    lines = [line.split() for line in log.read_text(encoding="utf-8").splitlines()]
    return [("here" if int(pid) == os.getpid() else "child", cell) for pid, cell in lines]


@pytest.mark.slow
def test_a_sweep_cell_is_planned_once_for_all_its_repeats_and_ranks(tmp_path: Path, plan_log: Path) -> None:
    # Two repeats of a one-process cell and of a two-replica cell (torchrun, two ranks), each repeat
    # a fresh interpreter: every one of those processes runs the plan it was given.
    outcome = run_sweep(
        _spec("planned-once", [8], repeats=2, replicas=[1, 2]), database=tmp_path / "r.db", workers="fresh"
    )
    assert all(cell.status == "ok" and cell.repeats_ok == 2 for cell in outcome.cells), outcome.cells
    assert sorted(_plans(plan_log)) == [("here", "replicas=1"), ("here", "replicas=2")]


@pytest.mark.slow
def test_a_run_with_a_time_limit_is_planned_once(plan_log: Path) -> None:
    from core import run

    result = run("fcnn", "cpu", micro_batch_size=8, timeout_seconds=300, **TINY)
    assert result.status.ok, result.status
    assert _plans(plan_log) == [("here", "replicas=1")]


def test_the_child_runs_the_plan_it_is_given_without_planning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = plan_run(get_plugin_manager(), "fcnn", "cpu", {"micro_batch_size": 4, **TINY})
    write_request(tmp_path / "request.json", plan.document(), parent_pid=None)

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the child planned the run again")

    monkeypatch.setattr(core.running.planning, "plan_run", refuse)
    assert child_main([str(tmp_path / "request.json"), str(tmp_path / "result.json")]) == 0

    result = RunResult.model_validate_json((tmp_path / "result.json").read_text())
    assert result.status.ok and result.config == plan.config
    assert json.loads((tmp_path / "result.json.partial").read_text())["window_seconds"] is not None
    # The child is core.running.child, reached by its own name: no detour through a sweep's module.
    assert child_command(Path("q"), Path("r"))[1:3] == ["-m", "core.running.child"]


def test_a_request_written_by_an_older_core_is_still_run(tmp_path: Path) -> None:
    # A Slurm job submitted before an upgrade carries options only (and runs `-m core.sweep.worker`).
    from core.sweep.worker import main as old_name

    options = {"workload": "fcnn", "accelerator": "cpu", "micro_batch_size": 4, **TINY}
    (tmp_path / "request.json").write_text(json.dumps({"options": options, "parent_pid": None}))
    assert old_name([str(tmp_path / "request.json"), str(tmp_path / "result.json")]) == 0
    assert RunResult.model_validate_json((tmp_path / "result.json").read_text()).status.ok


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (lambda plan: {**plan, "config": {**plan["config"], "steps": "two"}}, "invalid plan = 'config.steps'"),
        (lambda plan: {**plan, "surprise": 1}, "invalid plan = 'surprise'"),
        (lambda plan: {**plan, "config": {**plan["config"], "workload": "gone"}}, "invalid workload = 'gone'"),
        (lambda plan: {**plan, "launcher": "nowhere:Launcher"}, "invalid launcher = 'nowhere:Launcher'"),
        (lambda plan: {**plan, "workload_options": {"layers": "many"}}, "invalid workload_options"),
        (lambda plan: {**plan, "meter": "no-such-meter"}, "invalid power_meter = 'no-such-meter'"),
    ],
)
def test_a_child_given_a_plan_it_cannot_run_says_why_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: Callable[[dict[str, Any]], dict[str, Any]], said: str
) -> None:
    plan = plan_run(get_plugin_manager(), "fcnn", "cpu", {"micro_batch_size": 4, **TINY})
    request = tmp_path / "request.json"
    write_request(request, plan.document(), parent_pid=None)
    document = json.loads(request.read_text())
    request.write_text(json.dumps({**document, "plan": damage(document["plan"])}))

    assert child_main([str(request), str(tmp_path / "result.json")]) == 2

    err = capsys.readouterr().err
    assert "core: error: the run was refused: " in err and said in err, err
    assert not (tmp_path / "result.json").exists()


class ShapedOptions(FcnnOptions):
    """Options whose JSON form is not their Python form: an enum, a float given as an integer."""

    precision_hint: Precision = Precision.fp32
    scale: float = 1.5


class ShapedFcnn(Fcnn):
    name: ClassVar[str] = "shaped-fcnn"
    options_model: ClassVar[type[BaseModel]] = ShapedOptions


class ShapedPlugin:
    @hookimpl
    def core_register_workloads(self, register: Callable[[Any], None]) -> None:
        register(ShapedFcnn())


def test_a_plan_document_rebuilds_the_same_plan() -> None:
    with registered_plugins(ShapedPlugin()) as manager:
        workload_options = {**TINY_FCNN, "precision_hint": "bf16", "scale": 2}
        options = {"workload_options": workload_options, "precision": "bf16", "replicas": 2}
        plan = plan_run(manager, "shaped-fcnn", "cpu", options)
        document = PlannedRun.model_validate_json(plan.document().model_dump_json())
        rebuilt = document.rebuild(manager)

    assert rebuilt.config == plan.config and rebuilt.workload is plan.workload
    assert rebuilt.workload_options == plan.workload_options
    assert isinstance(rebuilt.workload_options, ShapedOptions) and rebuilt.workload_options.scale == 2.0
    assert rebuilt.workload_options.precision_hint is Precision.bf16
    assert rebuilt.accelerator_options == plan.accelerator_options
    assert type(rebuilt.launcher) is type(plan.launcher) and rebuilt.launcher is not None
    assert rebuilt.warnings == plan.warnings and rebuilt.meter_factory is plan.meter_factory


def test_a_plan_made_for_a_machine_profile_does_not_run_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from core.machines import load_machine

    monkeypatch.setattr(core.sweep.run, "run_in_process", lambda *a, **k: pytest.fail("ran a machine's plan here"))
    machine = load_machine("a100-80gb-x4")
    spec = make_sweep_spec({"name": "m", "grid": {"workload": "fcnn", "accelerator": "nvidia", "micro_batch_size": 8}})
    plan = plan_sweep(spec, machine=machine)
    assert plan.valid_cells
    with pytest.raises(SweepError, match="planned for machine 'a100-80gb-x4', not this host"):
        run_sweep(plan, database=tmp_path / "r.db")
    assert not (tmp_path / "r.db").exists()
    with pytest.raises(ConfigError, match="machine"):
        plan.valid_cells[0].planned.rebuild(get_plugin_manager())  # type: ignore[union-attr]


@pytest.mark.parametrize("executor", ["slurmm", "Local", "", "ssh"])
def test_an_unknown_executor_is_refused_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, executor: str
) -> None:
    monkeypatch.setattr(core.sweep.run, "run_in_process", lambda *a, **k: pytest.fail("ran on an unknown executor"))
    with pytest.raises(SweepError, match=f"invalid executor {executor!r}; allowed: local, slurm"):
        run_sweep(_spec("x", [8], repeats=1), database=tmp_path / "r.db", executor=executor)  # type: ignore[arg-type]
    assert not (tmp_path / "r.db").exists()


class _HostMeter(PowerMeterFactory):
    """A node meter that plans (it never reads: the test only plans and rebuilds)."""

    name = "plan-host-meter"
    accelerators = ("a-host-meter-reads-no-accelerator",)
    node_includes = ("fans",)

    def availability(self) -> Availability:
        return Availability(True)

    def meter_for(self, devices: Any, context: Any) -> Any:
        raise AssertionError("the test only plans")


class _HostMeterPlugin:
    @hookimpl
    def core_register_power_meters(self, register: Callable[[PowerMeterFactory], None]) -> None:
        register(_HostMeter())


def test_every_field_of_a_plan_survives_its_document() -> None:
    # A field the document leaves out is planned in the parent and lost in every child and rank
    # (the node meters, the accelerator's own precision policy and the packages once were).
    import dataclasses

    from core.running.planning import RunPlan

    with registered_plugins(ShapedPlugin(), _HostMeterPlugin()) as manager:
        options = {"workload_options": TINY_FCNN, "precision": "bf16", "node_meters": "plan-host-meter"}
        plan = plan_run(manager, "shaped-fcnn", "cpu", options)
        rebuilt = PlannedRun.model_validate_json(plan.document().model_dump_json()).rebuild(manager)

    assert plan.node_meter_factories and plan.precision_policy is not None
    for field in dataclasses.fields(RunPlan):
        if field.name == "machine":  # a plan for a machine profile does not run (tested above)
            continue
        before, after = getattr(plan, field.name), getattr(rebuilt, field.name)
        if field.name == "launcher":
            assert type(before) is type(after), field.name
        else:
            assert before == after or before is after, field.name
