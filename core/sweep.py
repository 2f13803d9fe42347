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

Every cell is validated (``core.planning.plan_run``) before anything runs. Each repeat runs in a
fresh process (``core.sweep_worker``) with a time limit, so an out-of-memory error, a crash or a
hang becomes a recorded result and the sweep goes on. Each result is committed to the database
as it arrives; ``resume=True`` runs only what is missing.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from core.config import RunConfig
from core.errors import ConfigError, ConfigErrors, CoreError
from core.results import RunResult, RunState, Status
from core.store import ResultStore, default_database
from core.summary import CellSummary, summarise

DEFAULT_REPEATS = 3
DEFAULT_TIMEOUT_SECONDS = 3600.0  # per repeat; an IPU's first compilation alone can take tens of minutes
STOP_GRACE_SECONDS = 10.0  # between SIGTERM and SIGKILL when a cell is stopped
_POLL_SECONDS = 0.5
_OUTPUT_TAIL_CHARS = 4000
_DICT_FIELDS = ("workload_options", "accelerator_options")
_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
_Scalar = (bool, int, float, str)


class SweepError(CoreError):
    """A sweep cannot start: its file is unreadable, cells are invalid, or its database disagrees."""


class SweepSpec(BaseModel):
    """A sweep file, as read. ``grid`` holds RunConfig fields; a list value is an axis."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200, pattern=_NAME_PATTERN,
                      description="the sweep's name in the database; defaults to the file's stem")
    description: str | None = None
    repeats: int = Field(default=DEFAULT_REPEATS, ge=1, le=1000, description="runs per cell")
    timeout_seconds: float = Field(default=DEFAULT_TIMEOUT_SECONDS, gt=0, le=7 * 24 * 3600.0,
                                   description="wall-clock limit of one repeat, process start to exit")
    grid: dict[str, Any]
    exclude: list[dict[str, Any]] = Field(default_factory=list,
                                          description="partial cells to leave out; a list matches any of its values")

    def axes(self) -> list[tuple[str, list[Any]]]:
        """(option, values) for every list in the grid, in file order; dict fields as ``group.key``."""
        return [(name, value) for name, value in _flatten(self.grid) if isinstance(value, list)]

    def shared(self) -> dict[str, Any]:
        return {name: value for name, value in _flatten(self.grid) if not isinstance(value, list)}


@dataclass
class Cell:
    """One point of the grid: its options, and how validation judged them."""

    index: int
    key: str  # canonical JSON of the options: the cell's identity in the database
    label: str  # the axis values only, for people
    options: dict[str, Any]  # RunConfig fields, workload and accelerator included
    config: RunConfig | None = None  # validated, micro-batch resolved; None when refused
    invalid_reason: str | None = None

    @property
    def valid(self) -> bool:
        return self.invalid_reason is None

    def describe(self) -> dict[str, Any]:
        return {"index": self.index, "key": self.key, "label": self.label, "options": self.options,
                "invalid_reason": self.invalid_reason}


@dataclass
class SweepPlan:
    spec: SweepSpec
    cells: list[Cell]
    source: str | None = None

    @property
    def valid_cells(self) -> list[Cell]:
        return [cell for cell in self.cells if cell.valid]

    @property
    def invalid_cells(self) -> list[Cell]:
        return [cell for cell in self.cells if not cell.valid]


@dataclass
class SweepOutcome:
    """What a sweep did. ``cells`` summarises every cell of the sweep now in the database."""

    name: str
    database: Path
    runs_done: int  # runs this call recorded
    runs_already_finished: int  # found in the database and skipped (resume)
    skipped_invalid: list[Cell]
    cells: list[CellSummary] = field(default_factory=list)


# --- reading a sweep file --------------------------------------------------------------------


def read_sweep_document(path: Path) -> dict[str, Any]:
    """The file's contents as a dict; the suffix says the format (.toml, .yaml/.yml, .json)."""
    suffix = path.suffix.lower()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SweepError(f"cannot read sweep file {path}: {exc.strerror or exc}") from None
    try:
        if suffix == ".toml":
            try:
                import tomllib
            except ModuleNotFoundError:  # Python 3.10
                import tomli as tomllib
            document = tomllib.loads(text)
        elif suffix in (".yaml", ".yml"):
            import yaml

            document = yaml.safe_load(text)
        elif suffix == ".json":
            document = json.loads(text)
        else:
            raise SweepError(f"sweep file {path}: unknown format {suffix!r}; use .toml, .yaml, .yml or .json")
    except SweepError:
        raise
    except Exception as exc:  # each parser has its own error type; all mean the same here
        raise SweepError(f"cannot parse sweep file {path}: {exc}") from None
    if not isinstance(document, dict):
        raise SweepError(f"sweep file {path}: expected a table of settings at the top level")
    return document


