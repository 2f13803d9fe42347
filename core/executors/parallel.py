"""One replica over several devices, and sharded replicas, with PyTorch's own engines.

The run's processes form a device mesh ``data x pipeline x tensor`` (``replicas x
pipeline_parallel x tensor_parallel``; global rank = ``(data x pipeline + stage) x tensor +
tensor rank``), one process per device under core's torchrun launch. On it:

- tensor parallelism: ``parallelize_module`` over the ``tensor`` dimension with the workload's
  :class:`core.contract.parallel.TensorParallelPlan` (Megatron's colwise/rowwise pairs);
- sharded data parallelism: ``fully_shard`` (FSDP2) over the ``data`` dimension, each transformer
  layer (every member of an ``nn.ModuleList``) a unit of its own, then the root; "fsdp-offload"
  keeps the shards in host memory (``CPUOffloadPolicy``);
- plain data parallelism of a tensor-parallel or pipelined replica: its gradients (the local shards
  of DTensor ones) averaged over the ``data`` dimension after the last micro-step;
- pipeline stages (:class:`PipelinedReplica`), each stage's module split over ``tensor`` and sharded
  over ``data`` as a whole model's would be, before ``torch.distributed.pipelining`` wraps it: its
  ``PipelineStage`` runs an FSDP2 module's micro-batches without gradient sync and reduce-scatters
  after the last. A rowwise layer's output is a whole plain tensor on every tensor rank, so a
  stage's output is the same on each, and each tensor rank sends to the same tensor rank of the
  next stage (the ``pipeline`` group of its own ``data`` and ``tensor`` coordinates).

fp16's dynamic loss scaling (core.executors.mesh_scaler, PyTorch's ``ShardedGradScaler``) checks each
process's part of the gradients and all-reduces the verdict over every process of the run: all skip
a step where any gradient anywhere was NaN/inf, and all lower (or raise) the scale alike.

The processes of one replica read the same samples: the data-parallel rank is
``rank // devices_per_replica``. The executor (core.executors.pytorch) calls this module only where
``uses_replica_placement`` holds; plain DDP stays as it was.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch

from core.base.config import RunConfig
from core.contract.parallel import SequenceParallelPlan, TensorParallelPlan
from core.contract.pipeline import PipelineLayout

#: the mesh's dimensions, outermost first
MESH_DIMENSIONS = ("data", "pipeline", "tensor")


def uses_replica_placement(config: RunConfig) -> bool:
    """Whether the run needs the device mesh: a replica over several devices, or sharded weights."""
    return config.devices_per_replica > 1 or config.sharding != "none"


def mesh_shape(config: RunConfig) -> tuple[int, int, int]:
    """(data, pipeline, tensor): replicas, pipeline stages, tensor-parallel degree."""
    return config.replicas, config.pipeline_parallel, config.tensor_parallel


def data_rank(config: RunConfig, rank: int) -> int:
    """The replica a process belongs to: every device of a replica reads the replica's samples."""
    return rank // config.devices_per_replica


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This process's part of ``tensor`` (a DTensor's local shard), or ``tensor`` itself."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def parameter_bytes_per_rank(model: torch.nn.Module) -> list[int]:
    """The bytes of weights each process of the run holds (its shards, its stage), rank by rank: one
    gather of a number per process, once (a collective: every process calls it)."""
    held = sum(local_tensor(p.detach()).numel() * p.element_size() for p in model.parameters())
    gathered: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, held)
    return [int(value) for value in gathered]


