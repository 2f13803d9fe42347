"""The CPU accelerator: PyTorch and TensorFlow on host cores, thread counts set and recorded.

PyTorch replicas run as one process each under torchrun with the gloo backend; TensorFlow
replicas run in one process over logical CPU devices with MirroredStrategy, or (``nodes > 1``,
``tensorflow_strategy = "multi-worker"``) as one process each under torchrun with
MultiWorkerMirroredStrategy, whose all-reduce on CPUs is TensorFlow's RING.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, ClassVar

from core.plugin import (
    Accelerator,
    Availability,
    ConfigError,
    DeviceRecord,
    Framework,
    MemoryBandwidth,
    Precision,
    RunConfig,
    RunContext,
    Workload,
)

from .peaks import derive_bandwidth, derive_peak, host_facts

if TYPE_CHECKING:
    from core.plugin import Executor

_PRECISIONS = (Precision.fp32, Precision.bf16, Precision.fp16, Precision.default)


def usable_cores() -> int:
    """Cores this process may run on (affinity and cgroup cpusets respected where visible)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


class CpuAccelerator(Accelerator):
    name: ClassVar[str] = "cpu"
    description: ClassVar[str] = "host CPU cores (PyTorch, TensorFlow); replicas via torchrun/gloo or MirroredStrategy"
    frameworks: ClassVar[tuple[Framework, ...]] = (Framework.torch, Framework.tensorflow)
    launcher: ClassVar[str | None] = "torchrun"
    distributed_backend: ClassVar[str | None] = "gloo"
    supports_inference: ClassVar[bool] = True
    forks_from_warm_parent: ClassVar[bool] = True
    # torch.set_num_threads in each replica's process; TensorFlow's intra-op pool for all replicas.
    applies_threads_per_replica: ClassVar[bool] = True
    # core's PyTorch executor: a replica over several processes (a "device" each), gloo between them
    applies_torch_parallelism: ClassVar[bool] = True
    max_devices_per_replica: ClassVar[int] = 1 << 10

    def availability(self) -> Availability:
        return Availability.yes()

    def precisions(self, framework: Framework) -> tuple[Precision, ...]:
        # tf32 is a tensor-core mode of NVIDIA GPUs; a CPU has nothing to switch.
        return _PRECISIONS

    def max_replicas_for(self, context: RunContext) -> int:
        return max(usable_cores() // context.config.devices_per_replica, 1)

    def validate_run(self, context: RunContext) -> None:
        config = context.config
        # Planning for a profile counts its cores; this host's otherwise.
        cores = context.machine.host_cores if context.machine is not None else usable_cores()
        threads = config.threads_per_replica
        processes = config.replicas * config.devices_per_replica
        if cores is not None and threads is not None and threads * processes > cores:
            raise ConfigError(
                "threads_per_replica",
                config.threads_per_replica,
                f"threads_per_replica x replicas x devices_per_replica ({config.threads_per_replica} x "
                f"{config.replicas} x {config.devices_per_replica}) must not exceed the {cores} usable cores",
            )
        if config.sharding == "fsdp-offload":
            # Checked on torch 2.13 (CPU build): fully_shard with CPUOffloadPolicy fails with "Cannot
            # access accelerator device when none is available"; and a CPU's weights are on the host already.
            raise ConfigError(
                "sharding",
                config.sharding,
                "'fsdp' or 'none' on the cpu accelerator (offloading to host memory needs an accelerator device)",
            )
        if config.compile and config.framework is Framework.tensorflow:
            return  # XLA jit of the train step
        if config.compile and config.replicas > 1:
            raise ConfigError(
                "compile", True, "torch.compile with replicas > 1 on the CPU is not supported; use compile=False"
            )

    def threads_per_replica(self, config: RunConfig) -> int:
        # threads of each process: a replica over several devices is that many processes
        return config.threads_per_replica or max(1, usable_cores() // (config.replicas * config.devices_per_replica))

    def devices(self) -> list[DeviceRecord]:
        from core.plugin import processor_name

        return [
            DeviceRecord(
                index=0,
                name=processor_name() or "cpu",
                kind=self.name,
                memory_bytes=_memory_bytes(),
                details={"usable_cores": usable_cores()},
            )
        ]

    def devices_used(self, context: RunContext) -> list[DeviceRecord]:
        config = context.config
        device = self.devices()[0]
        device.details.update({"replicas": config.replicas, "threads_per_replica": self.threads_per_replica(config)})
        return [device]

    def peak_flops_per_second(self, device: DeviceRecord, precision: Precision) -> tuple[float, str] | None:
        # The device is this host's processor (a run's devices are recorded where it runs): no
        # datasheet names it, so the peak is derived from what the machine says (plugins/cpu/peaks.py).
        facts = host_facts()
        return None if facts is None else derive_peak(facts, precision)

    def memory_bandwidth(self, device: DeviceRecord) -> MemoryBandwidth | None:
        facts = host_facts()
        return None if facts is None else derive_bandwidth(facts)

    def executor_for(self, workload: Workload, context: RunContext) -> Executor:
        config, options = context.config, context.workload_options
        threads = self.threads_per_replica(config)
        if config.framework is Framework.tensorflow:
            return self._keras_executor(workload, context, threads)
        from core.plugin import TorchPlacement, torch_executor

        def set_threads(_config: RunConfig) -> dict[str, Any]:
            import torch

            torch.set_num_threads(threads)
            return {"threads_per_replica": threads}

        placement = TorchPlacement(device="cpu", distributed_backend=self.distributed_backend, configure=set_threads)
        return torch_executor(workload.build_torch(options, config.seed), config, placement, context.process)

    def _keras_executor(self, workload: Workload, context: RunContext, threads: int) -> Executor:
        # The executor module first: it quiets TensorFlow's start-up logging before TF loads.
        import tensorflow as tf

        from core.plugin import (
            KerasPlacement,
            keras_executor,
            multi_worker_placement,
            set_tensorflow_threads,
            split_host_cpu,
        )

        config = context.config
        if config.tensorflow_multi_worker:
            # One replica in this process: its threads; before the strategy starts TensorFlow's runtime.
            kept = set_tensorflow_threads(threads, 2, asked=config.threads_per_replica is not None)
            if kept is not None:
                context.warn(kept)
            placement = multi_worker_placement(context.process, config, communication="RING", device_label="/cpu:0")
            return keras_executor(workload.build_keras(context.workload_options, config.seed), config, placement)
        # Before TensorFlow starts its runtime; the executor records the pools in force.
        kept = set_tensorflow_threads(
            threads * config.replicas, max(2, config.replicas), asked=config.threads_per_replica is not None
        )
        if kept is not None:
            context.warn(kept)
        if config.replicas > 1:
            devices = split_host_cpu(config.replicas)

            def make_strategy() -> Any:
                return tf.distribute.MirroredStrategy(
                    devices=devices, cross_device_ops=tf.distribute.ReductionToOneDevice()
                )
        else:

            def make_strategy() -> Any:
                return tf.distribute.OneDeviceStrategy("/cpu:0")

        placement = KerasPlacement(
            make_strategy=make_strategy, replicas=config.replicas, device_label="/cpu:0", jit_compile=config.compile
        )
        return keras_executor(workload.build_keras(context.workload_options, config.seed), config, placement)
