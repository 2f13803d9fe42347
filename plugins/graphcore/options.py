"""``poptorch.Options`` for a run, set the way graphcore/examples sets them for its training apps
(``vision/cnns/pytorch/train/train.py``: ``create_training_opts``).

Under poprun (PopDist's environment set) the options start from ``popdist.poptorch.Options(
ipus_per_replica=...)``, which already holds this instance's local replicas and its place among the
processes, as graphcore/examples does; elsewhere ``replicationFactor`` is the replicas of this
process and, with several instances, ``Distributed.configureProcessId`` places the process (the
PopTorch user guide's "distributed execution without PopRun").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.plugin import Fp32Policy, PrecisionPolicy

from .placement import IpuPlacement, PoprunProcess


@dataclass(frozen=True)
class OptionSettings:
    """Everything the Options depend on besides the placement."""

    seed: int
    ipu_model: bool = False
    executable_cache_dir: str | None = None
    #: the run's precision policy (planning's: PopTorchFp16Policy for fp16), which converts the model
    #: and its inputs
    precision: type[PrecisionPolicy] = Fp32Policy
    process: PoprunProcess | None = None  # this process among poprun's instances
    available_memory_proportion: float | None = None  # per IPU of a replica; None: Poplar's default
    partials_type: str | None = None  # "float" or "half"; None: PopTorch's default (float)
    recomputation: bool = False
    loss_scaling: float | None = None  # static; None: automatic loss scaling for fp16 training

    @property
    def half_precision(self) -> bool:
        """Whether the IPUs compute in float16 (loss scaling and stochastic rounding then)."""
        return self.precision.compute_dtype == "float16"


# PopART's RecomputationType (popart/sessionoptions.hpp: None 0, Standard 1, NormOnly 2, Pipeline 3):
# graphcore/examples sets Standard for a model on one IPU (vision/cnns/pytorch/utils/ipu_settings.py)
# and Pipeline recomputes each stage's forward pass from the activations stashed at its start.
RECOMPUTE_STANDARD, RECOMPUTE_PIPELINE = 1, 3


def build_options(poptorch: Any, placement: IpuPlacement, settings: OptionSettings, popdist: Any = None) -> Any:
    """A ``poptorch.Options`` for ``placement``; ``popdist`` is the imported module under poprun."""
    if popdist is not None and popdist.isPopdistEnvSet():
        opts = popdist.poptorch.Options(ipus_per_replica=placement.ipus_per_replica)
    else:
        opts = poptorch.Options()
        opts.replicationFactor(placement.replicas_per_instance)
        if placement.instances > 1:
            process = settings.process
            if process is None:
                raise RuntimeError(f"{placement.instances} instances need poprun (or Open MPI) to start them")
            opts.Distributed.configureProcessId(process.instance_index, placement.instances)
    opts.deviceIterations(placement.device_iterations)
    # The gradient of the mean loss over the update's micro-batches and replicas: what every other
    # placement in core computes, and PopTorch's default, set explicitly as graphcore/examples does.
    opts.Training.accumulationAndReplicationReductionType(poptorch.ReductionType.Mean)
    opts.Training.gradientAccumulation(placement.gradient_accumulation)
    opts.autoRoundNumIPUs(placement.auto_round_num_ipus)
    if placement.pipelined:
        # The default strategy once blocks exist; explicit so the stage of a block is its IPU.
        opts.setExecutionStrategy(poptorch.PipelinedExecution(poptorch.AutoStage.SameAsIpu))
    if settings.executable_cache_dir:
        opts.enableExecutableCaching(settings.executable_cache_dir)
    if settings.ipu_model:
        opts.useIpuModel(True)
    if settings.half_precision and placement.training:
        # fp16 weights and activations need loss scaling: a static scale travels with the optimizer
        # (poptorch.optim's loss_scaling); without one, PopTorch's automatic loss scaling sets it.
        if settings.loss_scaling is None:
            opts.Training.setAutomaticLossScaling(True)
        # No fp32 master copy of the weights in PopTorch: stochastic rounding keeps small fp16 weight
        # updates unbiased, as Graphcore's fp16 configurations enable it (vision/cnns/pytorch/train/
        # configs.yml, resnet50: enable_stochastic_rounding) and PopTorch recommends for training.
        opts.Precision.enableStochasticRounding(True)
    if settings.partials_type is not None:
        import torch

        opts.Precision.setPartialsType(torch.half if settings.partials_type == "half" else torch.float)
    if settings.available_memory_proportion is not None:
        opts.setAvailableMemoryProportion(
            {f"IPU{ipu}": settings.available_memory_proportion for ipu in range(placement.ipus_per_replica)}
        )
    if settings.recomputation and placement.training:
        opts._Popart.set("autoRecomputation", RECOMPUTE_PIPELINE if placement.pipelined else RECOMPUTE_STANDARD)
    opts.randomSeed(settings.seed)
    return opts


def numerics_summary(settings: OptionSettings, training: bool) -> dict[str, Any]:
    """The precision policy and memory settings a run used, for the result."""
    half = settings.half_precision
    summary: dict[str, Any] = {
        # PopTorch keeps one copy of the weights, in the model's type (HalfUpcastToFloat casting only).
        "weights": "float16" if half else "float32",
        "activations": "float16" if half else "float32",
        "partials": settings.partials_type or "float",
        "available_memory_proportion": settings.available_memory_proportion,
    }
    if training:
        summary.update(
            # poptorch.optim's accumulator and momentum types, float32 by default and set so here
            # (python/_optimizer_attributes.py reads float32 where a torch.optim optimizer has none).
            optimizer_state="float32",
            loss_scaling=(settings.loss_scaling if settings.loss_scaling is not None else "automatic")
            if half
            else None,
            stochastic_rounding=half,
            recomputation=settings.recomputation,
        )
    return summary


def options_summary(opts: Any) -> dict[str, Any]:
    """What the built Options hold, read back from them, for the result."""
    summary: dict[str, Any] = {
        "replication_factor": opts.replication_factor,
        "device_iterations": opts.device_iterations,
        "gradient_accumulation": opts.Training.gradient_accumulation,
        "auto_round_num_ipus": opts.auto_round_num_ipus,
        "distributed_process_id": opts.Distributed.processId,
        "distributed_processes": opts.Distributed.numProcesses,
    }
    if opts.exists("random_seed"):
        summary["random_seed"] = opts.random_seed
    summary["use_ipu_model"] = bool(opts.exists("use_model") and opts.use_model)
    return summary
