"""Published figures beside a sweep's own: a sweep file's ``[[reference]]`` tables (and a user's
own, in a file passed to ``core report --reference``), validated strictly.

A reference names the paper, its table or figure and row, the value as printed with its unit, the
core figure it corresponds to (a name from :data:`core.storage.metrics.METRICS`), which cells it
matches (``option = value`` over the grid) and the assumptions that separate the paper's
measurement from core's. The stored sweep record keeps the file's document but not its comments,
so the assumptions are data here. The report (core.report.references) shows each beside the
matched cells' medians, converted into the paper's unit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from core.base.errors import ConfigError, ConfigErrors

if TYPE_CHECKING:
    from core.sweep.plan import Cell

_Scalar = (bool, int, float, str)
_TEXT_LIMIT = 2000  # characters of a citation or an assumptions note

# --- units: each core unit and the spellings a paper may use, with the factor to core's unit ----
#
# value in core's unit = value in the paper's unit x factor: 1 min = 60 s, 1 kWh = 1000 Wh.
_SAMPLES = ("samples", "images", "img", "sequences", "seq", "items")  # what a sample is, as papers say it
_SECONDS = {"s": 1.0, "ms": 1e-3, "min": 60.0, "minutes": 60.0, "h": 3600.0, "hours": 3600.0}
_WATT_HOURS = {"Wh": 1.0, "kWh": 1e3, "MWh": 1e6, "J": 1 / 3600, "kJ": 1e3 / 3600, "MJ": 1e6 / 3600}


def _per(numerators: Iterable[str], denominators: Mapping[str, float]) -> dict[str, float]:
    """``N/D`` for each numerator and denominator: per D is 1/D's factor (1 image/kWh = 1e-3 images/Wh)."""
    return {f"{top}/{bottom}": 1.0 / factor for top in numerators for bottom, factor in denominators.items()}


UNITS: dict[str, dict[str, float]] = {
    "s": dict(_SECONDS),
    "Wh": dict(_WATT_HOURS),
    "J": {unit: factor * 3600 for unit, factor in _WATT_HOURS.items()},
    "samples/s": _per(_SAMPLES, {"s": 1.0, "min": 60.0, "h": 3600.0}),
    "tokens/s": _per(("tokens",), {"s": 1.0, "min": 60.0, "h": 3600.0}),
    "samples/Wh": _per(_SAMPLES, {"Wh": 1.0, "kWh": 1e3, "J": 1 / 3600, "kJ": 1e3 / 3600}),
    "tokens/Wh": _per(("tokens",), {"Wh": 1.0, "kWh": 1e3, "J": 1 / 3600, "kJ": 1e3 / 3600}),
    "J/sample": {
        f"{energy}/{sample.removesuffix('s')}": factor * 3600
        for energy, factor in _WATT_HOURS.items()
        for sample in _SAMPLES
    },
    "FLOP/s": {"FLOP/s": 1.0, "GFLOP/s": 1e9, "TFLOP/s": 1e12, "PFLOP/s": 1e15, "TFLOPS": 1e12, "GFLOPS": 1e9},
    "fraction": {"fraction": 1.0, "%": 0.01},
}


def _quantities() -> dict[str, str]:
    """The figures a reference may correspond to, each with its unit: every median figure core
    summarises whose unit a paper's can be converted to."""
    from core.storage.metrics import METRICS, Summary

    return {
        metric.name: metric.unit
        for metric in METRICS
        if metric.summary in (Summary.median, Summary.median_spread) and metric.unit in UNITS
    }


def unit_factor(quantity: str, unit: str) -> float:
    """The factor from ``unit`` to ``quantity``'s unit in core (value in core's = value x factor).

    :raises KeyError: for a quantity or unit the tables do not have (validation refuses them first).
    """
    return UNITS[_quantities()[quantity]][unit]


def in_paper_unit(measured: float, quantity: str, unit: str) -> float:
    """A figure as core stores it (``quantity``'s unit), in the paper's ``unit``."""
    return measured / unit_factor(quantity, unit)


# --- the model -----------------------------------------------------------------------------------


class Reference(BaseModel):
    """One published figure, and the cells of the sweep it is compared with."""

    model_config = ConfigDict(extra="forbid", strict=True)

    paper: str = Field(min_length=1, max_length=200, description="the paper's short name, e.g. 'ACES (Nasari et al.)'")
    citation: str | None = Field(
        default=None, min_length=1, max_length=_TEXT_LIMIT, description="the paper's full citation or URL"
    )
    table: str = Field(min_length=1, max_length=200, description="the table or figure: 'Table 1', 'Fig. 2'")
    row: str | None = Field(
        default=None, min_length=1, max_length=200, description="the row, column or point: '16 IPUs, 2nd epoch'"
    )
    quantity: str = Field(description="the core figure it corresponds to, a name from core.storage.metrics")
    value: float = Field(gt=0, allow_inf_nan=False, description="the paper's number, as printed")
    unit: str = Field(description="the paper's unit, e.g. 'images/s', 'min', 'Wh'")
    match: dict[str, Any] = Field(
        default_factory=dict,
        description="option = value selectors over the grid (workload_options.NAME for a workload's); "
        "every cell they match is compared",
    )
    assumptions: str | None = Field(
        default=None,
        min_length=1,
        max_length=_TEXT_LIMIT,
        description="what separates the paper's measurement from core's",
    )

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        # pydantic's own extra_forbidden error would be described with the enclosing model's fields.
        if isinstance(data, dict):
            unknown = [key for key in data if key not in cls.model_fields]
            if unknown:
                raise ValueError(
                    f"unknown key {str(unknown[0])[:80]!r}; a reference has: {', '.join(cls.model_fields)}"
                )
        return data

    @field_validator("quantity")
    @classmethod
    def _known_quantity(cls, quantity: str) -> str:
        quantities = _quantities()
        if quantity not in quantities:
            raise ValueError("a core figure with a unit; allowed: " + ", ".join(quantities))
        return quantity

    @field_validator("unit")
    @classmethod
    def _unit_of_quantity(cls, unit: str, info: ValidationInfo) -> str:
        quantity = info.data.get("quantity")
        if quantity is None:  # refused already, by its own field
            return unit
        core_unit = _quantities()[quantity]
        if unit not in UNITS[core_unit]:
            raise ValueError(
                f"not a unit of {quantity} (core's unit: {core_unit}); allowed: {', '.join(UNITS[core_unit])}"
            )
        return unit

    @field_validator("match")
    @classmethod
    def _selectors(cls, match: dict[str, Any]) -> dict[str, Any]:
        from core.sweep.spec import canonical_value

        selectors: dict[str, Any] = {}
        for name, value in match.items():
            inner = value.items() if isinstance(value, dict) else [(None, value)]
            for key, item in inner:
                option = name if key is None else f"{name}.{key}"
                if not isinstance(item, _Scalar):
                    raise ValueError(
                        f"{option} = {str(item)[:80]}: a selector's value is one number, string or boolean"
                    )
                selectors[option] = canonical_value(option, item)
        return selectors


