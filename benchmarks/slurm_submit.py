"""Submit time and ``sbatch`` calls of a cluster sweep: job arrays against one job per repeat.

A sweep of ``--cells`` cells (one repeat each, the FCNN with one hidden layer of 8) is submitted
with ``--executor slurm`` as ``core sweep`` would, once as job arrays and once with
``job_arrays = false``; the sweep is stopped at its first poll (the jobs stay, as after Ctrl-C),
then every job it submitted is cancelled. Reported per mode: the seconds ``SlurmBackend.submit``
took (folders, requests, ledger, sbatch), the sbatch calls, and how many tasks per call.

``--slurm real`` submits to the Slurm on PATH (scripts/local-slurm.sh starts a single-host one);
``--slurm fake`` puts counting stand-ins for sbatch, scontrol, squeue, scancel and sinfo first on
PATH (``--max-array-size`` is what the fake scontrol reports): each call still starts a process, as
sbatch does, but no controller answers, so the figure leaves out slurmctld's time per job.

    .venv/bin/python benchmarks/slurm_submit.py --cells 200 --slurm real
    .venv/bin/python benchmarks/slurm_submit.py --cells 19440 --slurm fake --modes arrays
    .venv/bin/python benchmarks/slurm_submit.py --cells 2000 --slurm fake --modes single
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext, redirect_stderr
from pathlib import Path
from typing import Any

import core.sweep.cluster
import core.sweep.slurm_jobs
from core.sweep import run_sweep
from core.sweep.cluster import LEDGER_NAME, SlurmBackend
from core.sweep.loop import Repeat

MODES = ("arrays", "single")

_FAKE_SBATCH = """#!/bin/bash
# A counting stand-in for sbatch --parsable: one line per call in $COUNT, a new id each time.
n=$(( $(wc -l < "$COUNT") + 1 ))
printf '%s\\n' "$*" >> "$COUNT"
echo $(( 1000 + n ))
"""
_FAKE_SCONTROL = '#!/bin/bash\necho "MaxArraySize            = $MAX_ARRAY_SIZE"\n'
_FAKE_QUIET = "#!/bin/bash\nexit 0\n"
_FAKE_SINFO = "#!/bin/bash\necho debug\n"


class _StopAtFirstPoll(KeyboardInterrupt):
    """Raised at the sweep's first poll: every job is submitted, and stays, as after Ctrl-C."""


class _Counting:
    """The cluster's scheduler, its sbatch calls counted; the sweep stops when it first polls."""

    def __init__(self) -> None:
        self.inner = core.sweep.slurm_jobs.SlurmScheduler()
        self.sbatch_calls = 0

    def submit(self, script: Path, options: Sequence[str], **where: Any) -> str:
        self.sbatch_calls += 1
        return self.inner.submit(script, options, **where)

    def states(self, job_ids: Sequence[str]) -> dict[str, str | None]:
        raise _StopAtFirstPoll

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def sweep_file(folder: Path, cells: int, *, arrays: bool) -> Path:
    path = folder / f"submit-{'arrays' if arrays else 'single'}.toml"
    steps = ", ".join(str(step) for step in range(1, cells + 1))
    path.write_text(
        f'name = "submit-{"arrays" if arrays else "single"}"\nrepeats = 1\ntimeout_seconds = 60\n'
        f'[grid]\nworkload = "fcnn"\naccelerator = "cpu"\nsteps = [{steps}]\nmicro_batch_size = 4\n'
        "workload_options = {layers = 1, hidden_width = 8}\n"
        f"[slurm]\nexclusive = false\ntime_limit_minutes = 5\njob_arrays = {str(arrays).lower()}\n"
    )
    return path


