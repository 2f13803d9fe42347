"""A Slurm sweep submitted from a login node (docs/cluster.md#submitting-from-a-login-node): its
cells planned for the compute nodes' machine profile, each job planning its run again on its node;
a multi-node cell as one job of its nodes; the printed resume command adopting the jobs in flight.

Most tests run against the simulated Slurm of tests/slurm_support.py; here a job "runs" when its
batch script runs on this host, which plays the compute node. One runs against a real Slurm.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from resume_command import printed_command, resume_words
from slurm_support import SimulatedSlurm

import core
import core.sweep.cluster
import core.sweep.slurm_jobs
from core.base.distributed import SINGLE_PROCESS
from core.cli import main
from core.contract.manager import get_plugin_manager
from core.running.launch import TorchrunLauncher
from core.running.node_plan import PLAN_ON_NODE_KEY, REFUSED_ON_NODE, RefusedOnNode, plan_on_node
from core.running.planning import PlannedRun
from core.running.slurm import SlurmAllocation
from core.storage.store import ResultStore
from core.sweep import SweepError, load_sweep, plan_sweep, run_sweep
from core.sweep.slurm_jobs import unavailable_reason

WORKTREE = Path(core.__file__).resolve().parent.parent
NVIDIA_HERE = get_plugin_manager().availability(get_plugin_manager().accelerator("nvidia")).available
no_gpu_here = pytest.mark.skipif(NVIDIA_HERE, reason="an NVIDIA GPU is here: the login node's part needs none")

NVIDIA_SWEEP = """\
name = "login"
repeats = 1
timeout_seconds = 120
{machine}
[grid]
workload = "fcnn"
accelerator = "nvidia"
precision = ["fp32", "bf16"]
replicas = 4
steps = 2
micro_batch_size = 4
workload_options = {{layers = 1, hidden_width = 8}}

