"""Real epochs and held-out evaluation for the PyTorch executor's runs to a target quality.

A steady-window run steps over a fixed pool of micro-batches; a run to a target
(``RunConfig.target``, docs/to-target.md) reads the training split in real epochs instead, and
evaluates the current weights on the held-out split. Both are laid out so that the quality curve
does not depend on how the global batch is split over replicas and micro-steps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any

import torch

from core.data.epoch_order import EVALUATION_BATCH, EpochOrder
from core.data.epoch_order import shard as shard_indices


class ShuffledEpochs:
    """The training split in memory, read in :class:`core.data.epoch_order.EpochOrder`'s order
    (the rule every framework's executor shares, and the image-folder reader too:
    core.data.loading.FileEpochs): this process's replicas' micro-batches as tensors."""

    def __init__(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        seed: int,
        micro_batch: int,
        accumulation: int,
        replicas: int,
        first_replica: int,
        replicas_here: int = 1,
    ) -> None:
        self._inputs, self._targets = inputs, targets
        self._order = EpochOrder(len(inputs), seed, micro_batch, accumulation, replicas)
        self._replicas_here = range(first_replica, first_replica + replicas_here)
        self.samples = self._order.samples
        self.global_batch = self._order.global_batch
        self.updates_per_epoch = self._order.updates_per_epoch

    def micro_batch(self, update: int, micro_step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) on the host of this process's ``micro_step`` of ``update`` (from 0)."""
        indices = torch.from_numpy(self._order.micro_batch(update, micro_step, self._replicas_here))
        return self._inputs.index_select(0, indices), self._targets.index_select(0, indices)


def held_out_sums(
    model: torch.nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    loss_fn: Callable[[Any, Any], Any],
    shard: tuple[int, int],
    to_device: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    forward_context: Callable[[], AbstractContextManager[Any]],
    no_grad: Callable[[], AbstractContextManager[Any]],
    token_loss_sums: Callable[[Any, Any], tuple[Any, int]] | None = None,
) -> torch.Tensor:
    """(correct top-1 predictions, summed loss, samples) over this process's shard of the held-out
    split in memory, as a float64 tensor on the device (a language model's sums: :func:`batch_sums`):
    added over the processes, they give one process's.

    :param shard: (rank, world size): this process takes samples rank, rank + world, ...
    """
    indices = torch.from_numpy(shard_indices(len(inputs), *shard))
    batches = (
        (inputs.index_select(0, chosen), targets.index_select(0, chosen)) for chosen in indices.split(EVALUATION_BATCH)
    )
    return batch_sums(model, batches, loss_fn, to_device, forward_context, no_grad, token_loss_sums)


def batch_sums(
    model: torch.nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    loss_fn: Callable[[Any, Any], Any],
    to_device: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    forward_context: Callable[[], AbstractContextManager[Any]],
    no_grad: Callable[[], AbstractContextManager[Any]],
    token_loss_sums: Callable[[Any, Any], tuple[Any, int]] | None = None,
) -> torch.Tensor:
    """(correct top-1 predictions, summed loss, samples) over ``batches`` of (inputs, targets) on the
    host (this process's shard of the held-out split, in memory or read from files), as a float64
    tensor on the device; a language model's (summed token loss, tokens predicted) instead where
    ``token_loss_sums`` (``TorchTrainingSpec.token_loss_sums``) says how a batch's are counted."""
    sums: torch.Tensor | None = None
    was_training = model.training
    model.eval()
    try:
        with no_grad():
            for host_inputs, host_targets in batches:
                batch_inputs, labels = to_device(host_inputs, host_targets)
                with forward_context():
                    outputs = model(batch_inputs)
                # The loss and the prediction in fp32 whatever the precision computed the outputs in.
                outputs = outputs.float()
                if token_loss_sums is not None:
                    token_loss, tokens = token_loss_sums(outputs, labels)
                    count = torch.tensor(float(tokens), device=token_loss.device, dtype=torch.float64)
                    these = torch.stack([token_loss.double(), count])
                    sums = these if sums is None else sums + these
                    continue
                loss_sum = loss_fn(outputs, labels).double() * labels.numel()
                correct = (outputs.argmax(dim=-1) == labels).sum().double()
                these = torch.stack(
                    [correct, loss_sum, torch.tensor(float(labels.numel()), device=correct.device, dtype=torch.float64)]
                )
                sums = these if sums is None else sums + these
    finally:
        model.train(was_training)
    if sums is None:  # a shard with no sample: a process beyond the split's size
        device = next(model.parameters()).device
        sums = torch.zeros(3 if token_loss_sums is None else 2, dtype=torch.float64, device=device)
    return sums
