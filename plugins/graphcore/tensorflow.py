"""The TensorFlow path: Keras on IPUs through the IPU build of TensorFlow 2 (``tensorflow.python.ipu``).

As the SDK's documentation and graphcore/examples do it: an ``ipu.config.IPUConfig`` selects the
IPUs and carries the Poplar options, ``configure_ipu_system()`` applies it, and the model is built
and compiled inside a distribution strategy's scope, which gives Keras models the IPU extensions:
``set_gradient_accumulation_options`` (``gradient_accumulation_steps_per_replica``) or, for a
replica pipelined over several IPUs, ``set_pipeline_stage_assignment`` and
``set_pipelining_options``. The replication factor is not an option: IPU Keras derives it from the
IPUs of the configured device (graphcore/keras ``keras/ipu/extensions/extensions_base.py``,
``_get_replication_factor``).

One instance: ``IPUConfig.auto_select_ipus`` and ``ipu_strategy.IPUStrategy``. Several instances
under poprun, as Graphcore's TF2 examples run them (``vision/cnns/tensorflow2/ipu_config.py`` and
``train.py``; ``tutorials/feature_examples/tensorflow2/popdist``):
``popdist.tensorflow.set_ipu_config(config, ipus_per_replica=..., configure_device=True)`` selects
the device poprun reserved and this process's share of the replicas, and
``ipu.distributed.popdist_strategy.PopDistStrategy`` reduces across every instance's replicas.
IPU Keras then divides the device's IPUs by the instances (``_get_num_ipus``): each process's
replication factor is its own replicas.

Training: one ``step()`` is one ``model.fit`` execution of ``steps_per_execution = gradient_accumulation
x device_iterations`` micro-batches per replica, that is ``device_iterations`` weight updates; since
SDK 2.5 ``steps_per_execution`` counts per replica and must be a multiple of the gradient
accumulation. ``fit``'s ``steps_per_epoch`` counts micro-batches over this instance's replicas
together (IPU Keras divides it by the replication factor: ``keras_steps_per_host_call``).
Gradients are averaged over the accumulated micro-batches
(``gradient_accumulation_reduction_method="mean"``), as the other placements in core do.

Inference: one ``step()`` is one ``model.predict`` execution of ``steps_per_execution =
device_iterations`` forward passes per replica; every output comes back to the host through the
outfeed. Pipelined, ``predict`` runs one pipeline ``steps_per_execution`` deep: gradient
accumulation has no effect there (``set_pipelining_options``'s own documentation), so only the stage
assignment is set. Either way the first call compiles; the runner times it as the first step.

Precision, loss scaling, the memory options, recomputation and distributed batch norm are decided
in :mod:`.tensorflow_settings`. The IPU Model and the executable cache are ``TF_POPLAR_FLAGS``
(``--use_ipu_model``, ``--executable_cache_path=...``), which Poplar reads once per process: the
first configuration is remembered and a different one refused. The flags are restored when the
executor closes. The ``ipu`` module is imported through :func:`import_ipu`, which tests replace.
"""

from __future__ import annotations

import importlib
import math
import os
from pathlib import Path
from typing import Any

from core.plugin import (
    ConfigError,
    Executor,
    HostStepClock,
    KerasTrainingSpec,
    NonFiniteLossError,
    PipelineLayout,
    PrecisionPolicy,
    RunConfig,
    StepClock,
    Workload,
)

from .pipeline import balance
from .placement import (
    IpuPlacement,
    PoprunProcess,
    check_steps_per_execution,
    host_call_samples,
    keras_steps_per_execution,
    keras_steps_per_host_call,
    tensorflow_ipus_per_instance,
)
from .tensorflow_settings import (
    PIPELINE_RECOMPUTATION_MODE,
    POPLAR_FLAGS,
    IpuKerasSettings,
    PoplarProcessConfiguration,
    claim_process_configuration,
    ipu_keras_settings,
    poplar_flags,
)

__all__ = ["POPLAR_FLAGS", "create_keras_executor", "import_ipu", "poplar_flags"]

#: where PopDistStrategy lives; ``tensorflow.python.ipu`` does not import its ``distributed`` package
POPDIST_STRATEGY_MODULE = "tensorflow.python.ipu.distributed.popdist_strategy"
PIPELINING_OPS_MODULE = "tensorflow.python.ipu.ops.pipelining_ops"


def import_ipu() -> Any:
    from tensorflow.python import ipu  # the IPU build of TensorFlow only

    return ipu


