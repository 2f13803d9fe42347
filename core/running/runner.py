"""Runs a plan in this process: times the phases apart, reads the meter over exactly the steady
window, and assembles the result. Faults become a status; what was measured before stays.

Phases: setup (placement, data on the device), first step (compilation happens here),
warm-up, steady window. The host waits for the device only at phase boundaries.
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.base.config import LOADGEN_SCENARIOS, RunConfig
from core.base.distributed import ProcessContext
from core.base.errors import DataError, NonFiniteLossError
from core.base.peaks import MemoryBandwidth
from core.base.precision import Precision, policy_in_force
from core.base.results import DeviceRecord, EnergyMeasurement, NodeEnergy, RunResult, RunState, Status
from core.base.units import JOULES_PER_WATT_HOUR
from core.contract.accelerator import devices_used, executor_for
from core.contract.context import RunContext
from core.contract.manager import innermost_location
from core.contract.meter import PowerMeter, PowerMeterFactory, UnavailableMeter, meter_for
from core.data import loader_worker_death
from core.energy.combined import MeterSet
from core.executors.base import Executor, StepClock
from core.running.environment import collect_environment
from core.running.exchange import gather_through_files
from core.running.hostload import host_load, sample_host
from core.running.observe import Observer
from core.running.planning import RunPlan, device_covers, node_covers
from core.running.replica_plan import recomputed_forward_flops
from core.running.slurm import slurm_job
from core.running.step_progress import ReportingStepClock, StepProgress
from core.running.to_target import record_target_energy, train_to_target

# Above this share of the window spent waiting for data, the run measures storage, not the device.
DATA_BOUND_FRACTION = 0.10


def percentile(values: list[float], fraction: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * fraction
    lower = int(position)
    upper = min(lower + 1, len(ordered) - 1)
    return ordered[lower] + (ordered[upper] - ordered[lower]) * (position - lower)


_OUT_OF_MEMORY_MESSAGES = ("out of memory", "can't allocate memory", "cannot allocate memory")


def classify_fault(exc: BaseException) -> RunState:
    if isinstance(exc, NonFiniteLossError):
        return RunState.non_finite_loss
    if isinstance(exc, DataError):
        # Reading the data failed (memory exhausted while decoding a file included): an error of
        # the data, not the model's out-of-memory.
        return RunState.error
    name = type(exc).__name__.lower()
    message = str(exc).lower()
    # PyTorch's CPU allocator raises a RuntimeError "can't allocate memory" (ENOMEM), not MemoryError.
    if (
        isinstance(exc, MemoryError)
        or "outofmemory" in name
        or "resourceexhausted" in name
        or any(text in message for text in _OUT_OF_MEMORY_MESSAGES)
    ):
        return RunState.oom
    return RunState.error


def _workload_figures(plan: RunPlan, warnings: list[str]) -> tuple[int | None, float | None, dict[str, object]]:
    # The workload plugin's bookkeeping (parameter count, FLOPs, details) is not the measurement:
    # if that code raises, the run goes on without those figures and says why.
    parameters: int | None = None
    flops: float | None = None
    details: dict[str, object] = {}
    # An inference run counts forward FLOPs only: its MFU is against the work it does.
    inference = plan.config.mode == "inference"
    figures_for = plan.workload.inference_figures_for if inference else plan.workload.figures_for
    try:
        parameters, flops = figures_for(plan.workload_options, plan.config.framework)
    except Exception as exc:
        warnings.append(
            f"the workload plugin's {figures_for.__name__} raised {type(exc).__name__}: {exc} "
            f"(at {innermost_location(exc)}); no parameter count or FLOP figures"
        )
    try:
        details = dict(plan.workload.details(plan.workload_options))
    except Exception as exc:
        warnings.append(
            f"the workload plugin's details raised {type(exc).__name__}: {exc} "
            f"(at {innermost_location(exc)}); no workload details"
        )
    return parameters, flops, details


def _memory_figure(plan: RunPlan, warnings: list[str]) -> float | None:
    """Bytes moved per sample, the workload's analytical count (for the roofline); a plugin's answer
    that raises or is not a positive finite number costs that figure, not the run."""
    try:
        moved = plan.workload.memory_bytes_per_sample(plan.workload_options, plan.config)
    except Exception as exc:
        warnings.append(
            f"the workload plugin's memory_bytes_per_sample raised {type(exc).__name__}: {exc} "
            f"(at {innermost_location(exc)}); no arithmetic intensity"
        )
        return None
    if moved is None:
        return None
    if isinstance(moved, bool) or not isinstance(moved, (int, float)) or not math.isfinite(moved) or moved <= 0:
        warnings.append(f"the workload plugin's memory_bytes_per_sample gave {moved!r}, not a positive number; ignored")
        return None
    return float(moved)


def _sample_figures(plan: RunPlan, warnings: list[str]) -> tuple[str | None, int | None]:
    """(what a sample is, tokens in one sample): the units of samples/Wh and of tokens/s and tokens/Wh.

    A plugin's answer that raises or is no whole number costs the token figures, not the run."""
    unit = getattr(plan.workload, "sample_unit", None)
    try:
        tokens = plan.workload.tokens_per_sample(plan.workload_options)
    except Exception as exc:
        warnings.append(
            f"the workload plugin's tokens_per_sample raised {type(exc).__name__}: {exc} "
            f"(at {innermost_location(exc)}); no token figures"
        )
        tokens = None
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1):
        warnings.append(f"the workload plugin's tokens_per_sample gave {tokens!r}, not a whole number >= 1; ignored")
        tokens = None
    return (unit if isinstance(unit, str) and unit else None), tokens


