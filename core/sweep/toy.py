"""Toy scale: a sweep file tried on this CPU in seconds (``core sweep FILE --toy``).

Not a second copy of the file: its own grid, each cell shrunk the same documented way, so a file
written for four A100s or an IPU-POD is exercised end to end (planning, the runs, the database,
the report) before its machine is booked, and in CI. What a toy cell keeps and changes:

- the workload and its architecture (the zoo's ``small`` variant: fewer, narrower layers and small
  inputs; the FCNN's widths capped; see each workload's ``toy_options``) and the framework; the
  precision becomes fp32 where it is TF32 (a GPU mode), bf16 or fp16 (emulated on most CPUs, several
  times slower than fp32: :data:`TOY_PRECISIONS`), a plugin's precision is kept;
- the CPU instead of the file's accelerator, one replica on one device of one node (a replica the file
  splits over devices is whole on the toy's one: no tensor parallelism, pipeline stages, sharding,
  recomputation or pipeline schedule; the file's split is checked by its dry run), no vendor
  options, no compilation, synthetic data, no energy meter; what only the file's machine or its
  files can honour is dropped: ``nodes`` and ``rendezvous`` (one node), ``weights`` (a file for the
  full-size model, which the toy's small variant cannot load), ``accuracy`` (it needs a labelled
  image folder; a toy reads synthetic data);
- ``micro_batch_size`` at most 4, ``gradient_accumulation`` at most 2 (an inference cell's stays 1;
  ``global_batch_size`` is dropped, its micro-batch and accumulation shrunk as given ones),
  2 timed steps after 1 warm-up; an inference cell under a LoadGen scenario runs LoadGen for 0.3 s
  and at least 20 queries, whether or not the file gives ``loadgen`` settings, at a server rate of
  at most 100 samples/s, with the offline rate and single-stream latency measured (not the file's,
  which are its machine's);
- a cell trained to a target (``target``: a paper's study to a quality, on data the user supplies)
  reads scikit-learn's digits written as tiny train/ and val/ splits (an image folder, or the shards or
  TFRecord files the cell's data format or framework reads)
  (:data:`TOY_TARGET_IMAGES_PER_CLASS` of each class in each split, in core's cache) instead, its model
  given their 10 classes, its target kept and its budget 2 epochs, evaluated after each: the whole
  path of a run to a target (real epochs, per-epoch times, evaluation) in seconds, whether or not the
  toy reaches the file's quality (``target_not_reached`` is a measured outcome);
- cells that become equal are run once, and at most ``TOY_MAX_CELLS`` of them, spread over the grid.

The toy sweep is stored under ``<name>-toy``, never beside the file's real results.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from core.base.config import LOADGEN_SCENARIOS
from core.base.errors import ConfigError
from core.base.results import RunResult
from core.contract.manager import PluginManager
from core.sweep.plan import Cell, cell_key

TOY_MAX_CELLS = 4
TOY_MICRO_BATCH = 4
TOY_GRADIENT_ACCUMULATION = 2
TOY_SUFFIX = "-toy"
TOY_LOADGEN_SECONDS = 0.3
TOY_LOADGEN_QUERIES = 20
#: a toy run to a target: each class's images in each split of the digits folder (train, val), epochs
TOY_TARGET_IMAGES_PER_CLASS = (2, 1)
TOY_TARGET_EPOCHS = 2
TOY_TARGET_CLASSES = 10
#: the formats a toy run to a target's digits are written in, each by its writer in core.workloads.digits
TOY_TARGET_FORMATS = {"image-folder": "write_image_folder", "webdataset": "write_shards", "tfrecord": "write_records"}

# Fields a toy fixes, whatever the file says.
_TOY_FIXED: dict[str, Any] = {
    "accelerator": "cpu",
    "nodes": 1,
    "replicas": 1,
    "devices_per_replica": 1,
    "tensor_parallel": 1,
    "device_iterations": 1,
    "steps": 2,
    "warmup_steps": 1,
    "compile": False,
    "power_meter": "none",
    "node_meters": "",
    "data": "synthetic",
}
# Fields that only mean something on the file's machine.
_TOY_DROPPED = (
    "accelerator_options",
    "threads_per_replica",
    "data_format",
    "data_workers",
    "timeout_seconds",
    "rendezvous",  # one node: no rendezvous
    "weights",  # a file for the full-size model: the toy's small variant has other shapes
    "accuracy",  # top-1 over a labelled image folder; a toy reads synthetic data
    "duration_seconds",  # a window of the file's length (CARAML's 30 minutes); a toy's is its two steps
    "global_batch_size",  # the file's machine's batch (4096 is 1024 accumulated toy micro-batches)
    # a replica split over the file's devices: the toy's replica is one device (its dry run checks the split)
    "sharding",
    "recompute",
    "pipeline_schedule",
)
# Precisions a toy runs as fp32: TF32 is a GPU mode, and a CPU without AVX-512's BF16/FP16
# instructions emulates 16-bit autocast (ResNet-50's small variant, micro-batch 4, on this project's
# CI-class CPU: bf16 3.7x and fp16 3.8x fp32's window; EfficientNet-B4's fp16 toy took 608 s).
TOY_PRECISIONS = {"tf32": "fp32", "bf16": "fp32", "fp16": "fp32"}
# LoadGen settings that describe the file's machine: a toy measures its own rates instead.
_TOY_LOADGEN_DROPPED = ("offline_expected_samples_per_second", "single_stream_expected_latency_seconds")
TOY_SERVER_SAMPLES_PER_SECOND = 100.0


def toy_cell_options(options: dict[str, Any], manager: PluginManager) -> dict[str, Any]:
    """One cell's options at toy scale (see the module docstring)."""
    toy = {key: value for key, value in options.items() if key not in _TOY_DROPPED}
    toy.update(_TOY_FIXED)
    precision = toy.get("precision")
    if isinstance(precision, str) and precision in TOY_PRECISIONS:  # a bad value is planning's to name
        toy["precision"] = TOY_PRECISIONS[precision]
    # Inference accumulates no gradients: anything but 1 is refused there, so a toy must not add it.
    accumulation_cap = 1 if toy.get("mode") == "inference" else TOY_GRADIENT_ACCUMULATION
    for field, cap in (("micro_batch_size", TOY_MICRO_BATCH), ("gradient_accumulation", accumulation_cap)):
        value = toy.get(field)
        toy[field] = min(value, cap) if isinstance(value, int) and not isinstance(value, bool) else cap
    try:
        workload = manager.workload(toy["workload"])
    except ConfigError:
        return toy  # an unknown workload: planning names it
    toy["workload_options"] = workload.toy_options(dict(toy.get("workload_options") or {}))
    if toy.get("scenario") in LOADGEN_SCENARIOS:
        # Also without the file's settings: LoadGen's own minimum is 10 s.
        toy["loadgen"] = _toy_loadgen(dict(toy.get("loadgen") or {}))
    if isinstance(toy.get("target"), dict):
        _toy_target(toy, workload)
    return toy


