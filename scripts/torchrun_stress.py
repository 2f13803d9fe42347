#!/usr/bin/env python3
"""Run the two-replica torchrun case many times beside CPU hogs and count the failures.

    .venv/bin/python scripts/torchrun_stress.py                 # 20 runs, 3 busy loops per core
    .venv/bin/python scripts/torchrun_stress.py --case core-run # `core run fcnn --replicas 2` instead
    .venv/bin/python scripts/torchrun_stress.py --without-fix   # the abort, for comparison

Not a CI test: it takes minutes and loads every core. The case ``test`` is the worker of
tests/test_torch_executor.py::test_two_torchrun_replicas_equal_one_process_with_the_whole_batch
(one DDP update on 2 gloo ranks, rank 0 saves its weights, both close the executor and exit), run
with torchrun exactly as that test does. Under load one rank used to die at exit with SIGABRT
("terminate called without an active exception"): gloo's worker thread released the last
gradient all-reduce, which holds a Python object, while the interpreter was finalizing (see
core.base.distributed.release_finished_collectives). ``--without-fix`` turns that wait off in the
workers, to show the failure rate without it.

Exit status: 0 when every run passed, 1 otherwise. The output of failed runs is kept with --logs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from core.running import processes  # noqa: E402

_HOG = "from core.running.processes import die_with_parent\ndie_with_parent()\nwhile True:\n    pass\n"
_NO_FIX = (
    "import core.base.distributed\ncore.base.distributed.release_finished_collectives = lambda *args, **kwargs: None\n"
)


def test_case_command(directory: Path, without_fix: bool) -> list[str]:
    from test_torch_executor import OPTIONS, WORKER

    script = directory / "worker.py"
    script.write_text((_NO_FIX if without_fix else "") + WORKER.format(options=OPTIONS), encoding="utf-8")
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        f"--log-dir={directory / 'torchelastic'}",
        str(script),
        str(directory / "state.pt"),
    ]


def core_run_command(directory: Path, without_fix: bool) -> list[str]:
    if without_fix:
        raise SystemExit("--without-fix applies to --case test only")
    return [
        sys.executable,
        "-m",
        "core.cli",
        "run",
        "fcnn",
        "--replicas",
        "2",
        "--batch-size",
        "8",
        "--steps",
        "3",
        "--warmup-steps",
        "1",
        "-o",
        "hidden_width=32",
        "-o",
        "input_width=64",
        "-o",
        "output_width=10",
        "--output",
        str(directory / "result.json"),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--hogs-per-core", type=int, default=3, help="busy-loop processes per CPU core")
    parser.add_argument("--case", choices=("test", "core-run"), default="test")
    parser.add_argument("--without-fix", action="store_true", help="turn the fix off in the workers")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds one run may take")
    parser.add_argument("--logs", type=Path, help="keep the output of failed runs in this folder")
    args = parser.parse_args(argv)

    cores = os.cpu_count() or 1
    hogs = [
        processes.start([sys.executable, "-c", _HOG], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(args.hogs_per_core * cores)
    ]
    failures: list[tuple[int, str]] = []
    started = time.monotonic()
    try:
        print(
            f"{args.runs} runs of case {args.case!r}{' WITHOUT the fix' if args.without_fix else ''} beside "
            f"{len(hogs)} busy loops on {cores} cores",
            flush=True,
        )
        for run in range(1, args.runs + 1):
            with tempfile.TemporaryDirectory(prefix="core-stress-") as scratch:
                directory = Path(scratch)
                command = (test_case_command if args.case == "test" else core_run_command)(directory, args.without_fix)
                began = time.monotonic()
                try:
                    completed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout)
                    code, output = completed.returncode, completed.stdout + completed.stderr
                except subprocess.TimeoutExpired as expired:
                    code, output = (
                        None,
                        f"timed out after {args.timeout:g} s\n{expired.stdout or ''}{expired.stderr or ''}",
                    )
                seconds = time.monotonic() - began
                aborted = "terminate called" in output or "SIGABRT" in output
                verdict = "ok" if code == 0 else ("ABORT" if aborted else "FAILED")
                print(f"run {run:3d}: {verdict:6s} exit {code}  {seconds:5.1f} s", flush=True)
                if code != 0:
                    failures.append((run, output))
                    if args.logs is not None:
                        args.logs.mkdir(parents=True, exist_ok=True)
                        (args.logs / f"run-{run}.log").write_text(output, encoding="utf-8")
    finally:
        for hog in hogs:
            processes.stop_process_group(hog, grace_seconds=1.0)
    print(
        f"{len(failures)} of {args.runs} runs failed ({sum('terminate called' in out for _, out in failures)} "
        f"with 'terminate called'); load: {len(hogs)} busy loops on {cores} cores; "
        f"{time.monotonic() - started:.0f} s in all",
        flush=True,
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