def new_result(plan: RunPlan, world_size: int) -> RunResult:
    config = plan.config
    warnings: list[str] = list(plan.warnings)
    parameters, flops, details = _workload_figures(plan, warnings)
    sample_unit, tokens_per_sample = _sample_figures(plan, warnings)
    return RunResult.of_config(
        config,
        world_size,
        sample_unit=sample_unit,
        tokens_per_sample=tokens_per_sample,
        parameter_count=parameters,
        flops_per_sample=flops,
        memory_bytes_per_sample=_memory_figure(plan, warnings),
        workload_details=details,
        energy_unavailable_reason=plan.meter_unavailable_reason,
        warnings=warnings,
        slurm=slurm_job(),
    )


class _Phase:
    """Times one phase: the clock stops after the device has finished and every rank arrived."""

    def __init__(self, executor: Executor) -> None:
        self._executor = executor

    def run(self, steps: int, clock: StepClock | None = None) -> float:
        started = time.perf_counter()
        self._executor.run_steps(steps, clock)
        self._executor.synchronize()
        elapsed = time.perf_counter() - started
        self._executor.check_finite()
        self._executor.barrier()
        return self._executor.gather_max(elapsed)


def execute(plan: RunPlan, process: ProcessContext, observer: Observer | None = None) -> RunResult:
    """Run the plan in this process. Every rank calls it; rank 0's result is the run's.

    A fault becomes the result's status. KeyboardInterrupt (and SystemExit) propagate instead,
    after the meter and the executor are closed.

    :param observer: told of each phase's partial result, in the main process (rank 0) only.
    """
    # core's executors and workloads look the precision up by name (core.base.precision.policy_for):
    # they get planning's policy, whichever accelerator builds the executor, and however.
    with policy_in_force(plan.context(process).precision_policy):
        return _execute(plan, process, observer)


