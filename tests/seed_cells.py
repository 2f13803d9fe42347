"""Cell summaries made up from a seed file's own grid: the cells its sweep would run (excludes
applied), each with one fabricated result, so the report's grouping and plots can be tested on the
papers' grids without running them."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from core.base.config import RunConfig, make_config
from core.base.results import DeviceRecord, RunResult, RunState, Status
from core.storage.store import StoredRun, SweepRecord
from core.storage.summary import CellSummary
from core.sweep.plan import expand_cells
from core.sweep.spec import load_sweep

SEEDS = Path(__file__).resolve().parent.parent / "examples" / "seeds"


def fabricated_result(
    config: RunConfig,
    throughput: float | None,
    *,
    flops_per_sample: float = 6.0e6,
    peak: float | None = None,
    tokens_per_sample: int | None = None,
) -> RunResult:
    """One repeat of ``config``: ``throughput`` samples/s (None: out of memory)."""
    assert config.micro_batch_size is not None
    samples_per_update = config.samples_per_update
    devices = config.replicas * config.devices_per_replica
    result = RunResult(
        workload=config.workload,
        accelerator=config.accelerator,
        framework=config.framework.value,
        config=config,
        samples_per_update=samples_per_update,
        samples_per_host_call=samples_per_update,
        world_size=config.replicas,
        devices=[DeviceRecord(index=index, name=f"device {index}", kind="made-up") for index in range(devices)],
        setup_seconds=0.5,
        status=Status(
            state=RunState.ok if throughput is not None else RunState.oom,
            phase=None if throughput is not None else "step",
            error_type=None if throughput is not None else "OutOfMemoryError",
        ),
        flops_per_sample=flops_per_sample,
        tokens_per_sample=tokens_per_sample,
    )
    if throughput is not None:
        result.window_steps = 10
        result.window_samples = 10 * samples_per_update
        result.window_seconds = result.window_samples / throughput
        result.throughput_per_second = throughput
        result.flops_per_second = flops_per_sample * throughput
        if peak is not None:
            result.peak_flops_per_second = peak
            result.model_flops_utilization = result.flops_per_second / peak
        result.energy_unavailable_reason = "fabricated"
    return result


def seed_cells(
    name: str,
    throughput_of: Callable[[RunConfig], float | None],
    keep: Callable[[dict[str, Any]], bool] = lambda options: True,
    **figures: Any,
) -> tuple[list[CellSummary], SweepRecord]:
    """The cells of ``examples/seeds/<name>.toml`` that ``keep`` keeps, with made-up results, and
    the sweep's record as ``core sweep`` stores it (the file's document, its ``[report]`` table)."""
    spec = load_sweep(SEEDS / f"{name}.toml")
    cells = []
    for position, cell in enumerate(expand_cells(spec)):
        if not keep(cell.options):
            continue
        config = make_config(**cell.options)
        result = fabricated_result(config, throughput_of(config), **figures)
        run = StoredRun(position, spec.name, cell.key, cell.label, 0, 1.0, datetime.now(timezone.utc), result)
        cells.append(CellSummary(sweep=spec.name, cell_key=cell.key, label=cell.label, runs=[run]))
    now = datetime.now(timezone.utc)
    record = SweepRecord(spec.name, None, spec.model_dump(mode="json"), [], now, now)
    return cells, record
