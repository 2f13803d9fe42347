"""Time and energy to train (GH200 Table II, CARAML's Wh per epoch): for a number of epochs under an
epoch definition, estimated from what a run measured, and measured where the run did whole epochs.

No run trains to the end, so the time to train is an estimate, and the report always says so:

    samples to train = epochs x samples per epoch
    time to train    = first step (measured, compilation included)
                       + (samples to train - the first step's samples) / steady throughput
    energy to train  = samples to train / samples per Wh of the steady window

Setup (building the model, starting the data loaders) and evaluation are not part of it. The meter
reads the steady window only, so the first step's energy is not in the energy estimate.

Measured: a run's own steps (first step, warm-up, window) whose samples are a whole number of
epochs took ``first + warm-up + window`` seconds for them; a window whose samples are whole epochs
measured their energy. Those figures are shown as measured, for the epochs the run did.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from core.base.epochs import EpochDefinition
from core.base.results import RunResult
from core.base.units import JOULES_PER_WATT_HOUR
from core.report.analysis import _short
from core.report.compare import Measure
from core.report.document import (
    Block,
    Heading,
    Paragraph,
    Table,
    Value,
    format_duration,
    format_number,
    one_line,
    shorten,
)
from core.report.tables import sample_unit
from core.storage.summary import CellSummary


@dataclass(frozen=True)
class TrainingPlan:
    """What "to train" means: ``epochs`` epochs of ``epoch_definition`` (None: each run's own)."""

    epochs: int
    epoch_definition: str | None = None

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ValueError(f"epochs must be at least 1, not {self.epochs}")
        if self.epoch_definition is not None:  # refused here, before any work; kept in its one spelling
            object.__setattr__(self, "epoch_definition", str(EpochDefinition.parse(self.epoch_definition)))

    def describe(self) -> str:
        what = "each run's own epoch definition" if self.epoch_definition is None else self.epoch_definition
        return f"{self.epochs} epoch{'s' if self.epochs != 1 else ''} ({what})"


@dataclass(frozen=True)
class TrainingFigures:
    """One repeat's figures to train under a plan; None where the run lacks what it needs."""

    samples_per_epoch: int | None
    estimate_seconds: float | None
    estimate_watt_hours: float | None
    measured_epochs: int | None  # whole epochs the run's own steps covered
    measured_seconds: float | None
    measured_window_epochs: int | None  # whole epochs the metered window covered
    measured_window_watt_hours: float | None


def samples_per_epoch(result: RunResult, plan: TrainingPlan) -> int | None:
    """Samples in one epoch of the plan's definition, as this run counts them."""
    if plan.epoch_definition is None:
        return result.samples_per_epoch
    definition = EpochDefinition.parse(plan.epoch_definition)
    if definition.kind == "dataset":
        # The dataset's size is known only where the run itself counted its epoch by the dataset.
        return result.samples_per_epoch if result.config.epoch.kind == "dataset" else None
    return definition.samples(None, result.samples_per_update, result.samples_per_host_call)


def _whole(samples: int | None, per_epoch: int) -> int | None:
    return samples // per_epoch if samples and samples % per_epoch == 0 else None


def training_figures(result: RunResult, plan: TrainingPlan) -> TrainingFigures:
    per_epoch = samples_per_epoch(result, plan)
    if not per_epoch:
        return TrainingFigures(None, None, None, None, None, None, None)
    total = plan.epochs * per_epoch
    estimate_seconds = None
    if result.throughput_per_second and result.first_step_seconds is not None:
        rest = max(0, total - result.samples_per_host_call)
        estimate_seconds = result.first_step_seconds + rest / result.throughput_per_second
    estimate_watt_hours = total / result.samples_per_watt_hour if result.samples_per_watt_hour else None
    run_samples = None
    if result.window_samples is not None:
        run_samples = result.samples_per_host_call * (1 + result.config.warmup_steps) + result.window_samples
    parts = (result.first_step_seconds, result.warmup_seconds, result.window_seconds)
    measured_epochs = _whole(run_samples, per_epoch)
    measured_seconds = sum(p for p in parts if p is not None) if None not in parts and measured_epochs else None
    window_epochs = _whole(result.window_samples, per_epoch)
    window_watt_hours = (
        result.energy_joules / JOULES_PER_WATT_HOUR if window_epochs and result.energy_joules is not None else None
    )
    return TrainingFigures(
        per_epoch,
        estimate_seconds,
        estimate_watt_hours,
        measured_epochs if measured_seconds is not None else None,
        measured_seconds,
        window_epochs if window_watt_hours is not None else None,
        window_watt_hours,
    )


_COUNTS = ("samples_per_epoch", "measured_epochs", "measured_window_epochs")


def _median(values: Sequence[Any], count: bool) -> Any:
    """The median; of a count, the lower middle value (a count of samples or epochs stays whole)."""
    present = [value for value in values if value is not None]
    if not present:
        return None
    return statistics.median_low(present) if count else statistics.median(present)


def cell_figures(cell: CellSummary, plan: TrainingPlan) -> TrainingFigures:
    """The cell's figures: the estimates from the cell's median first step, throughput and samples
    per Wh (the figures its row shows, so the row agrees with itself), the rest the median of each
    figure over the cell's successful repeats."""
    figures = [training_figures(result, plan) for result in cell.ok_results]
    names = TrainingFigures.__dataclass_fields__
    medians = TrainingFigures(*(_median([getattr(f, name) for f in figures], name in _COUNTS) for name in names))
    if medians.samples_per_epoch is None or not cell.ok_results:
        return medians
    total = plan.epochs * medians.samples_per_epoch
    first_step, throughput = cell.median("first_step_seconds"), cell.throughput_per_second
    estimate_seconds = None
    if throughput and first_step is not None:
        rest = max(0, total - cell.ok_results[0].samples_per_host_call)  # the same in every repeat of a cell
        estimate_seconds = first_step + rest / throughput
    watt_hours = total / cell.samples_per_watt_hour if cell.samples_per_watt_hour else None
    return dataclasses.replace(medians, estimate_seconds=estimate_seconds, estimate_watt_hours=watt_hours)


def estimate_seconds(cell: CellSummary, plan: TrainingPlan) -> float | None:
    return cell_figures(cell, plan).estimate_seconds


def time_to_train_measure(plan: TrainingPlan) -> Measure:
    """The comparison of estimated times to train across platforms (GH200 Table II)."""
    return Measure(
        "time_to_train_seconds",
        f"time to train {plan.epochs} epochs (s, estimate)",
        lambda cell: estimate_seconds(cell, plan),
        False,
        "faster",
        "slower",
        format_duration,
    )


def _measured_text(epochs: int | None, figure: float | None, text: Callable[[float], str]) -> Value:
    if epochs is None or figure is None:
        return Value("-")
    return Value(f"{text(figure)} for {epochs} epoch{'s' if epochs != 1 else ''}", figure)


def training_table(cells: Sequence[CellSummary], varying: Sequence[str], plan: TrainingPlan, identifier: str) -> Table:
    """One row per training cell with a figure: its options, epoch size, the estimates, what was measured."""
    columns = [(name, _short(name)) for name in varying] + [
        ("samples_per_epoch", "samples per epoch"),
        ("first_step_seconds", "first step (measured)"),
        ("throughput_per_second", f"steady throughput ({sample_unit(cells)}/s, measured)"),
        ("time_to_train_seconds", f"time to train {plan.epochs} epochs (estimate)"),
        ("energy_to_train_watt_hours", f"energy to train {plan.epochs} epochs (Wh, estimate)"),
        ("measured_seconds", "measured time (first step + warm-up + window)"),
        ("measured_window_watt_hours", "measured energy (window, Wh)"),
    ]
    rows, keys = [], []
    for cell in cells:
        figures = cell_figures(cell, plan)
        if figures.samples_per_epoch is None:
            continue
        rows.append(
            [Value(shorten(one_line(cell.option(name)))) for name in varying]
            + [
                Value(f"{figures.samples_per_epoch:,}", figures.samples_per_epoch),
                Value(format_duration(cell.median("first_step_seconds")), cell.median("first_step_seconds")),
                Value(format_number(cell.throughput_per_second), cell.throughput_per_second),
                Value(format_duration(figures.estimate_seconds), figures.estimate_seconds),
                Value(format_number(figures.estimate_watt_hours), figures.estimate_watt_hours),
                _measured_text(figures.measured_epochs, figures.measured_seconds, format_duration),
                _measured_text(figures.measured_window_epochs, figures.measured_window_watt_hours, format_number),
            ]
        )
        keys.append(cell.cell_key)
    return Table(columns=columns, rows=rows, identifier=identifier, row_keys=keys)


def training_blocks(
    title: str, cells: Sequence[CellSummary], varying: Sequence[str], plan: TrainingPlan, slug: str
) -> list[Block]:
    """A sweep's "time and energy to train" part: how it is estimated, and the table."""
    cells = [cell for cell in cells if cell.ok_results]
    table = training_table(cells, varying, plan, f"to-train-{slug}")
    heading = Heading(3, title)
    if not table.rows:
        return [
            heading,
            Paragraph(
                f"Not estimated: no successful cell knows the size of an epoch of {plan.describe()} "
                "(an epoch of 'dataset' is known only to runs that counted theirs by the dataset)."
            ),
        ]
    note = Paragraph(
        f"Estimates, not measurements, for {plan.describe()}: time = the measured first step (compilation "
        "included) + the remaining samples at the steady window's throughput; energy = the samples to train "
        "over the window's samples per Wh (the first step is not metered). Setup and evaluation are not "
        "included. Medians over each cell's successful repeats. Measured columns show what a run timed or "
        "metered itself where its own steps (or its window) covered whole epochs."
    )
    return [heading, note, table]