def _execute(plan: RunPlan, process: ProcessContext, observer: Observer | None) -> RunResult:
    config = plan.config
    result = new_result(plan, world_size=max(process.world_size, 1))

    def report(partial: RunResult) -> None:
        if observer is not None and process.is_main:
            observer.phase_ended(partial)

    def counted(inner: StepClock | None, phase: str, steps: int, before: int = 0) -> StepClock | None:
        """``inner`` telling the observer of the phase's steps (rank 0's; the others' as they were)."""
        if observer is None or not process.is_main or not observer.wants_steps_progress():
            return inner
        tell: Callable[[StepProgress], None] = observer.steps_progress
        return ReportingStepClock(inner, phase, steps, tell, marks_before_first_step=before)

    executor: Executor | None = None
    meter: PowerMeter | None = None  # the meter of the span config.energy_scope names
    window_meter: PowerMeter | None = None
    phase = "setup"
    try:
        context = plan.context(process)
        # The devices as the plugin names them from the configuration: the executor that opens them
        # is part of the span. Opening the meter is not (nor is it set-up's time).
        meter = _span_meter("run", plan, lambda: devices_used(plan.accelerator, context), result, process)
        started = time.perf_counter()
        executor = executor_for(plan.accelerator, plan.workload, context)
        # What the plugin found while it built the executor (planning's own are already there).
        result.warnings.extend(warning for warning in context.warnings if warning not in result.warnings)
        executor.synchronize()
        executor.barrier()
        result.setup_seconds = executor.gather_max(time.perf_counter() - started)
        result.devices = devices_used(plan.accelerator, plan.context(process))
        result.executor_details = executor.details()
        result.environment = collect_environment(
            executor.framework_version(),
            plan.accelerator.driver_versions(),
            executor.host_threads(),
            plan.packages,
        )
        report(result)

        if config.target is not None:
            phase = "training"
            _to_target(result, executor, plan, process, report)
        else:
            phase = "first_step"
            # After set-up's synchronise and barrier, as the window's meter starts after warm-up's.
            meter = _first(meter, _span_meter("steps", plan, lambda: result.devices, result, process))
            steps_started = time.perf_counter()
            result.first_step_seconds = _Phase(executor).run(1)
            # Executors that compile lazily record what compiling took (e.g. compile_seconds) here.
            result.executor_details = executor.details()
            report(result)

            phase = "warmup"
            warmup_steps = config.warmup_steps
            result.warmup_seconds = (
                _Phase(executor).run(warmup_steps, counted(None, "warmup", warmup_steps)) if warmup_steps else 0.0
            )
            report(result)

            phase = "window"
            if process.reads_node_meter:
                # Also under a longer scope, whose meter is running: the epoch estimate needs the window's.
                window_meter = _open_meters(plan, result.devices, result, process)
            meter = _first(meter, window_meter)
            host_before = sample_host()  # how busy the host was over the window: a wide spread's likely cause
            if config.scenario in LOADGEN_SCENARIOS:
                energy = _loadgen_window(result, executor, window_meter, config)
            else:
                energy = _loop_window(result, executor, window_meter, config, counted)
            result.host_load = host_load(host_before, sample_host())
            span_started = {"run": started, "steps": steps_started}.get(config.energy_scope)
            energy = _end_energy_span(result, executor, meter, span_started, energy)
            if process.meter_readers_gathered:  # every rank takes part, meter or not: the nodes are recorded
                energy = _energy_over_nodes(result, executor, process, energy)
            _record_device_figures(result, plan)
            if energy is not None:
                _record_energy(result, energy)
            _record_epoch(result, plan, executor.dataset_samples())

            for pass_phase, record in _passes_after_window(config):
                report(result)  # the window's figures, before the pass
                phase = pass_phase  # a fault in the pass is reported as the pass's
                record(result, executor)
    except BaseException as exc:
        if not isinstance(exc, Exception):
            # Ctrl-C (KeyboardInterrupt) or an exit request (SystemExit, SIGTERM under a launcher)
            # is the caller's, not a fault of the run: the finally below closes the meter and the
            # executor, then it propagates and nothing is reported.
            raise
        # A data loader worker that died is reported wherever the run was then: the data's fault.
        died = loader_worker_death(exc, config.data)
        fault = died.with_traceback(exc.__traceback__) if died is not None else exc
        result.status = Status.from_exception(classify_fault(fault), phase, fault)
        if meter is not None and result.energy is None:
            result.energy_unavailable_reason = None  # the meter was ready; the window is what failed
        result.explain_missing_energy()
    finally:
        _close_meters(meter, window_meter)
        if executor is not None:
            _close_quietly(executor.close)
    report(result)
    return result


def _to_target(
    result: RunResult, executor: Executor, plan: RunPlan, process: ProcessContext, report: Callable[[RunResult], None]
) -> None:
    """Train to ``config.target`` (core.running.to_target), the energy over its clock: the meter opens
    before the clock starts and stops when it ends; every node's where several read one."""
    meter = _open_meters(plan, result.devices, result, process) if process.reads_node_meter else None

    def joules_so_far() -> float | None:
        return _joules_so_far(meter, executor, process)

    try:
        energy = train_to_target(
            result,
            executor,
            plan.config,
            dict(plan.workload.evaluation_metrics),
            meter,
            _stopped,
            report,
            joules_so_far,
        )
    finally:
        _close_meters(meter)
    # What lazily compiling executors recorded over the clock (the first step's and first evaluation's
    # compilation, XLA's compilations per evaluation).
    result.executor_details = executor.details()
    result.warnings.extend(executor.window_warnings())
    # the meter's span: the clock's and its pauses (result.to_target's figures leave the pauses out)
    result.energy_seconds = (
        result.to_target.training_seconds + result.to_target.paused_seconds if result.to_target else None
    )
    result.energy_samples = result.to_target.samples if result.to_target else None
    if process.meter_readers_gathered:
        energy = _energy_over_nodes(result, executor, process, energy)
    if energy is not None:
        _record_energy(result, energy)
    if result.to_target is not None:
        result.warnings.extend(record_target_energy(result.to_target, result.energy_joules))


