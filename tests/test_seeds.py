"""The papers' studies as sweep files (examples/seeds/): each checked for its machine, and run at
toy scale on this CPU (docs/seeds.md)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from core.machines import load_machine
from core.running.planning import DATA_VARIABLE
from core.storage.store import ResultStore
from core.sweep import expand_cells, load_sweep, plan_sweep
from core.sweep.reference import check_references, matches
from core.sweep.run import run_sweep
from core.sweep.toy import TOY_TARGET_EPOCHS, toy_target_folder

ROOT = Path(__file__).resolve().parent.parent
SEEDS = sorted((ROOT / "examples" / "seeds").glob("*.toml"))
# What a paper's own grid may legitimately hold that a machine cannot take: AI4NP's FCNN grid goes
# past the GPU's memory (the poster's blank cells).
EXPECTED_REFUSALS = re.compile(r"fp32 weights and gradients alone")
# What only this machine lacks: torchvision cannot load against the CPU build of PyTorch here.
NOT_HERE = re.compile(r"torchvision")
#: keys of the toy cells that ran ok in this test session (one pytest-xdist worker runs this file:
#: scripts/test.sh's --dist loadfile)
TOY_CELLS_RUN_OK: set[str] = set()


def test_there_is_a_seed_for_every_row_of_docs_seeds_md() -> None:
    table = (ROOT / "docs" / "seeds.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\(\.\./examples/seeds/([\w.-]+\.toml)\)", table))
    assert linked == {path.name for path in SEEDS}


SEED_STATUSES = ("reproduces", "partial", "unfaithful")


def test_every_row_of_docs_seeds_md_gives_a_status_and_none_is_unfaithful() -> None:
    # The table's legend defines the statuses; an unfaithful row is a defect core can fix (issue 28).
    # Its rows have six columns; the later table of what each report draws links the files too.
    rows = [
        line
        for line in (ROOT / "docs" / "seeds.md").read_text(encoding="utf-8").splitlines()
        if line.startswith("| ") and "(../examples/seeds/" in line and line.count("|") >= 7
    ]
    statuses = {row.split("|")[3].strip(): row.split("|")[4].strip() for row in rows}
    assert len(statuses) == len(SEEDS)
    assert all(status in SEED_STATUSES for status in statuses.values()), statuses
    assert not [row for row, status in statuses.items() if status == "unfaithful"]


@pytest.mark.parametrize("path", SEEDS, ids=[p.stem for p in SEEDS])
def test_a_seed_names_its_paper_and_validates_for_its_machine(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# ") and ("Left out" in text or "Assumed" in text), "say what it reproduces and leaves out"
    spec = load_sweep(path)
    assert spec.name == path.stem and spec.machine is not None
    plan = plan_sweep(spec, machine=load_machine(spec.machine))
    unexpected = [f"{cell.label}: {cell.invalid_reason}" for cell in plan.invalid_cells]
    unexpected = [reason for reason in unexpected if not EXPECTED_REFUSALS.search(reason)]
    assert not unexpected, "\n".join(unexpected)
    assert plan.valid_cells


@pytest.mark.parametrize("path", SEEDS, ids=[p.stem for p in SEEDS])
def test_a_seeds_published_figures_validate_and_each_matches_one_planned_cell(path: Path) -> None:
    spec = load_sweep(path)  # validates every [[reference]] table
    cells = expand_cells(spec)
    check_references(spec.reference, cells)
    for position, reference in enumerate(spec.reference):
        where = f"reference.{position} ({reference.table}, {reference.row})"
        # The report's row says which paper, where in it, and what separates its measurement from core's.
        assert reference.citation and reference.row and reference.assumptions, where
        assert sum(matches(reference.match, cell.options) for cell in cells) == 1, where
    # One figure per row and quantity: a figure typed twice would be shown twice.
    assert len({(r.table, r.row, r.quantity) for r in spec.reference}) == len(spec.reference)


def test_docs_seeds_md_says_which_files_carry_the_papers_figures() -> None:
    rows = [
        line
        for line in (ROOT / "docs" / "seeds.md").read_text(encoding="utf-8").splitlines()
        if line.startswith("| ") and "(../examples/seeds/" in line and line.count("|") >= 7
    ]
    carried = {row.split("|")[3].strip(): row.split("|")[6].strip() for row in rows}
    for path in SEEDS:
        (cell,) = [text for link, text in carried.items() if f"({path.name})" in link.replace("../examples/seeds/", "")]
        references = load_sweep(path).reference
        if references:
            assert cell.startswith(f"{len(references)} ("), (path.name, cell)
        else:
            assert cell.startswith("none: "), (path.name, cell)
    assert sum(1 for path in SEEDS if load_sweep(path).reference) >= 19


@pytest.mark.slow
@pytest.mark.parametrize("path", SEEDS, ids=[p.stem for p in SEEDS])
def test_a_seed_runs_at_toy_scale_on_this_cpu(path: Path, tmp_path: Path) -> None:
    plan = plan_sweep(load_sweep(path), toy=True)
    refused_here = [cell for cell in plan.invalid_cells if NOT_HERE.search(cell.invalid_reason or "")]
    assert len(refused_here) == len(plan.invalid_cells), [c.invalid_reason for c in plan.invalid_cells]
    if not plan.valid_cells:
        pytest.skip(f"every toy cell needs what this machine lacks: {refused_here[0].invalid_reason}")
    # The seeds of one study on two machines (an A100 and a GH200 table, the T4 and A100 posters)
    # shrink to the same toy cells: one that already ran ok in this session is not run again.
    to_run = [cell for cell in plan.valid_cells if cell.key not in TOY_CELLS_RUN_OK]
    if not to_run:
        return
    plan = dataclasses.replace(plan, cells=to_run)
    database = tmp_path / "results.db"
    outcome = run_sweep(plan, database=database, skip_invalid=True)
    # A toy of a run to a target (its study's data is the user's: the toy reads the digits folder) may
    # miss the file's quality in its 2 epochs: a measured outcome, as a sweep counts it.
    measured = {"ok", "target_not_reached"}
    failed = [f"{cell.label}: {cell.status}" for cell in outcome.cells if cell.status not in measured | {"invalid"}]
    assert not failed, failed
    with ResultStore(database, create=False) as store:
        finished = store.finished(plan.spec.name)
        runs = store.runs(sweep=plan.spec.name)
    assert set(finished.values()) <= measured and len(finished) == len(to_run)
    for run in runs:
        if run.result.config.target is not None:  # real epochs, each timed, and an evaluation after each
            outcome_to_target = run.result.to_target
            assert outcome_to_target is not None and len(outcome_to_target.curve) == TOY_TARGET_EPOCHS
            assert len(outcome_to_target.epoch_seconds) == TOY_TARGET_EPOCHS
    TOY_CELLS_RUN_OK.update(cell.key for cell in to_run)


@pytest.mark.parametrize("path", [p for p in SEEDS if "to-target" in p.stem], ids=lambda p: p.stem)
def test_a_to_target_seed_names_the_data_the_user_supplies(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Its data is an environment variable: unset, a dry run for the file's machine warns and plans
    # (tests/test_to_target_papers.py: a run here is refused); its toy reads the digits.
    spec = load_sweep(path)
    cells = expand_cells(spec)
    variables = {cell.options["data"] for cell in cells}
    assert variables and all(DATA_VARIABLE.match(value) for value in variables), variables
    assert all(isinstance(cell.options.get("target"), dict) for cell in cells)
    for value in variables:
        monkeypatch.delenv(value.strip("${}"), raising=False)
    plan = plan_sweep(spec, machine=load_machine(spec.machine))
    assert all(any("is not set on this host" in warning for warning in cell.warnings) for cell in plan.valid_cells)
    toy = plan_sweep(spec, toy=True)
    # the digits in the format the cells read: TFRecord files for a Keras cell, else an image folder
    read = {"tfrecord" if cell.options.get("framework") == "tensorflow" else "image-folder" for cell in toy.cells}
    assert {cell.options["data"] for cell in toy.cells} == {str(toy_target_folder(name)) for name in read}
    assert all(cell.options["target"]["max_epochs"] == TOY_TARGET_EPOCHS for cell in toy.cells)
