"""``global_batch_size``: the micro-batch and gradient accumulation derived from the global batch,
checked against CARAML's rule for its IPU ResNet-50 and refused where the batch does not split (issue 28)."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.base.config import make_config
from core.base.errors import ConfigError
from core.contract.manager import get_plugin_manager
from core.sweep.plan import expand_cells
from core.sweep.spec import load_sweep
from core.sweep.toy import toy_cell_options

ROOT = Path(__file__).resolve().parents[1]
CARAML_GLOBAL_BATCHES = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def caraml_ipu_micro_batch(global_batch: int, replicas: int) -> int:
    """resnet50_benchmark.xml (FZJ-JSC/CARAML), parameter ``ipu_mbs``, as written there."""
    share = global_batch // replicas
    return share if global_batch == 16 or (global_batch == 32 and replicas == 4) else 16


@pytest.mark.parametrize("replicas", [1, 2, 4])
@pytest.mark.parametrize("global_batch", CARAML_GLOBAL_BATCHES)
def test_the_derived_micro_batch_is_caramls_ipu_mbs(global_batch: int, replicas: int) -> None:
    config = make_config(
        workload="fcnn", accelerator="cpu", global_batch_size=global_batch, replicas=replicas, micro_batch_size=16
    )
    assert config.micro_batch_size == caraml_ipu_micro_batch(global_batch, replicas)
    # "make sure the global batch size = replicas*mbs*gradient_accumulation_count" (the xml's comment)
    assert config.samples_per_update == global_batch
    assert config.gradient_accumulation == global_batch // (replicas * config.micro_batch_size)


def test_without_a_largest_micro_batch_each_replica_takes_its_share_at_once() -> None:
    config = make_config(workload="fcnn", accelerator="cpu", global_batch_size=96, replicas=3)
    assert (config.micro_batch_size, config.gradient_accumulation) == (32, 1)


def test_a_derived_config_reads_back_as_itself() -> None:
    # A worker process rebuilds the config from its JSON: the derived values must be a fixed point.
    config = make_config(workload="fcnn", accelerator="cpu", global_batch_size=4096, micro_batch_size=16, replicas=2)
    assert make_config(**config.model_dump(mode="json")) == config
    assert (config.micro_batch_size, config.gradient_accumulation) == (16, 128)


@pytest.mark.parametrize(
    ("options", "field", "allowed"),
    [
        ({"global_batch_size": 10, "replicas": 4}, "global_batch_size", "a multiple of 4"),
        ({"global_batch_size": 48, "replicas": 2, "micro_batch_size": 16}, "global_batch_size", "a multiple of 32"),
        (
            {"global_batch_size": 64, "micro_batch_size": 16, "gradient_accumulation": 2},
            "gradient_accumulation",
            "sets it: 4 here",
        ),
        ({"global_batch_size": True}, "global_batch_size", "a boolean is not a number"),
        ({"global_batch_size": 0}, "global_batch_size", "greater than or equal to 1"),
        (
            {"global_batch_size": 64, "micro_batch_size": 16, "mode": "inference"},
            "global_batch_size",
            "at most 16",
        ),
    ],
)
def test_a_global_batch_that_does_not_split_is_refused_naming_the_field(
    options: dict[str, object], field: str, allowed: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        make_config(workload="fcnn", accelerator="cpu", **options)
    assert raised.value.field == field
    assert allowed in str(raised.value)


def test_an_accumulation_given_equal_to_the_derived_one_is_accepted() -> None:
    config = make_config(
        workload="fcnn", accelerator="cpu", global_batch_size=64, micro_batch_size=16, gradient_accumulation=4
    )
    assert config.gradient_accumulation == 4


def test_caramls_ipu_resnet_file_holds_every_cell_of_the_xml_with_batch_norm_over_the_replicas() -> None:
    spec = load_sweep(ROOT / "examples" / "seeds" / "caraml-resnet50-ipu.toml")
    cells = expand_cells(spec)
    chosen = {(cell.options["global_batch_size"], cell.options["replicas"]): cell.options for cell in cells}
    # The xml's grid, 3 replicas left out (Poplar's powers of two), each once.
    assert sorted(chosen) == sorted((batch, replicas) for batch in CARAML_GLOBAL_BATCHES for replicas in (1, 2, 4))
    assert len(cells) == len(chosen)
    for (global_batch, replicas), options in chosen.items():
        # --dbn-replica-group-size=${replicas}
        assert options["accelerator_options"]["batch_norm_span"] == replicas
        config = make_config(**options)
        assert config.micro_batch_size == caraml_ipu_micro_batch(global_batch, replicas)
        assert config.samples_per_update == global_batch
    # The headline cell that could not be written with a fixed micro-batch: global 16 on 2 IPUs.
    headline = make_config(**chosen[(16, 2)])
    assert (headline.micro_batch_size, headline.gradient_accumulation) == (8, 1)


def test_a_toy_drops_the_files_global_batch() -> None:
    toy = toy_cell_options(
        {"workload": "fcnn", "accelerator": "cpu", "global_batch_size": 4096, "micro_batch_size": 16},
        get_plugin_manager(),
    )
    assert "global_batch_size" not in toy
    config = make_config(**toy)
    assert (config.micro_batch_size, config.gradient_accumulation) == (4, 2)


def test_a_dry_run_shows_the_global_batch_beside_what_it_derived(capsys: pytest.CaptureFixture[str]) -> None:
    from core.cli import main

    code = main(["run", "fcnn", "--global-batch-size", "64", "--batch-size", "16", "--replicas", "2", "--dry-run"])
    assert code in (0, None)
    placement = next(line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("placement"))
    assert "micro-batch 16, gradient accumulation 2; global batch size 64" in placement
