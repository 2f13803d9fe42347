"""Sweeps: a grid of runs declared in a file, each run in its own process, every result stored.

    from core import run_sweep
    outcome = run_sweep("examples/fcnn-cpu-sweep.toml", database="results/core.db")

The grid file (TOML, YAML or JSON) names RunConfig fields; a list is an axis, a scalar is shared:

    name = "fcnn-cpu"
    repeats = 3
    [grid]
    workload = "fcnn"
    micro_batch_size = [64, 256, 1024]
    precision = ["fp32", "bf16"]

Every cell is validated (``core.running.planning.plan_run``) once, before anything runs. Each
repeat runs that plan in a process of its own (``core.running.child``) with a time limit, so an
out-of-memory error, a crash or a hang becomes a recorded result and the sweep goes on. Each result
is committed to the database as it arrives; ``resume=True`` runs only what is missing.
"""

from __future__ import annotations

from core.sweep.loop import SweepBackend, SweepObserver, SweepOutcome
from core.sweep.plan import Cell, SweepPlan, cell_key, describe_config_error, expand_cells, plan_sweep
from core.sweep.repeat import STOP_GRACE_SECONDS, keep_warm_workers, run_in_process, worker_command
from core.sweep.run import run_sweep
from core.sweep.spec import (
    DEFAULT_REPEATS,
    DEFAULT_TIMEOUT_SECONDS,
    MAX_SWEEP_FILE_BYTES,
    SweepError,
    SweepSpec,
    UnsavedResultError,
    load_sweep,
    make_sweep_spec,
    read_sweep_document,
    shown,
)

# The package's modules, in the order a sweep uses them:
#   spec    the sweep file, read with limits and validated strictly
#   plan    the grid's cells, each validated as a run
#   repeat  one repeat in its own process, with a time limit
#   loop    the one sweep loop: what is pending, each ended repeat recorded once, failed cells stopped
#   run     the sweep's checks, resume, the database lock; the local backend (cluster: the Slurm one)
__all__ = [
    "DEFAULT_REPEATS",
    "DEFAULT_TIMEOUT_SECONDS",
    "MAX_SWEEP_FILE_BYTES",
    "STOP_GRACE_SECONDS",
    "Cell",
    "SweepBackend",
    "SweepError",
    "SweepObserver",
    "SweepOutcome",
    "SweepPlan",
    "SweepSpec",
    "UnsavedResultError",
    "cell_key",
    "describe_config_error",
    "expand_cells",
    "keep_warm_workers",
    "load_sweep",
    "make_sweep_spec",
    "plan_sweep",
    "read_sweep_document",
    "run_in_process",
    "run_sweep",
    "shown",
    "worker_command",
]
