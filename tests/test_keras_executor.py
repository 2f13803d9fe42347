"""KerasExecutor: exact gradient accumulation and replication, precision policies, NaN detection."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from core.base.config import Precision, make_config
from core.base.errors import NonFiniteLossError
from core.executors.keras import KerasExecutor, KerasPlacement  # imports TensorFlow lazily
from core.workloads.fcnn import Fcnn, FcnnOptions

tf = pytest.importorskip("tensorflow")

pytestmark = pytest.mark.tensorflow

ROOT = Path(__file__).resolve().parents[1]
# Children import core from this checkout and keep whatever else the parent's path provides.
CHILD_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
OPTIONS = FcnnOptions(layers=3, hidden_width=32, input_width=20, output_width=10)
STEPS = 2  # two updates: the accumulators must also reset between updates


def _config(micro: int, accumulation: int = 1, precision: str = "fp32", replicas: int = 1):
    return make_config(
        workload="fcnn",
        accelerator="cpu",
        framework="tensorflow",
        micro_batch_size=micro,
        gradient_accumulation=accumulation,
        replicas=replicas,
        precision=precision,
    )


def _one_cpu(jit: bool = False) -> KerasPlacement:
    return KerasPlacement(lambda: tf.distribute.OneDeviceStrategy("/cpu:0"), 1, "/cpu:0", jit)


def _weights(executor: KerasExecutor) -> list[np.ndarray]:
    return [np.array(v.numpy()) for v in executor.model.trainable_variables]


def _train(micro: int, accumulation: int, jit: bool = False) -> tuple[list[np.ndarray], list[np.ndarray]]:
    executor = KerasExecutor(Fcnn().build_keras(OPTIONS, seed=0), _config(micro, accumulation), _one_cpu(jit))
    try:
        initial = _weights(executor)
        for _ in range(STEPS):
            executor.step()
        executor.synchronize()
        executor.check_finite()
        return initial, _weights(executor)
    finally:
        executor.close()


def _relative(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b)) / max(float(np.max(np.abs(y))) for y in b)


@pytest.fixture(scope="module")
def reference() -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Initial and trained weights of one replica, micro-batch 32, no accumulation."""
    return _train(32, 1)


def test_gradient_accumulation_matches_one_big_batch(reference) -> None:
    initial, expected = reference
    _, accumulated = _train(8, 4)
    assert _relative(accumulated, expected) < 1e-6
    # The comparison means something only if training moved the weights well beyond the tolerance.
    assert _relative(expected, initial) > 1e-4


@pytest.mark.parametrize("accumulation", [1, 4])
def test_the_train_step_traces_the_model_once_whatever_the_accumulation(accumulation: int) -> None:
    # Tracing and optimising the graph is most of a run's first step: a micro-step outside the
    # accumulation loop (to seed the accumulators) doubled it for every accumulation above 1.
    spec = Fcnn().build_keras(OPTIONS, seed=0)
    traced = []

    def make_counted_loss() -> object:
        loss = spec.make_loss()

        def counted(targets: object, outputs: object) -> object:
            traced.append(1)  # Python runs once per trace of the micro-step, not per step
            return loss(targets, outputs)

        return counted

    counted_spec = dataclasses.replace(spec, make_loss=make_counted_loss)
    executor = KerasExecutor(counted_spec, _config(8, accumulation), _one_cpu())
    try:
        for _ in range(STEPS):
            executor.step()
        executor.synchronize()
        executor.check_finite()
    finally:
        executor.close()
    assert len(traced) == 1


def test_xla_matches_plain_graph(reference) -> None:
    _, expected = reference
    _, compiled = _train(16, 2, jit=True)
    assert _relative(compiled, expected) < 1e-5


