"""Wall time per run of a sweep of tiny runs: warm workers (each run forked from a parent that has
imported PyTorch once) against fresh interpreters (each run imports PyTorch again).

Six cells of the FCNN with one hidden layer of 8, a few steps each: the runs' own work is
milliseconds, so the time per run is process start-up. The sweeps of each mode alternate (the
order turning each round), each into a database of its own, so drift in the machine hits all alike:

* ``warm``: one ``run_sweep`` (its fork server starts while it plans; this process has imported
  PyTorch already, so planning is short and the first run waits for most of the server's imports);
* ``kept``: a second sweep inside a ``keep_warm_workers()`` block whose first sweep (a ``warm``
  one) started the fork server: it finds the server ready;
* ``fresh``: ``--workers fresh``;
* ``cold``: ``warm`` in a new interpreter, as ``core sweep FILE`` runs it: there the sweep's own
  planning imports PyTorch while the fork server does (the figures count from ``run_sweep``'s call).

    .venv/bin/python benchmarks/sweep_startup.py [--pairs 5] [--modes warm,kept,fresh,cold] [--json figures.json]

Prints, as medians over the rounds with their spread (min-max): the sweep's wall time over its runs,
first run included (targets: warm <= 0.2 s per run in ``kept``; the issue's ``<= 0.2 s`` holds for
a process that runs several sweeps), the marginal seconds per run (the gaps between runs being
recorded after the first: start-up, the run, its result stored; target <= 0.1 s), the first run's
seconds, and the runs' ``process_seconds``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from core.base.results import RunResult
from core.storage.store import ResultStore
from core.sweep import Cell, SweepObserver, make_sweep_spec, run_sweep

TARGET_SECONDS_PER_RUN = 0.2  # first run included, sweep wall time over its runs
TARGET_MARGINAL_SECONDS_PER_RUN = 0.1
MODES = ("warm", "kept", "fresh", "cold")

# A sweep in an interpreter of its own (mode "cold"): its figures as JSON on the last line.
_COLD_SWEEP = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import sweep_startup
print(json.dumps(sweep_startup.one_sweep("warm", Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))))
"""


def sweep_spec(name: str, steps: int = 3) -> Any:
    return make_sweep_spec(
        {
            "name": name,
            "repeats": 1,
            "timeout_seconds": 300,
            "grid": {
                "workload": "fcnn",
                "accelerator": "cpu",
                "micro_batch_size": [8, 16, 32],
                "precision": ["fp32", "bf16"],
                "steps": steps,
                "warmup_steps": 1,
                "threads_per_replica": 1,
                "power_meter": "none",
                "workload_options": {"layers": 1, "hidden_width": 8},
            },
        }
    )


class FinishTimes(SweepObserver):
    """When each run was recorded: the gaps between them are the wall time per run, start to stored."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def run_finished(self, cell: Cell, repeat: int, result: RunResult, process_seconds: float) -> None:
        self.times.append(time.perf_counter())


def one_sweep(workers: str, directory: Path, index: int, steps: int) -> dict[str, Any]:
    """One 6-cell sweep; its wall seconds per run, its runs' process seconds, and how each started."""
    database = directory / f"{workers}-{index}.db"
    spec = sweep_spec(f"startup-{workers}-{index}", steps)
    finished = FinishTimes()
    started = time.perf_counter()
    outcome = run_sweep(spec, database=database, workers=workers, observer=finished)  # type: ignore[arg-type]
    wall = time.perf_counter() - started
    gaps = [later - earlier for earlier, later in zip(finished.times, finished.times[1:])]
    with ResultStore(database) as store:
        runs = store.runs(sweep=spec.name)
        process_seconds = store.process_seconds(spec.name)
    starts = sorted({run.result.process_start.method for run in runs if run.result.process_start is not None})
    failed = [run.result.status.message for run in runs if not run.result.status.ok]
    if failed:
        raise SystemExit(f"a {workers} run failed: {failed[0]}")
    return {
        "wall_seconds_per_run": wall / outcome.runs_done,
        # After the first run (which, warm, waits for the fork server's imports): each run's wall time.
        "steady_seconds_per_run": statistics.median(gaps),
        "first_run_seconds": finished.times[0] - started,
        "process_seconds_median": statistics.median(process_seconds),
        "process_start": starts,
    }