class IpuKerasSystem:
    """What every IPU Keras executor sets up before its model: ``TF_POPLAR_FLAGS`` for the run, the
    IPU system configured for this instance's IPUs with the run's Poplar options, the Keras dtype
    policy, and the strategy to build the model in. ``close()`` restores the flags and the policy."""

    def __init__(
        self,
        ipu: Any,
        placement: IpuPlacement,
        settings: IpuKerasSettings,
        *,
        ipu_model: bool,
        executable_cache_dir: str | None,
        popdist: Any = None,
    ) -> None:
        from tensorflow import keras

        self._keras = keras
        requested = PoplarProcessConfiguration.for_run(ipu_model, executable_cache_dir)
        claim_process_configuration(requested)  # before anything reads the flags
        self._previous_flags = os.environ.get(POPLAR_FLAGS)
        self._previous_policy = keras.mixed_precision.global_policy()
        os.environ[POPLAR_FLAGS] = requested.flags
        self._closed = False
        try:
            # Layers read the global policy when they are built: set before the model is made.
            keras.mixed_precision.set_global_policy(settings.keras_policy)
            self.config = ipu.config.IPUConfig()
            self.config.allow_recompute = settings.recomputation
            self.config.matmuls.poplar_options.update(settings.poplar_options())
            self.config.convolutions.poplar_options.update(settings.poplar_options())
            self.config.norms.experimental.distributed_batch_norm_replica_group_size = settings.batch_norm_span
            device: dict[str, Any]
            if popdist is None:
                self.config.auto_select_ipus = tensorflow_ipus_per_instance(placement)
                self.config.configure_ipu_system()
                self.strategy = ipu.ipu_strategy.IPUStrategy()
                device = {"auto_select_ipus": self.config.auto_select_ipus}
            else:
                popdist.tensorflow.set_ipu_config(
                    self.config, ipus_per_replica=placement.ipus_per_replica, configure_device=True
                )
                self.config.configure_ipu_system()
                self.strategy = importlib.import_module(POPDIST_STRATEGY_MODULE).PopDistStrategy()
                distribution = self.config.experimental.multi_replica_distribution
                device = {
                    "select_ipus": self.config.select_ipus,
                    "popdist_process_index": distribution.process_index,
                    "popdist_process_count": distribution.process_count,
                    "strategy": "PopDistStrategy",
                }
        except BaseException:
            self.close()
            raise
        self._details: dict[str, Any] = {
            **device,
            "ipu_model": ipu_model,
            "executable_cache_dir": executable_cache_dir,
            POPLAR_FLAGS: os.environ[POPLAR_FLAGS],
            "allow_recompute": settings.recomputation,
        }

    def details(self) -> dict[str, Any]:
        return dict(self._details)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._keras.mixed_precision.set_global_policy(self._previous_policy)
        if self._previous_flags is None:
            os.environ.pop(POPLAR_FLAGS, None)
        else:
            os.environ[POPLAR_FLAGS] = self._previous_flags


def balanced_block_splits(names: list[str], params: list[int], stages: int, blocks: tuple[str, ...]) -> tuple[str, ...]:
    """Split layers (a block's first layer each) that keep every block whole and minimise the largest
    stage's parameters; the layers before the first block weigh on the first stage."""
    weights: dict[str, int] = dict.fromkeys(blocks, 0)
    current = blocks[0]
    for name, count in zip(names, params):
        current = name if name in weights else current
        weights[current] += count
    plan = balance(list(weights.items()), stages)
    return tuple(stage.layers[0] for stage in plan.stages[1:])


def stage_of_each(
    names: list[str], params: list[int], stages: int, splits: tuple[str, ...], blocks: tuple[str, ...] = ()
) -> list[int]:
    """The pipeline stage of each layer invocation, in execution order: a new stage begins at each
    split's layer (in order, as graphcore/examples' ``ModelFactory.pipeline_model`` assigns them),
    else the workload's blocks balanced by parameter count, else every layer balanced so."""
    if not splits and blocks:
        splits = balanced_block_splits(names, params, stages, blocks)
    if not splits:
        keyed = [(f"{i}:{name}", count) for i, (name, count) in enumerate(zip(names, params))]
        stage_of = balance(keyed, stages).layer_to_stage
        return [stage_of[key] for key, _ in keyed]
    assignment, stage = [], 0
    for name in names:
        if stage < len(splits) and name == splits[stage]:
            stage += 1
        assignment.append(stage)
    if stage < len(splits):
        where = f" after {splits[stage - 1]!r}" if stage else ""
        raise ConfigError(
            "accelerator_options.pipeline_splits",
            ",".join(splits),
            f"layer {splits[stage]!r} is not in the model{where}; its layers in execution order: {', '.join(names)}",
        )
    return assignment


