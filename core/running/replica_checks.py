"""Planning's checks of a PyTorch replica over several devices, or of sharded replicas, on the
accelerators whose executor is core's (``Accelerator.applies_torch_parallelism``): what
core.executors.parallel applies, and the field to change where it cannot."""

from __future__ import annotations

from typing import Any

from core.base.config import Framework, Precision, RunConfig
from core.base.errors import ConfigError
from core.contract.pipeline import PipelineLayout
from core.contract.workload import Workload
from core.data import SYNTHETIC_SOURCES


def check_torch_replica(
    config: RunConfig, workload: Workload, options: Any, layout: PipelineLayout | None, planned_elsewhere: bool = False
) -> list[str]:
    """ConfigError naming the field for what core's PyTorch executor cannot run: stages the workload's
    layout cannot make, recomputation of a model without named layers, always; what the executor does
    not apply yet (pipeline stages with offloaded shards, a workload without a tensor-parallel plan,
    the step loop's limits) here, but as a warning in a plan for a machine profile
    (``planned_elsewhere``: ``--dry-run --machine``, where the split's rules and memory are what is
    asked). Returns those warnings."""
    if config.pipeline_parallel > 1:
        _check_pipeline_layout(config, workload, layout)
    not_yet: list[ConfigError] = []
    if config.recompute != "none":
        _check_recompute(config, workload, options, layout)
    if config.devices_per_replica > 1 or config.sharding != "none":
        not_yet.extend(_plain_training_limits(config))
        if config.tensor_parallel > 1:
            _check_tensor_plan(config, workload, options, not_yet)
        if config.pipeline_parallel > 1 and config.sharding == "fsdp-offload":
            # The weights' shards and gradients on the host: a tied weight's gradients would be summed
            # over the stages by a collective of the device's backend on host tensors.
            not_yet.append(
                ConfigError(
                    "sharding", config.sharding, "'none' or 'fsdp' with pipeline stages (offload not composed yet)"
                )
            )
    if not_yet and not planned_elsewhere:
        raise not_yet[0]
    notes = [f"core's PyTorch executor does not run this yet (planned, not runnable): {error}" for error in not_yet]
    if config.sharding != "none" and config.replicas == 1:
        notes.append(
            f"sharding {config.sharding!r} over 1 replica shards nothing: each device keeps the whole weights, "
            "gradients and optimizer state (FSDP shards over the replicas)"
        )
    return notes


def _check_recompute(config: RunConfig, workload: Workload, options: Any, layout: PipelineLayout | None) -> None:
    """Recomputation works layer by layer (core.executors.recompute): the layers are the blocks the
    workload names (``Workload.pipeline_layout``), a stack of identical transformer layers; it keeps
    activations for a backward, so training only."""
    if config.mode != "train":
        raise ConfigError("recompute", config.recompute, "'none' for inference: no activations are kept for a backward")
    if layout is None:  # one device per replica: planning has not read the layout
        layout = workload.pipeline_layout(options, Framework.torch)
    if layout is None or not layout.blocks or not layout.repeated_layers:
        raise ConfigError(
            "recompute",
            config.recompute,
            f"'none' (workload {workload.name!r} names no stack of transformer layers to recompute: "
            "Workload.pipeline_layout with repeated layers)",
        )


def _plain_training_limits(config: RunConfig) -> list[ConfigError]:
    """What the device mesh is not built for yet: the step loop of synthetic training only."""
    why = "with devices_per_replica > 1 or sharding (core's device mesh)"
    limits = []
    if config.mode != "train":
        limits.append(ConfigError("mode", config.mode, f"'train' {why}"))
    if config.data not in SYNTHETIC_SOURCES:
        limits.append(ConfigError("data", config.data, f"one of {', '.join(sorted(SYNTHETIC_SOURCES))} {why}"))
    if config.target is not None:
        limits.append(ConfigError("target", config.target, f"unset (None) {why}"))
    if config.compile:
        limits.append(ConfigError("compile", True, f"False {why}"))
    if config.weights is not None:
        limits.append(ConfigError("weights", config.weights, f"unset (None) {why}"))
    if config.precision is Precision.fp16 and config.sharding == "fsdp-offload":
        # The mesh's loss scaler (core.executors.mesh_scaler) checks each process's gradients where
        # they lie; with offloaded shards those are on the host, a path no test has run yet.
        limits.append(
            ConfigError("precision", config.precision.value, "fp32, tf32, bf16 or default with sharding 'fsdp-offload'")
        )
    return limits


def _check_tensor_plan(config: RunConfig, workload: Workload, options: Any, not_yet: list[ConfigError]) -> None:
    plan = workload.tensor_parallel_plan(options)
    if plan is None:
        not_yet.append(
            ConfigError(
                "tensor_parallel",
                config.tensor_parallel,
                f"1 (workload {workload.name!r} gives no tensor-parallel plan: Workload.tensor_parallel_plan)",
            )
        )
        return
    indivisible = plan.indivisible(config.tensor_parallel)
    if indivisible:
        raise ConfigError(
            "tensor_parallel",
            config.tensor_parallel,
            f"a divisor of the model's {', '.join(indivisible)} (each device holds an equal part)",
        )


def _check_pipeline_layout(config: RunConfig, workload: Workload, layout: PipelineLayout | None) -> None:
    """Stages of whole blocks the workload names (the micro-batches per stage and the layers of a
    shaped model are checked for every accelerator: core.running.replica_plan.check_replica_split)."""
    stages = config.pipeline_parallel
    if layout is None:
        raise ConfigError(
            "devices_per_replica",
            config.devices_per_replica,
            f"tensor_parallel ({config.tensor_parallel}): workload {workload.name!r} names no pipeline stages "
            "(Workload.pipeline_layout)",
        )
    if not layout.repeated_layers or stages > len(layout.blocks):
        raise ConfigError(
            "devices_per_replica",
            config.devices_per_replica,
            f"at most {len(layout.blocks)} pipeline stages x tensor_parallel {config.tensor_parallel}: each stage "
            f"holds whole {layout.unit}s, of which the model has {len(layout.blocks)}",
        )
