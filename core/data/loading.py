"""Micro-batches for the PyTorch executor from a real dataset: background workers, rank sharding,
endless epochs, and the time the training loop spends waiting for them.

Whatever goes wrong while reading (a broken file, memory exhausted in a worker, a worker killed)
reaches the runner as one :class:`core.base.errors.DataError` naming the file where it is known: a fault
of the data, never the model's out-of-memory. The loader's worker processes are stopped and their
temporary folders removed on every way out (:meth:`LoaderWorkers.close`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import multiprocessing
import os
import shutil
import signal
import time
from collections.abc import Generator, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset, Sampler, Subset, get_worker_info

from core.base.config import RunConfig
from core.base.distributed import ProcessContext
from core.base.errors import DataError
from core.data import detect_format, loader_worker_death
from core.data.epoch_order import EVALUATION_BATCH, EpochOrder
from core.data.torch_datasets import torch_dataset

#: how long a loader worker has to end after it was told to stop (torch's own teardown joins each
#: for 5 s, then sends SIGTERM) before it is killed
WORKER_STOP_GRACE_SECONDS = 2.0


#: the longest path a Unix socket may have (sockaddr_un's sun_path, less its closing NUL)
UNIX_SOCKET_PATH_BYTES = 107
#: multiprocessing's names: a process's folder ``pymp-XXXXXXXX`` and a socket ``listener-XXXXXXXX``
_WORKER_FOLDER, _WORKER_SOCKET = "pymp-" + "x" * 8, "listener-" + "x" * 8


def check_worker_socket_folder() -> None:
    """Refuse, naming TMPDIR, a temporary folder too deep for the sockets through which loader
    workers pass tensors: a worker makes one in its ``pymp-*`` folder there for each batch, and
    past 107 bytes it fails in the worker's queue thread, which prints the error and drops the
    batch, so the main process would wait for it forever."""
    import tempfile

    # A folder multiprocessing already made in this process is the one the workers inherit.
    inherited = multiprocessing.current_process()._config.get("tempdir")  # type: ignore[attr-defined]
    folder = inherited if inherited is not None else os.path.join(tempfile.gettempdir(), _WORKER_FOLDER)
    socket = os.fsencode(os.path.join(folder, _WORKER_SOCKET))
    if len(socket) > UNIX_SOCKET_PATH_BYTES:
        raise DataError(
            f"data loader workers cannot start: the temporary folder {os.path.dirname(folder)!r} (TMPDIR) is too "
            f"deep for the sockets they pass tensors through (a socket there has a path of {len(socket)} bytes; a "
            f"Unix socket's may have {UNIX_SOCKET_PATH_BYTES}): set TMPDIR to a shorter path, or data_workers = 0"
        )


def _prepare_worker(folders: Connection, worker_id: int) -> None:
    """A loader worker's ``worker_init_fn``: make this worker's multiprocessing temporary folder
    (``pymp-*``, where its sockets for passing tensors to the main process live) now, where
    multiprocessing makes it, and send its path to the main process. The worker removes it when it
    ends, on SIGTERM too (a stopped run's group, or torch stopping a worker that would not end);
    the main process removes it after a worker killed outright (the kernel's out-of-memory killer)."""
    import multiprocessing
    import multiprocessing.util

    # multiprocessing's own record of the process's folder: one inherited from the main process is
    # the main process's to remove, not this worker's.
    inherited = multiprocessing.current_process()._config.get("tempdir") is not None  # type: ignore[attr-defined]
    if inherited:
        return
    # SIGTERM waits from before the folder is made until the main process has its path and the
    # handler that removes it is in place: a worker stopped in between would leave it unrecorded.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        folder = multiprocessing.util.get_temp_dir()
        with contextlib.suppress(OSError):  # a main process already gone needs no record
            folders.send(folder)
        signal.signal(signal.SIGTERM, functools.partial(_leave_on_sigterm, folder))
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def _leave_on_sigterm(folder: str, signum: int, frame: Any) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    os._exit(128 + signum)  # as SIGTERM's default action would end it, without its folder


class LoaderWorkers:
    """A DataLoader's iterations and its worker processes: each :meth:`iterate` starts an epoch;
    :meth:`close` stops the workers (persistent ones live as long as the loader) and removes the
    temporary folders of any that could not remove their own.

    The workers' folders stay where multiprocessing puts them (a longer path could pass the 108
    bytes a Unix socket's path may have); their paths come back through a pipe, which leaves no file.
    """

    def __init__(self, loader: DataLoader, source: str) -> None:
        self._loader = loader
        self._source = source
        self._iterator: Any = None
        self._folders: tuple[Connection, Connection] | None = None
        self._sent: list[str] = []

    def iterate(self) -> Iterator[Any]:
        if self._folders is None and self._loader.num_workers > 0:
            check_worker_socket_folder()
            # Before the first workers start: they start with the first iteration.
            self._folders = multiprocessing.Pipe(duplex=False)
            self._loader.worker_init_fn = functools.partial(_prepare_worker, self._folders[1])
        self._receive()  # a loader that starts workers each epoch must not fill the pipe
        self._iterator = iter(self._loader)
        return self._iterator

    def _receive(self) -> None:
        if self._folders is None:
            return
        reader = self._folders[0]
        with contextlib.suppress(EOFError, OSError):
            while reader.poll():
                self._sent.append(reader.recv())

    def next(self, iterator: Iterator[Any], end: Any = None) -> Any:
        """The next batch, or ``end`` after the epoch's last; any failure of the loader becomes a
        DataError."""
        try:
            return next(iterator, end)
        except Exception as error:
            died = _worker_killed(iterator, error, self._source)
            raise (died or DataError(loader_failure(error, self._source))) from error

    def close(self) -> None:
        # torch's own teardown, which its iterator's __del__ would call: each worker is told to stop,
        # joined, and terminated if it does not. Waiting for garbage collection is not enough: at
        # interpreter exit multiprocessing terminates daemonic workers first, leaving their files.
        shutdown = getattr(self._iterator, "_shutdown_workers", None)
        workers = list(getattr(self._iterator, "_workers", None) or ())
        self._iterator = None
        try:
            if callable(shutdown):
                shutdown()
        finally:
            # torch's teardown ends with SIGTERM, which a worker stuck in native code (a decoder, a
            # parser) or one that blocks the signal outlives: it would spin on as an orphan.
            _kill_survivors(workers)
            self._receive()
            # The folders the stopped workers sent (one that ended normally removed its own already).
            for folder in self._sent:
                if Path(folder).name.startswith("pymp-"):
                    shutil.rmtree(folder, ignore_errors=True)
            self._sent = []
            for end in self._folders or ():
                end.close()
            self._folders = None


def _kill_survivors(workers: list[Any], grace_seconds: float = WORKER_STOP_GRACE_SECONDS) -> None:
    """SIGKILL each of a loader's worker processes still alive ``grace_seconds`` after its stop."""
    for worker in workers:
        with contextlib.suppress(Exception):  # a worker already reaped, or never started
            worker.join(timeout=grace_seconds)
            if worker.is_alive():
                worker.kill()
                worker.join(timeout=grace_seconds)


class WorkerFailure(Exception):
    """A dataset's failure in a loader worker, on its way to the main process whole.

    torch rebuilds a worker's exception in the main process from the text of its traceback
    (``ExceptionWrapper``: "Caught <type> in DataLoader worker process <n>.\nOriginal Traceback
    ...", the exception's own text last), so a message over several lines (tarfile's ReadError lists
    each compression it tried; a file name may hold a newline) used to keep only its last line. This
    one's text is the message as one line of JSON, read back by :func:`loader_failure`."""

    def __init__(self, message: str) -> None:
        super().__init__(message)


class ReportedDataset(Dataset):
    """``dataset`` as the DataLoader reads it: a sample that cannot be read raises, in a worker, a
    :class:`WorkerFailure` carrying the whole message (naming the file); in the main process the
    original exception."""

    def __init__(self, dataset: Any, source: str) -> None:
        self.dataset, self.source = dataset, source

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        with _reported(self.source):
            return self.dataset[index]


class ReportedStream(IterableDataset):
    """:class:`ReportedDataset` for a streamed dataset (WebDataset shards)."""

    def __init__(self, dataset: IterableDataset, source: str) -> None:
        self.dataset, self.source = dataset, source

    def __iter__(self) -> Iterator[Any]:
        with _reported(self.source):
            samples = iter(self.dataset)
        while True:
            with _reported(self.source):
                sample = next(samples, _END)
            if sample is _END:
                return
            yield sample


_END = object()


@contextlib.contextmanager
def _reported(source: str) -> Iterator[None]:
    try:
        yield
    except Exception as error:
        worker = get_worker_info()
        if worker is None:
            raise
        where = f"DataLoader worker process {worker.id}"
        raise WorkerFailure(json.dumps(f"{failure_message(error, source, where)} ({where})")) from None


def failure_message(error: BaseException, source: str, where: str = "the data loader") -> str:
    """What reading the data raised, as a DataError's message: its own where it is one (it names the
    file); out of memory as a fault of the data, never the model's; anything else with its type."""
    text = str(error).strip()
    if isinstance(error, DataError):
        return text
    if isinstance(error, MemoryError):
        return f"reading {source}: out of memory in {where} (MemoryError{': ' + text if text else ''})"
    return f"reading {source}: {type(error).__name__}: {text}"


def _worker_killed(iterator: Iterator[Any], error: BaseException, source: str) -> DataError | None:
    """The death of a worker that a lost connection stands for, or None.

    A worker killed just after it queued a batch leaves the main process a batch whose shared
    memory it must fetch from that worker: torch's check for dead workers has not run yet, and
    the fetch fails as ConnectionResetError (or EOFError). The worker's exit status says what
    happened, as torch's own message would."""
    if not isinstance(error, (ConnectionError, EOFError)):
        return None
    for worker in getattr(iterator, "_workers", []):
        worker.join(timeout=1.0)  # dead already where the connection broke: reaped at once
        code = worker.exitcode
        if code is not None and code < 0:
            text = f"DataLoader worker (pid {worker.pid}) is killed by signal: {signal.strsignal(-code)}."
            return loader_worker_death(RuntimeError(text), source)
        if code:
            text = f"DataLoader worker (pid {worker.pid}) exited unexpectedly with exit code {code}."
            return loader_worker_death(RuntimeError(text), source)
    return None


def loader_failure(error: BaseException, source: str) -> str:
    """What a DataLoader's failure says, without the worker's traceback torch folds into it.

    A worker's exception reaches the main process rebuilt by torch (``ExceptionWrapper.reraise``)
    with the message "Caught <type> in DataLoader worker process <n>.\nOriginal Traceback ...",
    the original's last line at the end: the whole message where it is a :class:`WorkerFailure`'s
    (one line of JSON); otherwise (a failure outside the dataset: collating a batch) its last line."""
    text = str(error).strip()
    lines = text.splitlines()
    if isinstance(error, WorkerFailure):
        with contextlib.suppress(ValueError):
            message = json.loads(lines[-1].partition(": ")[2])
            if isinstance(message, str):
                return message
    if len(lines) > 1 and lines[0].startswith("Caught ") and " in " in lines[0]:
        worker = lines[0].split(" in ", 1)[1].rstrip(".")
        kind, _, message = lines[-1].partition(": ")
        kind = kind.rsplit(".", 1)[-1]
        if kind == "DataError":
            return f"{message} ({worker})"
        if kind == "MemoryError":
            return f"reading {source}: out of memory in {worker} (MemoryError{': ' + message if message else ''})"
        return f"reading {source}: {kind}: {message} ({worker})"
    died = loader_worker_death(error, source)
    if died is not None:
        return str(died)
    return failure_message(error, source)


class FileBatches:
    """Yields (inputs, targets) micro-batches on the host; counts seconds spent waiting for one."""

    def __init__(
        self,
        config: RunConfig,
        pool_inputs: torch.Tensor,
        process: ProcessContext,
        pin_memory: bool,
        vocabulary: int | None = None,
    ) -> None:
        assert config.micro_batch_size is not None
        path = Path(config.data)
        self.format = detect_format(path) if config.data_format == "auto" else config.data_format
        try:
            self.dataset = torch_dataset(path, self.format, pool_inputs, process.rank, process.world_size, vocabulary)
        except MemoryError:
            raise DataError(f"{path}: out of memory listing the dataset") from None
        self._sampler: DistributedSampler | None = None
        workers = config.data_workers
        common: dict[str, Any] = dict(
            batch_size=config.micro_batch_size,
            num_workers=workers,
            pin_memory=pin_memory,
            drop_last=True,
            persistent_workers=workers > 0,
        )
        if workers > 0:
            common["prefetch_factor"] = 4
        if isinstance(self.dataset, IterableDataset):
            self.samples: int | None = None  # shards are streamed; their length is unknown up front
            self._loader = DataLoader(ReportedStream(self.dataset, str(path)), **common)
        else:
            self.samples = len(self.dataset)
            # Shuffled, and split so each rank reads a disjoint part of every epoch.
            self._sampler = DistributedSampler(
                self.dataset,
                num_replicas=process.world_size,
                rank=process.rank,
                shuffle=True,
                seed=config.seed,
                drop_last=True,
            )
            self._loader = DataLoader(ReportedDataset(self.dataset, str(path)), sampler=self._sampler, **common)
            if len(self._loader) == 0:
                raise ValueError(
                    f"{path}: {self.samples} samples are fewer than one micro-batch of "
                    f"{config.micro_batch_size} for each of {process.world_size} rank(s)"
                )
        # No worker process starts before the first batch is asked for.
        self._workers = LoaderWorkers(self._loader, str(path))
        self._batches = self._endless()
        self.wait_seconds = 0.0

    def _endless(self) -> Generator[tuple[torch.Tensor, torch.Tensor], None, None]:
        epoch = 0
        while True:
            if self._sampler is not None:
                self._sampler.set_epoch(epoch)
            iterator = self._workers.iterate()
            while (batch := self._workers.next(iterator)) is not None:
                yield batch
            epoch += 1

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        started = time.perf_counter()
        batch = next(self._batches)
        self.wait_seconds += time.perf_counter() - started
        return batch

    def details(self) -> dict[str, Any]:
        return {"data_format": self.format, "dataset_samples": self.samples}

    def close(self) -> None:
        """Stop the loader's workers and remove their temporary files; the executor's close calls it."""
        self._batches.close()
        self._workers.close()


class _EpochBatches(Sampler[list[int]]):
    """One epoch's micro-batches of this process's ``replicas``, as lists of indices in
    :class:`EpochOrder`'s order: the DataLoader asks for it anew each epoch, in the main process,
    after ``epoch`` is set."""

    def __init__(self, order: EpochOrder, replicas: range) -> None:
        self.order, self.replicas = order, replicas
        self.epoch = 0

    def __len__(self) -> int:
        return self.order.updates_per_epoch * self.order.accumulation

    def __iter__(self) -> Iterator[list[int]]:
        first = self.epoch * self.order.updates_per_epoch
        for update in range(first, first + self.order.updates_per_epoch):
            for micro_step in range(self.order.accumulation):
                yield self.order.micro_batch(update, micro_step, self.replicas).tolist()


class FileEpochs:
    """A run to a target's training split read from files (an image folder, shards) by the loader's workers, in the
    order the in-memory split is read (:class:`core.data.epoch_order.EpochOrder`: each epoch
    a permutation drawn from the run's seed and the epoch's number, cut into global batches, the
    last partial one dropped), so the quality curve does not depend on the replicas.

    :param replicas: the global numbers of this process's replicas, in order."""

    def __init__(
        self, dataset: Dataset, order: EpochOrder, replicas: range, workers: int, pin_memory: bool, source: str
    ) -> None:
        self.samples, self.updates_per_epoch = order.samples, order.updates_per_epoch
        self._batches = _EpochBatches(order, replicas)
        common: dict[str, Any] = {"prefetch_factor": 4} if workers > 0 else {}
        loader = DataLoader(
            ReportedDataset(dataset, source),
            batch_sampler=self._batches,
            num_workers=workers,
            pin_memory=pin_memory,
            persistent_workers=workers > 0,
            **common,
        )
        self._workers, self._source = LoaderWorkers(loader, source), source
        self._iterator: Iterator[Any] | None = None
        self._next = (0, 0)  # the (update, micro-step) the next batch is
        self.wait_seconds = 0.0

    def micro_batch(self, update: int, micro_step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) on the host of this process's ``micro_step`` of ``update`` (from 0): asked
        for in order, as the training loop reads them."""
        if (update, micro_step) != self._next:
            raise ValueError(f"micro-batch {(update, micro_step)} asked for out of order; next is {self._next}")
        started = time.perf_counter()
        if self._iterator is None or (micro_step == 0 and update % self.updates_per_epoch == 0):
            self._batches.epoch = update // self.updates_per_epoch
            self._iterator = self._workers.iterate()
        batch = self._workers.next(self._iterator)
        self.wait_seconds += time.perf_counter() - started
        if batch is None:
            raise DataError(f"{self._source}: the epoch ended before its update {update}")
        last = micro_step + 1 == self._batches.order.accumulation
        self._next = (update + 1, 0) if last else (update, micro_step + 1)
        return batch

    def close(self) -> None:
        self._iterator = None
        self._workers.close()


class HeldOutFiles:
    """A run to a target's held-out split read from files (an image folder, shards, a token file): this
    process's shard (every world-size-th sample from its rank, as the in-memory evaluation takes them)
    in batches of ``batch`` samples, by workers kept between evaluations."""

    def __init__(
        self,
        dataset: Dataset,
        shard: tuple[int, int],
        workers: int,
        pin_memory: bool,
        source: str,
        batch: int = EVALUATION_BATCH,
    ) -> None:
        rank, world = shard
        self.samples = len(dataset)  # type: ignore[arg-type]
        mine = Subset(ReportedDataset(dataset, source), range(rank, self.samples, world))
        loader = DataLoader(
            mine,
            batch_size=batch,
            shuffle=False,
            num_workers=workers,
            pin_memory=pin_memory,
            persistent_workers=workers > 0,
        )
        self._workers = LoaderWorkers(loader, source)

    def batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        iterator = self._workers.iterate()
        while (batch := self._workers.next(iterator)) is not None:
            yield batch

    def close(self) -> None:
        self._workers.close()


def target_split_readers(
    config: RunConfig,
    pool_inputs: torch.Tensor,
    process: ProcessContext,
    replicas_here: int,
    pin_memory: bool,
    vocabulary: int | None = None,
) -> tuple[str, FileEpochs, HeldOutFiles]:
    """(format, training reader, held-out reader) of a run to a target's splits in ``config.data``
    (core.data.listing.target_splits): an image folder's train/ and val/, WebDataset shards' (read sample
    by sample at their members' offsets, core.data.split_index), or token files' train.bin and val.bin
    cut into sequences of the workload's length. This process holds ``replicas_here``
    replicas; ``pool_inputs`` are the workload's synthetic inputs, which the samples are shaped after;
    ``vocabulary``: token ids are checked against it as they are read (``TorchTrainingSpec.vocabulary``)."""
    from core.data.listing import target_splits
    from core.data.torch_datasets import ImageFolder, IndexedShards, TokenFile

    assert config.micro_batch_size is not None
    data_format, train, held_out = target_splits(Path(config.data), config.data_format)
    sample_shape = tuple(pool_inputs.shape[1:])
    if data_format == "tokens":
        if pool_inputs.dtype not in (torch.int64, torch.int32) or len(sample_shape) != 1:
            raise ValueError(f"token data needs a workload whose inputs are token ids; this one takes {sample_shape}")
        training_set: Dataset = TokenFile(train, sample_shape[0], vocabulary=vocabulary)
        held_out_set: Dataset = TokenFile(held_out, sample_shape[0], vocabulary=vocabulary)
        # A sequence's logits are its length x the vocabulary: evaluated a micro-batch at a time, which
        # training showed fits the device, not EVALUATION_BATCH sequences (GPT-2's 256 would take 52 GB).
        evaluation_batch = config.micro_batch_size
    elif data_format in ("image-folder", "webdataset"):
        if len(sample_shape) != 3:
            raise ValueError(
                f"image data needs a workload whose inputs are images [C, H, W]; this one takes {sample_shape}"
            )
        shape = (sample_shape[0], sample_shape[1], sample_shape[2])
        images = ImageFolder if data_format == "image-folder" else IndexedShards
        training_set, held_out_set = images(train, shape), images(held_out, shape)
        evaluation_batch = EVALUATION_BATCH
    else:
        raise ValueError(
            f"the PyTorch executor reads a run to a target's splits as image folders, shards or token files, "
            f"not {data_format}"
        )
    order = EpochOrder(
        len(training_set),  # type: ignore[arg-type]
        config.seed,
        config.micro_batch_size,
        config.gradient_accumulation,
        config.replicas,
    )
    replicas = range(process.rank * replicas_here, (process.rank + 1) * replicas_here)
    training = FileEpochs(training_set, order, replicas, config.data_workers, pin_memory, str(train))
    shard = (process.rank, max(process.world_size, 1))
    evaluation = HeldOutFiles(
        held_out_set, shard, config.data_workers, pin_memory, str(held_out), batch=evaluation_batch
    )
    return data_format, training, evaluation
