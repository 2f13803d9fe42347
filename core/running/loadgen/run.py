"""One LoadGen performance run over a ``QuerySource``: settings in, ``LoadGenOutcome`` out.

LoadGen is imported here, lazily, so that core imports without it (the ``inference`` extra).
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from core.running.loadgen.outcome import LOG_FILES, LoadGenError, LoadGenOutcome, read_outcome
from core.running.loadgen.settings import (
    LoadGenSettings,
    Scenario,
    check_query_memory,
    check_server_span,
    check_source_counts,
)
from core.running.loadgen.sut import AnsweringSource, QueryAnswerer, QuerySource, WindowCallback

INSTALL_HINT = "pip install 'core[inference]' (the mlcommons-loadgen package)"
# Read from the log directory, never the working directory: LoadGen applies an audit.config it
# finds there over the settings given (MLPerf's compliance tests use that on purpose).
AUDIT_CONFIG_FILE = "audit.config"
# LoadGen keeps its logger and issue controller in process-wide singletons: one test at a time.
_LOADGEN_IN_USE = threading.Lock()


def import_loadgen() -> ModuleType:
    """``mlperf_loadgen``, or ``LoadGenError`` saying how to install it."""
    try:
        import mlperf_loadgen
    except ImportError as exc:
        raise LoadGenError(f"MLPerf LoadGen (mlperf_loadgen) is not importable: {exc}; {INSTALL_HINT}") from exc
    return mlperf_loadgen


def _scenario(lg: Any, scenario: Scenario) -> Any:
    return {
        "offline": lg.TestScenario.Offline,
        "single-stream": lg.TestScenario.SingleStream,
        "server": lg.TestScenario.Server,
    }[scenario]


def _nanoseconds(seconds: float) -> int:
    # at least 1: LoadGen reads 0 as a latency no query meets (or, expected, as infinitely many queries)
    return max(round(seconds * 1e9), 1)


def _milliseconds(seconds: float) -> int:
    return round(seconds * 1e3)


def loadgen_test_settings(lg: Any, settings: LoadGenSettings) -> Any:
    """LoadGen's ``TestSettings`` for ``settings``: every field core decides is set explicitly,
    so neither LoadGen's defaults nor an mlperf.conf choose them."""
    test = lg.TestSettings()
    test.scenario = _scenario(lg, settings.scenario)
    test.mode = lg.TestMode.PerformanceOnly
    test.min_duration_ms = _milliseconds(settings.min_duration_seconds)
    test.max_duration_ms = 0 if settings.max_duration_seconds is None else _milliseconds(settings.max_duration_seconds)
    test.min_query_count = settings.min_query_count
    test.max_query_count = settings.max_query_count or 0  # 0: no limit
    if settings.offline_expected_samples_per_second is not None:
        test.offline_expected_qps = settings.offline_expected_samples_per_second
    test.single_stream_expected_latency_ns = _nanoseconds(settings.single_stream_expected_latency_seconds)
    test.single_stream_target_latency_percentile = settings.single_stream_target_latency_percentile
    if settings.server_target_samples_per_second is not None:
        test.server_target_qps = settings.server_target_samples_per_second
    test.server_target_latency_ns = _nanoseconds(settings.server_target_latency_seconds)
    test.server_target_latency_percentile = settings.server_target_latency_percentile
    # LoadGen itself calls IssueQuery (no registered issue threads), one sample per server query.
    test.server_num_issue_query_threads = 0
    test.server_coalesce_queries = False
    test.qsl_rng_seed = settings.seed
    test.sample_index_rng_seed = settings.seed
    test.schedule_rng_seed = settings.seed
    test.accuracy_log_probability = 0.0  # performance only: the responses carry no data
    return test


def loadgen_log_settings(lg: Any, log_dir: Path) -> Any:
    """LoadGen writes its logs to ``log_dir`` under their standard names, nothing to stdout, no trace
    (a per-sample trace costs time in the measured window)."""
    logs = lg.LogSettings()
    logs.log_output.outdir = str(log_dir)
    logs.log_output.prefix = "mlperf_log_"
    logs.log_output.suffix = ""
    logs.log_output.prefix_with_datetime = False
    logs.log_output.copy_detail_to_stdout = False
    logs.log_output.copy_summary_to_stdout = False
    logs.enable_trace = False
    return logs


