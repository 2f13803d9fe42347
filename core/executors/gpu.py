"""What every GPU that PyTorch drives through its CUDA API shares (NVIDIA CUDA, AMD ROCm/HIP).

On ROCm, PyTorch keeps the device type "cuda" and the "nccl" backend (which is RCCL there), so the
placement is the same: one process per GPU under torchrun, the device of the local rank, device
events for step times, NCCL all-reduce, channels_last for convolutional models. TensorFlow runs
its replicas in one process with MirroredStrategy, or (``nodes > 1``, ``tensorflow_strategy =
"multi-worker"``) one process per GPU under torchrun with MultiWorkerMirroredStrategy and NCCL. A
vendor plugin subclasses this and supplies only what differs: device discovery (honouring its
visibility variables), driver versions, precision support, extra PyTorch switches and its energy
reader.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

from core.base.config import Framework, Precision, RunConfig
from core.base.distributed import ProcessContext
from core.base.results import DeviceRecord
from core.contract.accelerator import Accelerator
from core.contract.context import RunContext, overrides_old_form
from core.contract.workload import Workload

if TYPE_CHECKING:
    from core.executors.base import Executor

ALL_PRECISIONS = (Precision.fp32, Precision.tf32, Precision.bf16, Precision.fp16, Precision.default)


def configure_torch_for(accelerator: TorchGpuAccelerator, context: RunContext) -> dict[str, Any]:
    """``accelerator``'s vendor switches, in whichever form of the method its class overrides last."""
    if overrides_old_form(accelerator, "configure_torch_for", "configure_torch"):
        return accelerator.configure_torch(context.config)
    return accelerator.configure_torch_for(context)


