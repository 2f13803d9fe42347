"""The TensorFlow/Keras executor: a custom training loop under a ``tf.distribute.Strategy``.

A vendor plugin decides *where* the model runs (it supplies the strategy in a ``KerasPlacement``);
this module decides *how* one weight update runs, identically for every vendor.

TensorFlow is imported lazily, inside functions, so that importing this module (as plugin
discovery does) stays cheap and does not initialise TensorFlow's runtime.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import math
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from core.base.config import RunConfig
from core.base.distributed import ProcessContext
from core.base.errors import DataError, NonFiniteLossError
from core.base.precision import PrecisionPolicy, policy_for
from core.contract.workload import KerasTrainingSpec
from core.data import SYNTHETIC_SOURCES
from core.data.epoch_order import EVALUATION_BATCH, EpochOrder, metrics_of, shard
from core.data.tf_records import RecordSplit
from core.executors.base import Executor, HostStepClock, StepClock


def quiet_tensorflow_startup() -> None:
    """Keep TensorFlow's C++ start-up chatter (CPU feature notes) from burying core's own output.

    Takes effect only before TensorFlow loads; a value the user set is kept."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


quiet_tensorflow_startup()


class HostCollectives:
    """Barrier, maximum and gather over the processes of a multi-worker TensorFlow run, on the host.

    A gloo process group (torch.distributed) over the store of torchrun's rendezvous (its
    MASTER_ADDR and MASTER_PORT), as a PyTorch run's: the runner's window boundaries, set-up time
    and energy shares need them, and TensorFlow offers no barrier or object gather of its own. It
    also carries each worker's address to every other before TensorFlow starts (TF_CONFIG).
    """

    #: as PyTorch runs' process groups wait (core.executors.pytorch.DISTRIBUTED_TIMEOUT)
    TIMEOUT = datetime.timedelta(minutes=5)

    def __init__(self, process: ProcessContext) -> None:
        import torch.distributed as dist

        self._dist = dist
        self._process = process
        if not dist.is_initialized():
            dist.init_process_group(
                backend="gloo",
                init_method="env://",
                rank=process.rank,
                world_size=process.world_size,
                timeout=self.TIMEOUT,
            )

    def barrier(self) -> None:
        self._dist.barrier()

    def gather_max(self, value: float) -> float:
        import torch

        tensor = torch.tensor([value], dtype=torch.float64)
        self._dist.all_reduce(tensor, op=self._dist.ReduceOp.MAX)
        return float(tensor.item())

    def gather_objects(self, value: object) -> list[object]:
        gathered: list[object] = [None] * self._process.world_size
        self._dist.all_gather_object(gathered, value)
        return gathered

    def close(self) -> None:
        # No barrier: a worker that failed must not wait here for peers that will never come.
        if self._dist.is_initialized():
            self._dist.destroy_process_group()


@dataclass(frozen=True)
class KerasPlacement:
    """Where a Keras workload runs inside this process; built by the vendor plugin."""

    make_strategy: Callable[[], Any]  # -> tf.distribute.Strategy
    replicas: int  # replicas the strategy holds inside this process
    device_label: str  # e.g. "/cpu:0" or "GPU", recorded in details
    jit_compile: bool = False  # XLA for the gradient computation of a weight update
    #: a multi-worker run's host-side collectives (:func:`multi_worker_placement`); None in one process
    collectives: HostCollectives | None = None
    #: a multi-worker run's workers, HOST:PORT in task (global rank) order, and its all-reduce
    workers: tuple[str, ...] = ()
    communication: str | None = None


#: where a worker of a multi-node TensorFlow run is reached by the others, if not found as below
WORKER_HOST_VARIABLE = "CORE_TF_WORKER_HOST"

#: TensorFlow's all-reduce implementations (tf.distribute.experimental.CommunicationImplementation)
COMMUNICATIONS = ("AUTO", "RING", "NCCL")


def worker_host(nodes: int, environ: dict[str, str] | None = None) -> str:
    """The address the other workers reach this one at: the loopback on one node; over several, the
    address of this host's interface towards the rendezvous' store (MASTER_ADDR), which every node
    reaches already, or its fully qualified name where that is a loopback (on the store's own node).
    ``CORE_TF_WORKER_HOST`` overrides both."""
    env = dict(os.environ) if environ is None else environ
    if env.get(WORKER_HOST_VARIABLE):
        return env[WORKER_HOST_VARIABLE]
    if nodes == 1:
        return "127.0.0.1"
    master = env.get("MASTER_ADDR")
    if master:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((master, int(env.get("MASTER_PORT", "29500"))))  # UDP: sends nothing
                address = str(probe.getsockname()[0])
            if not ipaddress.ip_address(address).is_loopback:
                return address
        except (OSError, ValueError):
            pass
    return socket.getfqdn()


