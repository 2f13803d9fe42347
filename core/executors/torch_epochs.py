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
    after_batch: Callable[[], None] | None = None,
    token_loss_sums: Callable[[Any, Any], tuple[Any, int]] | None = None,
) -> torch.Tensor:
    """(correct top-1 predictions, summed loss, samples) over this process's shard of the held-out
    split in memory, as a float64 tensor on the device (a language model's sums: :func:`batch_sums`):
    added over the processes, they give one process's.

    :param shard: (rank, world size): this process takes samples rank, rank + world, ...
    :param after_batch: called after each batch's sums are added (see :func:`batch_sums`)
    """
    indices = torch.from_numpy(shard_indices(len(inputs), *shard))
    batches = (
        (inputs.index_select(0, chosen), targets.index_select(0, chosen)) for chosen in indices.split(EVALUATION_BATCH)
    )
    return batch_sums(
        model,
        batches,
        loss_fn,
        to_device,
        forward_context,
        no_grad,
        after_batch=after_batch,
        token_loss_sums=token_loss_sums,
    )


def batch_sums(
    model: torch.nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    loss_fn: Callable[[Any, Any], Any],
    to_device: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    forward_context: Callable[[], AbstractContextManager[Any]],
    no_grad: Callable[[], AbstractContextManager[Any]],
    after_batch: Callable[[], None] | None = None,
    token_loss_sums: Callable[[Any, Any], tuple[Any, int]] | None = None,
) -> torch.Tensor:
    """(correct top-1 predictions, summed loss, samples) over ``batches`` of (inputs, targets) on the
    host (this process's shard of the held-out split, in memory or read from files), as a float64
    tensor on the device; a language model's (summed token loss, tokens predicted) instead where
    ``token_loss_sums`` (``TorchTrainingSpec.token_loss_sums``) says how a batch's are counted.

    :param after_batch: called after each batch's sums are added: a lazy device's graph cut
        (``TorchDeviceHooks.cut_graph``), so that an evaluation is a few graphs of one batch each,
        whatever the split's size (one graph of every batch would grow with the split), compiled at
        the first evaluation and run again at every later one (the batches' shapes are the same each
        time: full ones and the split's last)
    """
    sums: torch.Tensor | None = None
    was_training = model.training
    model.eval()
    try:
        with no_grad():
            for host_inputs, host_targets in batches:
                batch_inputs, labels = to_device(host_inputs, host_targets)
                with forward_context():
                    outputs = model(batch_inputs)
                if token_loss_sums is not None:
                    # The loss in fp32 whatever the precision computed the outputs in.
                    token_loss, tokens = token_loss_sums(outputs.float(), labels)
                    count = torch.tensor(float(tokens), device=token_loss.device, dtype=torch.float64)
                    these = torch.stack([token_loss.double(), count])
                else:
                    these = outcome_sums(outputs, labels, loss_fn)
                sums = these if sums is None else sums + these
                if after_batch is not None:
                    after_batch()
    finally:
        model.train(was_training)
    if sums is None:  # a shard with no sample: a process beyond the split's size
        device = next(model.parameters()).device
        sums = torch.zeros(3 if token_loss_sums is None else 2, dtype=torch.float64, device=device)
    return sums


def outcome_sums(outputs: torch.Tensor, labels: torch.Tensor, loss_fn: Callable[[Any, Any], Any]) -> torch.Tensor:
    """(correct top-1 predictions, summed loss, samples) of one batch's model outputs against its labels,
    as a float64 tensor on the outputs' device: what every evaluation adds up, whichever device ran the
    forward pass (``loss_fn`` gives the batch's mean, as a workload's loss does)."""
    # The loss and the prediction in fp32 whatever the precision computed the outputs in.
    outputs = outputs.float()
    loss_sum = loss_fn(outputs, labels).double() * labels.numel()
    correct = (outputs.argmax(dim=-1) == labels).sum().double()
    samples = torch.tensor(float(labels.numel()), device=correct.device, dtype=torch.float64)
    return torch.stack([correct, loss_sum, samples])


class CompilationsPerEvaluation:
    """Graphs compiled by each evaluation of a run to a target, and by the training steps before it,
    where the device counts them (``TorchDeviceHooks.compiled_graphs``: XLA's compilations, or
    torch.compile's). An evaluation's batches have the same shapes every time, so only the first
    should compile; and an evaluation must leave the training step's graph as it was, so training
    after the first evaluation should compile nothing either. What runs between an evaluation's end
    and the next step (the NaN/inf check) is counted in neither."""

    def __init__(self) -> None:
        self.training: list[int] = []  #: per evaluation: graphs the training steps since the last one compiled
        self.evaluation: list[int] = []  #: per evaluation: graphs it compiled
        self.training_open = False  #: whether steps ran since the last evaluation
        self._training_started: int | None = None  # the count at the first of those steps

    def training_starts(self, count: int | None) -> None:
        """At the first step after an evaluation (or the run's first)."""
        self.training_open, self._training_started = True, count

    def evaluated(self, before: int | None, after: int | None) -> None:
        """The counts when an evaluation began and ended."""
        started, self.training_open = self._training_started, False
        if before is None or after is None:
            return
        self.training.append(before - started if started is not None else 0)
        self.evaluation.append(after - before)
        self._training_started = None

    def details(self) -> dict[str, list[int]]:
        if not self.evaluation:
            return {}
        return {"training_compiled_graphs": self.training, "evaluation_compiled_graphs": self.evaluation}

    def warnings(self, compiler: str) -> list[str]:
        """A later evaluation that compiled: a graph of a shape or state the first did not see, whose
        compilation each such evaluation pays inside the clock."""
        later = self.evaluation[1:]
        if not any(later):
            return []
        return [
            f"{compiler} compiled {sum(later)} new graph(s) in evaluations after the first (evaluation_compiled_graphs "
            f"{self.evaluation}): a recompilation inside the clock"
        ]
