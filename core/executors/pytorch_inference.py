"""The PyTorch inference executor: the training executor's placement, precision and data, with the
model in eval mode under ``torch.inference_mode()`` and no optimizer.

One ``step()`` is one forward pass over this process's micro-batch; like a training step it queues
work and returns, and the runner synchronises at phase boundaries only. Replicas are independent
processes (no DDP: there are no gradients to average); the process group serves the runner's
barriers and collectives alone.

The executor is also a query source for a load generator (``core.running.loadgen``, MLPerf
LoadGen's model): ``load``/``unload`` place samples on the device ahead of the timed test,
``infer`` runs the model on some of them and returns once the device is done.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from core.config import RunConfig
from core.contract.workload import TorchTrainingSpec
from core.errors import NonFiniteLossError
from core.executors.pytorch import TorchModelExecutor, TorchPlacement
from core.running.distributed import ProcessContext

#: samples a load generator may hold on the device at once, at most (MLPerf's "performance sample
#: count": ResNet-50's is 1024); a smaller pool or dataset gives its own size
PERFORMANCE_SAMPLES = 1024


def floating_tensors(outputs: Any) -> list[torch.Tensor]:
    """The floating-point tensors of a model's outputs (a tensor, or tuples, lists and dicts of them)."""
    if isinstance(outputs, torch.Tensor):
        return [outputs] if outputs.is_floating_point() else []
    if isinstance(outputs, dict):
        outputs = list(outputs.values())
    if isinstance(outputs, (list, tuple)):
        return [tensor for item in outputs for tensor in floating_tensors(item)]
    return []


class TorchInferenceExecutor(TorchModelExecutor):
    """Inference: one ``step()`` is one forward pass over a micro-batch, nothing kept for backward."""

    def __init__(
        self, spec: TorchTrainingSpec, config: RunConfig, placement: TorchPlacement, process: ProcessContext
    ) -> None:
        if config.mode != "inference":
            raise ValueError(f"TorchInferenceExecutor runs inference; a {config.mode!r} run takes torch_executor()")
        super().__init__(spec, config, placement, process, micro_steps=1)
        self._placed_model.eval()  # dropout off, batch norm on its running statistics
        self._model = torch.compile(self._placed_model) if config.compile else self._placed_model
        self._pool_inputs: torch.Tensor = spec.inputs  # on the host: what load() places
        self._loaded: dict[int, torch.Tensor] = {}
        self._details["ddp"] = False

    def _forward(self, inputs: torch.Tensor) -> Any:
        with torch.inference_mode(), self._autocast():
            outputs = self._model(inputs)
            # Queued like the forward itself: no host sync. Inside inference mode, where the
            # fused check may write (by 1) into inference tensors.
            self._non_finite.update(floating_tensors(outputs))
        return outputs

    def step(self) -> None:
        inputs, _ = self._micro_batch(0)
        self._forward(inputs)

    def check_finite(self) -> None:
        if self._any_rank_raised():
            raise NonFiniteLossError("a model output was NaN/inf in a forward pass since the last check")

    # --- a query source for a load generator ------------------------------------------------------

    @property
    def total_samples(self) -> int:
        """Samples a query may name: the synthetic pool, or the dataset's (map-style data only)."""
        if self._files is None:
            return len(self._pool_inputs)
        if self._files.samples is None:
            raise TypeError("streamed data (WebDataset shards) cannot be addressed by index")
        return self._files.samples

    @property
    def performance_samples(self) -> int:
        return min(self.total_samples, PERFORMANCE_SAMPLES)

    def _host_sample(self, index: int) -> torch.Tensor:
        if self._files is None:
            return self._pool_inputs[index]
        sample, _ = self._files.dataset[index]
        return sample

    def load(self, indices: Sequence[int]) -> None:
        """Place these samples on the device (outside any timed span); loaded ones stay."""
        for index in indices:
            if index not in self._loaded:
                self._loaded[index] = self._host_sample(index).to(self.device)

    def unload(self, indices: Sequence[int]) -> None:
        for index in indices:
            self._loaded.pop(index, None)

    def infer(self, indices: Sequence[int]) -> None:
        """Run the model on these loaded samples, as one batch; return once the device is done."""
        missing = [index for index in indices if index not in self._loaded]
        if missing:
            raise KeyError(f"samples {missing[:5]} were not loaded (load() them first)")
        batch = torch.stack([self._loaded[index] for index in indices])
        self._forward(self._inputs_to_device(batch, non_blocking=False))
        self.synchronize()

    # --- accuracy ---------------------------------------------------------------------------------

    def top1_counts(self) -> tuple[int, int] | None:
        """(correct, samples) of top-1 predictions over the whole labelled dataset, every rank taking
        every world_size-th sample; None without labelled, indexable data."""
        if self._files is None or self._files.samples is None:
            return None
        dataset = self._files.dataset
        rank, world = self._process.rank, max(self._process.world_size, 1)
        shard = torch.utils.data.Subset(dataset, range(rank, len(dataset), world))
        loader = torch.utils.data.DataLoader(
            shard, batch_size=self._config.micro_batch_size, shuffle=False, num_workers=self._config.data_workers
        )
        # Counted on the device: no host sync per batch.
        counts = torch.zeros(2, dtype=torch.int64, device=self.device)
        for inputs, labels in loader:
            logits = self._forward(self._inputs_to_device(inputs, non_blocking=False))
            labels = labels.to(self.device)
            with torch.inference_mode():
                counts[0] += (logits.argmax(dim=-1) == labels).sum()
                counts[1] += labels.numel()
        if self._process.is_distributed:
            counts = counts.to(self._collective_device())
            torch.distributed.all_reduce(counts, op=torch.distributed.ReduceOp.SUM)
        correct, samples = (int(value) for value in counts.tolist())
        return correct, samples
