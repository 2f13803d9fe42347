"""The PyTorch inference executor: the training executor's placement, precision and data, with the
model in eval mode without autograd (``torch.inference_mode()``, or what the device's hooks say)
and no optimizer.

One ``step()`` is one forward pass over this process's micro-batch; like a training step it queues
work and returns (on a lazy device the graph is cut after it: one graph per step), and the runner
synchronises at phase boundaries only. Replicas are independent processes (no DDP: there are no
gradients to average); the process group serves the runner's barriers and collectives alone.

The executor is also a query source for a load generator (``core.running.loadgen``, MLPerf
LoadGen's model): ``load``/``unload`` place samples on the device ahead of the timed test,
``infer`` runs the model on some of them and returns once the device is done. A device that
compiles one program per batch shape (XLA) pads each query up to one of a few sizes
(``TorchDeviceHooks.query_sizes``), compiled by ``warm_query_sizes`` before the window: a query of
3 samples runs as 4, its padding charged to the query's time and never counted as samples. The
loaded samples are one device tensor; there, a query gathers its rows by a tensor of their slots,
so a program's inputs are the same two whichever samples a query names, repeats included (an eager
device stacks views of the rows, which costs less per query).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from core.base.config import RunConfig
from core.base.distributed import ProcessContext
from core.base.errors import DataError, NonFiniteLossError
from core.contract.workload import TorchTrainingSpec
from core.executors.pytorch import TorchModelExecutor, TorchPlacement, compile_model

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
        self._model = compile_model(self._placed_model, self._hooks) if config.compile else self._placed_model
        self._pool_inputs: torch.Tensor = spec.inputs  # on the host: what load() places
        self._loaded: torch.Tensor | None = None  # every loaded sample, on the device
        self._slots: dict[int, int] = {}  # a loaded sample's index -> its row in _loaded
        # Sizes queries are padded up to, each a compiled program (empty on an eager device); a
        # query never holds more than the micro-batch (LoadGen's max_batch_size).
        self._query_sizes = self._hooks.query_sizes(config.micro_batch_size or 1)
        self._details["ddp"] = False

    def _forward(self, inputs: torch.Tensor) -> Any:
        with self._hooks.no_grad(), self.precision.forward_context():
            outputs = self._model(inputs)
            # Queued like the forward itself: no host sync. Inside the no-grad context, where the
            # fused check may write (by 1) into inference tensors.
            self._non_finite.update(floating_tensors(outputs))
        return outputs

    def step(self) -> None:
        inputs, _ = self._micro_batch(0)
        self._forward(inputs)
        self._hooks.cut_graph()  # one graph per step on a lazy device, as a training update is

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
        from core.data.loading import loader_failure

        try:
            sample, _ = self._files.dataset[index]
        except Exception as error:  # memory exhausted while decoding included: the data's fault
            raise DataError(loader_failure(error, self._config.data)) from error
        return sample

    def load(self, indices: Sequence[int]) -> None:
        """Place these samples on the device (outside any timed span); loaded ones stay."""
        new = [index for index in dict.fromkeys(indices) if index not in self._slots]
        if not new:
            return
        placed = torch.stack([self._host_sample(index) for index in new]).to(self.device)
        # One tensor of every loaded sample: a query gathers its samples from it by slot.
        self._loaded = placed if self._loaded is None else torch.cat([self._loaded, placed])
        first = len(self._slots)
        self._slots.update({index: first + offset for offset, index in enumerate(new)})
        self._hooks.cut_graph()  # the loaded samples are data on the device, not a graph queries extend

    def unload(self, indices: Sequence[int]) -> None:
        for index in indices:
            self._slots.pop(index, None)
        if not self._slots:
            self._loaded = None  # the device memory goes back; a partial unload keeps the tensor until then

    def infer(self, indices: Sequence[int]) -> None:
        """Run the model on these loaded samples, as one batch; return once the device is done."""
        missing = [index for index in indices if index not in self._slots]
        if missing or self._loaded is None:
            raise KeyError(f"samples {missing[:5]} were not loaded (load() them first)")
        slots = [self._slots[index] for index in indices]
        if self._query_sizes:
            # Padding repeats the first sample: a filler, computed and never counted as answered.
            padded = min(size for size in self._query_sizes if size >= len(slots))
            slots.extend(slots[:1] * (padded - len(slots)))
            # The slots are data on the device, so one program serves every choice of samples
            # (rows picked by constant indices would be part of the program, a new one each time).
            batch = self._loaded.index_select(0, torch.tensor(slots, dtype=torch.int64).to(self.device))
        else:
            # An eager device: views of the loaded rows, stacked (cheaper per query than a gather).
            loaded = self._loaded
            batch = torch.stack([loaded[slot] for slot in slots])
        self._forward(self._inputs_to_device(batch, non_blocking=False))
        self.synchronize()

    def query_sizes(self) -> tuple[int, ...]:
        """The batch sizes queries are padded up to (empty: each runs at its own size)."""
        return self._query_sizes

    def warm_query_sizes(self) -> None:
        """Run one query of each padded size over as many loaded samples as LoadGen loads (the
        gathered-from tensor's shape is part of each compiled program), so none compiles in the window."""
        sizes = self.query_sizes()
        if not sizes:
            return
        indices = list(range(self.performance_samples))
        self.load(indices)
        try:
            for size in sizes:
                self.infer(indices[:size])
        finally:
            self.unload(indices)

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
        from core.data.loading import LoaderWorkers

        # Counted on the device: no host sync per batch.
        counts = torch.zeros(2, dtype=torch.int64, device=self.device)
        workers = LoaderWorkers(loader, self._config.data)
        try:
            batches = workers.iterate()
            while (batch := workers.next(batches, None)) is not None:
                inputs, labels = batch
                logits = self._forward(self._inputs_to_device(inputs, non_blocking=False))
                labels = labels.to(self.device)
                with self._hooks.no_grad():
                    counts[0] += (logits.argmax(dim=-1) == labels).sum()
                    counts[1] += labels.numel()
                self._hooks.cut_graph()  # one graph per batch on a lazy device, not the whole pass
        finally:
            workers.close()  # the workers stop and their files go, whatever happened in the pass
        if self._process.is_distributed:
            counts = counts.to(self._collective_device())
            torch.distributed.all_reduce(counts, op=torch.distributed.ReduceOp.SUM)
        correct, samples = (int(value) for value in counts.tolist())
        return correct, samples