def assign_pipeline_stages(
    model: Any, placement: IpuPlacement, splits: tuple[str, ...], blocks: tuple[str, ...] = ()
) -> list[int]:
    """Give every layer invocation of a pipelined replica its stage (one stage per IPU), through IPU
    Keras's assignment objects, which Sequential and Functional models both return in execution
    order (``get_pipeline_stage_assignment``)."""
    if not hasattr(model, "get_pipeline_stage_assignment"):
        raise ConfigError(
            "devices_per_replica",
            placement.ipus_per_replica,
            f"IPU Keras pipelines Sequential and Functional models; this workload's is a {type(model).__name__}",
        )
    assignments = model.get_pipeline_stage_assignment()
    nested = [a.layer.name for a in assignments if a.is_nested_model]
    if nested:
        raise ConfigError(
            "devices_per_replica",
            placement.ipus_per_replica,
            f"the model nests models ({', '.join(nested)}), whose layers core does not split into stages: 1",
        )
    names = [a.layer.name for a in assignments]
    params = [int(a.layer.count_params()) for a in assignments]
    stages = stage_of_each(names, params, placement.ipus_per_replica, splits, blocks)
    for assignment, stage in zip(assignments, stages):
        assignment.pipeline_stage = stage
    model.set_pipeline_stage_assignment(assignments)
    return stages


def host_call_dataset(
    spec: KerasTrainingSpec, placement: IpuPlacement, instance_index: int, *, with_targets: bool
) -> Any:
    """The synthetic pool as one host call of this instance reads it, in micro-batches, repeated."""
    import numpy as np
    import tensorflow as tf

    indices = np.asarray(host_call_samples(placement, instance_index), dtype=np.int64) % len(spec.inputs)
    inputs = np.take(np.asarray(spec.inputs), indices, axis=0)
    if with_targets:
        slices: Any = (inputs, np.take(np.asarray(spec.targets), indices, axis=0))
    else:
        slices = inputs
    return tf.data.Dataset.from_tensor_slices(slices).batch(placement.micro_batch_size, drop_remainder=True).repeat()


def file_dataset(
    spec: KerasTrainingSpec, config: RunConfig, placement: IpuPlacement, instance_index: int, *, with_targets: bool
) -> Any:
    """TFRecord images through core's tf.data reader, in micro-batches: IPU Keras's infeed hands
    each replica its micro-batches. Each instance reads its shard of the records, as Graphcore's
    TF2 popdist example shards its dataset by instance."""
    from core.plugin import tfrecord_image_dataset

    image_shape = tuple(spec.inputs.shape[1:])
    if len(image_shape) != 3:
        raise ConfigError(
            "data",
            config.data,
            f"TFRecord files hold images [H, W, C]; this workload's inputs are {image_shape}: synthetic",
        )
    dataset = tfrecord_image_dataset(
        Path(config.data),
        image_shape,
        placement.micro_batch_size,
        config.seed,
        num_shards=placement.instances,
        shard_index=instance_index,
    )
    return dataset if with_targets else dataset.map(lambda images, _labels: images)


