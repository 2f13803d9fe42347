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
so a program's inputs are the same two whichever samples a query names, repeats included.

On an eager device nothing but the forward pass runs per step or per query in Python: a phase's
steps (``run_steps``) and a load generator's whole test (``answering``) enter ``inference_mode``
and the precision's autocast once; the outputs' NaN/inf check folds a group of steps' outputs into
the device-side flag in one call (``DeferredOutputCheck``), read at the phase's end as training's
is; a query's samples are gathered once a chunk at a time and each batch of it is a slice of that
chunk (``QueryRows``), one sample a slice of the loaded tensor.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from core.base.config import RunConfig
from core.base.distributed import ProcessContext
from core.base.errors import DataError, NonFiniteLossError
from core.base.queries import QueryRows
from core.contract.workload import TorchTrainingSpec
from core.executors.base import StepClock
from core.executors.pytorch import NonFiniteFlag, TorchModelExecutor, TorchPlacement, compile_model, overridden_hook

#: samples a load generator may hold on the device at once, at most (MLPerf's "performance sample
#: count": ResNet-50's is 1024); a smaller pool or dataset gives its own size
PERFORMANCE_SAMPLES = 1024
#: forward passes whose outputs one NaN/inf check takes at most: the check is one call whatever
#: their number, so its cost per step falls to a sixty-fourth
OUTPUTS_PER_CHECK = 64
#: bytes of outputs kept alive for one check, at most: large outputs are checked a few at a time
#: (one at a time above this), where the check is small against the forward pass anyway
OUTPUT_BYTES_PER_CHECK = 16 * 2**20
#: bytes of one query's samples gathered at once, at most (a batch's at least)
STAGED_QUERY_BYTES = 64 * 2**20


def floating_tensors(outputs: Any) -> list[torch.Tensor]:
    """The floating-point tensors of a model's outputs (a tensor, or tuples, lists and dicts of them)."""
    if isinstance(outputs, torch.Tensor):
        return [outputs] if outputs.is_floating_point() else []
    if isinstance(outputs, dict):
        outputs = list(outputs.values())
    if isinstance(outputs, (list, tuple)):
        return [tensor for item in outputs for tensor in floating_tensors(item)]
    return []