def free_port(host: str = "") -> int:
    """A TCP port free on this host now, for this worker's TensorFlow server (which binds it soon after)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def tf_config(workers: Sequence[str], index: int) -> dict[str, Any]:
    """TF_CONFIG for task ``index`` of a cluster of ``workers`` (HOST:PORT each, in task order)."""
    if not 0 <= index < len(workers):
        raise ValueError(f"task index {index} outside the cluster's {len(workers)} worker(s)")
    return {"cluster": {"worker": list(workers)}, "task": {"type": "worker", "index": index}}


def multi_worker_placement(
    process: ProcessContext, config: RunConfig, *, communication: str, device_label: str
) -> KerasPlacement:
    """This worker's place in a TensorFlow run of one process per replica (torchrun's workers):
    joins the host collectives, gathers every worker's HOST:PORT through them, and sets TF_CONFIG
    (task index = global rank). Its ``make_strategy`` builds ``tf.distribute.MultiWorkerMirroredStrategy``
    with ``communication`` (RING for CPUs; NCCL for GPUs), whose all-reduce spans every worker.

    Must run before TensorFlow's runtime starts in this process (the strategy configures the
    collective ops and starts this worker's server then); the caller may set thread pools and
    visible devices before, nothing that runs an op or lists logical devices.
    """
    if communication not in COMMUNICATIONS:
        raise ValueError(f"communication must be one of {COMMUNICATIONS}, got {communication!r}")
    collectives: HostCollectives | None = None
    workers: tuple[str, ...] = ()
    if process.is_distributed:
        collectives = HostCollectives(process)
        try:
            host = worker_host(config.nodes)
            address = f"[{host}]" if ":" in host else host  # an IPv6 literal
            workers = tuple(str(worker) for worker in collectives.gather_objects(f"{address}:{free_port()}"))
            os.environ["TF_CONFIG"] = json.dumps(tf_config(workers, process.rank))
        except BaseException:
            collectives.close()
            raise
    # else one worker (tensorflow_strategy multi-worker with one replica: torchrun starts no
    # process for it): without TF_CONFIG the strategy is that worker alone, as TensorFlow documents.

    def make_strategy() -> Any:
        import tensorflow as tf

        implementation = getattr(tf.distribute.experimental.CommunicationImplementation, communication)
        options = tf.distribute.experimental.CommunicationOptions(implementation=implementation)
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)

    return KerasPlacement(
        make_strategy=make_strategy,
        replicas=1,
        device_label=device_label,
        jit_compile=config.compile,
        collectives=collectives,
        workers=workers,
        communication=communication,
    )


def split_host_cpu(logical_devices: int) -> list[str]:
    """Split the host CPU into ``logical_devices`` TensorFlow logical CPUs; return their names.

    Lets ``tf.distribute.MirroredStrategy(devices=names, cross_device_ops=ReductionToOneDevice())``
    hold several replicas in one process on a CPU. The logical CPUs share TensorFlow's one
    intra-op thread pool: they give replicas separate variables and data, not separate cores.

    Must run before TensorFlow initialises its runtime (any op, or listing logical devices).
    Calling it again with the same count afterwards is harmless; another count raises.
    """
    import tensorflow as tf

    if logical_devices < 1:
        raise ValueError(f"logical_devices must be >= 1, got {logical_devices}")
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(logical_devices)]
        )
    except RuntimeError as exc:
        # TF refuses any change (even a no-op one) once its runtime is initialised.
        existing = tf.config.list_logical_devices("CPU")
        if len(existing) != logical_devices:
            raise RuntimeError(
                f"cannot split the host CPU into {logical_devices} logical devices: TensorFlow is "
                f"already initialised with {len(existing)} logical CPU(s); split_host_cpu must run "
                "before any TensorFlow op executes in this process"
            ) from exc
    return [d.name for d in tf.config.list_logical_devices("CPU")]


def set_tensorflow_threads(intra_op: int, inter_op: int | None = None, *, asked: bool) -> str | None:
    """Size TensorFlow's intra-op (and inter-op) thread pools for a run; None, or a warning to record.

    TensorFlow fixes its pools when its runtime starts (the first op in the process); a later call
    with other sizes raises. A run whose sizes were ``asked`` for (``threads_per_replica``) then
    cannot be what was asked, and is refused saying why. A run that left them to core keeps the
    pools in force, which ``KerasExecutor.host_threads`` records, and is told so in a warning.
    """
    import tensorflow as tf

    threading = tf.config.threading
    wanted = {"intra-op": intra_op} if inter_op is None else {"intra-op": intra_op, "inter-op": inter_op}
    try:
        threading.set_intra_op_parallelism_threads(intra_op)
        if inter_op is not None:
            threading.set_inter_op_parallelism_threads(inter_op)
        return None
    except RuntimeError:
        # Only a started runtime refuses a size: setting the size already in force is a no-op.
        in_force = {
            "intra-op": threading.get_intra_op_parallelism_threads(),
            "inter-op": threading.get_inter_op_parallelism_threads(),
        }
    sizes = ", ".join(f"{pool} {_pool_size(in_force[pool])} (this run: {size})" for pool, size in wanted.items())
    why = f"TensorFlow's runtime had already started in this process with thread pools of {sizes}; it fixes them"
    if asked:
        raise RuntimeError(
            f"threads_per_replica cannot be honoured: {why} when it starts. Run in a fresh process "
            "(the core command and sweeps do), or leave threads_per_replica unset to keep the pools in force"
        )
    return f"threads: {why} when it starts, and this run kept them"


def _pool_size(threads: int) -> str:
    # 0 is TensorFlow's "choose for me" (one thread per core).
    return "TensorFlow's default" if threads == 0 else str(threads)


def _replica_sum(tf: Any) -> Any:
    """A float counter with one component per replica, summed when read in cross-replica context."""
    return tf.Variable(
        0.0,
        trainable=False,
        dtype=tf.float32,
        synchronization=tf.VariableSynchronization.ON_READ,
        aggregation=tf.VariableAggregation.SUM,
    )


def _any_non_finite(tf: Any, tensors: list[Any]) -> Any:
    """1.0 if any element of ``tensors`` is NaN or infinite, else 0.0 (a float32 scalar)."""
    finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in tensors])
    return tf.cast(tf.logical_not(finite), tf.float32)


class Split(Protocol):
    """A run to a target's split as the Keras executor reads it: samples by index, on the host."""

    def __len__(self) -> int: ...

    def take(self, indices: Any) -> tuple[Any, Any]:
        """(inputs, targets) of samples ``indices`` (a 1-D integer array), as numpy arrays."""
        ...


