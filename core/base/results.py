"""The result of a run: a versioned JSON document with units in the field names."""

from __future__ import annotations

from datetime import datetime, timezone
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field, model_validator
from pydantic_core import PydanticCustomError

from core.base.config import RunConfig
from core.base.units import JOULES_PER_WATT_HOUR, watt_hours

# 1.1: EnergyMeasurement.power_timeline and .warnings (optional, so 1.0 documents still load).
# 1.2: Status.location and .traceback (optional).
# 1.3: RunResult.sample_unit and .tokens_per_sample (optional; a 1.2 document's tokens_per_sample is
#      read from its workload_details), config.epoch_definition (default "dataset", what 1.2 did), and
#      derived figures written beside the measured ones (Wh next to J, per device, tokens): computed
#      on read, never trusted from the document, so older documents get them too.
# 1.4: inference runs: config.mode (default "train", what every older document is), config.weights and
#      .accuracy (defaults None and false); RunResult.step_seconds_p99, .top1_accuracy and
#      .accuracy_samples (optional); the derived mode and energy_joules_per_sample (computed on read);
#      config.scenario and .loadgen (defaults "loop" and {}), RunResult.loadgen (optional);
#      config.nodes and .rendezvous (defaults 1 and None), RunResult.nodes (empty for one node).
# 1.5: RunResult.process_start (optional): a sweep's run forked from a warm parent or started as a
#      fresh interpreter, and why it was not forked.
# 1.6: the roofline's figures (optional, so older documents load without them): RunResult.
#      memory_bytes_per_sample (the workload's analytical count), .memory_bandwidth_bytes_per_second,
#      .memory_bandwidth_source, .memory_kind and .cache_bandwidths_bytes_per_second (summed datasheet
#      figures of the devices used); the derived arithmetic_intensity (computed on read).
# 1.7: EnergyMeasurement.meters (empty by default): each meter of a run that read node meters beside its
#      device meter (RunConfig.node_meters), what it includes and whether it is in the total.
# 1.8: energy scopes: config.energy_scope (default "window", what every older run measured) and
#      config.duration_seconds (default None); RunResult.energy_seconds and .energy_samples, the span the
#      energy covers and the samples in it (an older document's are its window's, filled in on read), and
#      .window_energy_joules (the window's own energy under a longer scope).
# 1.9: node_meters "auto" is the default: the host's CPU and DRAM meters (RAPL) read beside the device meter,
#      itemised in EnergyMeasurement.meters with counted false and MeterEnergy.note (optional), not added;
#      an older document's config without node_meters read none ("", filled in on read).
# 1.10: RunResult.host_load (optional, so older documents load without it): the host's load average at the
#       window's start and end, its CPU count and the CPU time stolen by a hypervisor over the window.
# 1.11: RunResult.slurm (optional, so older documents load without it): the Slurm job a run ran in (job
#       id, array job and task, node list, partition); a multi-node run records its nodes (RunResult.nodes,
#       with host names) with no meter too.
# 1.12: training to a target quality (RunConfig.target): RunResult.to_target (optional, so older
#       documents load without it) with the quality curve, time, energy, epochs and samples to the
#       target; RunState.target_not_reached for a run that ended without reaching it.
# 1.13: TargetOutcome.epoch_seconds and epoch_samples (defaults: none, so 1.12 documents load
#       without them): each whole epoch's training time on the clock, evaluations taken out (ACES's
#       first-epoch and per-epoch times from real epochs); TargetOutcome.paused_seconds and
#       .paused_joules (defaults 0 and None): the partial reports the clock leaves out.
# 1.14: RunResult.hardware_flops_per_sample and .hardware_flops_utilization (optional, None by default, so
#       older documents load without them): with activation recomputation (config.recompute), the FLOPs
#       the devices compute with the recomputed forward counted (Megatron's "TFLOPs/GPU"), beside the
#       model's FLOPs (flops_per_sample, model_flops_utilization), which recomputation does not change.
# 1.15: RunResult.communication_seconds_per_update and .communication_fraction (optional, None by
#       default, so older documents load without them): with config.profile_communication, the time
#       an update profiled after the window spends in collectives, as PyTorch's profiler attributes it.
SCHEMA_VERSION = "1.15"
# The error type of a document written by a newer core: ResultStore skips such a row with a warning.
NEWER_SCHEMA_ERROR = "newer_schema"
# A traceback kept in a result is cut to its end (where it broke) so a deep recursion stays small.
_TRACEBACK_CHARS = 20_000


