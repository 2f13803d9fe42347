"""What the TensorFlow path sets on the IPUs beyond the placement, decided and checked before
TensorFlow is imported: precision and loss scaling, the Poplar memory options, recomputation,
distributed batch norm, named pipeline splits, the data source, and the one ``TF_POPLAR_FLAGS``
a process can have.

Pure Python, no SDK: the accelerator's ``validate_run`` calls :func:`check_tensorflow_run` while
planning, so a bad value is refused (``ConfigError`` naming the field, the value and what is
allowed) before anything compiles. Where each setting lands in the SDK (3.3, TensorFlow 2.6):

- precision fp16 is Graphcore's "16.32" mixed precision: the Keras ``mixed_float16`` policy, float16
  compute with float32 variables (graphcore/examples ``vision/cnns/tensorflow2/precision.py``;
  graphcore/keras ``keras/ipu/mixed_precision_test.py`` trains under it with ``IPUStrategy`` and
  ``PopDistStrategy``). Loss scaling: under that policy Keras's ``compile`` wraps the optimizer in
  a dynamic ``LossScaleOptimizer`` (graphcore/keras ``keras/engine/training.py``,
  ``_get_optimizer``); ``loss_scaling`` makes it static, ``LossScaleOptimizer(optimizer,
  dynamic=False, initial_scale=...)`` (``keras/mixed_precision/loss_scale_optimizer.py``).
- ``partials_type`` and ``available_memory_proportion`` are PopLibs options of every matmul and
  convolution: ``IPUConfig.matmuls.poplar_options`` and ``.convolutions.poplar_options``, keys
  ``partialsType`` ("float" / "half") and ``availableMemoryProportion``, values strings
  (graphcore/tensorflow ``tensorflow/python/ipu/config.py``, ``_MatmulConfig``; set so in
  graphcore/examples ``vision/cnns/tensorflow2/ipu_config.py``).
- ``recomputation``: ``IPUConfig.allow_recompute``; a pipelined model also gets
  ``set_pipelining_options(recomputation_mode=RecomputationMode.Auto)``, which only applies when
  ``allow_recompute`` is set (``tensorflow/python/ipu/ops/pipelining_ops.py``, ``pipeline``).
- ``batch_norm_span``: ``IPUConfig.norms.experimental.distributed_batch_norm_replica_group_size``,
  "how many replicas to aggregate the batch statistics across" when training (``config.py``,
  ``_NormsExperimentalConfig``); it "should not be used when using model parallelism
  (pipelining)", and graphcore/examples refuses a group size that does not divide the replicas
  (``vision/cnns/tensorflow2/configuration/terminal_argparse.py``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from core.plugin import SYNTHETIC_SOURCES, ConfigError, PipelineLayout, Precision, PrecisionPolicy, RunConfig

from .pipeline import choose_split_points
from .placement import IpuPlacement

POPLAR_FLAGS = "TF_POPLAR_FLAGS"

#: the dtypes IPUs compute in (no bfloat16, no TF32)
IPU_COMPUTE_DTYPES = ("float32", "float16")

#: the recomputation mode a pipelined model gets (``pipelining_ops.RecomputationMode`` member name):
#: the SDK's default, which picks the strategy for the model and the pipeline schedule
PIPELINE_RECOMPUTATION_MODE = "Auto"

#: what core synthesises on the device, the one synthetic source IPU Keras is fed from
_SYNTHETIC = SYNTHETIC_SOURCES[0]


def poplar_flags(existing: str, ipu_model: bool, executable_cache_dir: str | None) -> str:
    """``TF_POPLAR_FLAGS`` with the IPU Model and cache flags added to what the user set."""
    flags = existing.split()
    if ipu_model and "--use_ipu_model" not in flags:
        flags.append("--use_ipu_model")
    if executable_cache_dir and not any(f.startswith("--executable_cache_path") for f in flags):
        flags.append(f"--executable_cache_path={executable_cache_dir}")
    return " ".join(flags)


# --- one configuration per process ------------------------------------------------------------


@dataclass(frozen=True)
class PoplarProcessConfiguration:
    """The ``TF_POPLAR_FLAGS`` a run configures the IPU system with, and the options they come from."""

    flags: str
    ipu_model: bool
    executable_cache_dir: str | None

    @classmethod
    def for_run(cls, ipu_model: bool, executable_cache_dir: str | None) -> PoplarProcessConfiguration:
        """What a run with these options sets, on top of the flags in this process's environment."""
        flags = poplar_flags(os.environ.get(POPLAR_FLAGS, ""), ipu_model, executable_cache_dir)
        return cls(flags, ipu_model, executable_cache_dir)


# Poplar parses TF_POPLAR_FLAGS once per process: PoplarXlaFlags::Get() returns a function-level
# static built from the environment on first use (graphcore/tensorflow, r2.6/sdk-release-3.3,
# tensorflow/compiler/plugin/poplar/driver/tools/flags.cc). A later configuration's flags are
# silently ignored, so the first one applied here is remembered and any other is refused.
_configured: PoplarProcessConfiguration | None = None