def cold_sweep(directory: Path, index: int, steps: int) -> dict[str, Any]:
    """``one_sweep("warm", ...)`` in a new interpreter, as ``core sweep`` would run it."""
    ran = subprocess.run(
        [sys.executable, "-c", _COLD_SWEEP, str(Path(__file__).parent), str(directory), str(index), str(steps)],
        capture_output=True,
        text=True,
        check=False,
    )
    if ran.returncode != 0:
        raise SystemExit(f"a cold sweep failed: {ran.stderr[-2000:]}")
    figures: dict[str, Any] = json.loads(ran.stdout.strip().splitlines()[-1])
    return figures


def warm_then_kept(directory: Path, index: int, steps: int, with_kept: bool) -> tuple[dict[str, Any], Any]:
    """A warm sweep and, with ``with_kept``, a second one in the same ``keep_warm_workers()`` block:
    the first starts the fork server (a ``warm`` sweep's figures), the second finds it ready."""
    if not with_kept:
        return one_sweep("warm", directory, index, steps), None
    from core.sweep import keep_warm_workers  # absent before issue 34

    with keep_warm_workers():
        first = one_sweep("warm", directory, index, steps)
        return first, one_sweep("warm", directory, 2000 + index, steps)


def _spread(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "all": values}


def measure(pairs: int, steps: int, modes: tuple[str, ...] = ("warm", "kept", "fresh")) -> dict[str, Any]:
    figures: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    # warm and kept come from one block (kept is its second sweep); the others alternate with it.
    turns = [mode for mode in modes if mode != "kept"] or ["warm"]
    with tempfile.TemporaryDirectory(prefix="core-sweep-startup-") as scratch:
        directory = Path(scratch)
        for index in range(pairs):
            # Turn the order each round, so that no mode always follows another.
            turn = index % len(turns)
            for mode in turns[turn:] + turns[:turn]:
                if mode == "cold":
                    figures[mode].append(cold_sweep(directory, 1000 + index, steps))
                elif mode == "fresh":
                    figures[mode].append(one_sweep("fresh", directory, index, steps))
                else:
                    warm, kept = warm_then_kept(directory, index, steps, "kept" in modes)
                    if "warm" in modes:
                        figures["warm"].append(warm)
                    if kept is not None:
                        figures["kept"].append(kept)
    summary: dict[str, Any] = {"pairs": pairs, "runs_per_sweep": 6}
    for mode, sweeps in figures.items():
        summary[mode] = {
            "seconds_per_run": _spread([round(s["wall_seconds_per_run"], 4) for s in sweeps]),
            "marginal_seconds_per_run": _spread([round(s["steady_seconds_per_run"], 4) for s in sweeps]),
            "first_run_seconds": _spread([round(s["first_run_seconds"], 3) for s in sweeps]),
            "process_seconds_median": statistics.median(s["process_seconds_median"] for s in sweeps),
            "process_start": sorted({method for s in sweeps for method in s["process_start"]}),
        }
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=5, help="rounds: one sweep of each mode per round")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per run")
    parser.add_argument("--modes", default="warm,kept,fresh", help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    modes = tuple(mode for mode in args.modes.split(",") if mode)
    if not modes or any(mode not in MODES for mode in modes):
        parser.error(f"--modes: choose from {', '.join(MODES)}")
    summary = measure(args.pairs, args.steps, modes)

    def spread(figures: dict[str, Any]) -> str:
        return f"{figures['median']:.3f} s ({figures['min']:.3f}-{figures['max']:.3f})"

    for mode in modes:
        figures = summary[mode]
        print(
            f"{mode:5}: {spread(figures['seconds_per_run'])} per run, first included; marginal "
            f"{spread(figures['marginal_seconds_per_run'])}; first run {spread(figures['first_run_seconds'])}; "
            f"process {figures['process_seconds_median']:.3f} s; started {'/'.join(figures['process_start'])}"
        )
    for mode in ("kept", "warm", "cold"):
        if mode in modes:
            per_run = summary[mode]["seconds_per_run"]["median"]
            marginal = summary[mode]["marginal_seconds_per_run"]["median"]
            print(
                f"{mode}: {'meets' if per_run <= TARGET_SECONDS_PER_RUN else 'misses'} <= {TARGET_SECONDS_PER_RUN} s "
                f"per run; marginal {'meets' if marginal <= TARGET_MARGINAL_SECONDS_PER_RUN else 'misses'} <= "
                f"{TARGET_MARGINAL_SECONDS_PER_RUN} s (medians of {args.pairs} rounds)"
            )
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