class RunState(str, Enum):
    ok = "ok"
    error = "error"
    oom = "oom"
    non_finite_loss = "non_finite_loss"
    killed = "killed"
    timeout = "timeout"  # a sweep cell that ran past its time limit and was stopped
    # A run trained to a target quality that ended (its epoch or time budget spent) without reaching
    # it: a measured outcome, everything kept, not a fault of the machinery (a sweep does not retry it).
    target_not_reached = "target_not_reached"


class Status(BaseModel):
    """ok, or what went wrong and in which phase; measurements taken before a fault are kept."""

    model_config = ConfigDict(extra="forbid")

    state: RunState = RunState.ok
    phase: str | None = Field(default=None, description="phase in which the fault happened")
    error_type: str | None = None
    message: str | None = None
    location: str | None = Field(default=None, description="'file.py:42 in function' of the frame that raised")
    traceback: str | None = Field(default=None, description="the whole traceback (`core --debug run` prints it)")

    @property
    def ok(self) -> bool:
        return self.state is RunState.ok

    @classmethod
    def from_exception(cls, state: RunState, phase: str | None, error: BaseException) -> Status:
        """A fault's status, naming where it was raised (the innermost frame: often plugin code)."""
        import traceback as tracebacks

        frames = tracebacks.extract_tb(error.__traceback__)
        location = f"{frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}" if frames else None
        text = "".join(tracebacks.format_exception(type(error), error, error.__traceback__))
        return cls(
            state=state,
            phase=phase,
            error_type=type(error).__name__,
            message=str(error) or repr(error),
            location=location,
            traceback=text[-_TRACEBACK_CHARS:],
        )


class DeviceRecord(BaseModel):
    """One device a run used, as the accelerator plugin describes it."""

    model_config = ConfigDict(extra="forbid")

    index: int
    name: str
    kind: str = Field(description="accelerator name, e.g. 'cpu'")
    memory_bytes: int | None = None
    details: dict[str, Any] = Field(default_factory=dict)


class PowerTimeline(BaseModel):
    """Mean power per component over consecutive spans of the window, in seconds from its start.

    The spans tile the sampled window; watts x (stop - start) summed over the spans is the sampled
    integral. None: the component had no valid reading in that span. Long windows are merged to a
    bounded number of spans (config ``power_timeline_points``), each the mean over its span."""

    model_config = ConfigDict(extra="forbid")

    start_seconds: list[float]
    stop_seconds: list[float]
    watts: dict[str, list[float | None]] = Field(description="per component, one value per span")


def _without_derived(model: type[BaseModel], data: Any) -> Any:
    """``data`` less the figures ``model`` computes: a document carries them for its readers, and
    reading it back recomputes them from what was measured (they cannot disagree)."""
    if isinstance(data, dict) and any(name in data for name in model.model_computed_fields):
        return {name: value for name, value in data.items() if name not in model.model_computed_fields}
    return data


def schema_version_number(version: str) -> tuple[int, int] | None:
    """``"1.6"`` as (1, 6), so that 1.10 sorts after 1.9; None for anything but MAJOR.MINOR."""
    major, dot, minor = version.partition(".")
    if not (dot and major.isdigit() and minor.isdigit() and major.isascii() and minor.isascii()):
        return None
    return int(major), int(minor)


def _check_schema_version(data: Any) -> None:
    """Refuse a document this core cannot know the layout of: written by a newer core (whose new
    fields would be dropped or misread), or with a version that is no version at all."""
    version = data.get("schema_version") if isinstance(data, dict) else None
    if not isinstance(version, str):
        return  # absent: the current layout; not text: the field's own type check says so
    number = schema_version_number(version)
    if number is None:
        raise PydanticCustomError(
            "schema_version",
            "schema_version {version} is no layout version (MAJOR.MINOR, this core writes {ours})",
            {"version": repr(version[:40]), "ours": SCHEMA_VERSION},
        )
    ours = schema_version_number(SCHEMA_VERSION)
    if ours is not None and number > ours:
        raise PydanticCustomError(
            NEWER_SCHEMA_ERROR,
            "written by a newer core: result schema {version}, this core reads up to {ours}; upgrade core to read it",
            {"version": version, "ours": SCHEMA_VERSION},
        )