def full_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's whole weights on the host, gathered from every shard (a collective: every process
    of the run calls it)."""
    from torch.distributed.tensor import DTensor

    state = {}
    for name, tensor in model.state_dict().items():
        whole = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        state[name] = whole.detach().cpu().clone()
    return state


class ReplicaPlacement:
    """The device mesh of a run, and what it does to the model and its gradients."""

    def __init__(self, config: RunConfig, device: torch.device, plan: TensorParallelPlan | None) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        self._config = config
        self._plan = plan
        self._device = device
        self.mesh = init_device_mesh(device.type, mesh_shape(config), mesh_dim_names=MESH_DIMENSIONS)
        self._fsdp: list[Any] = []  # the fully_shard modules, whose gradient sync the micro-steps switch
        #: state names of fused weights split part by part -> (dimension, parts): their DTensors hold
        #: the parts interleaved device by device (core.executors.tensor_styles)
        self._fused: dict[str, tuple[int, int]] = {}
        #: this process's stage of a pipelined replica (None: the replica is not pipelined)
        self.pipeline: PipelinedReplica | None = None

    @property
    def tensor_parallel(self) -> int:
        return self._config.tensor_parallel

    @property
    def sharded(self) -> bool:
        return self._config.sharding != "none"

    def place(
        self,
        model: torch.nn.Module,
        layout: PipelineLayout | None = None,
        make_stage: Any = None,
        loss_fn: Any = None,
        precision: Any = None,
    ) -> torch.nn.Module:
        """Split ``model`` over the tensor dimension, then shard it over the data dimension; or cut
        it into pipeline stages (``layout``'s blocks, each stage's module built by ``make_stage``)
        and return this process's stage, split and sharded the same way; the stages run forward and
        the loss in ``precision``'s context, the last scales the loss with it (a
        :class:`core.base.precision.PrecisionPolicy`; None: fp32 as it is)."""
        if self._config.pipeline_parallel > 1:
            if layout is None or make_stage is None or loss_fn is None:
                raise ValueError("pipeline stages need the workload's pipeline_layout and pipeline_stage, and the loss")
            # The plan's patterns name the whole model's modules: checked there, applied where the
            # stage holds them (the other stages' layers are nn.Identity in this one).
            whole_model_modules = [name for name, _ in model.named_modules()]
            self._check_tied_weights_whole(model)

            def split_and_shard(stage: torch.nn.Module) -> None:
                self._split_and_shard(stage, whole_model_modules)

            self.pipeline = PipelinedReplica(
                self._config, self.mesh, model, layout, make_stage, loss_fn, self._device, split_and_shard, precision
            )
            return self.pipeline.module
        self._split_and_shard(model, [name for name, _ in model.named_modules()])
        return model

    def _split_and_shard(self, model: torch.nn.Module, plan_modules: list[str]) -> None:
        # Tensor parallelism first: FSDP2 then shards the DTensor weights over data (2-D), as
        # torch's own composition expects.
        if self.tensor_parallel > 1:
            self._parallelize(model, plan_modules)
        if self.sharded:
            self._shard(model)

    def _check_tied_weights_whole(self, model: torch.nn.Module) -> None:
        """A weight tied over stages stays whole over the tensor dimension: each stage's copy must be
        split alike for their local gradients to add up, which the plan's colwise (output layer)
        and rowwise (embedding) styles would not be."""
        if self.tensor_parallel == 1 or self._plan is None:
            return
        names = [name for name, _ in model.named_modules()]
        split = {name for pattern in self._plan.styles for name in fnmatch.filter(names, pattern)}
        for tie in tied_parameters(model):
            owners = [name.rpartition(".")[0] for name in tie]
            if any(owner in split for owner in owners):
                raise ValueError(
                    f"the tensor-parallel plan splits {', '.join(owners)}, whose weight is tied over pipeline stages"
                )

    def _parallelize(self, model: torch.nn.Module, plan_modules: list[str]) -> None:
        """``plan_modules``: the modules the plan's patterns must match (the whole model's, for a
        stage); each is split where ``model`` holds it."""
        from torch.distributed.tensor.parallel import parallelize_module

        if self._plan is None:  # planning refuses it; a direct caller learns why here
            raise ValueError("tensor_parallel > 1 needs the workload's tensor_parallel_plan")
        sequence = self._plan.sequence_parallel
        held = [name for name, _ in model.named_modules()]
        plan: dict[str, Any] = {}
        claimed: set[str] = set()
        for pattern, style in self._plan.styles.items():
            for name in _matching(plan_modules, pattern, "tensor-parallel"):
                if name in claimed:
                    raise ValueError(f"module {name!r} matches two patterns of the tensor-parallel plan")
                claimed.add(name)
                if name in held:
                    plan[name] = self._style(pattern, style, model.get_submodule(name))
        for pattern, parts in self._plan.fused_parts.items():
            for name in fnmatch.filter(held, pattern):
                for parameter_name, parameter in model.get_submodule(name).named_parameters(recurse=False):
                    dim = plan[name].output_dim if parameter.ndim > 1 else 0
                    self._fused[f"{name}.{parameter_name}"] = (dim, parts)
        if sequence is not None:
            plan.update(_sequence_parallel_styles(sequence, plan_modules, held))
        mesh = self.mesh["tensor"]
        parallelize_module(model, mesh, plan)
        if sequence is not None:
            _split_sequence_over_layer_stack(model, sequence, mesh)
        for pattern, attributes in self._plan.head_count_attributes.items():
            for name in fnmatch.filter(held, pattern):
                module = model.get_submodule(name)
                for attribute in attributes:
                    setattr(module, attribute, getattr(module, attribute) // self.tensor_parallel)

    def _style(self, pattern: str, style: str, module: torch.nn.Module) -> Any:
        """torch's own style for an ``nn.Linear`` split as one block; core's for a transposed weight
        or fused parts (core.executors.tensor_styles)."""
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        from core.executors.tensor_styles import LayoutColwiseParallel, LayoutRowwiseParallel

        assert self._plan is not None
        transposed = pattern in self._plan.transposed
        parts = self._plan.fused_parts.get(pattern, 1)
        if style == "colwise":
            if isinstance(module, torch.nn.Linear) and not transposed and parts == 1:
                return ColwiseParallel()
            return LayoutColwiseParallel(output_dim=1 if transposed else 0, parts=parts)
        # with sequence parallelism the sum over the group is reduce-scattered over the sequence
        sequence = self._plan.sequence_parallel
        summed = Shard(sequence.dimension) if sequence is not None else Replicate()
        if isinstance(module, torch.nn.Linear) and not transposed:
            return RowwiseParallel(output_layouts=summed)
        return LayoutRowwiseParallel(input_dim=0 if transposed else 1, output_layouts=summed)

    def _shard(self, model: torch.nn.Module) -> None:
        from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

        policy = CPUOffloadPolicy() if self._config.sharding == "fsdp-offload" else OffloadPolicy()
        mesh = self.mesh["data"]
        # Each layer of a stack is a unit of its own: its weights are gathered just before it runs
        # and freed after, so no device holds more than a layer's whole weights at once. A stage's
        # stand-ins for other stages' layers (no weights) are none.
        layers = [
            layer
            for module in model.modules()
            if isinstance(module, torch.nn.ModuleList)
            for layer in module
            if any(True for _ in layer.parameters())
        ]
        for layer in layers:
            self._fsdp.append(fully_shard(layer, mesh=mesh, offload_policy=policy))
        self._fsdp.append(fully_shard(model, mesh=mesh, offload_policy=policy))

    def micro_step(self, last: bool) -> None:
        """Before a micro-step's backward: sharded gradients are reduced on the last one only (a
        pipeline's stage does so itself)."""
        if self.sharded and self.pipeline is None:
            self._fsdp[-1].set_requires_gradient_sync(last)

    def reduce_gradients(self, parameters: list[torch.nn.Parameter]) -> None:
        """After an update's last backward: average the gradients of a replica that is not sharded
        over the replicas (FSDP has reduced a sharded one already)."""
        replicas = self._config.replicas
        if self.sharded or replicas == 1:
            return
        group = self.mesh["data"].get_group()
        for parameter in parameters:
            if parameter.grad is None:
                continue
            gradient = local_tensor(parameter.grad)
            torch.distributed.all_reduce(gradient, group=group)
            gradient.div_(replicas)

    def full_state(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The whole model's weights on the host: gathered from the shards, and from every stage (a
        collective: every process of the run calls it)."""
        from core.executors.tensor_styles import deinterleaved

        state = full_state(model)
        for name, (dim, parts) in self._fused.items():
            if name in state:  # a pipeline stage holds its own layers only
                state[name] = deinterleaved(state[name], dim, parts, self.tensor_parallel)
        if self.pipeline is None:
            return state
        stages: list[Any] = [None] * self._config.pipeline_parallel
        torch.distributed.all_gather_object(stages, state, group=self.mesh["pipeline"].get_group())
        return {name: tensor for stage in stages for name, tensor in stage.items()}

    def details(self) -> dict[str, Any]:
        data, pipeline, tensor = mesh_shape(self._config)
        return {
            "device_mesh": {"data": data, "pipeline": pipeline, "tensor": tensor},
            "sharding": self._config.sharding,
            "tensor_parallel_modules": len(self._plan.styles) if self._plan is not None and tensor > 1 else 0,
            # the activations between the split layers sliced over the sequence (Megatron's)
            "sequence_parallel": self._plan is not None and tensor > 1 and self._plan.sequence_parallel is not None,
            "pipeline": self.pipeline.details() if self.pipeline is not None else None,
        }


def _matching(names: list[str], pattern: str, part: str) -> list[str]:
    matched = fnmatch.filter(names, pattern)
    if not matched:
        raise ValueError(f"the {part} plan names {pattern!r}, which is no module of the model")
    return matched


def _sequence_parallel_styles(sequence: SequenceParallelPlan, names: list[str], held: list[str]) -> dict[str, Any]:
    """The norms run on the sequence slice (their weights' gradients summed over the group by
    DTensor); the split blocks gather their input whole first. Everything passes plain tensors
    between modules (``use_local_output``), as the model's own code expects. ``names``: the modules
    the patterns must match (the whole model's); ``held``: those this process holds (its stage's)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput, SequenceParallel

    split = Shard(sequence.dimension)
    styles: dict[str, Any] = {}
    for pattern in sequence.norms:
        norm = SequenceParallel(sequence_dim=sequence.dimension, use_local_output=True)
        styles.update({name: norm for name in _matching(names, pattern, "sequence-parallel") if name in held})
    for pattern in sequence.gathered:
        gather = PrepareModuleInput(input_layouts=(split,), desired_input_layouts=(Replicate(),), use_local_output=True)
        styles.update({name: gather for name in _matching(names, pattern, "sequence-parallel") if name in held})
    return styles


