"""A workload on XLA devices through core's shared PyTorch executor, and what torch-xla changes in it.

Imported only when a run sets up (it imports torch-xla). The executor is core's: autocast,
gradient accumulation, the loss and gradient check, the phases. torch-xla changes five things,
each a hook of :class:`core.plugin.TorchDeviceHooks`:

- the graph: tensors are lazy; ``torch_xla.sync()`` after each update cuts the traced work there,
  so every micro-step of an update and its optimizer step compile and run as one XLA graph;
- synchronising: ``torch_xla.sync()`` then ``xm.wait_device_ops()`` (the device queue drained);
- recompilations: XLA compiles a graph the first time it sees it; torch-xla's ``CompileTime``
  metric counts every compilation, so one inside the timed window is reported, as core does for
  torch.compile on CUDA;
- replicas as processes: the ``xla`` process group (``init_method="xla://"``), rank 0's weights
  broadcast by ``xm.broadcast_master_param`` and the gradients averaged by ``xm.reduce_gradients``
  (what ``xm.optimizer_step`` does before stepping), a gloo group for core's host-side barriers
  (the ``xla`` backend's barrier does nothing);
- replicas as SPMD: ``torch_xla.runtime.use_spmd()`` before any tensor is placed, each micro-batch
  sharded along its first dimension over a one-axis ``data`` mesh (``xs.mark_sharding``).

fp32 means fp32 here too: torch-xla's mat-mul precision is set to "highest" (on a TPU its default,
"default", multiplies float32 matrices in one bfloat16 pass). bf16 is autocast on the ``xla``
device type, which torch-xla lowers to bfloat16.

Inference runs the same executor's forward under ``torch.no_grad()`` (torch-xla has no inference
tensors), one graph per step; LoadGen's queries are padded to a few sizes, each compiled before
the window (``query_sizes``).
"""

from __future__ import annotations

import logging
import os
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import torch
import torch_xla
import torch_xla.backends
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as metrics
import torch_xla.distributed.spmd as xs
import torch_xla.distributed.xla_backend  # noqa: F401 - registers the "xla" process-group backend
import torch_xla.runtime as xr

from core.plugin import (
    Executor,
    ProcessContext,
    RunConfig,
    RunContext,
    TorchDeviceHooks,
    TorchPlacement,
    Workload,
    torch_executor,
)

from .accelerator import Parallelism
from .discovery import pjrt_device
from .launcher import SPMD_DEVICES_VARIABLE

#: float32 matmuls as float32 (six bfloat16 passes on a TPU, ~22 bits), not torch-xla's TPU default of one pass
MAT_MUL_PRECISION = "highest"
#: torch-xla's metric of XLA compilations: (samples, total nanoseconds, recent samples)
COMPILE_METRIC = "CompileTime"


