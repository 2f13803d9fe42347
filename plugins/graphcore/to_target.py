"""A PopTorch run to a target quality (docs/to-target.md): the training split in real epochs, one host
call at a time, and the held-out split in host calls of the inference model, sharded over replicas.

Both keep core's rules (``core.plugin.EpochOrder``, ``held_out_shard``), so the curve does not depend on
how the global batch is split over replicas and micro-steps, and the evaluation equals one process's.
A host call's batch is laid out ``[device_iterations, gradient_accumulation, replicas, micro_batch]``
(PopART's input layout, as ``host_call_samples`` lays out the synthetic one): one update per host call
here, since a run to a target evaluates between updates (planning refuses device_iterations > 1).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import torch

from core.plugin import EpochOrder, held_out_shard


class HostCallEpochs:
    """The training split read in :class:`core.plugin.EpochOrder`'s order: update ``u``'s host call is
    every micro-step of every replica, ``[gradient_accumulation, replicas, micro_batch]``."""

    def __init__(
        self, inputs: torch.Tensor, targets: torch.Tensor, seed: int, micro_batch: int, accumulation: int, replicas: int
    ) -> None:
        self._inputs, self._targets = inputs, targets
        self._order = EpochOrder(len(inputs), seed, micro_batch, accumulation, replicas)
        self._accumulation, self._replicas = accumulation, replicas
        self.samples = self._order.samples

    def indices(self, update: int) -> torch.Tensor:
        """The split's indices of update ``update``'s host call (from 0), in PopART's input layout."""
        pieces = [
            self._order.micro_batch(update, micro_step, (replica,))
            for micro_step in range(self._accumulation)
            for replica in range(self._replicas)
        ]
        return torch.from_numpy(np.concatenate(pieces))

    def host_call(self, update: int) -> tuple[torch.Tensor, torch.Tensor]:
        chosen = self.indices(update)
        return self._inputs.index_select(0, chosen), self._targets.index_select(0, chosen)


class HeldOutHostCalls:
    """The held-out split in host calls of an inference model of ``replicas`` replicas of ``micro_batch``
    (one device iteration): replica ``r`` takes samples r, r + R, ... (``held_out_shard``), its micro-batch
    of call ``k`` the ``k``-th ``micro_batch`` of them. The last calls are padded with sample 0 so every
    call has the compiled shape; ``valid`` marks the padding, which no sum counts."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor, replicas: int, micro_batch: int) -> None:
        self._inputs, self._targets = inputs, targets
        self.samples = len(inputs)
        shards = [held_out_shard(self.samples, replica, replicas) for replica in range(replicas)]
        self.calls = max(1, math.ceil(max(len(s) for s in shards) / micro_batch))
        # [calls, replicas, micro_batch] of indices, -1 where padded
        layout = np.full((self.calls, replicas, micro_batch), -1, dtype=np.int64)
        for replica, indices in enumerate(shards):
            padded = np.full(self.calls * micro_batch, -1, dtype=np.int64)
            padded[: len(indices)] = indices
            layout[:, replica, :] = padded.reshape(self.calls, micro_batch)
        self._layout = torch.from_numpy(layout.reshape(self.calls, replicas * micro_batch))

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """(inputs, targets, valid) of each host call, on the host."""
        for indices in self._layout:
            valid = indices >= 0
            chosen = indices.clamp(min=0)
            yield self._inputs.index_select(0, chosen), self._targets.index_select(0, chosen), valid
