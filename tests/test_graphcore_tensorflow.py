"""The Graphcore plugin's TensorFlow path against a fake ``tensorflow.python.ipu`` loaded beside the
real TensorFlow: IPUConfig and IPUStrategy, Keras gradient accumulation and pipelining options,
steps_per_execution and the steps IPU Keras divides among replicas, the IPU Model flag, and
inference through ``model.predict``."""

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
        # IPU Keras divides steps_per_epoch among the 2 replicas: 24 gives each its 12 micro-batches.
        assert ("fit", 12, 24) in fake_tf_ipu._keras.calls
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

    cfg = fake_tf_ipu.config.IPUConfig()
    cfg.auto_select_ipus = 1
    cfg.configure_ipu_system()
    fake_tf_ipu.ipu_strategy.IPUStrategy()
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=3)
    model.set_gradient_accumulation_options(gradient_accumulation_steps_per_replica=2)
    with pytest.raises(
        RuntimeError, match=r"\(set to 3\) is not divisible by `gradient_accumulation_steps_per_replica` \(2\)"
    ):
        model.fit(np.zeros((6, 2)), np.zeros((6, 1)), batch_size=1, epochs=1, steps_per_epoch=3, verbose=0)
    model.set_pipeline_stage_assignment([0, 1])
    with pytest.raises(ValueError, match="has 1 IPUs attached, however the current model requires a multiple of 2"):
        model.fit(np.zeros((6, 2)), np.zeros((6, 1)), batch_size=1, epochs=1, steps_per_epoch=3, verbose=0)
    cfg.auto_select_ipus = 2
    cfg.configure_ipu_system()
    with pytest.raises(ValueError, match="pipelined, however `gradient_accumulation_steps_per_replica` has not been"):
        model.fit(np.zeros((6, 2)), np.zeros((6, 1)), batch_size=1, epochs=1, steps_per_epoch=3, verbose=0)
    with pytest.raises(ValueError, match="does not match the number of layers"):
        model.set_pipeline_stage_assignment([0])
    # Two replicas divide the steps asked for: 3 per epoch leave each 1, and steps_per_execution is cut
    # to 1 (graphcore/keras data_adapter.py), which the accumulation of 2 does not divide.
    model.set_pipeline_stage_assignment([0, 0])
    with pytest.raises(RuntimeError, match=r"\(set to 1\) is not divisible"):
        model.fit(np.zeros((6, 2)), np.zeros((6, 1)), batch_size=1, epochs=1, steps_per_epoch=3, verbose=0)


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


# --- inference -------------------------------------------------------------------------------------


def test_inference_predicts_device_iterations_on_every_replica(fake_tf_ipu: Any) -> None:
    from core_plugins.graphcore.tensorflow import KerasIpuInferenceExecutor

    executor = build(mode="inference", micro_batch_size=2, replicas=2, device_iterations=3)
    try:
        assert isinstance(executor, KerasIpuInferenceExecutor)
        assert fake_tf_ipu.config.configured[0].auto_select_ipus == [2]
        assert executor.model.steps_per_execution == 3  # device iterations per replica; no accumulation
        executor.step()
        # steps counts over both replicas (IPU Keras divides it by the replication factor).
        assert ("predict", 3, 6) in fake_tf_ipu._keras.calls
        assert not [c for c in fake_tf_ipu._keras.calls if c[0] in ("fit", "set_gradient_accumulation_options")]
        # Every output of a host call comes back: micro-batch x replicas x device iterations.
        assert executor._last_outputs.shape == (2 * 2 * 3, TINY_FCNN["output_width"])
        executor.check_finite()
        details = executor.details()
        assert details["mode"] == "inference" and details["samples_per_host_call"] == 12
        assert details["steps_per_host_call"] == 6 and details["auto_select_ipus"] == [2]
    finally:
        executor.close()