class XlaHooks(TorchDeviceHooks):
    """torch-xla's share of core's PyTorch step loop, for one run in this process."""

    compiler = "XLA (torch-xla)"
    # The losses' fold into the record of the first NaN/inf one joins each update's graph, where
    # it fuses: the same fold every update, so the same graph (a fold every 256 updates would be
    # a second graph, compiled the first time inside a window).
    losses_folded_every = 1

    def __init__(self, parallelism: Parallelism | None, replicas: int) -> None:
        self.parallelism = parallelism
        processes = parallelism == "processes"
        self.init_method = "xla://" if processes else None
        self.host_collectives_backend = "gloo" if processes else None
        self.reduces_gradients = processes
        self.replicas_in_process = replicas if parallelism == "spmd" else 1
        self._mesh: xs.Mesh | None = None

    # --- set up, before the executor touches the device ---------------------------------------

    def configure(self, config: RunConfig) -> dict[str, Any]:
        """TorchPlacement.configure: called first by the executor. Touches no device: in a
        process of several, torch-xla's ``xla://`` rendezvous must configure the runtime first."""
        if self.parallelism == "spmd":
            self._start_spmd(config.replicas)
        if torch_xla.backends.get_mat_mul_precision() != MAT_MUL_PRECISION:
            # torch-xla logs a warning against setting it "multiple times" on every call, the first too.
            backends_log = logging.getLogger("torch_xla.backends")
            level = backends_log.level
            backends_log.setLevel(logging.ERROR)
            try:
                torch_xla.backends.set_mat_mul_precision(MAT_MUL_PRECISION)
            finally:
                backends_log.setLevel(level)
        return {
            "pjrt_device": pjrt_device(),
            "parallelism": self.parallelism,
            "torch_xla_version": torch_xla.__version__,
            "xla_mat_mul_precision": torch_xla.backends.get_mat_mul_precision(),
            "gradient_all_reduce": {
                "processes": "xm.reduce_gradients over the xla process group",
                "spmd": "inserted by XLA's SPMD partitioner (batch sharded over the data mesh)",
            }.get(self.parallelism or "", None),
        }

    def _start_spmd(self, replicas: int) -> None:
        wanted = os.environ.get(SPMD_DEVICES_VARIABLE)
        if wanted != str(replicas):
            raise RuntimeError(
                f"an SPMD run of {replicas} replicas runs in a process the xla plugin starts ({SPMD_DEVICES_VARIABLE}="
                f"{wanted!r} here): run it through core.run or `core run`, which start one"
            )
        if torch_xla._XLAC._xla_runtime_is_initialized() and not xr.is_spmd():
            raise RuntimeError("torch-xla's runtime started in this process before SPMD was switched on")
        xr.use_spmd()
        devices = xr.global_runtime_device_count()
        if devices != replicas:
            raise RuntimeError(f"SPMD over {replicas} replicas, but torch-xla's runtime has {devices} device(s)")
        self._mesh = xs.Mesh(np.arange(devices), (devices,), ("data",))

    def model_placed(self, model: torch.nn.Module) -> None:
        if self.parallelism == "processes":
            # Every process built the same seeded weights; rank 0's are made everyone's, as DDP does.
            xm.broadcast_master_param(model)

    def check_runtime(self, process: ProcessContext) -> None:
        """After the executor placed the model: the runtime spans what the run asked for, so a
        replica can never train alone believing it is averaged with others."""
        if self.parallelism == "processes":
            own = xr.addressable_runtime_device_count()
            if own != 1:
                raise RuntimeError(
                    f"this process addresses {own} XLA devices; parallelism=processes places one per process "
                    "(TPU v2/v3 chips hold two: use parallelism=spmd)"
                )
            if xr.world_size() != process.world_size:
                raise RuntimeError(
                    f"torch-xla's replication spans {xr.world_size()} device(s) but the run has {process.world_size} "
                    "processes: the gradients would not be averaged over all of them"
                )

    # --- the step loop -----------------------------------------------------------------------

    def place_batch(self, tensor: torch.Tensor) -> torch.Tensor:
        if self._mesh is not None:
            # Samples over the data axis, every other dimension whole on each device.
            xs.mark_sharding(tensor, self._mesh, ("data",) + (None,) * (tensor.dim() - 1))
        return tensor

    def reduce_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        if self.reduces_gradients:
            xm.reduce_gradients(optimizer)  # sum over the replicas, scaled by 1 / replicas

    def cut_graph(self) -> None:
        torch_xla.sync()

    def no_grad(self) -> AbstractContextManager[Any]:
        # Not torch.inference_mode(): torch-xla's functionalization sets a version counter on every
        # tensor it wraps, and inference tensors have none (torch-xla 2.9.0 raises "Cannot set
        # version_counter for inference tensor" in the first forward). no_grad records nothing either.
        return torch.no_grad()

    def query_sizes(self, largest: int) -> tuple[int, ...]:
        # XLA compiles a program per input shape: queries of 1..largest samples are padded to powers
        # of two and to largest, at most log2(largest) + 1 programs, at most half of a batch wasted.
        powers = tuple(1 << bit for bit in range(largest.bit_length()) if 1 << bit < largest)
        return (*powers, largest)

    def synchronize(self, device: torch.device) -> None:
        torch_xla.sync()
        xm.wait_device_ops()

    def compiled_graphs(self, config: RunConfig) -> int | None:
        data = metrics.metric_data(COMPILE_METRIC)
        return int(data[0]) if data else 0

    def details(self) -> dict[str, Any]:
        data = metrics.metric_data(COMPILE_METRIC)
        return {
            "xla_compilations": int(data[0]) if data else 0,
            "xla_compile_seconds": float(data[1]) / 1e9 if data else 0.0,
        }


def xla_executor(workload: Workload, context: RunContext, parallelism: Parallelism | None) -> Executor:
    """Core's PyTorch executor for this process's share of the run, on its XLA device(s)."""
    config, process = context.config, context.process
    hooks = XlaHooks(parallelism, config.replicas)
    placement = TorchPlacement(
        # Each process's own device (one chip per process), or SPMD's one virtual device over all.
        device="xla:0",
        distributed_backend="xla" if parallelism == "processes" else None,
        configure=hooks.configure,
        hooks=hooks,
    )
    executor = torch_executor(workload.build_torch(context.workload_options, config.seed), config, placement, process)
    try:
        hooks.check_runtime(process)
    except BaseException:
        executor.close()
        raise
    return executor
