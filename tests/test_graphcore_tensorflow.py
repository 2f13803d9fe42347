"""The Graphcore plugin's TensorFlow path against a fake ``tensorflow.python.ipu`` loaded beside the
real TensorFlow: IPUConfig and IPUStrategy, Keras gradient accumulation and pipelining options,
steps_per_execution and the steps IPU Keras divides among replicas, the IPU Model flag, and
inference through ``model.predict``."""

from __future__ import annotations

import os
from typing import Any

import pytest

from core import run
from core.base.distributed import SINGLE_PROCESS
from core.contract.manager import get_plugin_manager
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
    # Two replicas divide the steps asked for: 3 per epoch leave each 1, and steps_per_execution (4, a
    # multiple of the accumulation as compiled) is cut to 1 (graphcore/keras data_adapter.py), which the
    # accumulation of 2 does not divide.
    model.set_pipeline_stage_assignment([0, 0])
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=4)
    with pytest.raises(RuntimeError, match=r"\(set to 1\) is not divisible"):
        model.fit(np.zeros((6, 2)), np.zeros((6, 1)), batch_size=1, epochs=1, steps_per_epoch=3, verbose=0)


def test_tensorflow_refuses_non_power_of_two(fake_tf_ipu: Any) -> None:
    from core import ConfigError

    with pytest.raises(ConfigError, match="must be a power of two"):
        build(replicas=3)


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


# --- replicas: what one host call runs ----------------------------------------------------------


def test_four_replicas_run_the_hand_calculated_updates_and_samples_per_call(fake_tf_ipu: Any) -> None:
    # micro-batch 2, gradient accumulation 3, 4 replicas, 2 device iterations. By hand: a host call
    # runs GA x D = 6 micro-batches on each replica, that is D = 2 weight updates, and
    # 2 x 3 x 4 x 2 = 48 samples. IPU Keras reads fit's steps_per_epoch over the 4 replicas together
    # and divides it by them, so the executor asks for 6 x 4 = 24.
    executor = build(micro_batch_size=2, gradient_accumulation=3, replicas=4, device_iterations=2)
    try:
        assert fake_tf_ipu.config.configured[-1].auto_select_ipus == [4]
        executor.step()
        assert ("fit", 6, 24) in fake_tf_ipu._keras.calls
        (plan,) = fake_tf_ipu._keras.executions
        assert plan["replicas"] == 4 and plan["micro_batches_per_replica"] == 6 and plan["executions"] == 1
        assert plan["weight_updates_per_execution"] == 2 == executor.updates_per_step
        assert plan["micro_batches"] * 2 == 48 == executor.details()["samples_per_host_call"]
        assert executor.details()["samples_per_update"] == 2 * 3 * 4
    finally:
        executor.close()


def test_a_four_replica_run_reports_the_hand_calculated_window(fake_tf_ipu: Any) -> None:
    result = run(
        "fcnn",
        "graphcore",
        framework="tensorflow",
        workload_options=TINY_FCNN,
        micro_batch_size=2,
        gradient_accumulation=3,
        replicas=4,
        device_iterations=2,
        steps=3,
        warmup_steps=0,
        power_meter="none",
    )
    assert result.status.ok, result.status
    assert result.samples_per_update == 24 and result.samples_per_host_call == 48
    assert result.window_updates == 3 * 2 and result.window_samples == 3 * 48
    assert [e["weight_updates_per_execution"] for e in fake_tf_ipu._keras.executions] == [2] * 4  # compile + 3