def test_samples_per_update_and_details() -> None:
    config = _config(8, 3, precision="fp32")
    executor = KerasExecutor(Fcnn().build_keras(OPTIONS, seed=0), config, _one_cpu())
    try:
        details = executor.details()
        assert details["framework"] == "tensorflow"
        assert details["tensorflow_version"] == tf.__version__ == executor.framework_version()
        assert details["mixed_precision_policy"] == "float32"
        assert details["tf32_enabled"] is False
        assert details["strategy"] == "OneDeviceStrategy"
        assert details["replicas_in_process"] == 1
        assert details["jit_compile"] is False
    finally:
        executor.close()


def test_placement_replica_count_must_match_strategy() -> None:
    placement = KerasPlacement(lambda: tf.distribute.OneDeviceStrategy("/cpu:0"), 2, "/cpu:0")
    with pytest.raises(ValueError, match="2 replica"):
        KerasExecutor(Fcnn().build_keras(OPTIONS, seed=0), _config(8), placement)


@pytest.mark.parametrize("precision", [Precision.bf16, Precision.fp16])
def test_mixed_precision_trains_and_restores_policy(precision: Precision) -> None:
    from tensorflow import keras

    before = keras.mixed_precision.global_policy().name
    tf32_before = tf.config.experimental.tensor_float_32_execution_enabled()
    executor = KerasExecutor(Fcnn().build_keras(OPTIONS, seed=0), _config(8, 2, precision.value), _one_cpu())
    try:
        expected_policy = {"bf16": "mixed_bfloat16", "fp16": "mixed_float16"}[precision.value]
        assert executor.details()["mixed_precision_policy"] == expected_policy
        first_dense = executor.model.layers[0]
        assert first_dense.compute_dtype == expected_policy.removeprefix("mixed_")
        is_loss_scaled = isinstance(executor.optimizer, keras.mixed_precision.LossScaleOptimizer)
        assert is_loss_scaled == (precision is Precision.fp16)
        assert executor.details()["loss_scaling"] == ("dynamic" if precision is Precision.fp16 else None)
        initial = _weights(executor)
        for _ in range(2):
            executor.step()
        executor.synchronize()
        executor.check_finite()  # raises on a NaN/inf loss
        trained = _weights(executor)
        assert all(np.isfinite(w).all() for w in trained)
        assert _relative(trained, initial) > 1e-4
    finally:
        executor.close()
    assert keras.mixed_precision.global_policy().name == before
    assert tf.config.experimental.tensor_float_32_execution_enabled() == tf32_before


def test_nan_in_data_raises_after_synchronize_then_resets() -> None:
    spec = Fcnn().build_keras(OPTIONS, seed=0)
    spec.inputs = spec.inputs.copy()
    spec.inputs[3, 5] = np.nan
    executor = KerasExecutor(spec, _config(8), _one_cpu())
    try:
        executor.step()
        executor.synchronize()
        with pytest.raises(NonFiniteLossError):
            executor.check_finite()
        executor.check_finite()  # nothing ran since the last check
    finally:
        executor.close()


