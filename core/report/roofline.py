"""Rooflines (AI4NP Fig. 1) and achieved FLOP/s against batch size on log-log axes (AI4NP Fig. 4).

A device's roofline: attainable FLOP/s = min(peak FLOP/s, memory bandwidth x arithmetic
intensity), intensity in FLOPs per byte moved. The two roofs meet at the ridge point, intensity =
peak / bandwidth: left of it a run is bound by memory, right of it by compute. Each run is placed
at its workload's analytical intensity (``flops_per_sample / memory_bytes_per_sample``) and its
achieved FLOP/s. Peaks and bandwidths are the results' own (summed over the devices a run used),
so one roofline is drawn per device, precision and device count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from core.base.errors import ConfigError
from core.base.roofs import RoofSource
from core.report.analysis import _batch_of, _positive, group_series
from core.report.document import (
    Block,
    Heading,
    Paragraph,
    Table,
    Value,
    format_number,
    format_percent,
    one_line,
    shorten,
)
from core.report.plots import _batch_axis, _legend, _png, _pyplot, plot_text
from core.report.roof_sources import (
    RoofRequest,
    cell_roofs,
    request_in_force,
    roof_request,
    roofs_in_force,
    why_no_roofs,
)
from core.storage.summary import CellSummary

if TYPE_CHECKING:
    from core.report.sections import SweepData

# --- the arithmetic -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Roofs:
    """One roofline: what a set of devices can do at one precision."""

    device: str  # the devices' names, e.g. "NVIDIA A100-SXM4-40GB" or "2 x MI250X"
    precision: str
    peak_flops_per_second: float
    bandwidth_bytes_per_second: float
    memory: str  # what the bandwidth is of
    caches_bytes_per_second: tuple[tuple[str, float], ...] = ()
    flops_source: str = ""
    bandwidth_source: str = ""
    origin: str = "datasheet"  # where the roofs come from: datasheet, machine profile NAME, measured on ...

    @property
    def ridge_intensity(self) -> float:
        """FLOPs per byte where the slanted roof meets the flat one."""
        return self.peak_flops_per_second / self.bandwidth_bytes_per_second

    def attainable(self, intensity: float, bandwidth: float | None = None) -> float:
        """min(peak, bandwidth x intensity): the most a run of that intensity can achieve."""
        return min(self.peak_flops_per_second, (bandwidth or self.bandwidth_bytes_per_second) * intensity)

    def bound(self, intensity: float) -> str:
        return "memory" if intensity < self.ridge_intensity else "compute"

    @property
    def title(self) -> str:
        return f"{self.device} ({self.precision})"


def _device_name(cell: CellSummary) -> str:
    """The devices a cell's first successful repeat used: '2 x NAME' where several share a name."""
    result = next(iter(cell.ok_results), None)
    names = [device.name for device in result.devices] if result is not None else []
    if not names:
        return str(cell.config.accelerator)
    distinct = sorted(set(names))
    return ", ".join(f"{names.count(name)} x {name}" if names.count(name) > 1 else name for name in distinct)


def roofs_of(cell: CellSummary, request: RoofRequest | None = None) -> Roofs | None:
    """The roofline of a cell from the source the report's request chooses (see roof_sources.py),
    or None where that source has no peak or no bandwidth for it."""
    found = cell_roofs(cell, request_in_force() if request is None else request)
    if found is None:
        return None
    return Roofs(
        device=shorten(one_line(_device_name(cell)), 80),
        precision=str(cell.option("precision")),
        peak_flops_per_second=found.peak_flops_per_second,
        bandwidth_bytes_per_second=found.bandwidth_bytes_per_second,
        memory=shorten(one_line(found.memory), 80),
        caches_bytes_per_second=found.caches_bytes_per_second,
        flops_source=found.flops_source,
        bandwidth_source=found.bandwidth_source,
        origin=shorten(one_line(found.origin), 160),
    )


@dataclass(frozen=True)
class RooflinePoint:
    cell: CellSummary
    intensity: float  # FLOPs per byte
    flops_per_second: float  # achieved, median of the repeats


