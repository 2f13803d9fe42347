"""The Graphcore plugin's TensorFlow path against a fake ``tensorflow.python.ipu`` loaded beside the
real TensorFlow: IPUConfig and IPUStrategy, Keras gradient accumulation and pipelining options,
steps_per_execution, the IPU Model flag."""

from __future__ import annotations

import os
from typing import Any

import pytest

from core import run
from core.contract.manager import get_plugin_manager
from core.running.distributed import SINGLE_PROCESS
from core.running.planning import plan_run
from core.testing import TINY_FCNN
from core_plugins.graphcore import accelerator as graphcore_accelerator

pytestmark = [pytest.mark.tensorflow, pytest.mark.usefixtures("fake_sdk", "fake_tf_ipu")]


@pytest.fixture(autouse=True)
def graphcore_tensorflow(monkeypatch: pytest.MonkeyPatch) -> None:
    # The availability probe reads the installed TensorFlow's version: the SDK's build says "+gc".
    monkeypatch.setattr(graphcore_accelerator, "_tensorflow_is_graphcore_build", lambda: True)


def build(**options: Any) -> Any:
    settings: dict[str, Any] = {"framework": "tensorflow", "workload_options": TINY_FCNN, "power_meter": "none"}
    settings.update(options)
    plan = plan_run(get_plugin_manager(), "fcnn", "graphcore", settings)
    return plan.accelerator.executor_for(plan.workload, plan.context(SINGLE_PROCESS))


def test_ipu_config_strategy_and_gradient_accumulation(fake_tf_ipu: Any) -> None:
    executor = build(micro_batch_size=4, gradient_accumulation=6, replicas=2, device_iterations=2)
    try:
        (configured,) = fake_tf_ipu.config.configured
        assert configured.auto_select_ipus == [2]  # 2 replicas x 1 IPU; IPU Keras derives replication from it
        assert executor.steps_per_execution == 12  # GA x device iterations, per replica (SDK >= 2.5)
        assert executor.model.steps_per_execution == 12
        assert ("set_gradient_accumulation_options", 6, "mean") in fake_tf_ipu._keras.calls
        executor.step()
        assert ("fit", 12, 12) in fake_tf_ipu._keras.calls
        executor.check_finite()
        assert executor.updates_per_step == 2
    finally:
        executor.close()


def test_pipelining_assigns_every_layer_a_stage(fake_tf_ipu: Any) -> None:
    executor = build(micro_batch_size=2, gradient_accumulation=3, devices_per_replica=2)
    try:
        ((name, assignment),) = [c[:2] for c in fake_tf_ipu._keras.calls if c[0] == "set_pipeline_stage_assignment"]
        assert len(assignment) == len(executor.model.layers) and sorted(set(assignment)) == [0, 1]
        assert assignment == sorted(assignment)  # contiguous stages
        assert ("set_pipelining_options", 3, "mean") in fake_tf_ipu._keras.calls
        assert fake_tf_ipu.config.configured[0].auto_select_ipus == [2]
        executor.step()
    finally:
        executor.close()


def test_ipu_model_and_cache_are_poplar_flags_restored_on_close(
    fake_tf_ipu: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TF_POPLAR_FLAGS", "--log_cycle_count=0")
    executor = build(micro_batch_size=2, accelerator_options={"ipu_model": True, "executable_cache_dir": str(tmp_path)})
    flags = fake_tf_ipu.config.configured[0].poplar_flags.split()
    assert flags == ["--log_cycle_count=0", "--use_ipu_model", f"--executable_cache_path={tmp_path}"]
    assert fake_tf_ipu.config.running_on_ipu_model()
    executor.close()
    assert os.environ["TF_POPLAR_FLAGS"] == "--log_cycle_count=0"


def test_a_tensorflow_run_on_the_fake(fake_tf_ipu: Any) -> None:
    result = run(
        "fcnn",
        "graphcore",
        framework="tensorflow",
        workload_options=TINY_FCNN,
        micro_batch_size=4,
        gradient_accumulation=2,
        device_iterations=2,
        steps=2,
        warmup_steps=0,
        power_meter="none",
    )
    assert result.status.ok, result.status
    assert result.window_updates == 4 and result.samples_per_host_call == 16
    assert result.executor_details["runtime"] == "tensorflow-ipu"


def test_the_fake_refuses_what_ipu_keras_refuses(fake_tf_ipu: Any) -> None:
    import keras
    import numpy as np

    fake_tf_ipu.ipu_strategy.IPUStrategy()
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=3)
    model.set_gradient_accumulation_options(gradient_accumulation_steps_per_replica=2)
    with pytest.raises(
        RuntimeError, match=r"\(set to 3\) is not divisible by `gradient_accumulation_steps_per_replica` \(2\)"
    ):
        model.fit(np.zeros((6, 2)), np.zeros((6, 1)), batch_size=1, epochs=1, steps_per_epoch=3, verbose=0)
    model.set_pipeline_stage_assignment([0, 1])
    with pytest.raises(ValueError, match="pipelined, however `gradient_accumulation_steps_per_replica` has not been"):
        model.fit(np.zeros((6, 2)), np.zeros((6, 1)), batch_size=1, epochs=1, steps_per_epoch=3, verbose=0)
    with pytest.raises(ValueError, match="does not match the number of layers"):
        model.set_pipeline_stage_assignment([0])


def test_tensorflow_refuses_non_power_of_two_and_instances(fake_tf_ipu: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from core import ConfigError

    with pytest.raises(ConfigError, match="must be a power of two"):
        build(replicas=3)
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="TensorFlow path runs in one instance"):
        build(replicas=2)


def test_fcnn_builds_its_keras_model_on_the_sdks_tensorflow_2_6(monkeypatch: pytest.MonkeyPatch) -> None:
    # keras.utils.set_random_seed arrived in TensorFlow 2.7; the Poplar SDK's TensorFlow is 2.6.
    from tensorflow import keras

    from core.workloads.fcnn import Fcnn

    workload = Fcnn()
    spec = workload.build_keras(workload.parse_options(TINY_FCNN), 3)
    expected = [w.copy() for w in spec.make_model().get_weights()]
    monkeypatch.delattr(keras.utils, "set_random_seed")
    weights = spec.make_model().get_weights()
    assert len(weights) == len(expected) and all(w.shape == e.shape for w, e in zip(weights, expected))
    assert all((w == v).all() for w, v in zip(weights, spec.make_model().get_weights()))  # seeded: repeatable
