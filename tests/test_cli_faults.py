"""The `core` command under faults: closed pipes, bad or full output paths, plugin code that raises.

Each reproduces a defect from issue 11 and asserts a clear message and exit code, no traceback,
nothing measured lost and no partial file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest
from filesystems import fill, mounted_tmpfs

from core import Accelerator, Availability, Precision, hookimpl
from core.cli import format_result, main
from core.testing import TINY_FCNN, registered_plugins

TINY_RUN = [
    "run",
    "fcnn",
    "--steps",
    "2",
    "--warmup-steps",
    "0",
    "--batch-size",
    "4",
    "--power-meter",
    "none",
    *[item for key, value in TINY_FCNN.items() for item in ("-o", f"{key}={value}")],
]


def shell(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", command],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
    )


@pytest.mark.slow
@pytest.mark.parametrize("command", ["core plugins", "core workloads", "core plugins --verbose"])
def test_a_closed_pipe_ends_quietly(command: str) -> None:
    # `head -c 1` leaves after one byte, long before the listing is written.
    completed = shell(f'{command} | head -c 1 >/dev/null; echo "exit=${{PIPESTATUS[0]}}" >&2')
    assert "Traceback" not in completed.stderr and "BrokenPipeError" not in completed.stderr, completed.stderr
    assert completed.stderr.strip().splitlines()[-1] in ("exit=0", "exit=141")


def test_output_that_is_a_directory_is_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([*TINY_RUN, "--output", str(tmp_path)])
    captured = capsys.readouterr()
    assert code == 2
    assert f"--output {tmp_path} is a directory" in captured.err
    assert captured.out == ""  # refused before running: nothing measured, nothing printed


def test_a_file_in_the_way_of_the_output_folder_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "plain").write_text("not a folder")
    code = main([*TINY_RUN, "--output", str(tmp_path / "plain" / "sub" / "result.json")])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert f"{tmp_path / 'plain'} is a file, not a folder" in captured.err


def test_output_parents_are_created_and_the_file_is_whole(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "a" / "b" / "result.json"
    assert main([*TINY_RUN, "--output", str(target)]) == 0
    assert json.loads(target.read_text())["status"]["state"] == "ok"
    assert [path.name for path in target.parent.iterdir()] == ["result.json"]  # no temporary left


def test_a_full_disk_keeps_the_result_and_leaves_no_partial_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with mounted_tmpfs(tmp_path, 16) as disk:
        fill(disk / "filler")
        target = disk / "result.json"
        code = main([*TINY_RUN, "--json", "--output", str(target)])
        captured = capsys.readouterr()
        left = sorted(path.name for path in disk.iterdir())
    assert code == 1
    assert "no space left on the device (ENOSPC)" in captured.err and "the result is printed above" in captured.err
    assert json.loads(captured.out)["status"]["state"] == "ok"  # what was measured reached the terminal
    assert left == ["filler"]  # neither the result nor a temporary file


class _BrokenExecutorAccelerator(Accelerator):
    name: ClassVar[str] = "broken-executor"

    def availability(self) -> Availability:
        return Availability.yes()

    def precisions(self, framework: Any) -> tuple[Precision, ...]:
        return (Precision.fp32,)

    def max_replicas(self, config: Any) -> int:
        return 1

    def devices(self) -> list[Any]:
        return []

    def create_executor(self, workload: Any, config: Any, process: Any) -> Any:
        return {}["device handle"]  # a plugin bug: KeyError


class _Plugin:
    @hookimpl
    def core_register_accelerators(self, register: Callable[[Accelerator], None]) -> None:
        register(_BrokenExecutorAccelerator())


def test_a_run_failing_in_plugin_code_names_the_file_and_line(capsys: pytest.CaptureFixture[str]) -> None:
    with registered_plugins(_Plugin()):
        code = main(["run", "fcnn", "--accelerator", "broken-executor", "--steps", "1"])
        shown = capsys.readouterr()
        assert code == 1
        assert "error           in setup: KeyError: 'device handle'" in shown.out
        assert f"raised at       {__file__}:" in shown.out and "in create_executor" in shown.out
        assert "Traceback" not in shown.err

        assert main(["run", "fcnn", "--accelerator", "broken-executor", "--steps", "1", "--debug"]) == 1
        debug = capsys.readouterr()
        assert "Traceback (most recent call last)" in debug.err and 'return {}["device handle"]' in debug.err


def test_updates_and_host_calls_are_labelled_apart() -> None:
    from core.base.results import RunResult

    with registered_plugins():
        from core.api import run

        result = run(
            "fcnn", "cpu", steps=2, warmup_steps=0, micro_batch_size=4, workload_options=TINY_FCNN, power_meter="none"
        )
    assert "2 updates)" in format_result(result)
    # Four updates per host call (device iterations, as on an IPU): eight updates in two calls.
    ipu_like: RunResult = result.model_copy(update={"window_updates": 8, "window_steps": 2})
    assert "8 updates in 2 host calls" in format_result(ipu_like)


def test_a_split_replica_prints_its_mesh_and_a_plain_one_none() -> None:
    from core.base.config import make_config
    from core.base.results import RunResult

    plain = RunResult.of_config(make_config(workload="gpt-800m", accelerator="cpu", micro_batch_size=2), world_size=1)
    assert "placement" not in format_result(plain)
    config = make_config(
        workload="gpt-800m",
        accelerator="cpu",
        replicas=2,
        devices_per_replica=4,
        tensor_parallel=2,
        gradient_accumulation=4,
        sharding="fsdp",
        recompute="selective",
        micro_batch_size=2,
    )
    split = RunResult.of_config(config, world_size=8)
    split.executor_details = {"sequence_parallel": True, "pipeline": {"schedule": "1f1b"}}
    assert (
        "  placement       data 2 x pipeline 2 x tensor 2 (8 processes), sequence parallel, sharding fsdp, "
        "recompute selective, schedule 1f1b"
    ) in format_result(split)
