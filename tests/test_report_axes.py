"""The report's axes and its [report] table: global batch (samples, tokens), devices and grid axes;
options that move with the device count as part of the scaling axis (ACES Tables 1 and 3); the
table's validation, filters, facets, normalisations and maps; and the seed files' own tables,
drawn on fabricated results for their grids (a slice of AI4NP's 19,440 cells)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from seed_cells import SEEDS, seed_cells

from core.base.config import RunConfig
from core.base.errors import ConfigError
from core.report import axes
from core.report.analysis import varying_options
from core.report.document import Figure, Heading, Paragraph, Table
from core.report.heatmap import heatmap_blocks, spec_heatmaps
from core.report.scaling import scaling_series
from core.report.sections import SweepData, sweep_section
from core.storage.store import SweepRecord
from core.storage.summary import CellSummary
from core.sweep.report_spec import HeatmapSpec
from core.sweep.spec import load_sweep, make_sweep_spec

GRID = {
    "workload": "fcnn",
    "precision": ["fp32", "fp16"],
    "micro_batch_size": [64, 128],
    "workload_options": {"layers": [4, 8]},
}

# --- the [report] table's validation ------------------------------------------------------------


@pytest.mark.parametrize(
    ("report", "field", "said"),
    [
        ({"x": "layers"}, "report.x", "not an axis of this sweep; allowed: the grid's options (micro_batch_size"),
        ({"series": ["global_batch", "hidden"]}, "report.series.1", "derived axis (global_batch, global_batch_tokens"),
        ({"figures": [{"y": "speed"}]}, "report.figures.0.y", "'throughput', 'tokens_per_second', 'flops'"),
        ({"figures": [{"sereis": ["precision"]}]}, "report.figures.0", "unknown setting 'sereis' (did you mean"),
        ({"bogus": 1}, "report", "a [report] table has: plots, x, series, filter"),
        ({"plots": ["heatmap"]}, "report.plots.0", "'heatmaps'"),
        ({"max_heatmaps": "3"}, "report.max_heatmaps", "an integer is required"),
        ({"max_heatmaps": 0}, "report.max_heatmaps", "greater than or equal to 1"),
        ({"filter": {"precison": "fp32"}}, "report.filter", "'precison': not an axis of this sweep"),
        ({"filter": {"precision": []}}, "report.filter", "an empty list keeps no cell"),
        ({"heatmaps": [{"x": "precision"}]}, "report.heatmaps.0.y", "required"),
        ({"heatmaps": [{"x": "precision", "y": "precision"}]}, "report.heatmaps.0", "a map needs two different"),
        (
            {"heatmaps": [{"x": "precision", "y": "devices", "normalise": "best"}]},
            "report.heatmaps.0.normalise",
            "'mfu', 'map-best' or 'group-best'",
        ),
        (
            {"heatmaps": [{"x": "precision", "y": "devices", "group": ["precision"]}]},
            "report.heatmaps.0",
            "group is for normalise = 'group-best'",
        ),
        ({"figures": [{"x": "devices", "facet": "devices"}]}, "report.figures.0", "each option on one axis"),
    ],
)
def test_a_bad_report_table_names_the_field_the_value_and_what_is_allowed(
    report: dict[str, Any], field: str, said: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        make_sweep_spec({"name": "s", "grid": GRID, "report": report})
    assert caught.value.field == field and said in caught.value.allowed, str(caught.value)


def test_a_report_table_names_grid_options_and_derived_axes_and_is_stored_whole() -> None:
    report = {
        "x": "global_batch",
        "filter": {"precision": "fp32", "workload_options.layers": [4, 8]},
        "heatmaps": [{"x": "micro_batch_size", "y": "workload_options.layers", "normalise": "group-best"}],
        "figures": [{"y": "flops", "x": "devices", "series": ["precision"], "facet": "workload_options.layers"}],
    }
    spec = make_sweep_spec({"name": "s", "grid": GRID, "report": report})
    assert spec.report is not None and spec.report.heatmaps is not None
    assert (
        spec.report.heatmaps[0].normalise == "group-best" and spec.report.figures[0].facet == "workload_options.layers"
    )
    # What core sweep stores (the file's document) reads back as the same table, and validates again.
    stored = spec.model_dump(mode="json")
    assert stored["report"]["filter"] == report["filter"]
    assert make_sweep_spec(stored).report == spec.report
    assert make_sweep_spec({"name": "s", "grid": GRID}).report is None


# --- axes ----------------------------------------------------------------------------------------


def _throughput(config: RunConfig) -> float:
    return 100.0 * config.samples_per_update / (1 + config.samples_per_update / 4096)


def test_global_batch_in_samples_and_tokens_and_devices() -> None:
    cells, _ = seed_cells("caraml-gpt-nvidia", _throughput, tokens_per_sample=2048)
    by_accumulation = {cell.config.gradient_accumulation: cell for cell in cells}
    cell = by_accumulation[8]
    assert axes.global_batch(cell) == 4 * 8 * 4  # micro-batch x accumulation x replicas
    assert axes.global_batch_tokens(cell) == 4 * 8 * 4 * 2048
    assert axes.position(cell, "devices") == 4 and axes.position(cell, "gradient_accumulation") == 8
    assert axes.axis_value(cell, "workload_options.nonexistent") is None
    # A workload without a sequence length has no token axis.
    cells, _ = seed_cells("caraml-resnet50-nvidia", _throughput)
    assert axes.global_batch_tokens(cells[0]) is None and axes.global_batch(cells[0]) == 16


def test_the_default_x_is_the_batch_axis_the_sweep_varies() -> None:
    gpt, _ = seed_cells("caraml-gpt-nvidia", _throughput)  # accumulation at a fixed micro-batch
    assert axes.default_x(gpt) == "global_batch"
    ipu, _ = seed_cells("caraml-resnet50-ipu", _throughput)  # global_batch_size, micro-batch derived
    assert axes.default_x(ipu) == "global_batch"
    # The micro-batch and accumulation that make up each global batch are not series of their own.
    assert axes.series_names(ipu, varying_options(ipu), "global_batch") == [
        "replicas",
        "accelerator_options.batch_norm_span",
    ]
    nvidia, _ = seed_cells("caraml-resnet50-nvidia", _throughput)  # the micro-batch alone
    assert axes.default_x(nvidia) == "micro_batch_size"
    table1, _ = seed_cells("aces-table1-resnet50-ipu", _throughput)  # replicas: a scaling series
    assert axes.default_x(table1) == "micro_batch_size"


def _section(cells: list[CellSummary], record: SweepRecord | None) -> list[Any]:
    return sweep_section(cells[0].sweep or "s", cells, record, Path("results.db"), slug="s")


def _figure(blocks: list[Any], kind: str) -> Figure:
    [figure] = [block for block in blocks if isinstance(block, Figure) and block.file_name == f"s-{kind}.png"]
    return figure


def _column(table: Table | None, name: str) -> list[Any]:
    assert table is not None
    index = [column for column, _ in table.columns].index(name)
    return [row[index].number for row in table.rows]


def test_caraml_gpt_is_drawn_against_the_global_batch_in_tokens() -> None:
    cells, record = seed_cells("caraml-gpt-nvidia", _throughput, tokens_per_sample=2048)
    blocks = _section(cells, record)
    figure = _figure(blocks, "throughput-vs-batch-size")
    tokens = [4 * accumulation * 4 * 2048 for accumulation in (1, 2, 4, 8, 16, 32, 64, 128, 256)]
    assert _column(figure.data, "global_batch_tokens") == tokens
    assert "global batch in tokens" in figure.caption
    assert not any("does not vary" in str(block) for block in blocks)
    # Without the file's [report] table, the default axis is the global batch in samples: still drawn.
    figure = _figure(_section(cells, None), "throughput-vs-batch-size")
    assert _column(figure.data, "global_batch") == [token // 2048 for token in tokens]


def test_caraml_mi250_gcd_and_package_series_share_the_global_batch_axis() -> None:
    cells, record = seed_cells("caraml-resnet50-mi250", _throughput)
    figure = _figure(_section(cells, record), "throughput-vs-batch-size")
    assert figure.data is not None
    series = {row[0].text: set() for row in figure.data.rows}
    for row in figure.data.rows:
        series[row[0].text].add(row[1].number)
    # One GCD at micro-batch 16..4096 and one package (2 GCDs) at 8..2048: the same global batches.
    assert series == {
        "replicas=1 mode=gcd": {16 << k for k in range(9)},
        "replicas=2 mode=package": {16 << k for k in range(9)},
    }


# --- scaling: options that move with the device count --------------------------------------------


def test_aces_table1_scales_1_to_16_in_one_series() -> None:
    cells, _ = seed_cells("aces-table1-resnet50-ipu", lambda config: 100.0 * config.replicas)
    [(label, points)] = scaling_series(cells, varying_options(cells)).items()
    assert [point.devices for point in points] == [1, 2, 4, 8, 16, 16]
    assert [point.detail for point in points][-2:] == ["instances=8", "instances=16"]
    assert all(point.efficiency == pytest.approx(1.0) for point in points)


def test_aces_table3_scales_1_to_16_at_its_micro_batch() -> None:
    cells, record = seed_cells("aces-table3-resnet50-tf-ipu", lambda config: 50.0 * config.replicas)
    [(label, points)] = scaling_series(cells, varying_options(cells)).items()
    assert label == "micro_batch_size=20" and [point.devices for point in points] == [1, 2, 4, 8, 16]
    assert points[1].detail == "batch_norm_span=2 instances=1"
    # The file's [report] table also draws Table 3's first part: one IPU, micro-batch 2..20.
    blocks = _section(cells, record)
    one_ipu = _figure(blocks, "figure-1")
    assert _column(one_ipu.data, "micro_batch_size") == [2, 4, 8, 14, 16, 18, 20]
    assert any(isinstance(block, Figure) and block.file_name == "s-scaling-efficiency.png" for block in blocks)
    assert not any(isinstance(block, Figure) and "heatmap" in block.file_name for block in blocks)  # not asked


def test_an_option_beside_the_device_count_still_makes_series() -> None:
    # Precision at every replica count varies beside the devices: a series each, as before.
    grid = {
        "workload": "fcnn",
        "accelerator": "cpu",
        "micro_batch_size": 8,
        "precision": ["fp32", "fp16"],
        "replicas": [1, 2, 4],
    }
    document = {"name": "s", "grid": grid}
    spec = make_sweep_spec(document)
    assert spec.report is None
    cells = _cells_of_grid(document["grid"])
    series = scaling_series(cells, varying_options(cells))
    assert sorted(series) == ["precision=fp16", "precision=fp32"]
    assert all(point.detail == "" for points in series.values() for point in points)


def _cells_of_grid(grid: dict[str, Any]) -> list[CellSummary]:
    import itertools
    from datetime import datetime, timezone

    from seed_cells import fabricated_result

    from core.base.config import make_config
    from core.storage.store import StoredRun

    names = [name for name, value in grid.items() if isinstance(value, list)]
    shared = {name: value for name, value in grid.items() if not isinstance(value, list)}
    cells = []
    for position, values in enumerate(itertools.product(*(grid[name] for name in names))):
        config = make_config(**shared, **dict(zip(names, values)))
        result = fabricated_result(config, 100.0 * config.replicas)
        run = StoredRun(position, "s", str(position), str(position), 0, 1.0, datetime.now(timezone.utc), result)
        cells.append(CellSummary(sweep="s", cell_key=str(position), label=str(position), runs=[run]))
    return cells


# --- AI4NP: Fig. 3 and Fig. 4 from the shipped grid -----------------------------------------------

_SLICE = {"layers": (4, 8, 16), "hidden_width": (32, 64, 512, 4096), "input_width": (2000,), "output_width": (200, 400)}


def _ai4np_throughput(config: RunConfig) -> float | None:
    options = config.workload_options
    width, batch = options["hidden_width"], config.micro_batch_size or 1
    if width * batch > 4096 * 8192:
        return None  # out of memory, as the poster's blank cells
    saturation = batch / (batch + 16384 / width)
    precision = 2.0 if config.precision.value == "fp16" else 1.0
    return 1e5 * precision * saturation * min(width, 2048) / options["layers"] / width


def _ai4np_slice(options: dict[str, Any]) -> bool:
    return all(options["workload_options"][name] in values for name, values in _SLICE.items())


def test_ai4np_fig3_maps_are_d_h_by_batch_one_per_precision_each_its_own_best() -> None:
    cells, record = seed_cells("ai4np-fcnn-t4", _ai4np_throughput, keep=_ai4np_slice)
    assert len(cells) == 2 * 9 * 3 * 4 * 2  # precisions x batches x the slice
    spec = load_sweep(SEEDS / "ai4np-fcnn-t4.toml").report
    assert spec is not None and spec.heatmaps is not None
    maps, measure = spec_heatmaps(cells, varying_options(cells), spec.heatmaps[0])
    assert measure == "group-best" and [heatmap.fixed for heatmap in maps] == [
        (("precision", "fp16"),),
        (("precision", "fp32"),),
    ]
    for heatmap in maps:
        assert heatmap.x_axis == "micro_batch_size" and heatmap.y_axis == "workload_options.hidden_width"
        assert heatmap.y_values == [32, 64, 512, 4096] and len(heatmap.x_values) == 9
        assert max(value for row in heatmap.values for value in row if value is not None) == pytest.approx(1.0)
        assert heatmap.states[3][-1] == "oom"  # D_H 4096 at batch 16384
        # Each position is its best cell over l and D_O: l = 4 (the fastest here) at D_O 200 or 400.
        precision = heatmap.fixed[0][1]
        best = max(c.flops_per_second or 0 for c in cells if c.option("precision") == precision and c.flops_per_second)
        at = [c for c in cells if c.option("precision") == precision and c.option("micro_batch_size") == 64]
        small = max(c.flops_per_second or 0 for c in at if c.option("workload_options.hidden_width") == 32)
        assert heatmap.values[0][0] == pytest.approx(small / best)


def test_ai4np_fig4_draws_three_panels_with_l_as_series() -> None:
    cells, record = seed_cells("ai4np-fcnn-a100", _ai4np_throughput, keep=_ai4np_slice)
    blocks = _section(cells, record)
    figure = _figure(blocks, "figure-1")
    assert figure.data is not None
    panels = {row[0].text for row in figure.data.rows}
    assert panels == {"hidden_width=64", "hidden_width=512", "hidden_width=4096"}
    series = {row[1].text for row in figure.data.rows}
    assert series == {"layers=4", "layers=8", "layers=16"}
    assert len(figure.data.rows) == 3 * 3 * 9  # panels x layers x batches: fp32, D_I 2000, D_O 200 only
    # The Fig. 3 maps of the file's table are drawn, one per precision of the A100 (fp32, tf32, fp16),
    # and no default map.
    maps = [block for block in blocks if isinstance(block, Figure) and "heatmap" in block.file_name]
    assert [block.file_name for block in maps] == [f"s-heatmap-1-group-best-{index}.png" for index in (1, 2, 3)]
    titles = [block.text for block in blocks if isinstance(block, Heading)]
    assert "Throughput against batch size" not in titles and "Roofline" in titles  # `plots` chose


@pytest.mark.parametrize(
    ("name", "panels", "series"),
    [
        (
            "aces-fig1-fig2-resnet50-dgx-a100",
            {"framework=torch", "framework=tensorflow"},
            {"precision=fp16", "precision=tf32"},
        ),
        ("aces-fig1-fig2-resnet50-v100", None, {"framework=torch", "framework=tensorflow"}),
    ],
)
def test_aces_fig1_and_fig2_draw_images_per_second_against_the_gpus(
    name: str, panels: set[str] | None, series: set[str]
) -> None:
    cells, record = seed_cells(name, _throughput)
    blocks = _section(cells, record)
    figure = _figure(blocks, "figure-1")
    assert figure.data is not None
    rows = [[value.text for value in row] for row in figure.data.rows]
    if panels is not None:  # a panel per framework, a line per precision (TensorFlow: mixed precision only)
        assert {row[1] for row in rows if row[0] == "framework=tensorflow"} == {"precision=fp16"}
    assert {row[0] for row in rows} == (panels or {"-"})  # the panel column: none without a facet
    assert {row[1] for row in rows} == series
    devices = {row[2] for row in rows}
    assert devices == {str(count) for count in (1, 2, 4, 8) if count <= max(c.config.replicas for c in cells)}
    titles = [block.text for block in blocks if isinstance(block, Heading)]
    assert "Scaling against device count" in titles and "Throughput against batch size" not in titles


# --- normalisations, facets, filters, the cap ----------------------------------------------------


def _small_sweep() -> list[CellSummary]:
    cells, _ = seed_cells("ai4np-fcnn-t4", _ai4np_throughput, keep=_ai4np_slice)
    return [cell for cell in cells if cell.option("workload_options.output_width") == 200]


def test_normalisations() -> None:
    cells = _small_sweep()
    varying = varying_options(cells)
    x, y = "micro_batch_size", "workload_options.hidden_width"
    # map-best: one map per (precision, layers), each map's best is 1.
    maps, measure = spec_heatmaps(cells, varying, HeatmapSpec(x=x, y=y, normalise="map-best"))
    assert measure == "best" and len(maps) == 2 * 3
    assert all(max(v for row in m.values for v in row if v is not None) == pytest.approx(1.0) for m in maps)
    # group-best by precision: the maps of one precision share one best, found in one of them.
    maps, _ = spec_heatmaps(cells, varying, HeatmapSpec(x=x, y=y, normalise="group-best", group=["precision"]))
    tops = [max(v for row in m.values for v in row if v is not None) for m in maps]
    assert sorted(tops)[-2:] == pytest.approx([1.0, 1.0]) and min(tops) < 0.5  # l = 16 runs at a quarter of l = 4
    # group-best without a group: each row's best is 1.
    maps, _ = spec_heatmaps(cells, varying, HeatmapSpec(x=x, y=y, normalise="group-best"))
    assert all(max(v for v in row if v is not None) == pytest.approx(1.0) for m in maps for row in m.values)


def test_facets_and_filters_choose_the_maps_and_their_cells() -> None:
    cells = _small_sweep()
    spec = HeatmapSpec(
        x="micro_batch_size",
        y="workload_options.layers",
        facet=["precision"],
        filter={"workload_options.hidden_width": [64, 512]},
    )
    maps, _ = spec_heatmaps(cells, varying_options(cells), spec)
    assert [m.fixed for m in maps] == [(("precision", "fp16"),), (("precision", "fp32"),)]
    assert all(m.y_values == [4, 8, 16] for m in maps)
    # Each position is the better of D_H 64 and 512 (D_H is filtered to those, then folded), against
    # the best of the map's (filtered) cells.
    fp32 = [
        c for c in cells if c.option("precision") == "fp32" and c.option("workload_options.hidden_width") in (64, 512)
    ]
    at = [c for c in fp32 if c.option("workload_options.layers") == 4 and c.option(spec.x) == 64]
    best = max(c.flops_per_second or 0 for c in fp32)
    assert maps[1].values[0][0] == pytest.approx(max(c.flops_per_second or 0 for c in at) / best)


def test_default_maps_are_capped_and_name_those_left_out_but_asked_maps_are_not() -> None:
    cells = _small_sweep()
    sweep = SweepData("s", "s", cells, {}, [], None)
    blocks = heatmap_blocks(sweep)
    drawn = [block for block in blocks if isinstance(block, Figure)]
    note = [block for block in blocks if isinstance(block, Paragraph) and "left out" in str(block)]
    assert len(drawn) == 8 and len(note) == 1 and "hidden_width" in str(note[0])
    # A table that asks for its maps gets every one: 2 precisions x 3 layer counts x 4 widths.
    asked = {"heatmaps": [{"x": "micro_batch_size", "y": "workload_options.input_width", "normalise": "map-best"}]}
    sweep = SweepData("s", "s", cells, {"report": asked}, [], None)
    blocks = heatmap_blocks(sweep)
    assert len([block for block in blocks if isinstance(block, Figure)]) == 2 * 3 * 4
    assert not any("left out" in str(block) for block in blocks)
    capped = SweepData("s", "s", cells, {"report": {"max_heatmaps": 2}}, [], None)
    assert len([block for block in heatmap_blocks(capped) if isinstance(block, Figure)]) == 2


def test_a_stored_report_table_that_is_not_valid_gives_the_defaults_and_says_so() -> None:
    cells = _small_sweep()
    sweep = SweepData("s", "s", cells, {"report": {"x": 3}}, [], None)
    assert sweep.report is None and sweep.report_problem is not None and "report.x" in sweep.report_problem
    blocks = sweep_section("s", cells, None, Path("results.db"), slug="s")
    assert blocks  # the defaults draw
    record = SweepRecord("s", None, {"report": {"x": 3}}, [], *([__import__("datetime").datetime.now()] * 2))
    blocks = sweep_section("s", cells, record, Path("results.db"), slug="s")
    assert any("stored [report] table is not used" in str(block) for block in blocks)
