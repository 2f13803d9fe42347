"""Where a run goes on IPUs, and whether it can: the rules PopTorch and the IPU TensorFlow build
enforce at compile time, checked before anything compiles, and the batch arithmetic.

Pure Python, no SDK: ``core plugins`` and the planner import it freely. Every refusal is a
``core.ConfigError`` naming the field, the value and the rule. The rules, with where each lives in
the SDK's own sources:

- IPUs per instance (process) = IPUs per replica x replicas per instance. PopTorch reserves a power
  of two of them, at most 64 per process (poptorch ``popart_compiler/source/CompilerImpl.cpp``:
  ``roundUpNumIPUs`` and ``assertSingleInstanceMaxNumIPUs``); with ``autoRoundNumIPUs`` it rounds up
  and leaves the extra IPUs idle, otherwise it refuses.
- Pipelined training (IPUs per replica > 1) runs ``2 x stages - 1`` pipeline stages (the backward
  pass adds ``stages - 1``), and gradient accumulation must be at least that
  (``popart_compiler/source/Compiler.cpp``); inference needs device iterations >= stages, and
  gradient accumulation 1 (``python/_poplar_executor.py``).
- poprun distributes replicas over instances: the instances must divide the replicas.
- IPU TensorFlow derives the replication factor from the IPU count: ``num_ipus // 2**ceil(log2(
  shards))`` (graphcore/keras ``keras/ipu/extensions/extensions_base.py``), so its IPU count must be
  a power of two with nothing to round; and ``steps_per_execution`` (per replica since SDK 2.5)
  must be a multiple of the gradient accumulation.
- Pipelined IPU Keras inference: ``predict`` runs one pipeline of depth ``steps_per_execution``
  (``_make_pipeline_ipu_predict_function``), and Poplar's pipeline lowering needs that depth to be a
  multiple of, and at least, the schedule's overlap: the forward stages under the default Grouped
  schedule (graphcore/tensorflow ``compiler/plugin/poplar/driver/visitors/pipeline_visitor.cc``,
  "The pipeline depth of the pipeline must be a multiple of %d"). So device iterations must be a
  multiple of the stages.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from core.plugin import ConfigError

#: PopTorch refuses more IPUs than this in one process ("Experiments that need more than 64 IPUs
#: require distributed execution.")
MAX_IPUS_PER_INSTANCE = 64


def is_power_of_two(n: int) -> bool:
    return n >= 1 and (n & (n - 1)) == 0


def next_power_of_two(n: int) -> int:
    """The smallest power of two >= n (PopTorch's ``roundUpNumIPUs``)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return 1 << (n - 1).bit_length()


_TIED_NOTE = ", one of them the output layer tied to IPU 0's embedding"


def pipeline_stages_in_training(ipus_per_replica: int) -> int:
    """Stages PopTorch runs when training a linear pipeline: the forward stages plus a backward
    stage for each but the last (which computes its backward in place)."""
    return 2 * ipus_per_replica - 1


@dataclass(frozen=True)
class IpuPlacement:
    """A validated placement of one run on IPUs; build it with :func:`plan_placement`."""

    micro_batch_size: int
    gradient_accumulation: int
    replicas: int  # global, across every instance
    ipus_per_replica: int  # pipeline stages of one replica; 1 = no pipelining
    device_iterations: int
    instances: int = 1  # host processes (poprun --num-instances)
    training: bool = True
    auto_round_num_ipus: bool = True
    #: stages after the last IPU's for layers tied to the first IPU (an output layer sharing the
    #: embedding's weight runs on IPU 0 in a stage of its own: core.plugin.PipelineLayout)
    tied_stages: int = 0

    @property
    def pipelined(self) -> bool:
        return self.ipus_per_replica > 1

    @property
    def total_ipus(self) -> int:
        """IPUs the model uses: IPUs per replica x replicas."""
        return self.ipus_per_replica * self.replicas

    @property
    def replicas_per_instance(self) -> int:
        return self.replicas // self.instances

    @property
    def ipus_per_instance(self) -> int:
        return self.ipus_per_replica * self.replicas_per_instance

    @property
    def reserved_ipus_per_instance(self) -> int:
        """What PopTorch attaches to in each process: the next power of two."""
        return next_power_of_two(self.ipus_per_instance)

    @property
    def reserved_ipus(self) -> int:
        return self.reserved_ipus_per_instance * self.instances

    @property
    def idle_ipus(self) -> int:
        return self.reserved_ipus - self.total_ipus

    @property
    def pipeline_stages(self) -> int:
        """Stages PopTorch checks gradient accumulation (training) or device iterations against."""
        if not self.pipelined:
            return 1
        forward = self.ipus_per_replica + self.tied_stages
        return pipeline_stages_in_training(forward) if self.training else forward

    @property
    def samples_per_update(self) -> int:
        """Samples per weight update, over every replica: micro x replicas x gradient accumulation."""
        return self.micro_batch_size * self.replicas * self.gradient_accumulation

    @property
    def samples_per_host_call(self) -> int:
        """Samples one call from the host processes: samples per update x device iterations."""
        return self.samples_per_update * self.device_iterations

    @property
    def samples_per_instance_host_call(self) -> int:
        """The combined batch one instance's ``poptorch.DataLoader`` yields per call."""
        return self.micro_batch_size * self.replicas_per_instance * self.gradient_accumulation * self.device_iterations

    def notes(self) -> list[str]:
        """What a user should know about this placement (rounding, idle IPUs)."""
        notes = []
        if self.reserved_ipus_per_instance != self.ipus_per_instance:
            notes.append(
                f"IPUs rounded up to a power of two: each instance uses {self.ipus_per_instance} "
                f"({self.replicas_per_instance} replica(s) x {self.ipus_per_replica} IPU(s) per replica) and "
                f"reserves {self.reserved_ipus_per_instance}; {self.idle_ipus} IPU(s) in all stay idle"
            )
        return notes

    def summary(self) -> dict[str, Any]:
        """The placement as the result records it (``executor_details``)."""
        return {
            "micro_batch_size": self.micro_batch_size,
            "gradient_accumulation": self.gradient_accumulation,
            "replicas": self.replicas,
            "ipus_per_replica": self.ipus_per_replica,
            "device_iterations": self.device_iterations,
            "instances": self.instances,
            "replicas_per_instance": self.replicas_per_instance,
            "total_ipus": self.total_ipus,
            "reserved_ipus": self.reserved_ipus,
            "pipeline_stages": self.pipeline_stages,
            "samples_per_update": self.samples_per_update,
            "samples_per_host_call": self.samples_per_host_call,
            "placement_notes": self.notes(),
        }


def plan_placement(
    *,
    micro_batch_size: int,
    gradient_accumulation: int,
    replicas: int,
    ipus_per_replica: int,
    device_iterations: int,
    instances: int = 1,
    training: bool = True,
    auto_round_num_ipus: bool = True,
    framework: str = "torch",
    tied_stages: int = 0,
) -> IpuPlacement:
    """Validate a placement; raise ConfigError naming the field and the rule it breaks."""
    if instances < 1:
        raise ConfigError("accelerator_options.instances", instances, "must be >= 1")
    if replicas % instances:
        raise ConfigError(
            "accelerator_options.instances",
            instances,
            f"must divide replicas ({replicas}): poprun gives every instance the same number of replicas",
        )
    placement = IpuPlacement(
        micro_batch_size,
        gradient_accumulation,
        replicas,
        ipus_per_replica,
        device_iterations,
        instances,
        training,
        auto_round_num_ipus,
        tied_stages=tied_stages if ipus_per_replica > 1 else 0,
    )
    per_instance = placement.ipus_per_instance
    layout = (
        f"{placement.replicas_per_instance} replica(s) per instance x {ipus_per_replica} "
        f"IPU(s) per replica = {per_instance} IPUs per instance"
    )
    if placement.reserved_ipus_per_instance > MAX_IPUS_PER_INSTANCE:
        raise ConfigError(
            "replicas",
            replicas,
            f"{layout}, reserving {placement.reserved_ipus_per_instance}; one process can reserve at most "
            f"{MAX_IPUS_PER_INSTANCE} IPUs: use more instances (accelerator_options.instances, under poprun)",
        )
    if framework == "tensorflow":
        _check_tensorflow_ipus(placement)
    elif not is_power_of_two(per_instance) and not auto_round_num_ipus:
        raise ConfigError(
            "replicas",
            replicas,
            f"{layout}, not a power of two; PopTorch must reserve {placement.reserved_ipus_per_instance}. "
            "Choose replicas x devices_per_replica a power of two, or set accelerator_options."
            "auto_round_num_ipus=true to reserve the extra IPUs and leave them idle",
        )
    stages = placement.pipeline_stages
    if training and placement.pipelined and gradient_accumulation < stages:
        raise ConfigError(
            "gradient_accumulation",
            gradient_accumulation,
            f"pipelined training over {ipus_per_replica} IPUs per replica runs {stages} pipeline stages "
            f"({(stages + 1) // 2} forward{_TIED_NOTE if placement.tied_stages else ''} + {(stages - 1) // 2} "
            f"backward); gradient_accumulation must be >= 2 x "
            f"{'(devices_per_replica + 1)' if placement.tied_stages else 'devices_per_replica'} - 1 = {stages}",
        )
    if not training:
        if gradient_accumulation != 1:
            raise ConfigError(
                "gradient_accumulation",
                gradient_accumulation,
                "inference runs no weight update: gradient_accumulation must be 1 "
                "(use device_iterations to feed a pipeline)",
            )
        if placement.pipelined and device_iterations < stages:
            raise ConfigError(
                "device_iterations",
                device_iterations,
                f"pipelined inference over {stages} stages needs device_iterations >= {stages}",
            )
        if framework == "tensorflow" and placement.pipelined and device_iterations % stages:
            raise ConfigError(
                "device_iterations",
                device_iterations,
                f"IPU Keras runs a pipelined predict as one pipeline {device_iterations} deep, and Poplar needs "
                f"the depth to be a multiple of the {stages} pipeline stages: choose a multiple of {stages}",
            )
    return placement


def host_call_samples(placement: IpuPlacement, instance_index: int = 0) -> list[int]:
    """Sample ids (before taking them modulo the pool) of one host call of one instance.

    Ordered as the combined batch is read: ``[device_iterations, gradient_accumulation, replicas of
    the instance, micro_batch]`` (PopART's input layout, graphcore/popart docs/popart/glossary.rst;
    IPU Keras's infeed hands batches to replicas in the same order). Global replica ``r`` holds
    samples ``[(r x GA + a) x micro, ...)`` of the update, and every device iteration repeats the
    same update: each weight update trains on samples ``0 .. samples_per_update - 1``, as on every
    other accelerator.
    """
    micro, accumulation = placement.micro_batch_size, placement.gradient_accumulation
    local = placement.replicas_per_instance
    update = [
        ((instance_index * local + replica) * accumulation + step) * micro + sample
        for step in range(accumulation)
        for replica in range(local)
        for sample in range(micro)
    ]
    return update * placement.device_iterations


def _check_tensorflow_ipus(placement: IpuPlacement) -> None:
    shards = next_power_of_two(placement.ipus_per_replica)
    ipus = placement.replicas_per_instance * shards
    if not is_power_of_two(ipus):
        raise ConfigError(
            "replicas",
            placement.replicas,
            f"IPU TensorFlow selects a multi-IPU device of {placement.replicas_per_instance} replica(s) x "
            f"{shards} IPU(s) (pipeline shards rounded up to a power of two) = {ipus} IPUs, and derives the "
            "replication factor from that count, so it must be a power of two: nothing can be rounded",
        )


def tensorflow_ipus_per_instance(placement: IpuPlacement) -> int:
    """``IPUConfig.auto_select_ipus`` for a placement that passed validation."""
    return placement.replicas_per_instance * next_power_of_two(placement.ipus_per_replica)


def keras_steps_per_execution(placement: IpuPlacement) -> int:
    """Keras ``steps_per_execution`` (micro-batches per replica per host call, SDK >= 2.5)."""
    return placement.gradient_accumulation * placement.device_iterations


def keras_steps_per_host_call(placement: IpuPlacement) -> int:
    """The ``steps_per_epoch`` (``fit``) or ``steps`` (``predict``) that make one host call run
    ``steps_per_execution`` micro-batches on every replica of this instance.

    IPU Keras reads those counts over all replicas together and divides them by the replication
    factor (graphcore/keras ``keras/ipu/extensions/data_adapter.py``, ``IPUDataHandler._infer_steps``),
    then truncates ``steps_per_execution`` to the quotient: asking for ``steps_per_execution`` alone
    would run only ``1 / replicas`` of an execution per replica.
    """
    return keras_steps_per_execution(placement) * placement.replicas_per_instance


def check_steps_per_execution(
    steps_per_execution: int, gradient_accumulation: int, replicas: int, per_replica: bool = True
) -> None:
    """The Keras rule: an execution holds whole weight updates.

    Since SDK 2.5 ``steps_per_execution`` counts micro-batches per replica and must be a multiple of
    the gradient accumulation; before, it counted them over all replicas combined and had to be a
    multiple of replicas x gradient accumulation (``per_replica=False``).
    """
    unit = gradient_accumulation if per_replica else gradient_accumulation * replicas
    if steps_per_execution % unit:
        what = (
            "gradient_accumulation"
            if per_replica
            else f"replicas x gradient_accumulation ({replicas} x {gradient_accumulation})"
        )
        raise ConfigError(
            "device_iterations",
            steps_per_execution,
            f"steps_per_execution {steps_per_execution} must be a multiple of {what} = {unit}",
        )


@dataclass(frozen=True)
class PoprunProcess:
    """This process's place among poprun's instances (poprun starts them through Open MPI)."""

    instance_index: int
    instances: int
    local_index: int  # among the instances on this host; 0 reads the host's power meter

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> PoprunProcess | None:
        """From Open MPI's variables (which PopTorch's ``Distributed`` options read too); None outside."""
        if "OMPI_COMM_WORLD_SIZE" not in environ:
            return None
        size = int(environ["OMPI_COMM_WORLD_SIZE"])
        rank = int(environ.get("OMPI_COMM_WORLD_RANK", "0"))
        local = int(environ.get("OMPI_COMM_WORLD_LOCAL_RANK", str(rank)))
        return cls(instance_index=rank, instances=size, local_index=local)


def poprun_command(
    placement: IpuPlacement,
    program: Sequence[str],
    *,
    hosts: Sequence[str] = (),
    executable_cache_dir: str | None = None,
    numa_aware: bool = True,
    vipu_partition: str | None = None,
) -> list[str]:
    """The poprun command line that runs ``program`` as ``placement.instances`` instances.

    poprun splits ``--num-replicas`` over ``--num-instances`` (one host process each) and gives each
    replica ``--ipus-per-replica`` IPUs; the ACES paper's "num-instances" and "num-replicas".
    """
    command = [
        "poprun",
        "--num-instances",
        str(placement.instances),
        "--num-replicas",
        str(placement.replicas),
        "--ipus-per-replica",
        str(placement.ipus_per_replica),
    ]
    if numa_aware:
        command += ["--numa-aware", "1"]
    if hosts:
        command += ["--host", ",".join(hosts)]
    if vipu_partition:
        command += [f"--vipu-partition={vipu_partition}"]
    if executable_cache_dir:
        command += [f"--executable-cache-path={executable_cache_dir}"]
    return command + list(program)


def format_command(command: Sequence[str]) -> str:
    return shlex.join(command)
