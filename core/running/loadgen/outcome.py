"""What a LoadGen run measured, read from LoadGen's own logs.

The figures come from ``mlperf_log_detail.txt``'s ``:::MLLOG`` lines (one JSON object each, keyed,
typed, stable across LoadGen's summary layout changes); the handful that a detail log without its
result lines would lack are read from ``mlperf_log_summary.txt``, which is kept verbatim as well.
LoadGen reports latencies in nanoseconds; here they are seconds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from core.base.errors import CoreError
from core.running.loadgen.settings import Scenario

SUMMARY_FILE = "mlperf_log_summary.txt"
DETAIL_FILE = "mlperf_log_detail.txt"
# Every file LoadGen opens in its output directory (LogOutputs in loadgen.cc).
LOG_FILES = (SUMMARY_FILE, DETAIL_FILE, "mlperf_log_accuracy.json", "mlperf_log_trace.json")

_MLLOG_PREFIX = ":::MLLOG "
_NANOSECONDS_PER_SECOND = 1e9
# LoadGen's power_begin / power_end: local wall-clock time to the millisecond.
_POWER_TIME_FORMAT = "%m-%d-%Y %H:%M:%S.%f"


class LoadGenError(CoreError):
    """LoadGen could not run (not installed), failed inside its native code, or left no result to read."""


class LoadGenOutcome(BaseModel):
    """One LoadGen performance run: LoadGen's verdict and figures, and the host's timing of it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    scenario: Scenario = Field(description="the scenario that ran")
    valid: bool = Field(description="LoadGen's 'Result is : VALID'")
    invalid_reason: str | None = Field(default=None, description="LoadGen's reasons when the result is INVALID")
    min_duration_met: bool = Field(description="LoadGen ran at least min_duration_seconds")
    min_queries_met: bool = Field(description="LoadGen issued at least min_query_count queries (samples, offline)")
    early_stopping_met: bool = Field(description="LoadGen's early-stopping criterion held (single-stream, server)")
    latency_constraint_met: bool | None = Field(
        default=None, description="server: the target percentile of samples met the latency bound; else None"
    )
    samples_per_second: float | None = Field(
        default=None,
        description="the throughput LoadGen reports: offline 'samples per second', server 'completed samples per "
        "second', single-stream 'QPS with loadgen overhead'",
    )
    scheduled_samples_per_second: float | None = Field(
        default=None, description="server: the arrival rate LoadGen actually scheduled; else None"
    )
    query_count: int | None = Field(default=None, description="queries LoadGen issued and counted")
    samples_answered: int = Field(description="samples the source's model answered (counted on the host)")
    latency_min_seconds: float | None = None
    latency_max_seconds: float | None = None
    latency_mean_seconds: float | None = None
    latency_p50_seconds: float | None = None
    latency_p90_seconds: float | None = None
    latency_p95_seconds: float | None = None
    latency_p99_seconds: float | None = None
    early_stopping_latency_seconds: float | None = Field(
        default=None,
        description="single-stream: LoadGen's early-stopping estimate of the target-percentile latency, MLPerf's "
        "single-stream result",
    )
    loadgen_errors: list[str] = Field(default_factory=list, description="errors LoadGen logged, as 'key: message'")
    loadgen_warnings: list[str] = Field(default_factory=list, description="warnings LoadGen logged, as 'key: message'")
    loadgen_version: str | None = Field(default=None, description="LoadGen's version line")
    window_start_perf_counter: float | None = Field(
        default=None,
        description="time.perf_counter() once the samples were loaded, just before LoadGen started issuing",
    )
    window_end_perf_counter: float | None = Field(
        default=None,
        description="time.perf_counter() once LoadGen had every answer, before the samples were unloaded",
    )
    window_seconds: float | None = Field(
        default=None, description="window_end - window_start: the span to take energy over"
    )
    loadgen_window_seconds: float | None = Field(
        default=None,
        description="LoadGen's own power_begin to power_end (first issue to last answer), to the millisecond",
    )
    start_test_seconds: float = Field(description="the whole StartTest call, sample loading and logging included")
    log_dir: Path = Field(description="the directory holding LoadGen's logs")
    summary_text: str = Field(description="mlperf_log_summary.txt, verbatim")


@dataclass(frozen=True)
class DetailLog:
    """A detail log's ``:::MLLOG`` entries: values by key (the last of a repeated key wins), and the
    entries LoadGen flagged as errors and warnings, as 'key: message'."""

    values: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def read_detail_log(path: Path) -> DetailLog:
    """The ``:::MLLOG`` lines of ``path``; other lines and lines that are not JSON are skipped."""
    log = DetailLog()
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.startswith(_MLLOG_PREFIX):
            continue
        try:
            entry = json.loads(line[len(_MLLOG_PREFIX) :])
        except ValueError:
            continue  # a line cut short (LoadGen killed mid-write) is not worth failing the run over
        if not isinstance(entry, dict) or not isinstance(entry.get("key"), str):
            continue
        key, value = entry["key"], entry.get("value")
        log.values[key] = value
        metadata = entry.get("metadata")
        if isinstance(metadata, dict) and metadata.get("is_error"):
            log.errors.append(f"{key}: {value}")
        elif isinstance(metadata, dict) and metadata.get("is_warning"):
            log.warnings.append(f"{key}: {value}")
    return log


