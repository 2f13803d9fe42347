"""Roof figures that do not come from a run's own datasheet peaks: a machine profile's (a paper's
table) and those measured on a host by a short probe (``core roofs``). Plain types only: the
probe is in :mod:`core.roofs.probe`, the choice between sources in :mod:`core.report.roof_sources`.

A profile's figures are per device, so a run on several devices gets their sum, as the datasheet
figures in its results are. A measured record is per host and device model: the report gives it to
the cells that ran on that host with that device.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError

from core.base.config import Precision
from core.base.files import parse_json

# Beyond these a figure is a typing mistake (or inf), not a machine: 1 EFLOP/s and 1 PB/s per device.
MAX_FLOPS_PER_SECOND = 1e18
MAX_BYTES_PER_SECOND = 1e15
#: the layout of a measured record (the cache file and the database's host_roofs rows)
MEASURED_ROOFS_FORMAT = 1

PositiveFlops = Annotated[float, Field(gt=0, le=MAX_FLOPS_PER_SECOND)]
PositiveBandwidth = Annotated[float, Field(gt=0, le=MAX_BYTES_PER_SECOND)]


class ProfileRoofs(BaseModel):
    """A machine profile's roofs, per device, with where they come from. Unknown figures are left
    out (a precision without a peak, a bandwidth of None), never guessed."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    source: str = Field(min_length=1, description="where the figures come from, e.g. 'AI4NP, Table 1'")
    memory_bandwidth_bytes_per_second: PositiveBandwidth | None = Field(
        default=None, description="peak memory bandwidth of one device (the slanted roof); None: unknown"
    )
    memory: str = Field(default="memory", min_length=1, description="what the bandwidth is of, e.g. 'GDDR6'")
    # A TOML file gives string keys: lax for the key's enum only (a string value is still refused).
    peak_flops_per_second: dict[Annotated[Precision, Strict(False)], PositiveFlops] = Field(
        default_factory=dict, strict=False, description="peak FLOP/s of one device by precision (the flat roof)"
    )

    def peak_for(self, precision: str) -> float | None:
        return next((value for name, value in self.peak_flops_per_second.items() if name.value == precision), None)


class MeasuredRoofs(BaseModel):
    """What the roof probe measured on one host for one device model: per device, labelled as
    measured, with when, where and how. Read back from a cache file or a database row, so every
    field is checked (a damaged or foreign record is refused, never trusted)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    format: int = Field(description="MEASURED_ROOFS_FORMAT of the core that wrote it")
    host: str = Field(min_length=1, description="the host name (socket.gethostname(), as each result records it)")
    device: str = Field(min_length=1, description="the device model, as the accelerator's DeviceRecord names it")
    accelerator: str = Field(min_length=1, description="the core accelerator whose device was probed")
    torch_device: str = Field(min_length=1, description="the torch device the probe ran on, e.g. 'cpu'")
    core_version: str
    torch_version: str
    measured_at: str = Field(description="ISO 8601, UTC")
    probe_seconds: float = Field(ge=0, description="how long the probe ran")
    memory_bandwidth_bytes_per_second: PositiveBandwidth
    # By the matmul's compute dtype (float32, bfloat16, float16): what a run's precision computes in.
    peak_flops_per_second: dict[str, PositiveFlops]
    method: str = Field(description="how the figures were measured (sizes, threads, repeats)")

    @property
    def date(self) -> str:
        return self.measured_at[:10]

    @property
    def label(self) -> str:
        return f"measured on host {self.host} on {self.date}"


def read_measured_roofs(text: str | bytes) -> MeasuredRoofs:
    """A measured record from JSON text; ValueError saying what is wrong with it."""
    try:
        data = parse_json(text)
    except ValueError as error:
        raise ValueError(f"not JSON ({error})") from None
    if not isinstance(data, dict) or data.get("format") != MEASURED_ROOFS_FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"not a measured-roofs record of format {MEASURED_ROOFS_FORMAT} (format: {found!r})")
    try:
        return MeasuredRoofs.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        raise ValueError(f"{field}: {first['msg']}") from None


# --- which source a report draws roofs from (`core report --roofs`, a sweep file's [report] roofs) ---


class RoofSource(str, Enum):
    auto = "auto"
    datasheet = "datasheet"
    machine = "machine"
    measured = "measured"


def parse_roofs_option(text: str) -> tuple[RoofSource, str | None]:
    """``--roofs``'s value (or ``[report] roofs``) as (source, machine profile name or file);
    ValueError naming what is allowed (the caller names the option or field)."""
    source, _, machine = text.partition(":")
    allowed = ", ".join(one.value for one in RoofSource) + ", machine:NAME or machine:FILE.toml"
    try:
        chosen = RoofSource(source)
    except ValueError:
        raise ValueError(f"allowed are {allowed}") from None
    if machine and chosen is not RoofSource.machine or (chosen is RoofSource.machine and text.endswith(":")):
        raise ValueError(f"only machine takes a profile (machine:NAME); allowed are {allowed}")
    return chosen, machine or None