class ArraySplit:
    """A split held in memory (the workload's own: ``KerasTrainingSpec``'s arrays)."""

    def __init__(self, inputs: Any, targets: Any) -> None:
        import numpy as np

        self.inputs, self.targets = np.asarray(inputs), np.asarray(targets)

    def __len__(self) -> int:
        return len(self.inputs)

    def take(self, indices: Any) -> tuple[Any, Any]:
        return self.inputs[indices], self.targets[indices]


def _target_splits(spec: KerasTrainingSpec, config: RunConfig) -> tuple[Split, Split]:
    """(training, held-out) splits of a run to a target: the workload's arrays, or ``config.data``'s
    train/ and val/ TFRecord files (core.data.listing.target_splits), read by offset in the same order."""
    if config.data in SYNTHETIC_SOURCES:
        if spec.evaluation_inputs is None:
            raise ValueError("a run to a target needs the workload's held-out split (evaluation_inputs)")
        return ArraySplit(spec.inputs, spec.targets), ArraySplit(spec.evaluation_inputs, spec.evaluation_targets)
    from pathlib import Path

    from core.data.listing import target_splits

    found, training, held_out = target_splits(Path(config.data), config.data_format)
    if found != "tfrecord":
        raise ValueError(f"the Keras executor reads a run to a target's splits as TFRecord files, not {found}")
    shape = tuple(spec.inputs.shape[1:])
    if len(shape) != 3:
        raise ValueError(
            f"TFRecord image data needs a workload whose inputs are images [H, W, C]; this one takes {shape}"
        )
    image_shape = (int(shape[0]), int(shape[1]), int(shape[2]))
    return RecordSplit(training, image_shape), RecordSplit(held_out, image_shape)


