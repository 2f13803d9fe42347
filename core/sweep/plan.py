"""A sweep's cells: the grid expanded, each cell validated as a run before anything runs."""

from __future__ import annotations

import dataclasses
import itertools
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from core.base.config import check_duration_fits
from core.base.errors import ConfigError, PluginError
from core.base.files import parse_json
from core.base.machine import MachineProfile
from core.sweep.reference import check_references, same_value
from core.sweep.spec import SweepSpec, _flatten, _shorten, _too_many, shown

if TYPE_CHECKING:
    from core.base.config import RunConfig
    from core.running.planning import PlannedRun

_LABEL_VALUE_CHARS = 60  # of one value in a cell's label
SEED_MAX = 2**32 - 1  # RunConfig.seed's largest


@dataclass
class Cell:
    """One point of the grid: its options, and how validation judged them."""

    index: int
    key: str  # canonical JSON of the options: the cell's identity in the database
    label: str  # the axis values only, for people
    options: dict[str, Any]  # RunConfig fields, workload and accelerator included
    #: the cell's validated plan, planned once for the whole sweep: each repeat's process runs it
    #: as it is (core.running.child); None when validation refused the cell
    planned: PlannedRun | None = None
    invalid_reason: str | None = None
    toy: bool = False  # shrunk by ``core sweep --toy`` (core.sweep.toy)

    @property
    def valid(self) -> bool:
        return self.invalid_reason is None

    @property
    def config(self) -> RunConfig | None:
        """The validated configuration, micro-batch resolved; None when refused."""
        return self.planned.config if self.planned is not None else None

    @property
    def warnings(self) -> tuple[str, ...]:
        """What planning warned of (a dry run for a machine shows them)."""
        return self.planned.warnings if self.planned is not None else ()

    def for_repeat(self, repeat: int) -> Cell:
        """The cell as repeat ``repeat`` (from 0) runs it. A run to a target trains from seed + repeat:
        MLPerf Training's runs each take a seed of their own, so the spread of time to target over
        the repeats is that of the training, not only the timing's. Every other run keeps the seed.
        The key, the cell's identity in the database, is the cell's."""
        config = self.config
        if repeat == 0 or config is None or config.target is None:
            return self
        assert self.planned is not None
        seed = config.seed + repeat
        if seed > SEED_MAX:
            seed -= SEED_MAX + 1  # seeds wrap, as they must stay in RunConfig's range
        planned = self.planned.model_copy(update={"config": config.model_copy(update={"seed": seed})})
        return dataclasses.replace(self, planned=planned, options={**self.options, "seed": seed})

    def describe(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "key": self.key,
            "label": self.label,
            "options": self.options,
            "invalid_reason": self.invalid_reason,
            "warnings": list(self.warnings),
        }


@dataclass
class SweepPlan:
    spec: SweepSpec
    cells: list[Cell]
    source: str | None = None
    #: where the cells were planned to run: "local" (here), or "slurm" (each repeat a job of its
    #: cell's nodes, so a multi-node cell needs no allocation or rendezvous here)
    executor: str = "local"

    @property
    def valid_cells(self) -> list[Cell]:
        return [cell for cell in self.cells if cell.valid]

    @property
    def invalid_cells(self) -> list[Cell]:
        return [cell for cell in self.cells if not cell.valid]


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
        if all(
            any(same_value(item, values.get(name)) for item in (wanted if isinstance(wanted, list) else [wanted]))
            for name, wanted in _flatten(entry)
        ):
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
        label = (
            " ".join(f"{name.split('.', 1)[-1]}={_label_value(value)}" for name, value in chosen.items())
            or f"{_label_value(options['workload'])} on {_label_value(options['accelerator'])}"
        )
        cells.append(Cell(index=len(cells), key=cell_key(options), label=label, options=options))
    return cells


def _label_value(value: Any) -> str:
    """A value as a cell's label shows it: a string that reads as a number keeps its quotes ("8")."""
    text = str(value)
    if isinstance(value, str):
        try:
            parse_json(value)
            text = json.dumps(value)
        except ValueError:
            pass
    return _shorten(text, _LABEL_VALUE_CHARS)


def describe_config_error(error: ConfigError) -> str:
    errors = _too_many(list(getattr(error, "errors", [error])))
    described = (f"{e.field}{_shown_value(e)}: {_shorten(str(e.allowed), 600)}" for e in errors)
    return _shorten("; ".join(described), 4000)


def _shown_value(error: ConfigError) -> str:
    return " (missing)" if getattr(error, "missing", False) else f" = {shown(error.value)!r}"


def plan_sweep(
    spec: SweepSpec,
    manager: Any = None,
    source: str | None = None,
    machine: MachineProfile | None = None,
    toy: bool = False,
    executor: str = "local",
) -> SweepPlan:
    """Expand the grid and validate every cell against the plugins, touching no device.

    :param machine: validate for the machine this profile describes instead of this host; with
        executor "slurm", the jobs then plan each run again on their node (core.sweep.remote_plan).
    :param toy: shrink the cells to toy scale, to run on this CPU (core.sweep.toy); the sweep's
        name gets the ``-toy`` suffix so that its results never mix with the file's own.
    :param executor: where the repeats will run (core.sweep.run.EXECUTORS): with "slurm" each
        repeat is a job of its cell's ``nodes`` nodes, so a multi-node cell is planned for that
        job's allocation rather than this process's.
    """
    from core.contract.manager import get_plugin_manager
    from core.running.planning import check_machine, plan_run
    from core.sweep.remote_plan import profile_hint

    manager = manager if manager is not None else get_plugin_manager()
    if machine is not None:
        check_machine(manager, machine)  # once, naming the profile's field, rather than in every cell
    cells = expand_cells(spec)
    check_references(spec.reference, cells)  # against the file's own cells, before a toy shrinks them
    if toy:
        from core.sweep.toy import TOY_SUFFIX, toy_cells

        cells = toy_cells(cells, manager)
        update: dict[str, Any] = {"name": spec.name + TOY_SUFFIX, "repeats": 1, "machine": None}
        if spec.report is not None and (spec.report.roofs or "").startswith("machine"):
            # The file's machine's roofs (a paper's table): a toy on this CPU draws its own instead.
            update["report"] = spec.report.model_copy(update={"roofs": None})
        spec = spec.model_copy(update=update)
    for cell in cells:
        options = dict(cell.options)
        workload, accelerator = options.pop("workload"), options.pop("accelerator")
        try:
            in_slurm_job = executor == "slurm"
            cell.planned = plan_run(
                manager, workload, accelerator, options, machine=machine, in_slurm_job=in_slurm_job
            ).document()
            check_duration_fits(options.get("duration_seconds"), spec.timeout_seconds, "the sweep's")
        except ConfigError as error:
            cell.invalid_reason = describe_config_error(error) + profile_hint(error, executor, machine)
        except PluginError as fault:  # a plugin's own bug makes its cells invalid, not the sweep crash
            cell.invalid_reason = str(fault)
    return SweepPlan(spec=spec, cells=cells, source=source, executor=executor)