def rooflines(
    cells: Sequence[CellSummary], request: RoofRequest | None = None
) -> list[tuple[Roofs, list[RooflinePoint]]]:
    """The cells grouped by roofline, each with its placeable runs (intensity and FLOP/s known);
    rooflines without a single run to place are left out."""
    request = request_in_force() if request is None else request
    groups: dict[Roofs, list[RooflinePoint]] = {}
    for cell in cells:
        intensity, achieved = cell.arithmetic_intensity, cell.flops_per_second
        if not _positive(intensity) or not _positive(achieved):
            continue
        roofs = roofs_of(cell, request)
        if roofs is None:
            continue
        groups.setdefault(roofs, []).append(RooflinePoint(cell, intensity, achieved))
    return list(groups.items())


def why_no_roofline(cells: Sequence[CellSummary], request: RoofRequest | None = None) -> str:
    """Why :func:`rooflines` found nothing, in the report's words."""
    if not any(_positive(cell.flops_per_second) for cell in cells):
        return "no cell has an achieved FLOP rate (the workload declares no FLOP count)"
    if not any(_positive(cell.arithmetic_intensity) for cell in cells):
        return (
            "no cell has an arithmetic intensity: the workload does not count the bytes it moves "
            "(memory_bytes_per_sample; the FCNN does)"
        )
    return why_no_roofs(cells, request_in_force() if request is None else request)


# --- units ------------------------------------------------------------------------------------------

_FLOP_UNITS = ((1e15, "PFLOP/s"), (1e12, "TFLOP/s"), (1e9, "GFLOP/s"), (1e6, "MFLOP/s"), (1.0, "FLOP/s"))
_BYTE_UNITS = ((1e12, "TB/s"), (1e9, "GB/s"), (1e6, "MB/s"), (1.0, "B/s"))


def flop_unit(peak: float) -> tuple[float, str]:
    """(scale, name) that shows ``peak`` as a number from 1 to 1000."""
    return next(((scale, name) for scale, name in _FLOP_UNITS if peak >= scale), _FLOP_UNITS[-1])


def rate_text(value: float, units: tuple[tuple[float, str], ...] = _FLOP_UNITS) -> str:
    scale, name = next(((s, n) for s, n in units if value >= s), units[-1])
    return f"{value / scale:.4g} {name}"


def bandwidth_text(value: float) -> str:
    return rate_text(value, _BYTE_UNITS)


# --- plots ------------------------------------------------------------------------------------------


def _intensity_range(roofs: Roofs, intensities: Sequence[float]) -> tuple[float, float]:
    """An x range that shows the ridge and every run, a decade of room on each side."""
    low = min([roofs.ridge_intensity, *intensities])
    high = max([roofs.ridge_intensity, *intensities])
    return low / 10, high * 10


