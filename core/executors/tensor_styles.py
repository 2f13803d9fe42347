"""DTensor parallel styles for the layers ``parallelize_module``'s own styles do not split right.

torch's ``ColwiseParallel`` and ``RowwiseParallel`` take ``nn.Linear`` (weight (output, input)) and
``nn.Embedding`` only (any other module: NotImplementedError), and split a fused projection as one
block. Two layouts need more:

- a weight stored (input, output), the transpose of ``nn.Linear``'s (GPT-2's ``Conv1D``): colwise
  splits its second dimension, rowwise its first;
- a fused projection whose output features are equal parts one after the other (GPT-2's
  ``c_attn``: [all q | all k | all v]). A plain split would give a device the queries of some heads
  and the keys of others. The parts are interleaved before the split ([q_0 k_0 v_0 | q_1 k_1 v_1 |
  ...], ``interleaved``), so device r's shard is [q_r | k_r | v_r] and the model's own split and
  reshape of its local output are right. The DTensor then holds the interleaved order:
  :func:`deinterleaved` gives the model's order back where the whole weights are gathered.

The styles reuse torch's input and output handling (replicated input, output sharded on the last
dimension for colwise; sharded input, output summed over the group for rowwise); only the
partition of the weights differs.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
from torch.distributed.tensor.placement_types import Placement


def interleaved(tensor: torch.Tensor, dim: int, parts: int, devices: int) -> torch.Tensor:
    """``tensor``'s ``parts`` equal parts along ``dim`` ([p0 | p1 | p2]), each cut into ``devices``
    slices, reordered device by device: [p0_0 p1_0 p2_0 | p0_1 p1_1 p2_1 | ...]."""
    slices = [part.chunk(devices, dim) for part in tensor.chunk(parts, dim)]
    return torch.cat([slices[part][device] for device in range(devices) for part in range(parts)], dim)


def deinterleaved(tensor: torch.Tensor, dim: int, parts: int, devices: int) -> torch.Tensor:
    """The inverse of :func:`interleaved`: the parts one after the other again."""
    blocks = tensor.chunk(devices * parts, dim)  # block device x parts + part
    return torch.cat([blocks[device * parts + part] for part in range(parts) for device in range(devices)], dim)


class LayoutColwiseParallel(ColwiseParallel):
    """Colwise for a weight whose output features are dimension ``output_dim`` (``nn.Linear``: 0,
    ``Conv1D``: 1), of ``parts`` fused equal parts (1: not fused); a bias is split with them."""

    def __init__(self, output_dim: int, parts: int) -> None:
        super().__init__()
        self.output_dim = output_dim
        self.parts = parts

    def _partition(self, name: str, module: nn.Module, mesh: DeviceMesh) -> None:
        for parameter_name, parameter in list(module.named_parameters(recurse=False)):
            dim = self.output_dim if parameter.ndim > 1 else 0
            whole = (
                interleaved(parameter.detach(), dim, self.parts, mesh.size()) if self.parts > 1 else parameter.detach()
            )
            split = distribute_tensor(whole, mesh, [Shard(dim)], src_data_rank=self.src_data_rank)
            module.register_parameter(parameter_name, nn.Parameter(split, requires_grad=parameter.requires_grad))

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return distribute_module(
            module,
            device_mesh,
            self._partition,
            partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
            partial(self._prepare_output_fn, self.output_layouts, self.use_local_output),
        )


class LayoutRowwiseParallel(RowwiseParallel):
    """Rowwise for a weight whose input features are dimension ``input_dim`` (``nn.Linear``: 1,
    ``Conv1D``: 0); the bias, added once to the sum, is replicated. ``output_layouts``: the sum's
    (None: replicated; with sequence parallelism sharded over the sequence)."""

    def __init__(self, input_dim: int, output_layouts: Placement | None = None) -> None:
        super().__init__(output_layouts=output_layouts)
        self.input_dim = input_dim
        self.desired_input_layouts = (Shard(-1),)

    def _partition(self, name: str, module: nn.Module, mesh: DeviceMesh) -> None:
        for parameter_name, parameter in list(module.named_parameters(recurse=False)):
            placement = Shard(self.input_dim) if parameter.ndim > 1 else Replicate()
            split = distribute_tensor(parameter.detach(), mesh, [placement], src_data_rank=self.src_data_rank)
            module.register_parameter(parameter_name, nn.Parameter(split, requires_grad=parameter.requires_grad))

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return distribute_module(
            module,
            device_mesh,
            self._partition,
            partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
            partial(self._prepare_output_fn, self.output_layouts, self.use_local_output),
        )
