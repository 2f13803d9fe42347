"""Inference benchmarks driven by MLPerf's LoadGen: the scenarios (offline, single-stream, server),
the system under test over a ``QuerySource``, and the figures read from LoadGen's logs.

See docs/inference.md ("LoadGen scenarios"). ``mlperf_loadgen`` is imported only when a run
starts (the ``inference`` extra), never when core is imported.
"""

from __future__ import annotations

from core.running.loadgen.outcome import LoadGenError, LoadGenOutcome
from core.running.loadgen.run import import_loadgen, run_scenario
from core.running.loadgen.settings import LoadGenSettings, Scenario, make_loadgen_settings
from core.running.loadgen.sut import QuerySource

__all__ = [
    "LoadGenError",
    "LoadGenOutcome",
    "LoadGenSettings",
    "QuerySource",
    "Scenario",
    "import_loadgen",
    "make_loadgen_settings",
    "run_scenario",
]