def plot_roofline(roofs: Roofs, points: Sequence[RooflinePoint], series_names: Sequence[str]) -> bytes:
    """The roofs (memory, caches, peak), the ridge point and the runs, log-log, in one figure."""
    pyplot = _pyplot()
    scale, unit = flop_unit(roofs.peak_flops_per_second)
    figure, axis = pyplot.subplots(figsize=(7.5, 4.8))
    low, high = _intensity_range(roofs, [point.intensity for point in points])
    xs = [low * (high / low) ** (k / 200) for k in range(201)]
    axis.plot(
        xs,
        [roofs.attainable(x) / scale for x in xs],
        color="black",
        linewidth=2,
        label=f"roof: {rate_text(roofs.peak_flops_per_second)} peak, "
        f"{bandwidth_text(roofs.bandwidth_bytes_per_second)} memory",
    )
    for index, (cache, bandwidth) in enumerate(roofs.caches_bytes_per_second):
        axis.plot(
            xs,
            [roofs.attainable(x, bandwidth) / scale for x in xs],
            color="grey",
            linestyle=("--", ":", "-.")[index % 3],
            linewidth=1.2,
            label=plot_text(f"{cache} roof: {bandwidth_text(bandwidth)}"),
        )
    ridge = roofs.ridge_intensity
    axis.plot([ridge], [roofs.peak_flops_per_second / scale], marker="D", color="black", linestyle="none")
    axis.annotate(
        f"ridge point: {ridge:.3g} FLOP/byte",
        (ridge, roofs.peak_flops_per_second / scale),
        textcoords="offset points",
        xytext=(6, -14),
        fontsize="small",
    )
    by_series = group_series([point.cell for point in points], series_names)
    lookup = {id(point.cell): point for point in points}
    for index, (label, members) in enumerate(by_series.items()):
        chosen = [lookup[id(cell)] for cell in members]
        axis.scatter(
            [p.intensity for p in chosen],
            [p.flops_per_second / scale for p in chosen],
            color=f"C{index % 10}",
            marker="os^vD<>ph*"[index % 10],
            s=36,
            zorder=3,
            label=plot_text(label),
        )
        for point in chosen:
            batch = _batch_of(point.cell)
            if batch is not None:
                axis.annotate(
                    f"b={batch}",
                    (point.intensity, point.flops_per_second / scale),
                    textcoords="offset points",
                    xytext=(4, 3),
                    fontsize="x-small",
                    color=f"C{index % 10}",
                )
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlim(low, high)
    lowest = min([p.flops_per_second for p in points] + [roofs.attainable(low)]) / scale
    axis.set_ylim(lowest / 3, roofs.peak_flops_per_second / scale * 3)
    axis.set_xlabel("arithmetic intensity (FLOPs per byte moved to and from memory)")
    # The roofs' source on a line of its own: a legend entry would cut it short.
    return _finished(figure, axis, unit, f"Roofline: {plot_text(roofs.title)}\nroofs: {plot_text(roofs.origin)}")


def _finished(figure: object, axis: object, unit: str, title: str) -> bytes:
    """The FLOP-rate axis labelled and titled, the legend beside the plot, where it hides no run
    (a roofline's runs fill the plot's corners); the figure as PNG bytes."""
    axis.set_ylabel(f"achieved {unit} (median)")  # type: ignore[attr-defined]
    axis.set_title(title)  # type: ignore[attr-defined]
    axis.grid(True, which="both", alpha=0.3)  # type: ignore[attr-defined]
    _legend(axis, "small")
    legend = axis.get_legend()  # type: ignore[attr-defined]
    if legend is not None:
        legend.set_bbox_to_anchor((1.02, 1.0))
        legend.set_loc("upper left")
    return _png(figure)


def plot_flops_against_batch(roofs: Roofs, points: Sequence[RooflinePoint], series_names: Sequence[str]) -> bytes:
    """AI4NP Fig. 4: achieved FLOP/s against micro-batch size, log-log, one line per series (hidden
    width, layers), with the flat peak roof and, dashed, each series' own attainable roof
    min(peak, bandwidth x intensity(batch)): the intensity grows with the batch, which shares the
    weights' traffic among more samples."""
    pyplot = _pyplot()
    scale, unit = flop_unit(roofs.peak_flops_per_second)
    figure, axis = pyplot.subplots(figsize=(7.5, 4.8))
    lookup = {id(point.cell): point for point in points}
    batches: list[float] = []
    for index, (label, members) in enumerate(group_series([p.cell for p in points], series_names).items()):
        chosen = sorted(
            ((batch, lookup[id(cell)]) for cell in members if (batch := _batch_of(cell)) is not None),
            key=lambda pair: pair[0],
        )
        if not chosen:
            continue
        color = f"C{index % 10}"
        x = [batch for batch, _ in chosen]
        batches += x
        axis.plot(x, [p.flops_per_second / scale for _, p in chosen], marker="o", color=color, label=plot_text(label))
        axis.plot(
            x,
            [roofs.attainable(p.intensity) / scale for _, p in chosen],
            linestyle="--",
            linewidth=1,
            color=color,
        )
    axis.axhline(
        roofs.peak_flops_per_second / scale,
        color="black",
        linewidth=1.5,
        label=plot_text(f"peak {rate_text(roofs.peak_flops_per_second)}"),
    )
    axis.plot([], [], linestyle="--", linewidth=1, color="grey", label="attainable: min(peak, bandwidth x intensity)")
    _batch_axis(axis, batches)
    axis.set_yscale("log")
    axis.set_xlabel("micro-batch size (samples per device per micro-step)")
    return _finished(figure, axis, unit, f"Achieved FLOP/s against micro-batch size: {plot_text(roofs.title)}")