def _split_sequence_over_layer_stack(model: torch.nn.Module, sequence: SequenceParallelPlan, mesh: Any) -> None:
    """The stack's first layer takes a slice of the sequence (a local cut, no traffic; its backward
    gathers the gradient) and its last gives the whole sequence back (an all-gather), so what runs
    outside the stack (embeddings, the final norm, the output layer, another pipeline stage) sees
    whole activations. Only the layers this process holds count: a pipeline stage's others are
    ``nn.Identity``."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput, PrepareModuleOutput, parallelize_module

    split = Shard(sequence.dimension)
    stack = model.get_submodule(sequence.layers)
    if not isinstance(stack, torch.nn.ModuleList):
        raise ValueError(f"the sequence-parallel plan's layers {sequence.layers!r} are no ModuleList of the model")
    held = [layer for layer in stack if not isinstance(layer, torch.nn.Identity)]
    if not held:
        return
    parallelize_module(
        held[0],
        mesh,
        PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(split,), use_local_output=True),
    )
    parallelize_module(held[-1], mesh, PrepareModuleOutput(output_layouts=split, desired_output_layouts=Replicate()))


def _in_context(forward: Callable[..., Any], context: Callable[[], AbstractContextManager[Any]]) -> Callable[..., Any]:
    def in_context(*args: Any, **kwargs: Any) -> Any:
        with context():
            return forward(*args, **kwargs)

    return in_context


def balanced_layers(layers: int, stages: int) -> tuple[int, ...]:
    """Whole layers per stage, as even as they go (the first stages take one more)."""
    return tuple(layers // stages + (1 if stage < layers % stages else 0) for stage in range(stages))


def tied_parameters(model: torch.nn.Module) -> list[tuple[str, ...]]:
    """Names of each weight that several modules share (an output layer tied to the embeddings)."""
    names: dict[int, list[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(parameter), []).append(name)
    return [tuple(group) for group in names.values() if len(group) > 1]


#: the schedule of ``pipeline_schedule`` None
DEFAULT_PIPELINE_SCHEDULE = "1f1b"


def bubble_fraction(stages: int, micro_batches: int) -> float:
    """The idle share of a GPipe or 1F1B pipeline: (stages - 1) / (micro-batches + stages - 1)."""
    return (stages - 1) / (micro_batches + stages - 1)


class PipelinedReplica:
    """One stage of a replica cut into ``pipeline_parallel`` stages of whole layers, run by
    ``torch.distributed.pipelining``'s GPipe or 1F1B schedule over the update's micro-batches
    (``gradient_accumulation``; the schedule averages their gradients). The workload builds the
    stage's module (``TorchTrainingSpec.pipeline_stage``): ``torch.distributed.pipelining.pipeline``
    traces a GPT-NeoX with torch.export, but its stage modules then miss the rotary embedding's
    no-grad region's input (torch 2.13: "Expected positional argument for parameter
    unsqueeze_default"), so the stages are cut by hand.

    A weight tied over stages (GPT's output layer and token embeddings) is a copy on each stage that
    holds it: their gradients are summed over the pipeline after backward, so every copy takes the
    same step and the copies stay one weight. ``prepare`` (tensor parallelism, FSDP2) transforms the
    stage's module before the schedule wraps it.

    ``precision`` (the run's policy) gives the context a stage's forward and the loss run in
    (autocast), and scales the loss inside the schedule's loss function on the last stage: the
    schedule's backward carries the scale through every stage's gradients, and the losses reported
    are the unscaled ones.
    """

    def __init__(
        self,
        config: RunConfig,
        mesh: Any,
        model: torch.nn.Module,
        layout: PipelineLayout,
        make_stage: Any,
        loss_fn: Any,
        device: torch.device,
        prepare: Callable[[torch.nn.Module], None] | None = None,
        precision: Any = None,
    ) -> None:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        self.stages = config.pipeline_parallel
        self.micro_batches = config.gradient_accumulation
        self.schedule_name = config.pipeline_schedule or DEFAULT_PIPELINE_SCHEDULE
        parameters = dict(model.named_parameters(remove_duplicate=False))
        self._tied = [(names, tuple(parameters[names[0]].shape)) for names in tied_parameters(model)]
        self._device = device
        #: a tied weight's copies are sharded alike over the data dimension (dimension 0, FSDP2's)
        self._data = mesh["data"] if config.sharding != "none" else None
        self.layers = balanced_layers(len(layout.blocks), self.stages)
        self._group = mesh["pipeline"].get_group()
        self.stage_index = mesh["pipeline"].get_local_rank()
        self.is_first = self.stage_index == 0
        self.is_last = self.stage_index == self.stages - 1
        first_block = sum(self.layers[: self.stage_index])
        blocks = range(first_block, first_block + self.layers[self.stage_index])
        self.module: torch.nn.Module = make_stage(model, blocks, self.is_first, self.is_last)
        if prepare is not None:
            prepare(self.module)
        self._losses: list[torch.Tensor] = []  # the last stage's unscaled losses of the update
        if precision is not None:
            context = precision.forward_context
            # the forward only: the schedule interleaves backward, which runs outside autocast
            self.module.forward = _in_context(self.module.forward, context)
            loss_fn = self._scaled_loss(loss_fn, context, precision.scale_loss)
        stage = PipelineStage(self.module, self.stage_index, self.stages, device, group=self._group)
        schedule = ScheduleGPipe if self.schedule_name == "gpipe" else Schedule1F1B
        self._schedule = schedule(stage, n_microbatches=self.micro_batches, loss_fn=loss_fn)

    def _scaled_loss(
        self,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        context: Callable[[], AbstractContextManager[Any]],
        scale: Callable[[torch.Tensor], torch.Tensor],
    ) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        def scaled(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            with context():
                loss = loss_fn(output, target)
            self._losses.append(loss.detach())
            return scale(loss)

        return scaled

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> list[torch.Tensor]:
        """Forward and backward of the update's micro-batches (``inputs`` holds them one after the
        other); the last stage returns each micro-batch's loss, the others none."""
        losses: list[torch.Tensor] = []
        if self.is_first and self.is_last:
            raise ValueError("a pipeline needs two stages or more")
        self._losses.clear()
        if self.is_first:
            self._schedule.step(inputs)
        elif self.is_last:
            self._schedule.step(target=targets, losses=losses)
        else:
            self._schedule.step()
        self._sum_tied_gradients()
        # The schedule's are what backward took (scaled under fp16); the loss function kept the
        # unscaled ones, the micro-batches' last (the first step's set-up also calls it, on no data).
        return self._losses[-self.micro_batches :] if self._losses else losses

    def _sum_tied_gradients(self) -> None:
        """Each tie's gradient summed over the stages, in place, on this process's shard of it (FSDP's
        over data; the tied weights stay whole over tensor): one all-reduce per tie, which every stage
        joins, with zeros where it holds no copy."""
        parameters = dict(self.module.named_parameters(remove_duplicate=False))
        for names, shape in self._tied:
            # by identity: a stage may hold one copy under both names
            held = list({id(p): p for p in (parameters[name] for name in names if name in parameters)}.values())
            for parameter in held:  # a copy the stage holds but does not use takes the same step
                if parameter.grad is None:
                    parameter.grad = torch.zeros_like(parameter)
            gradients = [local_tensor(p.grad) for p in held if p.grad is not None]
            if gradients:
                total = gradients[0]
                for other in gradients[1:]:
                    total.add_(other)
            else:
                total = torch.zeros(self._local_shape(shape), device=self._device)
            torch.distributed.all_reduce(total, group=self._group)
            for other in gradients[1:]:
                other.copy_(total)

    def _local_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """This process's part of a weight of ``shape`` it does not hold: FSDP2's chunk of dimension
        0 for its data rank (torch.chunk's, empty past the last chunk), or the whole."""
        if self._data is None:
            return shape
        chunks = torch.empty(shape, device="meta").chunk(self._data.size(), dim=0)
        rank = self._data.get_local_rank()
        return tuple(chunks[rank].shape) if rank < len(chunks) else (0, *shape[1:])

    def details(self) -> dict[str, Any]:
        return {
            "stages": self.stages,
            "stage": self.stage_index,
            "layers_per_stage": list(self.layers),
            "schedule": self.schedule_name,
            "micro_batches": self.micro_batches,
            # the schedule's own idle share, not a measurement
            f"bubble_fraction_{self.schedule_name}": round(bubble_fraction(self.stages, self.micro_batches), 6),
        }