def check_one_configuration_per_process(requested: PoplarProcessConfiguration) -> None:
    """Refuse ``requested`` when this process already configured IPU TensorFlow differently."""
    first = _configured
    if first is None or first.flags == requested.flags:
        return
    why = (
        f"this process already configured IPU TensorFlow with TF_POPLAR_FLAGS={first.flags!r}, and Poplar reads "
        "TF_POPLAR_FLAGS once per process, so a second configuration would silently run with the first's flags; "
        "run it in a process of its own (core sweep starts one per run)"
    )
    if first.ipu_model != requested.ipu_model:
        raise ConfigError("accelerator_options.ipu_model", requested.ipu_model, f"{first.ipu_model}: {why}")
    if first.executable_cache_dir != requested.executable_cache_dir:
        raise ConfigError(
            "accelerator_options.executable_cache_dir",
            requested.executable_cache_dir or "",
            f"{first.executable_cache_dir or ''!r}: {why}",
        )
    raise ConfigError(POPLAR_FLAGS, requested.flags, f"{first.flags!r}: {why}")


def claim_process_configuration(requested: PoplarProcessConfiguration) -> None:
    """Record ``requested`` as this process's configuration, refusing it if another came first."""
    global _configured
    check_one_configuration_per_process(requested)
    _configured = requested


# --- what the run sets -----------------------------------------------------------------------


@dataclass(frozen=True)
class IpuKerasSettings:
    """The TensorFlow path's settings of one run, validated; build them with :func:`ipu_keras_settings`."""

    #: the run's precision policy: its Keras dtype policy and whether it scales the loss
    policy: type[PrecisionPolicy]
    training: bool
    static_loss_scale: float | None  # None: fp16 training scales the loss dynamically (Keras)
    partials_type: str | None  # None: PopLibs' default, float
    available_memory_proportion: float | None  # None: PopLibs' default
    recomputation: bool
    batch_norm_span: int
    pipeline_splits: tuple[str, ...]  # layer names where stages 2.. begin; () balances by parameters
    #: how the splits were chosen (recorded in the result)
    pipeline_rule: str = "parameter count (layers)"
    #: the workload's blocks (each one's first layer): a balanced split keeps every block whole
    pipeline_blocks: tuple[str, ...] = ()

    @property
    def precision(self) -> Precision:
        return Precision(self.policy.name)

    @property
    def keras_policy(self) -> str:
        # Planning let only a policy with a Keras path reach the TensorFlow path.
        assert self.policy.keras_policy is not None, self.policy
        return self.policy.keras_policy

    @property
    def loss_scaling(self) -> str | None:
        """How fp16 training scales its loss: "static", "dynamic", or None (fp32, inference)."""
        if not self.training or not self.policy.scales_loss:
            return None
        return "static" if self.static_loss_scale is not None else "dynamic"

    def poplar_options(self) -> dict[str, str]:
        """PopLibs options for every matmul and convolution (strings: the SDK stores them in a protobuf)."""
        options = {}
        if self.partials_type is not None:
            options["partialsType"] = self.partials_type
        if self.available_memory_proportion is not None:
            options["availableMemoryProportion"] = repr(self.available_memory_proportion)
        return options

    def details(self) -> dict[str, Any]:
        """What the result records of them (``executor_details``)."""
        return {
            "precision": self.precision.value,
            "mixed_precision_policy": self.keras_policy,
            "loss_scaling": self.loss_scaling,
            "loss_scale": self.static_loss_scale,
            "partials_type": self.partials_type or "float (PopLibs default)",
            "available_memory_proportion": self.available_memory_proportion,
            "matmul_poplar_options": self.poplar_options(),
            "convolution_poplar_options": self.poplar_options(),
            "recomputation": self.recomputation,
            "batch_norm_span": self.batch_norm_span,
            "distributed_batch_norm_replica_group_size": self.batch_norm_span,
            "pipeline_splits": list(self.pipeline_splits) or None,
        }


def split_names(pipeline_splits: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in pipeline_splits.split(",") if name.strip())


