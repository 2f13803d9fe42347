"""AMD Instinct GPUs: core's shared CUDA-API placement (PyTorch on ROCm keeps the device type
"cuda" and the "nccl" backend, which is RCCL), discovered and described through amdsmi.

Two modes, chosen with ``accelerator_options={"mode": ...}``:

- ``gcd`` (default): every GPU HIP shows is a device, as ROCm numbers them; on an MI250 that is
  one GCD, half a package. Results list GCDs; energy is still measured per package.
- ``package``: the unit is the physical package. ROCm still needs one process (replica) per GCD,
  so ``replicas`` counts GCDs and must cover whole packages: the first ``replicas`` visible GPUs
  must include every GCD of each package they touch. Results list packages (each with its
  GCDs), peaks are per package, and no package is shared.

For parts with one GPU per package (MI100, MI210, MI300X) the two modes are the same.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from core.plugin import (
    Availability,
    ConfigError,
    DeviceRecord,
    Framework,
    MachineProfile,
    MemoryBandwidth,
    Precision,
    RunConfig,
    RunContext,
    TorchGpuAccelerator,
)

from ..probing import SdkProbe
from . import peaks, smi

PROBE = SdkProbe(
    module="amdsmi",
    install_hint=smi.INSTALL_HINT,
    device_globs=("/dev/kfd",),
    device_hint="no AMD GPU found (no /dev/kfd: the amdgpu kernel driver with ROCm support is not loaded)",
)

# TF32 is absent from MI100/MI200, and whether PyTorch's TF32 switch reaches MI300's hipBLASLt
# depends on the build; it is not offered until a run on MI300 shows it does.
PRECISIONS = (Precision.fp32, Precision.bf16, Precision.fp16, Precision.default)


class AmdOptions(BaseModel):
    """``accelerator_options`` of the AMD accelerator."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["gcd", "package"] = Field(
        default="gcd",
        description="'gcd': each GPU ROCm shows (an MI250 GCD) is a device; 'package': results, peaks and "
        "energy per physical package, replicas covering whole packages",
    )


def _check_whole_packages_on(machine: MachineProfile, config: RunConfig) -> None:
    """A machine's profile lists no GCD pairs: the rule is then that replicas cover whole packages,
    counted in the profile's GCDs per package (an MI250 has two)."""
    per_package = int(machine.details.get("gcds_per_package", 1))
    if config.replicas % per_package:
        raise ConfigError(
            "replicas",
            config.replicas,
            f"in package mode the replicas (one process per GCD) must cover whole packages: a multiple of "
            f"{per_package} on {machine.name!r} ({machine.device})",
        )