class TorchGpuAccelerator(Accelerator):
    frameworks: ClassVar[tuple[Framework, ...]] = (Framework.torch, Framework.tensorflow)
    launcher: ClassVar[str | None] = "torchrun"
    distributed_backend: ClassVar[str | None] = "nccl"
    # Inference replicas are independent processes (one per GPU, no DDP), like training's.
    supports_inference: ClassVar[bool] = True
    # CUDA and HIP are initialised lazily, in the run's own process: the fork server never does.
    forks_from_warm_parent: ClassVar[bool] = True
    #: the torch.version attribute a matching PyTorch build sets ("cuda" or "hip")
    torch_build_attribute: ClassVar[str] = "cuda"
    # The host threads that feed a GPU (data, the CPU side of each step): set where --threads asks.
    applies_threads_per_replica: ClassVar[bool] = True
    # core's PyTorch executor places a replica over several GPUs (FSDP2, DTensor, pipelining), NCCL between them.
    applies_torch_parallelism: ClassVar[bool] = True
    max_devices_per_replica: ClassVar[int] = 1 << 10

    @abstractmethod
    def visible_devices(self) -> list[DeviceRecord]:
        """The GPUs this process may use, in the order PyTorch numbers them (cuda:0, cuda:1, ...)."""

    def configure_torch_for(self, context: RunContext) -> dict[str, Any]:
        """Vendor switches set before the model is placed, in the run's process (its device is the
        current one already); returns them for the result. The default calls
        :meth:`configure_torch`, the form before the run context."""
        return self.configure_torch(context.config)

    def configure_torch(self, config: RunConfig) -> dict[str, Any]:
        """The form of :meth:`configure_torch_for` before the run context (options unparsed)."""
        return {}

    def precisions(self, framework: Framework) -> tuple[Precision, ...]:
        return ALL_PRECISIONS

    def max_replicas_for(self, context: RunContext) -> int:
        return len(self.visible_devices()) // context.config.devices_per_replica

    def max_replicas(self, config: RunConfig) -> int:
        # Kept for subclasses written before the run context that call it through super(); goes in 0.3.
        return len(self.visible_devices())

    def devices(self) -> list[DeviceRecord]:
        return self.visible_devices()

    def devices_used(self, context: RunContext) -> list[DeviceRecord]:
        return self.devices_for(context.config, context.process)

    def devices_for(self, config: RunConfig, process: ProcessContext) -> list[DeviceRecord]:
        # The form before the run context, which this class's devices_used calls: a subclass written
        # before it overrides this one (or calls it through super()); goes in 0.3.
        return self.visible_devices()[: config.devices_per_node]

    def executor_for(self, workload: Workload, context: RunContext) -> Executor:
        config, options, process = context.config, context.workload_options, context.process
        if config.framework is Framework.tensorflow:
            if config.tensorflow_multi_worker:
                return self._multi_worker_keras_executor(workload, context)
            return self._keras_executor(workload, options, config)
        import torch

        from core.executors.pytorch import TorchPlacement, torch_executor

        build = getattr(torch.version, self.torch_build_attribute, None)
        if not build or not torch.cuda.is_available():
            raise RuntimeError(
                f"this PyTorch ({torch.__version__}) cannot drive {self.name} GPUs: torch.version."
                f"{self.torch_build_attribute} is {build!r}, torch.cuda.is_available() is {torch.cuda.is_available()}"
            )
        local_device = process.local_rank if process.is_distributed else 0

        def configure(run_config: RunConfig) -> dict[str, Any]:
            torch.cuda.set_device(local_device)  # NCCL and the default stream follow the current device
            threads = {}
            if run_config.threads_per_replica is not None:  # else PyTorch's own choice stands
                torch.set_num_threads(run_config.threads_per_replica)
                threads = {"threads_per_replica": run_config.threads_per_replica}
            return {
                f"torch_{self.torch_build_attribute}_version": build,
                **threads,
                **configure_torch_for(self, context),
            }

        placement = TorchPlacement(
            device=f"cuda:{local_device}",
            distributed_backend=self.distributed_backend,
            device_timing_events=True,
            channels_last=workload.prefers_channels_last,
            configure=configure,
        )
        return torch_executor(workload.build_torch(options, config.seed), config, placement, process)

    def _keras_executor(self, workload: Workload, options: Any, config: RunConfig) -> Executor:
        import tensorflow as tf

        from core.executors.keras import KerasPlacement, keras_executor, set_tensorflow_threads

        if config.threads_per_replica is not None:
            # Before listing devices starts TensorFlow's runtime; the replicas share this one process.
            set_tensorflow_threads(config.threads_per_replica * config.replicas, asked=True)
        gpus = [device.name for device in tf.config.list_logical_devices("GPU")][: config.replicas]
        if len(gpus) < config.replicas:
            raise RuntimeError(f"TensorFlow sees {len(gpus)} GPU(s); the run asks for {config.replicas} replicas")

        def make_strategy() -> Any:
            if config.replicas == 1:
                return tf.distribute.OneDeviceStrategy(gpus[0])
            return tf.distribute.MirroredStrategy(devices=gpus)

        placement = KerasPlacement(
            make_strategy=make_strategy,
            replicas=config.replicas,
            device_label=",".join(gpus),
            jit_compile=config.compile,
        )
        return keras_executor(workload.build_keras(options, config.seed), config, placement)

    def _multi_worker_keras_executor(self, workload: Workload, context: RunContext) -> Executor:
        """This process's GPU (its local rank's) as one worker of MultiWorkerMirroredStrategy."""
        import tensorflow as tf

        from core.executors.keras import keras_executor, multi_worker_placement, set_tensorflow_threads

        config, process = context.config, context.process
        if config.threads_per_replica is not None:
            set_tensorflow_threads(config.threads_per_replica, asked=True)
        # Before TensorFlow's runtime starts: the strategy takes every GPU it sees, and this worker's is one.
        gpus = tf.config.list_physical_devices("GPU")
        if process.local_rank >= len(gpus):
            raise RuntimeError(
                f"TensorFlow sees {len(gpus)} GPU(s); local rank {process.local_rank} of this node needs its own"
            )
        tf.config.set_visible_devices(gpus[process.local_rank], "GPU")
        placement = multi_worker_placement(
            process, config, communication="NCCL", device_label=gpus[process.local_rank].name
        )
        return keras_executor(workload.build_keras(context.workload_options, config.seed), config, placement)
