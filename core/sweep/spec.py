"""A sweep file: reading it (TOML, YAML or JSON, with limits against hostile input) and validating
it strictly into a :class:`SweepSpec`."""

from __future__ import annotations

import json
import reprlib
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from core.base.config import RunConfig, canonical_node_meters
from core.base.epochs import EpochDefinition
from core.base.errors import ConfigError, ConfigErrors, CoreError
from core.sweep.reference import Reference, same_value
from core.sweep.report_spec import ReportField
from core.sweep.slurm_settings import SlurmSettings

DEFAULT_REPEATS = 3
DEFAULT_TIMEOUT_SECONDS = 3600.0  # per repeat; an IPU's first compilation alone can take tens of minutes
# RunConfig fields that are tables of keys (each key an axis of its own: target.value = [0.9, 0.95])
_DICT_FIELDS = ("workload_options", "accelerator_options", "loadgen", "target")
_NAME_PUNCTUATION = "._-"
_NAME_RULE = (
    "a sweep name is letters and digits of any script, '.', '_' and '-', starting with a letter or "
    "digit (the pattern [letter or digit][letters, digits, . _ -]*, at most 200 characters): no "
    "spaces, '/' or control characters, and no leading '.' (so no '..')"
)
_Scalar = (bool, int, float, str)
MAX_SWEEP_FILE_BYTES = 1 << 20  # a sweep file declares a grid; anything larger is a mistake or an attack
_SHOWN_CHARS = 200  # of a value quoted back in an error
_SHOWN_ERRORS = 10  # problems listed from one sweep file; the rest are counted

_YAML_LOADER: Any = None
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxtuple, _REPR.maxset = 4, 20, 20, 20, 20
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = _SHOWN_CHARS
_FLOAT_FIELDS = {name for name, info in RunConfig.model_fields.items() if info.annotation in (float, float | None)}


class SweepError(CoreError):
    """A sweep cannot start: its file is unreadable, cells are invalid, or its database disagrees."""


class UnsavedResultError(SweepError):
    """The database refused a result mid-sweep (a full disk): the sweep stopped, the result is kept.

    ``document`` is the run as JSON-ready data (sweep, cell, repeat, result); ``saved_to`` the file
    it was written to beside the database (``<database>.unsaved/``), which ``--resume`` records,
    or None when that failed too (``save_error``); ``core sweep`` then prints it as JSON.
    """

    def __init__(self, message: str, document: dict[str, Any], saved_to: Path | None, save_error: str | None) -> None:
        super().__init__(message)
        self.document = document
        self.saved_to = saved_to
        self.save_error = save_error


class SweepSpec(BaseModel):
    """A sweep file, as read. ``grid`` holds RunConfig fields; a list value is an axis.

    Strict: a number is a number (``repeats = true`` or ``"3"`` is refused, not 1 or 3); a
    ``timeout_seconds`` may be written as an integer.
    """

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    name: str = Field(
        min_length=1, max_length=200, description="the sweep's name in the database; defaults to the file's stem"
    )
    description: str | None = None
    repeats: int = Field(default=DEFAULT_REPEATS, ge=1, le=1000, description="runs per cell")
    timeout_seconds: float = Field(
        default=DEFAULT_TIMEOUT_SECONDS,
        gt=0,
        le=7 * 24 * 3600.0,
        description="wall-clock limit of one repeat, process start to exit",
    )
    machine: str | None = Field(
        default=None,
        description="the machine profile the file was written for (see `core machines`): --dry-run plans for it "
        "unless --machine names another",
    )
    grid: dict[str, Any]
    exclude: list[dict[str, Any]] = Field(
        default_factory=list, description="partial cells to leave out; a list matches any of its values"
    )
    slurm: SlurmSettings | None = Field(
        default=None, description="the Slurm jobs of `core sweep --executor slurm` (docs/cluster.md)"
    )
    reference: list[Reference] = Field(
        default_factory=list,
        description="published figures the sweep reproduces, shown beside its own in the report (docs/sweeps.md)",
    )
    report: ReportField = Field(default=None, description="what the report draws (docs/sweeps.md, the [report] table)")

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        value = unicodedata.normalize("NFC", value)
        if not _valid_sweep_name(value):
            raise ValueError(_NAME_RULE)
        return value

    def axes(self) -> list[tuple[str, list[Any]]]:
        """(option, values) for every list in the grid, in file order; dict fields as ``group.key``."""
        return [(name, value) for name, value in _flatten(self.grid) if isinstance(value, list)]

    def shared(self) -> dict[str, Any]:
        return {name: value for name, value in _flatten(self.grid) if not isinstance(value, list)}


