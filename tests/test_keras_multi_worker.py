"""TensorFlow as one process per replica: MultiWorkerMirroredStrategy under core's torchrun launcher
(docs/cluster.md). Each worker computes its own share of the global batch, so one update equals the
single process's with the whole batch; the choice is validated in planning, before any device."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from core import ConfigError
from core.contract.manager import get_plugin_manager
from core.executors.keras import WORKER_HOST_VARIABLE, tf_config, worker_host
from core.running.launch import TorchrunLauncher
from core.running.planning import plan_run
from core.testing import TINY_FCNN

pytestmark = pytest.mark.tensorflow

ROOT = Path(__file__).resolve().parents[1]
# Children import core from this checkout and keep whatever else the parent's path provides.
CHILD_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
OPTIONS = {"layers": 3, "hidden_width": 32, "input_width": 20, "output_width": 10}
SLURM_VARIABLES = ("SLURM_JOB_ID", "SLURM_JOB_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NODELIST", "SLURM_NODELIST")


def plan(**options: object) -> object:
    return plan_run(get_plugin_manager(), "fcnn", "cpu", {"workload_options": TINY_FCNN, **options})


@pytest.fixture
def outside_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in SLURM_VARIABLES:
        monkeypatch.delenv(variable, raising=False)


# --- choosing it, before any device ------------------------------------------------------------


def test_one_node_keeps_mirrored_strategy_in_one_process_unless_asked() -> None:
    assert plan(framework="tensorflow", replicas=2).launcher is None
    assert isinstance(
        plan(framework="tensorflow", replicas=2, tensorflow_strategy="multi-worker").launcher, TorchrunLauncher
    )
    # One replica is one process either way.
    assert plan(framework="tensorflow", tensorflow_strategy="multi-worker").launcher is None


def test_several_nodes_of_tensorflow_run_as_torchrun_agents(outside_slurm: None) -> None:
    planned = plan(framework="tensorflow", replicas=2, nodes=2, rendezvous="127.0.0.1:29400")
    assert planned.config.tensorflow_multi_worker
    assert isinstance(planned.launcher, TorchrunLauncher)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"tensorflow_strategy": "multi-worker", "replicas": 2}, "tensorflow_strategy"),  # framework torch
        (
            {"tensorflow_strategy": "mirrored", "framework": "tensorflow", "nodes": 2, "replicas": 2},
            "tensorflow_strategy",
        ),
        ({"tensorflow_strategy": "ring", "framework": "tensorflow"}, "tensorflow_strategy"),
    ],
)
def test_a_bad_tensorflow_strategy_is_refused_naming_the_field(
    options: dict[str, object], field: str, outside_slurm: None
) -> None:
    with pytest.raises(ConfigError) as refused:
        plan(rendezvous="127.0.0.1:29400", **options) if options.get("nodes") else plan(**options)
    assert refused.value.field == field, refused.value
    assert refused.value.value == options[field]
    assert "auto" in refused.value.allowed, refused.value  # what is allowed instead


def test_tf_config_names_every_worker_and_this_task() -> None:
    workers = ["10.0.0.1:2222", "10.0.0.2:2222"]
    assert tf_config(workers, 1) == {"cluster": {"worker": workers}, "task": {"type": "worker", "index": 1}}
    with pytest.raises(ValueError):
        tf_config(workers, 2)


def test_worker_host_is_the_loopback_on_one_node_and_routable_over_several() -> None:
    assert worker_host(1, {}) == "127.0.0.1"
    assert worker_host(2, {WORKER_HOST_VARIABLE: "node7-ib"}) == "node7-ib"
    # Towards a store on a loopback (this node's own): not that loopback, which other nodes cannot reach.
    assert worker_host(2, {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}) == socket.getfqdn()


# --- two workers compute one update of the whole batch ------------------------------------------

WORKER = textwrap.dedent("""
    import json, sys
    import numpy as np
    from core.base.distributed import ProcessContext
    from core.contract.accelerator import executor_for
    from core.contract.manager import get_plugin_manager
    from core.running.planning import plan_run

    options = json.loads(sys.argv[2])
    plan = plan_run(get_plugin_manager(), "fcnn", "cpu", options)
    process = ProcessContext.from_environment()
    executor = executor_for(plan.accelerator, plan.workload, plan.context(process))
    initial = [v.numpy() for v in executor.model.trainable_variables]
    executor.step()
    loss = executor._read_loss_sum()  # one update's mean loss over the whole global batch
    executor.barrier()
    trained = [v.numpy() for v in executor.model.trainable_variables]
    details = executor.details()
    executor.close()
    np.savez(f"{sys.argv[1]}.{process.rank}.npz", loss=loss, *initial, *trained)
    with open(f"{sys.argv[1]}.{process.rank}.json", "w") as out:
        json.dump(details, out)
