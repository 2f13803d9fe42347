"""What a LoadGen run is asked to do: one scenario, its load and its stopping rules, validated
before LoadGen is touched.

Units live in the names (seconds, samples per second); LoadGen's own nanoseconds and
milliseconds appear only where ``core.running.loadgen.run`` builds its ``TestSettings``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from core.config import RunConfig, config_errors
from core.errors import ConfigError, ConfigErrors

Scenario = Literal["offline", "single-stream", "server"]

# LoadGen keeps durations in whole milliseconds: below one it would read 0, which it takes as "none".
_SHORTEST_DURATION_SECONDS = 0.001
_LONGEST_DURATION_SECONDS = 7 * 24 * 3600.0


class LoadGenSettings(BaseModel):
    """One LoadGen performance run. Build it with ``make_loadgen_settings`` to get ``ConfigError``s."""

    # Strict like RunConfig: a number field takes a number, not "8" or true (docs/concepts.md).
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    scenario: Scenario = Field(
        description="'offline' (all samples in one query: throughput), 'single-stream' (one sample at a time: "
        "latency) or 'server' (single-sample queries arriving at random at a target rate: latency under load)"
    )
    max_batch_size: int = Field(
        default=1,
        ge=1,
        le=1 << 24,
        description="most samples per call to source.infer: offline splits its one query into batches of this "
        "size, server batches the queries waiting when the model frees up, up to this many; single-stream is "
        "always 1",
    )
    min_duration_seconds: float = Field(
        default=10.0,
        ge=_SHORTEST_DURATION_SECONDS,
        le=_LONGEST_DURATION_SECONDS,
        description="LoadGen keeps issuing until both this much time has passed and min_query_count queries "
        "completed (MLPerf submissions use 600)",
    )
    max_duration_seconds: float | None = Field(
        default=None,
        ge=_SHORTEST_DURATION_SECONDS,
        le=_LONGEST_DURATION_SECONDS,
        validate_default=True,
        description="LoadGen stops issuing after this long even if the minimums are unmet (the result is then "
        "INVALID); None for no limit",
    )
    min_query_count: int = Field(
        default=100,
        ge=1,
        le=1 << 40,
        description="fewest queries LoadGen issues; in offline, the fewest samples in its one query",
    )
    max_query_count: int | None = Field(
        default=None,
        ge=1,
        le=1 << 40,
        validate_default=True,
        description="LoadGen stops issuing after this many queries; None for no limit",
    )
    offline_expected_samples_per_second: float | None = Field(
        default=None,
        gt=0.0,
        le=1e12,
        validate_default=True,
        description="offline: the throughput expected; LoadGen sizes its one query to last 1.1 x "
        "min_duration_seconds at this rate (required for offline: an overestimate only lengthens the run, an "
        "underestimate ends it early and INVALID)",
    )
    single_stream_expected_latency_seconds: float = Field(
        default=0.001,
        gt=0.0,
        le=3600.0,
        description="single-stream: the latency expected, which LoadGen uses to generate enough queries for "
        "min_duration_seconds (too high a value runs out of queries early and makes the result INVALID)",
    )
    single_stream_target_latency_percentile: float = Field(
        default=0.90,
        gt=0.0,
        lt=1.0,
        description="single-stream: the latency percentile LoadGen reports as the result",
    )
    server_target_samples_per_second: float | None = Field(
        default=None,
        gt=0.0,
        le=1e9,
        validate_default=True,
        description="server: the mean rate of LoadGen's Poisson arrivals, one sample per query (required for server)",
    )
    server_target_latency_seconds: float = Field(
        default=0.1,
        gt=0.0,
        le=3600.0,
        description="server: the latency bound that server_target_latency_percentile of the samples must meet "
        "for a VALID result",
    )
    server_target_latency_percentile: float = Field(
        default=0.99,
        gt=0.0,
        lt=1.0,
        description="server: the share of samples that must finish within server_target_latency_seconds",
    )
    seed: int = Field(
        default=0,
        ge=0,
        le=2**32 - 1,
        description="seeds LoadGen's choice of the loaded samples, their order and the server arrival times",
    )

    @field_validator("max_duration_seconds")
    @classmethod
    def _max_duration_after_min(cls, value: float | None, info: ValidationInfo) -> float | None:
        minimum = info.data.get("min_duration_seconds")
        if value is not None and minimum is not None and value < minimum:
            raise ValueError(f"at least min_duration_seconds ({minimum}), or None for no limit")
        return value

    @field_validator("max_query_count")
    @classmethod
    def _max_queries_after_min(cls, value: int | None, info: ValidationInfo) -> int | None:
        minimum = info.data.get("min_query_count")
        if value is not None and minimum is not None and value < minimum:
            raise ValueError(f"at least min_query_count ({minimum}), or None for no limit")
        return value

    @field_validator("offline_expected_samples_per_second")
    @classmethod
    def _offline_needs_a_rate(cls, value: float | None, info: ValidationInfo) -> float | None:
        if value is None and info.data.get("scenario") == "offline":
            raise ValueError("a number above 0 is required for the offline scenario (the throughput expected)")
        return value

    @field_validator("server_target_samples_per_second")
    @classmethod
    def _server_needs_a_rate(cls, value: float | None, info: ValidationInfo) -> float | None:
        if value is None and info.data.get("scenario") == "server":
            raise ValueError("a number above 0 is required for the server scenario (the arrival rate)")
        return value


def make_loadgen_settings(**options: Any) -> LoadGenSettings:
    """Build LoadGenSettings, turning pydantic's errors into ConfigError (field, value, allowed)."""
    try:
        return LoadGenSettings(**options)
    except ValidationError as exc:
        errors = config_errors(exc, LoadGenSettings, unknown="unknown LoadGen setting; allowed settings are")
        raise (errors[0] if len(errors) == 1 else ConfigErrors(errors)) from None