def test_a_tensorflow_inference_run_on_the_fake(fake_tf_ipu: Any) -> None:
    result = run(
        "fcnn",
        "graphcore",
        framework="tensorflow",
        mode="inference",
        workload_options=TINY_FCNN,
        micro_batch_size=4,
        replicas=2,
        devices_per_replica=2,
        device_iterations=2,
        steps=2,
        warmup_steps=1,
        power_meter="none",
    )
    assert result.status.ok, result.status
    assert result.mode == "inference" and result.executor_details["runtime"] == "tensorflow-ipu"
    # micro 4 x replicas 2 x device iterations 2 per host call; 2 host calls in the window.
    assert result.samples_per_host_call == 16 and result.window_updates == 4 and result.window_samples == 32
    assert result.throughput_per_second == pytest.approx(32 / result.window_seconds)
    details = result.executor_details
    assert details["pipeline_stages"] == 2 and details["auto_select_ipus"] == [4]
    assert sorted(set(details["pipeline_stage_assignment"])) == [0, 1]
    # Pipelined predict is one pipeline steps_per_execution deep: no gradient accumulation is set.
    assert not [c for c in fake_tf_ipu._keras.calls if c[0] == "set_pipelining_options"]
    assert ("predict", 2, 4) in fake_tf_ipu._keras.calls


def test_pipelined_tensorflow_inference_needs_device_iterations_a_multiple_of_the_stages(fake_tf_ipu: Any) -> None:
    from core import ConfigError
    from core_plugins.graphcore.placement import plan_placement

    for device_iterations, rule in ((1, ">= 2"), (3, "multiple of the 2 pipeline stages")):
        with pytest.raises(ConfigError, match=rule) as caught:
            build(mode="inference", devices_per_replica=2, device_iterations=device_iterations)
        assert caught.value.field == "device_iterations"
    # PopTorch's own rule is only ``>=``: 3 device iterations over 2 stages are fine there.
    shape = {"micro_batch_size": 1, "gradient_accumulation": 1, "replicas": 1, "ipus_per_replica": 2}
    assert plan_placement(**shape, device_iterations=3, training=False, framework="torch").device_iterations == 3


def test_the_fake_refuses_the_pipeline_depth_poplar_refuses(fake_tf_ipu: Any) -> None:
    import keras
    import numpy as np
    import tensorflow as tf

    cfg = fake_tf_ipu.config.IPUConfig()
    cfg.auto_select_ipus = 2
    cfg.configure_ipu_system()
    fake_tf_ipu.ipu_strategy.IPUStrategy()
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2), keras.layers.Dense(1)])
    model.compile(steps_per_execution=3)
    model.set_pipeline_stage_assignment([0, 1])
    data = tf.data.Dataset.from_tensor_slices(np.zeros((6, 2), np.float32)).batch(1).repeat()
    with pytest.raises(tf.errors.FailedPreconditionError, match="must be a multiple of 2, but it is 3"):
        model.predict(data, steps=3, verbose=0)
    model.compile(steps_per_execution=4)
    assert model.predict(data, steps=4, verbose=0).shape == (4, 1)  # 2 IPUs, 2 stages: one replica
    model.set_pipeline_stage_assignment([0, 0])  # no longer pipelined: 2 replicas share the steps
    model.compile(steps_per_execution=2)
    with pytest.raises(ValueError, match=r"\(2\) must be a divisor of the number of batches \(3\)"):
        model.predict(data, steps=6, verbose=0)


def test_a_nan_output_fails_a_tensorflow_inference_run(fake_tf_ipu: Any) -> None:
    import tensorflow as tf

    from core import RunState
    from core.workloads.fcnn import Fcnn

    class NanOutputFcnn(Fcnn):
        name = "fcnn-nan-output"

        def build_keras(self, options: Any, seed: int) -> Any:
            spec = Fcnn.build_keras(self, options, seed)
            make_model = spec.make_model

            def nan_model() -> Any:
                model = make_model()
                bias = [layer.bias for layer in model.layers if getattr(layer, "bias", None) is not None][-1]
                bias.assign(tf.fill(bias.shape, float("nan")))
                return model

            spec.make_model = nan_model
            return spec

    result = run(
        NanOutputFcnn(),
        "graphcore",
        framework="tensorflow",
        mode="inference",
        workload_options=TINY_FCNN,
        micro_batch_size=2,
        steps=2,
        warmup_steps=0,
        power_meter="none",
    )
    assert result.status.state is RunState.non_finite_loss
    assert "NaN/inf" in str(result.status)