""")


def _one_process_update(micro: int) -> tuple[float, list[np.ndarray], list[np.ndarray]]:
    """The same update in this process: one replica, the whole global batch, no accumulation."""
    import tensorflow as tf

    from core.base.config import make_config
    from core.executors.keras import KerasExecutor, KerasPlacement
    from core.workloads.fcnn import Fcnn, FcnnOptions

    config = make_config(workload="fcnn", accelerator="cpu", framework="tensorflow", micro_batch_size=micro)
    placement = KerasPlacement(lambda: tf.distribute.OneDeviceStrategy("/cpu:0"), 1, "/cpu:0")
    executor = KerasExecutor(Fcnn().build_keras(FcnnOptions(**OPTIONS), seed=0), config, placement)
    try:
        initial = [np.array(v.numpy()) for v in executor.model.trainable_variables]
        executor.step()
        loss = executor._read_loss_sum()
        return loss, initial, [np.array(v.numpy()) for v in executor.model.trainable_variables]
    finally:
        executor.close()


def _relative(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b)) / max(float(np.max(np.abs(y))) for y in b)


@pytest.mark.slow
def test_two_workers_make_the_update_of_one_process_with_the_whole_batch(tmp_path: Path) -> None:
    pytest.importorskip("tensorflow")
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    options = {
        "framework": "tensorflow",
        "tensorflow_strategy": "multi-worker",
        "replicas": 2,
        "micro_batch_size": 8,
        "gradient_accumulation": 2,  # 8 x 2 x 2 = 32 samples an update
        "workload_options": OPTIONS,
    }
    out = tmp_path / "worker"
    ran = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
        + [f"--log-dir={tmp_path / 'logs'}", str(script), str(out), json.dumps(options)],
        env=CHILD_ENV,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    details = json.loads(out.with_suffix(".0.json").read_text())
    assert (details["workers"], details["replicas_in_sync"], details["communication"]) == (2, 2, "RING")
    assert details["worker_addresses"] == json.loads(out.with_suffix(".1.json").read_text())["worker_addresses"]

    expected_loss, expected_initial, expected = _one_process_update(32)
    for rank in (0, 1):
        saved = np.load(f"{out}.{rank}.npz")
        arrays = [saved[f"arr_{i}"] for i in range(len(saved.files) - 1)]
        initial, trained = arrays[: len(arrays) // 2], arrays[len(arrays) // 2 :]
        assert _relative(initial, expected_initial) == 0.0
        # Every worker holds the update of the whole batch: its own quarter-batches' gradients and the
        # other worker's, all-reduced. Workers that took the same samples would train other weights.
        assert _relative(trained, expected) < 1e-6, rank
        assert abs(float(saved["loss"]) - expected_loss) <= 1e-6 * abs(expected_loss), rank


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_core_run_of_tensorflow_workers_reports_the_global_batch(tmp_path: Path, workers: int) -> None:
    # One worker is this process alone (torchrun starts none): the strategy without TF_CONFIG.
    pytest.importorskip("tensorflow")
    ran = subprocess.run(
        [sys.executable, "-m", "core.cli", "run", "fcnn", "--framework", "tensorflow", "--replicas", str(workers)]
        + ["--tensorflow-strategy", "multi-worker", "--batch-size", "8", "--steps", "3", "--warmup-steps", "1"]
        + ["-o", "hidden_width=32", "-o", "input_width=64", "-o", "output_width=10", "--json"],
        env=CHILD_ENV,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    result = json.loads(ran.stdout)
    assert result["status"]["state"] == "ok", result["status"]
    assert result["world_size"] == workers
    assert result["config"]["tensorflow_strategy"] == "multi-worker"
    assert result["executor_details"]["strategy"] == "CollectiveAllReduceStrategy"  # MultiWorkerMirroredStrategy
    assert result["executor_details"].get("workers", 1) == workers
    assert result["window_samples"] == 3 * 8 * workers  # steps x micro x accumulation x replicas
    assert result["throughput_per_second"] == pytest.approx(result["window_samples"] / result["window_seconds"])