def _toy_target(toy: dict[str, Any], workload: Any) -> None:
    """A run to a target at toy scale: the digits folder for the user's data, their 10 classes for the
    model's head (where the workload takes ``num_classes``), the file's target on a budget of
    :data:`TOY_TARGET_EPOCHS` epochs, evaluated after each."""
    target = toy["target"]
    toy["target"] = {key: value for key, value in target.items() if key in ("metric", "value")} | {
        "evaluate_every_epochs": 1,
        "max_epochs": TOY_TARGET_EPOCHS,
    }
    framework = toy.get("framework", "torch")
    data_format = toy.get("data_format", "auto")
    if data_format not in TOY_TARGET_FORMATS:  # "auto" and the rest: what the framework reads
        data_format = "tfrecord" if framework == "tensorflow" else "image-folder"
    toy["data"] = str(toy_target_folder(data_format))
    if "num_classes" in workload.options_model.model_fields:
        toy["workload_options"] = {**toy["workload_options"], "num_classes": TOY_TARGET_CLASSES}


def toy_target_folder(data_format: str = "image-folder") -> Path:
    """scikit-learn's digits split into train/ and val/ in ``data_format`` (an image folder, WebDataset
    shards or TFRecord files: :data:`TOY_TARGET_FORMATS`), each class's first images of each split only,
    written once into core's cache (``$XDG_CACHE_HOME/core``) whole or not at all (a temporary folder
    renamed into place)."""
    from core.roofs.cache import cache_directory  # core/roofs: its parent is core's own

    train, held_out = TOY_TARGET_IMAGES_PER_CLASS
    folder = cache_directory().parent / f"toy-target-digits-{data_format}-{train}-{held_out}"
    if folder.is_dir():
        return folder
    try:
        from core.workloads import digits

        writer = TOY_TARGET_FORMATS[data_format]
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".toy-target-", dir=folder.parent))
        try:
            for split, count in (("train", train), ("val", held_out)):
                getattr(digits, writer)(staging / "whole", per_class=count)
                shutil.move(str(staging / "whole" / split), str(staging / split))
                shutil.rmtree(staging / "whole")
            os.replace(staging, folder)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    except ImportError as error:
        raise ConfigError(
            "target",
            "toy",
            f"a toy run to a target reads scikit-learn's digits as {data_format} splits ({error}): "
            "pip install 'core[digits]'" + (" and TensorFlow" if data_format == "tfrecord" else ""),
        ) from error
    except OSError as error:
        if not folder.is_dir():  # another toy sweep may have written it first
            raise ConfigError("data", str(folder), f"a toy run to a target's {data_format} splits: {error}") from error
    return folder


