"""Warm workers (issue 15): a sweep forks each run from a fork server that imported core and PyTorch
once (core.running.forkserver), and falls back to a fresh interpreter where forking is unsafe.

A forked run must behave as a fresh one: the same figures, a crash, a kill, a hang or an exception
recorded the same way, nothing left running after the sweep (however it ends), and the server
must never start a thread pool or initialise CUDA. Most tests here give the server a light
preload, so they do not wait for PyTorch's imports; the ones that need torch are marked slow.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from launching import LimitOnceWritten

import core.sweep.repeat
import core.sweep.run
from core.running import forkserver, processes
from core.sweep import keep_warm_workers, make_sweep_spec, plan_sweep, run_sweep
from core.sweep.repeat import WarmWorkers

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="warm workers fork on Linux only")

LIGHT_PRELOAD = ("core.sweep.worker",)

TINY_FCNN = {
    "workload": "fcnn",
    "accelerator": "cpu",
    "steps": 2,
    "warmup_steps": 1,
    "threads_per_replica": 1,
    "power_meter": "none",
    "workload_options": {"layers": 1, "hidden_width": 8},
}

FAKE_OK = """
import json, os, sys
from core.base.config import make_config
from core.base.results import RunResult
request = json.load(open(sys.argv[1]))
config = make_config(**request["options"])
open(os.path.join(os.environ["CORE_TEST_PIDS"], str(os.getpid())), "w").close()  # for the orphan checks
result = RunResult(workload=config.workload, accelerator=config.accelerator, framework="torch", config=config,
                   samples_per_update=config.samples_per_update, samples_per_host_call=config.samples_per_update,
                   world_size=1, window_seconds=1.0, throughput_per_second=100.0 * config.micro_batch_size)
open(sys.argv[2], "w").write(result.model_dump_json())
"""
FAKE_CRASH = "import sys; print('segmentation fault, pretend'); sys.exit(3)"
FAKE_KILLED = "import os, signal; print('about to be killed', flush=True); os.kill(os.getpid(), signal.SIGKILL)"
FAKE_EXCEPTION = "raise ValueError('the run broke')"
FAKE_EXIT_NOW = "import os; print('leaving', flush=True); os._exit(7)"
FAKE_HANG_AFTER_SETUP = (
    FAKE_OK.replace(
        "window_seconds=1.0, throughput_per_second=100.0 * config.micro_batch_size", "setup_seconds=0.25"
    ).replace('open(sys.argv[2], "w")', "open(sys.argv[2] + '.partial', \"w\")")
    + "\nimport time\ntime.sleep(600)\n"
)


def fake_workers(monkeypatch: pytest.MonkeyPatch, by_batch: dict[int, str]) -> None:
    """The worker replaced by ``python -c PROGRAM``: forkable, so warm sweeps fork it."""

    def command(request: Path, result: Path) -> list[str]:
        batch = json.loads(request.read_text())["options"]["micro_batch_size"]
        return [sys.executable, "-c", by_batch[batch], str(request), str(result)]

    monkeypatch.setattr(core.sweep.repeat, "worker_command", command)


@pytest.fixture(autouse=True)
def pid_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the fake runs write their pids (the environment reaches forked and fresh runs alike)."""
    (tmp_path / "pids").mkdir()
    monkeypatch.setenv("CORE_TEST_PIDS", str(tmp_path / "pids"))


def run_pids(tmp_path: Path) -> list[int]:
    return [int(path.name) for path in (tmp_path / "pids").iterdir()]


class ServerWatch:
    """Records every fork server a sweep starts."""

    def __init__(self) -> None:
        self.servers: list[forkserver.StartingForkServer] = []


@pytest.fixture
def servers(monkeypatch: pytest.MonkeyPatch) -> ServerWatch:
    """Fork servers with a light preload (no torch), recorded as they start."""
    watch = ServerWatch()
    real = forkserver.spawn_fork_server

    def start(preload: Any, log_path: Path) -> forkserver.StartingForkServer:
        server = real(LIGHT_PRELOAD, log_path)
        watch.servers.append(server)
        return server

    monkeypatch.setattr(core.sweep.repeat, "spawn_fork_server", start)
    return watch


def spec(name: str, batches: list[int], timeout: float = 60, repeats: int = 1) -> Any:
    return make_sweep_spec(
        {
            "name": name,
            "repeats": repeats,
            "timeout_seconds": timeout,
            "grid": {**TINY_FCNN, "micro_batch_size": batches},
        }
    )


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid and alive(int(entry.name)):
                    found.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return found