def _divided(value: float | None, by: float | None) -> float | None:
    return None if value is None or not by else value / by


def _times(value: float | None, factor: int) -> float | None:
    return None if value is None else value * factor


class MeterEnergy(BaseModel):
    """One meter's reading of the window, as an item of a run's energy (device meter and node meters)."""

    model_config = ConfigDict(extra="forbid")

    meter: str
    role: Literal["device", "node"] = Field(description="'device': the run's device meter; 'node': a node meter")
    includes: list[str] = Field(description="what its figure covers: 'devices', 'cpu', 'dram', 'fans', ...")
    counted: bool = Field(
        description="added into the run's energy_joules; false where a node meter including it counts it, or "
        "where it was read beside the devices (node_meters 'auto', see note)"
    )
    method: str | None = None
    energy_joules: float | None = None
    unavailable_reason: str | None = None
    components_joules: dict[str, float] = Field(default_factory=dict)
    note: str | None = Field(
        default=None,
        description="why it is not counted where that is not a node meter's holding it: read beside the "
        "devices (node_meters 'auto'), itemised only",
    )


class EnergyMeasurement(BaseModel):
    """Energy over exactly the steady window, or why there is none."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _derived_are_recomputed(cls, data: Any) -> Any:
        return _without_derived(cls, data)

    meter: str
    method: str | None = Field(
        default=None, description="'counter' (hardware accumulator) or 'sampled' (integrated power)"
    )
    energy_joules: float | None = None
    unavailable_reason: str | None = None
    components_joules: dict[str, float] = Field(
        default_factory=dict, description="per device or per zone, e.g. {'package-0': 12.1, 'package-0/dram': 1.3}"
    )
    mean_power_watts: float | None = None
    details: dict[str, Any] = Field(default_factory=dict)
    power_timeline: PowerTimeline | None = Field(
        default=None, description="sampled power over the window, where the meter samples power"
    )
    warnings: list[str] = Field(
        default_factory=list,
        description="what makes this figure less certain; the runner copies them into the result's warnings",
    )
    meters: list[MeterEnergy] = Field(
        default_factory=list,
        description="a run with node meters: each meter's figure, itemised; energy_joules is the sum of those "
        "counted (empty for a run read by one meter)",
    )

    @computed_field  # type: ignore[prop-decorator]
    @property
    def energy_watt_hours(self) -> float | None:
        """``energy_joules`` in Wh."""
        return watt_hours(self.energy_joules)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def components_watt_hours(self) -> dict[str, float]:
        """``components_joules`` in Wh: per device (``gpu0``, ``ipu3``) or per zone (``package-0``)."""
        return {name: joules / JOULES_PER_WATT_HOUR for name, joules in self.components_joules.items()}


class EnvironmentInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hostname: str
    platform: str
    python_version: str
    core_version: str
    framework_version: str | None = None
    library_versions: dict[str, str] = Field(default_factory=dict)
    driver_versions: dict[str, str] = Field(default_factory=dict)
    processor: str | None = None
    host_threads: dict[str, int] = Field(default_factory=dict, description="thread settings in force, e.g. intra_op")


class NodeEnergy(BaseModel):
    """One node of a multi-node run (or one poprun instance): its host and what its meter read."""

    model_config = ConfigDict(extra="forbid")

    node_rank: int
    hostname: str
    #: the node's name in Slurm (SLURMD_NODENAME) where the run was a Slurm job's: it tells apart
    #: nodes that share a host name (several slurmd on one host) and is what squeue and sacct show
    slurm_node: str | None = None
    energy_joules: float | None = None
    unavailable_reason: str | None = None
    meter: str | None = None
    devices: int = Field(default=0, description="devices of the run on this node (or instance)")


class QualityPoint(BaseModel):
    """One evaluation of a run trained to a target: how far training had gone and what it measured."""

    model_config = ConfigDict(extra="forbid")

    epoch: float = Field(ge=0, description="epochs trained when evaluated: samples / samples_per_epoch")
    samples: int = Field(ge=0, description="training samples processed since the clock started, every replica's")
    seconds: float = Field(
        ge=0, description="since the clock started (the first training step), evaluations before this one included"
    )
    joules: float | None = Field(
        default=None, description="energy since the clock started, every device; None without a meter"
    )
    value: float = Field(description="the target's metric at this evaluation")
    metrics: dict[str, float] = Field(
        default_factory=dict, description="every metric the evaluation produced ('top1', 'loss', a workload's own)"
    )
    evaluation_seconds: float = Field(ge=0, description="this evaluation's own time, inside `seconds`")


class TargetOutcome(BaseModel):
    """A training run to a target quality, as MLPerf Training times it: the clock starts at the first
    training step after initialisation (set-up, reported apart) and runs, evaluations included, to
    the first evaluation that meets the target, or to the run's budget."""

    model_config = ConfigDict(extra="forbid")

    metric: str = Field(description="what the target is of: 'top1', 'loss', or a workload's own metric")
    target: float = Field(description="the value to reach")
    higher_is_better: bool = Field(description="true: reached at value >= target; false: at value <= target")
    reached: bool
    stopped_by: Literal["target", "max_epochs", "max_seconds"] = Field(description="what ended training")
    time_to_target_seconds: float | None = Field(
        default=None, description="clock seconds at the first evaluation that met the target; None if not reached"
    )
    energy_to_target_joules: float | None = Field(
        default=None,
        description="energy from the clock's start to that evaluation's end; None if not reached or no meter",
    )
    epochs_to_target: float | None = None
    samples_to_target: int | None = None
    initialization_seconds: float | None = Field(
        default=None, description="before the clock: building the model, placing it and the data (MLPerf's init)"
    )
    training_seconds: float = Field(ge=0, description="clock seconds in all, to the end of training")
    training_joules: float | None = Field(
        default=None, description="energy over training_seconds; None without a meter"
    )
    evaluation_seconds: float = Field(ge=0, description="every evaluation's time, inside training_seconds")
    paused_seconds: float = Field(
        default=0.0,
        ge=0,
        description="time the clock left out after the evaluations that did not end training: the partial "
        "result told to the run's observers (written where a run keeps one), every process waiting for it",
    )
    paused_joules: float | None = Field(
        default=None,
        description="the meter's energy over those pauses, taken out of training_joules and the curve's; None "
        "without pauses or a meter, or where the meter cannot read before it stops (then they are left in, said "
        "in the result's warnings)",
    )
    epochs: float = Field(ge=0, description="epochs trained in all")
    samples: int = Field(ge=0, description="training samples processed in all")
    curve: list[QualityPoint] = Field(default_factory=list, description="every evaluation, in order")
    epoch_seconds: list[float] = Field(
        default_factory=list,
        description="each whole epoch's training time on the clock, in order, the evaluations inside it taken "
        "out; the first holds the first step (its compilation). Empty in documents before schema 1.13",
    )
    epoch_samples: int | None = Field(
        default=None,
        ge=0,
        description="training samples in one whole epoch: its global batches, the last partial one dropped",
    )