def _joules_so_far(meter: PowerMeter | None, executor: Executor, process: ProcessContext) -> float | None:
    """The run's energy since its meter started, without stopping it: this process's reading, or
    where several processes read a node's meter each, their sum (None if any could not tell). A
    meter that cannot read before it stops, or fails to, gives None: the point is left without."""
    own: float | None = None
    if meter is not None:
        try:
            own = meter.read_joules_so_far()
        except Exception:  # a failed reading costs this point's energy, not the run
            own = None
    if not process.meter_readers_gathered:
        return own
    if process.meter_per_process and process.exchange_dir is not None:
        return None  # gathered through files at the end only: no reading at each evaluation
    shares = executor.gather_objects({"reads": process.reads_node_meter, "joules": own})
    readings = [share.get("joules") for share in shares if isinstance(share, dict) and share.get("reads")]
    if not readings or any(not isinstance(joules, (int, float)) for joules in readings):
        return None
    return float(sum(readings))  # type: ignore[arg-type]


def _open_meter(factory: PowerMeterFactory, devices: list[DeviceRecord], context: RunContext) -> PowerMeter:
    try:
        return meter_for(factory, devices, context)
    except Exception as exc:  # a meter that cannot open costs its figure only
        return UnavailableMeter(factory.name, f"meter failed to open: {type(exc).__name__}: {exc}")


def _open_meters(
    plan: RunPlan, devices: list[DeviceRecord], result: RunResult, process: ProcessContext
) -> PowerMeter | None:
    """The meter this process reads over the energy's span: the device meter alone, or with the node
    meters as one :class:`MeterSet` (each node's meters once: only where one process reads a node's).
    Under ``node_meters = "auto"`` the node meters are read beside the devices, itemised, not added."""
    context = plan.context(process)
    device = None if plan.meter_factory is None else _open_meter(plan.meter_factory, devices, context)
    if not plan.node_meter_factories:
        return device
    beside = plan.config.node_meters_auto
    if process.meter_per_process:
        # Several processes of one host each read their own devices: a host's meter would count once each.
        if not beside:  # the default's are left out silently, as on a host without them
            result.warnings.append(
                "node meters are not read where each process reads its own devices' meter (poprun instances): "
                "the energy is the devices' only"
            )
        return device
    nodes = [(node_covers(factory), _open_meter(factory, devices, context)) for factory in plan.node_meter_factories]
    paired = None if device is None or plan.meter_factory is None else (device_covers(plan.meter_factory), device)
    if beside:
        return MeterSet(paired, [], plan.meter_unavailable_reason, beside=nodes)
    return MeterSet(paired, nodes, plan.meter_unavailable_reason)


