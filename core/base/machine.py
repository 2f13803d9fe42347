"""A machine profile: the hardware facts planning needs to check a run for a machine not at hand."""

from __future__ import annotations

import math
import sys
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, Strict, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from core.base.config import Precision, config_errors
from core.base.errors import ConfigError, ConfigErrors, did_you_mean
from core.base.roofs import ProfileRoofs

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

GIB = 1024**3
# Beyond these a figure is a typing mistake (or inf, 1e308), not a machine: a profile's numbers feed
# placement and memory checks, where an absurd one passes every check it should fail.
MAX_DEVICES = 1 << 16  # as RunConfig.replicas
MAX_MEMORY_GIB_PER_DEVICE = float(1 << 20)  # 1 PiB
MAX_HOST_CORES = 1 << 20
MAX_NUMA_NODES = 1 << 12


def _plain_detail(value: Any) -> Any:
    """A ``[details]`` value before the union of types, whose three refusals of inf or true would each
    read "a string is required" (or "an integer", "a number"); its error names the key
    (``machine.details.KEY``), not the whole table."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("a finite number is required")
    if isinstance(value, bool):
        raise ValueError("a string or a number is required, not a boolean")
    return value


class MachineProfile(BaseModel):
    """One node of a machine, as planning sees it. Unknown figures are None, never guessed."""

    # allow_inf_nan=False: a TOML file can spell inf and nan, and neither is a figure of a machine.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    name: str = Field(min_length=1, description="what --machine NAME selects")
    description: str = Field(description="one line for listings")
    source: str = Field(description="where the figures come from (the paper's table or section)")
    accelerator: str = Field(min_length=1, description="the core accelerator that drives its devices")
    device: str = Field(description="the device model, e.g. 'NVIDIA A100-SXM4-80GB'")
    devices: int = Field(
        ge=1, le=MAX_DEVICES, description="devices core places replicas on (an MI250's GCDs count one each)"
    )
    memory_gib_per_device: float | None = Field(
        default=None, gt=0, le=MAX_MEMORY_GIB_PER_DEVICE, description="device memory; None: unknown"
    )
    # A TOML file gives a list of strings: lax for the list and the enum only (a number is still refused).
    precisions: tuple[Annotated[Precision, Strict(False)], ...] = Field(
        min_length=1, strict=False, description="what its devices compute"
    )
    host_cores: int | None = Field(default=None, ge=1, le=MAX_HOST_CORES, description="CPU cores of the host")
    numa_nodes: int | None = Field(default=None, ge=1, le=MAX_NUMA_NODES, description="NUMA nodes of the host")
    roofs: ProfileRoofs | None = Field(
        default=None,
        description="the node's own roof figures per device (memory bandwidth, peak FLOP/s by precision) with "
        "their source, for `core report --roofs machine`; None: the datasheet's",
    )
    details: dict[str, Annotated[str | int | float, BeforeValidator(_plain_detail)]] = Field(
        default_factory=dict,
        description="vendor facts a plugin's rules read (e.g. compute_capability), each of the type and form "
        "the accelerator's machine_details declares",
    )

    #: the TOML file this profile was read from; None for a profile a plugin ships
    _file: Path | None = PrivateAttr(default=None)

    def __eq__(self, other: object) -> bool:
        # The figures make a profile, not the file they were read from (pydantic compares that too).
        if not isinstance(other, MachineProfile):
            return NotImplemented
        return self.model_dump() == other.model_dump()

    def __hash__(self) -> int:
        return hash(self.model_dump_json())

    @property
    def in_file(self) -> str:
        """`` (in profile FILE)`` for a profile read from a file, which its errors end with; else ""."""
        return "" if self._file is None else f" (in profile {self._file})"

    @property
    def memory_bytes_per_device(self) -> int | None:
        return None if self.memory_gib_per_device is None else int(self.memory_gib_per_device * GIB)


def find_machine(
    name_or_path: str | Path, profiles: Mapping[str, MachineProfile], relative_to: Path | None = None
) -> MachineProfile:
    """A profile of ``profiles`` by name, or one read from a TOML file; ConfigError on the field
    ``machine``. (:func:`core.machines.load_machine` looks the name up among the plugins' profiles.)

    :param profiles: the profiles a name may select, by name.
    :param relative_to: the folder a relative profile path is read from (a sweep file's own folder,
        so the file works from any working directory); None: the working directory.
    """
    if isinstance(name_or_path, str) and name_or_path in profiles:
        return profiles[name_or_path]
    path = Path(name_or_path)
    if relative_to is not None and not path.is_absolute():
        path = relative_to / path
    if path.suffix != ".toml" and not path.exists():
        raise ConfigError(
            "machine",
            str(name_or_path),
            f"a shipped profile ({', '.join(sorted(profiles)) or 'none: no loaded plugin ships one'}) "
            f"or a profile file (.toml){did_you_mean(str(name_or_path), profiles)}",
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
    except RecursionError:  # tomllib parses nested arrays and tables recursively
        raise ConfigError("machine", str(path), "a readable TOML profile (arrays or tables nest too deeply)") from None
    try:
        profile = MachineProfile.model_validate(document)
    except ValidationError as error:
        errors = [
            ConfigError(problem.field, problem.value, f"{problem.allowed} (in profile {path})", missing=problem.missing)
            for problem in config_errors(
                error, MachineProfile, unknown="unknown profile key; allowed", prefix="machine"
            )
        ]
        raise (errors[0] if len(errors) == 1 else ConfigErrors(errors)) from None
    profile._file = path
    return profile


_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean"}


def _detail_parts(kind: Any) -> tuple[type, list[Any]]:
    """(the Python type, the constraints) of a ``machine_details`` entry: ``str``, or
    ``Annotated[str, Field(pattern=..., description=...)]``."""
    if typing.get_origin(kind) is Annotated:
        base, *metadata = typing.get_args(kind)
        return base, metadata
    return kind, []


def detail_type_name(kind: Any) -> str:
    """``str``, ``int``: how the listing of the keys an accelerator reads names a detail's type."""
    return _detail_parts(kind)[0].__name__


def check_detail(key: str, value: Any, kind: Any) -> None:
    """A profile's ``[details]`` value against what its accelerator declares for ``key``: the type
    exactly (a boolean is not an integer, 9.0 is not the string "9.0"), then the constraints of an
    ``Annotated`` type (a pattern, a range), whose description says what is allowed.

    :raises ConfigError: on ``machine.details.<key>``.
    """
    base, metadata = _detail_parts(kind)
    field = f"machine.details.{key}"
    if type(value) is not base:  # exact: a boolean is not an int, an int is not a str
        required, got = (_TYPE_NAMES.get(t, t.__name__) for t in (base, type(value)))
        quoting = f'; a TOML string is quoted: {key} = "{value}"' if base is str else ""
        raise ConfigError(field, value, f"{required} is required, got {got}{quoting}")
    if not metadata:
        return
    try:
        TypeAdapter(kind).validate_python(value, strict=True)
    except ValidationError as error:
        problem = error.errors()[0]["msg"]
        described = [item.description for item in metadata if isinstance(item, FieldInfo) and item.description]
        raise ConfigError(field, value, (f"{described[0]} ({problem})" if described else problem)) from None
