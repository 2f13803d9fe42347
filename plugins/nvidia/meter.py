"""GPU energy from NVML: the total-energy counter, cross-checked with sampled instantaneous power.

One meter per node (the runner gives it to local rank 0 only) reads every GPU the run uses, found
by UUID (NVML ignores CUDA_VISIBLE_DEVICES). Devices older than Volta have no counter; their
energy is the integral of sampled power, and the result says so per device.

A MIG device has no energy or power of its own: it is read as its whole parent GPU, once however
many of the run's MIG devices share that GPU, and the result's warnings say so.
"""

from __future__ import annotations

from typing import Any, ClassVar

from core.plugin import (
    Availability,
    Clock,
    DeviceEnergyMeter,
    DeviceRecord,
    EnergyMeasurement,
    EnergySource,
    PowerMeter,
    PowerMeterFactory,
    RunConfig,
    RunContext,
)

from ..probing import SdkProbe
from . import nvml
from .accelerator import PROBE
from .nvml import energy_counter_joules, nvml_session, power_reader


class NvmlMeter(DeviceEnergyMeter):
    def __init__(self, devices: list[DeviceRecord], config: RunConfig, clock: Clock | None = None) -> None:
        self._session = nvml_session()
        pynvml = self._session.__enter__()
        try:
            readings: dict[str, str] = {}
            sources: list[EnergySource] = []
            source_of_gpu: dict[str, str] = {}  # parent GPU UUID -> the key its energy is under
            self._mig_warnings: list[str] = []
            mig_parents: dict[str, str] = {}
            for device in devices:
                key = f"gpu{device.index}"
                parent = device.details.get("mig_parent_uuid")
                gpu_uuid = parent or device.details["uuid"]
                if parent:
                    mig_parents[key] = parent
                if gpu_uuid in source_of_gpu:
                    self._mig_warnings.append(
                        f"{key}: MIG device {device.details['uuid']} is on GPU {gpu_uuid}, already measured "
                        f"as {source_of_gpu[gpu_uuid]}: its energy is counted there, once"
                    )
                    continue
                source_of_gpu[gpu_uuid] = key
                sources.append(self._source(pynvml, key, gpu_uuid, device.details.get("energy_counter"), readings))
                if parent:
                    self._mig_warnings.append(
                        f"{key}: MIG device {device.details['uuid']} has no energy reading of its own; this is "
                        f"the whole GPU {parent}, shared by every MIG instance on it (other jobs' work included)"
                    )
            details: dict[str, object] = {"power_reading": readings}
            if mig_parents:
                details["mig_parent_gpu"] = mig_parents
            super().__init__(
                "nvml",
                sources,
                config.power_sample_interval_seconds,
                sample_power=True,
                details=details,
                timeline_points=config.power_timeline_points,
                clock=clock,
            )
        except BaseException:
            self._session.__exit__(None, None, None)
            raise

    @staticmethod
    def _source(pynvml: Any, key: str, gpu_uuid: str, has_counter: Any, readings: dict[str, str]) -> EnergySource:
        handle = pynvml.nvmlDeviceGetHandleByUUID(gpu_uuid)
        counter = (lambda: energy_counter_joules(pynvml, handle)) if has_counter else None
        read_power, readings[key] = power_reader(pynvml, handle)
        return EnergySource(key=key, read_counter_joules=counter, read_power_watts=read_power)

    def stop(self) -> EnergyMeasurement:
        measurement = super().stop()
        if self._mig_warnings:
            measurement = measurement.model_copy(update={"warnings": [*measurement.warnings, *self._mig_warnings]})
        return measurement

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._session.__exit__(None, None, None)


class NvmlMeterFactory(PowerMeterFactory):
    name: ClassVar[str] = "nvml"
    description: ClassVar[str] = "NVIDIA GPU energy counter (Volta+) and sampled instantaneous power via NVML"
    accelerators: ClassVar[tuple[str, ...]] = ("nvidia",)

    def __init__(self, *, clock: Clock | None = None, probe: SdkProbe = PROBE) -> None:
        """:param clock: the meters' time (None: the real clock); a test's simulated one moves the
        simulated driver's time with it (tests/simnvml.py).
        :param probe: how to tell, without loading NVML, whether this host has the binding and an
        NVIDIA driver's device nodes (the accelerator's probe)."""
        self._clock = clock
        self.probe = probe

    def availability(self) -> Availability:
        # The binding alone is not enough: without the driver's device nodes NVML finds no GPU to
        # read, and `core plugins` would call the meter available on any host with nvidia-ml-py.
        missing = self.probe.missing()
        if missing:
            return Availability.no("; ".join(missing))
        # Device nodes are not a GPU NVML reads: a driver not loaded or of another version than
        # its library leaves them, and the meter would fail the run that chose it.
        problem = nvml.nvml_problem()
        return Availability.no(problem) if problem is not None else Availability.yes()

    def meter_for(self, devices: list[DeviceRecord], context: RunContext) -> PowerMeter:
        return NvmlMeter(devices, context.config, self._clock)
