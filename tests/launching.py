"""Starting worker scripts the way torchrun starts core's: shared by the multi-process tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def torchrun_two_ranks(script: Path, argument: Path, log_dir: Path) -> subprocess.CompletedProcess[str]:
    """Run ``script ARGUMENT`` as two gloo ranks under torchrun, from the repository root.

    torchrun keeps its logs in ``log_dir`` (without one it leaves a directory in /tmp each time).
    """
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            f"--log-dir={log_dir}",
            str(script),
            str(argument),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )


# A tiny FCNN: the runs below are about processes, not the model.
SMALL_FCNN = ["-o", "hidden_width=32", "-o", "input_width=64", "-o", "output_width=10", "--warmup-steps", "1"]


def start_long_run(**popen: Any) -> subprocess.Popen[str]:
    """``core run fcnn --replicas 2`` with a window far longer than any test: torchrun and two
    workers to kill, interrupt or watch. The caller must end it (``kill`` in a ``finally``)."""
    return subprocess.Popen(
        [sys.executable, "-m", "core.cli", "run", "fcnn", "--replicas", "2", "--batch-size", "8"]
        + ["--steps", "10000000", *SMALL_FCNN, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )
