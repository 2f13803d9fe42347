"""Bad configurations are refused before any device is touched: the message names the field,
the value and what is allowed; no traceback, no result file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from core import ConfigError, run
from core.cli import main

# (CLI arguments after `core run`, field the error must name, a fragment of what is allowed)
BAD_CONFIGS = [
    (["fcnn", "--batch-size", "0"], "micro_batch_size", "greater than or equal to 1"),
    (["fcnn", "--batch-size", "-4"], "micro_batch_size", "greater than or equal to 1"),
    (["fcnn", "--gradient-accumulation", "0"], "gradient_accumulation", "greater than or equal to 1"),
    (["fcnn", "--replicas", "0"], "replicas", "greater than or equal to 1"),
    (["fcnn", "--replicas", "4096"], "replicas", "can place at most"),
    (
        ["fcnn", "--precision", "fp8"],
        "precision",
        "no precision policy has this name (registered: fp32, tf32, bf16, fp16, default)",
    ),
    (["fcnn", "--precision", "tf32"], "precision", "supports: fp32, bf16, fp16"),
    (["fcnn", "--framework", "jax"], "framework", "'torch' or 'tensorflow'"),
    (["resnet-9000"], "workload", "unknown workload (did you mean 'resnet50'?); registered:"),
    (["fcnn", "--accelerator", "tpu"], "accelerator", "registered: amd, cpu, graphcore, nvidia"),
    (["fcnn", "--accelerator", "nvidia"], "accelerator", "not available here"),
    (["fcnn", "--accelerator", "graphcore"], "accelerator", "Poplar SDK"),
    (["fcnn", "--steps", "0"], "steps", "greater than or equal to 1"),
    (["fcnn", "--warmup-steps", "-1"], "warmup_steps", "greater than or equal to 0"),
    (["fcnn", "--seed", "-1"], "seed", "greater than or equal to 0"),
    (["fcnn", "--power-meter", "bogus"], "power_meter", "allowed: auto, none"),
    (["fcnn", "--power-sample-interval", "0"], "power_sample_interval_seconds", "greater than 0"),
    (["fcnn", "--threads", "0"], "threads_per_replica", "greater than or equal to 1"),
    (["fcnn", "--threads", "4000"], "threads_per_replica", "usable cores"),
    (["fcnn", "--devices-per-replica", "2"], "gradient_accumulation", "at least the 2 pipeline stages"),
    (["fcnn", "--device-iterations", "4"], "device_iterations", "allowed: 1"),
    (["fcnn", "-o", "layers=0"], "workload_options.layers", "greater than or equal to 1"),
    (["fcnn", "-o", "depth=3"], "workload_options.depth", "allowed: layers, hidden_width"),
    (["fcnn", "-o", "hidden_width=wide"], "workload_options.hidden_width", "valid integer"),
    (["fcnn", "-a", "mode=package"], "accelerator_options.mode", "unknown option for accelerator 'cpu'"),
    (["fcnn", "--data", "/no/such/dataset"], "data", "no such file or folder"),
]


@pytest.mark.parametrize("arguments,field,allowed", BAD_CONFIGS, ids=[" ".join(c[0]) for c in BAD_CONFIGS])
def test_cli_refuses_with_field_value_and_allowed(
    arguments: list[str], field: str, allowed: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "result.json"
    assert main(["run", *arguments, "--output", str(output)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("core: error: invalid ") and f"invalid {field}" in err, err
    assert allowed in err, err
    value = arguments[-1].split("=", 1)[-1]
    assert value in err, err  # the offending value is quoted back
    assert "Traceback" not in err
    assert not output.exists()


def test_there_are_at_least_fifteen_distinct_cases() -> None:
    assert len({field for _, field, _ in BAD_CONFIGS}) >= 15


def test_api_raises_config_error_with_the_field() -> None:
    with pytest.raises(ConfigError) as caught:
        run("fcnn", "cpu", micro_batch_size=0)
    assert caught.value.field == "micro_batch_size" and caught.value.value == 0
    with pytest.raises(ConfigError) as caught:
        run("fcnn", "cpu", unknown_option=1)
    assert caught.value.field == "unknown_option" and "allowed options are" in caught.value.allowed


def test_validation_touches_no_framework() -> None:
    """Refusal happens before PyTorch is even imported, so no device can have been touched."""
    code = (
        "import sys; from core.cli import main; rc = main(['run','fcnn','--batch-size','0']); "
        "assert rc == 2; assert 'torch' not in sys.modules and 'tensorflow' not in sys.modules"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert completed.returncode == 0, completed.stderr
    assert "Traceback" not in completed.stderr and "invalid micro_batch_size (--batch-size) = 0" in completed.stderr