@contextmanager
def fake_slurm(folder: Path, max_array_size: int) -> Iterator[Path]:
    """Counting stand-ins for Slurm's commands first on PATH; yields the file sbatch counts in."""
    bin_folder = folder / "fake-slurm"
    bin_folder.mkdir()
    for name, text in (
        ("sbatch", _FAKE_SBATCH),
        ("scontrol", _FAKE_SCONTROL),
        ("squeue", _FAKE_QUIET),
        ("scancel", _FAKE_QUIET),
        ("sacct", _FAKE_QUIET),
        ("sinfo", _FAKE_SINFO),
    ):
        (bin_folder / name).write_text(text)
        (bin_folder / name).chmod(0o755)
    count = folder / "sbatch-calls"
    count.write_text("")
    saved = {name: os.environ.get(name) for name in ("PATH", "COUNT", "MAX_ARRAY_SIZE")}
    os.environ.update(PATH=f"{bin_folder}:{os.environ['PATH']}", COUNT=str(count), MAX_ARRAY_SIZE=str(max_array_size))
    core.sweep.slurm_jobs.unavailable_reason.cache_clear()
    try:
        yield count
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        core.sweep.slurm_jobs.unavailable_reason.cache_clear()


def submit_once(folder: Path, cells: int, *, arrays: bool) -> dict[str, Any]:
    """Submit one sweep, stop it at its first poll, cancel its jobs; its figures."""
    scheduler = _Counting()
    timed: dict[str, float] = {}
    original_submit = SlurmBackend.submit

    def submit(backend: SlurmBackend, repeats: Sequence[Repeat]) -> list[Repeat]:
        started = time.perf_counter()
        try:
            return original_submit(backend, repeats)
        finally:
            timed["submit_seconds"] = time.perf_counter() - started

    saved_scheduler = core.sweep.cluster.make_scheduler
    core.sweep.cluster.make_scheduler = lambda: scheduler
    SlurmBackend.submit = submit  # type: ignore[method-assign]
    database = folder / f"{'arrays' if arrays else 'single'}.db"
    planned = time.perf_counter()
    try:
        with redirect_stderr(io.StringIO()):  # the stopped sweep's line naming every job it leaves
            run_sweep(sweep_file(folder, cells, arrays=arrays), database=database, executor="slurm")
    except _StopAtFirstPoll:
        pass
    finally:
        core.sweep.cluster.make_scheduler = saved_scheduler
        SlurmBackend.submit = original_submit  # type: ignore[method-assign]
    total = time.perf_counter() - planned
    name = f"submit-{'arrays' if arrays else 'single'}"
    jobs = json.loads((Path(f"{database}.jobs") / name / LEDGER_NAME).read_text())["jobs"]
    submitted = sorted({job["job_id"].split("_")[0] for job in jobs if job["job_id"]})
    subprocess.run(["scancel", *submitted], check=False)  # an array's id cancels its tasks
    return {
        "mode": "arrays" if arrays else "single",
        "cells": cells,
        "jobs_in_ledger": len(jobs),
        "sbatch_calls": scheduler.sbatch_calls,
        "submit_seconds": round(timed.get("submit_seconds", float("nan")), 3),
        "sweep_seconds_to_first_poll": round(total, 3),
        "max_array_size": scheduler.inner.max_array_size() if arrays else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", type=int, default=200)
    parser.add_argument("--slurm", choices=("real", "fake"), default="fake")
    parser.add_argument("--modes", default=",".join(MODES), help="arrays,single")
    parser.add_argument("--max-array-size", type=int, default=1001, help="what the fake scontrol reports")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    if not set(modes) <= set(MODES):
        parser.error(f"--modes: each of {', '.join(MODES)}, not {args.modes!r}")
    figures = []
    with tempfile.TemporaryDirectory(prefix="core-slurm-submit-", dir=os.environ.get("CORE_BENCH_DIR")) as scratch:
        folder = Path(scratch)
        for mode in modes:
            (folder / mode).mkdir()
            with fake_slurm(folder / mode, args.max_array_size) if args.slurm == "fake" else nullcontext():
                figures.append(submit_once(folder / mode, args.cells, arrays=mode == "arrays"))
            figures[-1]["slurm"] = args.slurm
            print(json.dumps(figures[-1]), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