class _KerasIpuExecutorBase(Executor):
    """The host side both IPU Keras executors share: a host call returns once the IPUs finished and
    their outfeed reached the host, so host timestamps time it."""

    _details: dict[str, Any]

    def __init__(
        self,
        spec: KerasTrainingSpec,
        config: RunConfig,
        placement: IpuPlacement,
        settings: IpuKerasSettings,
        *,
        ipu: Any,
        ipu_model: bool,
        executable_cache_dir: str | None,
        process: PoprunProcess | None,
        popdist: Any,
    ) -> None:
        """The IPU system, the host-call shape and the data; the subclass builds its model in the strategy."""
        import tensorflow as tf

        self._tf = tf
        self._placement = placement
        self._settings = settings
        self.updates_per_step = placement.device_iterations
        self.steps_per_execution = keras_steps_per_execution(placement)  # inference: device_iterations (GA 1)
        self.steps_per_host_call = keras_steps_per_host_call(placement)
        self._system = IpuKerasSystem(
            ipu, placement, settings, ipu_model=ipu_model, executable_cache_dir=executable_cache_dir, popdist=popdist
        )
        try:
            instance_index = process.instance_index if process is not None else 0
            training = config.mode == "train"
            if config.data == "synthetic":
                self._dataset = host_call_dataset(spec, placement, instance_index, with_targets=training)
            else:
                self._dataset = file_dataset(spec, config, placement, instance_index, with_targets=training)
            self._common: dict[str, Any] = {
                "framework": "tensorflow",
                "runtime": "tensorflow-ipu",
                "tensorflow_version": tf.__version__,
                **placement.summary(),
                **settings.details(),
                "steps_per_execution": self.steps_per_execution,
                "steps_per_host_call": self.steps_per_host_call,
                "instance_index": instance_index,
                "data": "synthetic" if config.data == "synthetic" else "files",
                "data_format": None if config.data == "synthetic" else "tfrecord",
            }
        except BaseException:
            self.close()
            raise

    def synchronize(self) -> None:
        # fit() and predict() return after the execution finished and its outfeed reached the host.
        pass

    def step_clock(self) -> StepClock:
        return HostStepClock()

    def details(self) -> dict[str, Any]:
        return {**self._details, **self._system.details()}

    def framework_version(self) -> str:
        return str(self._tf.__version__)

    def close(self) -> None:
        self._system.close()


class KerasIpuExecutor(_KerasIpuExecutorBase):
    def __init__(
        self,
        spec: KerasTrainingSpec,
        config: RunConfig,
        placement: IpuPlacement,
        settings: IpuKerasSettings,
        *,
        ipu: Any,
        ipu_model: bool = False,
        executable_cache_dir: str | None = None,
        process: PoprunProcess | None = None,
        popdist: Any = None,
    ) -> None:
        check_steps_per_execution(
            keras_steps_per_execution(placement), placement.gradient_accumulation, placement.replicas
        )
        super().__init__(
            spec,
            config,
            placement,
            settings,
            ipu=ipu,
            ipu_model=ipu_model,
            executable_cache_dir=executable_cache_dir,
            process=process,
            popdist=popdist,
        )
        tf = self._tf
        try:
            with self._system.strategy.scope():
                self.model = spec.make_model()
                per_sample = spec.make_loss()

                def mean_loss(targets: Any, outputs: Any) -> Any:
                    # float32 whatever the policy: a float16 mean over a micro-batch can overflow
                    return tf.reduce_mean(tf.cast(per_sample(targets, outputs), tf.float32))

                self.model.compile(
                    optimizer=self._optimizer(spec), loss=mean_loss, steps_per_execution=self.steps_per_execution
                )
                assignment = None
                if placement.pipelined:
                    assignment = assign_pipeline_stages(
                        self.model, placement, settings.pipeline_splits, settings.pipeline_blocks
                    )
                    self.model.set_pipelining_options(
                        gradient_accumulation_steps_per_replica=placement.gradient_accumulation,
                        gradient_accumulation_reduction_method="mean",
                        **self._recomputation_mode(),
                    )
                elif placement.gradient_accumulation > 1:
                    self.model.set_gradient_accumulation_options(
                        gradient_accumulation_steps_per_replica=placement.gradient_accumulation,
                        gradient_accumulation_reduction_method="mean",
                    )
            self._last_loss: float | None = None
            self._details: dict[str, Any] = {
                **self._common,
                "gradient_accumulation_reduction_method": "mean",
                "pipeline_stage_assignment": assignment,
                "pipeline_balanced_by": settings.pipeline_rule if assignment is not None else None,
                "pipeline_recomputation_mode": PIPELINE_RECOMPUTATION_MODE if self._recomputation_mode() else None,
                "optimizer": type(self.model.optimizer).__name__,
            }
        except BaseException:
            self.close()
            raise

    def _optimizer(self, spec: KerasTrainingSpec) -> Any:
        """The workload's optimizer; under fp16 with a static loss scale, wrapped to scale by it (left
        alone, Keras's compile wraps it in a dynamic LossScaleOptimizer under mixed_float16)."""
        optimizer = spec.make_optimizer()
        scale = self._settings.static_loss_scale
        if self._settings.loss_scaling == "static" and scale is not None:
            from tensorflow import keras

            optimizer = keras.mixed_precision.LossScaleOptimizer(optimizer, dynamic=False, initial_scale=scale)
        return optimizer

    def _recomputation_mode(self) -> dict[str, Any]:
        """``set_pipelining_options``'s recomputation mode, forwarded to ``pipelining_ops.pipeline``."""
        if not (self._settings.recomputation and self._placement.pipelined):
            return {}
        modes = importlib.import_module(PIPELINING_OPS_MODULE).RecomputationMode
        return {"recomputation_mode": getattr(modes, PIPELINE_RECOMPUTATION_MODE)}

    def step(self) -> None:
        # One execution: steps_per_execution micro-batches per replica, device_iterations updates.
        with self._system.strategy.scope():
            history = self.model.fit(
                self._dataset, epochs=1, steps_per_epoch=self.steps_per_host_call, shuffle=False, verbose=0
            )
        self._last_loss = float(history.history["loss"][-1])

    def check_finite(self) -> None:
        if self._last_loss is not None and not math.isfinite(self._last_loss):
            raise NonFiniteLossError(f"loss is {self._last_loss} (not finite)")