def _energy_over_nodes(
    result: RunResult, executor: Executor, process: ProcessContext, energy: EnergyMeasurement | None
) -> EnergyMeasurement | None:
    """Each node's window energy (read by its local rank 0) gathered to every rank: the run's is their
    sum, each node's is kept in ``result.nodes``, and a node whose meter read nothing is named."""
    own: dict[str, object] | None = None
    if process.reads_node_meter:
        record = NodeEnergy(
            node_rank=process.node_rank,
            hostname=socket.gethostname(),
            slurm_node=os.environ.get("SLURMD_NODENAME") or None,
            energy_joules=energy.energy_joules if energy is not None else None,
            unavailable_reason=(energy.unavailable_reason if energy is not None else result.energy_unavailable_reason),
            meter=energy.meter if energy is not None else None,
            devices=len(result.devices),
        )
        own = {
            "node": record.model_dump(),
            "devices": [device.model_dump(mode="json") for device in result.devices],
            "window_energy_joules": result.window_energy_joules,  # under a longer scope: the window's own
        }
    if process.meter_per_process and process.exchange_dir is not None:
        # No host-side process group (poprun's instances): through the launch's folder.
        gathered = gather_through_files(Path(process.exchange_dir), "energy", process.rank, process.world_size, own)
    else:
        gathered = executor.gather_objects(own)
    shares = [share for share in gathered if isinstance(share, dict)]
    pairs = sorted(
        ((NodeEnergy.model_validate(share["node"]), share) for share in shares), key=lambda pair: pair[0].node_rank
    )
    nodes = [node for node, _ in pairs]
    result.nodes = nodes
    if result.config.energy_scope != "window":
        windows = [share.get("window_energy_joules") for _, share in pairs]
        complete = bool(windows) and all(isinstance(joules, (int, float)) for joules in windows)
        result.window_energy_joules = sum(windows) if complete else None  # type: ignore[arg-type]
    # Every node's devices: energy per device divides the run's energy by all of them.
    devices = []
    for node, share in pairs:
        for device in share["devices"]:
            details = {**device.get("details", {}), "node_rank": node.node_rank}
            devices.append(DeviceRecord.model_validate({**device, "details": details}))
    result.devices = devices
    if not nodes or all(node.meter is None for node in nodes):
        return energy  # no node had a meter: the run's reason stands
    missing = [node for node in nodes if node.energy_joules is None]
    meters = sorted({node.meter for node in nodes if node.meter is not None})
    unit = "instance" if process.meter_per_process else "node"
    combined = EnergyMeasurement(
        meter=", ".join(meters),
        method=energy.method if energy is not None else None,
        components_joules={
            f"{unit}{node.node_rank}": node.energy_joules for node in nodes if node.energy_joules is not None
        },
        warnings=list(energy.warnings) if energy is not None else [],
    )
    if missing:
        combined.unavailable_reason = "; ".join(
            f"{unit} {node.node_rank} ({node.hostname}): {node.unavailable_reason or 'its meter read nothing'}"
            for node in missing
        )
    else:
        combined.energy_joules = sum(node.energy_joules or 0.0 for node in nodes)
    return combined


def _loop_window(
    result: RunResult,
    executor: Executor,
    meter: PowerMeter | None,
    config: RunConfig,
    counted: Callable[[StepClock | None, str, int, int], StepClock | None] | None = None,
) -> EnergyMeasurement | None:
    """core's own steady window: ``config.steps`` steps back to back, timed at its two ends.

    :param counted: wraps the window's step clock so that it tells its progress (the start's mark, then one per step).
    """
    waited_before_window = executor.data_wait_seconds()
    steps = window_steps(config, result.warmup_seconds)
    clock: StepClock | None = executor.step_clock()
    if counted is not None:
        clock = counted(clock, "window", steps, 1)
    window_seconds, step_seconds, energy = _timed_window(executor, meter, steps, clock)
    result.warnings.extend(executor.window_warnings())
    result.data_wait_seconds = executor.data_wait_seconds() - waited_before_window
    result.data_wait_fraction = result.data_wait_seconds / window_seconds
    if result.data_wait_fraction > DATA_BOUND_FRACTION:
        result.warnings.append(
            f"data-bound: the loop waited for input data {result.data_wait_fraction:.0%} of the window; "
            "add data_workers or use faster storage to measure the accelerator"
        )
    result.window_seconds = window_seconds
    result.window_steps = steps
    result.window_updates = steps * executor.updates_per_step
    result.window_samples = result.window_updates * config.samples_per_update
    result.throughput_per_second = result.window_samples / window_seconds
    if step_seconds:
        result.step_seconds_median = percentile(step_seconds, 0.5)
        result.step_seconds_p90 = percentile(step_seconds, 0.9)
        result.step_seconds_p99 = percentile(step_seconds, 0.99)
    return energy


