"""Activation recomputation (``RunConfig.recompute``) of a PyTorch model's layer stack, with PyTorch's
own non-reentrant checkpointing: activations a layer would keep for its backward are dropped in the
forward and computed again in the backward, trading compute for memory.

The layers are the blocks the workload names for pipeline stages (``Workload.pipeline_layout``: its
``pipeline_blocks`` pattern over the model's module paths), so there is one naming of a model's
layer stack, not two. The choices, as core.running.replica_plan counts their memory and FLOPs:

- ``"full"``: each layer's forward runs under ``torch.utils.checkpoint`` (non-reentrant), set on the
  module instance: parameter names, the module tree and the module's hooks stay as they were, so
  FSDP2's ``fully_shard`` (its pre-backward gathers the weights the recomputation uses), tensor
  parallelism's DTensors, the hand-cut pipeline stages and torch.compile run it unchanged
  (``torch.distributed._composable.checkpoint``, hooks around the module, fails under torch.compile
  in torch 2.13: "Recomputed values ... have different metadata"). Only the layer's inputs are kept;
  its whole forward runs again in the backward (replica_plan: ``2sbh`` per layer and one layer's
  activations while it is recomputed; HFU counts each layer's forward FLOPs once more).
- ``"selective"``: Megatron-LM's selective recomputation (Korthikanti et al. 2022): the attention
  core of each layer (QK^T, scaling, mask, softmax, dropout, the weighted sum over V) is
  recomputed, every linear layer's output is kept. The attention core is one call in the models
  core runs, ``torch.nn.functional.scaled_dot_product_attention`` (transformers' "sdpa"
  implementation), so each such call inside a layer's forward runs under ``torch.utils.checkpoint``
  (non-reentrant): its inputs (q, k, v after the rotary embedding: the linear layer's output, which
  Megatron keeps too) are kept, what the attention computes inside is not, and the kernel runs
  again in the backward. HFU counts each layer's attention scores and weighted values once more
  (``TransformerShape.attention_score_forward_flops``), exactly that call's FLOPs.

  Why not a selective-checkpoint policy (``torch.utils.checkpoint.create_selective_checkpoint_contexts``)
  over the whole layer, saving everything but the attention ops: such a policy caches the output of
  every op it saves, also those autograd would not keep (each intermediate of the rotary embedding,
  views that hold the attention's output alive), so the layer would keep more than without
  recomputation. And a policy that saves only matmul outputs recomputes the norms and GeLU too,
  which is more than Megatron's selective and than HFU counts.

  The memory model: with an unfused attention, Megatron's ``5as^2b`` scores per layer are what
  "selective" drops (replica_plan's ``34sbh`` instead of ``sbh(34 + 5as/h)``). A fused kernel keeps no
  scores anyway (``TransformerShape.fused_attention``: replica_plan counts none and selective alike);
  recomputing it still drops what the kernel keeps for its own backward (its output and the
  softmax's log-sum-exp), a little below replica_plan's ``34sbh``.

A layer under "selective" that makes no such call would recompute nothing: its first forward raises
a ConfigError naming ``recompute`` instead of letting the run pass for one that recomputes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from core.base.errors import ConfigError
from core.contract.pipeline import PipelineLayout

#: the attention core "selective" recomputes: PyTorch's fused attention
ATTENTION_CORE = torch.nn.functional.scaled_dot_product_attention


@dataclass
class RecomputeCounts:
    """What recomputation ran, counted on the host (no device work): layers' forwards under "full",
    attention-core calls under "selective", first in the forward, then again in the backward."""

    layers: int = 0
    attention_calls: int = 0  # attention-core calls made in layers' forwards
    attention_runs: int = 0  # runs of the attention core: the forward's and the backward's recomputations


def apply_recompute(model: torch.nn.Module, layout: PipelineLayout | None, recompute: str) -> RecomputeCounts | None:
    """Make ``model``'s layers (``layout.blocks``) recompute their activations in the backward as
    ``recompute`` says; before the model is split, sharded or compiled (the hooks travel with each
    layer). Returns the counts (None for "none"). ValueError where the model names no layers (planning
    refuses that first: core.running.replica_checks)."""
    if recompute == "none":
        return None
    if layout is None or not layout.blocks:
        raise ValueError(f"recompute={recompute!r} needs the workload's layers (TorchTrainingSpec.pipeline_layout)")
    counts = RecomputeCounts(layers=len(layout.blocks))
    for name in layout.blocks:
        layer = model.get_submodule(name)
        if recompute == "full":
            _recompute_whole(layer)
        elif recompute == "selective":
            _recompute_attention_core(name, layer, counts)
        else:
            raise ValueError(f"recompute must be 'none', 'selective' or 'full', not {recompute!r}")
    return counts


def _recompute_whole(layer: torch.nn.Module) -> None:
    """``layer``'s forward under non-reentrant ``torch.utils.checkpoint``, set on the instance: the
    module, its name and its hooks (fully_shard's gather, tensor parallelism's) stay as they were."""
    forward = layer.forward

    def checkpointed(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():  # nothing kept for a backward: nothing to recompute
            return forward(*args, **kwargs)
        return torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)

    layer.forward = checkpointed


class _CheckpointedAttention(TorchFunctionMode):
    """Inside a layer's forward: each attention-core call runs under non-reentrant checkpointing.
    A TorchFunctionMode is not active inside its own handler, so the call it makes is the plain one."""

    def __init__(self, counts: RecomputeCounts) -> None:
        super().__init__()
        self._counts = counts

    def __torch_function__(
        self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if func is not ATTENTION_CORE or not torch.is_grad_enabled():
            return func(*args, **kwargs)
        self._counts.attention_calls += 1
        counts = self._counts

        def attention(*inputs: Any, **options: Any) -> Any:
            counts.attention_runs += 1
            return func(*inputs, **options)

        return torch.utils.checkpoint.checkpoint(attention, *args, use_reentrant=False, **kwargs)


def _recompute_attention_core(name: str, layer: torch.nn.Module, counts: RecomputeCounts) -> None:
    """Hooks that run ``layer``'s forward under :class:`_CheckpointedAttention`, and refuse a layer
    whose forward made no attention-core call (it would recompute nothing)."""
    modes: list[tuple[_CheckpointedAttention, int]] = []

    def enter(module: torch.nn.Module, args: Any) -> None:
        mode = _CheckpointedAttention(counts)
        mode.__enter__()
        modes.append((mode, counts.attention_calls))

    def leave(module: torch.nn.Module, args: Any, output: Any) -> None:
        if not modes:
            return
        mode, calls_before = modes.pop()
        mode.__exit__(None, None, None)
        # output None: the forward raised, and that error is the one to see
        if output is not None and torch.is_grad_enabled() and counts.attention_calls == calls_before:
            raise ConfigError(
                "recompute",
                "selective",
                f"'full' or 'none': layer {name!r} computes its attention without "
                "torch.nn.functional.scaled_dot_product_attention, so 'selective' would recompute nothing",
            )

    layer.register_forward_pre_hook(enter)
    layer.register_forward_hook(leave, always_call=True)