def run_scenario(
    source: QuerySource,
    settings: LoadGenSettings,
    log_dir: Path,
    *,
    on_window_open: WindowCallback | None = None,
    on_window_close: WindowCallback | None = None,
) -> LoadGenOutcome:
    """Run LoadGen's ``settings.scenario`` in performance mode against ``source``.

    :param source: the samples and the model; ``infer`` is called with at most
        ``settings.max_batch_size`` indices, all of them loaded.
    :param log_dir: created if missing; LoadGen's four log files go there (earlier ones are replaced).
    :param on_window_open: called (on the calling thread) once the samples are loaded, just before
        LoadGen starts issuing: start a power meter here.
    :param on_window_close: called once every sample is answered, before the samples are unloaded.
    :returns: LoadGen's figures and verdict, the host's timing of the window, the summary verbatim.
    :raises: whatever ``source`` or a window callback raised (the first of them), once LoadGen has
        ended; ``ConfigError`` for a source whose sample counts LoadGen cannot take, or settings
        whose queries would not fit in memory (``check_query_memory``); ``LoadGenError`` if
        LoadGen is not installed, is already running a test in this process, failed inside (an
        exception out of its native code, ``std::bad_alloc`` among them) or left no result.
    """
    check_source_counts(source.total_samples, source.performance_samples)
    check_query_memory(settings, loaded_samples=source.performance_samples)
    check_server_span(settings)
    lg = import_loadgen()
    if not _LOADGEN_IN_USE.acquire(blocking=False):
        raise LoadGenError("a LoadGen test is already running in this process; LoadGen runs one at a time")
    try:
        log_dir = Path(log_dir).resolve()
        log_dir.mkdir(parents=True, exist_ok=True)
        for name in LOG_FILES:
            # A stale summary must not pass for this run's if LoadGen cannot write its own.
            (log_dir / name).unlink(missing_ok=True)
        return _run_locked(source, settings, log_dir, lg, on_window_open, on_window_close)
    finally:
        _LOADGEN_IN_USE.release()


def _run_locked(
    source: QuerySource,
    settings: LoadGenSettings,
    log_dir: Path,
    lg: Any,
    on_window_open: WindowCallback | None,
    on_window_close: WindowCallback | None,
) -> LoadGenOutcome:
    answerer = QueryAnswerer(
        source,
        lg,
        max_batch_size=1 if settings.scenario == "single-stream" else settings.max_batch_size,
        answer_on_worker=settings.scenario == "server",
        on_window_open=on_window_open,
        on_window_close=on_window_close,
    )
    sut = qsl = None
    # Queries as two lists of numbers (no Python object per sample), where this LoadGen has it.
    fast = hasattr(lg, "ConstructFastSUT")
    # Offline and single-stream answer on this thread: the model's thread state is set up once.
    inline = settings.scenario != "server"
    answering = source.answering() if inline and isinstance(source, AnsweringSource) else contextlib.nullcontext()
    try:
        if fast:
            sut = lg.ConstructFastSUT(answerer.issue_query, answerer.flush_queries)
        else:
            sut = lg.ConstructSUT(answerer.issue_queries, answerer.flush_queries)
        qsl = lg.ConstructQSL(
            source.total_samples, source.performance_samples, answerer.load_samples, answerer.unload_samples
        )
        started = time.perf_counter()
        try:
            with answering:
                lg.StartTestWithLogSettings(
                    sut,
                    qsl,
                    loadgen_test_settings(lg, settings),
                    loadgen_log_settings(lg, log_dir),
                    str(log_dir / AUDIT_CONFIG_FILE),
                )
        except Exception as exc:
            # Out of LoadGen's native code (the callbacks keep their own faults): LoadGen's own
            # failure, not the model's, even as a MemoryError (std::bad_alloc).
            raise LoadGenError(_describe_native_failure(exc)) from exc
        start_test_seconds = time.perf_counter() - started
    finally:
        answerer.stop()
        if qsl is not None:
            lg.DestroyQSL(qsl)
        if sut is not None:
            (lg.DestroyFastSUT if fast else lg.DestroySUT)(sut)
    answerer.raise_failure()
    return read_outcome(
        log_dir,
        settings.scenario,
        samples_answered=answerer.samples_answered,
        start_test_seconds=start_test_seconds,
        window_start_perf_counter=answerer.window_start_perf_counter,
        window_end_perf_counter=answerer.window_end_perf_counter,
    )


def _describe_native_failure(exc: Exception) -> str:
    """A LoadGen failure in words that say whose it is. Not "out of memory" for std::bad_alloc:
    that is the model's state (oom); here LoadGen could not allocate its own queries."""
    what = "std::bad_alloc: LoadGen could not allocate its queries" if isinstance(exc, MemoryError) else str(exc)
    return (
        f"LoadGen failed inside its test ({type(exc).__name__}: {what}); its process-wide state is "
        "now undefined (LoadGen is not exception-safe), so a run that measures under LoadGen runs in "
        "a process of its own"
    )
