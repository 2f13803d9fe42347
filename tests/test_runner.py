"""The runner's phases, timed window, meter placement and fault handling, on scripted parts."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, ClassVar

import pytest

from core import (
    Accelerator,
    Availability,
    DeviceRecord,
    EnergyMeasurement,
    Framework,
    PowerMeter,
    PowerMeterFactory,
    Precision,
    ProcessContext,
    RunConfig,
    RunState,
    Workload,
    hookimpl,
    run,
)
from core.base.errors import NonFiniteLossError
from core.executors.base import Executor, HostStepClock, StepClock
from core.testing import registered_plugins

STEP_SECONDS = 0.002


class ScriptedExecutor(Executor):
    """Sleeps a fixed time per step and logs every call; can fail at a chosen step."""

    def __init__(self, log: list[str], fail_at_step: int | None, failure: BaseException | None, samples: int) -> None:
        self.log, self.fail_at_step, self.failure = log, fail_at_step, failure
        self.steps = 0

    def step(self) -> None:
        self.steps += 1
        if self.steps == self.fail_at_step and not isinstance(self.failure, NonFiniteLossError):
            raise self.failure  # type: ignore[misc]
        time.sleep(STEP_SECONDS)
        self.log.append("step")

    def synchronize(self) -> None:
        self.log.append("sync")

    def step_clock(self) -> StepClock:
        return HostStepClock()

    def check_finite(self) -> None:
        if isinstance(self.failure, NonFiniteLossError) and self.fail_at_step and self.steps >= self.fail_at_step:
            raise self.failure

    def close(self) -> None:
        self.log.append("close")


class ScriptedAccelerator(Accelerator):
    name: ClassVar[str] = "scripted"

    def __init__(self, fail_at_step: int | None = None, failure: BaseException | None = None) -> None:
        self.log: list[str] = []
        self.fail_at_step, self.failure = fail_at_step, failure

    def availability(self) -> Availability:
        return Availability.yes()

    def precisions(self, framework: Framework) -> tuple[Precision, ...]:
        return (Precision.fp32,)

    def max_replicas(self, config: RunConfig) -> int:
        return 1

    def devices(self) -> list[DeviceRecord]:
        return [DeviceRecord(index=0, name="scripted device", kind=self.name)]

    def peak_flops_per_second(self, device: DeviceRecord, precision: Precision) -> tuple[float, str] | None:
        return (2.0e6, "scripted datasheet")

    def create_executor(self, workload: Workload, config: RunConfig, process: ProcessContext) -> Executor:
        assert config.micro_batch_size is not None
        return ScriptedExecutor(self.log, self.fail_at_step, self.failure, config.micro_batch_size)


class ScriptedWorkload(Workload):
    name: ClassVar[str] = "scripted-workload"
    default_micro_batch_size: ClassVar[int] = 8

    def flops_per_sample(self, options: Any) -> float:
        return 1000.0

    def figures_for(self, options: Any, framework: Framework) -> tuple[int | None, float | None]:
        # The figures of the framework that ran reach the result, not the reference ones.
        return (123 if framework is Framework.torch else 456), self.flops_per_sample(options)


class RecordingMeter(PowerMeter):
    name = "recording"

    def __init__(self, log: list[str], joules: float | None, fail: str | None) -> None:
        self.log, self.joules, self.fail = log, joules, fail

    def start(self) -> None:
        self.log.append("meter-start")
        if self.fail == "start":
            raise OSError("sensor went away")

    def stop(self) -> EnergyMeasurement:
        self.log.append("meter-stop")
        if self.fail == "stop":
            raise OSError("sensor went away")
        return EnergyMeasurement(meter=self.name, method="counter", energy_joules=self.joules)


class RecordingMeterFactory(PowerMeterFactory):
    name: ClassVar[str] = "recording"

    def __init__(self, log: list[str], joules: float | None = 36.0, fail: str | None = None) -> None:
        self.log, self.joules, self.fail = log, joules, fail

    def reads(self, accelerator_name: str) -> bool:
        return accelerator_name == "scripted"

    def availability(self) -> Availability:
        return Availability.yes()

    def create(self, devices: list[DeviceRecord], config: RunConfig) -> PowerMeter:
        if self.fail == "create":
            raise OSError("sensor went away")
        return RecordingMeter(self.log, self.joules, self.fail)


class MeterPlugin:
    def __init__(self, factory: PowerMeterFactory) -> None:
        self.factory = factory

    @hookimpl
    def core_register_power_meters(self, register: Callable[[PowerMeterFactory], None]) -> None:
        register(self.factory)


def test_phases_window_and_meter_placement() -> None:
    accelerator = ScriptedAccelerator()
    with registered_plugins(MeterPlugin(RecordingMeterFactory(accelerator.log))):
        result = run(ScriptedWorkload(), accelerator, steps=10, warmup_steps=2, micro_batch_size=8)
    assert result.status.ok, result.status
    log = accelerator.log
    # setup sync, 1 first step + sync, 2 warm-up steps + sync, meter on, 10 steps, sync, meter off.
    assert log == (
        ["sync", "step", "sync", "step", "step", "sync", "meter-start"]
        + ["step"] * 10
        + ["sync", "meter-stop", "close"]
    )
    assert result.window_samples == 80 and result.window_steps == 10
    assert result.throughput_per_second == pytest.approx(80 / result.window_seconds)
    assert result.window_seconds >= 10 * STEP_SECONDS
    assert result.step_seconds_median >= STEP_SECONDS * 0.9 and result.step_seconds_p90 >= result.step_seconds_median
    assert None not in (result.setup_seconds, result.first_step_seconds, result.warmup_seconds)
    assert result.flops_per_second == pytest.approx(1000.0 * result.throughput_per_second)
    assert result.peak_flops_per_second == 2.0e6 and result.peak_flops_source == "scripted datasheet"
    assert result.model_flops_utilization == pytest.approx(result.flops_per_second / 2.0e6)
    assert result.energy_joules == 36.0 and result.energy.method == "counter"
    assert result.samples_per_watt_hour == pytest.approx(80 / (36.0 / 3600))
    assert result.devices[0].name == "scripted device"
    assert result.parameter_count == 123


@pytest.mark.parametrize(
    "where,reason", [("create", "meter failed to open"), ("start", "meter failed to start"), ("stop", "meter failed")]
)
def test_a_failing_meter_costs_only_the_energy_figure(where: str, reason: str) -> None:
    accelerator = ScriptedAccelerator()
    with registered_plugins(MeterPlugin(RecordingMeterFactory(accelerator.log, fail=where))):
        result = run(ScriptedWorkload(), accelerator, steps=3, warmup_steps=0)
    assert result.status.ok, result.status
    assert result.throughput_per_second is not None
    assert result.energy_joules is None and result.samples_per_watt_hour is None
    assert f"{reason}: OSError: sensor went away" in result.energy_unavailable_reason


def test_no_meter_gives_a_reason_not_a_number() -> None:
    with registered_plugins():
        result = run(ScriptedWorkload(), ScriptedAccelerator(), steps=2, warmup_steps=0)
    assert result.energy_joules is None and result.samples_per_watt_hour is None
    assert "no available power meter reads accelerator 'scripted'" in result.energy_unavailable_reason


@pytest.mark.parametrize(
    "failure,step,state,phase",
    [
        (MemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), 3, RunState.oom, "warmup"),
        (RuntimeError("HIP error: out of memory"), 1, RunState.oom, "first_step"),
        (NonFiniteLossError("loss is nan"), 5, RunState.non_finite_loss, "window"),
        (ValueError("shapes do not match"), 6, RunState.error, "window"),
    ],
)
def test_faults_are_reported_and_earlier_figures_kept(
    failure: BaseException, step: int, state: RunState, phase: str
) -> None:
    accelerator = ScriptedAccelerator(fail_at_step=step, failure=failure)
    with registered_plugins(MeterPlugin(RecordingMeterFactory(accelerator.log))):
        result = run(ScriptedWorkload(), accelerator, steps=4, warmup_steps=2)
    assert result.status.state is state and result.status.phase == phase
    assert result.status.error_type == type(failure).__name__ and str(failure) in result.status.message
    assert result.setup_seconds is not None
    if phase == "window":
        assert result.warmup_seconds is not None and result.throughput_per_second is None
        assert result.energy_joules is None and "did not complete" in result.energy_unavailable_reason
    assert accelerator.log[-1] == "close"


def test_a_nan_loss_in_a_real_torch_run_is_reported() -> None:
    from core.testing import TINY_FCNN
    from core_plugins.cpu.accelerator import CpuAccelerator

    class HugeLearningRate(Workload):
        """FCNN whose optimizer diverges at once."""

        name: ClassVar[str] = "diverging-fcnn"
        options_model = __import__("core.workloads.fcnn", fromlist=["FcnnOptions"]).FcnnOptions

        def build_torch(self, options: Any, seed: int) -> Any:
            import torch

            from core.workloads.fcnn import Fcnn

            spec = Fcnn().build_torch(options, seed)
            spec.inputs = spec.inputs * 1e30
            spec.make_optimizer = lambda params: torch.optim.SGD(params, lr=1e30)
            return spec

    with registered_plugins():
        result = run(
            HugeLearningRate(),
            CpuAccelerator(),
            micro_batch_size=4,
            steps=2,
            warmup_steps=1,
            power_meter="none",
            workload_options=TINY_FCNN,
        )
    assert result.status.state is RunState.non_finite_loss
    assert result.setup_seconds is not None


class Observer:
    def __init__(self) -> None:
        self.events: list[Any] = []

    @hookimpl
    def core_run_started(self, config: RunConfig) -> None:
        self.events.append(("started", config.workload))

    @hookimpl
    def core_result_ready(self, result: Any) -> None:
        self.events.append(("ready", result.status.state))


def test_observers_see_the_start_and_the_result() -> None:
    observer = Observer()
    with registered_plugins(observer):
        run(ScriptedWorkload(), ScriptedAccelerator(), steps=2, warmup_steps=0)
    assert observer.events == [("started", "scripted-workload"), ("ready", RunState.ok)]


def test_replicas_as_processes_need_registered_plugins() -> None:
    from core import ConfigError
    from core_plugins.cpu.accelerator import CpuAccelerator

    with registered_plugins():
        with pytest.raises(ConfigError) as caught:
            run("fcnn", CpuAccelerator(), replicas=2)  # a new object, not the registered one
    assert caught.value.field == "replicas" and "registered through a plugin" in caught.value.allowed


# --- energy in the papers' units: epochs as the run defines them, tokens -------------------------


class ScriptedLanguageWorkload(ScriptedWorkload):
    """A sample of 128 tokens, from a dataset of 10,000 sequences."""

    name: ClassVar[str] = "scripted-language"
    sample_unit: ClassVar[str] = "sequences"

    def samples_per_epoch(self, options: Any) -> int:
        return 10_000

    def tokens_per_sample(self, options: Any) -> int:
        return 128


@pytest.mark.parametrize(
    "definition,samples",
    [
        ("dataset", 10_000),  # the workload's dataset: what core did before definitions existed
        ("samples:1281167", 1_281_167),  # CARAML's ImageNet epoch
        ("samples:1000000", 1_000_000),  # CARAML's "1 Epoch: 10^6 images"
        ("global-batches:4", 4 * 8 * 2),  # CARAML's IPU GPT: 4 x (micro 8 x accumulation 2)
        ("host-calls:3", 3 * 8 * 2),
    ],
)
def test_the_epoch_is_the_one_the_run_defines(definition: str, samples: int) -> None:
    accelerator = ScriptedAccelerator()
    with registered_plugins(MeterPlugin(RecordingMeterFactory(accelerator.log, joules=36.0))):
        result = run(
            ScriptedLanguageWorkload(),
            accelerator,
            steps=4,
            warmup_steps=0,
            micro_batch_size=8,
            gradient_accumulation=2,
            epoch_definition=definition,
        )
    assert result.status.ok, result.status
    assert result.config.epoch_definition == definition
    assert result.samples_per_epoch == samples
    assert result.epoch_seconds == pytest.approx(samples / result.throughput_per_second)
    # Extrapolated from the window: 36 J over its samples, times the epoch's samples.
    assert result.energy_joules_per_epoch == pytest.approx(36.0 / result.window_samples * samples)
    assert result.energy_watt_hours_per_epoch == pytest.approx(36.0 / result.window_samples * samples / 3600)
    assert result.energy_watt_hours_per_device_per_epoch == pytest.approx(result.energy_watt_hours_per_epoch)


def test_a_language_model_reports_tokens_per_second_and_per_wh() -> None:
    accelerator = ScriptedAccelerator()
    with registered_plugins(MeterPlugin(RecordingMeterFactory(accelerator.log, joules=36.0))):
        result = run(ScriptedLanguageWorkload(), accelerator, steps=5, warmup_steps=0, micro_batch_size=8)
    assert result.status.ok, result.status
    assert result.sample_unit == "sequences" and result.tokens_per_sample == 128
    assert result.tokens_per_second == pytest.approx(128 * result.throughput_per_second)
    assert result.samples_per_watt_hour == pytest.approx(40 / (36.0 / 3600))
    assert result.tokens_per_watt_hour == pytest.approx(128 * 40 / (36.0 / 3600))
    assert result.energy_watt_hours == pytest.approx(0.01)
    assert result.energy_watt_hours_per_device == pytest.approx(0.01)  # one scripted device


def test_a_workload_without_tokens_has_no_token_figures() -> None:
    with registered_plugins():
        result = run(ScriptedWorkload(), ScriptedAccelerator(), steps=2, warmup_steps=0)
    assert result.sample_unit == "samples" and result.tokens_per_sample is None
    assert result.tokens_per_second is None and result.tokens_per_watt_hour is None


class BrokenTokensWorkload(ScriptedWorkload):
    name: ClassVar[str] = "broken-tokens"

    def tokens_per_sample(self, options: Any) -> int:
        raise KeyError("sequence_length")


def test_a_failing_tokens_per_sample_costs_only_the_token_figures() -> None:
    with registered_plugins():
        result = run(BrokenTokensWorkload(), ScriptedAccelerator(), steps=2, warmup_steps=0)
    assert result.status.ok and result.throughput_per_second is not None
    assert result.tokens_per_sample is None
    assert any("tokens_per_sample raised KeyError" in warning for warning in result.warnings)


class BadPeakTable(ScriptedAccelerator):
    """An accelerator whose peak table has a bug: it raises, or answers something that is no figure."""

    def __init__(self, peak: Any = None, bandwidth: Any = None) -> None:
        super().__init__()
        self.peak, self.bandwidth = peak, bandwidth

    def peak_flops_per_second(self, device: DeviceRecord, precision: Precision) -> Any:
        if isinstance(self.peak, BaseException):
            raise self.peak
        return self.peak

    def memory_bandwidth(self, device: DeviceRecord) -> Any:
        if isinstance(self.bandwidth, BaseException):
            raise self.bandwidth
        return self.bandwidth


@pytest.mark.parametrize(
    "peak,bandwidth,said",
    [
        (KeyError("A100-SXM4-80GB"), None, "peak_flops_per_second raised KeyError"),
        (0.0, None, "peak_flops_per_second answered 0.0"),  # not a (figure, source) pair
        ((0.0, "a datasheet with a typo"), None, "no datasheet figure"),  # the MFU would divide by zero
        ((float("nan"), "NaN"), None, "no datasheet figure"),
        ((3e12, "datasheet"), 900e9, "memory_bandwidth answered 900000000000.0"),  # not a MemoryBandwidth
    ],
)
def test_a_broken_peak_table_costs_its_figures_not_the_measured_run(peak: Any, bandwidth: Any, said: str) -> None:
    with registered_plugins():
        result = run(ScriptedWorkload(), BadPeakTable(peak, bandwidth), steps=3, warmup_steps=0, micro_batch_size=8)
    assert result.status.ok, result.status
    assert result.throughput_per_second and result.flops_per_second  # what was measured stays
    assert any(said in warning for warning in result.warnings), result.warnings
    if "memory_bandwidth" in said:
        assert result.peak_flops_per_second == 3e12 and result.memory_bandwidth_bytes_per_second is None
    else:
        assert result.peak_flops_per_second is None and result.model_flops_utilization is None


# --- energy scopes (issue 28): the span the energy covers, chosen per run --------------------------


def test_the_default_scope_is_the_window_and_says_so() -> None:
    accelerator = ScriptedAccelerator()
    with registered_plugins(MeterPlugin(RecordingMeterFactory(accelerator.log))):
        result = run(ScriptedWorkload(), accelerator, steps=5, warmup_steps=1, micro_batch_size=8)
    assert result.status.ok, result.status
    assert result.config.energy_scope == "window"
    assert (result.energy_seconds, result.energy_samples) == (result.window_seconds, result.window_samples)
    assert result.energy_joules_per_sample == pytest.approx(36.0 / 40)


@pytest.mark.parametrize(
    "scope,before_set_up",
    [
        # CARAML wraps its whole training script in jpwr: set-up, compilation and warm-up are in.
        ("run", True),
        # CARAML's GPU ResNet-50: jpwr around tf_cnn_benchmarks' loop, warm-up in, graph building out.
        ("steps", False),
    ],
)
def test_a_longer_scope_reads_its_span_and_a_second_meter_the_window(scope: str, before_set_up: bool) -> None:
    accelerator = ScriptedAccelerator()
    with registered_plugins(MeterPlugin(RecordingMeterFactory(accelerator.log))):
        result = run(ScriptedWorkload(), accelerator, steps=10, warmup_steps=2, micro_batch_size=8, energy_scope=scope)
    assert result.status.ok, result.status
    # (span meter on,) setup sync, (span meter on,) first step + sync, 2 warm-up steps + sync, window
    # meter on, 10 steps, sync, window meter off, span meter off.
    set_up = ["meter-start", "sync"] if before_set_up else ["sync", "meter-start"]
    assert accelerator.log == (
        set_up
        + ["step", "sync", "step", "step", "sync", "meter-start"]
        + ["step"] * 10
        + ["sync", "meter-stop", "meter-stop", "close"]
    )
    assert result.energy_joules == 36.0 and result.window_energy_joules == 36.0
    assert result.energy_samples == 8 * (1 + 2 + 10) and result.window_samples == 80
    phases = result.first_step_seconds + result.warmup_seconds + result.window_seconds
    assert result.energy_seconds >= phases + (result.setup_seconds if before_set_up else 0.0)
    assert result.samples_per_watt_hour == pytest.approx(8 * 13 / (36.0 / 3600))
    assert result.energy_joules_per_sample == pytest.approx(36.0 / (8 * 13))


def test_a_run_of_one_epoch_in_the_run_scope_reports_that_epochs_measured_energy() -> None:
    # CARAML's IPU GPT: an epoch of 4 host calls, compilation included (docs/concepts.md#energy-scopes).
    accelerator = ScriptedAccelerator()
    with registered_plugins(MeterPlugin(RecordingMeterFactory(accelerator.log, joules=36.0))):
        result = run(
            ScriptedWorkload(),
            accelerator,
            steps=3,
            warmup_steps=0,
            micro_batch_size=8,
            energy_scope="run",
            epoch_definition="host-calls:4",
        )
    assert result.status.ok, result.status
    assert result.samples_per_epoch == result.energy_samples == 32
    assert result.energy_joules_per_epoch == 36.0
    assert result.energy_watt_hours_per_device_per_epoch == pytest.approx(36.0 / 3600)


class SpanThenWindowMeterFactory(RecordingMeterFactory):
    """The first meter made (the span's) reads ``span`` J, the next (the window's) ``window`` J."""

    def __init__(self, log: list[str], span: float, window: float | None) -> None:
        super().__init__(log)
        self.readings = [span, window]

    def create(self, devices: list[DeviceRecord], config: RunConfig) -> PowerMeter:
        return RecordingMeter(self.log, self.readings.pop(0), None)


@pytest.mark.parametrize("scope", ["steps", "run"])
def test_an_epoch_longer_than_the_span_adds_its_samples_at_the_windows_energy(scope: str) -> None:
    # The span's 100 J once (compilation and all), then the epoch's 48 samples beyond the span's 32
    # at the window's 36 J / 24 samples: not set-up's energy multiplied by the epoch.
    accelerator = ScriptedAccelerator()
    with registered_plugins(MeterPlugin(SpanThenWindowMeterFactory(accelerator.log, span=100.0, window=36.0))):
        result = run(
            ScriptedWorkload(),
            accelerator,
            steps=3,
            warmup_steps=0,
            micro_batch_size=8,
            energy_scope=scope,
            epoch_definition="host-calls:10",
        )
    assert result.status.ok, result.status
    assert (result.energy_joules, result.window_energy_joules, result.energy_samples) == (100.0, 36.0, 32)
    assert result.energy_joules_per_epoch == pytest.approx(100.0 + 48 * 36.0 / 24)


def test_without_the_windows_energy_a_longer_scope_gives_no_epoch_estimate() -> None:
    accelerator = ScriptedAccelerator()
    with registered_plugins(MeterPlugin(SpanThenWindowMeterFactory(accelerator.log, span=100.0, window=None))):
        result = run(
            ScriptedWorkload(),
            accelerator,
            steps=3,
            warmup_steps=0,
            energy_scope="run",
            epoch_definition="host-calls:8",
        )
    assert result.status.ok and result.energy_joules == 100.0 and result.window_energy_joules is None
    assert result.samples_per_epoch is not None and result.energy_joules_per_epoch is None


@pytest.mark.parametrize("where,reason", [("create", "meter failed to open"), ("start", "meter failed to start")])
def test_a_run_scope_meter_that_fails_costs_only_the_energy(where: str, reason: str) -> None:
    accelerator = ScriptedAccelerator()
    with registered_plugins(MeterPlugin(RecordingMeterFactory(accelerator.log, fail=where))):
        result = run(ScriptedWorkload(), accelerator, steps=3, warmup_steps=1, energy_scope="run")
    assert result.status.ok, result.status
    assert result.throughput_per_second is not None and result.energy_joules is None
    assert f"{reason}: OSError: sensor went away" in result.energy_unavailable_reason


def test_a_fault_in_set_up_stops_a_run_scope_meter_and_keeps_no_energy() -> None:
    accelerator = ScriptedAccelerator(fail_at_step=1, failure=ValueError("shapes do not match"))
    with registered_plugins(MeterPlugin(RecordingMeterFactory(accelerator.log))):
        result = run(ScriptedWorkload(), accelerator, steps=3, warmup_steps=1, energy_scope="run")
    assert (result.status.state, result.status.phase) == (RunState.error, "first_step")
    assert result.energy_joules is None and accelerator.log[0] == "meter-start"
    assert "close" in accelerator.log


def test_a_window_of_fixed_duration_is_sized_from_the_warm_ups_pace() -> None:
    from core.base.config import make_config
    from core.running.runner import window_steps

    config = make_config(workload="fcnn", accelerator="cpu", steps=20, warmup_steps=3, duration_seconds=60.0)
    assert window_steps(config, 1.5) == 120  # 0.5 s a step: 120 fit in 60 s
    assert window_steps(config, 30.0) == 20  # slower than `steps` allow: `steps` still
    assert window_steps(make_config(workload="fcnn", accelerator="cpu", steps=7), 1.5) == 7
    accelerator = ScriptedAccelerator()
    with registered_plugins(MeterPlugin(RecordingMeterFactory(accelerator.log))):
        result = run(ScriptedWorkload(), accelerator, steps=2, warmup_steps=2, duration_seconds=0.1, micro_batch_size=8)
    assert result.status.ok, result.status
    # Whatever this machine's pace, the window took the steps the warm-up's pace fits in 0.1 s.
    assert result.window_steps == window_steps(result.config, result.warmup_seconds) >= 2
    assert accelerator.log.count("step") == 1 + 2 + result.window_steps
    assert result.window_samples == 8 * result.window_steps == result.energy_samples
    assert result.throughput_per_second == pytest.approx(result.window_samples / result.window_seconds)


@pytest.mark.parametrize(
    "options,field,says",
    [
        ({"energy_scope": "job"}, "energy_scope", "'window', 'steps' or 'run'"),
        ({"energy_scope": True}, "energy_scope", "'window', 'steps' or 'run'"),
        ({"duration_seconds": 0}, "duration_seconds", "greater than 0"),
        ({"duration_seconds": "1800"}, "duration_seconds", "a number"),
        ({"duration_seconds": True}, "duration_seconds", "a number"),
        ({"duration_seconds": 60.0, "warmup_steps": 0}, "duration_seconds", "set warmup_steps to 1 or more"),
        (
            {"mode": "inference", "scenario": "offline", "energy_scope": "run"},
            "energy_scope",
            "allowed with a LoadGen scenario: 'window'",
        ),
        (
            {"mode": "inference", "scenario": "server", "duration_seconds": 60.0},
            "duration_seconds",
            "-l min_duration_seconds",
        ),
    ],
)
def test_bad_energy_scopes_and_durations_are_refused_by_name(options: dict, field: str, says: str) -> None:
    from core.base.config import make_config
    from core.base.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        make_config(workload="fcnn", accelerator="cpu", **options)
    assert caught.value.field == field and says in str(caught.value), str(caught.value)
    assert caught.value.value == options[field] and type(caught.value.value) is type(options[field])


def test_a_result_before_1_8_reads_its_window_as_the_energys_span() -> None:
    from core.base.results import RunResult

    accelerator = ScriptedAccelerator()
    with registered_plugins(MeterPlugin(RecordingMeterFactory(accelerator.log))):
        result = run(ScriptedWorkload(), accelerator, steps=4, warmup_steps=1, micro_batch_size=8)
    document = result.model_dump(mode="json")
    document["schema_version"] = "1.7"
    for field in ("energy_seconds", "energy_samples"):
        del document[field]
    del document["config"]["energy_scope"], document["config"]["duration_seconds"]
    old = RunResult.model_validate(document)
    assert old.config.energy_scope == "window"
    assert (old.energy_samples, old.energy_seconds) == (32, result.window_seconds)
    assert old.energy_joules_per_sample == pytest.approx(36.0 / 32)


def test_a_window_as_long_as_the_runs_time_limit_is_refused_before_it_runs() -> None:
    from core.base.errors import ConfigError

    accelerator = ScriptedAccelerator()
    with registered_plugins(), pytest.raises(ConfigError) as caught:
        run(ScriptedWorkload(), accelerator, duration_seconds=30.0, timeout_seconds=30)
    assert caught.value.field == "duration_seconds" and "the run's timeout_seconds (30 s)" in str(caught.value)
    assert accelerator.log == []  # nothing ran


@pytest.mark.parametrize(
    "scope,says", [("window", "over the window"), ("steps", "over every step"), ("run", "over the run (set-up")]
)
def test_core_run_says_which_span_the_energy_covers(scope: str, says: str) -> None:
    from core.cli.text import format_result

    accelerator = ScriptedAccelerator()
    with registered_plugins(MeterPlugin(RecordingMeterFactory(accelerator.log))):
        result = run(ScriptedWorkload(), accelerator, steps=3, warmup_steps=1, energy_scope=scope)
    line = next(line for line in format_result(result).splitlines() if "36 J" in line)
    assert says in line, line


def test_a_first_epochs_throughput_includes_the_first_steps_compilation() -> None:
    # ACES Table 1's "1st epoch": compilation inside the epoch, so lower than the steady throughput.
    accelerator = ScriptedAccelerator()
    with registered_plugins():
        result = run(
            ScriptedWorkload(),
            accelerator,
            steps=3,
            warmup_steps=0,
            micro_batch_size=8,
            epoch_definition="host-calls:10",
        )
    assert result.status.ok, result.status
    expected = result.first_step_seconds + (80 - 8) / result.throughput_per_second
    assert result.first_epoch_seconds == pytest.approx(expected)
    assert result.first_epoch_throughput_per_second == pytest.approx(80 / expected)
    assert result.model_dump(mode="json")["first_epoch_throughput_per_second"] == pytest.approx(80 / expected)
