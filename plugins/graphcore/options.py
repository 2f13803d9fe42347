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

from .placement import IpuPlacement, PoprunProcess


@dataclass(frozen=True)
class OptionSettings:
    """Everything the Options depend on besides the placement."""

    seed: int
    ipu_model: bool = False
    executable_cache_dir: str | None = None
    half_precision: bool = False
    process: PoprunProcess | None = None  # this process among poprun's instances


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
        # fp16 weights and activations need loss scaling; PopTorch's automatic loss scaling sets it.
        opts.Training.setAutomaticLossScaling(True)
    opts.randomSeed(settings.seed)
    return opts


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