def test_the_fake_divides_steps_per_epoch_by_the_replicas_as_ipu_keras_does(fake_tf_ipu: Any) -> None:
    # What a caller that passes GA x D (not x replicas) gets from IPU Keras with 4 replicas
    # (graphcore/keras data_adapter.py, IPUDataHandler._infer_steps: steps // replication_factor).
    import keras
    import numpy as np

    cfg = fake_tf_ipu.config.IPUConfig()
    cfg.auto_select_ipus = 4
    cfg.configure_ipu_system()
    fake_tf_ipu.ipu_strategy.IPUStrategy()
    data = (np.zeros((64, 2), np.float32), np.zeros((64, 1), np.float32))

    def model_with(steps_per_execution: int, accumulation: int = 1) -> Any:
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse", steps_per_execution=steps_per_execution)
        if accumulation > 1:
            model.set_gradient_accumulation_options(gradient_accumulation_steps_per_replica=accumulation)
        return model

    with pytest.raises(ValueError, match="all 4 replicas are requested to run 1 steps each"):
        model_with(1).fit(*data, batch_size=1, steps_per_epoch=1, verbose=0)  # GA = D = 1: 0 steps each
    with pytest.raises(RuntimeError, match=r"\(set to 1\) is not divisible .* \(3\)"):
        model_with(6, 3).fit(*data, batch_size=1, steps_per_epoch=6, verbose=0)  # 6 // 4 = 1 < GA
    model_with(4).fit(*data, batch_size=1, steps_per_epoch=4, verbose=0)  # D = 4 asked, 1 update ran
    assert fake_tf_ipu._keras.executions[-1]["weight_updates_per_execution"] == 1
    model_with(4).fit(*data, batch_size=1, steps_per_epoch=16, verbose=0)  # x replicas: the 4 asked
    assert fake_tf_ipu._keras.executions[-1]["weight_updates_per_execution"] == 4


# --- one configuration per process ----------------------------------------------------------------