def _loadgen_window(
    result: RunResult, executor: Executor, meter: PowerMeter | None, config: RunConfig
) -> EnergyMeasurement | None:
    """The window under a LoadGen scenario: as long as LoadGen's settings make it, not ``steps``."""
    from core.running.loadgen.window import calibrate, loadgen_window

    rate = calibrate(executor, config)
    executor.begin_window()  # after the calibration: a recompilation it caused is not the window's
    window = loadgen_window(executor, meter, config, rate)
    result.warnings.extend(executor.window_warnings())
    executor.check_finite()
    result.loadgen = window.figures
    result.window_seconds = window.window_seconds
    result.window_steps = result.window_updates = window.infer_calls
    result.window_samples = window.samples
    result.throughput_per_second = window.samples / window.window_seconds
    if config.scenario != "offline":
        # A query's latency, issue to answer, as LoadGen measured it; offline has one query only.
        figures = window.figures
        result.step_seconds_median = figures.latency_p50_seconds
        result.step_seconds_p90 = figures.latency_p90_seconds
        result.step_seconds_p99 = figures.latency_p99_seconds
    if not window.figures.valid:
        result.warnings.append(f"LoadGen: the result is INVALID ({window.figures.invalid_reason or 'no reason given'})")
    return window.energy


def _first(*meters: PowerMeter | None) -> PowerMeter | None:
    """The first of ``meters`` that is one."""
    return next((meter for meter in meters if meter is not None), None)


def _close_meters(*meters: PowerMeter | None) -> None:
    """Close each meter once (the span's may be the window's), whatever any of them raises."""
    for meter in {id(meter): meter for meter in meters if meter is not None}.values():
        _close_quietly(meter.close)


def _span_meter(
    scope: str, plan: RunPlan, devices: Callable[[], list[DeviceRecord]], result: RunResult, process: ProcessContext
) -> PowerMeter | None:
    """The meter of a span longer than the window, opened and started, where the run's scope is
    ``scope`` and this process reads its node's meter; else None."""
    if plan.config.energy_scope != scope or not process.reads_node_meter:
        return None
    return _started(_open_meters(plan, devices(), result, process))


def _end_energy_span(
    result: RunResult,
    executor: Executor,
    meter: PowerMeter | None,
    span_started: float | None,
    window: EnergyMeasurement | None,
) -> EnergyMeasurement | None:
    """Close the span ``config.energy_scope`` names, right after the window closed (a synchronise and
    a barrier): record its length and samples, and return its energy (the window's is ``window``;
    ``span_started`` is when a longer span began)."""
    if span_started is None:
        result.energy_seconds, result.energy_samples = result.window_seconds, result.window_samples
        return window
    result.window_energy_joules = None if window is None else window.energy_joules
    energy = None if meter is None else _stopped(meter)
    result.energy_seconds = executor.gather_max(time.perf_counter() - span_started)
    window_samples = result.window_samples or 0
    per_step = window_samples // max(result.window_steps or 1, 1)
    result.energy_samples = window_samples + per_step * (1 + result.config.warmup_steps)  # first step, warm-up
    return energy


def _started(meter: PowerMeter | None) -> PowerMeter | None:
    """``meter``, started; a meter that cannot start costs its figure only."""
    if meter is None:
        return None
    try:
        meter.start()
    except Exception as exc:
        return UnavailableMeter(getattr(meter, "name", "?"), f"meter failed to start: {type(exc).__name__}: {exc}")
    return meter


def _stopped(meter: PowerMeter) -> EnergyMeasurement:
    """What ``meter`` measured since it started; a failing meter costs the energy figure, not the run."""
    try:
        return meter.stop()
    except Exception as exc:
        return EnergyMeasurement(
            meter=getattr(meter, "name", "?"), unavailable_reason=f"meter failed: {type(exc).__name__}: {exc}"
        )


def window_steps(config: RunConfig, warmup_seconds: float | None) -> int:
    """The window's steps: ``steps``, or for a window of fixed duration as many as the warm-up's pace
    fits in ``duration_seconds``, if more. Counted before the window, from a figure every rank shares
    (the warm-up's time is the slowest rank's), so every rank takes as many steps and the window reads
    no clock between steps."""
    if config.duration_seconds is None or not warmup_seconds or not config.warmup_steps:
        return config.steps
    seconds_per_step = warmup_seconds / config.warmup_steps
    return max(config.steps, math.ceil(config.duration_seconds / seconds_per_step))


def _timed_window(
    executor: Executor, meter: PowerMeter | None, steps: int, clock: StepClock | None = None
) -> tuple[float, list[float], EnergyMeasurement | None]:
    clock = clock if clock is not None else executor.step_clock()
    executor.begin_window()
    # The previous phase ended with a synchronise and a barrier: the device is idle here.
    meter = _started(meter)
    started = time.perf_counter()
    clock.mark()
    executor.run_steps(steps, clock)
    executor.synchronize()
    # Every rank must be done before the window (and the node's meter) closes.
    executor.barrier()
    elapsed = time.perf_counter() - started
    energy = None if meter is None else _stopped(meter)
    executor.check_finite()
    step_seconds = clock.intervals_seconds()
    return executor.gather_max(elapsed), step_seconds, energy


