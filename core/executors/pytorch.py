"""The PyTorch executor every vendor shares: device placement, the precision policy's step
(core.base.precision), gradient accumulation, DDP replicas and torch.compile. A vendor plugin describes its device in a
TorchPlacement; it does not write its own training loop.
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch

from core.base.config import RunConfig
from core.base.distributed import ProcessContext
from core.base.errors import NonFiniteLossError
from core.base.precision import PrecisionPolicy, policy_for
from core.contract.workload import TorchTrainingSpec
from core.data import SYNTHETIC_ON_HOST, SYNTHETIC_SOURCES
from core.data.epoch_order import metrics_of, token_metrics_of
from core.executors import stand_in
from core.executors.base import Executor, HostStepClock, StepClock
from core.executors.parallel import (
    ReplicaPlacement,
    data_rank,
    local_tensor,
    parameter_bytes_per_rank,
    uses_replica_placement,
)
from core.executors.recompute import apply_recompute
from core.executors.torch_epochs import CompilationsPerEvaluation, ShuffledEpochs, batch_sums, held_out_sums

if TYPE_CHECKING:
    from core.data.loading import FileBatches, FileEpochs, HeldOutFiles

# A rank that dies must fail the run, not hang its peers for torch's default 30 minutes.
DISTRIBUTED_TIMEOUT = datetime.timedelta(minutes=5)


class TorchDeviceHooks:
    """What a device changes in the shared step loop beyond the fields of a :class:`TorchPlacement`.

    The defaults are an eager device's (CPU, CUDA, ROCm): DDP averages the gradients of several
    processes, the device module synchronises, and only torch.compile compiles graphs. A device
    whose tensors are lazy and whose graphs are compiled per update (torch-xla) overrides what
    differs; the executor calls each hook at the one place it applies.
    """

    #: ``init_method`` of the process group of a multi-process run (None: torchrun's environment)
    init_method: str | None = None
    #: backend of a second process group for the runner's host-side collectives (barriers, gathers),
    #: where the device's own backend does not do them; None: the default group does
    host_collectives_backend: str | None = None
    #: True where :meth:`reduce_gradients` averages the gradients over the processes: no DDP wrapper then
    reduces_gradients: bool = False
    #: data-parallel replicas this one process holds (one program over several devices, as XLA SPMD
    #: runs): each micro-batch is then those replicas' micro-batches together, and place_batch
    #: splits it over the devices
    replicas_in_process: int = 1
    #: names what compiles graphs, in the warning about a recompilation inside the window
    compiler: str = "torch.compile"
    #: the torch.compile backend of a ``compile=true`` run: a name Dynamo knows (Gaudi's "hpu_backend")
    #: or a backend callable
    compile_backend: str | Callable[..., Any] = "inductor"
    #: updates whose losses the executor holds (references: no device op) before folding them, in
    #: a few device ops, into its record of the first NaN/inf loss: an eager device's update then
    #: pays nothing for the check. A device that compiles each update into one graph (XLA) sets 1:
    #: the fold joins every update's graph, where it fuses, the same fold every time
    losses_folded_every: int = 256

    def model_placed(self, model: torch.nn.Module) -> None:
        """The model is on the device, before any wrapper or optimizer sees it (make replicas start
        alike where no DDP broadcasts the first rank's weights)."""

    def place_batch(self, tensor: torch.Tensor) -> torch.Tensor:
        """A micro-batch tensor just moved to the device, as the step uses it (split, annotated)."""
        return tensor

    def reduce_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """After the last backward of an update, before the optimizer step (``reduces_gradients``)."""

    def after_backward(self) -> None:
        """After each micro-step's backward, before the next micro-step or the optimizer step (Gaudi's
        lazy mode ends a graph there: ``htcore.mark_step()``). Only a subclass that overrides it is
        called: an eager device pays nothing per micro-step."""

    def cut_graph(self) -> None:
        """Where the queued work ends one graph: after every update, and after the non-finite flag
        is read (its reset would otherwise join the next update's graph and change it)."""

    def no_grad(self) -> AbstractContextManager[Any]:
        """The context an inference forward pass runs in: nothing recorded for backward."""
        return torch.inference_mode()

    def query_sizes(self, largest: int) -> tuple[int, ...]:
        """The batch sizes an inference query of up to ``largest`` samples is padded up to, each
        compiled before the timed window; empty where a query runs at its own size (eager devices)."""
        return ()

    def synchronize(self, device: torch.device) -> None:
        """Wait until every queued operation of this process on ``device`` has finished."""
        if device.type != "cpu":
            getattr(torch, device.type).synchronize(device)

    def compiled_graphs(self, config: RunConfig) -> int | None:
        """Graphs compiled in this process so far (a rise inside the window is a recompilation);
        None where nothing is counted."""
        return _compiled_graph_count() if config.compile else None

    def details(self) -> dict[str, Any]:
        """What the result records of the device's own state (read again after the first step, so
        compilation counted there shows)."""
        return {}


@dataclass(frozen=True)
class TorchPlacement:
    """How a vendor places a PyTorch workload on this process's device."""

    device: str  # "cpu", "cuda:0", ...
    distributed_backend: str | None = None  # "gloo", "nccl" when the run has several processes
    device_timing_events: bool = False  # time steps with device events instead of host clocks
    channels_last: bool = False  # NHWC activations for convolutional models
    configure: Callable[[RunConfig], dict[str, Any]] | None = None  # vendor settings; returns what it set
    details: dict[str, Any] = field(default_factory=dict)
    hooks: TorchDeviceHooks = field(default_factory=TorchDeviceHooks)  # what a lazy device changes


class DeviceEventStepClock(StepClock):
    """Step boundaries as device events queued on the current stream: no host sync per step."""

    def __init__(self, device: torch.device) -> None:
        self._module = getattr(torch, device.type)
        self._events: list[Any] = []

    def mark(self) -> None:
        event = self._module.Event(enable_timing=True)
        event.record()
        self._events.append(event)

    def intervals_seconds(self) -> list[float]:
        return [a.elapsed_time(b) / 1000.0 for a, b in zip(self._events, self._events[1:])]


def _fused_finite_check_runs_on(device: torch.device) -> bool:
    """Whether GradScaler's fused non-finite kernel runs on ``device`` (CUDA, ROCm, CPU since torch 2.3)."""
    try:
        torch._amp_foreach_non_finite_check_and_unscale_(
            [torch.zeros(1, device=device)], torch.zeros(1, device=device), torch.ones(1, device=device)
        )
    except (RuntimeError, NotImplementedError):
        return False
    return True


class NonFiniteFlag:
    """A device-side "some value was NaN/inf" flag, raised by queued ops and read only on request.

    Raising it queues device work like any other op, so checking every update costs no host sync.
    Once raised it stays raised until ``take()`` reads and clears it.
    """

    def __init__(self, device: torch.device) -> None:
        self._found = torch.zeros(1, device=device)  # float32, one element: what the fused kernel takes
        self._one = torch.ones(1, device=device)
        self._fused = _fused_finite_check_runs_on(device)

    def update(self, tensors: list[torch.Tensor]) -> None:
        """Raise the flag if any element of ``tensors`` is NaN/inf; values are left unchanged (the
        fused kernel rewrites them in place, multiplied by exactly 1: not for tensors autograd saved)."""
        if not tensors:
            return
        if self._fused:
            # GradScaler's own check with an unscale factor of 1: one call over the whole list
            # (one kernel on CUDA) that sets the flag to 1 and never clears it. Its in-place
            # "unscale" multiplies by exactly 1, which changes no value, NaN and inf included.
            torch._amp_foreach_non_finite_check_and_unscale_(tensors, self._found, self._one)
        else:
            # Devices without the fused kernel: exact, and still no read back to the host.
            all_finite = torch.stack([torch.isfinite(t).all() for t in tensors]).all()
            self._found.add_(all_finite.logical_not())

    def take(self) -> torch.Tensor:
        """The flag as a device tensor (non-zero: raised), cleared for the next interval."""
        found = self._found.clone()
        self._found.zero_()
        return found


#: the record of the first NaN/inf loss when none was: above any loss's position
NO_NON_FINITE_LOSS = 2**62


class FirstNonFiniteLoss:
    """The position of the first NaN/inf loss since the last ``take()``, counted in losses (micro-steps)
    and kept on the device: recording one costs no host sync.

    ``record`` only holds a reference to each loss; once ``fold_every`` updates' losses are held, a
    few device ops fold them into the record (stack, isfinite, where, minimum), so memory stays
    bounded and an eager device's update pays for no op of the check.
    """

    def __init__(self, device: torch.device, losses_per_update: int, fold_every: int) -> None:
        self._losses_per_fold = losses_per_update * fold_every
        self._held: list[torch.Tensor] = []
        self._positions = torch.arange(self._losses_per_fold, device=device)
        self._folded = torch.zeros((), dtype=torch.int64, device=device)  # losses folded since the last take
        self._first = torch.full((), NO_NON_FINITE_LOSS, dtype=torch.int64, device=device)

    def record(self, losses: list[torch.Tensor]) -> None:
        """One update's losses, each micro-step's in order."""
        self._held += losses
        if len(self._held) >= self._losses_per_fold:
            self._fold()

    def _fold(self) -> None:
        count = len(self._held)
        if not count:
            return
        with torch.no_grad():
            bad = torch.isfinite(torch.stack(self._held).reshape(count, -1)).all(dim=1).logical_not()
            first = torch.where(bad, self._positions[:count] + self._folded, NO_NON_FINITE_LOSS).min()
            torch.minimum(self._first, first, out=self._first)
            self._folded.add_(count)
        self._held.clear()

    def take(self) -> torch.Tensor:
        """The record as a device tensor (``NO_NON_FINITE_LOSS``: every loss was finite), cleared."""
        self._fold()
        first = self._first.clone()
        self._first.fill_(NO_NON_FINITE_LOSS)
        self._folded.zero_()
        return first


def all_finite(tensors: list[torch.Tensor]) -> torch.Tensor:
    """True (a device tensor) where no element of ``tensors`` is NaN/inf; reads them, writes none."""
    with torch.no_grad():
        return torch.stack([torch.isfinite(t).all() for t in tensors]).all()


def compile_model(model: torch.nn.Module, hooks: TorchDeviceHooks) -> Any:
    """``torch.compile(model)`` with the device's backend (TorchDeviceHooks.compile_backend)."""
    return torch.compile(model, backend=stand_in.compile_backend_for(hooks.compile_backend))


def _backend_name(backend: str | Callable[..., Any]) -> str:
    return backend if isinstance(backend, str) else getattr(backend, "__name__", type(backend).__name__)


def overridden_after_backward(hooks: TorchDeviceHooks) -> Callable[[], None] | None:
    """The device's ``after_backward``, or None where it keeps the default that does nothing (a
    subclass's method and one set on the instance both count)."""
    return overridden_hook(hooks, "after_backward")


def overridden_hook(hooks: TorchDeviceHooks, name: str) -> Callable[[], None] | None:
    """The device's hook ``name`` (``after_backward``, ``cut_graph``), or None where it keeps the
    default that does nothing (a subclass's method and one set on the instance both count)."""
    method = getattr(hooks, name)
    return None if getattr(method, "__func__", None) is getattr(TorchDeviceHooks, name) else method


def _compiled_graph_count() -> int:
    """Graphs TorchDynamo has compiled in this process; a rise inside the window is a recompilation."""
    from torch._dynamo.utils import counters  # private, but the counter Dynamo's own tests read

    return int(counters["stats"]["unique_graphs"])


def micro_batch_indices(rank: int, micro_batch: int, accumulation: int, pool: int) -> list[torch.Tensor]:
    """Sample indices of each micro-step of one update for this rank.

    The update's global batch is samples [0, replicas x accumulation x micro) taken modulo the
    pool; rank r holds a contiguous block of it. Any split of the same samples gives the same
    mean gradient, which is what makes accumulation and replicas exactly comparable.
    """
    first = rank * accumulation * micro_batch
    return [(torch.arange(micro_batch) + first + step * micro_batch) % pool for step in range(accumulation)]


def replicas_micro_batch_indices(
    first_replica: int, replicas: int, micro_batch: int, accumulation: int, pool: int
) -> list[torch.Tensor]:
    """Sample indices of each micro-step of one update for a process holding ``replicas`` replicas,
    from ``first_replica`` on: each micro-step is theirs together, replica by replica, so a
    process holding every replica takes exactly the samples the replicas' processes would."""
    per_replica = [micro_batch_indices(first_replica + r, micro_batch, accumulation, pool) for r in range(replicas)]
    return [torch.cat([indices[step] for indices in per_replica]) for step in range(accumulation)]


class TorchModelExecutor(Executor):
    """What training and inference share: the precision policy (``precision``, the run's
    :class:`core.base.precision.PrecisionPolicy`), the process group, the model on the device (weights
    loaded, channels_last, converted by the policy), the data (synthetic on the device or the host,
    or files), and the runner's synchronisation, clocks and collectives.

    ``micro_steps`` is the micro-batches one step takes (gradient accumulation when training, 1 for
    inference). Subclasses wrap the model (DDP, torch.compile) and define ``step``.
    """

    def __init__(
        self,
        spec: TorchTrainingSpec,
        config: RunConfig,
        placement: TorchPlacement,
        process: ProcessContext,
        micro_steps: int,
    ) -> None:
        assert config.micro_batch_size is not None
        self._config = config
        self._process = process
        self._placement = placement
        self.device = torch.device(stand_in.device_for(placement.device))
        self._details: dict[str, Any] = dict(placement.details)
        if placement.configure is not None:
            self._details.update(placement.configure(config))
        #: the run's precision policy: the forward pass's context, backward and the optimizer step
        self.precision: PrecisionPolicy = policy_for(config.precision)(self.device)
        self._details.update(self.precision.configure_torch())

        self._hooks = placement.hooks
        self._host_group: Any = None  # None: the default group does the runner's collectives
        if process.is_distributed and not torch.distributed.is_initialized():
            if placement.distributed_backend is None:
                raise RuntimeError("a multi-process run needs a distributed backend in the placement")
            torch.distributed.init_process_group(
                backend=placement.distributed_backend, init_method=self._hooks.init_method, timeout=DISTRIBUTED_TIMEOUT
            )
        if process.is_distributed and self._hooks.host_collectives_backend is not None:
            self._host_group = torch.distributed.new_group(
                backend=self._hooks.host_collectives_backend, timeout=DISTRIBUTED_TIMEOUT
            )

        if config.weights is not None:
            from core.executors.weights import load_weights

            # On the host, before placing: the file's tensors replace the seeded ones.
            self._details.update(load_weights(spec.model, config.weights))
        memory_format = torch.channels_last if placement.channels_last else torch.contiguous_format
        model = spec.model.to(self.device)
        if placement.channels_last:
            model = model.to(memory_format=memory_format)
        model = self.precision.convert_module(model)
        self._hooks.model_placed(model)
        self._placed_model: torch.nn.Module = model
        self._memory_format = memory_format if placement.channels_last else None
        self._files: FileBatches | None = None
        # Synthetic micro-batches stay on the device ("synthetic") or on the host, where every
        # micro-step copies them over as real data would be ("synthetic-host").
        on_host = config.data == SYNTHETIC_ON_HOST
        # Page-locked host memory makes CUDA's (and ROCm's) copies to the device asynchronous; other
        # runtimes (XLA's PJRT) copy from pageable memory, and pinning would need a CUDA driver.
        pins = self.device.type == "cuda"
        pin = on_host and pins
        self._micro_batches = []
        replicas_here = self._hooks.replicas_in_process
        # The devices of one replica (tensor-parallel, pipelined) read that replica's samples.
        replica = data_rank(config, process.rank) if uses_replica_placement(config) else process.rank
        if config.data in SYNTHETIC_SOURCES:
            for indices in replicas_micro_batch_indices(
                replica * replicas_here, replicas_here, config.micro_batch_size, micro_steps, len(spec.inputs)
            ):
                batch = (spec.inputs.index_select(0, indices), spec.targets.index_select(0, indices))
                if on_host:
                    self._micro_batches.append(tuple(t.pin_memory() if pin else t for t in batch))
                else:
                    self._micro_batches.append(self._to_device(*batch, non_blocking=False))
        elif config.target is None:  # a run to a target reads its splits itself (TorchExecutor)
            from core.data.loading import FileBatches

            self._files = FileBatches(config, spec.inputs, process, pin_memory=pins, vocabulary=spec.vocabulary)
            self._details.update(self._files.details())
        self._copy_each_step = on_host or config.data not in SYNTHETIC_SOURCES
        self._details["data"] = config.data if config.data in SYNTHETIC_SOURCES else "files"

        self._details.update(
            {
                "framework": "torch",
                "mode": config.mode,
                "device": str(self.device),
                "distributed_backend": placement.distributed_backend if process.is_distributed else None,
                "compile": config.compile,
                "compile_backend": _backend_name(self._hooks.compile_backend) if config.compile else None,
                "channels_last": placement.channels_last,
                "intra_op_threads": torch.get_num_threads(),
                "inter_op_threads": torch.get_num_interop_threads(),
            }
        )

    def _to_device(
        self, inputs: torch.Tensor, targets: torch.Tensor, non_blocking: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        targets = self._hooks.place_batch(targets.to(self.device, non_blocking=non_blocking))
        return self._inputs_to_device(inputs, non_blocking), targets

    def _inputs_to_device(self, inputs: torch.Tensor, non_blocking: bool) -> torch.Tensor:
        inputs = inputs.to(self.device, non_blocking=non_blocking)
        if self._memory_format is not None and inputs.dim() == 4:
            inputs = inputs.contiguous(memory_format=self._memory_format)
        return self._hooks.place_batch(self.precision.convert_input(inputs))

    def _micro_batch(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._files is not None:
            inputs, targets = self._files.next()
            return self._to_device(inputs, targets, non_blocking=True)
        inputs, targets = self._micro_batches[index]
        return self._to_device(inputs, targets, non_blocking=True) if self._copy_each_step else (inputs, targets)

    def data_wait_seconds(self) -> float:
        return self._files.wait_seconds if self._files is not None else 0.0

    def begin_window(self) -> None:
        self._graphs_before_window = self._hooks.compiled_graphs(self._config)

    def window_warnings(self) -> list[str]:
        before = getattr(self, "_graphs_before_window", None)
        if before is None:
            return []
        added = (self._hooks.compiled_graphs(self._config) or 0) - before
        if added > 0:
            return [
                (
                    f"{self._hooks.compiler} compiled {added} new graph(s) inside the timed window (a recompilation): "
                    "its compile time is in window_seconds"
                )
            ]
        return []

    def synchronize(self) -> None:
        self._hooks.synchronize(self.device)

    def step_clock(self) -> StepClock:
        if self._placement.device_timing_events and self.device.type != "cpu":  # the CPU may stand in (core.testing)
            return DeviceEventStepClock(self.device)
        return HostStepClock()

    def _collective_device(self) -> torch.device:
        on_device = self._placement.distributed_backend == "nccl" and self._host_group is None
        return self.device if on_device else torch.device("cpu")

    def barrier(self) -> None:
        if not self._process.is_distributed:
            return
        if self._collective_device().type != "cpu" and self.device.index is not None:
            # NCCL's barrier is a collective on a device: name ours rather than let torch guess.
            torch.distributed.barrier(device_ids=[self.device.index])
        else:
            torch.distributed.barrier(group=self._host_group)

    def gather_max(self, value: float) -> float:
        if not self._process.is_distributed:
            return value
        tensor = torch.tensor([value], dtype=torch.float64, device=self._collective_device())
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX, group=self._host_group)
        return float(tensor.item())

    def gather_objects(self, value: object) -> list[object]:
        if not self._process.is_distributed:
            return [value]
        gathered: list[object] = [None] * self._process.world_size
        torch.distributed.all_gather_object(gathered, value, group=self._host_group)
        return gathered

    def host_threads(self) -> dict[str, int]:
        # torch's own settings, and what the placement's configure() set (its keys ending in _threads).
        return {k: v for k, v in self._details.items() if k.endswith("_threads") and type(v) is int}

    def dataset_samples(self) -> int | None:
        return self._files.samples if self._files is not None else None

    def details(self) -> dict[str, Any]:
        return {**self._details, **self._hooks.details()}

    def framework_version(self) -> str:
        return torch.__version__

    def model_state(self) -> dict[str, torch.Tensor]:
        """The model's weights on the host (tests compare them across placements)."""
        return {name: tensor.detach().cpu().clone() for name, tensor in self._placed_model.state_dict().items()}

    def close(self) -> None:
        if self._files is not None:
            # The loader's worker processes and their temporary files go first, on every way out.
            self._files.close()
        if self._process.is_distributed and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
            # gloo's worker thread may still hold the Context a gradient all-reduce captured in
            # backward(); released during interpreter exit, it aborts the process. Wait for it.
            from core.base.distributed import release_finished_collectives

            release_finished_collectives()


#: the training draws' seed of rank r: the run's seed times this, plus r (distinct for every rank
#: and every seed below 2**32, and a generator's seed whatever the seed)
_DRAWS_PER_SEED = 1 << 20


def seed_training_draws(seed: int, rank: int, device: torch.device) -> int:
    """Seed the generator that dropout and the other random layers draw from while training (the
    device's default one: the host's, and a CUDA or ROCm device's own), so that a run with a seed is
    repeated draw for draw; each rank its own draws (replicas drop different units, as one process
    of the whole batch would draw different masks for its halves). Returns the seed. Models are built
    apart from it (``core.workloads.zoo.seeded``: from ``seed`` itself). Only the CPU generator and the
    run's CUDA device are seeded: ``torch.manual_seed`` would also queue every CUDA device's lazy seeding
    (and a stack trace of it), a few milliseconds of every run."""
    draws = seed * _DRAWS_PER_SEED + rank
    torch.default_generator.manual_seed(draws)
    if device.type == "cuda":
        with torch.cuda.device(device):
            torch.cuda.manual_seed(draws)  # this device's generator: the run's
    return draws


class TorchExecutor(TorchModelExecutor):
    """Training: one ``step()`` is one weight update (gradient accumulation, DDP across replicas)."""

    def __init__(
        self, spec: TorchTrainingSpec, config: RunConfig, placement: TorchPlacement, process: ProcessContext
    ) -> None:
        if config.mode != "train":
            raise ValueError(f"TorchExecutor trains; a {config.mode!r} run takes torch_executor() instead")
        super().__init__(spec, config, placement, process, micro_steps=config.gradient_accumulation)
        model = self._placed_model
        self._ddp: torch.nn.parallel.DistributedDataParallel | None = None
        #: the device mesh of a replica over several devices or of sharded replicas (no DDP then)
        self._replica: ReplicaPlacement | None = None
        # Recomputation first: its hooks go with each layer into a pipeline stage, under fully_shard
        # and tensor parallelism, and into torch.compile's graph.
        #: what recomputation ran, counted on the host (None: recompute "none")
        self.recompute_counts = apply_recompute(model, spec.pipeline_layout, config.recompute)
        if self.recompute_counts is not None:
            self._details["recompute"] = {"choice": config.recompute, "layers": self.recompute_counts.layers}
        if uses_replica_placement(config):
            self._replica = ReplicaPlacement(config, self.device, spec.tensor_parallel_plan)
            if self.precision.scales_loss:
                from core.executors.mesh_scaler import MeshGradScaler

                # every process of the mesh skips a step, and moves its scale, on one verdict
                self.precision.scale_over_mesh(MeshGradScaler(self.device))
            model = self._replica.place(model, spec.pipeline_layout, spec.pipeline_stage, spec.loss_fn, self.precision)
            self._details.update(self._replica.details())
            self._details["parameter_bytes_per_rank"] = parameter_bytes_per_rank(model)
        elif process.is_distributed and not self._hooks.reduces_gradients:
            device_ids = [self.device.index] if self.device.type != "cpu" and self.device.index is not None else None
            self._ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
            model = self._ddp
        self._model = compile_model(model, self._hooks) if config.compile else model
        # The devices of one replica draw alike: a tensor-parallel replica's whole activations are the
        # same on each of its devices, and a dropout mask on them must be too.
        draws_rank = data_rank(config, process.rank) if self._replica is not None else process.rank
        self._details["training_draws_seed"] = seed_training_draws(config.seed, draws_rank, self.device)
        self._after_backward = overridden_after_backward(self._hooks)
        self._optimizer = spec.make_optimizer(model.parameters())
        self._loss_fn = spec.loss_fn
        # Every micro-step's loss goes into a record, kept on the device, of the first that was
        # NaN/inf; the trained weights are checked at the phase's end, outside its timing. No pass
        # over the gradients each update (it cost 2.6-5.8% of an FCNN update on the CPU): an
        # optimizer step with a NaN/inf gradient leaves a NaN/inf weight (or a moment that makes
        # one), so the weights carry every gradient fault, the last update's included, even one
        # a kernel masks on its way to the loss (TensorFlow's fused oneDNN ReLU maps NaN to 0).
        self._losses = FirstNonFiniteLoss(self.device, config.gradient_accumulation, self._hooks.losses_folded_every)
        # The weights the optimizer steps: those of its parameter groups.
        self._trained_parameters = [p for group in self._optimizer.param_groups for p in group["params"]]
        self._updates = 0  # updates run, on the host: the check names the one whose loss was NaN/inf
        self._updates_checked = 0  # updates run up to the last check
        self._details["ddp"] = self._ddp is not None
        # A run to a target reads the training split in real epochs and evaluates on the held-out split.
        self._spec = spec
        self._epochs: ShuffledEpochs | FileEpochs | None = None
        self._training_files: FileEpochs | None = None
        self._held_out_files: HeldOutFiles | None = None
        self._compilations = CompilationsPerEvaluation()
        replicas_here = self._hooks.replicas_in_process
        if config.target is not None and config.data not in SYNTHETIC_SOURCES:
            from core.data.loading import target_split_readers

            data_format, self._training_files, self._held_out_files = target_split_readers(
                config,
                spec.inputs,
                process,
                replicas_here,
                pin_memory=self.device.type == "cuda",
                vocabulary=spec.vocabulary,
            )
            self._epochs = self._training_files
            self._details.update(
                {
                    "data_format": data_format,
                    "dataset_samples": self._epochs.samples,
                    "held_out_samples": self._held_out_files.samples,
                    "epoch_order": "shuffled per epoch (seeded), last partial global batch dropped",
                }
            )
        elif config.target is not None:
            if spec.evaluation_inputs is None:
                raise ValueError("a run to a target needs the workload's held-out split (evaluation_inputs)")
            assert config.micro_batch_size is not None
            self._epochs = ShuffledEpochs(
                spec.inputs,
                spec.targets,
                config.seed,
                config.micro_batch_size,
                config.gradient_accumulation,
                config.replicas,
                process.rank * replicas_here,
                replicas_here,
            )
            self._copy_each_step = True
            self._details["epoch_order"] = "shuffled per epoch (seeded), last partial global batch dropped"

    def _pipelined_step(self) -> None:
        """One update of a pipelined replica: its micro-batches through the schedule, one after the other."""
        assert self._replica is not None and self._replica.pipeline is not None
        pipeline = self._replica.pipeline
        batches = [self._micro_batch(index) for index in range(self._config.gradient_accumulation)]
        inputs = torch.cat([inputs for inputs, _ in batches])
        targets = torch.cat([targets for _, targets in batches])
        losses = pipeline.step(inputs, targets)
        if not losses:  # only the last stage computes the loss; the others record finite zeros
            losses = [torch.zeros((), device=self.device)] * self._config.gradient_accumulation
        self._apply_update([loss.detach() for loss in losses])

    def _apply_update(self, losses: list[torch.Tensor]) -> None:
        """After an update's last backward: the gradients averaged where the device or the mesh does
        it, the optimizer's step, the update's (detached) losses recorded."""
        # Where the device averages the gradients itself (no DDP), it does so once per update.
        self._hooks.reduce_gradients(self._optimizer)
        if self._replica is not None:
            self._replica.reduce_gradients(self._trained_parameters)
        self.precision.optimizer_step(self._optimizer)
        self._optimizer.zero_grad(set_to_none=True)
        self._losses.record(losses)
        self._updates += 1

    def step(self) -> None:
        if self._replica is not None and self._replica.pipeline is not None:
            self._pipelined_step()
            return
        if self._epochs is not None and not self._compilations.training_open:
            # A run to a target: the graphs compiled from here to the next evaluation are training's.
            self._compilations.training_starts(self._hooks.compiled_graphs(self._config))
        accumulation = self._config.gradient_accumulation
        last = accumulation - 1
        losses: list[torch.Tensor] = []
        for index in range(accumulation):
            inputs, targets = self._micro_batch(index)
            # DDP all-reduces gradients only on the final micro-step of an update.
            sync_context = self._ddp.no_sync() if (self._ddp is not None and index < last) else contextlib.nullcontext()
            if self._replica is not None:
                self._replica.micro_step(last=index == last)
            with sync_context:
                with self.precision.forward_context():
                    loss = self._loss_fn(self._model(inputs), targets)
                    if accumulation > 1:
                        loss = loss / accumulation
                self.precision.backward(loss)
                if self._after_backward is not None:
                    self._after_backward()
            # Detached: a held loss must not keep its update's autograd graph alive until the fold.
            losses.append(loss.detach())
        self._apply_update(losses)
        # A lazy device compiles the update, every micro-step of it, as one graph.
        self._hooks.cut_graph()

    def _micro_batch(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._epochs is None:
            return super()._micro_batch(index)
        return self._to_device(*self._epochs.micro_batch(self._updates, index), non_blocking=True)

    def dataset_samples(self) -> int | None:
        return self._epochs.samples if self._epochs is not None else super().dataset_samples()

    def data_wait_seconds(self) -> float:
        if self._training_files is not None:
            return self._training_files.wait_seconds
        return super().data_wait_seconds()

    def evaluate(self) -> dict[str, float] | None:
        spec = self._spec
        world = max(self._process.world_size, 1)

        def to_device(inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self._to_device(inputs, targets, non_blocking=False)

        # A lazy device ends a graph after each batch: an evaluation is a few graphs of one batch each.
        after_batch = overridden_hook(self._hooks, "cut_graph")
        graphs_before = self._hooks.compiled_graphs(self._config)
        if self._held_out_files is not None:
            sums = batch_sums(
                self._placed_model,
                self._held_out_files.batches(),
                self._loss_fn,
                to_device,
                self.precision.forward_context,
                self._hooks.no_grad,
                after_batch=after_batch,
                token_loss_sums=spec.token_loss_sums,
            )
        elif spec.evaluation_inputs is not None:
            sums = held_out_sums(
                self._placed_model,
                spec.evaluation_inputs,
                spec.evaluation_targets,
                self._loss_fn,
                (self._process.rank, world),
                to_device,
                self.precision.forward_context,
                self._hooks.no_grad,
                after_batch=after_batch,
                token_loss_sums=spec.token_loss_sums,
            )
        else:
            return None
        self._hooks.cut_graph()
        if self._process.is_distributed:
            sums = sums.to(self._collective_device())
            torch.distributed.all_reduce(sums, op=torch.distributed.ReduceOp.SUM, group=self._host_group)
        # read on the host: the evaluation's graphs have run
        sums_read = sums.tolist()
        metrics = metrics_of(sums_read) if spec.token_loss_sums is None else token_metrics_of(sums_read)
        self._compilations.evaluated(graphs_before, self._hooks.compiled_graphs(self._config))
        return metrics

    def window_warnings(self) -> list[str]:
        return super().window_warnings() + self._compilations.warnings(self._hooks.compiler)

    def profile_communication(self) -> dict[str, Any] | None:
        from core.executors.communication import profile_update

        profile = profile_update(self.step, self.synchronize, self.device)
        self.check_finite()  # the extra update is an update like the others: a NaN in it is reported
        return profile.as_dict()

    def details(self) -> dict[str, Any]:
        return {**super().details(), **self._compilations.details()}

    def check_finite(self) -> None:
        first_update = self._updates_checked + 1  # the first update since the last check, counting from 1
        updated = self._updates > self._updates_checked
        self._updates_checked = self._updates
        # A NaN/inf in loss-scaled gradients is loss scaling at work: the policy skips that step
        # and lowers the scale, leaving the weights as they were. Losses only then.
        weights = updated and not self.precision.scales_loss
        # A sharded or split weight is checked where it lies: each process its own part.
        weights_finite = all_finite([local_tensor(p.detach()) for p in self._trained_parameters]) if weights else None
        first_loss, weights_finite_everywhere = self._first_faults_on_every_rank(self._losses.take(), weights_finite)
        self._hooks.cut_graph()  # the record's reset apart from the next update's graph
        accumulation = self._config.gradient_accumulation
        if first_loss != NO_NON_FINITE_LOSS:
            update = first_update + first_loss // accumulation
            micro_step = f", micro-step {first_loss % accumulation + 1} of {accumulation}" if accumulation > 1 else ""
            raise NonFiniteLossError(
                f"the loss was NaN/inf in update {update} of the run{micro_step}, the first since the last check "
                "(update 1 is the first step; a NaN/inf gradient shows in the next update's loss)"
            )
        if not weights_finite_everywhere:
            updates = (
                f"update {first_update}"
                if first_update == self._updates
                else (f"one of updates {first_update} to {self._updates}")
            )
            raise NonFiniteLossError(
                f"NaN/inf in a weight after a NaN/inf gradient, in {updates} of the run (every loss was finite)"
            )

    def _first_faults_on_every_rank(
        self, first_loss: torch.Tensor, weights_finite: torch.Tensor | None
    ) -> tuple[int, bool]:
        """The earliest NaN/inf loss's position on any rank, and whether every rank's weights were
        finite (None: not checked): one read, one collective. A fault on one rank only must fail
        every rank alike, or the others would wait at the next barrier for a rank that has stopped."""
        finite = (
            torch.ones((), dtype=torch.int64, device=first_loss.device) if weights_finite is None else weights_finite
        )
        verdict = torch.stack([first_loss, finite.to(torch.int64)])
        if self._process.is_distributed:
            verdict = verdict.to(device=self._collective_device())
            torch.distributed.all_reduce(verdict, op=torch.distributed.ReduceOp.MIN, group=self._host_group)
        first, finite_everywhere = verdict.tolist()
        return int(first), bool(finite_everywhere)

    def close(self) -> None:
        # The split readers' worker processes first, on every way out, as the base class's loader's.
        try:
            for reader in (self._training_files, self._held_out_files):
                if reader is not None:
                    reader.close()
        finally:
            super().close()

    def model_state(self) -> dict[str, torch.Tensor]:
        """The trained weights on the host (tests compare them across placements). With a device mesh
        they are gathered from every shard: every process of the run calls it."""
        if self._replica is not None:
            return self._replica.full_state(self._model)
        wrapped = self._ddp.module if self._ddp is not None else self._model
        # torch.compile wraps the module; its weights are the original module's.
        module = cast(torch.nn.Module, getattr(wrapped, "_orig_mod", wrapped))
        return {name: tensor.detach().cpu().clone() for name, tensor in module.state_dict().items()}


def torch_executor(
    spec: TorchTrainingSpec, config: RunConfig, placement: TorchPlacement, process: ProcessContext
) -> TorchModelExecutor:
    """The executor for ``config.mode``: training (:class:`TorchExecutor`) or inference
    (``core.executors.pytorch_inference.TorchInferenceExecutor``), on the same placement."""
    if config.mode == "inference":
        from core.executors.pytorch_inference import TorchInferenceExecutor

        return TorchInferenceExecutor(spec, config, placement, process)
    return TorchExecutor(spec, config, placement, process)
