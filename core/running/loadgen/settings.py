"""What a LoadGen run is asked to do: one scenario, its load and its stopping rules, validated
before LoadGen is touched.

Units live in the names (seconds, samples per second); LoadGen's own nanoseconds and
milliseconds appear only where ``core.running.loadgen.run`` builds its ``TestSettings``.
"""

from __future__ import annotations

import math
import os
import resource
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from core.base.config import RunConfig, config_errors
from core.base.errors import ConfigError, ConfigErrors

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

    @field_validator("max_duration_seconds", "max_query_count")
    @classmethod
    def _maximum_after_minimum(cls, value: float | None, info: ValidationInfo) -> float | None:
        # each max_X is checked against its min_X, declared (and so validated) before it; a field
        # validator's info always names its field
        minimum_field = "min_" + str(info.field_name).removeprefix("max_")
        minimum = info.data.get(minimum_field)
        if value is not None and minimum is not None and value < minimum:
            raise ValueError(f"at least {minimum_field} ({minimum}), or None for no limit")
        return value

    @field_validator("offline_expected_samples_per_second", "server_target_samples_per_second")
    @classmethod
    def _scenario_needs_a_rate(cls, value: float | None, info: ValidationInfo) -> float | None:
        scenario, rate = _RATE_OF_SCENARIO[str(info.field_name)]
        if value is None and info.data.get("scenario") == scenario:
            raise ValueError(f"a number above 0 is required for the {scenario} scenario ({rate})")
        return value


#: the rate field each scenario needs, and what that rate is
_RATE_OF_SCENARIO = {
    "offline_expected_samples_per_second": ("offline", "the throughput expected"),
    "server_target_samples_per_second": ("server", "the arrival rate"),
}


def _refusal(errors: list[ConfigError], given: set[str]) -> ConfigError:
    """One error of the settings, or all of them; a rate the scenario needs and nobody gave reads
    ``(missing)``, not ``= None`` (its validator sees the default)."""
    errors = [
        ConfigError(error.field, error.value, error.allowed, missing=True)
        if error.value is None
        and error.field.removeprefix("loadgen.") in _RATE_OF_SCENARIO
        and error.field not in given
        else error
        for error in errors
    ]
    return errors[0] if len(errors) == 1 else ConfigErrors(errors)


def make_loadgen_settings(**options: Any) -> LoadGenSettings:
    """Build LoadGenSettings, turning pydantic's errors into ConfigError (field, value, allowed),
    and refusing settings whose queries would not fit in this host's memory (``check_query_memory``)."""
    try:
        settings = LoadGenSettings(**options)
    except ValidationError as exc:
        errors = config_errors(exc, LoadGenSettings, unknown="unknown LoadGen setting; allowed settings are")
        raise _refusal(errors, set(options)) from None
    check_query_memory(settings)
    return settings


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


# --- what LoadGen's queries cost in memory ----------------------------------------------------------
#
# LoadGen generates every query of a test before it issues the first (GenerateQueries in
# loadgen.cc), however soon max_duration or max_query_count would stop it, and holds them to the
# end. Queries it cannot allocate end in std::bad_alloc inside StartTest, after which LoadGen's log
# thread writes to freed memory and the process crashes. So the count the settings imply is
# bounded before LoadGen is touched:
#
#   offline:        1 query of max(min_query_count, 1.1 x min_duration x offline_expected_rate) samples
#   single-stream:  max(min_query_count, 2 x min_duration / expected_latency + 1) queries of 1 sample
#   server:         max(min_query_count, min_duration x target_rate + 1) queries of 1 sample
#
# (offline's 1.1 is LoadGen's kSlack in test_settings_internal.cc; single-stream generates twice
# min_duration's worth, in case the model is faster than expected; server's Poisson arrivals are
# generated over min_duration, on average; the + 1 is the query at 0 s), plus the performance
# samples loaded. Their bytes must fit in LOADGEN_MEMORY_SHARE of the host's memory.