def check_source_counts(total_samples: object, performance_samples: object) -> None:
    """The query sample library's sizes, as LoadGen needs them: 1 <= performance <= total."""
    if isinstance(total_samples, bool) or not isinstance(total_samples, int) or total_samples < 1:
        raise ConfigError("source.total_samples", total_samples, "an integer of at least 1 is required")
    if (
        isinstance(performance_samples, bool)
        or not isinstance(performance_samples, int)
        or not 1 <= performance_samples <= total_samples
    ):
        raise ConfigError(
            "source.performance_samples",
            performance_samples,
            f"an integer from 1 to source.total_samples ({total_samples}) is required",
        )


#: LoadGen settings a run fills in itself, and the run option each comes from
RUN_DECIDES = {"scenario": "scenario", "max_batch_size": "micro_batch_size", "seed": "seed"}
#: offline's expected rate where a run's options give none, to validate the rest in planning; the
#: run itself measures the rate in its warm-up (see ``settings_for_run``)
_PLANNING_RATE = 1.0
_SINGLE_STREAM_MARGIN = 0.25
_OFFLINE_MARGIN = 2.0
_MOST_GENERATED_QUERIES = 2_000_000


def settings_for_run(config: RunConfig, measured_samples_per_second: float | None = None) -> LoadGenSettings:
    """The LoadGen settings of an inference run: its ``loadgen`` options, with the scenario, the
    largest batch (the micro-batch) and the seed taken from the run. Errors name ``loadgen.<key>``.

    :param measured_samples_per_second: the model's rate measured just before LoadGen starts (at
        the micro-batch for offline, one sample per call otherwise). Where ``loadgen`` gives none,
        twice it is offline's expected rate (LoadGen sizes its one query from it), and a quarter of its
        inverse is single-stream's expected latency (LoadGen generates min_duration / latency
        queries, and runs out of them early if told too high a latency). Measuring beats asking
        the user to guess, whose guess too high ends the test INVALID. None in planning.
    """
    for key, option in RUN_DECIDES.items():
        if key in config.loadgen:
            raise ConfigError(f"loadgen.{key}", config.loadgen[key], f"set by the run's {option} option")
    if config.scenario == "loop":
        raise ValueError("scenario 'loop' runs without LoadGen: it has no LoadGen settings")
    options: dict[str, Any] = dict(config.loadgen)
    if config.scenario == "offline" and "offline_expected_samples_per_second" not in options:
        # Twice the measured rate: an overestimate only lengthens the test (LoadGen sizes its one
        # query for 1.1 x min_duration at this rate), an underestimate ends it early and INVALID.
        measured = measured_samples_per_second and _OFFLINE_MARGIN * measured_samples_per_second
        options["offline_expected_samples_per_second"] = measured or _PLANNING_RATE
    if (
        config.scenario == "single-stream"
        and "single_stream_expected_latency_seconds" not in options
        and measured_samples_per_second
    ):
        # A margin of 4 on the measured latency: the queries LoadGen runs out of end it INVALID.
        # The floor keeps its pre-generated queries (min_duration / latency) at 2 million at most.
        duration = float(
            options.get("min_duration_seconds", LoadGenSettings.model_fields["min_duration_seconds"].default)
        )
        options["single_stream_expected_latency_seconds"] = max(
            _SINGLE_STREAM_MARGIN / measured_samples_per_second, duration / _MOST_GENERATED_QUERIES
        )
    try:
        return LoadGenSettings(
            scenario=config.scenario,  # narrowed above: a LoadGen scenario
            max_batch_size=config.micro_batch_size or 1,
            seed=config.seed,
            **options,
        )
    except ValidationError as exc:
        errors = config_errors(exc, LoadGenSettings, unknown="unknown LoadGen setting; allowed", prefix="loadgen")
        raise (errors[0] if len(errors) == 1 else ConfigErrors(errors)) from None
