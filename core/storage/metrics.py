"""Each figure of a result declared once: what it is, its unit, how a cell of repeats summarises it,
and where it is shown. The consumers are generated from :data:`METRICS`, so none can drift:

- the flat export (CSV, Parquet, DataFrame): :data:`EXPORT_COLUMNS` and :func:`flat_record`,
  one column per exported entry, in declaration order;
- a sweep cell's summary over its repeats (``CellSummary.figure``), by :class:`Summary`;
- the report's cells tables (``core.report.tables``) and the ``core results`` text table, from
  each entry's :class:`Reported`;
- the text ``core run`` prints (``core.cli.format_result``), line by line from :data:`PRINTED_LINES`
  and each entry's :class:`Printed`.

Adding a figure is one entry here (and, for a measured one, its field on ``RunResult``). A test
(tests/test_metrics.py) fails when a scalar field of ``RunResult``, computed ones included, reaches
no export column, and when an entry reads a field that does not exist.

The export's first columns keep the order and names they had in 0.2.0 (readers by position and
by name keep working); figures added since come after ``run_id``.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from core.base.files import finite_json
from core.base.results import RunResult

if TYPE_CHECKING:
    from core.storage.store import StoredRun


class Summary(str, Enum):
    """How a sweep cell summarises one figure over its repeats."""

    median_spread = "median and spread"  # median over the successful repeats, and (max - min) / median
    median = "median"  # over the successful repeats that have the figure
    total = "sum"  # over every recorded repeat that has it (time spent on the cell)
    first = "first"  # the same in every repeat (a unit, a datasheet source): the first successful one's
    none = "none"  # not summarised: the row's own identity or state
    # A figure to a target quality: MLPerf Training's olympic mean over the repeats that trained to it
    # (core.storage.summary.olympic_mean: the fastest and slowest dropped, a run that missed the target
    # the slowest); the report shows its median, min, max and how many repeats reached it beside it.
    olympic_mean = "olympic mean"
    holds = "holds"  # a yes/no figure: the successful repeats where it holds (the target reached)


# Where the figure is read. ``row.NAME``: the database row (sweep, cell, repeat, run id); anything
# else: a dotted path into the RunResult ("config.precision", "loadgen.valid").
ROW_PREFIX = "row."

# The tables a figure can be reported in.
TRAINING = "training"  # the report's cells table of training cells
INFERENCE = "inference"  # the report's cells table of inference cells
RESULTS = "results"  # the plain-text table of cells `core results` prints


@dataclass(frozen=True)
class Reported:
    """Where a figure appears as a column of a cells table (its median, or as its summary says).

    :param tables: of TRAINING, INFERENCE, RESULTS.
    :param header: the report's column header; ``{unit}`` is the cells' sample unit ("images"),
        ``{sample}`` one of them ("image").
    :param short: the header in ``core results``' text table (default: ``header``).
    :param key: the column's key in the report's tables (default: the figure's name).
    :param scale: shown multiplied by this (1e-12: TFLOP/s; 1e3: ms).
    :param percent: shown as a percentage.
    :param optional: shown only where some cell has the figure (token and epoch figures).
    """

    tables: frozenset[str]
    header: str
    short: str | None = None
    key: str | None = None
    scale: float = 1.0
    percent: bool = False
    optional: bool = False


@dataclass(frozen=True)
class Printed:
    """How ``core run`` prints a figure: one part of one line of its text.

    :param line: the key of the line in :data:`PRINTED_LINES`.
    :param text: the part, ``str.format`` with ``value`` (scaled) and the line's context: ``unit``
        (the sample unit, "images"), ``sample`` ("image"), ``passes`` ("updates"; "batches" for
        inference), ``devices`` (how many), ``method`` (" (counter)") and ``epoch`` (its definition).
    :param aside: in the parentheses after the line's main parts.
    :param attach: joined to the part before it with a space, not a comma.
    :param missing: the part where the figure is missing; None leaves it out.
    :param shown: a further condition on the result for printing it.
    :param scale: the value is multiplied by this before formatting.
    """

    line: str
    text: str
    aside: bool = False
    attach: bool = False
    missing: str | None = None
    shown: Callable[[RunResult], bool] | None = None
    scale: float = 1.0


@dataclass(frozen=True)
class PrintedLine:
    """One line of ``core run``'s text, in order. A line without figures of its own (``structural``)
    is written by the CLI from the result's structure (LoadGen's verdict, the nodes, the error).

    :param label: the line's label, or a function of the result choosing it.
    :param shown: printed only where this holds.
    :param always: printed even where none of its figures has a value (their ``missing`` text shown).
    :param note: a second line, indented under the first.
    """

    key: str
    label: str | Callable[[RunResult], str] = ""
    shown: Callable[[RunResult], bool] | None = None
    always: bool = False
    note: str | None = None
    structural: bool = False


@dataclass(frozen=True)
class Metric:
    """One figure of a run (or one column of its row): declared once.

    :param name: its name: the export column, the report's column key, ``CellSummary.figure(name)``.
    :param source: where it is read: a dotted path into the RunResult, or ``row.NAME`` for the
        database row's own (sweep, cell, repeat).
    :param unit: the unit of the value as stored ("samples/s", "J", "FLOP/s"; "" for a count or text).
    :param description: what it is, in a few words.
    :param summary: how a cell summarises it over its repeats.
    :param export: how the value is written in a flat export (default: enums as their value, times
        in ISO 8601, anything else as it is).
    :param exported: whether it is a column of the flat export.
    :param reading: turns what ``source`` holds into the figure (the last point of a quality curve);
        None: the value there is the figure.
    """

    name: str
    source: str
    unit: str = ""
    description: str = ""
    summary: Summary = Summary.none
    export: Callable[[Any], Any] | None = None
    exported: bool = True
    reported: Reported | None = None
    printed: tuple[Printed, ...] = field(default=())
    reading: Callable[[Any], Any] | None = None

    def value(self, result: RunResult) -> Any:
        """The figure as the result holds it (a row's own column: None, the result does not know it)."""
        if self.source.startswith(ROW_PREFIX):
            return None
        return self._read(read_path(result, self.source))

    def value_of_run(self, run: StoredRun) -> Any:
        """The figure of a stored run, its row's columns included."""
        if self.source.startswith(ROW_PREFIX):
            return getattr(run, self.source.removeprefix(ROW_PREFIX))
        return self._read(read_path(run.result, self.source))

    def _read(self, held: Any) -> Any:
        return self.reading(held) if self.reading is not None and held is not None else held

    def exported_value(self, run: StoredRun) -> Any:
        value = self.value_of_run(run)
        return self.export(value) if self.export is not None else plain(value)


def read_path(result: Any, path: str) -> Any:
    """``result.a.b`` for ``path`` "a.b"; None where a step on the way is None."""
    value = result
    for name in path.split("."):
        if value is None:
            return None
        value = getattr(value, name)
    return value


def plain(value: Any) -> Any:
    """A value as a flat export writes it: an enum as its value, a time in ISO 8601."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def _json_object(value: Any) -> str:
    """A mapping as sorted JSON text (``{}`` when empty): options, which always exist."""
    return json.dumps(finite_json(dict(value or {})), sort_keys=True)


def _json_or_none(value: Any) -> str | None:
    """A mapping as sorted JSON text, or None when it is empty: figures a meter or datasheet may lack."""
    return json.dumps(finite_json(dict(value)), sort_keys=True) if value else None


def _hostnames(value: Any) -> str | None:
    """A multi-node run's hosts (``result.nodes``), comma-separated by node rank; None for one node."""
    return ",".join(node.hostname for node in value) if value else None


def _count(value: Any) -> int:
    return len(value or ())


def _last_value(curve: Any) -> float | None:
    """The metric at a quality curve's last evaluation: where training ended."""
    return curve[-1].value if curve else None


def _to_target(name: str, unit: str, description: str, header: str, short: str) -> Metric:
    """A figure to the target quality: each run's own, MLPerf's olympic mean over a cell's repeats."""
    return Metric(
        name,
        f"to_target.{name}",
        unit,
        description,
        Summary.olympic_mean,
        reported=Reported(frozenset({RESULTS}), header, short=short, optional=True),
    )


def _first_epoch(seconds: Any) -> float | None:
    """The first whole epoch's training time (``TargetOutcome.epoch_seconds``): None before one ended."""
    return seconds[0] if seconds else None


def _later_epoch(seconds: Any) -> float | None:
    """The median of the whole epochs after the first: the steady epoch (None with fewer than two)."""
    return statistics.median(seconds[1:]) if len(seconds or ()) >= 2 else None


def _epoch_rate(outcome: Any, epoch: Callable[[Any], float | None]) -> float | None:
    """An epoch's samples (its whole global batches) per second of its training time."""
    seconds = epoch(outcome.epoch_seconds)
    if not seconds or outcome.epoch_samples is None:
        return None
    return float(outcome.epoch_samples / seconds)


def _several_devices(result: RunResult) -> bool:
    return len(result.devices) >= 2


def _throughput_measured(result: RunResult) -> bool:
    return result.throughput_per_second is not None


def _latency_label(result: RunResult) -> str:
    if result.config.mode != "inference":
        return "step time"
    return "batch latency" if result.loadgen is None else "query latency"


def _latency_shown(result: RunResult) -> bool:
    """Offline sends LoadGen one query: it has no latency to print."""
    return _throughput_measured(result) and (result.loadgen is None or result.loadgen.scenario != "offline")


def _epoch_estimated(result: RunResult) -> bool:
    return result.samples_per_epoch is not None and result.epoch_seconds is not None


def _window_calls_differ(result: RunResult) -> bool:
    return result.window_steps != result.window_updates


def _no_energy(result: RunResult) -> bool:
    return result.energy_joules is None


# The lines of `core run`'s text, in order.
PRINTED_LINES: tuple[PrintedLine, ...] = (
    PrintedLine("throughput", "throughput", shown=_throughput_measured),
    PrintedLine("tokens", "tokens", shown=_throughput_measured),
    PrintedLine("latency", _latency_label, shown=_latency_shown, always=True),
    PrintedLine("loadgen", structural=True),
    # A run trained to a target: reached or not, time, energy, epochs, where training ended, the curve.
    PrintedLine("to_target", structural=True),
    PrintedLine("phases", "phases", always=True),
    PrintedLine("data wait", "data wait"),
    PrintedLine("achieved", "achieved"),
    PrintedLine("roofline", "roofline"),
    PrintedLine("communication", "communication", note="(one update profiled after the window, outside it)"),
    PrintedLine("accuracy", "top-1 accuracy"),
    # Always: a run without energy says why, or that it was not measured (never "unavailable: None").
    PrintedLine("energy", "energy", always=True),
    PrintedLine("components", structural=True),
    PrintedLine("meters", structural=True),
    PrintedLine("efficiency", "efficiency"),
    PrintedLine("nodes", structural=True),
    PrintedLine("slurm", "slurm"),
    PrintedLine("epoch", "epoch", shown=_epoch_estimated, note="(estimate, extrapolated from the timed window)"),
    PrintedLine("error", structural=True),
    PrintedLine("warnings", structural=True),
)

_BOTH = frozenset({TRAINING, INFERENCE})
_MILLISECONDS = 1e3


def _latency(name: str, percentile: str) -> Metric:
    return Metric(
        name,
        name,
        "s",
        f"{percentile} of the window's step times (an inference run's batch or query latency)",
        Summary.median,
        reported=Reported(
            frozenset({INFERENCE}),
            f"latency {percentile} (ms, median)",
            key=f"latency_{percentile}_milliseconds",
            scale=_MILLISECONDS,
        ),
        printed=(
            Printed(
                "latency",
                f"{'median' if percentile == 'p50' else percentile} {{value:.4g}} ms",
                missing=f"{'median' if percentile == 'p50' else percentile} n/a",
                scale=_MILLISECONDS,
            ),
        ),
    )


def _steady(result: RunResult) -> bool:
    """A run of the steady phases (first step, warm-up, window), not one trained to a target."""
    return result.to_target is None


def _trained_to_target(result: RunResult) -> bool:
    return result.to_target is not None


def _phase(name: str, words: str, shown: Callable[[RunResult], bool] | None = None) -> Metric:
    return Metric(
        name,
        name,
        "s",
        f"the {words} phase",
        Summary.median,
        printed=(Printed("phases", f"{words} {{value:.4g}} s", missing=f"{words} n/a", shown=shown),),
    )


def _row(name: str, description: str, summary: Summary = Summary.none) -> Metric:
    return Metric(name, ROW_PREFIX + name, description=description, summary=summary)


def _option(name: str, description: str = "") -> Metric:
    """A run option (RunConfig field): the same in every repeat of a cell."""
    return Metric(name, f"config.{name}", description=description or f"config.{name}", summary=Summary.first)


METRICS: tuple[Metric, ...] = (
    # --- where the run belongs, and how it went
    _row("sweep", "the sweep's name; empty for a single run (core run --database)"),
    _row("cell_key", "the cell's canonical JSON options; empty for a single run"),
    _row("cell_label", "the cell's label; a single run's: its workload, accelerator and options"),
    _row("repeat", "the repeat, from 0; empty for a single run"),
    Metric("status", "status.state", description="ok, error, oom, non_finite_loss, killed, timeout"),
    Metric("status_phase", "status.phase", description="the phase a fault happened in"),
    Metric("status_message", "status.message", description="the fault's message"),
    # --- what ran
    Metric("workload", "workload", summary=Summary.first),
    Metric("accelerator", "accelerator", summary=Summary.first),
    Metric("framework", "framework", summary=Summary.first),
    Metric("mode", "mode", description="train or inference", summary=Summary.first),
    _option("scenario"),
    _option("precision"),
    _option("micro_batch_size"),
    _option("gradient_accumulation"),
    _option("replicas"),
    _option("devices_per_replica"),
    _option("device_iterations"),
    _option("compile"),
    _option("steps"),
    _option("warmup_steps"),
    Metric(
        "samples_per_update",
        "samples_per_update",
        "samples",
        "micro-batch x gradient accumulation x replicas",
        Summary.first,
    ),
    Metric("world_size", "world_size", "processes", "processes that trained together", Summary.first),
    # --- the phases and the window
    _phase("setup_seconds", "setup"),
    # A run to a target has no first step nor warm-up of its own: its clock holds them (the phases
    # line says its training instead, below).
    _phase("first_step_seconds", "first step", shown=_steady),
    _phase("warmup_seconds", "warm-up", shown=_steady),
    Metric(
        "window_seconds",
        "window_seconds",
        "s",
        "the steady, timed window",
        Summary.median,
        printed=(Printed("throughput", "window {value:.4g} s", aside=True),),
    ),
    Metric(
        "throughput_per_second",
        "throughput_per_second",
        "samples/s",
        "window samples / window seconds",
        Summary.median_spread,
        reported=Reported(_BOTH | {RESULTS}, "throughput ({unit}/s, median)", short="{unit}/s"),
        printed=(Printed("throughput", "{value:.6g} {unit}/s"),),
    ),
    _latency("step_seconds_median", "p50"),
    _latency("step_seconds_p90", "p90"),
    _latency("step_seconds_p99", "p99"),
    Metric("loadgen_valid", "loadgen.valid", description="LoadGen verdict (a LoadGen scenario only)"),
    Metric(
        "loadgen_samples_per_second",
        "loadgen.samples_per_second",
        "samples/s",
        "LoadGen's own throughput",
        Summary.median,
    ),
    Metric(
        "loadgen_early_stopping_latency_seconds",
        "loadgen.early_stopping_latency_seconds",
        "s",
        "single-stream: LoadGen's early-stopping estimate of the target percentile",
        Summary.median,
    ),
    Metric(
        "top1_accuracy",
        "top1_accuracy",
        "fraction",
        "inference with accuracy=true: share of the labelled samples predicted right",
        Summary.median,
        printed=(Printed("accuracy", "{value:.4%}"),),
    ),
    # --- FLOPs
    Metric("parameter_count", "parameter_count", "parameters", "the model's parameters", Summary.first),
    Metric(
        "flops_per_sample",
        "flops_per_sample",
        "FLOP",
        "FLOPs per sample of what the run does (training: forward and backward)",
        Summary.median,
        printed=(Printed("achieved", "{value:.4g} FLOP/sample", aside=True),),
    ),
    Metric(
        "flops_per_second",
        "flops_per_second",
        "FLOP/s",
        "achieved: flops_per_sample x throughput",
        Summary.median,
        # Unscaled: the report writes it in engineering notation (285.5 M on a CPU, 312 T on a GPU),
        # where TFLOP/s read 285.5 µ.
        reported=Reported(frozenset({TRAINING}), "FLOP/s (median)"),
        printed=(Printed("achieved", "{value:.4g} TFLOP/s", scale=1e-12),),
    ),
    Metric(
        "model_flops_utilization",
        "model_flops_utilization",
        "fraction",
        "flops_per_second / peak_flops_per_second",
        Summary.median,
        reported=Reported(frozenset({TRAINING}), "MFU (median)", percent=True),
        printed=(
            Printed(
                "achieved",
                "MFU {value:.2%}",
                # where FLOP/s are measured but no peak is known: say why there is no MFU (no HFU either)
                missing="no MFU (no datasheet peak for these devices at this precision)",
                shown=lambda result: result.flops_per_second is not None,
            ),
        ),
    ),
    # --- energy over the span config.energy_scope names (the window by default)
    Metric(
        "energy_joules",
        "energy_joules",
        "J",
        "energy over the scope's span, every device measured",
        Summary.median,
        reported=Reported(frozenset({TRAINING}), "energy (J, median)"),
        printed=(Printed("energy", "{value:.4g} J"),),
    ),
    Metric(
        "energy_watt_hours",
        "energy_watt_hours",
        "Wh",
        "energy_joules in Wh",
        Summary.median,
        reported=Reported(frozenset({TRAINING, RESULTS}), "energy (Wh, median)", short="energy Wh"),
        printed=(Printed("energy", "= {value:.4g} Wh over {span}{method}", attach=True),),
    ),
    Metric("device_count", "devices", "devices", "devices the run used", Summary.first, export=_count),
    Metric(
        "energy_joules_per_device",
        "energy_joules_per_device",
        "J",
        "the span's energy divided evenly over the devices",
        Summary.median,
    ),
    Metric(
        "energy_watt_hours_per_device",
        "energy_watt_hours_per_device",
        "Wh",
        "energy_joules_per_device in Wh",
        Summary.median,
        reported=Reported(frozenset({TRAINING}), "energy per device (Wh, median)"),
        printed=(Printed("energy", "{value:.4g} Wh per device ({devices} devices)", shown=_several_devices),),
    ),
    Metric(
        "energy_components_watt_hours",
        "energy.components_watt_hours",
        "Wh",
        "per device or zone, as the meter reads them (JSON text)",
        export=_json_or_none,
    ),
    Metric(
        "samples_per_watt_hour",
        "samples_per_watt_hour",
        "samples/Wh",
        "the span's samples per Wh",
        Summary.median,
        reported=Reported(_BOTH | {RESULTS}, "{unit}/Wh (median)", short="{unit}/Wh"),
        printed=(Printed("efficiency", "{value:.4g} {unit}/Wh"),),
    ),
    Metric(
        "energy_joules_per_sample",
        "energy_joules_per_sample",
        "J/sample",
        "the span's energy over its samples",
        Summary.median,
        reported=Reported(frozenset({INFERENCE}), "energy per {sample} (J, median)"),
        printed=(Printed("efficiency", "{value:.4g} J per {sample}", aside=True),),
    ),
    Metric("sample_unit", "sample_unit", description="what one sample is: images, sequences", summary=Summary.first),
    Metric(
        "tokens_per_sample",
        "tokens_per_sample",
        "tokens",
        "tokens in one sample (language models)",
        Summary.first,
        printed=(Printed("tokens", "{value} tokens per {sample}", aside=True),),
    ),
    Metric(
        "tokens_per_second",
        "tokens_per_second",
        "tokens/s",
        "throughput x tokens_per_sample",
        Summary.median,
        reported=Reported(frozenset({TRAINING}), "tokens/s (median)", optional=True),
        printed=(Printed("tokens", "{value:.6g} tokens/s"),),
    ),
    Metric(
        "tokens_per_watt_hour",
        "tokens_per_watt_hour",
        "tokens/Wh",
        "samples_per_watt_hour x tokens_per_sample",
        Summary.median,
        reported=Reported(frozenset({TRAINING}), "tokens/Wh (median)", optional=True),
        printed=(Printed("efficiency", "{value:.4g} tokens/Wh"),),
    ),
    # --- epochs (estimates, extrapolated from the window)
    _option("epoch_definition", "what one epoch is (dataset, samples:N, global-batches:N, host-calls:N)"),
    Metric("samples_per_epoch", "samples_per_epoch", "samples", "samples in one epoch as defined", Summary.first),
    Metric(
        "epoch_seconds",
        "epoch_seconds",
        "s",
        "estimate: samples_per_epoch / throughput",
        Summary.median,
        reported=Reported(frozenset({INFERENCE}), "time per epoch (s, estimate, median)", optional=True),
        printed=(Printed("epoch", "{epoch}: {value:.4g} s"),),
    ),
    Metric(
        "energy_joules_per_epoch",
        "energy_joules_per_epoch",
        "J",
        "estimate: the window's energy per sample x samples_per_epoch",
        Summary.median,
        printed=(Printed("epoch", "{value:.4g} J"),),
    ),
    Metric(
        "energy_watt_hours_per_epoch",
        "energy_watt_hours_per_epoch",
        "Wh",
        "estimate: energy_joules_per_epoch in Wh",
        Summary.median,
        reported=Reported(
            frozenset({TRAINING, RESULTS}),
            "energy per epoch (Wh, estimate, median)",
            short="epoch Wh (estimate)",
            optional=True,
        ),
        printed=(Printed("epoch", "= {value:.4g} Wh", attach=True),),
    ),
    Metric(
        "energy_joules_per_device_per_epoch",
        "energy_joules_per_device_per_epoch",
        "J",
        "estimate: one epoch's energy divided over the devices",
        Summary.median,
    ),
    Metric(
        "energy_watt_hours_per_device_per_epoch",
        "energy_watt_hours_per_device_per_epoch",
        "Wh",
        "estimate: energy_joules_per_device_per_epoch in Wh",
        Summary.median,
        printed=(Printed("epoch", "{value:.4g} Wh per device ({devices} devices)", shown=_several_devices),),
    ),
    Metric(
        "energy_unavailable_reason",
        "energy_unavailable_reason",
        description="why there is no energy figure",
        summary=Summary.first,
        printed=(Printed("energy", "unavailable: {value}", missing="not measured", shown=_no_energy),),
    ),
    Metric(
        "workload_options",
        "config.workload_options",
        description="the workload's options (JSON text)",
        export=_json_object,
    ),
    Metric(
        "accelerator_options",
        "config.accelerator_options",
        description="the accelerator's options (JSON text)",
        export=_json_object,
    ),
    Metric("hostname", "environment.hostname", description="the host the run was on (rank 0's)"),
    Metric("started_at", "started_at", description="when the run started (ISO 8601, UTC)"),
    _row("process_seconds", "the run's process, start to exit (a sweep's run)", Summary.total),
    _row("run_id", "the row's id in the database"),
    # --- added in 0.3: every other scalar figure of the result
    Metric("schema_version", "schema_version", description="the result document's layout"),
    Metric("status_error_type", "status.error_type", description="the exception's type of a fault"),
    _option("nodes", "nodes the run spanned"),
    Metric(
        "samples_per_host_call",
        "samples_per_host_call",
        "samples",
        "samples_per_update x device_iterations",
        Summary.first,
    ),
    Metric(
        "window_updates",
        "window_updates",
        "updates",
        "weight updates (inference: batches) in the window",
        Summary.median,
        printed=(Printed("throughput", "{value} {passes}", aside=True),),
    ),
    Metric(
        "window_steps",
        "window_steps",
        "host calls",
        "host calls in the window",
        Summary.median,
        printed=(Printed("throughput", "in {value} host calls", aside=True, attach=True, shown=_window_calls_differ),),
    ),
    Metric("window_samples", "window_samples", "samples", "samples in the window", Summary.median),
    Metric(
        "data_wait_seconds",
        "data_wait_seconds",
        "s",
        "window time the loop spent waiting for input data",
        Summary.median,
        printed=(Printed("data wait", "{value:.4g} s", aside=True),),
    ),
    Metric(
        "data_wait_fraction",
        "data_wait_fraction",
        "fraction",
        "data_wait_seconds / window_seconds",
        Summary.median,
        printed=(Printed("data wait", "{value:.1%} of the window"),),
    ),
    Metric(
        "accuracy_samples",
        "accuracy_samples",
        "samples",
        "labelled samples top1_accuracy counts",
        Summary.median,
        printed=(Printed("accuracy", "of {value} labelled {unit}", attach=True),),
    ),
    Metric(
        "peak_flops_per_second",
        "peak_flops_per_second",
        "FLOP/s",
        "sum of the datasheet peaks of the devices used, at the run's precision",
        Summary.median,
    ),
    Metric("peak_flops_source", "peak_flops_source", description="where the peak comes from", summary=Summary.first),
    Metric(
        "memory_bytes_per_sample",
        "memory_bytes_per_sample",
        "bytes",
        "bytes one device moves to and from its memory per sample (the workload's count)",
        Summary.median,
    ),
    Metric(
        "arithmetic_intensity",
        "arithmetic_intensity",
        "FLOP/byte",
        "flops_per_sample / memory_bytes_per_sample: the roofline's x axis",
        Summary.median,
        printed=(Printed("roofline", "intensity {value:.4g} FLOP/byte"),),
    ),
    Metric(
        "memory_bandwidth_bytes_per_second",
        "memory_bandwidth_bytes_per_second",
        "bytes/s",
        "sum of the datasheet memory bandwidths of the devices used",
        Summary.median,
        printed=(Printed("roofline", "memory {value:.4g} GB/s", scale=1e-9),),
    ),
    Metric(
        "memory_bandwidth_source",
        "memory_bandwidth_source",
        description="where the bandwidth comes from",
        summary=Summary.first,
    ),
    Metric(
        "memory_kind",
        "memory_kind",
        description="what the bandwidth is of: HBM3, on-chip SRAM",
        summary=Summary.first,
        printed=(Printed("roofline", "{value}", aside=True),),
    ),
    Metric(
        "cache_bandwidths_bytes_per_second",
        "cache_bandwidths_bytes_per_second",
        "bytes/s",
        "summed datasheet cache bandwidths by cache (JSON text)",
        export=_json_or_none,
    ),
    Metric("energy_method", "energy.method", description="counter or sampled", summary=Summary.first),
    # --- energy scopes (schema 1.8)
    _option("duration_seconds", "a window of about this many seconds (null: steps alone)"),
    _option("energy_scope", "the span the energy covers: window (default), steps or run"),
    Metric("energy_seconds", "energy_seconds", "s", "the span the energy covers", Summary.median),
    Metric("energy_samples", "energy_samples", "samples", "samples processed in that span", Summary.median),
    Metric(
        "first_epoch_seconds",
        "first_epoch_seconds",
        "s",
        "estimate: a first epoch, compilation included (the first step, then the window's pace)",
        Summary.median,
    ),
    Metric(
        "first_epoch_throughput_per_second",
        "first_epoch_throughput_per_second",
        "samples/s",
        "estimate: samples_per_epoch / first_epoch_seconds (ACES Table 1's 1st epoch)",
        Summary.median,
    ),
    Metric(
        "window_energy_joules",
        "window_energy_joules",
        "J",
        "with scope steps or run: the window's own energy",
        Summary.median,
    ),
    # --- the host's load over the window (schema 1.10): a busy host widens a cell's spread
    Metric("host_cpu_count", "host_load.cpu_count", "CPUs", "the host's logical CPUs", Summary.first),
    Metric(
        "host_load_average_start",
        "host_load.load_average_start",
        description="the host's 1-minute load average at the window's start",
        summary=Summary.median,
    ),
    Metric(
        "host_load_average_end",
        "host_load.load_average_end",
        description="the host's 1-minute load average at the window's end",
        summary=Summary.median,
    ),
    Metric(
        "host_steal_fraction",
        "host_load.steal_fraction",
        "fraction",
        "share of the CPU time over the window a hypervisor gave to other guests",
        Summary.median,
    ),
    # --- where the run ran (schema 1.11): the Slurm job, and a multi-node run's hosts
    Metric(
        "slurm_job_id",
        "slurm.job_id",
        description="the Slurm job the run ran in (SLURM_JOB_ID)",
        printed=(Printed("slurm", "job {value}"),),
    ),
    Metric(
        "slurm_array_job_id",
        "slurm.array_job_id",
        description="the job array it was a task of (SLURM_ARRAY_JOB_ID)",
        printed=(Printed("slurm", "array {value}"),),
    ),
    Metric(
        "slurm_array_task_id",
        "slurm.array_task_id",
        description="its index in that array (SLURM_ARRAY_TASK_ID)",
        printed=(Printed("slurm", "task {value}", attach=True),),
    ),
    Metric(
        "slurm_nodelist",
        "slurm.nodelist",
        description="the job's nodes, as Slurm compresses them (SLURM_JOB_NODELIST)",
        printed=(Printed("slurm", "on {value}"),),
    ),
    Metric(
        "slurm_partition",
        "slurm.partition",
        description="the job's partition (SLURM_JOB_PARTITION)",
        printed=(Printed("slurm", "partition {value}"),),
    ),
    Metric(
        "node_hostnames",
        "nodes",
        description="a multi-node run's hosts, by node rank, comma-separated",
        export=_hostnames,
    ),
    # --- training to a target quality (schema 1.12): empty for a run without config.target
    Metric(
        "target_metric", "to_target.metric", description="what the target is of: top1, loss...", summary=Summary.first
    ),
    Metric("target_value", "to_target.target", description="the value to reach", summary=Summary.first),
    Metric(
        "target_higher_is_better",
        "to_target.higher_is_better",
        description="true: reached at value >= target; false: at value <= target",
        summary=Summary.first,
    ),
    Metric(
        "target_reached",
        "to_target.reached",
        description="whether the run reached its target (a cell: how many repeats did)",
        summary=Summary.holds,
        reported=Reported(frozenset({RESULTS}), "reached", optional=True),
    ),
    Metric(
        "target_stopped_by", "to_target.stopped_by", description="what ended training: target, max_epochs, max_seconds"
    ),
    _to_target(
        "time_to_target_seconds",
        "s",
        "clock seconds to the first evaluation that met the target, evaluations included",
        "time to target (s, olympic mean)",
        "to target s",
    ),
    _to_target(
        "energy_to_target_joules",
        "J",
        "energy from the clock's start to that evaluation's end, every device",
        "energy to target (J, olympic mean)",
        "to target J",
    ),
    _to_target(
        "epochs_to_target", "epochs", "epochs trained to that evaluation", "epochs to target (olympic mean)", "epochs"
    ),
    _to_target(
        "samples_to_target",
        "samples",
        "training samples to that evaluation, every replica's",
        "samples to target (olympic mean)",
        "samples",
    ),
    Metric(
        "target_initialization_seconds",
        "to_target.initialization_seconds",
        "s",
        "before the clock: building the model, placing it and the data (MLPerf's init)",
        Summary.median,
    ),
    Metric(
        "target_training_seconds",
        "to_target.training_seconds",
        "s",
        "clock seconds in all, to the end of training",
        Summary.median,
        printed=(
            Printed(
                "phases",
                "training {value:.4g} s (first step and evaluations inside)",
                missing="training n/a",
                shown=_trained_to_target,
            ),
        ),
    ),
    Metric("target_training_joules", "to_target.training_joules", "J", "energy over those seconds", Summary.median),
    Metric(
        "target_evaluation_seconds",
        "to_target.evaluation_seconds",
        "s",
        "every evaluation's time, inside the training seconds",
        Summary.median,
    ),
    Metric("target_epochs_trained", "to_target.epochs", "epochs", "epochs trained in all", Summary.median),
    Metric("target_samples_trained", "to_target.samples", "samples", "training samples in all", Summary.median),
    Metric("target_evaluations", "to_target.curve", description="evaluations on the quality curve", export=_count),
    Metric(
        "target_final_value",
        "to_target.curve",
        description="the target's metric at the last evaluation (where training ended)",
        summary=Summary.median,
        reading=_last_value,
    ),
    # --- a run to a target's real epochs (schema 1.13): each whole epoch's training time, evaluations out
    Metric(
        "target_first_epoch_seconds",
        "to_target.epoch_seconds",
        "s",
        "the first whole epoch's training time on the clock, its first step's compilation inside, evaluations out",
        Summary.median,
        reading=_first_epoch,
    ),
    Metric(
        "target_epoch_seconds",
        "to_target.epoch_seconds",
        "s",
        "a later epoch's training time on the clock (the median over the run's epochs after the first), "
        "evaluations out",
        Summary.median,
        reading=_later_epoch,
    ),
    Metric(
        "target_first_epoch_throughput_per_second",
        "to_target",
        "samples/s",
        "the first whole epoch's samples / its training time (ACES Table 1's 1st epoch, from a real epoch)",
        Summary.median,
        reading=lambda outcome: _epoch_rate(outcome, _first_epoch),
    ),
    Metric(
        "target_epoch_throughput_per_second",
        "to_target",
        "samples/s",
        "a later epoch's samples / its training time (the median epoch after the first: ACES's 2nd epoch)",
        Summary.median,
        reading=lambda outcome: _epoch_rate(outcome, _later_epoch),
    ),
    Metric(
        "target_final_top1",
        "to_target.curve",
        "fraction",
        "top-1 on the held-out split at the last evaluation (where training ended), whatever the target's metric",
        Summary.median,
        reading=lambda curve: curve[-1].metrics.get("top1") if curve else None,
    ),
    # --- activation recomputation (schema 1.14): the FLOPs the devices compute, the recomputed forward
    # counted (Megatron's TFLOPs/GPU), beside the model's FLOPs (flops_per_sample, MFU); None without it
    Metric(
        "hardware_flops_per_sample",
        "hardware_flops_per_sample",
        "FLOP",
        "with recomputation: flops_per_sample plus the forward FLOPs recomputed in the backward",
        Summary.median,
    ),
    Metric(
        "hardware_flops_utilization",
        "hardware_flops_utilization",
        "fraction",
        "with recomputation: hardware_flops_per_sample x throughput / peak_flops_per_second (MFU counts the "
        "model's FLOPs only)",
        Summary.median,
        reported=Reported(frozenset({TRAINING}), "HFU, recomputation counted (median)", percent=True, optional=True),
        printed=(Printed("achieved", "HFU {value:.2%} (recomputed forward counted)"),),
    ),
    # --- communication (schema 1.15): an update profiled after the window, its collectives' time
    Metric(
        "communication_seconds_per_update",
        "communication_seconds_per_update",
        "s",
        "with profile_communication: seconds of a profiled update with a collective in flight (mean over processes)",
        Summary.median,
        printed=(Printed("communication", "{value:.4g} s of a profiled update", scale=1.0),),
    ),
    Metric(
        "communication_fraction",
        "communication_fraction",
        "fraction",
        "with profile_communication: communication_seconds_per_update / the profiled update's time",
        Summary.median,
        reported=Reported(frozenset({TRAINING}), "communication share of an update (median)", percent=True),
        printed=(Printed("communication", "{value:.1%} in collectives", aside=True),),
    ),
)

METRICS_BY_NAME: dict[str, Metric] = {metric.name: metric for metric in METRICS}

# The columns of a flat export (CSV, Parquet, DataFrame), in order.
EXPORT_COLUMNS: tuple[str, ...] = tuple(metric.name for metric in METRICS if metric.exported)


def flat_record(run: StoredRun) -> dict[str, Any]:
    """One run as a flat dict of EXPORT_COLUMNS (options and per-component figures as JSON text)."""
    return {metric.name: metric.exported_value(run) for metric in METRICS if metric.exported}


def reported(table: str) -> list[Metric]:
    """The figures a table shows (TRAINING, INFERENCE, RESULTS), in declaration order."""
    return [metric for metric in METRICS if metric.reported is not None and table in metric.reported.tables]


def printed_on(line: str) -> list[tuple[Metric, Printed]]:
    """The figures of one line of ``core run``'s text, with how each is printed, in declaration order."""
    return [(metric, part) for metric in METRICS for part in metric.printed if part.line == line]


# --- the declaration checked against the result (tests/test_metrics.py) -------------------------

_SCALARS = (int, float, str, bool, datetime, Enum)


def _allowed_types(annotation: Any) -> list[Any]:
    """The types an annotation allows, Optional and unions opened."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [kind for kind in typing.get_args(annotation) if kind is not type(None)]
    return [annotation]


def _field_types(model: type[BaseModel]) -> dict[str, Any]:
    fields: dict[str, Any] = {name: info.annotation for name, info in model.model_fields.items()}
    fields.update({name: info.return_type for name, info in model.model_computed_fields.items()})
    return fields


def scalar_fields(model: type[BaseModel] = RunResult) -> list[str]:
    """The fields of ``model`` that hold one number, text, time or state, computed ones included."""

    def scalar(annotation: Any) -> bool:
        kinds = _allowed_types(annotation)
        return all(isinstance(kind, type) and issubclass(kind, _SCALARS) for kind in kinds) or all(
            typing.get_origin(kind) is typing.Literal for kind in kinds
        )

    return [name for name, annotation in _field_types(model).items() if scalar(annotation)]


def source_exists(source: str, model: type[BaseModel] = RunResult) -> bool:
    """Whether a declared source names a field: ``row.NAME`` of a stored row, or a dotted path
    through ``model`` and the models of its fields."""
    from core.storage.store import StoredRun

    if source.startswith(ROW_PREFIX):
        row_fields = {item.name for item in dataclasses.fields(StoredRun)} - {"result"}
        return source.removeprefix(ROW_PREFIX) in row_fields
    annotation: Any = model
    for name in source.split("."):
        kinds = _allowed_types(annotation)
        if len(kinds) != 1 or not (isinstance(kinds[0], type) and issubclass(kinds[0], BaseModel)):
            return False
        fields = _field_types(kinds[0])
        if name not in fields:
            return False
        annotation = fields[name]
    return True


def unknown_sources(metrics: Iterable[Metric] = METRICS) -> list[str]:
    """The declared metrics that read no field, as ``name (source)``."""
    return [f"{metric.name} ({metric.source})" for metric in metrics if not source_exists(metric.source)]


def unexported_fields(metrics: Iterable[Metric] = METRICS, model: type[BaseModel] = RunResult) -> list[str]:
    """The scalar fields of ``model`` that no exported metric reads."""
    exported = {metric.source for metric in metrics if metric.exported}
    return [name for name in scalar_fields(model) if name not in exported]