# --- the data behind them -------------------------------------------------------------------------


def roofs_table(roofs: Roofs, identifier: str) -> Table:
    """The roofs and where each figure comes from."""
    rows = [
        [
            Value("peak"),
            Value(rate_text(roofs.peak_flops_per_second), roofs.peak_flops_per_second),
            Value(shorten(one_line(roofs.flops_source), 600)),
        ],
        [
            Value(f"memory bandwidth ({roofs.memory})"),
            Value(bandwidth_text(roofs.bandwidth_bytes_per_second), roofs.bandwidth_bytes_per_second),
            Value(shorten(one_line(roofs.bandwidth_source), 600)),
        ],
        *(
            [
                Value(f"{cache} bandwidth"),
                Value(bandwidth_text(value), value),
                Value(shorten(one_line(roofs.bandwidth_source), 600)),
            ]
            for cache, value in roofs.caches_bytes_per_second
        ),
        [
            Value("ridge point"),
            Value(f"{roofs.ridge_intensity:.4g} FLOP/byte", roofs.ridge_intensity),
            Value("peak / memory bandwidth"),
        ],
    ]
    return Table(columns=[("roof", "roof"), ("value", "value"), ("source", "source")], rows=rows, identifier=identifier)


def points_table(roofs: Roofs, points: Sequence[RooflinePoint], series_names: Sequence[str], identifier: str) -> Table:
    """Each run on the roofline: its intensity, achieved and attainable FLOP/s, and what bounds it."""
    labels = {
        id(cell): label
        for label, members in group_series([p.cell for p in points], series_names).items()
        for cell in members
    }
    rows = []
    for point in sorted(points, key=lambda p: (labels[id(p.cell)], _batch_of(p.cell) or 0)):
        attainable = roofs.attainable(point.intensity)
        batch = _batch_of(point.cell)
        rows.append(
            [
                Value(shorten(one_line(labels[id(point.cell)]))),
                Value("n/a" if batch is None else str(batch), batch),
                Value(format_number(point.intensity), point.intensity),
                Value(format_number(point.flops_per_second / 1e9), point.flops_per_second / 1e9),
                Value(format_number(attainable / 1e9), attainable / 1e9),
                Value(format_percent(point.flops_per_second / attainable), point.flops_per_second / attainable),
                Value(roofs.bound(point.intensity)),
            ]
        )
    return Table(
        columns=[
            ("series", "series"),
            ("micro_batch_size", "micro-batch"),
            ("arithmetic_intensity", "intensity (FLOP/byte)"),
            ("achieved_gflops", "achieved (GFLOP/s)"),
            ("attainable_gflops", "attainable (GFLOP/s)"),
            ("fraction_of_attainable", "of attainable"),
            ("bound", "bound by"),
        ],
        rows=rows,
        identifier=identifier,
    )


# --- the section ----------------------------------------------------------------------------------


_ROOF_CHOICE = {
    "auto": "for each cell, measured on its host where measured, else the datasheet's, else a machine profile's",
    "datasheet": "the datasheet figures each run recorded",
    "machine": "the machine profile's figures",
    "measured": "measured on each cell's host",
}


def _roof_choice(from_file: bool) -> str:
    request = request_in_force()
    text = _ROOF_CHOICE[request.source.value]
    if request.chosen_profile is not None:
        text = f"machine profile {request.chosen_profile.name}'s figures"
    return f"{text}, as the sweep file's [report] table asks" if from_file else text


