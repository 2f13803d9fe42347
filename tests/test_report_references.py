"""Published figures beside measured ones: a sweep file's [[reference]] tables validated, matched to
its cells and shown in the report, in the paper's unit, with the ratio; a user's own from
`core report --reference`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from synthetic import synthetic_result
from test_report import parse_html

from core.base.errors import ConfigError
from core.cli import main
from core.report import ReportError, write_report
from core.storage.store import ResultStore
from core.sweep import expand_cells, make_sweep_spec, plan_sweep
from core.sweep.reference import in_paper_unit, load_reference_file, unit_factor

GRID: dict[str, Any] = {"workload": "fcnn", "micro_batch_size": [8, 16, 32], "precision": ["fp32", "bf16"]}
THROUGHPUT = {8: 1000.0, 16: 1800.0, 32: 3000.0}  # images/s of the fp32 cells; bf16 twice that


def reference(**changes: Any) -> dict[str, Any]:
    entry = {
        "paper": "Made-up et al.",
        "citation": "https://example.org/paper",
        "table": "Table 1",
        "row": "batch 16",
        "quantity": "throughput_per_second",
        "value": 50_000.0,
        "unit": "images/min",
        "match": {"micro_batch_size": 16, "precision": "fp32"},
        "assumptions": "the paper's own data loader; ours is synthetic",
    }
    entry.update(changes)
    return {key: value for key, value in entry.items() if value is not None}


def sweep_document(*references: dict[str, Any], **grid: Any) -> dict[str, Any]:
    return {"name": "papers", "grid": {**GRID, **grid}, "reference": list(references)}


def refused(document: dict[str, Any]) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        spec = make_sweep_spec(document)
        plan_sweep(spec)
    return caught.value


# --- validation -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "field", "allowed"),
    [
        ({"unit": "Wh"}, "reference.0.unit", "not a unit of throughput_per_second (core's unit: samples/s)"),
        ({"quantity": "speed"}, "reference.0.quantity", "allowed: setup_seconds"),
        ({"value": 0.0}, "reference.0.value", "greater than 0"),
        ({"value": float("nan")}, "reference.0.value", "finite"),
        ({"value": "3749.09"}, "reference.0.value", "number"),
        ({"value": True}, "reference.0.value", "boolean is not a number"),
        ({"paper": ""}, "reference.0.paper", "at least 1 character"),
        ({"match": {"precision": ["fp32", "bf16"]}}, "reference.0.match", "one number, string or boolean"),
        ({"page": 3}, "reference.0", "unknown key 'page'; a reference has: paper, citation"),
    ],
)
def test_a_reference_that_does_not_validate_is_refused_naming_field_value_and_what_is_allowed(
    changes: dict[str, Any], field: str, allowed: str
) -> None:
    error = refused(sweep_document(reference(**changes)))
    assert error.field == field
    assert allowed in error.allowed


def test_a_reference_needs_a_paper_table_quantity_value_and_unit() -> None:
    error = refused(sweep_document({"match": {}}))
    assert {problem.field for problem in error.errors} == {  # type: ignore[attr-defined]
        f"reference.0.{name}" for name in ("paper", "table", "quantity", "value", "unit")
    }


@pytest.mark.parametrize(
    ("match", "field", "allowed"),
    [
        ({"steps": 10}, "reference.0.match.steps", "not an option of this sweep's cells; allowed: "),
        ({"micro_batch_size": 64}, "reference.0.match.micro_batch_size", "the grid gives: 8, 16, 32"),
        ({"precision": "fp16"}, "reference.0.match.precision", "the grid gives: 'fp32', 'bf16'"),
        ({"micro_batch_size": 32, "precision": "bf16"}, "reference.0.match", "no planned cell has all these"),
    ],
)
def test_a_reference_matching_no_planned_cell_is_refused(match: dict[str, Any], field: str, allowed: str) -> None:
    document = sweep_document(reference(match=match))
    document["exclude"] = [{"micro_batch_size": 32, "precision": "bf16"}]
    error = refused(document)
    assert error.field == field and allowed in error.allowed


def test_selectors_match_nested_and_dotted_options_and_numbers_as_numbers() -> None:
    grid = {"workload_options": {"hidden_width": [32, 64]}}
    nested = reference(match={"workload_options": {"hidden_width": 64}, "micro_batch_size": 16.0})
    dotted = reference(match={"workload_options.hidden_width": 32})
    spec = make_sweep_spec(sweep_document(nested, dotted, **grid))
    assert spec.reference[0].match == {"workload_options.hidden_width": 64, "micro_batch_size": 16.0}
    plan_sweep(spec)  # both match planned cells
    # A dumped spec validates again (core sweep --repeats re-validates the file's document).
    assert make_sweep_spec(spec.model_dump()).reference == spec.reference


def test_units_convert_to_the_papers() -> None:
    assert in_paper_unit(120.0, "epoch_seconds", "min") == pytest.approx(2.0)
    assert in_paper_unit(7200.0, "epoch_seconds", "hours") == pytest.approx(2.0)
    assert in_paper_unit(3600.0, "energy_joules", "Wh") == pytest.approx(1.0)
    assert in_paper_unit(2.0, "energy_watt_hours_per_epoch", "kWh") == pytest.approx(0.002)
    assert in_paper_unit(1.0, "energy_watt_hours_per_epoch", "J") == pytest.approx(3600.0)
    assert in_paper_unit(40_000.0, "samples_per_watt_hour", "images/kWh") == pytest.approx(4e7)
    assert in_paper_unit(10.0, "throughput_per_second", "images/min") == pytest.approx(600.0)
    assert in_paper_unit(0.25, "model_flops_utilization", "%") == pytest.approx(25.0)
    assert in_paper_unit(3e12, "flops_per_second", "TFLOP/s") == pytest.approx(3.0)
    assert unit_factor("throughput_per_second", "items/s") == 1.0


# --- the report ---------------------------------------------------------------------------------


def _store(tmp_path: Path, *references: dict[str, Any], planned_options: bool = True) -> ResultStore:
    """The grid's cells, fp32 and bf16 at batch 8 and 16 run (bf16 batch 16 out of memory), batch 32
    not run; each cell's key and options as a sweep records them."""
    spec = make_sweep_spec(sweep_document(*references))
    plan_sweep(spec)  # the references match planned cells
    store = ResultStore(tmp_path / "results.db")
    cells = []
    for cell in expand_cells(spec):
        batch, precision = cell.options["micro_batch_size"], cell.options["precision"]
        planned = {"key": cell.key, "label": cell.label, "invalid_reason": None}
        cells.append({**planned, "options": cell.options} if planned_options else planned)
        if batch == 32:
            continue
        failed = batch == 16 and precision == "bf16"
        for repeat, jitter in enumerate((0.9, 1.0, 1.3)):
            speed = THROUGHPUT[batch] * (2 if precision == "bf16" else 1) * jitter
            result = synthetic_result(
                micro_batch_size=batch,
                precision=precision,
                throughput=None if failed else speed,
                state="oom" if failed else "ok",
                message="out of memory" if failed else None,
            )
            store.add(result, sweep="papers", cell_key=cell.key, cell_label=cell.label, repeat=repeat)
    store.save_sweep("papers", spec.model_dump(mode="json"), cells, "papers.toml")
    return store