def read_summary(text: str) -> dict[str, str]:
    """``label : value`` lines of a summary, by label (e.g. 'Result is' -> 'VALID')."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        label, colon, value = line.partition(":")
        if colon and label.strip() and not label.startswith(" *"):
            fields.setdefault(label.strip(), value.strip())
    return fields


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            return float(str(value)) if value is not None else None
        except ValueError:
            return None
    return float(value)


def _seconds(nanoseconds: Any) -> float | None:
    number = _number(nanoseconds)
    return None if number is None else number / _NANOSECONDS_PER_SECOND


def _flag(value: Any, summary_value: str | None) -> bool | None:
    if isinstance(value, bool):
        return value
    if summary_value is not None:
        return summary_value.lower() == "yes"
    return None


def _power_window_seconds(values: dict[str, Any]) -> float | None:
    try:
        begin = datetime.strptime(str(values["power_begin"]), _POWER_TIME_FORMAT)
        end = datetime.strptime(str(values["power_end"]), _POWER_TIME_FORMAT)
    except (KeyError, ValueError):
        return None
    return (end - begin).total_seconds()


def _one_line(text: Any) -> str:
    return " ".join(str(text).split())


def _invalid_reason(values: dict[str, Any], early_stopping_met: bool) -> str:
    """LoadGen's reasons, one line: its result_invalid_reason names the unmet duration, query count
    and latency bound; an unmet early-stopping criterion is told only in early_stopping_result."""
    reasons = [_one_line(values.get("result_invalid_reason") or "")]
    if not early_stopping_met:
        reasons.append(
            "early stopping not satisfied: " + _one_line(values.get("early_stopping_result") or "see the summary")
        )
    return " ".join(reason for reason in reasons if reason) or "LoadGen gave no reason; see the summary"


_THROUGHPUT_KEYS: dict[str, tuple[str, str]] = {
    # scenario: (detail key, summary label)
    "offline": ("result_samples_per_second", "Samples per second"),
    "server": ("result_completed_samples_per_sec", "Completed samples per second"),
    "single-stream": ("result_qps_with_loadgen_overhead", "QPS w/ loadgen overhead"),
}


def _percentile_seconds(values: dict[str, Any], summary: dict[str, str], percent: str) -> float | None:
    detail = values.get(f"result_{percent}_percentile_latency_ns")
    return _seconds(detail if detail is not None else summary.get(f"{percent} percentile latency (ns)"))


def read_outcome(
    log_dir: Path,
    scenario: Scenario,
    *,
    samples_answered: int,
    start_test_seconds: float,
    window_start_perf_counter: float | None,
    window_end_perf_counter: float | None,
) -> LoadGenOutcome:
    """The outcome of the run whose logs are in ``log_dir``; ``LoadGenError`` where LoadGen left no result."""
    summary_path, detail_path = log_dir / SUMMARY_FILE, log_dir / DETAIL_FILE
    if not summary_path.is_file():
        raise LoadGenError(f"LoadGen wrote no {SUMMARY_FILE} in {log_dir} (it could not open its logs, or failed)")
    summary_text = summary_path.read_text(encoding="utf-8", errors="replace")
    summary = read_summary(summary_text)
    detail = read_detail_log(detail_path) if detail_path.is_file() else DetailLog()
    values = detail.values

    validity = values.get("result_validity", summary.get("Result is"))
    if validity not in ("VALID", "INVALID"):
        raise LoadGenError(f"LoadGen's logs in {log_dir} hold no result (no result_validity, no 'Result is' line)")
    throughput_key, throughput_label = _THROUGHPUT_KEYS[scenario]
    throughput = values.get(throughput_key, summary.get(throughput_label))
    window_seconds = (
        window_end_perf_counter - window_start_perf_counter
        if window_start_perf_counter is not None and window_end_perf_counter is not None
        else None
    )
    query_count = values.get("result_query_count")
    early_stopping_met = bool(_flag(values.get("early_stopping_met"), summary.get("Early stopping satisfied")))
    return LoadGenOutcome(
        scenario=scenario,
        valid=validity == "VALID",
        invalid_reason=None if validity == "VALID" else _invalid_reason(values, early_stopping_met),
        min_duration_met=bool(_flag(values.get("result_min_duration_met"), summary.get("Min duration satisfied"))),
        min_queries_met=bool(_flag(values.get("result_min_queries_met"), summary.get("Min queries satisfied"))),
        early_stopping_met=early_stopping_met,
        latency_constraint_met=_flag(
            values.get("result_perf_constraints_met"), summary.get("Performance constraints satisfied")
        ),
        samples_per_second=_number(throughput),
        scheduled_samples_per_second=_number(values.get("result_scheduled_samples_per_sec")),
        query_count=query_count if isinstance(query_count, int) and not isinstance(query_count, bool) else None,
        samples_answered=samples_answered,
        latency_min_seconds=_seconds(values.get("result_min_latency_ns", summary.get("Min latency (ns)"))),
        latency_max_seconds=_seconds(values.get("result_max_latency_ns", summary.get("Max latency (ns)"))),
        latency_mean_seconds=_seconds(values.get("result_mean_latency_ns", summary.get("Mean latency (ns)"))),
        latency_p50_seconds=_percentile_seconds(values, summary, "50.00"),
        latency_p90_seconds=_percentile_seconds(values, summary, "90.00"),
        latency_p95_seconds=_percentile_seconds(values, summary, "95.00"),
        latency_p99_seconds=_percentile_seconds(values, summary, "99.00"),
        early_stopping_latency_seconds=_seconds(values.get("early_stopping_latency_ss"))
        if scenario == "single-stream"
        else None,
        loadgen_errors=detail.errors,
        loadgen_warnings=detail.warnings,
        loadgen_version=str(values["loadgen_version"]) if "loadgen_version" in values else None,
        window_start_perf_counter=window_start_perf_counter,
        window_end_perf_counter=window_end_perf_counter,
        window_seconds=window_seconds,
        loadgen_window_seconds=_power_window_seconds(values),
        start_test_seconds=start_test_seconds,
        log_dir=log_dir,
        summary_text=summary_text,
    )