def roofline_blocks(sweep: SweepData) -> list[Block]:
    """:func:`_roofline_blocks` under the roofs the sweep file's ``[report] roofs`` names, where the
    report leaves the choice to it (``--roofs auto``, the default); a name the report cannot load is
    said, and the report's own choice is used."""
    chosen = sweep.report.roofs if sweep.report is not None else None
    request = request_in_force()
    if chosen is None or request.source is not RoofSource.auto:
        return _roofline_blocks(sweep)
    try:
        asked = roof_request(chosen)
    except (ValueError, ConfigError) as problem:
        note = Paragraph(f"The sweep file's roofs ({chosen!r}) are not used: {one_line(problem)}.")
        blocks = _roofline_blocks(sweep)
        return blocks[:1] + [note] + blocks[1:]
    with roofs_in_force(replace(asked, measured=request.measured)):
        return _roofline_blocks(sweep, from_file=True)


def _roofline_blocks(sweep: SweepData, from_file: bool = False) -> list[Block]:
    """Per roofline: the roofline plot, the FLOP/s-against-batch plot where the batch varies, the
    roofs with their sources and the runs' figures; or why none is drawn."""
    title = sweep.titled("Roofline")
    found = rooflines(sweep.cells)
    if not found:
        return [Heading(3, title), Paragraph(f"Not drawn: {why_no_roofline(sweep.cells)}.")]
    blocks: list[Block] = [
        Heading(3, title),
        Paragraph(
            "Attainable FLOP/s = min(peak, memory bandwidth x arithmetic intensity); the ridge point is where "
            "the roofs meet (peak / bandwidth). Intensity is the workload's FLOPs per sample over its bytes "
            "moved per sample, an analytical lower bound on traffic (docs/concepts.md#bytes-moved-per-sample), "
            "so a run sits at or left of its true intensity. b= labels each run's micro-batch size. "
            f"Roofs: {_roof_choice(from_file)} (`core report --roofs` chooses); each "
            "table below says where every figure comes from."
        ),
    ]
    for index, (roofs, points) in enumerate(found):
        suffix = f"-{index + 1}" if len(found) > 1 else ""
        blocks.append(Heading(4, f"{roofs.title}: {len(points)} runs; roofs: {roofs.origin}"))
        above = [point for point in points if point.flops_per_second > roofs.peak_flops_per_second]
        if above:
            # A run cannot beat a true peak: the peak figure is wrong for this machine (a CPU's derived
            # from the nominal clock a virtual machine reports, below its boost clock), and says so.
            best = max(point.flops_per_second for point in above)
            blocks.append(
                Paragraph(
                    f"Warning: {len(above)} run(s) achieved more than the peak ({rate_text(best)} against "
                    f"{rate_text(roofs.peak_flops_per_second)}), so the peak is too low for this machine and "
                    f"MFU above 100 % is not a measurement error of the runs. The peak's source: {roofs.flops_source}"
                )
            )
        blocks += [
            sweep.figure(
                f"roofline{suffix}",
                plot_roofline(roofs, points, sweep.series_names),
                f"Roofline of {roofs.title}, log-log: roofs ({roofs.origin}), ridge point and each cell's median "
                "achieved FLOP/s",
                data=points_table(roofs, points, sweep.series_names, f"roofline-{sweep.slug}{suffix}"),
            ),
            roofs_table(roofs, f"roofs-{sweep.slug}{suffix}"),
        ]
        if sweep.batch_varies and len({_batch_of(point.cell) for point in points} - {None}) > 1:
            blocks.append(
                sweep.figure(
                    f"flops-vs-batch-log{suffix}",
                    plot_flops_against_batch(roofs, points, sweep.series_names),
                    f"Achieved FLOP/s against micro-batch size on {roofs.title}, log-log (AI4NP Fig. 4): solid, "
                    "measured; dashed, each series' attainable roof at its intensity",
                    data=points_table(roofs, points, sweep.series_names, f"flops-batch-{sweep.slug}{suffix}"),
                )
            )
    return blocks