class SlurmJob(BaseModel):
    """The Slurm job a run ran in, as Slurm's environment told the run's main process."""

    model_config = ConfigDict(extra="forbid")

    job_id: str = Field(description="SLURM_JOB_ID: the job's own id (an array task's too)")
    array_job_id: str | None = Field(default=None, description="SLURM_ARRAY_JOB_ID: the array the job is a task of")
    array_task_id: int | None = Field(default=None, description="SLURM_ARRAY_TASK_ID: its index in that array")
    nodelist: str | None = Field(default=None, description="SLURM_JOB_NODELIST, compressed as Slurm writes it")
    partition: str | None = Field(default=None, description="SLURM_JOB_PARTITION")


class LoadGenFigures(BaseModel):
    """What MLPerf LoadGen said of an inference run under one of its scenarios, from its own logs."""

    model_config = ConfigDict(extra="forbid")

    scenario: str
    valid: bool = Field(description="LoadGen's verdict ('Result is : VALID')")
    invalid_reason: str | None = None
    samples_per_second: float | None = Field(
        default=None,
        description="LoadGen's throughput: offline 'samples per second', server 'completed samples per second', "
        "single-stream 'QPS with loadgen overhead'",
    )
    query_count: int | None = None
    latency_p50_seconds: float | None = None
    latency_p90_seconds: float | None = None
    latency_p95_seconds: float | None = None
    latency_p99_seconds: float | None = None
    latency_mean_seconds: float | None = None
    early_stopping_latency_seconds: float | None = Field(
        default=None, description="single-stream: LoadGen's early-stopping estimate of the target percentile"
    )
    settings: dict[str, Any] = Field(default_factory=dict, description="the LoadGen settings the run used")
    loadgen_version: str | None = None
    errors: list[str] = Field(default_factory=list, description="errors LoadGen logged")
    summary_text: str = Field(default="", description="mlperf_log_summary.txt, verbatim")