def wait_until_gone(pids: list[int], seconds: float = 60.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [pid for pid in pids if alive(pid)]


# --- which runs are forked --------------------------------------------------------------------------


def test_runs_that_cannot_be_forked_safely_start_fresh_and_say_why(tmp_path: Path) -> None:
    plan = plan_sweep(
        make_sweep_spec(
            {
                "name": "choices",
                "grid": {
                    "workload": "fcnn",
                    "accelerator": "cpu",
                    "framework": ["torch", "tensorflow"],
                    "replicas": [1, 2],
                    "micro_batch_size": 8,
                },
            }
        )
    )
    by_label = {cell.label: cell for cell in plan.valid_cells}
    warm = WarmWorkers("warm", tmp_path)
    assert warm.refusal(by_label["framework=torch replicas=1"]) is None
    assert "TensorFlow" in (warm.refusal(by_label["framework=tensorflow replicas=1"]) or "")
    assert "launcher" in (warm.refusal(by_label["framework=torch replicas=2"]) or "")
    fresh = WarmWorkers("fresh", tmp_path)
    assert "--workers fresh" in (fresh.refusal(by_label["framework=torch replicas=1"]) or "")


def test_an_accelerator_must_say_its_runs_may_be_forked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from core.contract.manager import get_plugin_manager

    cell = plan_sweep(spec("s", [8])).valid_cells[0]
    monkeypatch.setattr(type(get_plugin_manager().accelerator("cpu")), "forks_from_warm_parent", False)
    assert "forks_from_warm_parent" in (WarmWorkers("warm", tmp_path).refusal(cell) or "")


def test_a_sweep_with_fresh_workers_starts_no_fork_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, servers: ServerWatch
) -> None:
    fake_workers(monkeypatch, {8: FAKE_OK})
    outcome = run_sweep(spec("fresh", [8]), database=tmp_path / "r.db", workers="fresh")
    assert servers.servers == []
    start = outcome.cells[0].runs[0].result.process_start
    assert start is not None and start.method == "fresh" and "--workers fresh" in (start.reason or "")


def test_a_fork_server_that_cannot_start_leaves_runs_fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = forkserver.spawn_fork_server
    monkeypatch.setattr(
        core.sweep.repeat, "spawn_fork_server", lambda preload, log_path: real(["core.no_such_module_here"], log_path)
    )
    fake_workers(monkeypatch, {8: FAKE_OK, 16: FAKE_OK})
    outcome = run_sweep(spec("broken-server", [8, 16]), database=tmp_path / "r.db")
    starts = [run.result.process_start for cell in outcome.cells for run in cell.runs]
    assert all(cell.status == "ok" for cell in outcome.cells)
    assert all(s is not None and s.method == "fresh" for s in starts)
    assert all("could not start" in (s.reason or "") and "no_such_module_here" in (s.reason or "") for s in starts if s)


def test_a_fork_server_that_dies_between_runs_leaves_the_next_runs_fresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, servers: ServerWatch
) -> None:
    # Kills its parent, the fork server; never the test's process, should the run not be forked.
    killer = FAKE_OK + (
        f"\nimport os, signal\nif os.getppid() != {os.getpid()}: os.kill(os.getppid(), signal.SIGKILL)\n"
    )
    fake_workers(monkeypatch, {8: killer, 16: FAKE_OK, 32: FAKE_OK})
    outcome = run_sweep(spec("dying-server", [8, 16, 32]), database=tmp_path / "r.db")
    runs = {cell.label: cell.runs[0].result for cell in outcome.cells}
    assert all(result.status.ok for result in runs.values()), [r.status for r in runs.values()]
    first, *rest = (runs[f"micro_batch_size={b}"].process_start for b in (8, 16, 32))
    assert first is not None and first.method == "forked", first
    assert all(s is not None and s.method == "fresh" and "died" in (s.reason or "") for s in rest)