def make_sweep_spec(document: dict[str, Any], default_name: str | None = None) -> SweepSpec:
    """Validate a sweep document. Raises ConfigError naming the setting (``grid.precision``)."""
    document = dict(document)
    if default_name is not None and "name" not in document:
        document["name"] = default_name
    try:
        spec = SweepSpec(**document)
    except ValidationError as exc:
        errors = []
        for error in exc.errors():
            where = ".".join(str(part) for part in error.get("loc", ())) or "sweep"
            allowed = ("unknown setting; a sweep file has: " + ", ".join(SweepSpec.model_fields)
                       if error.get("type") == "extra_forbidden" else str(error.get("msg", "invalid")))
            errors.append(ConfigError(where, error.get("input"), allowed))
        raise (errors[0] if len(errors) == 1 else ConfigErrors(errors)) from None
    _check_grid(spec)
    return spec


def load_sweep(path: str | Path) -> SweepSpec:
    path = Path(path)
    return make_sweep_spec(read_sweep_document(path), default_name=_default_name(path))


def _default_name(path: Path) -> str:
    stem = "".join(c if c.isalnum() or c in "._-" else "-" for c in path.stem).lstrip("._-")
    return stem or "sweep"


def _flatten(grid: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    for name, value in grid.items():
        if name in _DICT_FIELDS and isinstance(value, dict):
            for key, inner in value.items():
                yield f"{name}.{key}", inner
        else:
            yield name, value


def _check_grid(spec: SweepSpec) -> None:
    allowed_fields = list(RunConfig.model_fields)
    for name, value in spec.grid.items():
        if name not in RunConfig.model_fields:
            raise ConfigError(f"grid.{name}", value, "unknown run option; allowed: " + ", ".join(allowed_fields))
        if name in _DICT_FIELDS and not isinstance(value, dict):
            raise ConfigError(f"grid.{name}", value, "a table of KEY = value (a value may be a list)")
    if "workload" not in spec.grid:
        raise ConfigError("grid.workload", None, "required: the workload to run (a name, or a list of names)")
    for name, value in _flatten(spec.grid):
        values = value if isinstance(value, list) else [value]
        if not values:
            raise ConfigError(f"grid.{name}", value, "an empty list makes no cells; give at least one value")
        for item in values:
            if not isinstance(item, _Scalar):
                raise ConfigError(f"grid.{name}", item, "a value must be a number, a string or a boolean (or a list of them)")
        canonical = [json.dumps(item) for item in values]
        if len(set(canonical)) != len(canonical):
            raise ConfigError(f"grid.{name}", value, "a value appears twice: the same cell would run twice")
    known = {name for name, _ in _flatten(spec.grid)}
    for position, entry in enumerate(spec.exclude):
        if not isinstance(entry, dict) or not entry:
            raise ConfigError(f"exclude.{position}", entry, "a table of option = value (or list of values)")
        for name, _ in _flatten(entry):
            if name not in known:
                raise ConfigError(f"exclude.{position}.{name}", entry, "not an option set in the grid; allowed: "
                                  + ", ".join(sorted(known)))


# --- cells -----------------------------------------------------------------------------------


def _cell_options(shared: dict[str, Any], chosen: dict[str, Any]) -> dict[str, Any]:
    options: dict[str, Any] = {"accelerator": "cpu"}  # as `core run`: the CPU unless the file says
    for name, value in {**shared, **chosen}.items():
        if "." in name:
            group, key = name.split(".", 1)
            options.setdefault(group, {})[key] = value
        else:
            options[name] = value
    return options


def _excluded(values: dict[str, Any], spec: SweepSpec) -> bool:
    for entry in spec.exclude:
        if all(values.get(name) in (wanted if isinstance(wanted, list) else [wanted])
               for name, wanted in _flatten(entry)):
            return True
    return False


def cell_key(options: dict[str, Any]) -> str:
    """Canonical JSON of a cell's options: the same options always give the same key."""
    return json.dumps(options, sort_keys=True, separators=(",", ":"))


def expand_cells(spec: SweepSpec) -> list[Cell]:
    """Every combination of the axes, first axis outermost, minus the excluded ones."""
    axes, shared = spec.axes(), spec.shared()
    cells: list[Cell] = []
    for combination in itertools.product(*(values for _, values in axes)):
        chosen = {name: value for (name, _), value in zip(axes, combination)}
        if _excluded({**shared, **chosen}, spec):
            continue
        options = _cell_options(shared, chosen)
        label = " ".join(f"{name.split('.', 1)[-1]}={value}" for name, value in chosen.items()) \
            or f"{options['workload']} on {options['accelerator']}"
        cells.append(Cell(index=len(cells), key=cell_key(options), label=label, options=options))
    return cells


def describe_config_error(error: ConfigError) -> str:
    errors = getattr(error, "errors", [error])
    return "; ".join(f"{e.field} = {e.value!r}: {e.allowed}" for e in errors)


def plan_sweep(spec: SweepSpec, manager: Any = None, source: str | None = None) -> SweepPlan:
    """Expand the grid and validate every cell against the plugins, touching no device."""
    from core.planning import plan_run
    from core.plugins import get_plugin_manager

    manager = manager if manager is not None else get_plugin_manager()
    cells = expand_cells(spec)
    for cell in cells:
        options = dict(cell.options)
        workload, accelerator = options.pop("workload"), options.pop("accelerator")
        try:
            cell.config = plan_run(manager, workload, accelerator, options).config
        except ConfigError as error:
            cell.invalid_reason = describe_config_error(error)
    return SweepPlan(spec=spec, cells=cells, source=source)


# --- one repeat in its own process -----------------------------------------------------------


def _stop_process_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the cell's process group (torchrun stops its workers on it), SIGKILL what remains."""
    for sig, wait_seconds in ((signal.SIGTERM, STOP_GRACE_SECONDS), (signal.SIGKILL, 30.0)):
        try:
            os.killpg(process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            process.wait(timeout=wait_seconds)
            if sig is signal.SIGTERM:
                # The leader is gone; anything it left in the group gets the same end.
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-_OUTPUT_TAIL_CHARS:].decode("utf-8", errors="replace").strip()


def _read_result(path: Path) -> RunResult | None:
    try:
        return RunResult.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _phase_after(result: RunResult) -> str:
    """The phase a run was in when it stopped: the one after the last it completed."""
    for seconds, following in ((result.window_seconds, "teardown"), (result.warmup_seconds, "window"),
                               (result.first_step_seconds, "warmup"), (result.setup_seconds, "first_step")):
        if seconds is not None:
            return following
    return "setup"


def _bare_result(config: RunConfig) -> RunResult:
    return RunResult(workload=config.workload, accelerator=config.accelerator, framework=config.framework.value,
                     config=config, samples_per_update=config.samples_per_update,
                     samples_per_host_call=config.samples_per_host_call, world_size=config.replicas)


def worker_command(request: Path, result_path: Path) -> list[str]:
    """The command that runs one repeat (see core/sweep_worker.py)."""
    return [sys.executable, "-m", "core.sweep_worker", str(request), str(result_path)]


def run_in_process(cell: Cell, *, timeout_seconds: float, work_dir: Path,
                   on_wait: Callable[[float], None] | None = None) -> tuple[RunResult, float]:
    """Run one repeat of ``cell`` in a fresh process; returns its result and the process's seconds.

    Never raises for what happens inside the process: a crash, a kill or a timeout comes back as
    the result's status, keeping the phases measured before it. KeyboardInterrupt stops the
    process and propagates.
    """
    assert cell.config is not None, "only validated cells run"
    work_dir.mkdir(parents=True, exist_ok=True)
    request, result_path, log_path = (work_dir / "request.json", work_dir / "result.json", work_dir / "output.log")
    for stale in (result_path, result_path.with_name(result_path.name + ".partial")):
        stale.unlink(missing_ok=True)
    request.write_text(json.dumps({"options": cell.options, "parent_pid": os.getpid()}), encoding="utf-8")
    command = worker_command(request, result_path)
    started = time.monotonic()
    timed_out = False
    with open(log_path, "wb") as log:
        # A session of its own: the whole cell (torchrun included) can be stopped as one group,
        # and a Ctrl-C at the terminal reaches the sweep, which then stops the cell itself.
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   env=dict(os.environ, PYTHONUNBUFFERED="1"), start_new_session=True)
        try:
            while True:
                try:
                    process.wait(timeout=_POLL_SECONDS)
                    break
                except subprocess.TimeoutExpired:
                    elapsed = time.monotonic() - started
                    if elapsed > timeout_seconds:
                        timed_out = True
                        _stop_process_group(process)
                        break
                    if on_wait is not None:
                        on_wait(elapsed)
        except BaseException:
            _stop_process_group(process)
            raise
    process_seconds = time.monotonic() - started
    returncode = process.returncode

    result = None if timed_out else _read_result(result_path)
    if result is not None:
        return result, process_seconds
    partial = _read_result(result_path.with_name(result_path.name + ".partial"))
    if partial is not None and not partial.status.ok and not timed_out:
        return partial, process_seconds  # the run recorded its own fault, then the process died
    result = partial if partial is not None else _bare_result(cell.config)
    phase = _phase_after(result)
    output = _tail(log_path)
    output = f"Output tail:\n{output}" if output else "The process printed nothing."
    if timed_out:
        status = Status(state=RunState.timeout, phase=phase, error_type="Timeout",
                        message=f"no result after {timeout_seconds:g} s (the per-repeat time limit); the cell's "
                                f"processes were stopped. {output}")
    elif returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:  # a real-time signal has no name
            name = f"signal {-returncode}"
        killed = -returncode == signal.SIGKILL
        status = Status(state=RunState.killed if killed else RunState.error, phase=phase, error_type="ProcessKilled",
                        message=f"the cell's process was killed by {name}"
                                + (" (the kernel's out-of-memory killer sends SIGKILL)" if killed else "")
                                + f". {output}")
    else:
        status = Status(state=RunState.error, phase=phase, error_type="ProcessFailed",
                        message=f"the cell's process exited with code {returncode} without a result. {output}")
    result.status = status
    return result, process_seconds


