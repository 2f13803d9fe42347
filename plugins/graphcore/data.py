"""Real data on IPUs through ``poptorch.DataLoader``: one host call's samples per batch.

``poptorch.DataLoader(options, dataset, batch_size=micro_batch)`` combines ``micro_batch x
device_iterations x local replicas x gradient_accumulation`` samples into the tensor one call of
the compiled model consumes (graphcore/poptorch ``python/__init__.py``, ``combinedBatchSize``).
With several instances it hands each process its own part of a map-style dataset
(``auto_distributed_partitioning``, which needs ``randomSeed`` set to shuffle); an
``IterableDataset`` (WebDataset shards) is not partitioned by PopTorch — it asserts a single
process — so core's shards are split per instance before they reach it. With background workers
the loader runs in ``DataLoaderMode.Async``: an ``AsynchronousDataAccessor`` process keeps host calls
ready while the IPUs compute, as graphcore/examples reads ImageNet (``vision/cnns/pytorch/datasets/
dataset.py``). The seconds the host call waits for data are counted, as core's other executors do.

The datasets are core's own (``core.data.torch_datasets``), shaped after the workload's synthetic
inputs; only formats with one tensor shape per sample can feed a compiled IPU program.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from core.plugin import RunConfig, detect_data_format

from .placement import IpuPlacement

#: formats whose samples have one shape (PopTorch compiles one shape per input); COCO's boxes do not
IPU_TORCH_FORMATS = ("image-folder", "webdataset", "tokens", "cityscapes")


def data_format(config: RunConfig) -> str:
    return detect_data_format(Path(config.data)) if config.data_format == "auto" else config.data_format


class HostCallFiles:
    """Host calls of real samples, endlessly (a new epoch when the dataset runs out)."""

    def __init__(
        self,
        poptorch: Any,
        options: Any,
        config: RunConfig,
        pool_inputs: torch.Tensor,
        placement: IpuPlacement,
        instance_index: int,
        vocabulary: int | None = None,
    ) -> None:
        from core.plugin import torch_dataset

        assert config.micro_batch_size is not None
        self.format = data_format(config)
        dataset = torch_dataset(
            Path(config.data), self.format, pool_inputs, instance_index, placement.instances, vocabulary
        )
        iterable = isinstance(dataset, torch.utils.data.IterableDataset)
        self.mode = poptorch.DataLoaderMode.Async if config.data_workers > 0 else poptorch.DataLoaderMode.Sync
        self._loader = poptorch.DataLoader(
            options,
            dataset,
            batch_size=config.micro_batch_size,
            shuffle=not iterable,
            num_workers=config.data_workers,
            drop_last=True,
            # Shards are already this instance's; PopTorch partitions map-style datasets itself.
            auto_distributed_partitioning=not iterable,
            mode=self.mode,
        )
        self.samples_per_call = int(self._loader.combinedBatchSize)
        self.dataset_samples = None if iterable else len(dataset)
        self._batches = self._endless()
        self.wait_seconds = 0.0

    def _endless(self) -> Iterator[Any]:
        while True:
            empty = True
            for batch in self._loader:
                empty = False
                yield batch
            if empty:
                raise ValueError(
                    f"{self.dataset_samples if self.dataset_samples is not None else 'the'} samples are fewer than "
                    f"one host call of {self.samples_per_call} for this instance"
                )

    def next(self) -> Any:
        started = time.perf_counter()
        batch = next(self._batches)
        self.wait_seconds += time.perf_counter() - started
        return batch

    def details(self) -> dict[str, Any]:
        return {
            "data": "files",
            "data_format": self.format,
            "dataset_samples": self.dataset_samples,
            "data_loader_mode": self.mode.name,
            "data_wait_seconds": self.wait_seconds,
        }

    def close(self) -> None:
        # Async mode: stops the AsynchronousDataAccessor's worker process.
        self._loader.terminate()
