"""Starting worker scripts the way torchrun starts core's: shared by the multi-process tests."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def torchrun_two_ranks(script: Path, argument: Path, log_dir: Path) -> subprocess.CompletedProcess[str]:
    """Run ``script ARGUMENT`` as two gloo ranks under torchrun, from the repository root.

    torchrun keeps its logs in ``log_dir`` (without one it leaves a directory in /tmp each time).
    """
    return torchrun_ranks(script, argument, log_dir, 2)


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


class LimitOnceWritten:
    """A clock for a run's time limit (``core.sweep.repeat.time``, or ``run_in_child(clock=...)``'s
    ``monotonic``) that is real time until a run under ``folder_glob`` in the temporary directory has
    written a partial result holding ``field``, then leaps past any limit: the run is stopped for its
    time limit in the phase the test means, however slowly a busy machine started it."""

    LEAP_SECONDS = 1e6

    def __init__(self, folder_glob: str, field: str) -> None:
        self._pattern = f"{folder_glob}/result.json.partial"
        self._field = field
        self._leap = 0.0

    def _written(self) -> bool:
        for path in Path(tempfile.gettempdir()).glob(self._pattern):
            try:
                if json.loads(path.read_text(encoding="utf-8")).get(self._field) is not None:
                    return True
            except (OSError, ValueError):  # being replaced: read it at the next call
                continue
        return False

    def monotonic(self) -> float:
        if not self._leap and self._written():
            self._leap = self.LEAP_SECONDS
        return time.monotonic() + self._leap


def torchrun_ranks(script: Path, argument: Path, log_dir: Path, ranks: int) -> subprocess.CompletedProcess[str]:
    """Run ``script ARGUMENT`` as ``ranks`` gloo ranks under torchrun, from the repository root, its
    logs in ``log_dir``."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={ranks}",
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