# --- the sweep -------------------------------------------------------------------------------


class SweepObserver:
    """What a sweep tells whoever watches it (the CLI's progress line). Every method may be a no-op."""

    def started(self, plan: SweepPlan, runs_total: int, runs_finished: int) -> None: ...

    def run_started(self, cell: Cell, repeat: int, runs_done: int, runs_total: int,
                    seconds_left: float | None) -> None: ...

    def waiting(self, cell: Cell, repeat: int, elapsed_seconds: float, seconds_left: float | None) -> None: ...

    def run_finished(self, cell: Cell, repeat: int, result: RunResult, process_seconds: float) -> None: ...


def _seconds_left(durations: list[float], runs_left: int, current_elapsed: float = 0.0) -> float | None:
    """Mean duration of finished runs times the runs left, less what the current one has used."""
    if not durations:
        return None
    return max(0.0, sum(durations) / len(durations) * runs_left - current_elapsed)


def run_sweep(sweep: str | Path | SweepSpec | SweepPlan, *, database: str | Path | None = None,
              resume: bool = False, retry_failed: bool = False, repeats: int | None = None,
              timeout_seconds: float | None = None, skip_invalid: bool = False,
              observer: SweepObserver | None = None) -> SweepOutcome:
    """Run every cell of a sweep ``repeats`` times, each repeat in its own process, storing each result.

    :param sweep: a sweep file, a SweepSpec, or a SweepPlan from :func:`plan_sweep`.
    :param database: the results database (default: ``$CORE_DATABASE`` or results/core.db).
    :param resume: continue a sweep already in the database, running only what is missing.
    :param retry_failed: with resume, run again the repeats recorded as failed (their rows are replaced).
    :param repeats: override the file's repeats per cell.
    :param timeout_seconds: override the file's per-repeat time limit.
    :param skip_invalid: run the valid cells even if validation refused some (otherwise refuse to start).
    :raises SweepError: before anything runs, when cells are invalid or the database disagrees.
    :returns: what ran, and a summary of every cell.
    """
    plan = sweep if isinstance(sweep, SweepPlan) else plan_sweep(
        sweep if isinstance(sweep, SweepSpec) else load_sweep(sweep),
        source=None if isinstance(sweep, SweepSpec) else str(sweep))
    spec = plan.spec
    updates = {key: value for key, value in (("repeats", repeats), ("timeout_seconds", timeout_seconds))
               if value is not None}
    if updates:
        spec = make_sweep_spec({**spec.model_dump(), **updates})
    if plan.invalid_cells and not skip_invalid:
        raise SweepError(f"{len(plan.invalid_cells)} of {len(plan.cells)} cells are invalid (see --dry-run); "
                         "fix the grid, add an exclude, or pass --skip-invalid:\n"
                         + "\n".join(f"  {cell.label}: {cell.invalid_reason}" for cell in plan.invalid_cells))
    observer = observer or SweepObserver()
    database = Path(database) if database is not None else default_database()
    store = ResultStore(database)
    try:
        finished = _check_database(store, plan, resume)
        store.save_sweep(spec.name, spec.model_dump(mode="json"), [cell.describe() for cell in plan.cells], plan.source)
        return _run_cells(store, plan, spec, finished, retry_failed, observer, database)
    finally:
        store.close()