def _passes_after_window(config: RunConfig) -> list[tuple[str, Callable[[RunResult, Executor], None]]]:
    """What runs after the window, outside it, each its own phase: the profiled update, the accuracy pass."""
    passes: list[tuple[str, Callable[[RunResult, Executor], None]]] = []
    if config.profile_communication:
        passes.append(("communication", _record_communication))
    if config.accuracy:
        passes.append(("accuracy", _record_accuracy))
    return passes


def _record_communication(result: RunResult, executor: Executor) -> None:
    """One more update under the profiler, after the window and its energy (outside both): each
    process's time in collectives, gathered; the result's figures are their mean."""
    profile = executor.profile_communication()
    profiles = executor.gather_objects(profile)  # every process takes part, profiled or not
    if profile is None or any(not isinstance(each, dict) for each in profiles):
        result.warnings.append("communication: this executor does not profile its collectives; none recorded")
        return
    measured = [each for each in profiles if isinstance(each, dict)]
    result.communication_seconds_per_update = sum(each["communication_seconds"] for each in measured) / len(measured)
    result.communication_fraction = sum(each["fraction"] for each in measured) / len(measured)
    result.executor_details["communication"] = {"per_rank": measured, "source": measured[0]["source"]}


def _record_accuracy(result: RunResult, executor: Executor) -> None:
    """Top-1 over the labelled dataset, after the window (outside it): a figure apart from the timing."""
    counts = executor.top1_counts()
    if counts is None:
        result.warnings.append("accuracy: this executor does not measure top-1 accuracy; none recorded")
        return
    correct, samples = counts
    if samples:
        result.accuracy_samples = samples
        result.top1_accuracy = correct / samples


def _record_epoch(result: RunResult, plan: RunPlan, dataset_samples: int | None) -> None:
    """Estimates of one epoch's time and energy, as the run's epoch_definition defines an epoch,
    extrapolated from the steady window's pace and the energy's span (no epoch is run)."""
    epoch = plan.config.epoch
    if epoch.kind == "dataset" and plan.config.mode == "inference":
        # Inference goes over the evaluation split (the folder read, or the workload's), not training's.
        dataset_samples = dataset_samples or plan.workload.evaluation_samples(plan.workload_options)
    elif epoch.kind == "dataset":
        dataset_samples = dataset_samples or plan.workload.samples_per_epoch(plan.workload_options)
    samples = epoch.samples(dataset_samples, result.samples_per_update, result.samples_per_host_call)
    if not samples or not result.throughput_per_second:
        return
    result.samples_per_epoch = samples
    result.epoch_seconds = samples / result.throughput_per_second
    if result.energy_joules is None or not result.energy_samples or not result.window_samples:
        return
    if plan.config.energy_scope == "window":
        result.energy_joules_per_epoch = result.energy_joules / result.window_samples * samples
    elif result.window_energy_joules is not None:
        # The span once (set-up, compilation, warm-up), then the epoch's samples beyond it at the
        # window's energy per sample: a run of exactly one epoch is that epoch's measured energy.
        beyond = samples - result.energy_samples
        result.energy_joules_per_epoch = (
            result.energy_joules + beyond * result.window_energy_joules / result.window_samples
        )


def _record_device_figures(result: RunResult, plan: RunPlan) -> None:
    """FLOP/s and MFU where the window's throughput and the FLOPs are known; the memory bandwidth."""
    if result.flops_per_sample is not None and result.throughput_per_second is not None:
        result.flops_per_second = result.flops_per_sample * result.throughput_per_second
        _record_hardware_flops(result, plan)
        _record_utilization(result, plan)
    _record_bandwidth(result, plan)