class AmdAccelerator(TorchGpuAccelerator):
    name: ClassVar[str] = "amd"
    description: ClassVar[str] = (
        "AMD Instinct GPUs through ROCm (PyTorch DDP/RCCL, TensorFlow MirroredStrategy); "
        "MI250 GCD or package mode; amdsmi energy per package"
    )
    torch_build_attribute: ClassVar[str] = "hip"
    options_model: ClassVar[type[BaseModel]] = AmdOptions
    #: GCDs per physical package (an MI250 has 2): package mode places whole packages
    machine_details: ClassVar[dict[str, Any]] = {
        "gcds_per_package": Annotated[
            int, Field(ge=1, le=64, description="GPUs ROCm shows per physical package, e.g. 2 for an MI250")
        ]
    }

    def __init__(
        self,
        probe: SdkProbe = PROBE,
        environment: Mapping[str, str] | None = None,
        kfd_topology: Any = smi.KFD_TOPOLOGY,
    ) -> None:
        self.probe = probe
        self._environment = environment
        self._kfd_topology = kfd_topology
        self._node: smi.Node | None = None

    def availability(self) -> Availability:
        missing = self.probe.missing()
        return Availability.no("; ".join(missing)) if missing else Availability.yes()

    # --- discovery ------------------------------------------------------------------------------

    def node(self) -> smi.Node:
        """The node's GPUs and packages (static facts; discovered once per accelerator object)."""
        if self._node is None:
            with smi.amdsmi_session() as amdsmi:
                self._node = smi.discover(amdsmi, self._kfd_topology)
        return self._node

    def environment(self) -> Mapping[str, str]:
        return os.environ if self._environment is None else self._environment

    def _record(self, position: int, gcd: smi.Gcd, node: smi.Node) -> DeviceRecord:
        package = node.package_of(gcd.bdf)
        return DeviceRecord(
            index=position,
            name=gcd.product,
            kind=self.name,
            memory_bytes=gcd.memory_bytes,
            details={
                "unit": "gcd",
                "bdf": gcd.bdf,
                "uuid": gcd.uuid,
                "hip_index": gcd.hip_index,
                "package": package.key if package else None,
                "package_gcds": list(package.bdfs) if package else None,
                "market_name": gcd.market_name,
                "device_id": f"{gcd.device_id:#06x}" if gcd.device_id else None,
                "compute_units": gcd.compute_units,
                "gfx_target": gcd.gfx_target,
            },
        )

    def visible_devices(self) -> list[DeviceRecord]:
        node = self.node()
        return [self._record(i, gcd, node) for i, gcd in enumerate(node.visible(self.environment()))]

    def _visible_or_refuse(self) -> list[DeviceRecord]:
        try:
            return self.visible_devices()
        except smi.AmdsmiUnavailable as exc:
            raise ConfigError("accelerator", self.name, f"cannot list the AMD GPUs here: {exc}") from None

    # --- planning ---------------------------------------------------------------------------------

    def precisions(self, framework: Framework) -> tuple[Precision, ...]:
        return PRECISIONS

    def max_replicas_for(self, context: RunContext) -> int:
        return len(self._visible_or_refuse())

    def validate_run(self, context: RunContext) -> None:
        config = context.config
        if context.accelerator_options_as(AmdOptions).mode != "package":
            return
        if context.machine is not None:
            _check_whole_packages_on(context.machine, config)
            return
        used = self._visible_or_refuse()[: config.replicas]
        node = self.node()
        if node.package_error and any(d.details["package"] is None for d in used):
            raise ConfigError("accelerator_options.mode", "package", f"packages are unknown here: {node.package_error}")
        bdfs = {d.details["bdf"] for d in used}
        partial = {}
        for device in used:
            left_out = [b for b in device.details["package_gcds"] if b not in bdfs]
            if left_out:
                partial[device.details["package"]] = left_out
        if partial:
            described = "; ".join(f"{key} without {', '.join(bdfs_)}" for key, bdfs_ in partial.items())
            raise ConfigError(
                "replicas",
                config.replicas,
                "in package mode the replicas (one process per GCD) must cover whole packages, and the first "
                f"{config.replicas} visible GPU(s) would use {described}; choose replicas that cover whole packages "
                "and make sibling GCDs visible together (ROCR_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES)",
            )

    def devices_used(self, context: RunContext) -> list[DeviceRecord]:
        gcds = self.visible_devices()[: context.config.replicas]
        if context.accelerator_options_as(AmdOptions).mode == "gcd":
            return gcds
        packages: dict[str, list[DeviceRecord]] = {}
        for record in gcds:
            packages.setdefault(record.details["package"], []).append(record)
        return [
            DeviceRecord(
                index=position,
                name=members[0].name,
                kind=self.name,
                memory_bytes=sum(m.memory_bytes or 0 for m in members)
                if all(m.memory_bytes for m in members)
                else None,
                details={
                    "unit": "package",
                    "package": key,
                    "gcds": [{"cuda_index": m.index, **m.details} for m in members],
                },
            )
            for position, (key, members) in enumerate(packages.items())
        ]

    # --- running ----------------------------------------------------------------------------------

    def configure_torch_for(self, context: RunContext) -> dict[str, Any]:
        import torch

        expected = len(self.visible_devices())
        if torch.cuda.device_count() != expected:
            raise RuntimeError(
                f"PyTorch sees {torch.cuda.device_count()} GPU(s) where amdsmi with ROCR/HIP_VISIBLE_DEVICES gives "
                f"{expected}: devices and their energy could not be matched"
            )
        properties = torch.cuda.get_device_properties(torch.cuda.current_device())
        return {
            "mode": context.accelerator_options_as(AmdOptions).mode,
            "hip_device_name": properties.name,
            "gcn_arch_name": getattr(properties, "gcnArchName", None),
            "miopen_version": torch.backends.cudnn.version(),
        }

    def driver_versions(self) -> dict[str, str]:
        try:
            with smi.amdsmi_session() as amdsmi:
                return smi.driver_versions(amdsmi, smi.discover(amdsmi, self._kfd_topology))
        except Exception as exc:  # noqa: BLE001 - versions are informative; their absence must not fail a run
            return {"amdgpu_driver": f"unknown ({type(exc).__name__}: {exc})"}

    def peak_flops_per_second(self, device: DeviceRecord, precision: Precision) -> tuple[float, str] | None:
        return peaks.peak(device.name, precision, per_gcd=device.details.get("unit") == "gcd")

    def memory_bandwidth(self, device: DeviceRecord) -> MemoryBandwidth | None:
        return peaks.memory_bandwidth(device.name, per_gcd=device.details.get("unit") == "gcd")