#: Host bytes per sample LoadGen pre-generates, by scenario. Measured on LoadGen 6.0.17 (x86-64) as
#: the growth of the peak resident set over 1 and 4 million samples: 325 bytes per single-sample
#: query (its QueryMetadata, in a vector grown by doubling without a reserve; the sample's metadata
#: and the query's promise on the heap; four latency vectors LoadGen reserves per sample) and 600
#: bytes per sample of offline's one query (LoadGen's share, the query copied to Python and core's
#: (id, index) pairs of it). Rounded up to leave room for another build's allocator.
LOADGEN_BYTES_PER_SAMPLE: dict[str, int] = {"offline": 1024, "single-stream": 512, "server": 512}
#: The share of the host's memory LoadGen's queries may take: the model, its data and the
#: framework need the rest.
LOADGEN_MEMORY_SHARE = 0.5
#: What no process can exceed, whatever the host: x86-64's and AArch64's 47-bit user address
#: space. The bound where the host that will run is not this one (a plan for a machine profile).
ADDRESS_SPACE_BYTES = 1 << 47
# LoadGen's own factors (see above).
_OFFLINE_SLACK = 1.1
_SINGLE_STREAM_GENERATED_DURATIONS = 2.0
_UNLIMITED = (resource.RLIM_INFINITY, -1)


