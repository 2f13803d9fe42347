"""A sweep file's ``[report]`` table: which plots its report draws, on which axes, over which cells.

Validated strictly with the rest of the file (core.sweep.spec), so a misspelt axis fails at load,
naming the field, the value and the axes allowed, before any cell runs. The report reads the table
back from the stored sweep (``SweepRecord.spec["report"]``), validated again there without the grid.

Axis names are the grid's options (``precision``, ``workload_options.hidden_width``) or the derived
axes in :data:`DERIVED_AXES`, which every cell has whatever the grid sets.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, WrapValidator, model_validator

from core.base.errors import did_you_mean
from core.base.roofs import parse_roofs_option

# The axes every cell has, with what they are (the report's axis labels say the same).
DERIVED_AXES: dict[str, str] = {
    "global_batch": "global batch (samples per weight update: micro-batch x gradient accumulation x replicas)",
    "global_batch_tokens": "global batch in tokens (global batch x the workload's tokens per sample)",
    "micro_batch_size": "micro-batch size (samples per device per micro-step)",
    "gradient_accumulation": "gradient accumulation (micro-steps per update)",
    "replicas": "replicas (devices in data parallel)",
    "devices": "devices (replicas x devices per replica)",
}
# The report's standard parts, by the name a [report] table's `plots` gives them.
PARTS = ("throughput", "energy", "scaling", "mfu", "roofline", "heatmaps", "pareto", "power", "latency")
Part = Literal["throughput", "energy", "scaling", "mfu", "roofline", "heatmaps", "pareto", "power", "latency"]
Measure = Literal["throughput", "tokens_per_second", "flops", "mfu", "samples_per_wh", "p90_latency"]
Normalisation = Literal["mfu", "map-best", "group-best"]
DEFAULT_MAX_HEATMAPS = 8  # default maps per sweep and measure: beyond these the report says which were left out

_Scalar = bool | int | float | str
FilterValue = _Scalar | list[_Scalar]

# The grid's options and their values while a sweep file is validated; None where the table is read
# on its own (from the database), when names are checked against the cells instead.
_GRID_AXES: ContextVar[dict[str, list[Any]] | None] = ContextVar("_GRID_AXES", default=None)


def _grid_values(grid: dict[str, Any]) -> Iterator[tuple[str, list[Any]]]:
    for name, value in grid.items():
        if name in ("workload_options", "accelerator_options") and isinstance(value, dict):
            yield from (
                (f"{name}.{key}", inner if isinstance(inner, list) else [inner]) for key, inner in value.items()
            )
        else:
            yield name, value if isinstance(value, list) else [value]


def _known_axis(name: str) -> str:
    grid = _GRID_AXES.get()
    if grid is not None and name not in grid and name not in DERIVED_AXES:
        raise ValueError(
            "not an axis of this sweep; allowed: the grid's options ("
            + ", ".join(sorted(grid))
            + ") or a derived axis ("
            + ", ".join(DERIVED_AXES)
            + ")"
        )
    return name


def _filter_axes(filters: dict[str, FilterValue]) -> dict[str, FilterValue]:
    for name, value in filters.items():
        try:
            _known_axis(name)
        except ValueError as error:
            raise ValueError(f"{name!r}: {error}") from None
        if isinstance(value, list) and not value:
            raise ValueError(f"{name}: an empty list keeps no cell; give at least one value")
        _filter_values_in_grid(name, value)
    return filters


def _filter_values_in_grid(name: str, value: FilterValue) -> None:
    """A filter on a grid option keeps cells of values the grid gives it, compared as the report
    compares them (a boolean is not a number): ``micro_batch_size = true`` kept no cell, in silence."""
    from core.sweep.reference import same_value
    from core.sweep.spec import canonical_value  # imports this module: here, not at import time

    grid = _GRID_AXES.get()
    if grid is None or name not in grid:
        return  # read back from a database, or a derived axis (global_batch, devices)
    spellings = [canonical_value(name, known) for known in grid[name]]
    for item in value if isinstance(value, list) else [value]:
        if not any(same_value(canonical_value(name, item), known) for known in spellings):
            kinds = {isinstance(known, bool) for known in grid[name] if isinstance(known, (int, float))}
            hint = (
                " (a boolean is not a number)"
                if isinstance(item, (int, float)) and kinds and isinstance(item, bool) not in kinds
                else ""
            )
            given = ", ".join(json.dumps(known)[:40] for known in grid[name][:20])
            raise ValueError(f"{name} = {json.dumps(item)[:80]}: no cell has this value{hint}; the grid gives: {given}")


AxisName = Annotated[str, Field(min_length=1, max_length=200), AfterValidator(_known_axis)]


def _roofs_choice(text: str) -> str:
    parse_roofs_option(text)  # ValueError naming what is allowed
    return text


RoofsChoice = Annotated[str, Field(min_length=1, max_length=300), AfterValidator(_roofs_choice)]
Filter = Annotated[dict[str, FilterValue], AfterValidator(_filter_axes)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        # Named here, not by the sweep file's error translator, which lists the file's own settings.
        if isinstance(data, dict):
            for key in data:
                if key not in cls.model_fields:
                    hint = did_you_mean(str(key), cls.model_fields)
                    raise ValueError(
                        f"unknown setting {str(key)[:80]!r}{hint}; {_TABLES[cls.__name__]} has: "
                        + ", ".join(cls.model_fields)
                    )
        return data


_TABLES = {
    "ReportSpec": "a [report] table",
    "FigureSpec": "a [[report.figures]] entry",
    "HeatmapSpec": "a [[report.heatmaps]] entry",
}


class FigureSpec(_Strict):
    """One line plot: ``y`` against ``x``, a line per ``series`` value, a panel per ``facet`` value."""

    title: str | None = Field(default=None, max_length=200, description="the figure's heading")
    y: Measure = Field(default="throughput", description="the figure drawn up the y axis")
    x: AxisName | None = Field(default=None, description="the x axis; default: the batch axis the sweep varies")
    series: list[AxisName] | None = Field(
        default=None, description="one line per value of these; default: the other options that vary"
    )
    facet: AxisName | None = Field(default=None, description="one panel per value of this option")
    filter: Filter = Field(default_factory=dict, description="the cells drawn: option = value or list of values")

    @model_validator(mode="after")
    def _distinct(self) -> FigureSpec:
        taken = [name for name in (self.x, self.facet) if name is not None]
        for name in self.series or []:
            if name in taken:
                raise ValueError(f"series names {name!r}, already the figure's x or facet: each option on one axis")
        if self.x is not None and self.x == self.facet:
            raise ValueError(f"x and facet are both {self.x!r}: each option on one axis")
        return self


class HeatmapSpec(_Strict):
    """Maps of ``y`` (rows) by ``x`` (columns), one per value of ``facet``, normalised as ``normalise`` says."""

    title: str | None = Field(default=None, max_length=200, description="the maps' heading")
    x: AxisName = Field(description="the columns' option")
    y: AxisName = Field(description="the rows' option")
    facet: list[AxisName] | None = Field(
        default=None,
        description="one map per combination of these; options on no axis are folded (each position's best "
        "cell); default: every other option that varies",
    )
    normalise: Normalisation | None = Field(
        default=None,
        description="mfu: achieved over peak FLOP/s; map-best: each map's best cell is 100 %; group-best: each "
        "group's best (`group`, else each row) is 100 %; default: mfu where every cell has one, else map-best",
    )
    group: list[AxisName] | None = Field(
        default=None, description="with group-best: the options whose values make a group; default: each row"
    )
    filter: Filter = Field(default_factory=dict, description="the cells drawn: option = value or list of values")

    @model_validator(mode="after")
    def _consistent(self) -> HeatmapSpec:
        if self.x == self.y:
            raise ValueError(f"x and y are both {self.x!r}: a map needs two different options")
        if self.group is not None and self.normalise != "group-best":
            raise ValueError(f"group is for normalise = 'group-best', not {self.normalise!r}")
        for name in self.facet or []:
            if name in (self.x, self.y):
                raise ValueError(f"facet names {name!r}, already the map's x or y: each option on one axis")
        return self


class ReportSpec(_Strict):
    """The ``[report]`` table of a sweep file; every field optional (the report's defaults)."""

    plots: list[Part] | None = Field(
        default=None, description="the standard parts drawn (" + ", ".join(PARTS) + "); default: all"
    )
    x: AxisName | None = Field(
        default=None, description="x axis of the plots against batch; default: the batch axis the sweep varies"
    )
    series: list[AxisName] | None = Field(
        default=None, description="one line per value of these in the standard plots; default: the others varying"
    )
    filter: Filter = Field(
        default_factory=dict, description="the cells of every plot and map (tables keep all): option = value(s)"
    )
    figures: list[FigureSpec] = Field(default_factory=list, description="line plots drawn after the standard parts")
    heatmaps: list[HeatmapSpec] | None = Field(
        default=None, description="the maps drawn, each with every map it asks for; default: the report's pairs"
    )
    max_heatmaps: int = Field(
        default=DEFAULT_MAX_HEATMAPS, ge=1, le=10_000, description="the default maps drawn per measure"
    )
    roofs: RoofsChoice | None = Field(
        default=None,
        description="where the roofline's roofs come from when `core report --roofs` is auto: datasheet, machine, "
        "machine:NAME (a paper's own figures, as AI4NP's Table 1), measured or auto",
    )


def _within_grid(value: Any, handler: Any, info: ValidationInfo) -> Any:
    """Validate the table with the grid's option names (and the derived axes) as the axes allowed."""
    grid = info.data.get("grid")
    values = dict(_grid_values(grid)) if isinstance(grid, dict) else None
    token = _GRID_AXES.set(values)
    try:
        return handler(value)
    finally:
        _GRID_AXES.reset(token)


# SweepSpec's field: declared after ``grid``, whose option names it checks the axes against.
ReportField = Annotated[ReportSpec | None, WrapValidator(_within_grid)]


def read_report_spec(document: Any) -> ReportSpec | None:
    """The ``[report]`` table of a stored sweep document; None where it has none.

    :raises pydantic.ValidationError: where the stored table is not a valid one (a database written
        by another version, or edited by hand).
    """
    if not isinstance(document, dict) or document.get("report") is None:
        return None
    return ReportSpec.model_validate(document["report"])