# Logical CPUs can only be configured before TensorFlow initialises, so replicas run in a child.
_REPLICA_SCRIPT = textwrap.dedent(
    """
    import json
    import numpy as np
    from core.executors.keras import split_host_cpu
    names = split_host_cpu(2)
    import tensorflow as tf
    from tensorflow import keras
    from core.base.config import make_config
    from core.executors.keras import KerasExecutor, KerasPlacement
    from core.workloads.fcnn import Fcnn, FcnnOptions

    out = {"names": names, "same_count_again": split_host_cpu(2)}
    try:
        split_host_cpu(3)
        out["resplit_error"] = None
    except RuntimeError as exc:
        out["resplit_error"] = str(exc)
    opts = FcnnOptions(layers=3, hidden_width=32, input_width=20, output_width=10)

    def build(micro, ga, replicas, precision="fp32", spec=None):
        if replicas == 1:
            placement = KerasPlacement(lambda: tf.distribute.OneDeviceStrategy(names[0]), 1, "/cpu:0")
        else:
            placement = KerasPlacement(
                lambda: tf.distribute.MirroredStrategy(
                    devices=names, cross_device_ops=tf.distribute.ReductionToOneDevice()),
                replicas, "/cpu:0")
        config = make_config(workload="fcnn", accelerator="cpu", framework="tensorflow",
                             micro_batch_size=micro, gradient_accumulation=ga, replicas=replicas,
                             precision=precision)
        return KerasExecutor(spec or Fcnn().build_keras(opts, seed=0), config, placement)

    def weights(ex):
        return [v.numpy() for v in ex.model.trainable_variables]

    def train(micro, ga, replicas, steps=2):
        ex = build(micro, ga, replicas)
        w0 = weights(ex)
        for _ in range(steps):
            ex.step()
        ex.synchronize()
        ex.check_finite()
        w = weights(ex)
        ex.close()
        return w0, w

    def rel(a, b):
        return float(max(np.abs(x - y).max() for x, y in zip(a, b)) / max(np.abs(y).max() for y in b))

    w0, single = train(32, 1, 1)
    out["moved"] = rel(single, w0)
    out["two_replicas"] = rel(train(16, 1, 2)[1], single)
    out["two_replicas_accumulating"] = rel(train(8, 2, 2)[1], single)

    # A NaN seen only by replica 1 (samples 4..7 with micro 4) must still be reported.
    spec = Fcnn().build_keras(opts, seed=0)
    spec.inputs = spec.inputs.copy()
    spec.inputs[5, 0] = np.nan
    ex = build(4, 1, 2, spec=spec)
    ex.step()
    ex.synchronize()
    out["replica_losses"] = [float(v.numpy()) for v in ex._loss_sum.values]
    out["replica_finite_updates"] = [float(v.numpy()) for v in ex._finite_updates.values]
    try:
        ex.check_finite()
        out["nan_raised"] = False
    except Exception as exc:
        out["nan_raised"] = type(exc).__name__
        out["nan_message"] = str(exc)
    ex.close()

    # fp16: an overflow on replica 1 only must skip the update on every replica.
    spec = Fcnn().build_keras(opts, seed=0)
    spec.inputs = spec.inputs.copy()
    spec.inputs[4:8] *= 1e6  # beyond float16's range
    ex = build(4, 1, 2, precision="fp16", spec=spec)
    opt = ex.optimizer
    def scale() -> float:
        return float(opt.dynamic_scale.numpy() if hasattr(opt, "dynamic_scale") else opt.loss_scale.numpy())

    w0, scale0 = weights(ex), scale()
    ex.step()
    ex.synchronize()
    out["fp16_overflow_weights_unchanged"] = rel(weights(ex), w0) == 0.0
    out["fp16_scale_ratio"] = scale() / scale0
    ex.close()

    # fp16 with two replicas trains normally on ordinary data.
    ex = build(8, 2, 2, precision="fp16")
    w0 = weights(ex)
    for _ in range(2):
        ex.step()
    ex.synchronize()
    ex.check_finite()
    out["fp16_moved"] = rel(weights(ex), w0)
    ex.close()
    print("RESULT " + json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def replica_run() -> dict:
    env = {**CHILD_ENV, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run(
        [sys.executable, "-c", _REPLICA_SCRIPT],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads(lines[-1].removeprefix("RESULT "))


@pytest.mark.slow
def test_split_host_cpu(replica_run: dict) -> None:
    assert replica_run["names"] == ["/device:CPU:0", "/device:CPU:1"]
    assert replica_run["same_count_again"] == replica_run["names"]
    assert replica_run["resplit_error"] and "already initialised" in replica_run["resplit_error"]


@pytest.mark.slow
def test_two_replicas_match_one(replica_run: dict) -> None:
    assert replica_run["moved"] > 1e-4
    assert replica_run["two_replicas"] < 1e-6
    assert replica_run["two_replicas_accumulating"] < 1e-6


@pytest.mark.slow
def test_nan_on_one_replica_is_detected(replica_run: dict) -> None:
    # Replica 1's loss may stay finite (oneDNN's fused ReLU maps the NaN input to 0), but its
    # local gradient is NaN: that replica alone flags it, and the read sums the flags.
    assert np.isfinite(replica_run["replica_losses"][0])
    # Replica 0's loss was finite in its one update; replica 1's is NaN from the first where the
    # kernels pass the NaN on, finite where oneDNN's ReLU maps it to 0 (so on a CPU with AMX): then
    # the weights, which its NaN gradient reached, name the update instead.
    nan_loss = not np.isfinite(replica_run["replica_losses"][1])
    assert replica_run["replica_finite_updates"] == ([1.0, 0.0] if nan_loss else [1.0, 1.0])
    assert "in update 1 of the run" in replica_run["nan_message"]
    assert nan_loss or "every loss was finite" in replica_run["nan_message"]
    assert replica_run["nan_raised"] == "NonFiniteLossError"


def test_fp16_overflow_on_one_replica_skips_update_everywhere(replica_run: dict) -> None:
    assert replica_run["fp16_overflow_weights_unchanged"] is True
    assert replica_run["fp16_scale_ratio"] == 0.5
    assert replica_run["fp16_moved"] > 1e-4


def test_import_does_not_load_tensorflow() -> None:
    code = "import sys, core.executors.keras; print('tensorflow' in sys.modules)"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        cwd=ROOT,
        env=CHILD_ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


# TensorFlow fixes its thread pools when its runtime starts, so the runs go in a fresh process whose
# runtime this script starts first, as a notebook that used TensorFlow before would have.
_STARTED_RUNTIME_SCRIPT = textwrap.dedent(
    """
    import json
    import tensorflow as tf
    tf.constant(1.0) + 1.0  # starts TensorFlow's runtime with its default pools
    from core import run
    from core.workloads.fcnn import FcnnOptions

    def outcome(**settings):
        result = run("fcnn", "cpu", framework="tensorflow", steps=1, warmup_steps=0, micro_batch_size=4,
                     power_meter="none", workload_options={"layers": 2, "hidden_width": 8}, **settings)
        return {"state": result.status.state.value, "phase": result.status.phase, "message": result.status.message,
                "warnings": result.warnings, "threads": result.environment.host_threads if result.environment else None}

    print("RESULT " + json.dumps({"left_to_core": outcome(), "asked": outcome(threads_per_replica=1)}))
    """
)


@pytest.mark.slow
def test_a_started_tensorflow_runtime_keeps_its_pools_or_refuses_threads_asked_for() -> None:
    # Issue 26: a second TensorFlow run in one process failed in setup with TensorFlow's own
    # "Intra op parallelism cannot be modified after initialization", whatever the run asked for.
    proc = subprocess.run(
        [sys.executable, "-c", _STARTED_RUNTIME_SCRIPT],
        check=False,
        cwd=ROOT,
        env={**CHILD_ENV, "TF_CPP_MIN_LOG_LEVEL": "2"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
    outcomes = json.loads(lines[-1].removeprefix("RESULT "))
    kept = outcomes["left_to_core"]
    assert kept["state"] == "ok", kept
    # The pools in force are recorded as TensorFlow reports them (0: its default, one per core).
    assert kept["threads"] == {"intra_op_threads": 0, "inter_op_threads": 0}
    assert [w for w in kept["warnings"] if w.startswith("threads: TensorFlow's runtime had already started")], kept
    asked = outcomes["asked"]
    assert (asked["state"], asked["phase"]) == ("error", "setup"), asked
    assert asked["message"].startswith("threads_per_replica cannot be honoured"), asked
    assert "intra-op TensorFlow's default (this run: 1)" in asked["message"], asked