class DeferredOutputCheck:
    """Folds forward passes' floating-point outputs into the non-finite flag a group at a time: one
    fused check over up to ``most`` passes' outputs (``OUTPUTS_PER_CHECK``, fewer where they are
    large), still on the device and without a host sync. ``flush`` checks what is waiting; call it
    before the phase's flag is read, inside the context the outputs were made in (the fused check
    writes into them, by 1, and inference tensors take writes only there).

    :param most: 1 checks every pass as it comes: on a lazy device, where each step is its own
        graph, and on a compiled model, whose outputs may live in buffers the next pass reuses.
    """

    def __init__(self, flag: NonFiniteFlag, most: int = OUTPUTS_PER_CHECK) -> None:
        self._flag = flag
        self._most = most
        self._limit = 0  # passes per check, set from the first outputs' size
        self._pending: list[torch.Tensor] = []

    def add(self, outputs: Any) -> None:
        pending = self._pending
        if type(outputs) is torch.Tensor and outputs.is_floating_point():
            pending.append(outputs)
        else:
            pending.extend(floating_tensors(outputs))
        if not self._limit and pending:
            size = sum(tensor.nbytes for tensor in pending)
            self._limit = max(1, min(self._most, OUTPUT_BYTES_PER_CHECK // max(size, 1)))
        if len(pending) >= self._limit:
            self.flush()

    def flush(self) -> None:
        pending = self._pending
        if not pending:
            return
        self._pending = []
        if len(pending) > 1:
            try:
                # One tensor of them all, checked in one kernel: on a CPU the "fused" check loops
                # over its list (about 1.3 us a tensor), where a copy and one check cost a fifth.
                pending = [torch.cat(pending)]
            except RuntimeError:
                pass  # shapes that differ beyond the first dimension: checked tensor by tensor
        self._flag.update(pending)


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
        self._cut_graph = overridden_hook(self._hooks, "cut_graph")  # None on an eager device
        lazy_or_compiled = self._cut_graph is not None or config.compile
        # Raised on the device by a NaN/inf output, read at each phase's end (check_finite).
        self._non_finite = NonFiniteFlag(self.device)
        self._output_check = DeferredOutputCheck(self._non_finite, 1 if lazy_or_compiled else OUTPUTS_PER_CHECK)
        # The thread inside answering(): its contexts are entered, infer() enters none of its own.
        self._answering_thread: int | None = None
        self._staged = _StagedQuery()
        # Whether a pass over the same micro-batch gives the same outputs each time, as far as the
        # last phase showed (False once the model drew random numbers); the first phase checks all.
        self._repeats_itself = False
        self._phases_run = 0
        self._details["ddp"] = False

    @contextlib.contextmanager
    def _forward_contexts(self) -> Iterator[None]:
        """Nothing recorded for backward (the device's ``no_grad``), the precision's autocast; the
        outputs waiting for their check are checked before these close."""
        with self._hooks.no_grad(), self.precision.forward_context():
            try:
                yield
            finally:
                self._output_check.flush()

    def _forward(self, inputs: torch.Tensor) -> Any:
        if self._answering_thread == threading.get_ident():
            outputs = self._model(inputs)
            self._output_check.add(outputs)
            return outputs
        with self._forward_contexts():
            outputs = self._model(inputs)
            # Queued like the forward itself: no host sync.
            self._output_check.add(outputs)
        return outputs

    def step(self) -> None:
        self.run_steps(1)

    def run_steps(self, count: int, clock: StepClock | None = None) -> None:
        """``count`` forward passes in one entry of the contexts, the micro-batch fetched once where
        it stays on the device.

        Which outputs are checked: on an eager device, where every pass runs the same model on the same micro-batch
        (synthetic data on the device) and the model drew no random numbers in the previous phase
        (the first step's, which checks its one pass), each pass computes the same outputs, so a
        NaN/inf in any of them is in the last, and that one is checked. Otherwise (data copied or
        read each step, a model that samples) every pass's outputs are, a group at a time."""
        mark = None if clock is None else clock.mark
        cut = self._cut_graph  # one graph per step on a lazy device, as a training update is
        fixed = None if self._copy_each_step else self._micro_batches[0][0]
        model, check = self._model, self._output_check.add
        random_before = _random_states(self.device)
        with self._forward_contexts():
            # Not on a lazy device: there each pass's check is part of its one graph (checking the
            # last only would make that pass a graph of its own, and the others another).
            if fixed is not None and self._repeats_itself and cut is None:
                outputs = None
                for _ in range(count):
                    outputs = model(fixed)
                    if cut is not None:
                        cut()
                    if mark is not None:
                        mark()
                if outputs is not None:
                    check(outputs)
            else:
                for _ in range(count):
                    check(model(fixed if fixed is not None else self._micro_batch(0)[0]))
                    if cut is not None:
                        cut()
                    if mark is not None:
                        mark()
        # A model that drew random numbers may give other outputs each pass: every one is checked
        # from the next phase on.
        drew_random = not all(map(torch.equal, _random_states(self.device), random_before))
        self._repeats_itself = not drew_random and (self._repeats_itself or self._phases_run == 0)
        self._phases_run += 1

    @contextlib.contextmanager
    def answering(self) -> Iterator[None]:
        """The forward pass's contexts, entered once on this thread for a load generator's whole
        test: ``infer`` calls on this thread run the model alone inside it."""
        with self._forward_contexts():
            self._answering_thread = threading.get_ident()
            try:
                yield
            finally:
                self._answering_thread = None

    def _any_rank_raised(self) -> bool:
        """Read and clear the non-finite flag; True when it was raised on any rank."""
        found = self._non_finite.take()
        self._hooks.cut_graph()  # the flag's reset apart from the next update's graph
        if self._process.is_distributed:
            # A NaN on one rank only must fail every rank alike, or the others would go on
            # to wait at the next barrier for a rank that has stopped.
            found = (found != 0).to(device=self._collective_device(), dtype=torch.float32)
            torch.distributed.all_reduce(found, op=torch.distributed.ReduceOp.MAX, group=self._host_group)
        return bool(found.item() != 0)

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
        self._staged = _StagedQuery()  # its rows may be among these
        for index in indices:
            self._slots.pop(index, None)
        if not self._slots:
            self._loaded = None  # the device memory goes back; a partial unload keeps the tensor until then

    def _slots_of(self, indices: Sequence[int]) -> list[int]:
        """The loaded rows of these samples (a lookup per sample in C, no Python loop)."""
        try:
            return list(map(self._slots.__getitem__, indices))
        except KeyError:
            missing = [index for index in indices if index not in self._slots]
            raise KeyError(f"samples {missing[:5]} were not loaded (load() them first)") from None

    def _rows(self, indices: Sequence[int], loaded: torch.Tensor) -> torch.Tensor:
        """An eager device's batch of these loaded samples: a slice wherever it can be."""
        if isinstance(indices, QueryRows):
            return self._query_rows(indices)
        slots = self._slots_of(indices)
        if len(slots) == 1:
            return loaded[slots[0] : slots[0] + 1]  # a view: nothing gathered
        return loaded.index_select(0, torch.tensor(slots, device=self.device))

    def _padded_rows(self, indices: Sequence[int], loaded: torch.Tensor) -> torch.Tensor:
        slots = self._slots_of(indices)
        # Padding repeats the first sample: a filler, computed and never counted as answered.
        padded = min(size for size in self._query_sizes if size >= len(slots))
        slots.extend(slots[:1] * (padded - len(slots)))
        # The slots are data on the device, so one program serves every choice of samples
        # (rows picked by constant indices would be part of the program, a new one each time).
        return loaded.index_select(0, torch.tensor(slots, dtype=torch.int64).to(self.device))

    def infer(self, indices: Sequence[int]) -> None:
        """Run the model on these loaded samples, as one batch; return once the device is done.

        Consecutive runs of one query (``QueryRows``) are served as slices of that query's samples,
        gathered once a chunk at a time."""
        loaded = self._loaded
        if loaded is None:
            raise KeyError(f"samples {list(indices)[:5]} were not loaded (load() them first)")
        batch = self._padded_rows(indices, loaded) if self._query_sizes else self._rows(indices, loaded)
        self._forward(self._inputs_to_device(batch, non_blocking=False))
        self.synchronize()

    def _query_rows(self, rows: QueryRows) -> torch.Tensor:
        """A run of a query's samples, sliced from the chunk of that query gathered last; a run
        outside it gathers the next chunk (``STAGED_QUERY_BYTES`` of samples, the run's at least)."""
        if not self._staged.holds(rows):
            loaded = self._loaded
            assert loaded is not None
            chunk_rows = max(len(rows), STAGED_QUERY_BYTES // max(loaded[0].nbytes, 1))
            end = min(len(rows.indices), rows.start + chunk_rows)
            slots = torch.tensor(self._slots_of(rows.indices[rows.start : end]), device=self.device)
            self._staged = _StagedQuery(rows.indices, rows.start, loaded.index_select(0, slots))
        staged = self._staged
        assert staged.chunk is not None
        return staged.chunk[rows.start - staged.first : rows.end - staged.first]

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


def _random_states(device: torch.device) -> list[torch.Tensor]:
    """What changes when a forward pass draws random numbers: the CPU generator's state, and the
    device's generator's (its seed and offset) where it has one. Read once per phase."""
    states = [torch.random.default_generator.get_state()]
    module = getattr(torch, device.type, None)
    if device.type != "cpu" and module is not None and hasattr(module, "get_rng_state"):
        states.append(module.get_rng_state(device))
    return states


class _StagedQuery:
    """The samples ``first``..``end`` of one query, gathered from the loaded tensor: a chunk its
    consecutive runs are slices of."""

    def __init__(self, query: list[int] | None = None, first: int = 0, chunk: torch.Tensor | None = None) -> None:
        self.query = query  # kept, so that the same list object is the same query
        self.first = first
        self.chunk = chunk
        self.end = first + (0 if chunk is None else len(chunk))

    def holds(self, rows: QueryRows) -> bool:
        return rows.indices is self.query and self.first <= rows.start and rows.end <= self.end