def ipu_keras_settings(
    config: RunConfig,
    options: Any,
    placement: IpuPlacement,
    layout: PipelineLayout | None = None,
    *,
    policy: type[PrecisionPolicy],
) -> IpuKerasSettings:
    """The run's settings, or a ConfigError naming the option and what it may be; ``layout`` is the
    workload's Keras blocks, against which pipeline splits are checked; ``policy`` the run's
    precision policy (``RunContext.precision_policy``)."""
    training = config.mode == "train"
    if policy.compute_dtype not in IPU_COMPUTE_DTYPES or policy.keras_policy is None:
        dtypes = ", ".join(IPU_COMPUTE_DTYPES)
        raise ConfigError("precision", config.precision.value, f"IPU TensorFlow computes in {dtypes}: fp32, fp16")
    if options.loss_scaling is not None and (not policy.scales_loss or not training):
        raise ConfigError(
            "accelerator_options.loss_scaling",
            options.loss_scaling,
            "a static loss scale applies to fp16 training (precision=fp16, mode=train); leave it unset "
            f"for {config.precision.value} {config.mode}",
        )
    if options.recomputation and not training:
        raise ConfigError(
            "accelerator_options.recomputation",
            True,
            "recomputation replaces activations kept for the backward pass, so it applies to training; "
            "false for inference",
        )
    _check_batch_norm_span(options.batch_norm_span, placement, training)
    if options.layers_per_ipu:
        raise ConfigError(
            "accelerator_options.layers_per_ipu",
            options.layers_per_ipu,
            "read by framework torch (repeated BERT/GPT layers); with tensorflow, name the layers where "
            "pipeline stages begin in accelerator_options.pipeline_splits",
        )
    splits = split_names(options.pipeline_splits)
    rule = "pipeline_splits" if splits else "parameter count (layers)"
    blocks: tuple[str, ...] = ()
    if placement.pipelined and layout is not None:
        # The workload names its blocks: splits must be among them, and a published split applies.
        choice = choose_split_points(layout, placement.ipus_per_replica, options.pipeline_splits, "")
        splits, rule, blocks = choice.split_points or (), choice.rule, layout.blocks
    if splits:
        stages = placement.ipus_per_replica
        if not placement.pipelined:
            raise ConfigError(
                "accelerator_options.pipeline_splits",
                options.pipeline_splits,
                "splits a replica over several IPUs: set devices_per_replica > 1, or leave it empty",
            )
        if len(splits) != stages - 1:
            raise ConfigError(
                "accelerator_options.pipeline_splits",
                options.pipeline_splits,
                f"{stages} IPUs per replica run {stages} pipeline stages: name the {stages - 1} layer(s) where "
                f"stages 2..{stages} begin, comma-separated",
            )
    return IpuKerasSettings(
        policy=policy,
        training=training,
        static_loss_scale=options.loss_scaling,
        partials_type=options.partials_type,
        available_memory_proportion=options.available_memory_proportion,
        recomputation=options.recomputation or config.recompute == "full",
        batch_norm_span=options.batch_norm_span,
        pipeline_splits=splits,
        pipeline_rule=rule,
        pipeline_blocks=blocks,
    )


def _check_batch_norm_span(span: int, placement: IpuPlacement, training: bool) -> None:
    if span == 1:
        return
    field = "accelerator_options.batch_norm_span"
    if not training:
        raise ConfigError(
            field,
            span,
            "batch-norm statistics are gathered across replicas when training; inference normalises "
            "with the moving statistics: 1",
        )
    if placement.pipelined:
        raise ConfigError(
            field,
            span,
            "distributed batch norm groups whole replicas of one IPU each; it is not for model parallelism "
            f"(devices_per_replica={placement.ipus_per_replica}): 1",
        )
    if placement.replicas % span:
        divisors = [d for d in range(1, placement.replicas + 1) if placement.replicas % d == 0]
        raise ConfigError(
            field,
            span,
            f"the IPUs over which batch-norm statistics are gathered form groups of whole replicas, so the span "
            f"must divide replicas ({placement.replicas}); allowed: {', '.join(map(str, divisors))}",
        )


def check_tensorflow_data(config: RunConfig) -> None:
    """IPU Keras is fed core's synthetic pool or TFRecord files through tf.data; refuse anything else
    before compiling (planning already checked that the path exists and the workload reads it)."""
    if config.data == _SYNTHETIC:
        return
    if config.data in SYNTHETIC_SOURCES:
        raise ConfigError(
            "data", config.data, f"IPU TensorFlow streams the synthetic pool through its infeed: {_SYNTHETIC}"
        )
    if config.data_format not in ("auto", "tfrecord"):
        raise ConfigError(
            "data_format", config.data_format, "IPU TensorFlow reads TFRecord files through tf.data: auto, tfrecord"
        )


def check_tensorflow_run(
    config: RunConfig,
    options: Any,
    placement: IpuPlacement,
    *,
    this_process: bool = True,
    layout: PipelineLayout | None = None,
    policy: type[PrecisionPolicy],
) -> IpuKerasSettings:
    """Everything the TensorFlow path refuses before compiling; ``this_process`` false when planning
    for a described machine, where this process's earlier configuration does not matter."""
    check_tensorflow_data(config)
    settings = ipu_keras_settings(config, options, placement, layout, policy=policy)
    if options.ipu_model and placement.instances > 1:
        # config.py, _MultiReplicaDistributionConfig: "Multi-replica distribution is not supported on
        # the IPU model." The real SDK says so when the first instance configures its IPUs.
        raise ConfigError(
            "accelerator_options.ipu_model",
            True,
            "several instances share the replicas through IPUConfig.experimental.multi_replica_distribution, "
            "which the IPU Model does not support: false (IPUs under poprun), or instances=1",
        )
    if this_process:
        requested = PoplarProcessConfiguration.for_run(options.ipu_model, options.executable_cache_dir or None)
        check_one_configuration_per_process(requested)
    return settings