def _check_database(store: ResultStore, plan: SweepPlan, resume: bool) -> dict[tuple[str, int], str]:
    name = plan.spec.name
    finished = store.finished(name)
    recorded = store.sweep(name)
    if (finished or recorded is not None) and not resume:
        raise SweepError(f"sweep {name!r} already has {len(finished)} run(s) in {store.path}; pass --resume to "
                         "continue it, or give the sweep another name")
    if recorded is not None:
        before = {cell["key"] for cell in recorded.cells}
        now = {cell.key for cell in plan.cells}
        if before != now:
            raise SweepError(f"sweep {name!r} in {store.path} was started with a different grid "
                             f"({len(before - now)} cell(s) gone, {len(now - before)} new); "
                             "resume it with its original file, or give the changed grid another name")
    return finished


def _run_cells(store: ResultStore, plan: SweepPlan, spec: SweepSpec, finished: dict[tuple[str, int], str],
               retry_failed: bool, observer: SweepObserver, database: Path) -> SweepOutcome:
    cells = plan.valid_cells
    ok = RunState.ok.value
    recorded = {key: status for key, status in finished.items() if not (retry_failed and status != ok)}
    # A cell stops at its first failed repeat: an out-of-memory cell would fail every time.
    stopped = {key for (key, _), status in recorded.items() if status != ok}

    def pending() -> list[tuple[int, Cell]]:
        # Rounds: every cell once, then every cell again, so slow drift spreads over all cells.
        return [(repeat, cell) for repeat in range(spec.repeats) for cell in cells
                if (cell.key, repeat) not in recorded and cell.key not in stopped]

    already = sum(1 for cell in cells for repeat in range(spec.repeats) if (cell.key, repeat) in recorded)
    durations = store.process_seconds(spec.name)
    runs_done = 0
    observer.started(plan, runs_total=len(pending()) + already, runs_finished=already)
    with tempfile.TemporaryDirectory(prefix="core-sweep-") as scratch:
        while True:
            queue = pending()
            if not queue:
                break
            repeat, cell = queue[0]
            total = already + runs_done + len(queue)
            observer.run_started(cell, repeat, already + runs_done, total, _seconds_left(durations, len(queue)))

            def waiting(elapsed: float, cell: Cell = cell, repeat: int = repeat, left: int = len(queue)) -> None:
                observer.waiting(cell, repeat, elapsed, _seconds_left(durations, left, elapsed))

            result, seconds = run_in_process(cell, timeout_seconds=spec.timeout_seconds,
                                             work_dir=Path(scratch) / f"cell-{cell.index}-repeat-{repeat}",
                                             on_wait=waiting)
            store.add(result, sweep=spec.name, cell_key=cell.key, cell_label=cell.label, repeat=repeat,
                      process_seconds=seconds, replace=(cell.key, repeat) in finished)
            recorded[(cell.key, repeat)] = result.status.state.value
            if not result.status.ok:
                stopped.add(cell.key)
            durations.append(seconds)
            runs_done += 1
            observer.run_finished(cell, repeat, result, seconds)
    return SweepOutcome(name=spec.name, database=database, runs_done=runs_done, runs_already_finished=already,
                        skipped_invalid=plan.invalid_cells, cells=summarise(store.runs(sweep=spec.name)))