class KerasExecutor(Executor):
    """One weight update per ``step()``: GA accumulated micro-steps on every replica, one apply.

    ``model`` and ``optimizer`` are public for inspection. The global Keras dtype policy and the
    TF32 flag are process-wide: one executor at a time per process, and ``close()`` restores them.
    The update's samples live on the devices for the executor's lifetime (R x GA x micro samples).
    """

    def __init__(self, spec: KerasTrainingSpec, config: RunConfig, placement: KerasPlacement) -> None:
        import tensorflow as tf
        from tensorflow import keras

        if config.micro_batch_size is None:
            raise ValueError("config.micro_batch_size must be resolved before building an executor")
        self._tf = tf
        self._micro = config.micro_batch_size
        self._accumulation = config.gradient_accumulation
        #: the run's precision policy (its Keras policy, TF32 switch and loss scaling)
        self.precision: type[PrecisionPolicy] = policy_for(config.precision)

        # Global state this executor changes; close() puts it back.
        self._previous_policy = keras.mixed_precision.global_policy()
        self._previous_tf32 = tf.config.experimental.tensor_float_32_execution_enabled()
        self._closed = False
        self._files: Any = None
        self._data_source = config.data
        self._data_wait_seconds = 0.0
        self._collectives = placement.collectives
        self._updates = 0  # updates run, on the host: the check names the one whose loss was NaN/inf
        self._updates_checked = 0  # updates run up to the last check
        # A run to a target: the training split in real epochs, and the held-out split (host arrays).
        self._epochs: EpochOrder | None = None
        self._training_split: Split | None = None
        self._evaluation_split: Split | None = None
        self._evaluation_step: Callable[[Any, Any, Any], Any] | None = None
        try:
            # Layers read the global policy when constructed, so it is set before make_model.
            self.precision.configure_keras(tf, keras)
            strategy = placement.make_strategy()
            local_devices = list(strategy.extended.worker_devices)
            if len(local_devices) != placement.replicas:
                raise ValueError(
                    f"placement says {placement.replicas} replica(s) in this process but the strategy "
                    f"{type(strategy).__name__} holds {len(local_devices)}: {local_devices}"
                )
            self._strategy = strategy
            # Across processes (multi-worker strategies) the all-reduce spans every replica.
            self._global_replicas = strategy.num_replicas_in_sync
            loss_fn = self._build_model(spec)
            self._loss_fn = loss_fn
            self._local_devices = local_devices
            self._place_data(spec, config, local_devices)
            self._train_step = self._make_train_step(loss_fn, placement.jit_compile)
            self._details: dict[str, Any] = {
                "framework": "tensorflow",
                "tensorflow_version": tf.__version__,
                "keras_version": getattr(keras, "__version__", None),
                "mixed_precision_policy": keras.mixed_precision.global_policy().name,
                "tf32_enabled": bool(tf.config.experimental.tensor_float_32_execution_enabled()),
                "loss_scaling": "dynamic" if self._loss_scaling else None,
                "optimizer": type(self.optimizer).__name__,
                "strategy": type(strategy).__name__,
                "replicas_in_process": placement.replicas,
                "device": placement.device_label,
                "jit_compile": placement.jit_compile,
                "data": "synthetic" if self._files is None else "files",
            }
            if self._epochs is not None:
                self._details["data"] = "training split"
                self._details["epoch_order"] = "shuffled per epoch (seeded), last partial global batch dropped"
            if self._files is not None:
                self._details["data_format"] = "tfrecord"
            if isinstance(self._training_split, RecordSplit):
                self._details.update(
                    {
                        "data": "files",
                        "data_format": "tfrecord",
                        "dataset_samples": len(self._training_split),
                        "held_out_samples": len(self._evaluation_split) if self._evaluation_split is not None else 0,
                    }
                )
            if placement.workers:
                self._details.update(
                    {
                        "workers": len(placement.workers),
                        "worker_addresses": list(placement.workers),
                        "communication": placement.communication,
                        "replicas_in_sync": self._global_replicas,
                    }
                )
        except BaseException:
            self.close()
            raise

    def _build_model(self, spec: KerasTrainingSpec) -> Any:
        """Model, optimizer (as the precision policy trains: loss-scaled for fp16) and the
        replica-sum counters, in the strategy's scope; returns the loss function."""
        tf = self._tf
        from tensorflow import keras

        with self._strategy.scope():
            self.model = spec.make_model()
            loss_fn = spec.make_loss()
            optimizer = self.precision.keras_optimizer(spec.make_optimizer(), keras)
            self.optimizer = optimizer
            self._loss_scaling = isinstance(optimizer, keras.mixed_precision.LossScaleOptimizer)
            self._variables = list(self.model.trainable_variables)
            # Optimizer slots must exist before the first trace: creating variables inside
            # a replica function of a tf.function is not allowed under MirroredStrategy.
            if hasattr(optimizer, "build"):
                optimizer.build(self._variables)
            # One component per replica, summed when read in cross-replica context:
            # accumulating costs no all-reduce per step.
            self._loss_sum = _replica_sum(tf)
            # Each replica's updates since the last check before its running loss sum went NaN/inf
            # (it stays so): the first NaN/inf loss's update, recorded with no pass over the
            # gradients. The loss alone can miss a NaN: oneDNN's fused MatMul+BiasAdd+ReLU turns
            # a NaN input into a finite activation, so the loss stays finite while the gradient
            # of the first kernel (x^T dz) is NaN. That gradient leaves a NaN weight, which the
            # check at the phase's end reads, outside its timing.
            self._finite_updates = _replica_sum(tf)
        return loss_fn

    def _place_data(self, spec: KerasTrainingSpec, config: RunConfig, local_devices: list[Any]) -> None:
        import numpy as np

        tf, strategy = self._tf, self._strategy
        accumulation, micro, global_replicas = self._accumulation, self._micro, self._global_replicas
        # Data: sample i of the run is pool[i % pool]. Micro-step g of global replica r takes
        # samples [(g*N + r)*micro, (g*N + r + 1)*micro): the union over one update is the same
        # whatever the split into replicas and micro-steps, which makes results comparable.
        inputs = np.asarray(spec.inputs)
        targets = np.asarray(spec.targets)
        pool = inputs.shape[0]
        if config.target is not None:
            # A run to a target reads the training split in real epochs: each update's samples are
            # copied to the replicas as it runs (step()), and the held-out split stays on the host.
            self._training_split, self._evaluation_split = _target_splits(spec, config)
            samples = len(self._training_split)
            self._epochs = EpochOrder(samples, config.seed, micro, accumulation, global_replicas)
            return

        def per_replica(array: Any) -> Any:
            def value_fn(ctx: Any) -> Any:
                replica = ctx.replica_id_in_sync_group
                start = np.arange(accumulation)[:, None] * global_replicas + replica
                indices = (start * micro + np.arange(micro)[None, :]) % pool  # [GA, micro]
                # Copied to the replica's device once here, never per step.
                with tf.device(local_devices[replica % len(local_devices)]):
                    return tf.identity(tf.convert_to_tensor(np.take(array, indices, axis=0)))

            return strategy.experimental_distribute_values_from_function(value_fn)

        # Real data: each step draws one whole update (R x GA x micro samples) from a tf.data
        # pipeline; the strategy splits it between replicas, and each replica's share is
        # reshaped to [GA, micro, ...] in the update. Waiting for it is timed on the host.
        if config.data == "synthetic":
            self._inputs = per_replica(inputs)
            self._targets = per_replica(targets)
            return
        from pathlib import Path

        from core.data.tf_records import image_dataset

        if inputs.ndim != 4:
            raise ValueError(
                f"TFRecord image data needs a workload whose inputs are images [H, W, C]; "
                f"this one takes {inputs.shape[1:]}"
            )
        dataset = image_dataset(
            Path(config.data), tuple(inputs.shape[1:]), global_replicas * accumulation * micro, config.seed
        )
        self._files = iter(strategy.experimental_distribute_dataset(dataset))

    def _accumulated_gradients(self, loss_fn: Any, jit_compile: bool) -> Callable[[Any, Any], Any]:
        """One replica's gradients summed over its micro-steps, and its loss (XLA-compiled with
        ``jit_compile``)."""
        tf, optimizer, variables = self._tf, self.optimizer, self._variables
        accumulation = self._accumulation
        update_batch = float(self._global_replicas * accumulation * self._micro)
        # tf.keras 2 LossScaleOptimizer: the caller scales the loss (and unscales gradients).
        # Keras 3: scale_loss(); apply_gradients() unscales.
        scale_loss: Callable[[Any], Any] = getattr(
            optimizer, "get_scaled_loss", getattr(optimizer, "scale_loss", lambda loss: loss)
        )

        def micro_step(x: Any, y: Any) -> tuple[list[Any], Any]:
            with tf.GradientTape() as tape:
                outputs = self.model(x, training=True)
                per_sample = tf.cast(loss_fn(y, outputs), tf.float32)
                # Divide by the whole update's batch, so that summing gradients over
                # micro-steps and (all-reduce) replicas gives the gradient of the mean loss.
                loss = tf.reduce_sum(per_sample) / update_batch
                scaled = scale_loss(loss)
            grads = tape.gradient(scaled, variables)
            # Dense accumulators: IndexedSlices (embeddings) are densified here.
            grads = [
                tf.zeros(v.shape, tf.float32) if g is None else tf.convert_to_tensor(g)
                for g, v in zip(grads, variables)
            ]
            return grads, loss

        def accumulate(xs: Any, ys: Any) -> tuple[list[Any], Any]:
            if accumulation == 1:  # no loop at all
                return micro_step(xs[0], ys[0])

            def body(g: Any, acc: list[Any], total: Any) -> tuple[Any, list[Any], Any]:
                step_grads, step_loss = micro_step(tf.gather(xs, g), tf.gather(ys, g))
                return g + 1, [a + b for a, b in zip(acc, step_grads)], total + step_loss

            # A while loop from zeroed accumulators, not Python unrolling nor a micro-step outside
            # the loop to seed them: the graph holds the model's forward and backward once, so
            # tracing and optimising it (most of a run's first step) cost what GA=1's do, whatever
            # the accumulation (a seeding micro-step doubled them: 26 s against 15 s for the small
            # ResNet-50 here). Adding to zeros is exact.
            zeros = [tf.zeros(v.shape, tf.float32) for v in variables]
            _, grads, loss = tf.while_loop(
                lambda g, acc, total: g < accumulation, body, (tf.constant(0), zeros, tf.constant(0.0))
            )
            return grads, loss

        # XLA compiles the per-replica gradient computation; the optimizer apply stays outside
        # it, where every strategy supports its cross-replica merge.
        return tf.function(accumulate, jit_compile=True) if jit_compile else accumulate

    def _make_train_step(self, loss_fn: Any, jit_compile: bool) -> Callable[[Any, Any], None]:
        tf, strategy, optimizer, variables = self._tf, self._strategy, self.optimizer, self._variables
        accumulation, micro, loss_scaling = self._accumulation, self._micro, self._loss_scaling
        global_replicas = self._global_replicas
        compute = self._accumulated_gradients(loss_fn, jit_compile)
        # tf.keras 2's LossScaleOptimizer leaves unscaling to the caller; Keras 3's applies it.
        unscale: Callable[[list[Any]], list[Any]] = (
            optimizer.get_unscaled_gradients if hasattr(optimizer, "get_scaled_loss") else lambda grads: grads
        )

        def replica_update(xs: Any, ys: Any) -> None:
            if self._files is not None:  # [GA x micro, ...] -> [GA, micro, ...]
                xs = tf.reshape(xs, tf.concat([[accumulation, micro], tf.shape(xs)[1:]], 0))
                ys = tf.reshape(ys, tf.concat([[accumulation, micro], tf.shape(ys)[1:]], 0))
            grads, loss = compute(xs, ys)
            grads = unscale(grads)
            if loss_scaling and global_replicas > 1:
                # Keras 3's LossScaleOptimizer judges finiteness on replica 0's local
                # gradients; make every replica see a non-finite gradient if any has one,
                # so a step that overflows anywhere is skipped everywhere.
                bad = tf.distribute.get_replica_context().all_reduce(
                    tf.distribute.ReduceOp.SUM, _any_non_finite(tf, grads)
                )
                grads = [tf.where(bad > 0, tf.fill(tf.shape(g), math.nan), g) for g in grads]
            # In replica context the optimizer all-reduces (sums) gradients across replicas.
            optimizer.apply_gradients(zip(grads, variables))
            self._loss_sum.assign_add(loss)
            # This replica's running sum (its own component here) stays NaN/inf from its first
            # NaN/inf loss on: the updates counted before it name that update.
            self._finite_updates.assign_add(tf.cast(tf.math.is_finite(self._loss_sum.read_value()), tf.float32))

        @tf.function
        def train_step(xs: Any, ys: Any) -> None:
            strategy.run(replica_update, args=(xs, ys))

        return train_step

    def step(self) -> None:
        # Dispatches the update; nothing here reads a value back to the host.
        self._updates += 1
        if self._epochs is not None:
            self._train_step(*self._epoch_update(self._epochs, self._updates - 1))
            return
        if self._files is None:
            self._train_step(self._inputs, self._targets)
            return
        started = time.perf_counter()
        try:
            inputs, targets = next(self._files)
        except Exception as error:  # a damaged record, memory exhausted decoding one: the data's fault
            from core.data.tf_records import pipeline_failure

            raise DataError(pipeline_failure(error, self._data_source)) from error
        self._data_wait_seconds += time.perf_counter() - started
        self._train_step(inputs, targets)

    def _epoch_update(self, epochs: EpochOrder, update: int) -> tuple[Any, Any]:
        """Every replica's samples of ``update`` (from 0), ``[accumulation, micro, ...]`` on its device,
        in :class:`EpochOrder`'s order: the replica's number in the strategy is its global one."""
        tf, strategy, devices, split = self._tf, self._strategy, self._local_devices, self._training_split
        assert split is not None
        taken: dict[int, tuple[Any, Any]] = {}

        def per_replica(part: int) -> Any:
            def value_fn(ctx: Any) -> Any:
                replica = ctx.replica_id_in_sync_group
                if replica not in taken:
                    indices = epochs.update(update, replica)  # [accumulation, micro]
                    started = time.perf_counter()
                    inputs, targets = split.take(indices.reshape(-1))
                    self._data_wait_seconds += time.perf_counter() - started
                    taken[replica] = (inputs.reshape(*indices.shape, *inputs.shape[1:]), targets.reshape(indices.shape))
                with tf.device(devices[replica % len(devices)]):
                    return tf.convert_to_tensor(taken[replica][part])

            return strategy.experimental_distribute_values_from_function(value_fn)

        return per_replica(0), per_replica(1)

    def dataset_samples(self) -> int | None:
        return self._epochs.samples if self._epochs is not None else None

    def evaluate(self) -> dict[str, float] | None:
        """Top-1 and the mean loss over the held-out split, with the current weights in inference mode
        (``training=False``) under the run's precision policy. Global replica ``r`` of ``R`` takes
        samples r, r + R, ... in batches of one fixed shape (padded, the padding weighted 0), so the
        graph is traced once; the replicas' sums are added on the host, and over the workers of a
        multi-worker run, so every process returns what one process would."""
        if self._evaluation_split is None:
            return None
        import numpy as np

        tf, strategy, devices, split = self._tf, self._strategy, self._local_devices, self._evaluation_split
        replicas, samples = self._global_replicas, len(split)
        rows = min(EVALUATION_BATCH, max(1, math.ceil(samples / replicas)))
        shards: dict[int, Any] = {}
        step = self._evaluation_step or self._make_evaluation_step()
        totals = np.zeros(3, dtype=np.float64)
        for start in range(0, math.ceil(samples / replicas), rows):
            taken: dict[int, tuple[Any, Any, Any]] = {}

            def per_replica(part: int, start: int = start, taken: dict[int, tuple[Any, Any, Any]] = taken) -> Any:
                def value_fn(ctx: Any) -> Any:
                    replica = ctx.replica_id_in_sync_group
                    if replica not in shards:
                        shards[replica] = shard(samples, replica, replicas)
                    if replica not in taken:
                        chosen = shards[replica][start : start + rows]
                        padded = np.zeros(rows, dtype=np.int64)
                        padded[: len(chosen)] = chosen
                        weights = (np.arange(rows) < len(chosen)).astype(np.float32)
                        taken[replica] = (*split.take(padded), weights)
                    with tf.device(devices[replica % len(devices)]):
                        return tf.convert_to_tensor(taken[replica][part])

                return strategy.experimental_distribute_values_from_function(value_fn)

            sums = step(per_replica(0), per_replica(1), per_replica(2))
            for local in strategy.experimental_local_results(sums):
                totals += np.asarray(local.numpy(), dtype=np.float64)
        if self._collectives is not None:
            totals = np.sum([np.asarray(part) for part in self._collectives.gather_objects(totals.tolist())], axis=0)
        return metrics_of(totals.tolist())

    def _make_evaluation_step(self) -> Callable[[Any, Any, Any], Any]:
        tf, strategy, loss_fn = self._tf, self._strategy, self._loss_fn

        def replica_sums(xs: Any, ys: Any, weights: Any) -> Any:
            # The loss and the prediction in fp32 whatever the policy computed the outputs in.
            outputs = tf.cast(self.model(xs, training=False), tf.float32)
            per_sample = tf.cast(loss_fn(ys, outputs), tf.float32)
            correct = tf.cast(tf.equal(tf.argmax(outputs, axis=-1, output_type=ys.dtype), ys), tf.float32)
            return tf.stack(
                [tf.reduce_sum(correct * weights), tf.reduce_sum(per_sample * weights), tf.reduce_sum(weights)]
            )

        @tf.function
        def evaluation_step(xs: Any, ys: Any, weights: Any) -> Any:
            return strategy.run(replica_sums, args=(xs, ys, weights))

        self._evaluation_step = evaluation_step
        return evaluation_step

    def data_wait_seconds(self) -> float:
        return self._data_wait_seconds

    def _read_loss_sum(self) -> float:
        # Read in the strategy's scope, i.e. in cross-replica context, where a sync-on-read SUM
        # variable returns the sum of every replica's component (in a replica context it would
        # return only that replica's).
        with self._strategy.scope():
            return float(self._loss_sum.read_value().numpy())

    def synchronize(self) -> None:
        # Every update ends by writing the loss accumulator on each device, and copying a value to
        # the host waits for the device work queued before it (GPU streams run in order; CPU ops
        # complete within the call). So one scalar read is a sync of all queued updates.
        self._read_loss_sum()

    def step_clock(self) -> StepClock:
        # Calling a tf.function returns once its ops are dispatched: on a GPU these host marks
        # time dispatch, while the window's total stays exact through the runner's synchronise.
        return HostStepClock()

    def check_finite(self) -> None:
        first_update = self._updates_checked + 1  # the first update since the last check, counting from 1
        updates = self._updates - self._updates_checked
        self._updates_checked = self._updates
        # Each replica's count, read from its own component; then both counters restart from zero.
        with self._strategy.scope():
            total = float(self._loss_sum.read_value().numpy())
            finite_updates = [float(v.numpy()) for v in self._strategy.experimental_local_results(self._finite_updates)]
            self._loss_sum.assign(0.0)
            self._finite_updates.assign(0.0)
        # The earliest replica's, over every worker: each reaches the same verdict.
        before_fault = int(min(finite_updates, default=updates))
        if self._collectives is not None:
            before_fault = -int(self._collectives.gather_max(-before_fault))
        if before_fault < updates:
            raise NonFiniteLossError(
                f"training loss was NaN/inf in update {first_update + before_fault} of the run, the first since "
                f"the last check (update 1 is the first step; summed since the check: {total})"
            )
        # A NaN/inf in loss-scaled gradients is loss scaling at work (the optimizer skips the
        # update and lowers the scale), not a fault: losses only then. Mirrored weights agree.
        if updates and not self._loss_scaling and float(_any_non_finite(self._tf, self._variables).numpy()):
            where = f"update {first_update}" if updates == 1 else f"one of updates {first_update} to {self._updates}"
            raise NonFiniteLossError(
                f"NaN/inf in a weight after a NaN/inf gradient, in {where} of the run (every loss was finite)"
            )

    def barrier(self) -> None:
        # Across a multi-worker run's processes (in one process the synchronise is all there is).
        if self._collectives is not None:
            self._collectives.barrier()

    def gather_max(self, value: float) -> float:
        return value if self._collectives is None else self._collectives.gather_max(value)

    def gather_objects(self, value: object) -> list[object]:
        return [value] if self._collectives is None else self._collectives.gather_objects(value)

    def details(self) -> dict[str, Any]:
        return dict(self._details)

    def framework_version(self) -> str | None:
        return str(self._tf.__version__)

    def host_threads(self) -> dict[str, int]:
        # 0 stands for TensorFlow's default (one thread per core), as TensorFlow itself reports it.
        threading = self._tf.config.threading
        return {
            "intra_op_threads": threading.get_intra_op_parallelism_threads(),
            "inter_op_threads": threading.get_inter_op_parallelism_threads(),
        }

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        from tensorflow import keras

        keras.mixed_precision.set_global_policy(self._previous_policy)
        self._tf.config.experimental.enable_tensor_float_32_execution(self._previous_tf32)
        # Drop graphs, variables and device-resident data so memory can be reclaimed.
        for name in (
            "_train_step",
            "_evaluation_step",
            "_loss_fn",
            "_training_split",
            "_evaluation_split",
            "_inputs",
            "_targets",
            "_files",
            "_loss_sum",
            "_finite_updates",
            "_variables",
            "model",
            "optimizer",
        ):
            self.__dict__.pop(name, None)
        if self._collectives is not None:
            self._collectives.close()