def _rows(html: Path) -> list[dict[str, tuple[str, str | None]]]:
    return [row for _, row in parse_html(html).tables["references-papers"]]


def test_the_report_shows_each_reference_beside_the_cells_median_in_the_papers_unit(tmp_path: Path) -> None:
    store = _store(
        tmp_path,
        reference(),  # fp32 batch 16: median 1800 images/s = 108,000 images/min
        reference(
            row="bf16 batch 16", value=3000.0, unit="images/s", match={"micro_batch_size": 16, "precision": "bf16"}
        ),
        reference(row="batch 32", value=5000.0, unit="images/s", match={"micro_batch_size": 32}),
        reference(
            row="no meter",
            quantity="samples_per_watt_hour",
            value=1e4,
            unit="images/Wh",
            match={"micro_batch_size": 8, "precision": "fp32"},
        ),
    )
    files = write_report(store, tmp_path / "report")
    rows = _rows(files.html)
    first = rows[0]
    assert first["paper_value"][0] == "50 k images/min"
    assert first["measured"] == ("108 k images/min", "108000.0")
    assert float(first["ratio"][1] or "nan") == pytest.approx(108_000 / 50_000)
    # Each distinct note once, under the table, and its label in the rows that share it.
    assert [row["assumptions"][0] for row in rows] == ["A1"] * 5
    assert "A1: the paper's own data loader; ours is synthetic" in files.markdown.read_text(encoding="utf-8")
    assert first["status"][0] == "ok" and first["source"][0] == "sweep file"
    # A failed matched cell says so, with no figure to compare.
    assert (rows[1]["status"][0], rows[1]["measured"][0], rows[1]["ratio"][0]) == ("failed (oom)", "n/a", "n/a")
    # A selector matching two cells gives a row for each; neither ran.
    assert [row["status"][0] for row in rows[2:4]] == ["not run yet"] * 2
    assert [row["cell"][0] for row in rows[2:4]] == [
        "micro_batch_size=32 precision=fp32",
        "micro_batch_size=32 precision=bf16",
    ]
    # An ok cell without the figure (no energy meter) says that, not a ratio.
    assert rows[4]["status"][0] == "ok, but no samples_per_watt_hour figure" and rows[4]["ratio"][0] == "n/a"
    markdown = files.markdown.read_text(encoding="utf-8")
    assert "### Published figures beside these results" in markdown
    assert "| Made-up et al. | Table 1, batch 16 |" in markdown
    assert "Cited: Made-up et al.: https://example.org/paper." in markdown


def test_a_sweep_without_references_has_no_such_table(tmp_path: Path) -> None:
    files = write_report(_store(tmp_path), tmp_path / "report")
    assert "Published figures" not in files.markdown.read_text(encoding="utf-8")