def _record_utilization(result: RunResult, plan: RunPlan) -> None:
    """MFU against the summed datasheet peaks of the devices used, where every one is known."""
    # A policy may be measured against another precision's peak ("default": fp32's).
    policy = plan.precision_policy
    measured_against = Precision(policy.peak_precision or plan.config.precision) if policy else plan.config.precision
    peaks = _device_figures(result, plan, "peak_flops_per_second", _is_peak, measured_against)
    if not peaks or result.flops_per_second is None:
        return
    result.peak_flops_per_second = sum(peak[0] for peak in peaks)
    result.peak_flops_source = "; ".join(sorted({peak[1] for peak in peaks}))
    result.model_flops_utilization = result.flops_per_second / result.peak_flops_per_second
    if result.hardware_flops_per_sample is not None and result.throughput_per_second is not None:
        hardware_flops_per_second = result.hardware_flops_per_sample * result.throughput_per_second
        result.hardware_flops_utilization = hardware_flops_per_second / result.peak_flops_per_second


def _record_hardware_flops(result: RunResult, plan: RunPlan) -> None:
    """With activation recomputation, the FLOPs the devices compute: the model's and the recomputed
    forward (core.running.replica_plan.recomputed_forward_flops), where the workload gives its
    transformer shape; a workload plugin that raises leaves the figure out and says why."""
    config = plan.config
    if config.recompute == "none" or config.mode != "train" or result.flops_per_sample is None:
        return
    try:
        shape = plan.workload.transformer_shape(plan.workload_options)
    except Exception as exc:
        result.warnings.append(
            f"the workload plugin's transformer_shape raised {type(exc).__name__}: {exc}; no hardware FLOPs "
            "with recomputation"
        )
        return
    if shape is not None:
        result.hardware_flops_per_sample = result.flops_per_sample + recomputed_forward_flops(shape, config.recompute)


def _record_bandwidth(result: RunResult, plan: RunPlan) -> None:
    """The summed datasheet memory bandwidths of the devices used (the roofline's slope), where
    every one is known; with the peaks, a report places the run on its device's roofline."""
    known = _device_figures(result, plan, "memory_bandwidth", _is_bandwidth)
    if not known:
        return
    result.memory_bandwidth_bytes_per_second = sum(bandwidth.bytes_per_second for bandwidth in known)
    result.memory_bandwidth_source = "; ".join(sorted({bandwidth.source for bandwidth in known}))
    result.memory_kind = ", ".join(sorted({bandwidth.memory for bandwidth in known}))
    caches = set.intersection(*(set(bandwidth.caches_bytes_per_second) for bandwidth in known))
    result.cache_bandwidths_bytes_per_second = {
        cache: sum(bandwidth.caches_bytes_per_second[cache] for bandwidth in known) for cache in sorted(caches)
    }


def _device_figures(
    result: RunResult, plan: RunPlan, method: str, valid: Callable[[Any], bool], *args: Any
) -> list[Any]:
    """The accelerator's ``method(device, *args)`` for every device the run used, or [] where one is
    unknown (None). A peak table's bug (it raises, or answers something that is no figure: a bare
    number, zero, NaN) costs these figures with a warning saying so, never the measured run."""
    try:
        figures = [getattr(plan.accelerator, method)(device, *args) for device in result.devices]
    except Exception as exc:
        result.warnings.append(
            f"the accelerator's {method} raised {type(exc).__name__}: {exc} (at {innermost_location(exc)}); "
            "the run has no such figure"
        )
        return []
    if any(figure is None for figure in figures):
        return []
    invalid = [figure for figure in figures if not valid(figure)]
    if invalid:
        result.warnings.append(
            f"the accelerator's {method} answered {invalid[0]!r}, which is no datasheet figure; the run has none"
        )
        return []
    return figures


def _is_peak(peak: Any) -> bool:
    """(FLOP/s, source): a finite positive number and a text."""
    return isinstance(peak, tuple) and len(peak) == 2 and _positive(peak[0]) and isinstance(peak[1], str)


def _is_bandwidth(bandwidth: Any) -> bool:
    return isinstance(bandwidth, MemoryBandwidth) and _positive(bandwidth.bytes_per_second)


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _record_energy(result: RunResult, energy: EnergyMeasurement) -> None:
    result.energy = energy
    result.warnings.extend(f"energy: {warning}" for warning in energy.warnings)
    result.energy_joules = energy.energy_joules
    result.energy_unavailable_reason = energy.unavailable_reason
    if energy.energy_joules and result.energy_samples:
        result.samples_per_watt_hour = result.energy_samples / (energy.energy_joules / JOULES_PER_WATT_HOUR)


def _close_quietly(close: Callable[[], None]) -> None:
    try:
        close()
    except Exception:
        pass
