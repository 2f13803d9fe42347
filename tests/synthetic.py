"""Results made up for tests of the database and the reports: no run, no framework."""

from __future__ import annotations

from typing import Any

from core.base.config import make_config
from core.base.results import DeviceRecord, EnergyMeasurement, PowerTimeline, RunResult, RunState, Status

FLOPS_PER_SAMPLE = 6.0e6


def synthetic_result(
    *,
    micro_batch_size: int = 64,
    precision: str = "fp32",
    replicas: int = 1,
    accelerator: str = "cpu",
    throughput: float | None = 1000.0,
    state: str = "ok",
    message: str | None = None,
    samples_per_watt_hour: float | None = None,
    mfu: float | None = None,
    **options: Any,
) -> RunResult:
    config = make_config(
        workload="fcnn",
        accelerator=accelerator,
        micro_batch_size=micro_batch_size,
        precision=precision,
        replicas=replicas,
        steps=10,
        **options,
    )
    samples_per_update = config.samples_per_update
    result = RunResult(
        workload="fcnn",
        accelerator=accelerator,
        framework="torch",
        config=config,
        samples_per_update=samples_per_update,
        samples_per_host_call=samples_per_update,
        world_size=replicas,
        devices=[DeviceRecord(index=index, name=f"device {index}", kind=accelerator) for index in range(replicas)],
        setup_seconds=0.5,
        first_step_seconds=0.1,
        warmup_seconds=0.05,
        status=Status(
            state=RunState(state),
            phase=None if state == "ok" else "setup",
            error_type=None if state == "ok" else "RuntimeError",
            message=message,
        ),
        flops_per_sample=FLOPS_PER_SAMPLE,
        parameter_count=1_000_000,
    )
    if state == "ok" and throughput is not None:
        result.window_steps = 10
        result.window_samples = 10 * samples_per_update
        result.window_seconds = result.window_samples / throughput
        result.throughput_per_second = throughput
        result.flops_per_second = FLOPS_PER_SAMPLE * throughput
        if samples_per_watt_hour is not None:
            result.samples_per_watt_hour = samples_per_watt_hour
            result.energy_joules = result.window_samples / samples_per_watt_hour * 3600.0
            result.energy = EnergyMeasurement(
                meter="synthetic",
                method="counter",
                energy_joules=result.energy_joules,
                power_timeline=ramp_timeline(result.energy_joules, result.window_seconds),
            )
        else:
            result.energy_unavailable_reason = "no power meter in this test"
        if mfu is not None and "model_flops_utilization" in RunResult.model_fields:
            result.model_flops_utilization = mfu
    return result


def ramp_timeline(joules: float, seconds: float, spans: int = 10) -> PowerTimeline:
    """Two devices whose power rises linearly over the window, with the given total energy."""
    edges = [seconds * k / spans for k in range(spans + 1)]
    mean_watts = joules / seconds
    # Spans' means of a ramp from 0.5 to 1.5 times the mean, split 3:1 between the devices.
    shape = [0.5 + (k + 0.5) / spans for k in range(spans)]
    return PowerTimeline(
        start_seconds=edges[:-1],
        stop_seconds=edges[1:],
        watts={"gpu0": [0.75 * mean_watts * f for f in shape], "gpu1": [0.25 * mean_watts * f for f in shape]},
    )
