"""Toy scale: a sweep file's own grid, shrunk to run on this CPU (core sweep FILE --toy)."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.cli import main
from core.contract.manager import get_plugin_manager
from core.storage.store import ResultStore
from core.sweep import load_sweep, plan_sweep
from core.sweep.toy import TOY_MAX_CELLS, toy_cell_options

ROOT = Path(__file__).resolve().parent.parent


def test_a_cell_keeps_its_workload_and_precision_and_loses_its_machine() -> None:
    toy = toy_cell_options(
        {
            "workload": "resnet50",
            "accelerator": "graphcore",
            "precision": "tf32",
            "replicas": 16,
            "devices_per_replica": 4,
            "micro_batch_size": 20,
            "gradient_accumulation": 24,
            "accelerator_options": {"instances": 8},
            "workload_options": {"image_size": 224, "dataset": "imagenet"},
            "steps": 500,
            "duration_seconds": 1800.0,  # CARAML's 30-minute window: a toy's is its two steps
            "energy_scope": "run",
        },
        get_plugin_manager(),
    )
    assert toy["workload"] == "resnet50" and toy["accelerator"] == "cpu" and toy["precision"] == "fp32"
    assert (toy["replicas"], toy["devices_per_replica"], toy["micro_batch_size"], toy["gradient_accumulation"]) == (
        1,
        1,
        4,
        2,
    )
    assert "accelerator_options" not in toy and toy["steps"] == 2 and "duration_seconds" not in toy
    assert toy["workload_options"] == {"dataset": "imagenet", "variant": "small"}  # the size is the small variant's


def test_an_inference_cell_keeps_one_micro_step_and_a_short_loadgen_run() -> None:
    """Inference refuses gradient accumulation, and LoadGen's own minimum (10 s) is no toy: both hold
    where the file says nothing of them (an offline cell beside loop cells cannot give loadgen)."""
    manager = get_plugin_manager()
    for scenario in ("loop", "offline"):
        toy = toy_cell_options({"workload": "fcnn", "mode": "inference", "scenario": scenario}, manager)
        assert toy["gradient_accumulation"] == 1
        assert toy.get("loadgen") == (
            None if scenario == "loop" else {"min_duration_seconds": 0.3, "min_query_count": 20}
        )
    training = toy_cell_options({"workload": "fcnn"}, manager)
    assert training["gradient_accumulation"] == 2 and "loadgen" not in training


def test_the_fcnn_grid_of_19440_cells_becomes_a_few_distinct_toys(tmp_path: Path) -> None:
    sweep = tmp_path / "grid.toml"
    sweep.write_text(
        'name = "grid"\nmachine = "t4"\n[grid]\nworkload = "fcnn"\naccelerator = "nvidia"\n'
        'precision = ["fp32", "fp16"]\n'
        "micro_batch_size = [64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]\n"
        "[grid.workload_options]\nlayers = [4, 8, 16, 32, 64, 128]\n"
        "hidden_width = [32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]\n"
        "input_width = [2000, 4000, 6000, 8000]\noutput_width = [200, 400, 600, 800, 1000]\n"
    )
    spec = load_sweep(sweep)
    full = plan_sweep(spec)
    assert len(full.cells) == 19440
    toy = plan_sweep(spec, toy=True)
    assert toy.spec.name == "grid-toy" and toy.spec.repeats == 1 and toy.spec.machine is None
    assert 1 < len(toy.cells) <= TOY_MAX_CELLS and all(cell.valid for cell in toy.cells)
    assert len({cell.key for cell in toy.cells}) == len(toy.cells)
    # fp16 runs as fp32 at toy scale (emulated on the CPU, several times slower): the cells spread
    # over the other axes instead.
    assert {cell.options["precision"] for cell in toy.cells} == {"fp32"}


def test_a_dry_run_plans_for_the_file_s_machine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep = tmp_path / "t4.toml"
    sweep.write_text(
        'name = "t4"\nmachine = "t4"\n[grid]\nworkload = "fcnn"\naccelerator = "nvidia"\nprecision = "bf16"\n'
    )
    assert main(["sweep", str(sweep), "--dry-run", "--database", str(tmp_path / "r.db")]) == 2
    out = capsys.readouterr()
    assert "planned for machine 't4'" in out.out and "Tesla T4" in out.out
    assert main(["sweep", str(sweep), "--toy", "--machine", "t4", "--database", str(tmp_path / "r.db")]) == 2
    assert "a toy sweep runs on this CPU" in capsys.readouterr().err


@pytest.mark.slow
def test_the_example_runs_at_toy_scale_into_its_own_sweep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    database = tmp_path / "results.db"
    assert main(["sweep", str(ROOT / "examples" / "fcnn-cpu-sweep.toml"), "--toy", "--database", str(database)]) == 0
    # Its bf16 cells run as fp32 at toy scale, the same toy as its fp32 cells: one run.
    assert "sweep fcnn-cpu-toy: 1 run now" in capsys.readouterr().out
    with ResultStore(database, create=False) as store:
        assert set(store.finished("fcnn-cpu-toy").values()) == {"ok"}
        assert not store.finished("fcnn-cpu")
        for result in store.results(sweep="fcnn-cpu-toy"):
            assert "core sweep --toy" in (result.energy_unavailable_reason or "")
            assert result.warnings[0].startswith("a toy run (core sweep --toy)")


TOY_DROPS = """
name = "machine-only"
repeats = 3
[grid]
workload = "fcnn"
accelerator = "nvidia"
mode = "{mode}"
{options}
[grid.workload_options]
layers = 2
hidden_width = 32
"""


@pytest.mark.parametrize(
    ("mode", "options"),
    [
        ("train", 'nodes = [2, 4]\nreplicas = 8\nrendezvous = "node1:29500"'),
        ("inference", 'weights = "/nowhere/fcnn.safetensors"\naccuracy = true\ndata = "/nowhere/imagenet"'),
        (
            "inference",
            'scenario = ["server", "offline", "single-stream"]\n[grid.loadgen]\n'
            "server_target_samples_per_second = 1e8\noffline_expected_samples_per_second = 1e9\n"
            "single_stream_expected_latency_seconds = 1e-6",
        ),
    ],
    ids=["nodes", "weights-and-accuracy", "loadgen-rates"],
)
def test_a_toy_drops_what_only_the_files_machine_can_honour(tmp_path: Path, mode: str, options: str) -> None:
    """Issue 26: nodes, a weights file, accuracy over a labelled folder and the machine's LoadGen
    rates made every toy cell invalid (or a LoadGen run of billions of queries); they are dropped."""
    sweep = tmp_path / "sweep.toml"
    sweep.write_text(TOY_DROPS.format(mode=mode, options=options), encoding="utf-8")
    toy = plan_sweep(load_sweep(sweep), toy=True)
    assert toy.cells and all(cell.valid for cell in toy.cells), [cell.invalid_reason for cell in toy.cells]
    for cell in toy.cells:
        assert cell.config is not None and cell.config.nodes == 1 and cell.config.rendezvous is None
        assert cell.config.weights is None and cell.config.accuracy is False and cell.config.data == "synthetic"
        loadgen = cell.config.loadgen
        assert "offline_expected_samples_per_second" not in loadgen
        assert "single_stream_expected_latency_seconds" not in loadgen
        assert loadgen.get("server_target_samples_per_second", 0) <= 100