class SweptReference(Reference):
    """A reference from a file of one's own (``core report --reference``): it names its sweep."""

    sweep: str = Field(min_length=1, max_length=200, description="the sweep whose cells it matches")


class ReferenceFile(BaseModel):
    """A file of references for ``core report --reference``: ``[[reference]]`` tables naming their sweep."""

    model_config = ConfigDict(extra="forbid", strict=True)

    reference: list[SweptReference] = Field(min_length=1, description="the published figures, each naming its sweep")


def load_reference_file(path: str | Path) -> list[SweptReference]:
    """The references of a file for ``core report --reference`` (TOML, YAML or JSON, read with a
    sweep file's limits).

    :raises SweepError: the file cannot be read or parsed.
    :raises ConfigError: an entry does not validate, naming ``reference.N.FIELD``.
    """
    from core.base.config import config_errors
    from core.sweep.spec import read_sweep_document, shown

    document = read_sweep_document(Path(path))
    try:
        return ReferenceFile.model_validate(document).reference
    except ValidationError as exc:
        errors = [
            ConfigError(error.field, shown(error.value), error.allowed, missing=error.missing)
            for error in config_errors(
                exc, ReferenceFile, unknown="unknown setting; a reference file has", nameless="reference file"
            )
        ]
        raise (errors[0] if len(errors) == 1 else ConfigErrors(errors[:10])) from None


# --- matching cells ------------------------------------------------------------------------------


def _option(options: Mapping[str, Any], name: str) -> tuple[bool, Any]:
    """(present, value) of ``name`` in a cell's options; ``group.key`` looks inside a table."""
    if name in options:
        return True, options[name]
    group, dot, key = name.partition(".")
    inner = options.get(group) if dot else None
    if isinstance(inner, Mapping) and key in inner:
        return True, inner[key]
    return False, None


def same_value(wanted: Any, value: Any) -> bool:
    """A selector's value against a cell's: numbers as numbers (8 and 8.0), else equal type and value."""
    numbers = all(isinstance(item, (int, float)) and not isinstance(item, bool) for item in (wanted, value))
    if numbers:
        return float(wanted) == float(value)
    return type(wanted) is type(value) and wanted == value


def matches(selectors: Mapping[str, Any], options: Mapping[str, Any]) -> bool:
    """Whether a cell's options (a planned cell's, nested as the plan holds them) have every selector."""
    for name, wanted in selectors.items():
        present, value = _option(options, name)
        if not present or not same_value(wanted, value):
            return False
    return True


def _option_values(cells: Sequence[Cell]) -> dict[str, list[Any]]:
    """Each option the cells set (``group.key`` inside a table), with its values in grid order."""
    values: dict[str, list[Any]] = {}
    for cell in cells:
        for name, value in cell.options.items():
            inner = value.items() if isinstance(value, dict) else [(None, value)]
            for key, item in inner:
                seen = values.setdefault(name if key is None else f"{name}.{key}", [])
                if not any(type(item) is type(known) and item == known for known in seen):
                    seen.append(item)
    return values


def check_references(references: Sequence[Reference], cells: Sequence[Cell], prefix: str = "reference") -> None:
    """Refuse a reference whose selectors match none of the planned cells (refused ones count: the
    report says why they did not run), naming the selector that rules them out.

    :raises ConfigError: ``reference.N.match.OPTION``, its value and the values the grid gives it.
    """
    values: dict[str, list[Any]] | None = None
    for position, reference in enumerate(references):
        if any(matches(reference.match, cell.options) for cell in cells):
            continue
        values = values if values is not None else _option_values(cells)
        where = f"{prefix}.{position}.match"
        for name, wanted in reference.match.items():
            if name not in values:
                raise ConfigError(
                    f"{where}.{name[:80]}", wanted, "not an option of this sweep's cells; allowed: " + ", ".join(values)
                )
            if not any(same_value(wanted, value) for value in values[name]):
                shown = ", ".join(repr(value) for value in values[name][:20])
                raise ConfigError(f"{where}.{name[:80]}", wanted, f"no cell has this value; the grid gives: {shown}")
        raise ConfigError(
            where,
            reference.match,
            "no planned cell has all these options together (an exclude leaves them out); name a cell the grid plans",
        )
