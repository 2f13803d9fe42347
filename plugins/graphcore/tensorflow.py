"""The TensorFlow path: Keras on IPUs through the IPU build of TensorFlow 2 (``tensorflow.python.ipu``).

As the SDK's documentation and graphcore/examples do it: an ``ipu.config.IPUConfig`` selects the
IPUs (``auto_select_ipus``) and ``configure_ipu_system()`` applies it; the model is built and
compiled inside an ``ipu.ipu_strategy.IPUStrategy`` scope, which gives Keras models the IPU
extensions: ``set_gradient_accumulation_options`` (``gradient_accumulation_steps_per_replica``) or,
for a replica pipelined over several IPUs, ``set_pipeline_stage_assignment`` and
``set_pipelining_options``. The replication factor is not an option: IPU Keras derives it from the
IPUs selected (graphcore/keras ``keras/ipu/extensions/extensions_base.py``).

Training: one ``step()`` is one ``model.fit`` execution of ``steps_per_execution = gradient_accumulation
x device_iterations`` micro-batches per replica, that is ``device_iterations`` weight updates; since
SDK 2.5 ``steps_per_execution`` counts per replica and must be a multiple of the gradient
accumulation. Gradients are averaged over the accumulated micro-batches
(``gradient_accumulation_reduction_method="mean"``), as the other placements in core do.

Inference: one ``step()`` is one ``model.predict`` execution of ``steps_per_execution =
device_iterations`` forward passes per replica; every output comes back to the host through the
outfeed. Pipelined, ``predict`` runs one pipeline ``steps_per_execution`` deep: gradient
accumulation has no effect there (``set_pipelining_options``'s own documentation), so only the stage
assignment is set. Either way the first call compiles; the runner times it as the first step.

The IPU Model and the executable cache are ``TF_POPLAR_FLAGS`` (``--use_ipu_model``,
``--executable_cache_path=...``), read when the IPU system is configured; they are restored when
the executor closes. The ``ipu`` module is imported through :func:`import_ipu`, which tests replace.
"""

from __future__ import annotations

import math
import os
from typing import Any

from core.plugin import (
    ConfigError,
    Executor,
    HostStepClock,
    KerasTrainingSpec,
    NonFiniteLossError,
    RunConfig,
    StepClock,
    Workload,
)

from .pipeline import balance
from .placement import (
    IpuPlacement,
    check_steps_per_execution,
    host_call_samples,
    keras_steps_per_execution,
    keras_steps_per_host_call,
    tensorflow_ipus_per_instance,
)

POPLAR_FLAGS = "TF_POPLAR_FLAGS"


def import_ipu() -> Any:
    from tensorflow.python import ipu  # the IPU build of TensorFlow only

    return ipu


def poplar_flags(existing: str, ipu_model: bool, executable_cache_dir: str | None) -> str:
    """``TF_POPLAR_FLAGS`` with the IPU Model and cache flags added to what the user set."""
    flags = existing.split()
    if ipu_model and "--use_ipu_model" not in flags:
        flags.append("--use_ipu_model")
    if executable_cache_dir and not any(f.startswith("--executable_cache_path") for f in flags):
        flags.append(f"--executable_cache_path={executable_cache_dir}")
    return " ".join(flags)


def stage_assignment(model: Any, stages: int) -> list[int]:
    """The pipeline stage of each layer of a ``keras.Sequential``, balanced by parameter count."""
    layers = [(f"{i}:{layer.name}", int(layer.count_params())) for i, layer in enumerate(model.layers)]
    plan = balance(layers, stages)
    stage_of = plan.layer_to_stage
    return [stage_of[name] for name, _ in layers]


class IpuKerasSystem:
    """What every IPU Keras executor sets up before its model: ``TF_POPLAR_FLAGS`` for the run, the
    IPU system configured for the placement's IPUs, and the ``IPUStrategy`` to build the model in.
    ``close()`` restores the flags (they are read when the system is configured)."""

    def __init__(self, ipu: Any, placement: IpuPlacement, *, ipu_model: bool, executable_cache_dir: str | None) -> None:
        self._previous_flags = os.environ.get(POPLAR_FLAGS)
        os.environ[POPLAR_FLAGS] = poplar_flags(self._previous_flags or "", ipu_model, executable_cache_dir)
        self._closed = False
        try:
            self.config = ipu.config.IPUConfig()
            self.config.auto_select_ipus = tensorflow_ipus_per_instance(placement)
            self.config.configure_ipu_system()
            self.strategy = ipu.ipu_strategy.IPUStrategy()
        except BaseException:
            self.close()
            raise
        self._details: dict[str, Any] = {
            "auto_select_ipus": self.config.auto_select_ipus,
            "ipu_model": ipu_model,
            "executable_cache_dir": executable_cache_dir,
            POPLAR_FLAGS: os.environ[POPLAR_FLAGS],
        }

    def details(self) -> dict[str, Any]:
        return dict(self._details)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._previous_flags is None:
            os.environ.pop(POPLAR_FLAGS, None)
        else:
            os.environ[POPLAR_FLAGS] = self._previous_flags


def assign_pipeline_stages(model: Any, placement: IpuPlacement) -> list[int]:
    """Give every layer of a pipelined replica's ``keras.Sequential`` its stage (one per IPU)."""
    if not hasattr(model, "set_pipeline_stage_assignment") or not _is_sequential(model):
        raise ConfigError(
            "devices_per_replica",
            placement.ipus_per_replica,
            "pipelining a TensorFlow workload needs its model to be a keras.Sequential",
        )
    assignment = stage_assignment(model, placement.ipus_per_replica)
    model.set_pipeline_stage_assignment(list(assignment))
    return assignment


