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

#: held-out samples per forward pass of an evaluation (each process's shard): how the split is cut
#: changes no count, only the rounding of the loss's sum
EVALUATION_BATCH = 256


class EpochOrder:
    """The order a run to a target reads its training split of ``samples`` in: each epoch one
    permutation of the split, drawn from the run's seed and the epoch's number (the same on every
    process), cut into global batches, the last partial one dropped. Global batch ``k`` holds the
    permutation's samples ``[k G, (k+1) G)``; replica ``r``'s micro-step ``m`` takes the ``micro_batch``
    of them at ``(r x accumulation + m) x micro_batch``: one process with the whole global batch sees
    the same samples per update as several replicas. In memory (:class:`ShuffledEpochs`) or from
    files (core.data.loading.FileEpochs), the order is this one."""

    def __init__(
        self,
        samples: int,
        seed: int,
        micro_batch: int,
        accumulation: int,
        replicas: int,
        first_replica: int,
        replicas_here: int = 1,
    ) -> None:
        self._seed = seed
        self._micro_batch, self._accumulation = micro_batch, accumulation
        self._replicas_here = range(first_replica, first_replica + replicas_here)
        self.samples = samples
        self.accumulation = accumulation
        self.global_batch = micro_batch * accumulation * replicas
        self.updates_per_epoch = self.samples // self.global_batch
        if self.updates_per_epoch < 1:
            raise ValueError(
                f"the training split's {self.samples} samples hold no global batch of {self.global_batch}: "
                "lower the batch size"
            )
        self._epoch = -1
        self._order = torch.empty(0, dtype=torch.int64)

    def _order_of(self, epoch: int) -> torch.Tensor:
        if epoch != self._epoch:
            generator = torch.Generator().manual_seed(self._seed + (epoch << 32))
            self._order, self._epoch = torch.randperm(self.samples, generator=generator), epoch
        return self._order

    def indices(self, update: int, micro_step: int) -> torch.Tensor:
        """The split's samples of this process's ``micro_step`` of ``update`` (from 0)."""
        epoch, position = divmod(update, self.updates_per_epoch)
        order = self._order_of(epoch)
        start = position * self.global_batch
        pieces = []
        for replica in self._replicas_here:
            offset = start + (replica * self._accumulation + micro_step) * self._micro_batch
            pieces.append(order[offset : offset + self._micro_batch])
        return torch.cat(pieces)


class ShuffledEpochs(EpochOrder):
    """The training split in memory, read in :class:`EpochOrder`'s order."""

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
        super().__init__(len(inputs), seed, micro_batch, accumulation, replicas, first_replica, replicas_here)
        self._inputs, self._targets = inputs, targets

    def micro_batch(self, update: int, micro_step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) on the host of this process's ``micro_step`` of ``update`` (from 0)."""
        indices = self.indices(update, micro_step)
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
) -> torch.Tensor:
    """(correct top-1 predictions, summed loss, samples) over this process's shard of the held-out
    split in memory, as a float64 tensor on the device: added over the processes, they give one
    process's.

    :param shard: (rank, world size): this process takes samples rank, rank + world, ...
    """
    rank, world = shard
    indices = torch.arange(rank, len(inputs), world)
    batches = (
        (inputs.index_select(0, chosen), targets.index_select(0, chosen)) for chosen in indices.split(EVALUATION_BATCH)
    )
    return batch_sums(model, batches, loss_fn, to_device, forward_context, no_grad)


def batch_sums(
    model: torch.nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    loss_fn: Callable[[Any, Any], Any],
    to_device: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    forward_context: Callable[[], AbstractContextManager[Any]],
    no_grad: Callable[[], AbstractContextManager[Any]],
) -> torch.Tensor:
    """(correct top-1 predictions, summed loss, samples) over ``batches`` of (inputs, targets) on the
    host (this process's shard of the held-out split, in memory or read from files), as a float64
    tensor on the device."""
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
        sums = torch.zeros(3, dtype=torch.float64, device=device)
    return sums


def metrics_of(sums: torch.Tensor) -> dict[str, float]:
    """'top1' and 'loss' from the summed (correct, loss, samples)."""
    correct, loss, samples = (float(value) for value in sums.tolist())
    if samples == 0:
        return {}
    return {"top1": correct / samples, "loss": loss / samples}