class KerasInferenceExecutor(KerasExecutor):
    """Inference under the same strategy, precision policy and data layout: one ``step()`` is one
    forward pass (``training=False``) of each replica's micro-batch, in a ``tf.function`` (XLA with
    ``jit_compile``); no optimizer, no gradients. Replicas in one process each run their own batch.
    """

    def _build_model(self, spec: KerasTrainingSpec) -> Any:
        tf = self._tf
        with self._strategy.scope():
            self.model = spec.make_model()
            self.optimizer = None
            self._loss_scaling = False
            self._variables = []
            # Forward passes since the last check whose outputs held a NaN/inf, one count per
            # replica; every step writes it, so reading it is also the synchronise.
            self._loss_sum = _replica_sum(tf)
        return None

    def _make_train_step(self, loss_fn: Any, jit_compile: bool) -> Callable[[Any, Any], None]:
        tf, strategy, micro = self._tf, self._strategy, self._micro

        def forward(xs: Any) -> Any:
            if self._files is not None:  # [micro, ...] -> [1, micro, ...], the synthetic layout
                xs = tf.reshape(xs, tf.concat([[1, micro], tf.shape(xs)[1:]], 0))
            outputs = self.model(xs[0], training=False)
            return _any_non_finite(tf, tf.nest.flatten(outputs))

        compute = tf.function(forward, jit_compile=True) if jit_compile else forward

        def replica_forward(xs: Any, ys: Any) -> None:
            self._loss_sum.assign_add(compute(xs))

        @tf.function
        def inference_step(xs: Any, ys: Any) -> None:
            strategy.run(replica_forward, args=(xs, ys))

        return inference_step

    def check_finite(self) -> None:
        with self._strategy.scope():
            non_finite = float(self._loss_sum.read_value().numpy())
            self._loss_sum.assign(0.0)
        if non_finite:
            raise NonFiniteLossError(
                f"a model output was NaN/inf in {non_finite:g} replica forward pass(es) since the last check"
            )

    def details(self) -> dict[str, Any]:
        return {**super().details(), "mode": "inference", "optimizer": None, "loss_scaling": None}


def keras_executor(spec: KerasTrainingSpec, config: RunConfig, placement: KerasPlacement) -> KerasExecutor:
    """The Keras executor for ``config.mode``: training or inference, on the same placement."""
    if config.mode == "inference":
        return KerasInferenceExecutor(spec, config, placement)
    return KerasExecutor(spec, config, placement)