def host_memory_bytes() -> int:
    """The memory this process may use: the host's physical memory, or less where a cgroup's
    limit (a container, a Slurm job) or the process's own address-space or data limit
    (``ulimit -v``, ``ulimit -d``) says so."""
    limits = [os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")]
    for kind in (resource.RLIMIT_AS, resource.RLIMIT_DATA):
        soft, _ = resource.getrlimit(kind)
        if soft not in _UNLIMITED:
            limits.append(soft)
    cgroup = _cgroup_memory_limit()
    if cgroup is not None:
        limits.append(cgroup)
    return min(limits)


def _cgroup_memory_limit() -> int | None:
    """This process's cgroup memory limit (v2 ``memory.max``, v1 ``memory.limit_in_bytes``), if any."""
    candidates = []
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            hierarchy, _, path = line.partition(":")[2].partition(":")
            if hierarchy == "":  # v2's unified hierarchy: "0::/path"
                candidates.append(Path("/sys/fs/cgroup") / path.lstrip("/") / "memory.max")
            elif "memory" in hierarchy.split(","):
                candidates.append(Path("/sys/fs/cgroup/memory") / path.lstrip("/") / "memory.limit_in_bytes")
    except OSError:
        return None
    for candidate in candidates:
        try:
            text = candidate.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:  # v1 says "no limit" with a huge number, v2 with "max"
            return int(text)
    return None


class QueryCount(NamedTuple):
    """The samples LoadGen generates for some settings, and the setting that decides how many."""

    samples: int
    setting: str


def generated_samples(settings: LoadGenSettings) -> QueryCount:
    """How many samples LoadGen pre-generates for ``settings`` (queries x samples per query), and
    the setting that makes them that many (min_query_count, or the rate or latency that with
    min_duration_seconds gives more)."""
    duration = settings.min_duration_seconds
    if settings.scenario == "offline":
        rate = settings.offline_expected_samples_per_second or 0.0
        timed, setting = _OFFLINE_SLACK * duration * rate, "offline_expected_samples_per_second"
    elif settings.scenario == "single-stream":
        timed = _SINGLE_STREAM_GENERATED_DURATIONS * duration / settings.single_stream_expected_latency_seconds
        setting = "single_stream_expected_latency_seconds"
    else:
        timed = duration * (settings.server_target_samples_per_second or 0.0)
        setting = "server_target_samples_per_second"
    # Offline's one query holds the timed count (truncated); the others generate queries until one
    # is scheduled at or past the span, the one at 0 s included: one more than the span holds.
    generated = math.ceil(timed) + (0 if settings.scenario == "offline" else 1)
    if settings.min_query_count >= generated:
        return QueryCount(settings.min_query_count, "min_query_count")
    return QueryCount(generated, setting)


def most_generated_samples(scenario: Scenario, memory_bytes: int | None = None, loaded_samples: int = 0) -> int:
    """The most samples LoadGen may pre-generate for ``scenario`` in ``memory_bytes`` (default: this
    host's, ``host_memory_bytes``), ``loaded_samples`` performance samples already counted."""
    memory = host_memory_bytes() if memory_bytes is None else memory_bytes
    return int(LOADGEN_MEMORY_SHARE * memory) // LOADGEN_BYTES_PER_SAMPLE[scenario] - loaded_samples


def check_query_memory(
    settings: LoadGenSettings, *, prefix: str = "", loaded_samples: int = 0, memory_bytes: int | None = None
) -> None:
    """Refuse ``settings`` whose pre-generated queries (``generated_samples``) would not fit in
    memory: a ConfigError naming the setting that decides their count, its value and its bound.

    :param prefix: put before the setting's name (``"loadgen."`` for a run's options).
    :param loaded_samples: the source's performance samples, which LoadGen also holds.
    :param memory_bytes: the memory of the host that will run; default this one's.
    """
    where = "this host's " if memory_bytes is None else ""
    memory = host_memory_bytes() if memory_bytes is None else memory_bytes
    most = most_generated_samples(settings.scenario, memory, loaded_samples)
    count = generated_samples(settings)
    if count.samples <= most:
        return
    cost = LOADGEN_BYTES_PER_SAMPLE[settings.scenario]
    why = (
        f"LoadGen would pre-generate {count.samples:,} samples before its first query (about {cost} bytes "
        f"each: {_gib(count.samples * cost)}), more than the {max(most, 0):,} that fit in "
        f"{LOADGEN_MEMORY_SHARE:.0%} of {where}{_gib(memory)} of memory"
    )
    if most < 1 and loaded_samples:
        raise ConfigError("source.performance_samples", loaded_samples, f"fewer: {why}, the loaded samples included")
    bound = _bound(count.setting, max(most, 1), settings.min_duration_seconds)
    raise ConfigError(prefix + count.setting, getattr(settings, count.setting), f"{bound}: {why}")


def _bound(setting: str, most_samples: int, duration: float) -> str:
    """What ``setting`` may be for LoadGen to generate at most ``most_samples`` samples (rounded
    to four figures on the side that keeps within it)."""
    shorter = f"with min_duration_seconds {duration:g} (or a shorter min_duration_seconds)"
    spans = max(most_samples - 1, 1)  # the query at 0 s comes on top of those in the span
    if setting == "offline_expected_samples_per_second":
        return f"at most {_four_figures(most_samples / (_OFFLINE_SLACK * duration), math.floor):g} {shorter}"
    if setting == "single_stream_expected_latency_seconds":
        latency = _SINGLE_STREAM_GENERATED_DURATIONS * duration / spans
        return f"at least {_four_figures(latency, math.ceil):g} {shorter}"
    if setting == "server_target_samples_per_second":
        return f"at most {_four_figures(spans / duration, math.floor):g} {shorter}"
    return f"at most {most_samples:,}"


def _four_figures(value: float, rounding: Callable[[float], int]) -> float:
    """``value`` to four significant figures, rounded by ``rounding`` (math.floor or math.ceil)."""
    if value <= 0:
        return value
    scale = 10.0 ** (math.floor(math.log10(value)) - 3)
    return rounding(value / scale) * scale


def _gib(size_bytes: float) -> str:
    return f"{size_bytes / (1 << 30):,.3g} GiB"


#: LoadGen settings a run fills in itself, and the run option each comes from
RUN_DECIDES = {"scenario": "scenario", "max_batch_size": "micro_batch_size", "seed": "seed"}
#: offline's expected rate where a run's options give none, to validate the rest in planning; the
#: run itself measures the rate in its warm-up (see ``settings_for_run``)
_PLANNING_RATE = 1.0
_SINGLE_STREAM_MARGIN = 0.25
_OFFLINE_MARGIN = 2.0
_MOST_GENERATED_QUERIES = 2_000_000
# The fields' own upper bounds (LoadGenSettings), which a derived value keeps to.
_MOST_OFFLINE_RATE = 1e12
_LONGEST_LATENCY_SECONDS = 3600.0


def settings_for_run(
    config: RunConfig, measured_samples_per_second: float | None = None, *, memory_bytes: int | None = None
) -> LoadGenSettings:
    """The LoadGen settings of an inference run: its ``loadgen`` options, with the scenario, the
    largest batch (the micro-batch) and the seed taken from the run. Errors name ``loadgen.<key>``,
    queries that would not fit in memory included (``check_query_memory``).

    :param measured_samples_per_second: the model's rate measured just before LoadGen starts (at
        the micro-batch for offline, one sample per call otherwise). Where ``loadgen`` gives none,
        twice it is offline's expected rate (LoadGen sizes its one query from it), and a quarter of its
        inverse is single-stream's expected latency (LoadGen generates 2 x min_duration / latency
        queries, and runs out of them early if told too high a latency). Measuring beats asking
        the user to guess, whose guess too high ends the test INVALID. Both are bounded so that
        LoadGen generates no more queries than fit in memory (single-stream: 2 million at most).
        None in planning, where a derived latency is the lowest the run may use (the most queries).
    :param memory_bytes: the memory of the host that will run (default: this one's).
    """
    for key, option in RUN_DECIDES.items():
        if key in config.loadgen:
            raise ConfigError(f"loadgen.{key}", config.loadgen[key], f"set by the run's {option} option")
    if config.scenario == "loop":
        raise ValueError("scenario 'loop' runs without LoadGen: it has no LoadGen settings")
    options: dict[str, Any] = dict(config.loadgen)
    if config.scenario == "offline":
        options.setdefault("offline_expected_samples_per_second", _PLANNING_RATE)  # replaced below
    try:
        settings = LoadGenSettings(
            scenario=config.scenario,  # narrowed above: a LoadGen scenario
            max_batch_size=config.micro_batch_size or 1,
            seed=config.seed,
            **options,
        )
    except ValidationError as exc:
        errors = config_errors(exc, LoadGenSettings, unknown="unknown LoadGen setting; allowed", prefix="loadgen")
        raise _refusal(errors, {f"loadgen.{key}" for key in options}) from None
    memory = host_memory_bytes() if memory_bytes is None else memory_bytes
    derived = _derived_settings(settings, set(config.loadgen), measured_samples_per_second, memory)
    if derived:
        settings = settings.model_copy(update=derived)
    check_query_memory(settings, prefix="loadgen.", memory_bytes=memory_bytes)
    return settings


def _derived_settings(
    settings: LoadGenSettings, given: set[str], measured_samples_per_second: float | None, memory_bytes: int
) -> dict[str, float]:
    """The expected rate (offline) or latency (single-stream) the run decides, where ``loadgen``
    gives none: from the measured rate, within what memory allows (see ``settings_for_run``)."""
    duration = settings.min_duration_seconds
    most = max(most_generated_samples(settings.scenario, memory_bytes), 1)
    if settings.scenario == "offline" and "offline_expected_samples_per_second" not in given:
        # Twice the measured rate: an overestimate only lengthens the test (LoadGen sizes its one
        # query for 1.1 x min_duration at this rate), an underestimate ends it early and INVALID.
        wanted = _OFFLINE_MARGIN * measured_samples_per_second if measured_samples_per_second else _PLANNING_RATE
        fitting = max(most - 1, 1) / (_OFFLINE_SLACK * duration)  # a sample short: rounding
        return {"offline_expected_samples_per_second": max(min(wanted, fitting, _MOST_OFFLINE_RATE), 1e-9)}
    if settings.scenario == "single-stream" and "single_stream_expected_latency_seconds" not in given:
        # A margin of 4 on the measured latency: the queries LoadGen runs out of end it INVALID.
        # The floor keeps its pre-generated queries (2 x min_duration / latency) at 2 million at
        # most (generating them takes seconds), and within memory.
        # (two short of the limit: one for the query at 0 s, one for rounding)
        floor = _SINGLE_STREAM_GENERATED_DURATIONS * duration / max(min(_MOST_GENERATED_QUERIES, most) - 2, 1)
        measured = _SINGLE_STREAM_MARGIN / measured_samples_per_second if measured_samples_per_second else 0.0
        return {"single_stream_expected_latency_seconds": min(max(measured, floor), _LONGEST_LATENCY_SECONDS)}
    return {}
