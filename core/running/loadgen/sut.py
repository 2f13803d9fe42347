"""The system under test LoadGen drives: its callbacks hand queries to a ``QuerySource`` in
batches and tell LoadGen when each sample is done.

Threads. LoadGen calls ``issue_queries`` and the sample-library callbacks from the thread that
called ``StartTest`` (for every scenario here: core registers no issue threads), holding the GIL
only for the call. Offline and single-stream answer inline on that thread, so the model runs on
the caller's thread with its thread-local state (CUDA stream, ``torch.inference_mode``). Server
must return at once to keep LoadGen's arrival schedule, so one worker thread answers its queries:
a ``QuerySource`` that relies on thread-local state must set it up inside ``infer``.

Bulk. Queries arrive as two lists, response ids and sample indices (LoadGen's ``ConstructFastSUT``:
no Python object per sample); an inline query is handed to the source in runs of consecutive
samples (``QueryRows``), which a source may serve as slices of the query gathered once, and each
run is completed with one ``QuerySamplesComplete`` over responses reused from call to call
(LoadGen copies them), so no Python object is built per sample there either.

Faults. A callback that raised into LoadGen's C++ would unwind through code that is not
exception-safe, and a sample never completed makes LoadGen wait forever. So every callback keeps
the first exception, completes the samples it was handed, and answers every later sample at once
without the model; ``raise_failure`` re-raises it once ``StartTest`` has returned.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

from core.base.queries import QueryRows


@runtime_checkable
class QuerySource(Protocol):
    """The samples LoadGen queries and the model that answers them."""

    @property
    def total_samples(self) -> int:
        """Samples in the query sample library (QSL)."""
        ...

    @property
    def performance_samples(self) -> int:
        """How many samples LoadGen may hold loaded at once (its performance sample count)."""
        ...

    def load(self, indices: Sequence[int]) -> None:
        """Stage these samples in host memory (the QSL's LoadSamplesToRam); untimed."""
        ...

    def unload(self, indices: Sequence[int]) -> None:
        """Release samples staged by ``load``."""
        ...

    def infer(self, indices: Sequence[int]) -> None:
        """Run the model on these samples and return once the device is done with them."""
        ...


@runtime_checkable
class AnsweringSource(Protocol):
    """A query source that sets up its model's thread state (``torch.inference_mode``, autocast)
    once for a whole test rather than in every ``infer``."""

    def answering(self) -> AbstractContextManager[Any]:
        """Entered on the thread that answers, around every query of the test."""
        ...


WindowCallback = Callable[[], None]

# (LoadGen's response id, the sample's index in the QSL)
_Sample = tuple[int, int]


class _Responses:
    """Empty responses for ``QuerySamplesComplete``, made once per answering thread and reused:
    LoadGen copies them in the call, and setting a response's id costs half of making one."""

    def __init__(self, loadgen: Any) -> None:
        self._lg = loadgen
        self._per_thread = threading.local()

    def empty(self, sample_ids: list[int]) -> list[Any]:
        made: list[Any] | None = getattr(self._per_thread, "made", None)
        if made is None:
            made = self._per_thread.made = []
        if len(made) < len(sample_ids):
            made.extend(self._lg.QuerySampleResponse(0, 0, 0) for _ in range(len(sample_ids) - len(made)))
        responses = made if len(made) == len(sample_ids) else made[: len(sample_ids)]
        for response, sample_id in zip(responses, sample_ids):
            response.id = sample_id
        return responses


class QueryAnswerer:
    """LoadGen's SUT and QSL callbacks over one ``QuerySource``.

    :param loadgen: the imported ``mlperf_loadgen`` module.
    :param max_batch_size: most samples per ``infer`` call.
    :param answer_on_worker: answer from a worker thread (server) instead of inline.
    :param on_window_open: called once the samples are loaded, just before LoadGen starts issuing.
    :param on_window_close: called once LoadGen has every answer, before the samples are unloaded.
    """

    def __init__(
        self,
        source: QuerySource,
        loadgen: Any,
        *,
        max_batch_size: int,
        answer_on_worker: bool,
        on_window_open: WindowCallback | None = None,
        on_window_close: WindowCallback | None = None,
    ) -> None:
        self._source = source
        self._lg = loadgen
        self._max_batch_size = max_batch_size
        self._on_window_open = on_window_open
        self._on_window_close = on_window_close
        self._failure: BaseException | None = None
        self._failure_lock = threading.Lock()
        self.samples_answered = 0
        """Samples the model answered (not those completed without it after a failure)."""
        self.window_start_perf_counter: float | None = None
        self.window_end_perf_counter: float | None = None
        self._loaded_sets = 0
        self._window_open = False
        # Server: samples waiting for the worker, and the flag that ends it.
        self._waiting: deque[_Sample] = deque()
        self._waiting_changed = threading.Condition()
        self._stopping = False
        self._worker: threading.Thread | None = None
        self._responses = _Responses(loadgen)
        if answer_on_worker:
            self._worker = threading.Thread(target=self._answer_waiting, name="loadgen-server-worker", daemon=True)
            self._worker.start()

    # --- faults -----------------------------------------------------------------------------

    @property
    def failure(self) -> BaseException | None:
        return self._failure

    def _fail(self, exc: BaseException) -> None:
        with self._failure_lock:
            if self._failure is None:
                self._failure = exc

    def raise_failure(self) -> None:
        """Re-raise the first exception a callback caught, if any (after StartTest has returned)."""
        if self._failure is not None:
            raise self._failure

    # --- the query sample library -------------------------------------------------------------

    def load_samples(self, indices: Sequence[int]) -> None:
        if self._failure is not None:
            return
        try:
            self._source.load(list(indices))
            self._loaded_sets += 1
            # In performance mode LoadGen loads its one set right before it starts issuing.
            self.window_start_perf_counter = time.perf_counter()
            if self._on_window_open is not None:
                self._on_window_open()
            self._window_open = True
        except BaseException as exc:
            self._fail(exc)

    def unload_samples(self, indices: Sequence[int]) -> None:
        # ...and unloads it once every sample has been answered and the result logged.
        self.window_end_perf_counter = time.perf_counter()
        if self._window_open:
            self._window_open = False
            try:
                if self._on_window_close is not None:
                    self._on_window_close()
            except BaseException as exc:
                self._fail(exc)
        if self._loaded_sets == 0:
            return  # its load failed: there is nothing to release
        self._loaded_sets -= 1
        try:
            self._source.unload(list(indices))
        except BaseException as exc:
            self._fail(exc)

    # --- the system under test -------------------------------------------------------------------

    def issue_queries(self, query_samples: Sequence[Any]) -> None:
        """LoadGen's ``ConstructSUT`` callback (a LoadGen without ``ConstructFastSUT``)."""
        self.issue_query([int(sample.id) for sample in query_samples], [int(sample.index) for sample in query_samples])

    def issue_query(self, sample_ids: list[int], indices: list[int]) -> None:
        """LoadGen's ``ConstructFastSUT`` callback: a query as its response ids and sample indices."""
        handed_over = 0  # samples of this query already answered inline or queued for the worker
        try:
            if self._worker is None:
                size, count = self._max_batch_size, len(sample_ids)
                for start in range(0, count, size):
                    end = min(start + size, count)
                    self._answer(sample_ids[start:end], QueryRows(indices, start, end))
                    handed_over = end
            else:
                with self._waiting_changed:
                    self._waiting.extend(zip(sample_ids, indices))
                    self._waiting_changed.notify()
                handed_over = len(sample_ids)
        except BaseException as exc:
            # _answer keeps its own faults; this is one outside it (a KeyboardInterrupt between
            # batches): the rest of the query is completed all the same, so LoadGen can end.
            self._fail(exc)
            self._complete(sample_ids[handed_over:])

    def flush_queries(self) -> None:
        """LoadGen will issue no more queries; those waiting are still answered."""

    def _answer(self, sample_ids: list[int], indices: Sequence[int]) -> None:
        try:
            if self._failure is None:
                self._source.infer(indices)
                self.samples_answered += len(sample_ids)
        except BaseException as exc:
            self._fail(exc)
        # Completed whatever happened: LoadGen waits for every sample it issued.
        self._complete(sample_ids)

    def _complete(self, sample_ids: list[int]) -> None:
        """Tell LoadGen these samples are done, with an empty response (performance mode reads none)."""
        try:
            self._lg.QuerySamplesComplete(self._responses.empty(sample_ids))
        except BaseException as exc:
            self._fail(exc)

    def _answer_waiting(self) -> None:
        """Server worker: take what has arrived (up to a batch), answer it, repeat until stopped."""
        while True:
            with self._waiting_changed:
                while not self._waiting and not self._stopping:
                    self._waiting_changed.wait()
                if not self._waiting:
                    return
                count = min(len(self._waiting), self._max_batch_size)
                batch = [self._waiting.popleft() for _ in range(count)]
            self._answer([sample_id for sample_id, _ in batch], [index for _, index in batch])

    def stop(self) -> None:
        """End the worker once it has answered what is waiting; wait for it."""
        if self._worker is None:
            return
        with self._waiting_changed:
            self._stopping = True
            self._waiting_changed.notify()
        self._worker.join()