def test_the_fake_runs_a_second_configuration_with_the_first_flags(
    fake_tf_ipu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # flags.cc: PoplarXlaFlags::Get() parses TF_POPLAR_FLAGS once per process.
    cfg = fake_tf_ipu.config.IPUConfig()
    cfg.auto_select_ipus = 1
    cfg.configure_ipu_system()
    monkeypatch.setenv("TF_POPLAR_FLAGS", "--use_ipu_model")
    cfg.configure_ipu_system()
    assert [c.poplar_flags for c in fake_tf_ipu.config.configured] == ["", ""]


def test_a_second_different_configuration_in_one_process_is_refused_before_compiling(
    fake_tf_ipu: Any, tmp_path: Any
) -> None:
    from core import ConfigError

    build(micro_batch_size=2).close()
    build(micro_batch_size=4, replicas=2).close()  # the same TF_POPLAR_FLAGS: configured again, fine
    assert len(fake_tf_ipu.config.configured) == 2
    for options, field in (
        ({"ipu_model": True}, "accelerator_options.ipu_model"),
        ({"executable_cache_dir": str(tmp_path)}, "accelerator_options.executable_cache_dir"),
    ):
        with pytest.raises(ConfigError, match="reads TF_POPLAR_FLAGS once per process") as refused:
            build(micro_batch_size=2, accelerator_options=options)
        assert refused.value.field == field
    assert len(fake_tf_ipu.config.configured) == 2  # refused while planning, nothing configured


def test_the_executor_itself_refuses_a_second_configuration(fake_tf_ipu: Any) -> None:
    from core import ConfigError
    from core_plugins.graphcore.tensorflow import create_keras_executor

    build(micro_batch_size=2).close()
    plan = plan_run(get_plugin_manager(), "fcnn", "graphcore", _settings(micro_batch_size=2))
    options = plan.accelerator_options.model_copy(update={"ipu_model": True})
    placement = plan.accelerator.placement(plan.config, options)
    with pytest.raises(ConfigError, match="once per process"):
        create_keras_executor(
            plan.workload, plan.workload_options, plan.config, placement, options, precision=plan.precision_policy
        )
    assert len(fake_tf_ipu.config.configured) == 1


def _settings(**options: Any) -> dict[str, Any]:
    settings: dict[str, Any] = {"framework": "tensorflow", "workload_options": TINY_FCNN, "power_meter": "none"}
    settings.update(options)
    return settings


# --- instances under poprun (PopDist) -----------------------------------------------------------


def _as_poprun_instance(
    monkeypatch: pytest.MonkeyPatch, fake_sdk: Any, index: int, instances: int, replicas: int
) -> None:
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", str(instances))
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", str(index))
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", str(index))
    fake_sdk.popdist.environment = {
        "instances": instances,
        "instance_index": index,
        "total_replicas": replicas,
        "ipus_per_replica": 1,
    }


def test_an_instance_under_poprun_runs_its_replicas_through_popdist(
    fake_tf_ipu: Any, fake_sdk: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import numpy as np

    from core.workloads.fcnn import Fcnn
    from core_plugins.graphcore.placement import host_call_samples

    _as_poprun_instance(monkeypatch, fake_sdk, index=1, instances=2, replicas=4)
    executor = build(micro_batch_size=2, gradient_accumulation=3, replicas=4, device_iterations=2)
    try:
        import popdist.tensorflow

        assert popdist.tensorflow.calls == [("set_ipu_config", 1, True)]
        configured = fake_tf_ipu.config.configured[-1]
        assert configured.select_ipus == [popdist.getDeviceId(1)] and not configured.auto_select_ipus
        distribution = configured.experimental.multi_replica_distribution
        assert (distribution.process_count, distribution.process_index) == (2, 1)
        assert type(executor._system.strategy).__name__ == "PopDistStrategy" and fake_sdk.popdist.initialised
        executor.step()
        # This instance's 2 replicas: GA x D x 2 micro-batches asked for, 6 for each replica.
        assert ("fit", 6, 12) in fake_tf_ipu._keras.calls
        (plan,) = fake_tf_ipu._keras.executions
        assert plan["replicas"] == 2 and plan["weight_updates_per_execution"] == 2
        details = executor.details()
        assert details["instance_index"] == 1 and details["popdist_process_count"] == 2
        assert details["samples_per_host_call"] == 2 * 3 * 4 * 2  # the global batch of every instance
        # The synthetic samples are instance 1's share of each update.
        spec = Fcnn().build_keras(Fcnn().parse_options(TINY_FCNN), 0)
        placement = executor._placement
        first = np.concatenate([x for x, _ in executor._dataset.take(3 * 2).as_numpy_iterator()])
        wanted = np.asarray(host_call_samples(placement, 1))[: len(first)] % len(spec.inputs)
        assert np.array_equal(first, spec.inputs[wanted])
    finally:
        executor.close()


def test_tensorflow_instances_are_started_by_poprun(fake_tf_ipu: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from pathlib import Path

    from core_plugins.graphcore.launcher import PoprunLauncher

    fakes = Path(__file__).parent / "fakes" / "graphcore"
    monkeypatch.setenv("PATH", f"{fakes / 'bin'}{os.pathsep}{os.environ['PATH']}")
    plan = plan_run(
        get_plugin_manager(),
        "fcnn",
        "graphcore",
        _settings(micro_batch_size=20, gradient_accumulation=24, replicas=4, accelerator_options={"instances": 2}),
    )
    assert isinstance(plan.launcher, PoprunLauncher)
    command = plan.launcher.command(plan.context(SINGLE_PROCESS), ["core", "run"], Path("."))
    assert command[:7] == ["poprun", "--num-instances", "2", "--num-replicas", "4", "--ipus-per-replica", "1"]


def test_tensorflow_instances_refuse_what_popdist_cannot_run(
    fake_tf_ipu: Any, fake_sdk: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from core import ConfigError

    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")  # Open MPI's, but not poprun's PopDist variables
    with pytest.raises(ConfigError, match="variables only poprun sets") as refused:
        build(micro_batch_size=2, replicas=4)
    assert refused.value.field == "accelerator_options.instances"
    _as_poprun_instance(monkeypatch, fake_sdk, index=0, instances=2, replicas=8)
    with pytest.raises(ConfigError, match="poprun was started with --num-replicas 8"):
        build(micro_batch_size=2, replicas=4)
    with pytest.raises(ConfigError, match="multi_replica_distribution, which the IPU Model does not support"):
        build(micro_batch_size=2, replicas=8, accelerator_options={"ipu_model": True})


# --- distributed batch norm (batch_norm_span) ---------------------------------------------------


def test_batch_norm_span_gathers_statistics_over_replica_groups(fake_tf_ipu: Any) -> None:
    executor = build(micro_batch_size=2, replicas=4, accelerator_options={"batch_norm_span": 2})
    try:
        configured = fake_tf_ipu.config.configured[-1]
        assert configured.norms.experimental.distributed_batch_norm_replica_group_size == 2
        details = executor.details()
        assert details["batch_norm_span"] == 2 and details["distributed_batch_norm_replica_group_size"] == 2
    finally:
        executor.close()


@pytest.mark.parametrize(
    "settings,rule",
    [
        ({"replicas": 4, "span": 3}, r"must divide replicas \(4\); allowed: 1, 2, 4"),
        ({"replicas": 1, "span": 2}, r"must divide replicas \(1\); allowed: 1"),
        ({"replicas": 2, "span": 2, "devices_per_replica": 2, "gradient_accumulation": 3}, "not for model parallelism"),
        ({"replicas": 2, "span": 2, "mode": "inference"}, "inference normalises with the moving statistics"),
    ],
)
def test_a_batch_norm_span_ipu_tensorflow_cannot_run_is_refused(
    fake_tf_ipu: Any, settings: dict[str, Any], rule: str
) -> None:
    from core import ConfigError

    span = settings.pop("span")
    with pytest.raises(ConfigError, match=rule) as refused:
        build(micro_batch_size=2, accelerator_options={"batch_norm_span": span}, **settings)
    assert refused.value.field == "accelerator_options.batch_norm_span" and refused.value.value == span


def test_poptorch_refuses_a_batch_norm_span(fake_tf_ipu: Any) -> None:
    from core import ConfigError

    with pytest.raises(ConfigError, match="PopTorch normalises each replica's micro-batch on its own") as refused:
        plan_run(
            get_plugin_manager(),
            "fcnn",
            "graphcore",
            {"workload_options": TINY_FCNN, "replicas": 2, "accelerator_options": {"batch_norm_span": 2}},
        )
    assert refused.value.field == "accelerator_options.batch_norm_span"


# --- precision and the memory options ------------------------------------------------------------


def test_fp16_is_mixed_precision_with_dynamic_loss_scaling(fake_tf_ipu: Any) -> None:
    import keras

    executor = build(micro_batch_size=2, gradient_accumulation=2, precision="fp16")
    try:
        assert keras.mixed_precision.global_policy().name == "mixed_float16"
        assert executor.model.layers[0].compute_dtype == "float16"
        assert executor.model.layers[0].variable_dtype == "float32"  # fp32 master weights
        # Left alone, compile() wrapped the optimizer in a dynamic LossScaleOptimizer.
        assert type(executor.model.optimizer).__name__ == "LossScaleOptimizer"
        assert not [c for c in fake_tf_ipu._keras.calls if c[0] == "LossScaleOptimizer"]  # not the plugin's
        executor.step()
        executor.check_finite()
        details = executor.details()
        assert details["precision"] == "fp16" and details["mixed_precision_policy"] == "mixed_float16"
        assert details["loss_scaling"] == "dynamic" and details["loss_scale"] is None
    finally:
        executor.close()
    assert keras.mixed_precision.global_policy().name == "float32"  # restored


def test_a_static_loss_scale_partials_and_memory_proportion(fake_tf_ipu: Any) -> None:
    options = {"loss_scaling": 128.0, "partials_type": "half", "available_memory_proportion": 0.3}
    executor = build(micro_batch_size=2, precision="fp16", accelerator_options=options)
    try:
        assert ("LossScaleOptimizer", False, 128.0) in fake_tf_ipu._keras.calls
        configured = fake_tf_ipu.config.configured[-1]
        expected = {"partialsType": "half", "availableMemoryProportion": "0.3"}
        assert configured.matmuls.poplar_options == expected == configured.convolutions.poplar_options
        details = executor.details()
        assert details["loss_scaling"] == "static" and details["loss_scale"] == 128.0
        assert details["partials_type"] == "half" and details["available_memory_proportion"] == 0.3
        executor.step()
    finally:
        executor.close()


def test_the_fake_ipu_config_refuses_what_the_sdk_refuses(fake_tf_ipu: Any) -> None:
    cfg = fake_tf_ipu.config.IPUConfig()
    with pytest.raises(ValueError, match="'allow_recomputation' is not a valid attribute"):
        cfg.allow_recomputation = True
    with pytest.raises(TypeError, match="must be of type bool"):
        cfg.allow_recompute = 1
    cfg.auto_select_ipus = 1
    cfg.matmuls.poplar_options["availableMemoryProportion"] = 0.3  # not a string
    with pytest.raises(TypeError, match="expected one of: bytes, unicode"):
        cfg.configure_ipu_system()


@pytest.mark.parametrize(
    "settings,field,rule",
    [
        ({"accelerator_options": {"loss_scaling": 64.0}}, "loss_scaling", "applies to fp16 training"),
        (
            {"mode": "inference", "precision": "fp16", "accelerator_options": {"loss_scaling": 64.0}},
            "loss_scaling",
            "applies to fp16 training",
        ),
        ({"mode": "inference", "accelerator_options": {"recomputation": True}}, "recomputation", "false for inference"),
        ({"accelerator_options": {"layers_per_ipu": "0,4,4,4"}}, "layers_per_ipu", "pipeline_splits"),
        ({"accelerator_options": {"pipeline_splits": "dense"}}, "pipeline_splits", "devices_per_replica > 1"),
        (
            {"devices_per_replica": 2, "gradient_accumulation": 3, "accelerator_options": {"pipeline_splits": "a,b"}},
            "pipeline_splits",
            "name the 1 layer",
        ),
    ],
)
def test_options_the_tensorflow_path_cannot_honour_are_refused(
    fake_tf_ipu: Any, settings: dict[str, Any], field: str, rule: str
) -> None:
    from core import ConfigError

    with pytest.raises(ConfigError, match=rule) as refused:
        build(micro_batch_size=2, **settings)
    assert refused.value.field == f"accelerator_options.{field}"


def test_recomputation_of_a_pipelined_model(fake_tf_ipu: Any) -> None:
    executor = build(
        micro_batch_size=2, gradient_accumulation=3, devices_per_replica=2, accelerator_options={"recomputation": True}
    )
    try:
        assert fake_tf_ipu.config.configured[-1].allow_recompute is True
        ((_, kwargs),) = [c for c in fake_tf_ipu._keras.calls if c[0] == "pipelining_kwargs"]
        assert kwargs == {"recomputation_mode": fake_tf_ipu.pipelining_ops.RecomputationMode.Auto}
        executor.step()
        assert executor.details()["pipeline_recomputation_mode"] == "Auto"
        assert executor.details()["recomputation"] is True
    finally:
        executor.close()


# --- pipeline stages by layer name ------------------------------------------------------------------


def test_pipeline_splits_name_the_layers_where_stages_begin(fake_tf_ipu: Any) -> None:
    import keras

    keras.backend.clear_session()  # layer names from dense, dense_1, ...
    executor = build(
        micro_batch_size=2,
        gradient_accumulation=3,
        devices_per_replica=2,
        accelerator_options={"pipeline_splits": "dense_2"},
    )
    try:
        names = [layer.name for layer in executor.model.layers]
        assert names[:3] == ["dense", "dense_1", "dense_2"]
        assert executor.details()["pipeline_stage_assignment"] == [0, 0] + [1] * (len(names) - 2)
        executor.step()
    finally:
        executor.close()
    from core import ConfigError

    keras.backend.clear_session()
    with pytest.raises(ConfigError, match="layer 'nowhere' is not in the model; its layers in execution order: dense,"):
        build(
            micro_batch_size=2,
            gradient_accumulation=3,
            devices_per_replica=2,
            accelerator_options={"pipeline_splits": "nowhere"},
        )


def test_a_functional_model_is_pipelined_in_execution_order(fake_tf_ipu: Any) -> None:
    import keras

    from core_plugins.graphcore.placement import plan_placement
    from core_plugins.graphcore.tensorflow import assign_pipeline_stages

    fake_tf_ipu.ipu_strategy.IPUStrategy()
    inputs = keras.Input((4,))
    a = keras.layers.Dense(4, name="a")(inputs)
    b = keras.layers.Dense(4, name="b")(a)
    joined = keras.layers.Add(name="skip")([a, b])  # a skip connection across the split
    model = keras.Model(inputs, keras.layers.Dense(2, name="head")(joined))
    placement = plan_placement(
        micro_batch_size=1, gradient_accumulation=3, replicas=1, ipus_per_replica=2, device_iterations=1
    )
    assert assign_pipeline_stages(model, placement, ("b",)) == [0, 1, 1, 1]
    # The fake refuses what IPU Keras refuses: a layer fed from a later stage.
    assignments = model.get_pipeline_stage_assignment()
    for assignment, stage in zip(assignments, [1, 0, 1, 1]):
        assignment.pipeline_stage = stage
    with pytest.raises(ValueError, match="Layer b in pipeline stage 0 has a dependency from a pipeline stage"):
        model.set_pipeline_stage_assignment(assignments)


# --- real data: TFRecord files through tf.data -----------------------------------------------------


class _TinyImages:
    """A small image classifier for TFRecord tests: 8x8 RGB images, 4 classes."""

    @staticmethod
    def workload() -> Any:
        from typing import ClassVar

        from core.base.config import Framework
        from core.contract.workload import KerasTrainingSpec, Workload

        class TinyImages(Workload):
            name: ClassVar[str] = "tiny-images"
            frameworks: ClassVar[tuple[Framework, ...]] = (Framework.tensorflow,)
            data_formats: ClassVar[tuple[str, ...] | None] = ("tfrecord",)
            default_micro_batch_size: ClassVar[int] = 2

            def build_torch(self, options: Any, seed: int) -> Any:
                raise NotImplementedError

            def build_keras(self, options: Any, seed: int) -> KerasTrainingSpec:
                import numpy as np

                def make_model() -> Any:
                    from tensorflow import keras

                    return keras.Sequential(
                        [
                            keras.Input((8, 8, 3)),
                            keras.layers.Conv2D(4, 3),
                            keras.layers.GlobalAveragePooling2D(),
                            keras.layers.Dense(4, dtype="float32"),
                        ]
                    )

                def make_loss() -> Any:
                    from tensorflow import keras

                    return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

                def make_optimizer() -> Any:
                    from tensorflow import keras

                    return keras.optimizers.SGD(learning_rate=0.01)

                rng = np.random.default_rng(seed)
                return KerasTrainingSpec(
                    make_model=make_model,
                    make_loss=make_loss,
                    make_optimizer=make_optimizer,
                    inputs=rng.standard_normal((16, 8, 8, 3), dtype=np.float32),
                    targets=rng.integers(0, 4, size=16),
                )

        return TinyImages()


def write_tfrecord(path: Any, count: int) -> None:
    import numpy as np
    import tensorflow as tf

    with tf.io.TFRecordWriter(str(path)) as writer:
        for i in range(count):
            image = tf.io.encode_png(np.full((8, 8, 3), i % 256, np.uint8)).numpy()
            example = tf.train.Example(
                features=tf.train.Features(
                    feature={
                        "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image])),
                        "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 4])),
                    }
                )
            )
            writer.write(example.SerializeToString())


def test_a_tfrecord_dataset_feeds_ipu_keras(fake_tf_ipu: Any, tmp_path: Any) -> None:
    write_tfrecord(tmp_path / "train.tfrecord", 32)
    result = run(
        _TinyImages.workload(),
        "graphcore",
        framework="tensorflow",
        data=str(tmp_path / "train.tfrecord"),
        micro_batch_size=2,
        gradient_accumulation=2,
        replicas=2,
        steps=2,
        warmup_steps=0,
        power_meter="none",
    )
    assert result.status.ok, result.status
    details = result.executor_details
    assert details["data"] == "files" and details["data_format"] == "tfrecord"
    assert result.samples_per_host_call == 2 * 2 * 2


def test_each_instance_reads_its_shard_of_the_records(tmp_path: Any) -> None:
    from pathlib import Path

    from core.plugin import tfrecord_image_dataset

    write_tfrecord(tmp_path / "train.tfrecord", 8)

    def labels(shard: int) -> set[int]:
        dataset = tfrecord_image_dataset(Path(tmp_path), (8, 8, 3), 1, 0, num_shards=2, shard_index=shard)
        return {int(label[0]) for _, label in dataset.take(8).as_numpy_iterator()}

    assert labels(0) == {0, 2} and labels(1) == {1, 3}  # records 0, 2, 4, 6 and 1, 3, 5, 7


def test_only_what_ipu_tensorflow_can_feed_passes(fake_tf_ipu: Any, tmp_path: Any) -> None:
    from core import ConfigError
    from core_plugins.graphcore.tensorflow_settings import check_tensorflow_data

    write_tfrecord(tmp_path / "train.tfrecord", 4)
    with pytest.raises(ConfigError, match="places synthetic data on the device only"):
        plan_run(get_plugin_manager(), "fcnn", "graphcore", _settings(data="synthetic-host"))
    with pytest.raises(ConfigError, match="takes synthetic data only"):  # fcnn takes vectors, not images
        plan_run(get_plugin_manager(), "fcnn", "graphcore", _settings(data=str(tmp_path)))
    plan = plan_run(
        get_plugin_manager(), _TinyImages.workload(), "graphcore", _settings(data=str(tmp_path), workload_options={})
    )
    check_tensorflow_data(plan.config)
    with pytest.raises(ConfigError, match="reads TFRecord files through tf.data"):
        check_tensorflow_data(plan.config.model_copy(update={"data_format": "image-folder"}))
