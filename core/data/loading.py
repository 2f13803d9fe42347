"""Micro-batches for the PyTorch executor from a real dataset: background workers, rank sharding,
endless epochs, and the time the training loop spends waiting for them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset

from core.config import RunConfig
from core.data import detect_format
from core.data.torch_datasets import torch_dataset
from core.running.distributed import ProcessContext


class FileBatches:
    """Yields (inputs, targets) micro-batches on the host; counts seconds spent waiting for one."""

    def __init__(self, config: RunConfig, pool_inputs: torch.Tensor, process: ProcessContext, pin_memory: bool) -> None:
        assert config.micro_batch_size is not None
        path = Path(config.data)
        self.format = detect_format(path) if config.data_format == "auto" else config.data_format
        self.dataset = torch_dataset(path, self.format, pool_inputs, process.rank, process.world_size)
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
            self._loader = DataLoader(self.dataset, **common)
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
            self._loader = DataLoader(self.dataset, sampler=self._sampler, **common)
            if len(self._loader) == 0:
                raise ValueError(
                    f"{path}: {self.samples} samples are fewer than one micro-batch of "
                    f"{config.micro_batch_size} for each of {process.world_size} rank(s)"
                )
        self._batches = self._endless()
        self.wait_seconds = 0.0

    def _endless(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        epoch = 0
        while True:
            if self._sampler is not None:
                self._sampler.set_epoch(epoch)
            yield from self._loader
            epoch += 1

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        started = time.perf_counter()
        batch = next(self._batches)
        self.wait_seconds += time.perf_counter() - started
        return batch

    def details(self) -> dict[str, Any]:
        return {"data_format": self.format, "dataset_samples": self.samples}
