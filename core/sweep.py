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
import reprlib
import subprocess
import sys
import tempfile
import time
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from core.config import RunConfig
from core.errors import ConfigError, ConfigErrors, CoreError, PluginError
from core.results import RunResult, RunState
from core.store import ResultStore, StoreError, default_database, unsaved_directory
from core.summary import CellSummary, summarise

DEFAULT_REPEATS = 3
DEFAULT_TIMEOUT_SECONDS = 3600.0  # per repeat; an IPU's first compilation alone can take tens of minutes
STOP_GRACE_SECONDS = 10.0  # between SIGTERM and SIGKILL when a cell is stopped
_POLL_SECONDS = 0.5
_OUTPUT_TAIL_CHARS = 4000
_DICT_FIELDS = ("workload_options", "accelerator_options")
_NAME_PUNCTUATION = "._-"
_NAME_RULE = ("a sweep name is letters and digits of any script, '.', '_' and '-', starting with a letter or "
              "digit (the pattern [letter or digit][letters, digits, . _ -]*, at most 200 characters): no "
              "spaces, '/' or control characters, and no leading '.' (so no '..')")
_Scalar = (bool, int, float, str)
MAX_SWEEP_FILE_BYTES = 1 << 20  # a sweep file declares a grid; anything larger is a mistake or an attack
_SHOWN_CHARS = 200  # of a value quoted back in an error
_SHOWN_ERRORS = 10  # problems listed from one sweep file; the rest are counted
_LABEL_VALUE_CHARS = 60  # of one value in a cell's label


class SweepError(CoreError):
    """A sweep cannot start: its file is unreadable, cells are invalid, or its database disagrees."""


class UnsavedResultError(SweepError):
    """The database refused a result mid-sweep (a full disk): the sweep stopped, the result is kept.

    ``document`` is the run as JSON-ready data (sweep, cell, repeat, result); ``saved_to`` the file
    it was written to beside the database (``<database>.unsaved/``), which ``--resume`` records,
    or None when that failed too (``save_error``); ``core sweep`` then prints it as JSON.
    """

    def __init__(self, message: str, document: dict[str, Any], saved_to: Path | None, save_error: str | None) -> None:
        super().__init__(message)
        self.document = document
        self.saved_to = saved_to
        self.save_error = save_error


class SweepSpec(BaseModel):
    """A sweep file, as read. ``grid`` holds RunConfig fields; a list value is an axis.

    Strict: a number is a number (``repeats = true`` or ``"3"`` is refused, not 1 or 3); a
    ``timeout_seconds`` may be written as an integer.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(min_length=1, max_length=200,
                      description="the sweep's name in the database; defaults to the file's stem")
    description: str | None = None
    repeats: int = Field(default=DEFAULT_REPEATS, ge=1, le=1000, description="runs per cell")
    timeout_seconds: float = Field(default=DEFAULT_TIMEOUT_SECONDS, gt=0, le=7 * 24 * 3600.0,
                                   description="wall-clock limit of one repeat, process start to exit")
    grid: dict[str, Any]
    exclude: list[dict[str, Any]] = Field(default_factory=list,
                                          description="partial cells to leave out; a list matches any of its values")

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        value = unicodedata.normalize("NFC", value)
        if not _valid_sweep_name(value):
            raise ValueError(_NAME_RULE)
        return value

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
    runs_recovered: int = 0  # results a failed write had left in <database>.unsaved/, now recorded


# --- reading a sweep file --------------------------------------------------------------------


def read_sweep_document(path: Path) -> dict[str, Any]:
    """The file's contents as a dict; the suffix says the format (.toml, .yaml/.yml, .json).

    A file over 1 MiB is refused, and so are YAML aliases (``*name``, ``<<: *name``): a few hundred
    bytes of nested aliases expand to billions of values.
    """
    from core.files import describe_os_error

    suffix = path.suffix.lower()
    if suffix not in (".toml", ".yaml", ".yml", ".json"):
        raise SweepError(f"sweep file {path}: unknown format {_shorten(suffix)!r}; use .toml, .yaml, .yml or .json")
    try:
        with open(path, "rb") as stream:
            data = stream.read(MAX_SWEEP_FILE_BYTES + 1)
    except OSError as exc:
        raise SweepError(f"cannot read sweep file {path}: {describe_os_error(exc)}") from None
    if len(data) > MAX_SWEEP_FILE_BYTES:
        raise SweepError(f"sweep file {path} is larger than {MAX_SWEEP_FILE_BYTES >> 20} MiB; a sweep file "
                         "declares a grid, it holds no data")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SweepError(f"sweep file {path} is not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    try:
        if suffix == ".toml":
            try:
                import tomllib
            except ModuleNotFoundError:  # Python 3.10
                import tomli as tomllib
            document = tomllib.loads(text)
        elif suffix in (".yaml", ".yml"):
            import yaml

            document = yaml.load(text, Loader=_yaml_loader())  # noqa: S506 - a SafeLoader without aliases
        else:
            document = json.loads(text)
    except Exception as exc:  # each parser has its own error type (RecursionError too); all mean the same here
        text = str(exc).replace('in "<unicode string>", ', "")  # PyYAML's name for the text it was given
        raise SweepError(f"cannot parse sweep file {path}: {_shorten(text, 500)}") from None
    if not isinstance(document, dict):
        raise SweepError(f"sweep file {path}: expected a table of settings at the top level")
    return document


_YAML_LOADER: Any = None


def _yaml_loader() -> Any:
    """yaml.SafeLoader that refuses aliases: with them, 300 bytes can expand to gigabytes."""
    global _YAML_LOADER
    if _YAML_LOADER is None:
        import yaml

        class NoAliasLoader(yaml.SafeLoader):
            def compose_node(self, parent: Any, index: Any) -> Any:
                if self.check_event(yaml.AliasEvent):
                    event = self.peek_event()
                    raise yaml.composer.ComposerError(
                        None, None, f"found the alias *{_shorten(str(event.anchor), 60)}: a sweep file may not use "
                        "YAML aliases (*name, <<: *name); write the values out", event.start_mark)
                return super().compose_node(parent, index)

        _YAML_LOADER = NoAliasLoader
    return _YAML_LOADER


class _Shown:
    """A stand-in for a long value in an error message: its repr is the value's, cut short."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxtuple, _REPR.maxset = 4, 20, 20, 20, 20
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = _SHOWN_CHARS


