"""GPU energy from NVML: the total-energy counter, cross-checked with sampled instantaneous power.

One meter per node (the runner gives it to local rank 0 only) reads every GPU the run uses, found
by UUID (NVML ignores CUDA_VISIBLE_DEVICES). Devices older than Volta have no counter; their
energy is the integral of sampled power, and the result says so per device.
"""

from __future__ import annotations

import importlib.util
from typing import Any, ClassVar

from core.plugin import (
    Availability,
    DeviceEnergyMeter,
    DeviceRecord,
    EnergySource,
    PowerMeter,
    PowerMeterFactory,
    RunConfig,
    RunContext,
)

from .nvml import energy_counter_joules, nvml_session, power_reader


class NvmlMeter(DeviceEnergyMeter):
    def __init__(self, devices: list[DeviceRecord], config: RunConfig) -> None:
        self._session = nvml_session()
        pynvml = self._session.__enter__()
        try:
            readings: dict[str, str] = {}
            sources = [self._source(pynvml, device, readings) for device in devices]
            super().__init__(
                "nvml",
                sources,
                config.power_sample_interval_seconds,
                sample_power=True,
                details={"power_reading": readings},
                timeline_points=config.power_timeline_points,
            )
        except BaseException:
            self._session.__exit__(None, None, None)
            raise

    @staticmethod
    def _source(pynvml: Any, device: DeviceRecord, readings: dict[str, str]) -> EnergySource:
        key = f"gpu{device.index}"
        handle = pynvml.nvmlDeviceGetHandleByUUID(device.details["uuid"])
        counter = (lambda: energy_counter_joules(pynvml, handle)) if device.details.get("energy_counter") else None
        read_power, readings[key] = power_reader(pynvml, handle)
        return EnergySource(key=key, read_counter_joules=counter, read_power_watts=read_power)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._session.__exit__(None, None, None)


class NvmlMeterFactory(PowerMeterFactory):
    name: ClassVar[str] = "nvml"
    description: ClassVar[str] = "NVIDIA GPU energy counter (Volta+) and sampled instantaneous power via NVML"

    def reads(self, accelerator_name: str) -> bool:
        return accelerator_name == "nvidia"

    def availability(self) -> Availability:
        if importlib.util.find_spec("pynvml") is None:
            return Availability.no("nvidia-ml-py is not installed (pip install 'core[nvidia]')")
        return Availability.yes()

    def meter_for(self, devices: list[DeviceRecord], context: RunContext) -> PowerMeter:
        return NvmlMeter(devices, context.config)