def _toy_loadgen(settings: dict[str, Any]) -> dict[str, Any]:
    """LoadGen's stopping rules shrunk to a fraction of a second (MLPerf's are 600 s)."""
    for key, cap in (("min_duration_seconds", TOY_LOADGEN_SECONDS), ("min_query_count", TOY_LOADGEN_QUERIES)):
        value = settings.get(key)
        settings[key] = min(value, cap) if isinstance(value, (int, float)) and not isinstance(value, bool) else cap
    for key in ("max_duration_seconds", "max_query_count", *_TOY_LOADGEN_DROPPED):
        settings.pop(key, None)  # would fall below the shrunk minimums, or are the machine's rates
    rate = settings.get("server_target_samples_per_second")
    if isinstance(rate, (int, float)) and not isinstance(rate, bool):
        settings["server_target_samples_per_second"] = min(rate, TOY_SERVER_SAMPLES_PER_SECOND)
    return settings


TOY_ENERGY_REASON = "a toy run (core sweep --toy) measures no energy: it sets power_meter='none'"
TOY_WARNING = "a toy run (core sweep --toy): the file's grid at toy scale on this CPU, not its machine's figures"


def mark_toy_result(result: RunResult) -> None:
    """Say in a toy cell's result why it has no energy and what its figures are (the run itself only
    saw power_meter='none' and a small model)."""
    if result.energy_unavailable_reason is not None:
        result.energy_unavailable_reason = TOY_ENERGY_REASON
    if TOY_WARNING not in result.warnings:
        result.warnings.insert(0, TOY_WARNING)


def toy_cells(cells: list[Cell], manager: PluginManager) -> list[Cell]:
    """The grid's cells at toy scale: equal ones once, at most TOY_MAX_CELLS spread over the grid."""
    distinct: dict[str, Cell] = {}
    for cell in cells:
        options = toy_cell_options(cell.options, manager)
        key = cell_key(options)
        if key not in distinct:
            distinct[key] = Cell(index=0, key=key, label=f"toy of {cell.label}", options=options, toy=True)
    chosen = list(distinct.values())
    if len(chosen) > TOY_MAX_CELLS:
        step = (len(chosen) - 1) / (TOY_MAX_CELLS - 1)
        chosen = [chosen[round(i * step)] for i in range(TOY_MAX_CELLS)]
    for index, cell in enumerate(chosen):
        cell.index = index
    return chosen
