"""The order a run to a target reads its training split in, and how its evaluation is summed: framework-free.

A run to a target (``RunConfig.target``, docs/to-target.md) reads the training split in real epochs
and evaluates the current weights on the held-out split. Every framework's executor lays both out by
the rules here (numpy only), so that the quality curve depends neither on the framework's own random
numbers nor on how the global batch is split over replicas and micro-steps.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

#: held-out samples per forward pass of an evaluation (each replica's shard): how the split is cut
#: changes no count, only the rounding of the loss's sum
EVALUATION_BATCH = 256

Indices = npt.NDArray[np.int64]


class EpochOrder:
    """The training split in epochs: each epoch one permutation of the split, drawn from the run's
    seed and the epoch's number (the same on every process), cut into global batches, the last partial
    one dropped. Global batch ``k`` holds the permutation's samples ``[k G, (k+1) G)``; replica ``r``'s
    micro-step ``m`` takes the ``micro_batch`` of them at ``(r x accumulation + m) x micro_batch``: one
    process with the whole global batch sees the same samples per update as several replicas."""

    def __init__(self, samples: int, seed: int, micro_batch: int, accumulation: int, replicas: int) -> None:
        self.samples = samples
        self._seed = seed
        self._micro_batch, self._accumulation = micro_batch, accumulation
        self.accumulation = accumulation
        self.global_batch = micro_batch * accumulation * replicas
        self.updates_per_epoch = samples // self.global_batch
        if self.updates_per_epoch < 1:
            raise ValueError(
                f"the training split's {samples} samples hold no global batch of {self.global_batch}: "
                "lower the batch size"
            )
        self._epoch = -1
        self._order: Indices = np.empty(0, dtype=np.int64)

    def permutation(self, epoch: int) -> Indices:
        """Epoch ``epoch``'s order of the split (from 0): numpy's generator seeded with (seed, epoch)."""
        if epoch != self._epoch:
            generator = np.random.default_rng([self._seed, epoch])
            self._order, self._epoch = generator.permutation(self.samples).astype(np.int64), epoch
        return self._order

    def micro_batch(self, update: int, micro_step: int, replicas: Iterable[int]) -> Indices:
        """The split's indices that ``replicas`` (global numbers, in order) train on in their
        ``micro_step`` of ``update`` (both from 0), one micro-batch after the other."""
        epoch, position = divmod(update, self.updates_per_epoch)
        order = self.permutation(epoch)
        start = position * self.global_batch
        pieces = []
        for replica in replicas:
            offset = start + (replica * self._accumulation + micro_step) * self._micro_batch
            pieces.append(order[offset : offset + self._micro_batch])
        return np.concatenate(pieces)

    def update(self, update: int, replica: int) -> Indices:
        """Replica ``replica``'s indices for every micro-step of ``update``: ``[accumulation, micro_batch]``."""
        return np.stack([self.micro_batch(update, step, (replica,)) for step in range(self._accumulation)])


def shard(samples: int, rank: int, world: int) -> Indices:
    """The held-out samples evaluation shard ``rank`` of ``world`` takes: rank, rank + world, ..."""
    return np.arange(rank, samples, world, dtype=np.int64)


def metrics_of(sums: Iterable[float]) -> dict[str, float]:
    """'top1' and 'loss' from the (correct top-1 predictions, summed loss, samples) of every shard
    added together; empty where no sample was evaluated."""
    correct, loss, samples = (float(value) for value in sums)
    if samples == 0:
        return {}
    return {"top1": correct / samples, "loss": loss / samples}


def token_metrics_of(sums: Iterable[float]) -> dict[str, float]:
    """A language model's 'loss' (the mean loss of a predicted token) and 'perplexity' (its exp) from
    the (summed token loss, tokens predicted) of every shard added together: each token weighs the
    same, wherever its sequence was evaluated. Empty where no token was evaluated."""
    loss, tokens = (float(value) for value in sums)
    if tokens == 0:
        return {}
    mean = loss / tokens
    # exp overflows a float past 709 nats: a model that far off has an infinite perplexity to say.
    return {"loss": mean, "perplexity": math.exp(mean) if mean < 709 else math.inf}