class ProcessStart(BaseModel):
    """How a sweep started a run's process (core.sweep.repeat): forked from a warm parent that had
    imported core and the framework already, or a fresh interpreter, with the reason it was not forked."""

    model_config = ConfigDict(extra="forbid")

    method: Literal["forked", "fresh"]
    reason: str | None = Field(default=None, description="why a fresh interpreter, when the sweep asked for warm")


# Above this share of the CPU time going to other guests (steal), the host was busy: the window's
# timings include waits for a CPU the hypervisor lent elsewhere.
STEAL_BUSY_FRACTION = 0.02


class HostLoad(BaseModel):
    """How busy the host was during the timed window, as /proc reads it (Linux; None elsewhere):
    other work competing for the CPUs widens the spread of a cell's repeats."""

    model_config = ConfigDict(extra="forbid")

    cpu_count: int | None = Field(default=None, ge=1, description="the host's logical CPUs (os.cpu_count)")
    load_average_start: float | None = Field(
        default=None, ge=0, description="the 1-minute load average at the window's start (/proc/loadavg)"
    )
    load_average_end: float | None = Field(default=None, ge=0, description="the same at the window's end")
    steal_fraction: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="share of all CPU time over the window that a hypervisor gave to others (/proc/stat steal)",
    )

    @property
    def load_average(self) -> float | None:
        """The higher of the two readings: the window was at least this busy at one end."""
        readings = [value for value in (self.load_average_start, self.load_average_end) if value is not None]
        return max(readings) if readings else None

    @property
    def overloaded(self) -> bool:
        """More runnable tasks than CPUs: some waited for one."""
        load = self.load_average
        return load is not None and self.cpu_count is not None and load > self.cpu_count

    @property
    def stolen(self) -> bool:
        return self.steal_fraction is not None and self.steal_fraction > STEAL_BUSY_FRACTION

    @property
    def busy(self) -> bool:
        """Load above the CPU count, or steal above STEAL_BUSY_FRACTION."""
        return self.overloaded or self.stolen

    def describe(self) -> str:
        """``load 5.2 on 4 CPUs, steal 3.1 %``: what was read."""
        parts = []
        if self.load_average is not None:
            cpus = f" on {self.cpu_count} CPUs" if self.cpu_count is not None else ""
            parts.append(f"load {self.load_average:.2f}{cpus}")
        if self.steal_fraction is not None:
            parts.append(f"steal {self.steal_fraction:.1%}")
        return ", ".join(parts) or "nothing read"