def test_the_fork_server_starts_while_the_sweep_plans(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, servers: ServerWatch
) -> None:
    # Its imports overlap the sweep's own planning and validation, instead of following them.
    started_while_planning: list[bool] = []
    real_plan = core.sweep.run.plan_sweep

    def plan(*args: Any, **kwargs: Any) -> Any:
        started_while_planning.append(bool(servers.servers) and servers.servers[0].process.poll() is None)
        return real_plan(*args, **kwargs)

    monkeypatch.setattr(core.sweep.run, "plan_sweep", plan)
    fake_workers(monkeypatch, {8: FAKE_OK, 16: FAKE_OK})
    outcome = run_sweep(spec("early-server", [8, 16]), database=tmp_path / "r.db")
    assert started_while_planning == [True]
    assert all(run.result.process_start.method == "forked" for cell in outcome.cells for run in cell.runs)  # type: ignore[union-attr]
    assert len(servers.servers) == 1 and not alive(servers.servers[0].process.pid)
    assert children_of(os.getpid()) == []


def test_a_sweep_none_of_whose_runs_may_be_forked_stops_the_early_server_before_its_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, servers: ServerWatch
) -> None:
    # A TensorFlow sweep, say: the server begun while it planned must not take CPU from its runs.
    monkeypatch.setattr(core.sweep.repeat, "_accelerator_refusal", lambda name: "not this one")
    server_alive_at_runs: list[bool] = []

    def command(request: Path, result: Path) -> list[str]:
        server_alive_at_runs.append(alive(servers.servers[0].process.pid))
        return [sys.executable, "-c", FAKE_OK, str(request), str(result)]

    monkeypatch.setattr(core.sweep.repeat, "worker_command", command)
    outcome = run_sweep(spec("unforkable", [8]), database=tmp_path / "r.db")
    start = outcome.cells[0].runs[0].result.process_start
    assert start is not None and start.method == "fresh" and start.reason == "not this one"
    assert len(servers.servers) == 1 and server_alive_at_runs == [False]


def test_sweeps_in_a_keep_block_share_one_fork_server_and_it_ends_with_the_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, servers: ServerWatch
) -> None:
    fake_workers(monkeypatch, {8: FAKE_OK, 16: FAKE_OK})
    with keep_warm_workers():
        first = run_sweep(spec("kept-1", [8, 16]), database=tmp_path / "r.db")
        assert len(servers.servers) == 1 and alive(servers.servers[0].process.pid), "kept between sweeps"
        second = run_sweep(spec("kept-2", [8, 16]), database=tmp_path / "r.db")
        assert len(servers.servers) == 1, "the second sweep found the server ready"
    starts = [run.result.process_start for outcome in (first, second) for cell in outcome.cells for run in cell.runs]
    assert all(s is not None and s.method == "forked" for s in starts), starts
    assert not alive(servers.servers[0].process.pid) and children_of(os.getpid()) == []


def test_a_kept_fork_server_serves_only_the_environment_it_started_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, servers: ServerWatch
) -> None:
    # Variables read when a library is imported were read by the server: a sweep with others starts its own.
    fake_workers(monkeypatch, {8: FAKE_OK})
    with keep_warm_workers():
        run_sweep(spec("env-1", [8]), database=tmp_path / "r.db")
        monkeypatch.setenv("OMP_NUM_THREADS", "3")
        run_sweep(spec("env-2", [8]), database=tmp_path / "r.db")
        assert len(servers.servers) == 2 and not alive(servers.servers[0].process.pid)
    assert not alive(servers.servers[1].process.pid) and children_of(os.getpid()) == []


def test_a_kept_fork_server_that_failed_is_not_handed_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, servers: ServerWatch, caplog: pytest.LogCaptureFixture
) -> None:
    killer = FAKE_OK + if_forked("os.kill(server, signal.SIGKILL)")
    fake_workers(monkeypatch, {8: killer, 16: FAKE_OK})
    caplog.set_level("WARNING", logger="core.sweep.repeat")
    with keep_warm_workers():
        run_sweep(spec("failed-1", [8, 16]), database=tmp_path / "r.db")
        assert len(fork_server_warnings(caplog)) == 1
        fake_workers(monkeypatch, {8: FAKE_OK, 16: FAKE_OK})
        second = run_sweep(spec("failed-2", [8, 16]), database=tmp_path / "r.db")
    assert len(servers.servers) == 2, "the second sweep started a server of its own"
    assert all(run.result.process_start.method == "forked" for cell in second.cells for run in cell.runs)  # type: ignore[union-attr]
    assert len(fork_server_warnings(caplog)) == 1
    assert children_of(os.getpid()) == []