class KerasIpuInferenceExecutor(_KerasIpuExecutorBase):
    """Forward passes on IPUs: ``model.predict`` over the same IPU system, strategy and pipeline
    stages as training. No optimizer, loss or gradient accumulation; every output of every replica
    comes back to the host, and the last host call's are checked for NaN/inf at phase boundaries
    (as the PopTorch inference executor checks its last call's)."""

    def __init__(
        self,
        spec: KerasTrainingSpec,
        config: RunConfig,
        placement: IpuPlacement,
        settings: IpuKerasSettings,
        *,
        ipu: Any,
        ipu_model: bool = False,
        executable_cache_dir: str | None = None,
        process: PoprunProcess | None = None,
        popdist: Any = None,
    ) -> None:
        super().__init__(
            spec,
            config,
            placement,
            settings,
            ipu=ipu,
            ipu_model=ipu_model,
            executable_cache_dir=executable_cache_dir,
            process=process,
            popdist=popdist,
        )
        try:
            with self._system.strategy.scope():
                self.model = spec.make_model()
                # predict() needs neither loss nor optimizer; compile() carries steps_per_execution.
                self.model.compile(steps_per_execution=self.steps_per_execution)
                assignment = (
                    assign_pipeline_stages(self.model, placement, settings.pipeline_splits, settings.pipeline_blocks)
                    if placement.pipelined
                    else None
                )
            self._last_outputs: Any = None
            self._details: dict[str, Any] = {
                **self._common,
                "mode": "inference",
                "pipeline_stage_assignment": assignment,
            }
        except BaseException:
            self.close()
            raise

    def step(self) -> None:
        # One execution: device_iterations forward passes per replica, all outputs to the host.
        with self._system.strategy.scope():
            self._last_outputs = self.model.predict(self._dataset, steps=self.steps_per_host_call, verbose=0)

    def check_finite(self) -> None:
        import numpy as np

        # The outputs are on the host already: checking the last call's costs no device sync.
        if self._last_outputs is None:
            return
        for output in self._tf.nest.flatten(self._last_outputs):
            values = np.asarray(output)
            if np.issubdtype(values.dtype, np.floating) and not bool(np.isfinite(values).all()):
                raise NonFiniteLossError("a model output was NaN/inf in the last host call")


def create_keras_executor(
    workload: Workload,
    workload_options: Any,
    config: RunConfig,
    placement: IpuPlacement,
    options: Any,
    *,
    process: PoprunProcess | None = None,
    popdist: Any = None,
    layout: PipelineLayout | None = None,
    precision: type[PrecisionPolicy],
) -> Executor:
    """The IPU Keras executor of ``config.mode``; ``popdist`` (with ``popdist.tensorflow`` imported)
    for an instance that poprun started; ``layout`` the workload's Keras blocks for pipelining;
    ``precision`` the run's precision policy (``RunContext.precision_policy``)."""
    from core.plugin import quiet_tensorflow_startup

    quiet_tensorflow_startup()  # before TensorFlow loads, as core's Keras executor does

    settings = ipu_keras_settings(config, options, placement, layout, policy=precision)
    executor = KerasIpuInferenceExecutor if config.mode == "inference" else KerasIpuExecutor
    return executor(
        workload.build_keras(workload_options, config.seed),
        config,
        placement,
        settings,
        ipu=import_ipu(),
        ipu_model=options.ipu_model,
        executable_cache_dir=options.executable_cache_dir or None,
        process=process,
        popdist=popdist,
    )
