"""How a workload's PyTorch model splits its layers over the devices of a tensor-parallel group.

Tensor parallelism is Megatron-LM's: a block's first linear layer split by output features
("colwise"), its second by input features ("rowwise"), so each device holds whole attention heads
and a slice of the MLP and one all-reduce per pair joins them. The workload knows its module paths;
core's PyTorch executor turns the plan into ``torch.distributed.tensor.parallel.parallelize_module``
styles. A workload without a plan cannot run with ``tensor_parallel > 1`` (planning refuses it).

Two layouts need more than a module path and a style: a fused projection whose output features are
equal parts one after the other (GPT-2's ``c_attn``: [all queries | all keys | all values]), which a
plain colwise split would cut into one device's queries and another's keys (``fused_parts``), and a
weight stored (input, output), transposed against ``nn.Linear``'s (output, input) (GPT-2's
``Conv1D``: ``transposed``).
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
    #: colwise module path pattern -> the equal parts its output features concatenate (3 for a fused
    #: query/key/value projection laid out [all q | all k | all v]): each part is split over the
    #: devices on its own, so a device holds its heads' q, k and v, laid out [q | k | v]
    fused_parts: Mapping[str, int] = field(default_factory=dict)
    #: module path patterns whose weight is stored (input features, output features), the transpose
    #: of ``nn.Linear``'s (GPT-2's ``Conv1D``): colwise splits its second dimension, rowwise its first
    transposed: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for pattern, parts in self.fused_parts.items():
            if self.styles.get(pattern) != "colwise" or parts < 2:
                raise ValueError(
                    f"fused_parts names {pattern!r} ({parts}): a colwise pattern of styles, 2 parts or more"
                )
        for pattern in self.transposed:
            if pattern not in self.styles:
                raise ValueError(f"transposed names {pattern!r}, which styles does not")

    def indivisible(self, tensor_parallel: int) -> list[str]:
        """The sizes ``tensor_parallel`` does not divide, as 'attention heads 8' (empty: it divides all)."""
        return [f"{name} {size}" for name, size in self.divided.items() if size % tensor_parallel]