def test_a_sweep_that_raises_in_a_keep_block_stops_its_fork_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, servers: ServerWatch
) -> None:
    def interrupted(request: Path, result: Path) -> list[str]:
        raise KeyboardInterrupt

    monkeypatch.setattr(core.sweep.repeat, "worker_command", interrupted)
    with keep_warm_workers():
        with pytest.raises(KeyboardInterrupt):
            run_sweep(spec("ctrl-c", [8]), database=tmp_path / "r.db")
        assert len(servers.servers) == 1 and not alive(servers.servers[0].process.pid)
    assert children_of(os.getpid()) == []


def fork_server_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "fork server" in r.getMessage()]


def if_forked(action: str) -> str:
    """A line of a fake run that does ``action`` (``server`` is its pid) only when it was forked:
    never to the test's process, which is a fresh run's parent."""
    return f"import os, signal, time\nserver = os.getppid()\nif server != {os.getpid()}:\n    {action}\n"


@pytest.mark.parametrize("batches", [[8], [8, 16, 32]])
def test_a_run_whose_fork_server_dies_under_it_runs_again_fresh(
    batches: list[int],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    servers: ServerWatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The server is killed while the forked run is going: the parent-death signal ends the run
    # before it has a result (the sleep is only a hang guard). That is the machinery's fault.
    dies_under = if_forked("os.kill(server, signal.SIGKILL); time.sleep(60)") + FAKE_OK
    fake_workers(monkeypatch, {8: dies_under, 16: FAKE_OK, 32: FAKE_OK})
    caplog.set_level("WARNING", logger="core.sweep.repeat")
    outcome = run_sweep(spec("dies-under-a-run", batches, timeout=120), database=tmp_path / "r.db")
    runs = {cell.label: cell.runs for cell in outcome.cells}
    assert all(len(cell_runs) == 1 for cell_runs in runs.values()), "one recorded repeat per cell"
    results = [cell_runs[0].result for cell_runs in runs.values()]
    assert all(result.status.ok for result in results), [r.status for r in results]
    first = runs["micro_batch_size=8"][0].result.process_start
    assert first is not None and first.method == "fresh", first
    assert "run again in a fresh interpreter" in (first.reason or "") and "died" in (first.reason or "")
    assert all(r.process_start is not None and r.process_start.method == "fresh" for r in results)
    assert len(fork_server_warnings(caplog)) == 1, fork_server_warnings(caplog)  # once for the sweep
    assert len(servers.servers) == 1 and not alive(servers.servers[0].process.pid)
    assert children_of(os.getpid()) == []


def test_a_fork_server_that_hangs_under_a_run_does_not_hold_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, servers: ServerWatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The run stops its server (SIGSTOP), then finishes with a result: the server never reports
    # the end. The run's own result counts, long before the (hang-guard) time limit.
    stops_server = if_forked("os.kill(server, signal.SIGSTOP)") + FAKE_OK
    fake_workers(monkeypatch, {8: stops_server, 16: FAKE_OK})
    caplog.set_level("WARNING", logger="core.sweep.repeat")
    outcome = run_sweep(spec("hangs-under-a-run", [8, 16], timeout=60), database=tmp_path / "r.db")
    cells = {cell.label: cell for cell in outcome.cells}
    hung, after = cells["micro_batch_size=8"].runs[0].result, cells["micro_batch_size=16"].runs[0].result
    assert hung.status.ok and after.status.ok, (hung.status, after.status)
    assert hung.process_start is not None and hung.process_start.method == "forked"
    assert after.process_start is not None and after.process_start.method == "fresh"
    assert "stopped answering" in (after.process_start.reason or "")
    assert len(fork_server_warnings(caplog)) == 1, fork_server_warnings(caplog)
    assert not alive(servers.servers[0].process.pid), "the stuck server outlived its sweep"
    assert wait_until_gone(run_pids(tmp_path)) == [] and children_of(os.getpid()) == []


@pytest.mark.slow  # waits the run's time limit for the stuck server, which must leave the fresh run time to start
def test_a_fork_server_that_does_not_answer_costs_a_run_no_more_than_its_time_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, servers: ServerWatch
) -> None:
    real = forkserver.StartingForkServer.ready

    def stuck(self: forkserver.StartingForkServer, ready_timeout: float = 60.0) -> forkserver.ForkServer:
        server = real(self, ready_timeout)
        os.kill(server.process.pid, signal.SIGSTOP)  # ready, then never answers a fork request
        return server

    monkeypatch.setattr(forkserver.StartingForkServer, "ready", stuck)
    fake_workers(monkeypatch, {8: FAKE_OK, 16: FAKE_OK})
    # A fork answers in milliseconds; the run waits for one at most its own limit, then starts
    # fresh with the whole limit to itself (the old 60 s wait came out of the run's limit).
    outcome = run_sweep(spec("no-answer", [8, 16], timeout=30), database=tmp_path / "r.db")
    results = [cell.runs[0].result for cell in outcome.cells]
    assert all(result.status.ok for result in results), [r.status for r in results]
    assert all(r.process_start is not None and r.process_start.method == "fresh" for r in results)
    assert "stopped answering" in (results[0].process_start.reason or "")  # type: ignore[union-attr]
    assert not alive(servers.servers[0].process.pid) and children_of(os.getpid()) == []


