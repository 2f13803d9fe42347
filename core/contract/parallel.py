"""How a workload's PyTorch model splits its layers over the devices of a tensor-parallel group.

Tensor parallelism is Megatron-LM's: a block's first linear layer split by output features
("colwise"), its second by input features ("rowwise"), so each device holds whole attention heads
and a slice of the MLP and one all-reduce per pair joins them. The workload knows its module paths;
core's PyTorch executor turns the plan into ``torch.distributed.tensor.parallel.parallelize_module``
styles. A workload without a plan cannot run with ``tensor_parallel > 1`` (planning refuses it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

#: how one linear layer is split: by output features (its outputs stay sharded) or by input
#: features (its outputs are summed over the group)
TensorParallelStyle = Literal["colwise", "rowwise"]


@dataclass(frozen=True)
class SequenceParallelPlan:
    """Megatron-LM's sequence parallelism (Korthikanti et al. 2022), with the tensor parallelism it
    belongs to: between the split layers (layer norms, dropouts, residual sums) each device of the
    tensor group holds a slice of the sequence instead of the whole of it. A split block's input is
    gathered whole before its colwise layer, and its rowwise layer's output is reduce-scattered over
    the sequence instead of all-reduced: the same traffic, and those activations take 1/t of the
    memory."""

    #: the layer stack (an ``nn.ModuleList``'s path): the input of its first layer is sliced, the
    #: output of its last layer gathered whole again, for what runs outside the stack
    layers: str
    #: patterns of modules that run on the sequence slice as they are (layer norms)
    norms: tuple[str, ...]
    #: patterns of modules whose first input is gathered whole over the sequence (the blocks whose
    #: first layer is colwise: attention, MLP)
    gathered: tuple[str, ...]
    #: the sequence dimension of the activations (batch first: 1)
    dimension: int = 1


@dataclass(frozen=True)
class TensorParallelPlan:
    """Module paths (``fnmatch`` patterns over ``model.named_modules()`` of ``build_torch``'s model,
    ``*`` for a layer's index) and how each is split."""

    styles: Mapping[str, TensorParallelStyle]
    #: module path pattern -> attributes holding a head count that is per device once split (a model
    #: that reshapes by its stored head count needs them divided by the tensor degree); none where
    #: the model infers the heads from the tensor's width
    head_count_attributes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: sizes the tensor degree must divide, by name ("attention heads": 8, "MLP width": 8192)
    divided: Mapping[str, int] = field(default_factory=dict)
    #: how the activations between the split layers are split over the sequence (None: they are
    #: whole on every device of the group); every rowwise layer's output is then sequence-split
    sequence_parallel: SequenceParallelPlan | None = None

    def indivisible(self, tensor_parallel: int) -> list[str]:
        """The sizes ``tensor_parallel`` does not divide, as 'attention heads 8' (empty: it divides all)."""
        return [f"{name} {size}" for name, size in self.divided.items() if size % tensor_parallel]