[slurm]
poll_seconds = 1
exclusive = false
"""


def _nvidia_sweep(folder: Path, machine: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "login.toml"
    path.write_text(NVIDIA_SWEEP.format(machine=machine))
    return path


@pytest.fixture
def simulated_slurm(monkeypatch: pytest.MonkeyPatch) -> SimulatedSlurm:
    slurm = SimulatedSlurm()
    monkeypatch.setattr(core.sweep.slurm_jobs, "unavailable_reason", lambda: None)
    monkeypatch.setattr(core.sweep.cluster, "make_scheduler", lambda: slurm)
    return slurm


def _run_jobs_here(slurm: SimulatedSlurm, poll: int) -> None:
    """Each pending job's batch script run on this host, the "compute node"; its state as Slurm's."""
    for job in slurm.jobs.values():
        if job["state"] != "PENDING":
            continue
        # The job sees this worktree's core as a cluster's node sees the shared installation.
        path = os.pathsep.join(filter(None, [str(WORKTREE), os.environ.get("PYTHONPATH")]))
        done = subprocess.run(
            ["bash", str(job["folder"] / "job.sh")],
            cwd=job["folder"],
            env={**os.environ, "PYTHONPATH": path},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        job["state"] = "COMPLETED" if done.returncode == 0 else "FAILED"


def _results(database: Path, sweep: str = "login") -> list[Any]:
    with ResultStore(database, create=False) as store:
        return [run.result for run in store.runs(sweep=sweep)]


# --- done when: NVIDIA cells submitted from a shell without a GPU fail on the node, recorded --------


@no_gpu_here
def test_nvidia_cells_for_a_profile_are_submitted_and_fail_on_the_node_as_not_available(
    tmp_path: Path, simulated_slurm: SimulatedSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep = _nvidia_sweep(tmp_path)
    database = tmp_path / "results.db"
    command = ["sweep", str(sweep), "--executor", "slurm", "--database", str(database)]

    # Planned for this host (no GPU), every cell is refused, and the error says how to name the nodes.
    assert main(command) == 2
    err = capsys.readouterr().err
    assert "not available here" in err and "--machine NAME" in err and "`machine` key" in err
    assert simulated_slurm.jobs == {}

    simulated_slurm.on_poll = _run_jobs_here
    assert main([*command, "--machine", "a100-80gb-x4"]) == 0

    assert len(simulated_slurm.jobs) == 2  # submitted, not refused at planning
    results = _results(database)
    assert len(results) == 2
    for result in results:
        assert result.status.state.value == "error" and result.status.error_type == REFUSED_ON_NODE
        assert "planned for machine 'a100-80gb-x4', refused on node" in result.status.message
        assert "invalid accelerator = 'nvidia': not available here" in result.status.message
    assert sorted(result.config.precision.value for result in results) == ["bf16", "fp32"]
    assert "2 cells, 2 failed" in capsys.readouterr().out  # each cell recorded; the sweep went on


def test_the_sweep_files_machine_plans_a_slurm_sweep_and_the_request_asks_the_node_to_plan_again(
    tmp_path: Path, simulated_slurm: SimulatedSlurm
) -> None:
    sweep = _nvidia_sweep(tmp_path, machine='machine = "a100-80gb-x4"')
    database = tmp_path / "results.db"
    simulated_slurm.on_poll = lambda slurm, poll: (_ for _ in ()).throw(KeyboardInterrupt)

    assert main(["sweep", str(sweep), "--executor", "slurm", "--database", str(database)]) == 130

    requests = [json.loads((job["folder"] / "request.json").read_text()) for job in simulated_slurm.jobs.values()]
    assert len(requests) == 2
    for request in requests:
        assert request["plan"]["machine"] == "a100-80gb-x4"
        assert request[PLAN_ON_NODE_KEY]["accelerator"] == "nvidia" and request[PLAN_ON_NODE_KEY]["replicas"] == 4
        assert request["parent_pid"] is None
    for job in simulated_slurm.jobs.values():
        assert "core.running.child" in (job["folder"] / "job.sh").read_text()


@pytest.mark.parametrize(
    ("grid", "refused"),
    [
        ("replicas = 8", "can place at most 4 on 'a100-80gb-x4'"),  # the profile's device count
        ('precision = "fp8"', "on 'a100-80gb-x4' (NVIDIA A100"),  # its precisions
        ('accelerator = "amd"', "machine 'a100-80gb-x4' has NVIDIA"),  # its accelerator
        # its memory: 1.1e10 parameters, whose fp32 weights alone are 43 GB of the 80 GB
        ("workload_options = {layers = 3, hidden_width = 60000, input_width = 60000}", "a model that fits"),
    ],
)
def test_planning_for_the_profile_checks_what_it_says(
    tmp_path: Path, simulated_slurm: SimulatedSlurm, capsys: pytest.CaptureFixture[str], grid: str, refused: str
) -> None:
    text = NVIDIA_SWEEP.format(machine='machine = "a100-80gb-x4"').replace('precision = ["fp32", "bf16"]', "")
    key = grid.split(" =", 1)[0]
    text = "\n".join(line for line in text.splitlines() if not line.startswith(f"{key} ="))
    sweep = tmp_path / "bad.toml"
    sweep.write_text(text.replace("[grid]\n", f"[grid]\n{grid}\n"))

    assert main(["sweep", str(sweep), "--executor", "slurm", "--database", str(tmp_path / "r.db")]) == 2

    assert refused in capsys.readouterr().err
    assert simulated_slurm.jobs == {}  # refused before anything was submitted


def test_a_site_files_profile_plans_a_slurm_sweep(
    tmp_path: Path, simulated_slurm: SimulatedSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    site = tmp_path / "site.toml"
    site.write_text(
        "[machines.two-gpus]\ndescription = 'our nodes'\nsource = 'our inventory'\naccelerator = 'nvidia'\n"
        "device = 'NVIDIA A100'\ndevices = 2\nprecisions = ['fp32']\n"
    )
    command = ["sweep", str(_nvidia_sweep(tmp_path)), "--executor", "slurm", "--dry-run", "--site", str(site)]

    assert main([*command, "--machine", "two-gpus", "--database", str(tmp_path / "r.db")]) == 2

    out = capsys.readouterr().out
    assert "planned for machine 'two-gpus'" in out
    assert "can place at most 2 on 'two-gpus'" in out and "precision = 'bf16'" in out

    # Through the API, the file's own `machine` names the site's profile as well.
    from core.sweep.site import find_site

    named = _nvidia_sweep(tmp_path / "api", machine='machine = "two-gpus"')
    with pytest.raises(SweepError, match="can place at most 2 on 'two-gpus'"):
        run_sweep(named, database=tmp_path / "r.db", executor="slurm", site=find_site(str(site)))
    assert simulated_slurm.jobs == {}


def test_machine_outside_a_dry_run_stays_refused_for_local_sweeps_and_core_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep = _nvidia_sweep(tmp_path)
    assert main(["sweep", str(sweep), "--machine", "a100-80gb-x4", "--database", str(tmp_path / "r.db")]) == 2
    assert "use it with --dry-run, or with --executor slurm" in capsys.readouterr().err
    assert main(["run", "fcnn", "--accelerator", "nvidia", "--machine", "a100-80gb-x4"]) == 2
    assert "use it with --dry-run" in capsys.readouterr().err
    assert not (tmp_path / "r.db").exists()


def test_a_plan_for_a_profile_runs_only_as_slurm_jobs(tmp_path: Path) -> None:
    sweep = _nvidia_sweep(tmp_path, machine='machine = "a100-80gb-x4"')
    from core.machines import load_machine

    planned = plan_sweep(load_sweep(sweep), machine=load_machine("a100-80gb-x4"), executor="slurm")
    assert len(planned.valid_cells) == 2
    with pytest.raises(SweepError, match="for --dry-run or for --executor slurm"):
        run_sweep(planned, database=tmp_path / "r.db", executor="local")


# --- the job's side: planning again on the node -----------------------------------------------------

CPU_PROFILE = """\
name = "cpu-node"
description = "a CPU node"
source = "the test"
accelerator = "cpu"
device = "CPU"
devices = {devices}
precisions = ["fp32"]
"""


def _cpu_cell_plan(tmp_path: Path, devices: int, **options: Any) -> tuple[PlannedRun, dict[str, Any]]:
    from core.running.planning import plan_run

    profile = tmp_path / "cpu-node.toml"
    profile.write_text(CPU_PROFILE.format(devices=devices))
    from core.machines import load_machine

    cell = {"workload": "fcnn", "accelerator": "cpu", "workload_options": {"layers": 1, "hidden_width": 8}, **options}
    given = dict(cell)
    planned = plan_run(
        get_plugin_manager(), given.pop("workload"), given.pop("accelerator"), given, machine=load_machine(str(profile))
    ).document()
    return planned, cell


def test_a_node_that_cannot_run_the_profiles_plan_records_why(tmp_path: Path) -> None:
    # The profile says 64 devices; this node places fewer replicas: refused there, not crashed.
    planned, cell = _cpu_cell_plan(tmp_path, devices=64, replicas=64)
    with pytest.raises(RefusedOnNode) as refusal:
        plan_on_node(get_plugin_manager(), planned, cell)
    status = refusal.value.result.status
    assert status.error_type == REFUSED_ON_NODE and status.phase == "setup"
    assert "planned for machine 'cpu-node', refused on node" in str(status.message)
    assert "invalid replicas = 64" in str(status.message)


def test_a_multi_node_cell_is_one_job_of_its_nodes_meeting_inside_its_allocation(
    tmp_path: Path, simulated_slurm: SimulatedSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Submitted from outside any allocation: no rendezvous needed at planning.
    for variable in ("SLURM_JOB_ID", "SLURM_JOB_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        monkeypatch.delenv(variable, raising=False)
    sweep = _nvidia_sweep(tmp_path, machine='machine = "a100-80gb-x4"').read_text()
    path = tmp_path / "two.toml"
    path.write_text(sweep.replace('precision = ["fp32", "bf16"]\nreplicas = 4', "nodes = 2\nreplicas = 8"))
    simulated_slurm.on_poll = lambda slurm, poll: (_ for _ in ()).throw(KeyboardInterrupt)

    assert main(["sweep", str(path), "--executor", "slurm", "--database", str(tmp_path / "r.db")]) == 130

    (job,) = simulated_slurm.jobs.values()
    assert job["options"][:2] == ["--nodes=2", "--ntasks-per-node=1"]  # one torchrun agent per node
    script = (job["folder"] / "job.sh").read_text()
    assert "core.running.child" in script and "srun" not in script  # the run's launcher starts the agents

    # Inside that job (its allocation in the environment), the node's plan finds the rendezvous there.
    planned, cell = _cpu_cell_plan(tmp_path, devices=4, nodes=2, replicas=2)
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-2]")
    monkeypatch.setattr(SlurmAllocation, "hostnames", lambda self: ["node1", "node2"])
    plan = plan_on_node(get_plugin_manager(), planned, cell)
    assert isinstance(plan.launcher, TorchrunLauncher)
    command = plan.launcher.command(plan.context(SINGLE_PROCESS), [sys.executable, "-m", "w"], tmp_path)
    assert command[:2] == ["srun", "--nodes=2"] and "--rdzv-endpoint=node1:29500" in command
    assert "--rdzv-id=core-77" in command


# --- the resume command names where the sweep's state lives -----------------------------------------


def test_the_printed_resume_command_run_as_printed_adopts_the_waiting_jobs(
    tmp_path: Path,
    simulated_slurm: SimulatedSlurm,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Started from one folder with a relative database and jobs directory, resumed from another.
    started = tmp_path / "started here"
    sweep = _nvidia_sweep(started)
    monkeypatch.chdir(started)
    simulated_slurm.on_poll = lambda slurm, poll: (_ for _ in ()).throw(KeyboardInterrupt)
    given = ["sweep", sweep.name, "--executor", "slurm", "--machine", "a100-80gb-x4", "--database", "r.db"]
    assert main([*given, "--slurm-jobs-directory", "jobs", "--name", "renamed"]) == 130
    err = capsys.readouterr().err
    assert "2 job(s) of sweep renamed stay in Slurm" in err
    printed = printed_command(err)
    for word in ("--database", "--machine=a100-80gb-x4", "--name=renamed", "--slurm-jobs-directory="):
        assert word in printed, printed

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    submitted = dict(simulated_slurm.jobs)
    simulated_slurm.on_poll = lambda slurm, poll: [
        slurm.end(job, "COMPLETED", result="ok", exit_code=0) for job in slurm.jobs
    ]
    assert main(resume_words(err)) == 0

    assert simulated_slurm.jobs.keys() == submitted.keys()  # waited for, none submitted again
    assert len(_results(started / "r.db", "renamed")) == 2
    assert list(elsewhere.iterdir()) == []  # nothing of the sweep's state made here


def test_a_sweep_that_stopped_submitting_prints_the_command_that_resumes_it(
    tmp_path: Path, simulated_slurm: SimulatedSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    # sbatch refuses the second job after the first began measuring: that one stays, and the
    # error says, word for word, how to go on.
    def measured_first(slurm: SimulatedSlurm, number: int) -> None:
        if number == 2:
            first = next(iter(slurm.jobs.values()))
            (first["folder"] / "result.json.partial").write_text("{}")

    simulated_slurm.on_submit = measured_first
    simulated_slurm.refuse_submission = 2
    sweep = _nvidia_sweep(tmp_path)
    database = tmp_path / "r.db"
    command = ["sweep", str(sweep), "--executor", "slurm", "--machine", "a100-80gb-x4", "--database", str(database)]
    command += ["--slurm-job-arrays", "no"]  # one sbatch per repeat: the second is the one refused

    assert main(command) == 2
    err = capsys.readouterr().err
    assert "stopped submitting" in err and "Continue with: " in err
    simulated_slurm.refuse_submission = None
    simulated_slurm.on_poll = lambda slurm, poll: [
        slurm.end(job, "COMPLETED", result="ok", exit_code=0)
        for job in slurm.jobs
        if slurm.jobs[job]["state"] == "PENDING"
    ]
    first = set(simulated_slurm.jobs)
    assert main(resume_words(err)) == 0
    assert len(first) == 1 and len(simulated_slurm.jobs) == 2  # the first job waited for, the refused one submitted
    assert len(_results(database)) == 2


# --- against a real Slurm ----------------------------------------------------------------------------

SLURM_MISSING = unavailable_reason()


@pytest.mark.slow
@no_gpu_here
@pytest.mark.skipif(
    SLURM_MISSING is not None,
    reason=f"no Slurm to submit to ({SLURM_MISSING}); scripts/local-slurm.sh starts a single-host one as root",
)
def test_on_a_real_slurm_nvidia_cells_for_a_profile_fail_on_the_node_as_not_available(tmp_path: Path) -> None:
    sweep = _nvidia_sweep(tmp_path)
    database = tmp_path / "results.db"

    command = ["sweep", str(sweep), "--executor", "slurm", "--machine", "a100-80gb-x4", "--database", str(database)]
    assert main(command) == 0

    results = _results(database)
    assert len(results) == 2
    for result in results:
        assert result.status.error_type == REFUSED_ON_NODE, result.status
        assert "not available here" in str(result.status.message)