class RunResult(BaseModel):
    """Everything a run measured. Fields that a fault prevented from being measured stay null."""

    model_config = ConfigDict(extra="forbid")

    schema_version: str = SCHEMA_VERSION
    workload: str
    accelerator: str
    framework: str
    config: RunConfig
    started_at: datetime = Field(default_factory=lambda: datetime.now(timezone.utc))
    status: Status = Field(default_factory=Status)

    samples_per_update: int = Field(description="global: micro-batch x gradient accumulation x replicas")
    samples_per_host_call: int = Field(description="samples_per_update x device_iterations")
    world_size: int = Field(description="processes that trained together")
    devices: list[DeviceRecord] = Field(default_factory=list)
    sample_unit: str | None = Field(
        default=None, description="what one sample is, as the workload says: 'images', 'sequences', 'samples'"
    )
    tokens_per_sample: int | None = Field(
        default=None, ge=1, description="tokens in one sample (language models: the sequence length); else null"
    )

    setup_seconds: float | None = None
    first_step_seconds: float | None = Field(default=None, description="first update, including compilation")
    warmup_seconds: float | None = None
    window_seconds: float | None = Field(default=None, description="the steady, timed window")
    window_steps: int | None = Field(default=None, description="host calls in the window")
    window_updates: int | None = Field(default=None, description="weight updates in the window")
    window_samples: int | None = None
    throughput_per_second: float | None = Field(default=None, description="window samples / window seconds")
    step_seconds_median: float | None = Field(
        default=None, description="median (p50) of the window's step times; an inference run's batch latency"
    )
    step_seconds_p90: float | None = None
    step_seconds_p99: float | None = None

    data_wait_seconds: float | None = Field(
        default=None, description="window time the loop spent waiting for input data"
    )
    data_wait_fraction: float | None = Field(default=None, description="data_wait_seconds / window_seconds")
    samples_per_epoch: int | None = Field(
        default=None,
        description="samples in one epoch as config.epoch_definition defines it ('dataset': the real "
        "dataset's training split, the workload's or the files')",
    )
    epoch_seconds: float | None = Field(
        default=None, description="estimate, extrapolated from the window: samples_per_epoch / throughput_per_second"
    )
    energy_joules_per_epoch: float | None = Field(
        default=None,
        description="estimate: with scope 'window', energy_joules / window_samples x samples_per_epoch; with "
        "scope 'steps' or 'run', the span's energy once (compilation, set-up) plus the epoch's samples beyond "
        "energy_samples at the window's energy per sample, so a run of one epoch gives that epoch's measured energy",
    )

    parameter_count: int | None = None
    flops_per_sample: float | None = Field(
        default=None,
        description="FLOPs per sample of what the run does: training (forward + backward), or forward only (inference)",
    )
    flops_per_second: float | None = Field(default=None, description="achieved: flops_per_sample x throughput")
    peak_flops_per_second: float | None = Field(
        default=None, description="sum of the datasheet peaks of the devices used, at the run's precision"
    )
    peak_flops_source: str | None = None
    model_flops_utilization: float | None = Field(default=None, description="flops_per_second / peak_flops_per_second")
    hardware_flops_per_sample: float | None = Field(
        default=None,
        description="with activation recomputation: flops_per_sample plus the forward FLOPs recomputed (every "
        "layer's under 'full', the attention scores' under 'selective'); None without recomputation, where the "
        "devices compute the model's FLOPs",
    )
    hardware_flops_utilization: float | None = Field(
        default=None,
        description="hardware_flops_per_sample x throughput / peak_flops_per_second (Megatron's TFLOPs/GPU over "
        "the peak); None without recomputation (it equals model_flops_utilization)",
    )
    communication_seconds_per_update: float | None = Field(
        default=None,
        description="with profile_communication: the seconds of one update (profiled after the window) during "
        "which a collective was in flight, the mean over the processes (executor_details['communication'] "
        "holds each process's, by collective)",
    )
    communication_fraction: float | None = Field(
        default=None,
        description="with profile_communication: communication_seconds_per_update / the profiled update's wall "
        "time, the mean over the processes",
    )
    memory_bytes_per_sample: float | None = Field(
        default=None,
        description="bytes one device moves to and from its memory per sample, the workload's analytical "
        "count where it has one (the FCNN's: docs/concepts.md#bytes-moved-per-sample)",
    )
    memory_bandwidth_bytes_per_second: float | None = Field(
        default=None, description="sum of the datasheet memory bandwidths of the devices used (the roofline's slope)"
    )
    memory_bandwidth_source: str | None = None
    memory_kind: str | None = Field(default=None, description="what the bandwidth is of: 'HBM3', 'on-chip SRAM'")
    cache_bandwidths_bytes_per_second: dict[str, float] = Field(
        default_factory=dict, description="summed datasheet cache bandwidths by cache ('L2'), where given"
    )

    energy_joules: float | None = Field(
        default=None, description="energy over the span config.energy_scope names, every device measured"
    )
    energy_seconds: float | None = Field(
        default=None,
        description="the span energy_joules covers: the window's seconds (scope 'window'), or from the first "
        "step's (scope 'steps') or set-up's (scope 'run') start to the end of the window",
    )
    energy_samples: int | None = Field(
        default=None,
        description="samples processed in that span: the window's, or with scope 'steps' or 'run' also the "
        "first step's and the warm-up's",
    )
    window_energy_joules: float | None = Field(
        default=None,
        description="with scope 'steps' or 'run': the steady window's own energy (a second meter over the window), "
        "from which the epoch estimate adds the epoch's samples beyond the span",
    )
    energy_unavailable_reason: str | None = None
    samples_per_watt_hour: float | None = Field(default=None, description="energy_samples / energy in Wh")
    energy: EnergyMeasurement | None = None

    top1_accuracy: float | None = Field(
        default=None, description="inference with accuracy=true: share of the labelled samples predicted right"
    )
    accuracy_samples: int | None = Field(default=None, description="labelled samples top1_accuracy counts")
    nodes: list[NodeEnergy] = Field(
        default_factory=list,
        description="a run over several nodes: each node's host and window energy (energy_joules is their sum, "
        "None if any node's meter failed); recorded with their hosts where no meter reads them too",
    )
    loadgen: LoadGenFigures | None = Field(
        default=None, description="an inference run under a LoadGen scenario: LoadGen's verdict and figures"
    )
    to_target: TargetOutcome | None = Field(
        default=None,
        description="a training run to a target quality (config.target): its quality curve, and time, energy, "
        "epochs and samples to the target",
    )

    environment: EnvironmentInfo | None = None
    slurm: SlurmJob | None = Field(default=None, description="the Slurm job the run ran in; None outside Slurm")
    process_start: ProcessStart | None = Field(
        default=None, description="a sweep's run: forked from a warm parent or a fresh interpreter (and why)"
    )
    host_load: HostLoad | None = Field(
        default=None, description="the host's load average and CPU steal over the timed window (Linux's /proc)"
    )
    workload_details: dict[str, Any] = Field(default_factory=dict, description="model source, hyper-parameters")
    executor_details: dict[str, Any] = Field(
        default_factory=dict, description="effective precision flags, threads, strategy"
    )
    warnings: list[str] = Field(
        default_factory=list, description="things that make the figures less clean, e.g. a recompilation in the window"
    )

    @model_validator(mode="before")
    @classmethod
    def _read_older_layouts(cls, data: Any) -> Any:
        _check_schema_version(data)
        data = _without_derived(cls, data)
        # Before 1.9 node_meters defaulted to "" (none): a config without it read none, not "auto".
        config = data.get("config") if isinstance(data, dict) else None
        if isinstance(config, dict) and "node_meters" not in config:
            data = {**data, "config": {**config, "node_meters": ""}}
        # Before 1.8 the energy was always the window's.
        if isinstance(data, dict) and data.get("energy_joules") is not None and "energy_samples" not in data:
            data = {
                **data,
                "energy_samples": data.get("window_samples"),
                "energy_seconds": data.get("window_seconds"),
            }
        # Before 1.3 a language model's tokens per sample was in its workload_details only.
        if isinstance(data, dict) and "tokens_per_sample" not in data:
            details = data.get("workload_details")
            tokens = details.get("tokens_per_sample") if isinstance(details, dict) else None
            if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 1:
                data = {**data, "tokens_per_sample": tokens}
        return data

    # --- figures derived from the measured ones: written into every document, recomputed on read ---

    @computed_field  # type: ignore[prop-decorator]
    @property
    def mode(self) -> str:
        """``config.mode``: 'train' or 'inference' (every document before 1.4 trained)."""
        return self.config.mode

    @computed_field  # type: ignore[prop-decorator]
    @property
    def arithmetic_intensity(self) -> float | None:
        """FLOPs per byte moved: ``flops_per_sample / memory_bytes_per_sample``, the roofline's x axis."""
        return _divided(self.flops_per_sample, self.memory_bytes_per_sample)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def energy_joules_per_sample(self) -> float | None:
        """The energy over the samples of its span (an inference run: joules per image, per sequence);
        a result whose span was not recorded (made by hand) is the window's where its scope is."""
        samples = self.energy_samples
        if samples is None and self.config.energy_scope == "window":
            samples = self.window_samples
        return _divided(self.energy_joules, samples)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def energy_watt_hours(self) -> float | None:
        """``energy_joules`` (over its scope's span, all devices measured) in Wh."""
        return watt_hours(self.energy_joules)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def energy_joules_per_device(self) -> float | None:
        """The energy divided evenly over the devices the run used (CARAML's Energy/GPU: scope 'run');
        the meter's own per-device figures, where it has them, are ``energy.components_joules``."""
        return _divided(self.energy_joules, len(self.devices))

    @computed_field  # type: ignore[prop-decorator]
    @property
    def energy_watt_hours_per_device(self) -> float | None:
        return watt_hours(self.energy_joules_per_device)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def energy_watt_hours_per_epoch(self) -> float | None:
        """Estimate: ``energy_joules_per_epoch`` in Wh."""
        return watt_hours(self.energy_joules_per_epoch)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def energy_joules_per_device_per_epoch(self) -> float | None:
        """Estimate: one epoch's energy divided over the devices (CARAML's Energy/Epoch/IPU)."""
        return _divided(self.energy_joules_per_epoch, len(self.devices))

    @computed_field  # type: ignore[prop-decorator]
    @property
    def energy_watt_hours_per_device_per_epoch(self) -> float | None:
        return watt_hours(self.energy_joules_per_device_per_epoch)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def first_epoch_seconds(self) -> float | None:
        """Estimate of a first epoch, compilation included (ACES Table 1's "1st epoch"): the first
        step as measured, then the epoch's other samples at the window's pace."""
        if self.samples_per_epoch is None or self.first_step_seconds is None or not self.throughput_per_second:
            return None
        rest = max(self.samples_per_epoch - self.samples_per_host_call, 0)
        return self.first_step_seconds + rest / self.throughput_per_second

    @computed_field  # type: ignore[prop-decorator]
    @property
    def first_epoch_throughput_per_second(self) -> float | None:
        """Estimate: ``samples_per_epoch / first_epoch_seconds``, the throughput of a first epoch."""
        return _divided(
            None if self.samples_per_epoch is None else float(self.samples_per_epoch), self.first_epoch_seconds
        )

    @computed_field  # type: ignore[prop-decorator]
    @property
    def tokens_per_second(self) -> float | None:
        """``throughput_per_second`` (sequences/s) x ``tokens_per_sample``; null where a sample holds no tokens."""
        return None if self.tokens_per_sample is None else _times(self.throughput_per_second, self.tokens_per_sample)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def tokens_per_watt_hour(self) -> float | None:
        """``samples_per_watt_hour`` x ``tokens_per_sample`` (CARAML's Tokens/Energy)."""
        return None if self.tokens_per_sample is None else _times(self.samples_per_watt_hour, self.tokens_per_sample)

    @classmethod
    def of_config(cls, config: RunConfig, world_size: int, **fields: Any) -> RunResult:
        """A result with nothing measured yet: what the configuration alone says, plus ``fields``."""
        return cls(
            workload=config.workload,
            accelerator=config.accelerator,
            framework=config.framework.value,
            config=config,
            samples_per_update=config.samples_per_update,
            samples_per_host_call=config.samples_per_host_call,
            world_size=world_size,
            **fields,
        )

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)

    def explain_missing_energy(self) -> None:
        """Give a failed run without an energy figure the reason it has none, where nothing said
        one yet (a run that broke before its meter opened, a process killed or out of time)."""
        if self.status.ok or self.energy_joules is not None or self.energy_unavailable_reason:
            return
        where = f" in {self.status.phase}" if self.status.phase else ""
        self.energy_unavailable_reason = (
            f"the window did not complete ({self.status.state.value}{where}): no energy was measured"
        )
