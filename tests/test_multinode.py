"""Runs over several nodes: torchrun agents meeting at a c10d rendezvous, here two "nodes" on
localhost (docs/cluster.md). Their weights equal one process's with the whole batch, and each
node's energy reaches the result."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from launching import ROOT
from test_torch_executor import OPTIONS, one_update, relative_difference

from core import ConfigError
from core.base.distributed import SINGLE_PROCESS
from core.contract.manager import get_plugin_manager
from core.running.launch import TorchrunLauncher, multinode_torchrun_arguments
from core.running.planning import plan_run
from core.running.slurm import SlurmAllocation
from core.testing import TINY_FCNN


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_nodes(commands: list[list[str]], env: dict[str, str] | None = None) -> list[subprocess.CompletedProcess[str]]:
    """Start every node's command at once (they wait for each other at the rendezvous)."""
    started = [
        subprocess.Popen(
            command,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        for command in commands
    ]
    finished = []
    for process in started:
        try:
            out, err = process.communicate(timeout=300)
        finally:
            process.kill()
        finished.append(subprocess.CompletedProcess(process.args, process.returncode, out, err))
    return finished


WORKER = textwrap.dedent("""
    import sys, torch
    from core.base.config import make_config
    from core.base.distributed import ProcessContext
    from core.executors.pytorch import TorchExecutor, TorchPlacement
    from core.workloads.fcnn import Fcnn, FcnnOptions
    options = {options!r}
    process = ProcessContext.from_environment()
    config = make_config(workload="fcnn", accelerator="cpu", micro_batch_size=16, replicas=2, nodes=2,
                         rendezvous="127.0.0.1:1", workload_options=options)
    executor = TorchExecutor(Fcnn().build_torch(FcnnOptions(**options), seed=0), config,
                             TorchPlacement(device="cpu", distributed_backend="gloo"), process)
    executor.step()
    if process.rank == 0:
        torch.save(executor.model_state(), sys.argv[1])
    executor.close()
""")


@pytest.mark.slow
def test_two_nodes_train_the_same_weights_as_one_process_with_the_whole_batch(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(options=OPTIONS))
    out, rendezvous = tmp_path / "state.pt", f"127.0.0.1:{free_port()}"
    agent = [
        sys.executable,
        *multinode_torchrun_arguments(
            2, 1, rendezvous, run_id="weights", worker_module=[str(script), str(out)], log_dir=tmp_path / "logs"
        ),
    ]
    nodes = start_nodes([agent, agent])
    assert all(node.returncode == 0 for node in nodes), [node.stderr[-2000:] for node in nodes]
    whole = one_update(micro_batch_size=32, gradient_accumulation=1)
    assert relative_difference(torch.load(out), whole) < 1e-6


# A meter as a third party would write it: each node reads 10 J x (its node rank + 1) per window.
NODE_METER = """
import os
from core import Availability, PowerMeterFactory, hookimpl
from core.plugin import EnergyMeasurement, PowerMeter

class NodeMeter(PowerMeter):
    name = "node-meter"
    def __init__(self, devices):
        self.devices = devices
    def start(self):
        pass
    def stop(self):
        joules = 10.0 * (int(os.environ.get("GROUP_RANK", 0)) + 1)
        # NODE_METER_BY_DEVICE: the node's joules by device, as a GPU meter gives them
        by_device = {f"device{device.index}": joules / len(self.devices) for device in self.devices}
        return EnergyMeasurement(meter=self.name, method="counter", energy_joules=joules,
                                 components_joules=by_device if os.environ.get("NODE_METER_BY_DEVICE") else {})

class NodeMeterFactory(PowerMeterFactory):
    name = "node-meter"
    def reads(self, accelerator_name):
        return accelerator_name == "cpu"
    def availability(self):
        return Availability.yes()
    def meter_for(self, devices, context):
        return NodeMeter(devices)

@hookimpl
def core_register_power_meters(register):
    register(NodeMeterFactory())
"""


def install_node_meter(root: Path) -> dict[str, str]:
    (root / "node_meter.py").write_text(NODE_METER)
    info = root / "node_meter-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: node_meter\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[core]\nnode_meter = node_meter\n")
    return {"PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}


@pytest.mark.slow
def test_core_run_on_two_nodes_adds_up_each_nodes_energy(tmp_path: Path) -> None:
    env = install_node_meter(tmp_path)
    rendezvous = f"127.0.0.1:{free_port()}"
    outputs = [tmp_path / f"node{i}.json" for i in range(2)]
    commands = [
        [sys.executable, "-m", "core.cli", "run", "fcnn", "--nodes", "2", "--replicas", "2", "--rendezvous", rendezvous]
        + ["--batch-size", "8", "--steps", "3", "--power-meter", "node-meter", "--output", str(output)]
        + ["-o", "layers=1", "-o", "hidden_width=8"]
        for output in outputs
    ]
    nodes = start_nodes(commands, env)
    assert all(node.returncode == 0 for node in nodes), [node.stderr[-2000:] for node in nodes]
    results = [json.loads(output.read_text()) for output in outputs]
    for result in results:  # each node's core has the run's figures; global rank 0's is the run's
        assert [node["energy_joules"] for node in result["nodes"]] == [10.0, 20.0]
        assert result["energy_joules"] == 30.0 and result["energy"]["components_joules"] == {
            "node0": 10.0,
            "node1": 20.0,
        }
        assert result["world_size"] == 2 and result["samples_per_update"] == 16
        # Both nodes' devices count: energy per device divides by all of them.
        assert [device["details"]["node_rank"] for device in result["devices"]] == [0, 1]
        assert result["energy_joules_per_device"] == 15.0
    warned = [any("global rank 0 ran on another node" in w for w in result["warnings"]) for result in results]
    assert sorted(warned) == [False, True]  # one node held rank 0
    assert all("nodes           2: node 0 (" in node.stdout and "node 1 (" in node.stdout for node in nodes)


SMALL_GPT = ["gpt-800m", "-o", "variant=small", "-o", "vocabulary=96", "-o", "sequence_length=16"]


@pytest.mark.slow
def test_one_replica_spans_two_nodes_one_device_each(tmp_path: Path) -> None:
    """A replica larger than a node (tensor parallelism 2 over two one-device nodes): each node's
    agent starts its share of the replica's processes, not its whole replicas (none here); each
    node's meter reads its device, and the result keeps every device's energy."""
    env = {**install_node_meter(tmp_path), "NODE_METER_BY_DEVICE": "1"}
    rendezvous = f"127.0.0.1:{free_port()}"
    outputs = [tmp_path / f"node{i}.json" for i in range(2)]
    commands = [
        [sys.executable, "-m", "core.cli", "run", *SMALL_GPT, "--nodes", "2", "--rendezvous", rendezvous]
        + ["--devices-per-replica", "2", "--tensor-parallel", "2", "--batch-size", "4", "--steps", "2"]
        + ["--power-meter", "node-meter", "--output", str(output)]
        for output in outputs
    ]
    nodes = start_nodes(commands, env)
    assert all(node.returncode == 0 for node in nodes), [node.stderr[-2000:] for node in nodes]
    for output in outputs:
        result = json.loads(output.read_text())
        assert result["status"]["state"] == "ok" and result["world_size"] == 2 and result["samples_per_update"] == 4
        assert [device["details"]["node_rank"] for device in result["devices"]] == [0, 1]
        assert result["executor_details"]["device_mesh"] == {"data": 1, "pipeline": 1, "tensor": 2}
        assert result["energy"]["components_joules"] == {"node0/device0": 10.0, "node1/device0": 20.0}
        assert result["energy_joules"] == 30.0 and result["energy_joules_per_device"] == 15.0


def test_a_replica_spanning_nodes_starts_its_share_of_devices_on_each(tmp_path: Path) -> None:
    planned = plan_run(
        get_plugin_manager(),
        "gpt-800m",
        "cpu",
        {
            "workload_options": {"variant": "small"},
            "nodes": 2,
            "rendezvous": "a:1",
            "devices_per_replica": 2,
            "tensor_parallel": 2,
        },
    )
    launcher = planned.launcher  # type: ignore[attr-defined]
    context = planned.context(SINGLE_PROCESS)  # type: ignore[attr-defined]
    assert context.config.replicas_per_node == 0 and context.config.devices_per_node == 1
    command = launcher.command(context, [sys.executable, "-m", "core.running.worker", "c", "r"], tmp_path)
    assert "--nproc-per-node=1" in command and "--nnodes=2" in command


MIRRORED = {"tensorflow_strategy": "mirrored"}


def plan(**options: object) -> object:
    return plan_run(get_plugin_manager(), "fcnn", "cpu", {"workload_options": TINY_FCNN, **options})


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"nodes": 2, "replicas": 2}, "rendezvous"),  # outside Slurm: where do the nodes meet?
        ({"nodes": 2, "replicas": 3, "rendezvous": "a:1"}, "replicas"),
        ({"nodes": 2, "replicas": 2, "rendezvous": "a"}, "rendezvous"),
        ({"nodes": 2, "replicas": 2, "rendezvous": "a:70000"}, "rendezvous"),
        ({"nodes": 1, "rendezvous": "a:1"}, "rendezvous"),
        # TensorFlow spans nodes as MultiWorkerMirroredStrategy; MirroredStrategy cannot.
        ({"nodes": 2, "replicas": 2, "rendezvous": "a:1", "framework": "tensorflow"} | MIRRORED, "tensorflow_strategy"),
        ({"nodes": True}, "nodes"),
    ],
)
def test_a_bad_multi_node_run_is_refused_naming_the_field(
    options: dict[str, object], field: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in ("SLURM_JOB_ID", "SLURM_JOB_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        monkeypatch.delenv(variable, raising=False)
    with pytest.raises(ConfigError) as refused:
        plan(**options)
    assert refused.value.field == field, refused.value


SLURM = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "gpu[07-08]"}


def test_inside_slurm_srun_starts_one_agent_per_node_meeting_on_the_first(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for variable, value in SLURM.items():
        monkeypatch.setenv(variable, value)
    monkeypatch.setattr(SlurmAllocation, "hostnames", lambda self: ["gpu07", "gpu08"])
    with pytest.raises(ConfigError, match="at most the 2 node"):
        plan(nodes=4, replicas=4)
    planned = plan(nodes=2, replicas=4)
    launcher = planned.launcher  # type: ignore[attr-defined]
    assert isinstance(launcher, TorchrunLauncher)
    context = planned.context(SINGLE_PROCESS)  # type: ignore[attr-defined]
    command = launcher.command(context, [sys.executable, "-m", "core.running.worker", "c", "r"], tmp_path)
    assert command[:6] == [
        "srun",
        "--nodes=2",
        "--ntasks=2",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        "--export=ALL",
    ]
    assert "--rdzv-endpoint=gpu07:29500" in command and "--nproc-per-node=2" in command and "--nnodes=2" in command
    assert "--rdzv-id=core-4242" in command
    assert launcher.work_parent(context) == Path.cwd()  # every node reads the launch's files


def _slurm_reachable() -> str | None:
    """Why a real Slurm cannot be used here, or None when ``sinfo`` reaches its controller."""
    if shutil.which("srun") is None or shutil.which("sinfo") is None:
        return "Slurm's commands are not installed (Debian: slurm-wlm; scripts/local-slurm.sh starts one)"
    probe = subprocess.run(["sinfo", "--noheader"], capture_output=True, text=True, timeout=30, check=False)
    if probe.returncode != 0 or not probe.stdout.strip():
        return f"no Slurm controller answers sinfo: {(probe.stderr or probe.stdout).strip()[:300]}"
    return None


@pytest.mark.slow
def test_a_real_slurm_allocation_is_read_and_its_node_count_kept() -> None:
    why = _slurm_reachable()
    if why is not None:
        pytest.skip(f"SLURM TESTS SKIPPED: {why}")
    probe = (
        "from core.running.slurm import SlurmAllocation as A; a = A.from_environment(); "
        "print(a.node_count, a.rendezvous())"
    )
    inside = subprocess.run(
        ["srun", "-N1", sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT, check=False
    )
    assert inside.returncode == 0, inside.stderr
    count, rendezvous = inside.stdout.split()
    assert count == "1" and rendezvous.endswith(":29500")
    refused = subprocess.run(
        ["srun", "-N1", sys.executable, "-m", "core.cli", "run", "fcnn", "--nodes", "2", "--replicas", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )
    assert "invalid nodes (--nodes) = 2: at most the 1 node(s) of Slurm job" in refused.stderr
