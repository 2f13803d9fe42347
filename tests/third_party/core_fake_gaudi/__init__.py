"""core-fake-gaudi: a third party's plugin for an Intel Gaudi-like accelerator, written against
docs/hooks.md and docs/writing-a-plugin.md alone (it imports nothing from core but ``core.plugin``).

tests/test_extensions.py installs it through the ``core`` entry-point group (or registers it with
``core.testing.registered_plugins``) and exercises every extension point with it:

- the accelerator ``fake-gaudi``: core's PyTorch executor on ``hpu:N`` devices (the tests map them
  onto the CPU with ``core.testing.run_on_cpu_as("hpu")``), whose ``torch.compile`` backend is
  Gaudi's ``hpu_backend`` and which marks a step after each micro-step's backward, as Gaudi's lazy
  mode needs (``htcore.mark_step()``; here counted in :data:`EVENTS`);
- power meters: ``fake-gaudi-power`` reads the devices; ``fake-gaudi-bmc`` is a node meter whose
  figure includes the devices (the node's BMC); ``fake-gaudi-host`` is a node meter of the host's
  CPU and DRAM only. Each reads a fixed energy, so a test can check the sums exactly;
- the command ``core gaudi-info``;
- the report section "Gaudi runs".

Importing it imports no framework (``core --help`` and ``core plugins`` import it): torch only
inside ``executor_for``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from core.plugin import (
    Accelerator,
    Availability,
    Command,
    DeviceRecord,
    EnergyMeasurement,
    Framework,
    Paragraph,
    PowerMeter,
    PowerMeterFactory,
    Precision,
    RunConfig,
    RunContext,
    RunResult,
    Table,
    Value,
    Workload,
    hookimpl,
)

if TYPE_CHECKING:
    from core.plugin import Executor

#: what the plugin's hooks did, for the tests to look at
EVENTS: dict[str, int] = {"mark_step": 0, "cut_graph": 0, "model_placed": 0}

DEVICE_JOULES = 40.0
BMC_JOULES = 100.0
HOST_JOULES = 25.0


def reset_events() -> None:
    for key in EVENTS:
        EVENTS[key] = 0


# --- the accelerator --------------------------------------------------------------------------


def _gaudi_hooks() -> Any:
    # Imported here: core.plugin.TorchDeviceHooks imports torch.
    from core.plugin import TorchDeviceHooks

    class GaudiHooks(TorchDeviceHooks):
        compile_backend = "hpu_backend"
        compiler = "torch.compile (hpu_backend)"

        def after_backward(self) -> None:
            EVENTS["mark_step"] += 1  # habana_frameworks.torch.core.mark_step() on a Gaudi

        def cut_graph(self) -> None:
            EVENTS["cut_graph"] += 1  # the mark_step after the optimizer step

        def model_placed(self, model: Any) -> None:
            EVENTS["model_placed"] += 1

    return GaudiHooks()


class FakeGaudiAccelerator(Accelerator):
    name: ClassVar[str] = "fake-gaudi"
    description: ClassVar[str] = "an Intel Gaudi-like HPU (tests only)"
    frameworks: ClassVar[tuple[Framework, ...]] = (Framework.torch,)
    supports_inference: ClassVar[bool] = True

    def availability(self) -> Availability:
        return Availability.yes()  # a real plugin looks for habana_frameworks with find_spec

    def precisions(self, framework: Framework) -> tuple[Precision, ...]:
        return (Precision.fp32, Precision.bf16)

    def max_replicas(self, config: RunConfig) -> int:
        return 1

    def devices(self) -> list[DeviceRecord]:
        return [DeviceRecord(index=0, name="Gaudi 2 (fake)", kind=self.name, memory_bytes=96 << 30)]

    def executor_for(self, workload: Workload, context: RunContext) -> Executor:
        from core.plugin import TorchPlacement, torch_executor

        placement = TorchPlacement(
            device=f"hpu:{context.process.local_rank}",
            distributed_backend="hccl",
            device_timing_events=True,
            hooks=_gaudi_hooks(),
        )
        spec = workload.build_torch(context.workload_options, context.config.seed)
        return torch_executor(spec, context.config, placement, context.process)


# --- power meters ------------------------------------------------------------------------------


class FixedMeter(PowerMeter):
    """Reads a fixed energy over any window: the tests check sums, not a device."""

    def __init__(self, name: str, joules: float, components: dict[str, float] | None = None) -> None:
        self.name = name
        self._joules = joules
        self._components = components or {}

    def start(self) -> None:
        pass

    def stop(self) -> EnergyMeasurement:
        return EnergyMeasurement(
            meter=self.name, method="counter", energy_joules=self._joules, components_joules=self._components
        )


class GaudiPowerFactory(PowerMeterFactory):
    name = "fake-gaudi-power"
    description = "the HPUs' own energy counters (hl-smi)"

    def reads(self, accelerator_name: str) -> bool:
        return accelerator_name == "fake-gaudi"

    def availability(self) -> Availability:
        return Availability.yes()

    def meter_for(self, devices: list[DeviceRecord], context: RunContext) -> PowerMeter:
        return FixedMeter(self.name, DEVICE_JOULES, {f"hpu{d.index}": DEVICE_JOULES / len(devices) for d in devices})


class GaudiBmcFactory(PowerMeterFactory):
    name = "fake-gaudi-bmc"
    description = "the whole node through its BMC: HPUs, CPUs, DRAM, fans"
    node_includes = ("devices", "cpu", "dram", "fans")

    def reads(self, accelerator_name: str) -> bool:
        return False  # a node meter: never the device meter

    def availability(self) -> Availability:
        return Availability.yes()

    def meter_for(self, devices: list[DeviceRecord], context: RunContext) -> PowerMeter:
        return FixedMeter(self.name, BMC_JOULES)


class GaudiHostFactory(PowerMeterFactory):
    name = "fake-gaudi-host"
    description = "the host's CPU and DRAM"
    node_includes = ("cpu", "dram")

    def reads(self, accelerator_name: str) -> bool:
        return False

    def availability(self) -> Availability:
        return Availability.yes()

    def meter_for(self, devices: list[DeviceRecord], context: RunContext) -> PowerMeter:
        return FixedMeter(self.name, HOST_JOULES)


# --- a command and a report section -------------------------------------------------------------


def _info_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print as JSON")


def _info(args: argparse.Namespace) -> int:
    info = {"accelerator": FakeGaudiAccelerator.name, "devices": len(FakeGaudiAccelerator().devices())}
    print(json.dumps(info) if args.json else f"fake-gaudi: {info['devices']} device(s)")
    return 0


@hookimpl
def core_register_accelerators(register: Callable[[Accelerator], None]) -> None:
    register(FakeGaudiAccelerator())


@hookimpl
def core_register_power_meters(register: Callable[[PowerMeterFactory], None]) -> None:
    register(GaudiPowerFactory())
    register(GaudiBmcFactory())
    register(GaudiHostFactory())


@hookimpl
def core_register_commands(register: Callable[[Command], None]) -> None:
    register(Command("gaudi-info", "show the Gaudi devices", _info, add_arguments=_info_arguments))


@hookimpl
def core_report_sections(runs: Sequence[RunResult], add_section: Callable[[str, Sequence[Any]], None]) -> None:
    ours = [run for run in runs if run.accelerator == FakeGaudiAccelerator.name]
    rows = [
        [Value(run.workload), Value(f"{run.throughput_per_second or 0:.4g}", run.throughput_per_second)] for run in ours
    ]
    add_section(
        "Gaudi runs",
        [
            Paragraph(f"{len(ours)} of the {len(runs)} runs in this report ran on a Gaudi."),
            Table([("workload", "workload"), ("throughput", "samples/s")], rows, identifier="gaudi-runs"),
        ],
    )