def read_sweep_document(path: Path) -> dict[str, Any]:
    """The file's contents as a dict; the suffix says the format (.toml, .yaml/.yml, .json).

    A file over 1 MiB is refused, and so are YAML aliases (``*name``, ``<<: *name``): a few hundred
    bytes of nested aliases expand to billions of values.
    """
    from core.base.files import describe_os_error

    suffix = path.suffix.lower()
    if suffix not in (".toml", ".yaml", ".yml", ".json"):
        raise SweepError(f"sweep file {path}: unknown format {_shorten(suffix)!r}; use .toml, .yaml, .yml or .json")
    try:
        with open(path, "rb") as stream:
            data = stream.read(MAX_SWEEP_FILE_BYTES + 1)
    except OSError as exc:
        raise SweepError(f"cannot read sweep file {path}: {describe_os_error(exc)}") from None
    if len(data) > MAX_SWEEP_FILE_BYTES:
        raise SweepError(
            f"sweep file {path} is larger than {MAX_SWEEP_FILE_BYTES >> 20} MiB; a sweep file "
            "declares a grid, it holds no data"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SweepError(f"sweep file {path} is not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    try:
        if suffix == ".toml":
            try:
                import tomllib
            except ModuleNotFoundError:  # Python 3.10
                import tomli as tomllib
            document = tomllib.loads(text)
        elif suffix in (".yaml", ".yml"):
            import yaml

            document = yaml.load(text, Loader=_yaml_loader())  # noqa: S506 - a SafeLoader without aliases
        else:
            document = json.loads(text)
    except Exception as exc:  # each parser has its own error type (RecursionError too); all mean the same here
        text = str(exc).replace('in "<unicode string>", ', "")  # PyYAML's name for the text it was given
        raise SweepError(f"cannot parse sweep file {path}: {_shorten(text, 500)}") from None
    if not isinstance(document, dict):
        raise SweepError(f"sweep file {path}: expected a table of settings at the top level")
    return document


def _yaml_loader() -> Any:
    """yaml.SafeLoader that refuses aliases: with them, 300 bytes can expand to gigabytes."""
    global _YAML_LOADER
    if _YAML_LOADER is None:
        import yaml

        class NoAliasLoader(yaml.SafeLoader):
            def compose_node(self, parent: Any, index: Any) -> Any:
                if self.check_event(yaml.AliasEvent):
                    event = self.peek_event()
                    raise yaml.composer.ComposerError(
                        None,
                        None,
                        f"found the alias *{_shorten(str(event.anchor), 60)}: a sweep file may not use "
                        "YAML aliases (*name, <<: *name); write the values out",
                        event.start_mark,
                    )
                return super().compose_node(parent, index)

        _YAML_LOADER = NoAliasLoader
    return _YAML_LOADER


class _Shown:
    """A stand-in for a long value in an error message: its repr is the value's, cut short."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def shown(value: Any) -> Any:
    """``value`` when it is short; else an object whose repr is the start of the value's.

    Every error that quotes a value from a sweep file goes through here, so a huge value gives a
    short message (the work is bounded too: reprlib never walks the whole value).
    """
    if value is None or isinstance(value, (bool, int, float)) and len(_REPR.repr(value)) <= _SHOWN_CHARS:
        return value
    if isinstance(value, str) and len(value) <= _SHOWN_CHARS:
        return value
    text = _REPR.repr(value)
    if isinstance(value, (list, dict)) and len(text) <= _SHOWN_CHARS and "..." not in text:
        return value
    return _Shown(_shorten(text, _SHOWN_CHARS))


def _shorten(text: str, limit: int = _SHOWN_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _too_many(errors: list[ConfigError]) -> list[ConfigError]:
    if len(errors) <= _SHOWN_ERRORS:
        return errors
    return errors[:_SHOWN_ERRORS] + [
        ConfigError("sweep", _Shown("..."), f"and {len(errors) - _SHOWN_ERRORS} more problems not shown")
    ]


def make_sweep_spec(document: dict[str, Any], default_name: str | None = None) -> SweepSpec:
    """Validate a sweep document. Raises ConfigError naming the setting (``grid.precision``)."""
    from core.base.config import config_errors

    document = dict(document)
    if default_name is not None and "name" not in document:
        document["name"] = default_name
    try:
        spec = SweepSpec(**document)
    except ValidationError as exc:
        errors = [
            ConfigError(e.field, shown(e.value), _shorten(str(e.allowed), 600), missing=e.missing)
            for e in config_errors(exc, SweepSpec, unknown="unknown setting; a sweep file has", nameless="sweep")
        ]
        errors = _too_many(errors)
        raise (errors[0] if len(errors) == 1 else ConfigErrors(errors)) from None
    _check_grid(spec)
    canonical = [_canonical(entry) for entry in spec.exclude]
    return spec.model_copy(update={"grid": _canonical(spec.grid), "exclude": canonical})


def load_sweep(path: str | Path) -> SweepSpec:
    path = Path(path)
    return make_sweep_spec(read_sweep_document(path), default_name=_default_name(path))


def _name_character(character: str) -> bool:
    # Letters and digits of any script, with their combining marks (Devanagari's vowel signs).
    return character.isalnum() or character in _NAME_PUNCTUATION or unicodedata.category(character)[0] == "M"


def _valid_sweep_name(name: str) -> bool:
    return 0 < len(name) <= 200 and name[0].isalnum() and all(_name_character(c) for c in name)


def _default_name(path: Path) -> str:
    """The file's stem made a valid name: ``größe.toml`` -> ``größe``, ``my grid.yaml`` -> ``my-grid``."""
    stem = unicodedata.normalize("NFC", path.stem)
    name = "".join(c if _name_character(c) else "-" for c in stem)
    while name and not name[0].isalnum():
        name = name[1:]
    name = name[:200]
    return name if _valid_sweep_name(name) else "sweep"


def _flatten(grid: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    for name, value in grid.items():
        if name in _DICT_FIELDS and isinstance(value, dict):
            for key, inner in value.items():
                yield f"{name}.{key}", inner
        else:
            yield name, value


def canonical_value(name: str, value: Any) -> Any:
    """One spelling of a value that can be written several ways, so that equal settings make one
    cell: ``epoch_definition`` ``samples:1_000`` and ``samples: 1000`` are ``samples:1000``, ``node_meters``
    ``rapl, bmc`` is ``bmc,rapl``. A value
    that does not parse is left as written, for the cell's validation to refuse by name."""
    if name == "epoch_definition" and isinstance(value, str):
        try:
            return str(EpochDefinition.parse(value))
        except ValueError:
            return value
    if name == "node_meters" and isinstance(value, str):
        try:
            return canonical_node_meters(value, sort=True)
        except ValueError:
            return value
    return value


def _canonical(table: dict[str, Any]) -> dict[str, Any]:
    """A grid or an exclude entry with every value in its one spelling (see :func:`canonical_value`)."""
    return {
        name: [canonical_value(name, item) for item in value]
        if isinstance(value, list)
        else canonical_value(name, value)
        for name, value in table.items()
    }


def _check_grid(spec: SweepSpec) -> None:
    allowed_fields = list(RunConfig.model_fields)
    for name, value in spec.grid.items():
        if name not in RunConfig.model_fields:
            raise ConfigError(
                f"grid.{_shorten(name, 80)}", shown(value), "unknown run option; allowed: " + ", ".join(allowed_fields)
            )
        if name in _DICT_FIELDS and not isinstance(value, dict):
            raise ConfigError(f"grid.{name}", shown(value), "a table of KEY = value (a value may be a list)")
    if "workload" not in spec.grid:
        raise ConfigError(
            "grid.workload", None, "required: the workload to run (a name, or a list of names)", missing=True
        )
    for name, value in _flatten(spec.grid):
        where = f"grid.{_shorten(name, 80)}"
        values = value if isinstance(value, list) else [value]
        if not values:
            raise ConfigError(where, value, "an empty list makes no cells; give at least one value")
        seen: dict[tuple[str, Any], Any] = {}
        for item in values:
            if not isinstance(item, _Scalar):
                raise ConfigError(
                    where, shown(item), "a value must be a number, a string or a boolean (or a list of them)"
                )
            # Values are distinct as JSON values: 8, 8.0, "8" and true are four cells, which the
            # strict RunConfig then judges (8.0, "8" and true are not an integer). Only where the
            # option is a float, which takes 8 and 8.0 alike, are they one cell written twice.
            kind = (
                "boolean"
                if isinstance(item, bool)
                else "string"
                if isinstance(item, str)
                else ("number" if name in _FLOAT_FIELDS else type(item).__name__)
            )
            identity = (kind, canonical_value(name, item))
            if identity in seen:
                same = (
                    ""
                    if json.dumps(seen[identity]) == json.dumps(item)
                    else f" ({_shorten(json.dumps(seen[identity]), 40)} and {_shorten(json.dumps(item), 40)} "
                    f"are the same {'number' if kind == 'number' else 'value'})"
                )
                raise ConfigError(where, shown(value), f"a value appears twice{same}: the same cell would run twice")
            seen[identity] = item
    known = {name: value if isinstance(value, list) else [value] for name, value in _flatten(spec.grid)}
    for position, entry in enumerate(spec.exclude):
        if not isinstance(entry, dict) or not entry:
            raise ConfigError(f"exclude.{position}", shown(entry), "a table of option = value (or list of values)")
        for name, wanted in _flatten(entry):
            where = f"exclude.{position}.{_shorten(name, 80)}"
            if name not in known:
                raise ConfigError(
                    where, shown(entry), "not an option set in the grid; allowed: " + ", ".join(sorted(known))
                )
            _check_excluded_values(where, name, wanted, known[name])


def _check_excluded_values(where: str, name: str, wanted: Any, grid_values: list[Any]) -> None:
    """Each value an exclude entry names must be one the grid gives the option, compared as the cells
    are (a boolean is not a number: ``compile = 1`` would otherwise exclude the ``true`` cells, and
    ``micro_batch_size = true`` exclude nothing, both in silence)."""
    spellings = [canonical_value(name, value) for value in grid_values]
    for item in wanted if isinstance(wanted, list) else [wanted]:
        if any(same_value(canonical_value(name, item), value) for value in spellings):
            continue
        kinds = {isinstance(value, bool) for value in grid_values if isinstance(value, (int, float))}
        hint = ""
        if isinstance(item, (int, float)) and kinds and isinstance(item, bool) not in kinds:
            hint = " (a boolean is not a number)"
        given = ", ".join(_shorten(json.dumps(value), 40) for value in grid_values[:20])
        raise ConfigError(where, shown(item), f"no cell has this value{hint}; the grid gives: {given}")