@pytest.mark.slow  # as above
def test_a_fork_server_stuck_in_its_imports_costs_a_run_no_more_than_its_time_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "core_test_stuck_import.py").write_text("import time\ntime.sleep(600)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the server's environment is the sweep's
    monkeypatch.setattr(core.sweep.repeat, "WARM_IMPORTS", ("core_test_stuck_import",))
    fake_workers(monkeypatch, {8: FAKE_OK})
    outcome = run_sweep(spec("stuck-imports", [8], timeout=30), database=tmp_path / "r.db")
    result = outcome.cells[0].runs[0].result
    assert result.status.ok, result.status
    assert result.process_start is not None and result.process_start.method == "fresh"
    assert "not ready in 30 s" in (result.process_start.reason or ""), result.process_start
    assert children_of(os.getpid()) == []


@pytest.mark.slow  # waits out the server's grace before core kills it
def test_a_fork_server_stuck_past_sigterm_is_said_to_be_not_ready_not_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Stuck in its imports and deaf to SIGTERM (as one stopped by SIGSTOP is), the server ends by
    # core's own SIGKILL: that -9 is not how it ended, and the message says what happened.
    (tmp_path / "core_test_deaf_import.py").write_text(
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(600)\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    with pytest.raises(forkserver.ForkServerError) as raised:
        forkserver.start_fork_server(["core_test_deaf_import"], tmp_path / "server.log", ready_timeout=1)
    assert "was not ready in 1 s" in str(raised.value) and "core stopped it" in str(raised.value)
    assert "exited with code" not in str(raised.value)
    assert children_of(os.getpid()) == []


def test_a_closed_fork_server_leaves_without_finalising_its_imports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Tearing down PyTorch's modules took the sweep's end seconds on a loaded machine: the server,
    # which only imported, leaves at once (an atexit handler of its imports never runs).
    marker = tmp_path / "finalised"
    (tmp_path / "core_test_atexit_import.py").write_text(
        f"import atexit, pathlib\natexit.register(lambda: pathlib.Path({str(marker)!r}).write_text('yes'))\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    server = forkserver.start_fork_server(["core_test_atexit_import"], tmp_path / "server.log", ready_timeout=60)
    server.close()
    assert server.process.returncode == 0 and not marker.exists()


def test_a_forked_run_leaves_the_server_s_finalizers_and_runs_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # PyTorch registers a weakref.finalize per operator library at import; running them at each
    # forked run's exit took 40 to 55 ms of a tiny run. A finalizer the server's imports made is the
    # server's (here it would remove the server's folder); the run's own still runs at its exit.
    server_folder, run_folder = tmp_path / "server-owned", tmp_path / "run-owned"
    (tmp_path / "core_test_finalizer_import.py").write_text(_folder_with_a_finalizer(server_folder))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    server = forkserver.start_fork_server(["core_test_finalizer_import"], tmp_path / "server.log", ready_timeout=60)
    try:
        program = _folder_with_a_finalizer(run_folder)
        ended = processes.supervise([sys.executable, "-c", program], tmp_path / "out.log", starter=server)
        assert ended.returncode == 0, (tmp_path / "out.log").read_text()
        assert server_folder.is_dir(), "a forked run ran a finalizer of the server's imports at its exit"
        assert not run_folder.exists(), "a forked run's own finalizer did not run at its exit"
    finally:
        server.close()


def _folder_with_a_finalizer(folder: Path) -> str:
    """Python that makes ``folder`` and registers a finalizer that removes it (at exit, at the latest)."""
    return textwrap.dedent(
        f"""
        import pathlib, shutil, weakref
        pathlib.Path({str(folder)!r}).mkdir()
        class Holder:
            pass
        holder = Holder()
        weakref.finalize(holder, shutil.rmtree, {str(folder)!r})
        """
    )


def test_a_forked_run_records_the_versions_and_machine_a_fresh_one_reads() -> None:
    # The fork server reads them once (core.running.environment.read_before_forking) for its runs.
    from core.running import environment

    fresh = environment.collect_environment("x", {}, {}, ("pluggy",))
    assert "core.running.environment:read_before_forking" in core.sweep.repeat.WARM_IMPORTS
    code = textwrap.dedent(
        """
        import json
        from core.running import environment
        environment.read_before_forking()
        read = environment.collect_environment("x", {}, {}, ("pluggy",))
        print(json.dumps([read.library_versions, read.platform, read.processor, read.core_version]))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    versions, platform, processor, core_version = json.loads(done.stdout.strip().splitlines()[-1])
    assert versions == fresh.library_versions and "torch" in versions and "pydantic" in versions
    assert (platform, processor, core_version) == (fresh.platform, fresh.processor, fresh.core_version)


def test_a_fork_server_that_exits_before_it_is_ready_says_its_own_exit_code(tmp_path: Path) -> None:
    with pytest.raises(forkserver.ForkServerError, match=r"(?s)the fork server exited with code 1: .*no_such_module"):
        forkserver.start_fork_server(["core.no_such_module_here"], tmp_path / "server.log", ready_timeout=60)


# --- faults become results, as for fresh interpreters ------------------------------------------------


@pytest.mark.parametrize("workers", ["warm", "fresh"])
def test_crashes_kills_and_exceptions_are_recorded_alike(
    workers: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, servers: ServerWatch
) -> None:
    fake_workers(monkeypatch, {8: FAKE_CRASH, 16: FAKE_KILLED, 32: FAKE_EXCEPTION, 64: FAKE_EXIT_NOW, 128: FAKE_OK})
    outcome = run_sweep(spec(f"faults-{workers}", [8, 16, 32, 64, 128]), database=tmp_path / "r.db", workers=workers)  # type: ignore[arg-type]
    cells = {cell.label: cell for cell in outcome.cells}
    crash, killed, exception, exit_now, ok = (cells[f"micro_batch_size={b}"] for b in (8, 16, 32, 64, 128))
    assert crash.status == "error" and "exited with code 3 without a result" in crash.failure.status.message
    assert "segmentation fault, pretend" in crash.failure.status.message
    assert killed.status == "killed" and "SIGKILL" in killed.failure.status.message
    assert "about to be killed" in killed.failure.status.message
    assert exception.status == "error" and "exited with code 1" in exception.failure.status.message
    assert "ValueError: the run broke" in exception.failure.status.message
    assert "forkserver" not in exception.failure.status.message  # the traceback is the run's own
    assert exit_now.status == "error" and "exited with code 7" in exit_now.failure.status.message
    assert "leaving" in exit_now.failure.status.message
    assert ok.status == "ok" and ok.throughput_per_second == 12800.0
    method = "forked" if workers == "warm" else "fresh"
    assert {
        run.result.process_start.method for cell in outcome.cells for run in cell.runs if run.result.process_start
    } == {method}
    assert len(servers.servers) == (1 if workers == "warm" else 0)
    for server in servers.servers:
        assert not alive(server.process.pid), "the fork server outlived its sweep"
    assert run_pids(tmp_path) and wait_until_gone(run_pids(tmp_path), 2.0) == [], "a run outlived its sweep"
    assert children_of(os.getpid()) == [], "a process of the sweep outlived it"


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["warm", "fresh"])
def test_a_hang_past_the_time_limit_is_stopped_and_keeps_its_phases(
    workers: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, servers: ServerWatch
) -> None:
    monkeypatch.setattr(core.sweep.repeat, "STOP_GRACE_SECONDS", 2.0)
    fake_workers(monkeypatch, {32: FAKE_HANG_AFTER_SETUP})
    # The time limit passes once the run wrote its setup, however slowly a busy machine started it.
    monkeypatch.setattr(
        core.sweep.repeat, "time", LimitOnceWritten(f"core-sweep-{os.getpid()}-*/cell-*", "setup_seconds")
    )
    started = time.monotonic()
    outcome = run_sweep(spec(f"hang-{workers}", [32], timeout=300), database=tmp_path / "r.db", workers=workers)  # type: ignore[arg-type]
    assert time.monotonic() - started < 600  # a hang guard: the hang was stopped at its time limit
    hang = outcome.cells[0]
    assert hang.status == "timeout" and "no result after 300 s" in hang.failure.status.message
    assert hang.failure.setup_seconds == 0.25 and hang.failure.status.phase == "first_step"
    assert wait_until_gone(run_pids(tmp_path)) == [] and children_of(os.getpid()) == []


# --- nothing outlives a sweep ---------------------------------------------------------------------

SWEEP_SCRIPT = """
import json, signal, sys
from pathlib import Path
import core.sweep.repeat
import core.sweep.run
from core.running import forkserver
from core.sweep import make_sweep_spec, run_sweep

directory = Path(sys.argv[1])
real = forkserver.spawn_fork_server
def start(preload, log_path):
    server = real({light!r}, log_path)
    (directory / "server.pid").write_text(str(server.process.pid))
    return server
core.sweep.repeat.spawn_fork_server = start
hang = "import os, sys, time; open(sys.argv[2] + '.pid', 'w').write(str(os.getpid())); time.sleep(600)"
core.sweep.repeat.worker_command = lambda request, result: [sys.executable, "-c", hang, str(request), str(result)]
signal.signal(signal.SIGTERM, signal.default_int_handler)  # as the CLI does
spec = make_sweep_spec({{"name": "s", "timeout_seconds": 600, "grid": {grid!r}}})
try:
    run_sweep(spec, database=directory / "r.db")
except KeyboardInterrupt:
    sys.exit(130)
"""


@pytest.fixture
def sweep_in_a_process(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int, int]]:
    """A sweep whose one run hangs: the sweep, its fork server's pid and its forked run's pid."""
    script = SWEEP_SCRIPT.format(light=LIGHT_PRELOAD, grid={**TINY_FCNN, "micro_batch_size": 8})
    sweep = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], text=True, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240  # a hang guard: a busy machine starts Python slowly
        pid_files: list[Path] = []
        while time.monotonic() < deadline and sweep.poll() is None:
            scratch = Path(tempfile.gettempdir())  # the sweep's: a test worker's own under pytest-xdist
            pid_files = list(scratch.glob(f"core-sweep-{sweep.pid}-*/cell-0-repeat-0/result.json.pid"))
            if pid_files and (tmp_path / "server.pid").exists() and pid_files[0].read_text():
                break
            time.sleep(0.05)
        if not pid_files:
            sweep.kill()  # its stderr ends only with it: read before that, the test would hang
            raise AssertionError(f"the run never started: {sweep.communicate(timeout=60)[1]}")
        yield sweep, int((tmp_path / "server.pid").read_text()), int(pid_files[0].read_text())
    finally:
        if sweep.poll() is None:
            sweep.kill()
        sweep.wait()


def test_a_sweep_stopped_with_sigterm_leaves_no_forked_run(
    sweep_in_a_process: tuple[subprocess.Popen[str], int, int],
) -> None:
    sweep, server, run = sweep_in_a_process
    assert alive(server) and alive(run)
    assert os.getsid(run) == run and os.getpgid(run) == run, "a forked run leads a session of its own"
    sweep.send_signal(signal.SIGTERM)
    assert sweep.wait(timeout=120) == 130
    assert wait_until_gone([server, run]) == []


def test_a_sweep_killed_with_sigkill_leaves_no_forked_run(
    sweep_in_a_process: tuple[subprocess.Popen[str], int, int],
) -> None:
    sweep, server, run = sweep_in_a_process
    sweep.kill()
    sweep.wait(timeout=120)
    # The server dies with the sweep (parent-death signal), and the run with the server.
    assert wait_until_gone([server, run]) == []


# --- the server stays clean; forked runs match fresh ones ------------------------------------------

TORCH_IN_CHILD = """
import sys, torch
torch.set_num_threads(2)
a = torch.randn(256, 256, requires_grad=True)
(a @ a).sum().backward()
assert not torch.cuda._is_in_bad_fork()
print("threads", torch.get_num_threads())
"""


@pytest.mark.slow
def test_the_fork_server_never_starts_a_thread_pool_or_cuda(tmp_path: Path) -> None:
    server = forkserver.start_fork_server(core.sweep.repeat.WARM_IMPORTS, tmp_path / "server.log")
    try:
        ready = server.ready
        assert ready["torch_imported"] and not ready["cuda_initialized"] and not ready["tensorflow_imported"]
        for attempt in range(2):  # a second fork works as the first: the server's state did not change
            ended = processes.supervise(
                [sys.executable, "-c", TORCH_IN_CHILD], tmp_path / f"run{attempt}.log", starter=server
            )
            assert ended.returncode == 0, (tmp_path / f"run{attempt}.log").read_text()
            assert "threads 2" in (tmp_path / f"run{attempt}.log").read_text()
        status = server.status()
        # After a fork the server has one thread: OpenBLAS (started by numpy's import) stops its pool
        # before a fork, but torch's OpenMP pool, once used, stays (it would show here as more).
        assert status["threads"] == 1, status
        assert not status["cuda_initialized"] and status["runs"] == []
    finally:
        server.close()
    assert not alive(server.process.pid)


@pytest.mark.slow
def test_forked_runs_measure_what_fresh_runs_measure(tmp_path: Path) -> None:
    figures = {}
    for workers in ("warm", "fresh"):
        outcome = run_sweep(spec(workers, [8, 16]), database=tmp_path / f"{workers}.db", workers=workers)  # type: ignore[arg-type]
        results = [run.result for cell in outcome.cells for run in cell.runs]
        assert all(result.status.ok for result in results), [r.status for r in results]
        assert {r.process_start.method for r in results if r.process_start} == {
            "forked" if workers == "warm" else "fresh"
        }
        figures[workers] = [
            {key for key, value in r.model_dump(exclude={"process_start"}).items() if value is not None}
            for r in results
        ]
    assert figures["warm"] == figures["fresh"]
    assert children_of(os.getpid()) == []


def test_the_cli_offers_the_choice(capsys: pytest.CaptureFixture[str]) -> None:
    from core.cli import main

    with pytest.raises(SystemExit):
        main(["sweep", "--help"])
    assert "--workers {warm,fresh}" in capsys.readouterr().out


def test_a_forked_child_runs_python_as_the_interpreter_would(tmp_path: Path) -> None:
    server = forkserver.start_fork_server(LIGHT_PRELOAD, tmp_path / "server.log")
    try:
        program = textwrap.dedent(
            """
            import os, sys
            print(sys.argv[1:], __name__, os.environ["CORE_PARENT_PID"] == str(os.getppid()), sys.stdin.read() == "")
            print("to stderr", file=sys.stderr)
            """
        )
        ended = processes.supervise([sys.executable, "-c", program, "a", "b"], tmp_path / "out.log", starter=server)
        assert ended.returncode == 0
        assert (tmp_path / "out.log").read_text().splitlines() == ["['a', 'b'] __main__ True True", "to stderr"]
    finally:
        server.close()


def test_a_process_ending_without_atexit_removes_tensorflow_s_generated_sources(tmp_path: Path) -> None:
    """TensorFlow's autograph writes each converted function to $TMPDIR/__autograph_generated_file*.py
    and removes it only in an atexit handler, which a worker ending with exit_now never runs: ~100
    such files were left in /tmp. A module of that name elsewhere, or of another name, is kept."""
    temporary, elsewhere = tmp_path / "tmp", tmp_path / "elsewhere"
    temporary.mkdir()
    elsewhere.mkdir()
    code = textwrap.dedent(
        """
        import atexit, importlib.util, os, sys, tempfile
        from core.running import processes
        def load(folder, name):
            path = os.path.join(folder, name + ".py")
            with open(path, "w") as stream:
                stream.write("x = 1\\n")
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            sys.modules[name] = module
        load(tempfile.gettempdir(), "__autograph_generated_fileabc123")
        load(tempfile.gettempdir(), "ordinary_module")
        load(sys.argv[1], "__autograph_generated_filexyz789")
        processes.exit_now(5)
        """
    )
    env = {**os.environ, "TMPDIR": str(temporary)}
    done = subprocess.run([sys.executable, "-c", code, str(elsewhere)], env=env, timeout=60)
    assert done.returncode == 5
    assert sorted(path.name for path in temporary.iterdir()) == ["ordinary_module.py"]
    assert [path.name for path in elsewhere.iterdir()] == ["__autograph_generated_filexyz789.py"]