def host_call_dataset(spec: KerasTrainingSpec, placement: IpuPlacement, *, with_targets: bool) -> Any:
    """The synthetic pool as one host call reads it, in micro-batches, repeated without end."""
    import numpy as np
    import tensorflow as tf

    indices = np.asarray(host_call_samples(placement), dtype=np.int64) % len(spec.inputs)
    inputs = np.take(np.asarray(spec.inputs), indices, axis=0)
    if with_targets:
        slices: Any = (inputs, np.take(np.asarray(spec.targets), indices, axis=0))
    else:
        slices = inputs
    return tf.data.Dataset.from_tensor_slices(slices).batch(placement.micro_batch_size, drop_remainder=True).repeat()


class _KerasIpuExecutorBase(Executor):
    """The host side both IPU Keras executors share: a host call returns once the IPUs finished and
    their outfeed reached the host, so host timestamps time it."""

    _details: dict[str, Any]

    def __init__(self, placement: IpuPlacement, *, ipu: Any, ipu_model: bool, executable_cache_dir: str | None) -> None:
        """The IPU system and the host-call shape; the subclass builds its model in the strategy."""
        import tensorflow as tf

        self._tf = tf
        self._placement = placement
        self.updates_per_step = placement.device_iterations
        self.steps_per_execution = keras_steps_per_execution(placement)  # inference: device_iterations (GA 1)
        self.steps_per_host_call = keras_steps_per_host_call(placement)
        self._system = IpuKerasSystem(ipu, placement, ipu_model=ipu_model, executable_cache_dir=executable_cache_dir)

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
        *,
        ipu: Any,
        ipu_model: bool = False,
        executable_cache_dir: str | None = None,
    ) -> None:
        check_steps_per_execution(
            keras_steps_per_execution(placement), placement.gradient_accumulation, placement.replicas
        )
        super().__init__(placement, ipu=ipu, ipu_model=ipu_model, executable_cache_dir=executable_cache_dir)
        tf = self._tf
        try:
            with self._system.strategy.scope():
                self.model = spec.make_model()
                per_sample = spec.make_loss()

                def mean_loss(targets: Any, outputs: Any) -> Any:
                    return tf.reduce_mean(per_sample(targets, outputs))

                self.model.compile(
                    optimizer=spec.make_optimizer(), loss=mean_loss, steps_per_execution=self.steps_per_execution
                )
                assignment = None
                if placement.pipelined:
                    assignment = assign_pipeline_stages(self.model, placement)
                    self.model.set_pipelining_options(
                        gradient_accumulation_steps_per_replica=placement.gradient_accumulation,
                        gradient_accumulation_reduction_method="mean",
                    )
                elif placement.gradient_accumulation > 1:
                    self.model.set_gradient_accumulation_options(
                        gradient_accumulation_steps_per_replica=placement.gradient_accumulation,
                        gradient_accumulation_reduction_method="mean",
                    )

            self._dataset = host_call_dataset(spec, placement, with_targets=True)
            self._last_loss: float | None = None
            self._details: dict[str, Any] = {
                "framework": "tensorflow",
                "runtime": "tensorflow-ipu",
                "tensorflow_version": tf.__version__,
                **placement.summary(),
                "steps_per_execution": self.steps_per_execution,
                "steps_per_host_call": self.steps_per_host_call,
                "gradient_accumulation_reduction_method": "mean",
                "pipeline_stage_assignment": assignment,
            }
        except BaseException:
            self.close()
            raise

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
        *,
        ipu: Any,
        ipu_model: bool = False,
        executable_cache_dir: str | None = None,
    ) -> None:
        super().__init__(placement, ipu=ipu, ipu_model=ipu_model, executable_cache_dir=executable_cache_dir)
        tf = self._tf
        try:
            with self._system.strategy.scope():
                self.model = spec.make_model()
                # predict() needs neither loss nor optimizer; compile() carries steps_per_execution.
                self.model.compile(steps_per_execution=self.steps_per_execution)
                assignment = assign_pipeline_stages(self.model, placement) if placement.pipelined else None
            self._dataset = host_call_dataset(spec, placement, with_targets=False)
            self._last_outputs: Any = None
            self._details: dict[str, Any] = {
                "framework": "tensorflow",
                "runtime": "tensorflow-ipu",
                "mode": "inference",
                "tensorflow_version": tf.__version__,
                **placement.summary(),
                "steps_per_execution": self.steps_per_execution,
                "steps_per_host_call": self.steps_per_host_call,
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


def _is_sequential(model: Any) -> bool:
    return any(cls.__name__ == "Sequential" for cls in type(model).__mro__)


def create_keras_executor(
    workload: Workload, workload_options: Any, config: RunConfig, placement: IpuPlacement, options: Any
) -> Executor:
    from core.plugin import quiet_tensorflow_startup

    quiet_tensorflow_startup()  # before TensorFlow loads, as core's Keras executor does

    executor = KerasIpuInferenceExecutor if config.mode == "inference" else KerasIpuExecutor
    return executor(
        workload.build_keras(workload_options, config.seed),
        config,
        placement,
        ipu=import_ipu(),
        ipu_model=options.ipu_model,
        executable_cache_dir=options.executable_cache_dir or None,
    )
