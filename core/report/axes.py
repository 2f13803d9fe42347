"""The axes a report draws against: the grid's options, and the batch and device axes derived from
them (global batch in samples and in tokens, devices), as the papers draw them. Which batch axis a
sweep varies, the series beside it, and the options that move with the device count.

CARAML varies the global batch (gradient accumulation, or ``global_batch_size``) at a fixed
micro-batch; ACES Table 1 varies poprun instances with the replicas. Neither is a series of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from core.report.analysis import _BATCH, _DEVICE_OPTIONS, _short, series_label
from core.storage.summary import CellSummary
from core.sweep.report_spec import DERIVED_AXES

GLOBAL_BATCH = "global_batch"
GLOBAL_BATCH_TOKENS = "global_batch_tokens"
DEVICES = "devices"
# Options that set the global batch between them: at a fixed global batch, trading one for another
# (CARAML's derived micro-batch and accumulation) moves a point along no axis of its own.
_BATCH_PARTS = (_BATCH, "gradient_accumulation", "global_batch_size")
_AXIS_LABELS = {
    **DERIVED_AXES,
    "workload_options.hidden_width": "hidden width D_H (nodes per layer)",
    "workload_options.layers": "hidden layers l",
    "workload_options.input_width": "input width D_I (features)",
    "workload_options.output_width": "output width D_O (classes)",
}


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def global_batch(cell: CellSummary) -> int | None:
    """Samples per weight update over all replicas, as the config derives it."""
    micro = _count(cell.config.micro_batch_size)
    return None if micro is None else micro * cell.config.gradient_accumulation * cell.config.replicas


def tokens_per_sample(cell: CellSummary) -> int | None:
    """The workload's tokens in one sample, as its results recorded it; None for a workload without."""
    return next((count for result in cell.results if (count := _count(result.tokens_per_sample)) is not None), None)


def global_batch_tokens(cell: CellSummary) -> int | None:
    batch, tokens = global_batch(cell), tokens_per_sample(cell)
    return None if batch is None or tokens is None else batch * tokens


_DERIVED: dict[str, Callable[[CellSummary], Any]] = {
    GLOBAL_BATCH: global_batch,
    GLOBAL_BATCH_TOKENS: global_batch_tokens,
    DEVICES: lambda cell: cell.devices,
}


def axis_value(cell: CellSummary, name: str) -> Any:
    """The cell's value on an axis: a derived axis, else the option; None where the cell has neither."""
    derived = _DERIVED.get(name)
    if derived is not None:
        return derived(cell)
    try:
        return cell.option(name)
    except AttributeError:  # a name from a stored [report] table that these cells do not have
        return None


def position(cell: CellSummary, name: str) -> float | None:
    """The cell's place on a numeric (log) axis: a positive number, else None."""
    value = axis_value(cell, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        return None
    return float(value) if isinstance(value, float) else value


def axis_label(name: str) -> str:
    return _AXIS_LABELS.get(name, _short(name))


def values_of(cells: Sequence[CellSummary], name: str) -> set[str]:
    return {repr(axis_value(cell, name)) for cell in cells}


def varies(cells: Sequence[CellSummary], name: str) -> bool:
    return len(values_of(cells, name)) > 1


def default_x(cells: Sequence[CellSummary]) -> str:
    """The batch axis the sweep varies: the global batch where the options that set it beside the
    micro-batch vary (gradient accumulation, ``global_batch_size``: CARAML's sweeps), else the
    micro-batch size (replicas alone make a scaling series, not a batch axis)."""
    if any(varies(cells, name) for name in ("gradient_accumulation", "global_batch_size")):
        return GLOBAL_BATCH
    return _BATCH


def batch_varies(cells: Sequence[CellSummary], x: str) -> bool:
    return varies(cells, x)


def _one_point_each(cells: Sequence[CellSummary], names: Sequence[str], x: str) -> bool:
    seen = set()
    for cell in cells:
        key = (series_label(cell, names), repr(axis_value(cell, x)))
        if key in seen:
            return False
        seen.add(key)
    return True


def series_names(cells: Sequence[CellSummary], varying: Sequence[str], x: str) -> list[str]:
    """The options that make the series of a plot against ``x``: the others that vary, less those
    that only make up ``x`` (the micro-batch and accumulation of a global batch, the replicas of a
    device count) where each series then still has one cell per x value."""
    names = [name for name in varying if name != x]
    parts = {GLOBAL_BATCH: _BATCH_PARTS, GLOBAL_BATCH_TOKENS: _BATCH_PARTS, DEVICES: _DEVICE_OPTIONS}.get(x, ())
    trimmed = [name for name in names if name not in parts]
    return trimmed if trimmed != names and _one_point_each(cells, trimmed, x) else names


def keep(cells: Sequence[CellSummary], filters: dict[str, Any]) -> list[CellSummary]:
    """The cells whose options have the values a [report] filter names (a list: any of them)."""

    def matches(cell: CellSummary) -> bool:
        for name, wanted in filters.items():
            allowed = wanted if isinstance(wanted, list) else [wanted]
            value = axis_value(cell, name)
            if not any(_same(value, item) for item in allowed):
                return False
        return True

    return [cell for cell in cells if matches(cell)] if filters else list(cells)


def _same(value: Any, item: Any) -> bool:
    """Equal as option values: 8 and 8.0 are, true and 1 are not."""
    if isinstance(value, bool) or isinstance(item, bool):
        return value is item
    return bool(value == item)


def best_per_place(
    cells: Sequence[CellSummary],
    place: Callable[[CellSummary], tuple[Any, ...]],
    figure_of: Callable[[CellSummary], Any],
) -> list[CellSummary]:
    """One cell per place: the one with the largest figure (a cell with none only where none has)."""
    chosen: dict[tuple[Any, ...], CellSummary] = {}
    for cell in cells:
        key = place(cell)
        current = chosen.get(key)
        if current is None or _better(figure_of(cell), figure_of(current)):
            chosen[key] = cell
    return list(chosen.values())


def _better(value: Any, than: Any) -> bool:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
        return False
    return not isinstance(than, (int, float)) or than != than or value > than