def test_a_recorded_reference_that_does_not_validate_is_named_not_shown(tmp_path: Path) -> None:
    store = _store(tmp_path, reference())
    record = store.sweep("papers")
    assert record is not None
    spec = dict(record.spec)
    spec["reference"] = [*spec["reference"], {**spec["reference"][0], "unit": "furlongs"}]
    store.save_sweep("papers", spec, record.cells, record.source)
    files = write_report(store, tmp_path / "report")
    assert len(_rows(files.html)) == 1
    assert "A recorded reference is not shown: reference.1.unit: not a unit of" in files.markdown.read_text(
        encoding="utf-8"
    )


def test_a_users_own_references_are_shown_beside_the_files(tmp_path: Path) -> None:
    store = _store(tmp_path, reference())
    own = tmp_path / "mine.toml"
    own.write_text(
        '[[reference]]\nsweep = "papers"\npaper = "our lab, 2025"\ntable = "notebook p. 4"\n'
        'quantity = "throughput_per_second"\nvalue = 1.0\nunit = "images/s"\n'
        'match = { micro_batch_size = 8, precision = "bf16" }\n',
        encoding="utf-8",
    )
    assert main(["report", str(store.path), "--reference", str(own), "--output", str(tmp_path / "report")]) == 0
    rows = _rows(tmp_path / "report" / "report.html")
    assert [row["source"][0] for row in rows] == ["sweep file", "--reference"]
    assert rows[1]["measured"][0] == "2 k images/s" and rows[1]["assumptions"][0] == "A2"
    assert "A2: not stated" in (tmp_path / "report" / "report.md").read_text(encoding="utf-8")
    assert float(rows[1]["ratio"][1] or "nan") == pytest.approx(2000.0)


def test_a_users_reference_naming_no_reported_sweep_or_cell_is_refused(tmp_path: Path, capsys: Any) -> None:
    store = _store(tmp_path)
    entry = reference(sweep="elsewhere")
    with pytest.raises(ReportError, match=r"reference\.0\.sweep = 'elsewhere': not a sweep of this report"):
        write_report(store, tmp_path / "report", references=[_swept(entry)])
    entry = reference(sweep="papers", match={"micro_batch_size": 64})
    with pytest.raises(ReportError, match=r"reference\.0\.match = .*no planned cell of sweep 'papers'"):
        write_report(store, tmp_path / "report", references=[_swept(entry)])
    assert not (tmp_path / "report").exists()
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[[reference]]\nsweep = "papers"\npaper = "x"\ntable = "T"\n'
        'quantity = "epoch_seconds"\nvalue = 1\nunit = "days"\n'
    )
    assert main(["report", str(store.path), "--reference", str(bad), "--output", str(tmp_path / "report")]) == 2
    assert f"--reference {bad}: reference.0.unit = 'days': not a unit of epoch_seconds" in capsys.readouterr().err


def _swept(entry: dict[str, Any]) -> Any:
    from core.sweep.reference import SweptReference

    return SweptReference.model_validate(entry)


def test_a_reference_file_is_read_strictly(tmp_path: Path) -> None:
    path = tmp_path / "refs.toml"
    path.write_text('[[reference]]\npaper = "x"\ntable = "T"\nquantity = "epoch_seconds"\nvalue = 2\nunit = "min"\n')
    with pytest.raises(ConfigError) as caught:
        load_reference_file(path)
    assert caught.value.field == "reference.0.sweep"
    path.write_text(
        '[[reference]]\nsweep = "s"\npaper = "x"\ntable = "T"\nquantity = "epoch_seconds"\nvalue = 2\nunit = "min"\n'
    )
    (loaded,) = load_reference_file(path)
    assert (loaded.sweep, loaded.value, loaded.match) == ("s", 2.0, {})


def test_a_sweep_whose_cells_match_none_of_its_figures_says_so_once(tmp_path: Path) -> None:
    # A --toy sweep keeps the file's references but shrinks its cells: no figure matches any of them.
    store = _store(tmp_path, reference(), reference(row="batch 8", match={"micro_batch_size": 8}))
    record = store.sweep("papers")
    assert record is not None
    toy_cells = [{**cell, "options": {**cell["options"], "micro_batch_size": 4}} for cell in record.cells]
    store.save_sweep("papers", record.spec, toy_cells, record.source)
    files = write_report(store, tmp_path / "report")
    markdown = files.markdown.read_text(encoding="utf-8")
    assert "None of the 2 published figures the sweep carries matches one of its cells" in markdown
    assert "references-papers" not in parse_html(files.html).tables


def test_cells_recorded_without_their_options_are_matched_by_their_configuration(tmp_path: Path) -> None:
    # A record whose cells lack their options (or no record at all): the measured runs' configuration says.
    store = _store(tmp_path, reference(), planned_options=False)
    rows = _rows(write_report(store, tmp_path / "report").html)
    assert [(row["cell"][0], row["measured"][0]) for row in rows] == [
        ("micro_batch_size=16 precision=fp32", "108 k images/min")
    ]
