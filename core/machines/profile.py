"""A machine profile: the hardware facts planning needs to check a run for a machine not at hand."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError

from core.config import Precision, config_errors
from core.errors import ConfigError, ConfigErrors

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

GIB = 1024**3


class MachineProfile(BaseModel):
    """One node of a machine, as planning sees it. Unknown figures are None, never guessed."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str = Field(min_length=1, description="what --machine NAME selects")
    description: str = Field(description="one line for listings")
    source: str = Field(description="where the figures come from (the paper's table or section)")
    accelerator: str = Field(min_length=1, description="the core accelerator that drives its devices")
    device: str = Field(description="the device model, e.g. 'NVIDIA A100-SXM4-80GB'")
    devices: int = Field(ge=1, description="devices core places replicas on (an MI250's GCDs count one each)")
    memory_gib_per_device: float | None = Field(default=None, gt=0, description="device memory; None: unknown")
    # A TOML file gives a list of strings: lax for the list and the enum only (a number is still refused).
    precisions: tuple[Annotated[Precision, Strict(False)], ...] = Field(
        min_length=1, strict=False, description="what its devices compute"
    )
    host_cores: int | None = Field(default=None, ge=1, description="CPU cores of the host")
    numa_nodes: int | None = Field(default=None, ge=1, description="NUMA nodes of the host")
    details: dict[str, str | int | float] = Field(
        default_factory=dict, description="vendor facts a plugin's rules read (e.g. compute_capability)"
    )

    @property
    def memory_bytes_per_device(self) -> int | None:
        return None if self.memory_gib_per_device is None else int(self.memory_gib_per_device * GIB)


def machine_names() -> list[str]:
    from core.machines.catalog import MACHINES

    return sorted(MACHINES)


def load_machine(name_or_path: str | Path, relative_to: Path | None = None) -> MachineProfile:
    """A shipped profile by name, or one read from a TOML file; ConfigError on the field ``machine``.

    :param relative_to: the folder a relative profile path is read from (a sweep file's own folder,
        so the file works from any working directory); None: the working directory.
    """
    from core.machines.catalog import MACHINES

    if isinstance(name_or_path, str) and name_or_path in MACHINES:
        return MACHINES[name_or_path]
    path = Path(name_or_path)
    if relative_to is not None and not path.is_absolute():
        path = relative_to / path
    if path.suffix != ".toml" and not path.exists():
        raise ConfigError(
            "machine",
            str(name_or_path),
            f"a shipped profile ({', '.join(machine_names())}) or a profile file (.toml)",
        )
    if not path.is_file():
        found = "a folder" if path.is_dir() else "nothing"
        raise ConfigError("machine", str(name_or_path), f"a profile file (.toml): {found} at {path}")
    if path.suffix != ".toml":
        raise ConfigError("machine", str(name_or_path), "a profile file whose name ends in .toml")
    try:
        document: dict[str, Any] = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise ConfigError("machine", str(path), f"a readable TOML profile ({error})") from None
    try:
        return MachineProfile.model_validate(document)
    except ValidationError as error:
        errors = config_errors(error, MachineProfile, unknown="unknown profile key; allowed", prefix="machine")
        raise (errors[0] if len(errors) == 1 else ConfigErrors(errors)) from None