def shown(value: Any) -> Any:
    """``value`` when it is short; else an object whose repr is the start of the value's.

    Every error that quotes a value from a sweep file goes through here, so a huge value gives a
    short message (the work is bounded too: reprlib never walks the whole value).
    """
    if value is None or isinstance(value, (bool, int, float)) and len(_REPR.repr(value)) <= _SHOWN_CHARS:
        return value
    if isinstance(value, str) and len(value) <= _SHOWN_CHARS:
        return value
    text = _REPR.repr(value)
    if isinstance(value, (list, dict)) and len(text) <= _SHOWN_CHARS and "..." not in text:
        return value
    return _Shown(_shorten(text, _SHOWN_CHARS))


def _shorten(text: str, limit: int = _SHOWN_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _too_many(errors: list[ConfigError]) -> list[ConfigError]:
    if len(errors) <= _SHOWN_ERRORS:
        return errors
    return errors[:_SHOWN_ERRORS] + [ConfigError("sweep", _Shown("..."),
                                                 f"and {len(errors) - _SHOWN_ERRORS} more problems not shown")]


def make_sweep_spec(document: dict[str, Any], default_name: str | None = None) -> SweepSpec:
    """Validate a sweep document. Raises ConfigError naming the setting (``grid.precision``)."""
    from core.config import describe_type_error

    document = dict(document)
    if default_name is not None and "name" not in document:
        document["name"] = default_name
    try:
        spec = SweepSpec(**document)
    except ValidationError as exc:
        errors = []
        for error in exc.errors():
            where = ".".join(str(part) for part in error.get("loc", ())) or "sweep"
            if error.get("type") == "extra_forbidden":
                allowed = "unknown setting; a sweep file has: " + ", ".join(SweepSpec.model_fields)
            else:
                allowed = describe_type_error(error, SweepSpec) or str(error.get("msg", "invalid"))
                allowed = allowed.removeprefix("Value error, ")
            errors.append(ConfigError(where, shown(error.get("input")), _shorten(allowed, 600)))
        errors = _too_many(errors)
        raise (errors[0] if len(errors) == 1 else ConfigErrors(errors)) from None
    _check_grid(spec)
    return spec


def load_sweep(path: str | Path) -> SweepSpec:
    path = Path(path)
    return make_sweep_spec(read_sweep_document(path), default_name=_default_name(path))


def _name_character(character: str) -> bool:
    # Letters and digits of any script, with their combining marks (Devanagari's vowel signs).
    return character.isalnum() or character in _NAME_PUNCTUATION or unicodedata.category(character)[0] == "M"


def _valid_sweep_name(name: str) -> bool:
    return 0 < len(name) <= 200 and name[0].isalnum() and all(_name_character(c) for c in name)


def _default_name(path: Path) -> str:
    """The file's stem made a valid name: ``größe.toml`` -> ``größe``, ``my grid.yaml`` -> ``my-grid``."""
    stem = unicodedata.normalize("NFC", path.stem)
    name = "".join(c if _name_character(c) else "-" for c in stem)
    while name and not name[0].isalnum():
        name = name[1:]
    name = name[:200]
    return name if _valid_sweep_name(name) else "sweep"


def _flatten(grid: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    for name, value in grid.items():
        if name in _DICT_FIELDS and isinstance(value, dict):
            for key, inner in value.items():
                yield f"{name}.{key}", inner
        else:
            yield name, value


_FLOAT_FIELDS = {name for name, info in RunConfig.model_fields.items() if info.annotation in (float, float | None)}


def _check_grid(spec: SweepSpec) -> None:
    allowed_fields = list(RunConfig.model_fields)
    for name, value in spec.grid.items():
        if name not in RunConfig.model_fields:
            raise ConfigError(f"grid.{_shorten(name, 80)}", shown(value),
                              "unknown run option; allowed: " + ", ".join(allowed_fields))
        if name in _DICT_FIELDS and not isinstance(value, dict):
            raise ConfigError(f"grid.{name}", shown(value), "a table of KEY = value (a value may be a list)")
    if "workload" not in spec.grid:
        raise ConfigError("grid.workload", None, "required: the workload to run (a name, or a list of names)")
    for name, value in _flatten(spec.grid):
        where = f"grid.{_shorten(name, 80)}"
        values = value if isinstance(value, list) else [value]
        if not values:
            raise ConfigError(where, value, "an empty list makes no cells; give at least one value")
        seen: dict[tuple[str, Any], Any] = {}
        for item in values:
            if not isinstance(item, _Scalar):
                raise ConfigError(where, shown(item), "a value must be a number, a string or a boolean (or a list of them)")
            # Values are distinct as JSON values: 8, 8.0, "8" and true are four cells, which the
            # strict RunConfig then judges (8.0, "8" and true are not an integer). Only where the
            # option is a float, which takes 8 and 8.0 alike, are they one cell written twice.
            kind = "boolean" if isinstance(item, bool) else "string" if isinstance(item, str) else (
                "number" if name in _FLOAT_FIELDS else type(item).__name__)
            identity = (kind, item)
            if identity in seen:
                same = "" if json.dumps(seen[identity]) == json.dumps(item) else \
                    f" ({_shorten(json.dumps(seen[identity]), 40)} and {_shorten(json.dumps(item), 40)} are the same number)"
                raise ConfigError(where, shown(value), f"a value appears twice{same}: the same cell would run twice")
            seen[identity] = item
    known = {name for name, _ in _flatten(spec.grid)}
    for position, entry in enumerate(spec.exclude):
        if not isinstance(entry, dict) or not entry:
            raise ConfigError(f"exclude.{position}", shown(entry), "a table of option = value (or list of values)")
        for name, _ in _flatten(entry):
            if name not in known:
                raise ConfigError(f"exclude.{position}.{_shorten(name, 80)}", shown(entry),
                                  "not an option set in the grid; allowed: " + ", ".join(sorted(known)))


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
        label = " ".join(f"{name.split('.', 1)[-1]}={_label_value(value)}" for name, value in chosen.items()) \
            or f"{_label_value(options['workload'])} on {_label_value(options['accelerator'])}"
        cells.append(Cell(index=len(cells), key=cell_key(options), label=label, options=options))
    return cells


def _label_value(value: Any) -> str:
    """A value as a cell's label shows it: a string that reads as a number keeps its quotes ("8")."""
    text = str(value)
    if isinstance(value, str):
        try:
            json.loads(value)
            text = json.dumps(value)
        except ValueError:
            pass
    return _shorten(text, _LABEL_VALUE_CHARS)


def describe_config_error(error: ConfigError) -> str:
    errors = _too_many(list(getattr(error, "errors", [error])))
    return _shorten("; ".join(f"{e.field} = {shown(e.value)!r}: {_shorten(str(e.allowed), 600)}" for e in errors),
                    4000)


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
        except PluginError as fault:  # a plugin's own bug makes its cells invalid, not the sweep crash
            cell.invalid_reason = str(fault)
    return SweepPlan(spec=spec, cells=cells, source=source)


# --- one repeat in its own process -----------------------------------------------------------


def _stop_process_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the cell's process group (torchrun stops its workers on it), SIGKILL what remains."""
    from core import processes

    processes.stop_process_group(process, STOP_GRACE_SECONDS)


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
    the result's status, keeping the phases measured before it. KeyboardInterrupt (and SIGTERM,
    which the CLI turns into one) stops the process and propagates.
    """
    from core import processes

    assert cell.config is not None, "only validated cells run"
    work_dir.mkdir(parents=True, exist_ok=True)
    request, result_path, log_path = (work_dir / "request.json", work_dir / "result.json", work_dir / "output.log")
    partial_path = result_path.with_name(result_path.name + ".partial")
    for stale in (result_path, partial_path):
        stale.unlink(missing_ok=True)
    request.write_text(json.dumps({"options": cell.options, "parent_pid": os.getpid()}), encoding="utf-8")
    command = worker_command(request, result_path)
    started = time.monotonic()
    timed_out = False
    with open(log_path, "wb") as log:
        # A session of its own: the whole cell (torchrun included) can be stopped as one group,
        # and a Ctrl-C at the terminal reaches the sweep, which then stops the cell itself. The
        # cell's process ends with the sweep if the sweep is killed (core.processes).
        process = processes.start(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            while True:
                try:
                    process.wait(timeout=_POLL_SECONDS)
                    break
                except subprocess.TimeoutExpired:
                    elapsed = time.monotonic() - started
                    if elapsed > timeout_seconds:
                        timed_out = True
                        break
                    if on_wait is not None:
                        on_wait(elapsed)
        finally:
            _stop_process_group(process)
    process_seconds = time.monotonic() - started

    result = None if timed_out else _read_result(result_path)
    if result is not None:
        return result, process_seconds
    partial = _read_result(partial_path)
    if partial is not None and not partial.status.ok and not timed_out:
        return partial, process_seconds  # the run recorded its own fault, then the process died
    result = partial if partial is not None else _bare_result(cell.config)
    phase = processes.phase_after(result)
    if timed_out:
        result.status = processes.timeout_status(timeout_seconds, phase=phase, output=_tail(log_path),
                                                 limit="the per-repeat time limit")
    else:
        result.status = processes.exit_status(process.returncode, process="the cell's process", phase=phase,
                                              output=_tail(log_path))
    return result, process_seconds


# --- the sweep -------------------------------------------------------------------------------


class SweepObserver:
    """What a sweep tells whoever watches it (the CLI's progress line). Every method may be a no-op."""

    def started(self, plan: SweepPlan, runs_total: int, runs_finished: int, runs_recorded: int | None = None) -> None:
        """``runs_finished`` of ``runs_total`` asked for are recorded; ``runs_recorded`` counts the
        sweep's valid cells' runs in the database, those beyond a lowered ``repeats`` included."""

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
    store = ResultStore(database)  # StoreError, before anything runs: a directory, no database, a full disk
    try:
        # One sweep at a time on a database: a second one is refused (DatabaseInUseError), never
        # run beside the first. The kernel releases the lock however this process ends.
        with store.lock(spec.name):
            finished = _check_database(store, plan, resume)
            store.save_sweep(spec.name, _spec_record(spec, store.sweep(spec.name)),
                             [cell.describe() for cell in plan.cells], plan.source)
            recovered = _record_unsaved(store, plan, finished) if resume else 0
            outcome = _run_cells(store, plan, spec, finished, retry_failed, observer, database)
            outcome.runs_recovered = recovered
            return outcome
    finally:
        store.close()


def _spec_record(spec: SweepSpec, recorded: Any) -> dict[str, Any]:
    """The spec to store: a new sweep's as given; a resumed one's as first recorded, never lowered.

    ``repeats`` becomes the larger of the recorded and the new value (the runs beyond a lowered
    ``--repeats`` stay in the database, and every summary counts them); a resume that changes
    ``repeats`` or ``timeout_seconds`` is added to ``resumed`` with its values.
    """
    asked = spec.model_dump(mode="json")
    if recorded is None:
        return asked
    stored = dict(recorded.spec)
    previous = stored.get("repeats")
    if isinstance(previous, int) and not isinstance(previous, bool):
        stored["repeats"] = max(previous, spec.repeats)
    else:
        stored["repeats"] = spec.repeats
    changes = {key: asked[key] for key in ("repeats", "timeout_seconds") if recorded.spec.get(key) != asked[key]}
    if changes:
        from datetime import datetime, timezone

        history = stored.get("resumed") if isinstance(stored.get("resumed"), list) else []
        stored["resumed"] = [*history, {"at": datetime.now(timezone.utc).isoformat(), **changes}]
    return stored


def _unsaved_file(database: Path, sweep: str, cell: Cell, repeat: int) -> Path:
    return unsaved_directory(database) / f"{sweep}-cell{cell.index + 1}-repeat{repeat + 1}.json"


def _save_unsaved(path: Path, document: dict[str, Any]) -> str | None:
    """Write ``document`` whole to ``path`` (None) or say why it could not be written."""
    from core.files import OutputError, write_atomically

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps(document, indent=1) + "\n", "unsaved result")
        return None
    except OutputError as error:
        why = str(error)
    except OSError as exc:
        from core.files import describe_os_error

        why = f"cannot create {path.parent}: {describe_os_error(exc)}"
    try:
        path.parent.rmdir()  # only when empty: leave no folder that holds nothing
    except OSError:
        pass
    return why


def _record_unsaved(store: ResultStore, plan: SweepPlan, finished: dict[tuple[str, int], str]) -> int:
    """Record the results a failed write left in ``<database>.unsaved/`` for this sweep; returns how many.

    A file is removed once its run is in the database; one that cannot be read, belongs to a
    cell no longer in the grid, or whose repeat is already recorded stays, with a warning.
    """
    import logging

    directory = unsaved_directory(store.path)
    if not directory.is_dir():
        return 0
    log = logging.getLogger(__name__)
    cells = {cell.key: cell for cell in plan.valid_cells}
    name = plan.spec.name
    recovered = 0
    for path in sorted(directory.glob(f"{name}-cell*-repeat*.json")):
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
            if document.get("sweep") != name:
                continue  # another sweep whose name starts like this one's
            key, repeat = document["cell_key"], document["repeat"]
            result = RunResult.model_validate(document["result"])
            seconds = document.get("process_seconds")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("core: warning: cannot record %s: %s", path, _shorten(str(exc), 300))
            continue
        if key not in cells or not isinstance(repeat, int):
            log.warning("core: warning: %s is for a cell this sweep's grid does not have; left in place", path)
            continue
        if (key, repeat) in finished:
            log.warning("core: warning: %s: repeat %d of %s is already recorded; left in place",
                        path, repeat + 1, cells[key].label)
            continue
        store.add(result, sweep=name, cell_key=key, cell_label=cells[key].label, repeat=repeat,
                  process_seconds=seconds if isinstance(seconds, (int, float)) else None)
        finished[(key, repeat)] = result.status.state.value
        recovered += 1
        path.unlink(missing_ok=True)
    try:
        directory.rmdir()  # only when empty
    except OSError:
        pass
    return recovered


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
    valid_keys = {cell.key for cell in cells}
    in_database = sum(1 for key, _ in recorded if key in valid_keys)  # beyond a lowered --repeats too
    durations = store.process_seconds(spec.name)
    runs_done = 0
    observer.started(plan, runs_total=len(pending()) + already, runs_finished=already, runs_recorded=in_database)
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
            try:
                store.add(result, sweep=spec.name, cell_key=cell.key, cell_label=cell.label, repeat=repeat,
                          process_seconds=seconds, replace=(cell.key, repeat) in finished)
            except StoreError as error:
                observer.run_finished(cell, repeat, result, seconds)
                raise _unsaved(database, spec.name, cell, repeat, result, seconds, error) from None
            recorded[(cell.key, repeat)] = result.status.state.value
            if not result.status.ok:
                stopped.add(cell.key)
            durations.append(seconds)
            runs_done += 1
            observer.run_finished(cell, repeat, result, seconds)
    return SweepOutcome(name=spec.name, database=database, runs_done=runs_done, runs_already_finished=already,
                        skipped_invalid=plan.invalid_cells, cells=summarise(store.runs(sweep=spec.name)))


def _unsaved(database: Path, sweep: str, cell: Cell, repeat: int, result: RunResult, seconds: float,
             error: StoreError) -> UnsavedResultError:
    """The error that stops a sweep whose database refused a result, after saving the result if it can."""
    document = {"sweep": sweep, "cell_key": cell.key, "cell_label": cell.label, "repeat": repeat,
                "process_seconds": seconds, "result": result.model_dump(mode="json")}
    path = _unsaved_file(database, sweep, cell, repeat)
    save_error = _save_unsaved(path, document)
    what = f"repeat {repeat + 1} of cell {cell.label!r}"
    if save_error is None:
        kept = f"its result is saved in {path}, which the sweep records when resumed"
    else:
        kept = (f"its result could not be saved beside the database either ({save_error}), so it is printed "
                "as JSON on standard output")
    message = f"the sweep stopped: cannot record {what}: {error}; {kept}"
    return UnsavedResultError(message, document, None if save_error else path, save_error)
