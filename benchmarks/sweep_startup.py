"""Wall time per run of a sweep of tiny runs: warm workers (each run forked from a parent that has
imported PyTorch once) against fresh interpreters (each run imports PyTorch again).

Six cells of the FCNN with one hidden layer of 8, a few steps each: the runs' own work is
milliseconds, so the time per run is process start-up. Warm and fresh sweeps alternate, each into
a database of its own, so drift in the machine hits both alike.

    .venv/bin/python benchmarks/sweep_startup.py [--pairs 5] [--json figures.json]

Prints, as medians over the pairs: the wall seconds per run after the first (the gaps between
runs being recorded: start-up, the run, its result stored), the first run's (warm: it waits for
the fork server's imports, once per sweep), the sweep's wall time over its runs, and the runs'
``process_seconds``. Target: warm <= 0.3 s per run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from core.base.results import RunResult
from core.storage.store import ResultStore
from core.sweep import Cell, SweepObserver, make_sweep_spec, run_sweep

TARGET_WARM_SECONDS_PER_RUN = 0.3


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


def measure(pairs: int, steps: int) -> dict[str, Any]:
    figures: dict[str, list[dict[str, Any]]] = {"warm": [], "fresh": []}
    with tempfile.TemporaryDirectory(prefix="core-sweep-startup-") as scratch:
        for index in range(pairs):
            # Alternate which goes first, so neither always follows the other.
            order = ("warm", "fresh") if index % 2 == 0 else ("fresh", "warm")
            for workers in order:
                figures[workers].append(one_sweep(workers, Path(scratch), index, steps))
    summary: dict[str, Any] = {"pairs": pairs, "runs_per_sweep": 6}
    for workers, sweeps in figures.items():
        summary[workers] = {
            "wall_seconds_per_run_median": statistics.median(s["wall_seconds_per_run"] for s in sweeps),
            "wall_seconds_per_run": [round(s["wall_seconds_per_run"], 3) for s in sweeps],
            "steady_seconds_per_run_median": statistics.median(s["steady_seconds_per_run"] for s in sweeps),
            "first_run_seconds_median": statistics.median(s["first_run_seconds"] for s in sweeps),
            "process_seconds_median": statistics.median(s["process_seconds_median"] for s in sweeps),
            "process_start": sorted({method for s in sweeps for method in s["process_start"]}),
        }
    summary["fresh_over_warm"] = (
        summary["fresh"]["wall_seconds_per_run_median"] / summary["warm"]["wall_seconds_per_run_median"]
    )
    summary["fresh_over_warm_steady"] = (
        summary["fresh"]["steady_seconds_per_run_median"] / summary["warm"]["steady_seconds_per_run_median"]
    )
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=5, help="warm and fresh sweeps, alternating")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per run")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    summary = measure(args.pairs, args.steps)
    for workers in ("warm", "fresh"):
        figures = summary[workers]
        print(
            f"{workers:5}: {figures['steady_seconds_per_run_median']:.3f} s per run after the first; "
            f"first run {figures['first_run_seconds_median']:.2f} s; sweep wall / runs "
            f"{figures['wall_seconds_per_run_median']:.3f} s ({figures['wall_seconds_per_run']}); "
            f"process {figures['process_seconds_median']:.3f} s; started {'/'.join(figures['process_start'])}"
        )
    warm = summary["warm"]["steady_seconds_per_run_median"]
    verdict = "meets" if warm <= TARGET_WARM_SECONDS_PER_RUN else "misses"
    print(
        f"fresh / warm: {summary['fresh_over_warm_steady']:.1f}x per run after the first, "
        f"{summary['fresh_over_warm']:.1f}x over the whole sweep (medians of {args.pairs} pairs); "
        f"warm {verdict} the target of <= {TARGET_WARM_SECONDS_PER_RUN} s per run"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
