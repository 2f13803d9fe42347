"""The ``core`` command. ``core --help`` and ``core plugins`` import no framework or vendor SDK."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from core.contract.commands import BUILTIN_COMMANDS
from core.energy.units import JOULES_PER_WATT_HOUR
from core.errors import ConfigError
from core.sweep.loop import SweepObserver

_GIB = 1024**3

# The run command's flags come from RunConfig's fields: --field-name, except these names users
# already type. The fields below _OWN_SYNTAX are taken another way (positional, -o, -a).
_FLAG_NAMES = {
    "micro_batch_size": "--batch-size",
    "power_sample_interval_seconds": "--power-sample-interval",
    "threads_per_replica": "--threads",
}
_OWN_SYNTAX = {
    "workload": "WORKLOAD",
    "accelerator": "--accelerator",
    "workload_options": "-o",
    "accelerator_options": "-a",
    "loadgen": "-l",
}


def run_flags() -> dict[str, str]:
    """RunConfig field -> the ``core run`` flag that sets it (so an error can name both)."""
    from core.config import RunConfig

    flags = {name: _FLAG_NAMES.get(name, "--" + name.replace("_", "-")) for name in RunConfig.model_fields}
    return {**flags, **_OWN_SYNTAX}


def _flag_help(info: Any) -> tuple[Any, str]:
    """(argparse type, help) for one RunConfig field: its description, what it allows, its default."""
    import enum
    import types
    import typing

    from core.precision import BUILTIN_POLICIES, Precision

    kind = info.annotation
    if typing.get_origin(kind) in (typing.Union, types.UnionType):  # "int | None": the int
        kind = next(k for k in typing.get_args(kind) if k is not type(None))
    text = info.description or ""
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        text += f"; one of: {', '.join(str(member.value) for member in kind)}"
        kind = str
    elif typing.get_origin(kind) is typing.Literal:
        text += f"; one of: {', '.join(str(value) for value in typing.get_args(kind))}"
        kind = str
    elif kind is Precision:  # open: core's names, and any a plugin registers a policy for
        text += f"; core's: {', '.join(BUILTIN_POLICIES)}, and any a plugin registers"
        kind = str
    default = info.default.value if isinstance(info.default, enum.Enum) else info.default
    if default is not None and default != "":
        text += f" (default: {default})"
    return kind, text.lstrip("; ")


def _add_run_flags(run: argparse.ArgumentParser) -> None:
    """One flag per RunConfig field, generated: a new field gets its flag, help and error naming."""
    from core.config import RunConfig

    flags = run_flags()
    for name, info in RunConfig.model_fields.items():
        if name in _OWN_SYNTAX:
            continue
        kind, text = _flag_help(info)
        # default None: only what the user typed reaches RunConfig, which keeps its own defaults.
        if kind is bool:
            run.add_argument(flags[name], dest=name, action="store_true", default=None, help=text)
        else:
            metavar = flags[name].lstrip("-").upper().replace("-", "_")
            run.add_argument(flags[name], dest=name, type=kind, default=None, metavar=metavar, help=text)


def _option_pair(text: str) -> tuple[str, Any]:
    """``key=value`` with value parsed as JSON where it can be (numbers, true/false)."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    key, raw = text.split("=", 1)
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return key.strip(), value


def build_parser(plugin_commands: bool = True) -> argparse.ArgumentParser:
    """The ``core`` command's parser; with ``plugin_commands``, the commands plugins add too (which
    loads the plugins)."""
    parser = argparse.ArgumentParser(prog="core", description="Run one ML workload on any accelerator and measure it.")
    parser.add_argument(
        "--debug",
        action="store_true",
        help="show tracebacks: where a failing run or plugin broke, and core's own errors",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    # `core run ... --debug` as well as `core --debug run ...`: SUPPRESS keeps the top-level value.
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="show tracebacks: where a failing run or plugin broke, and core's own errors",
    )

    run = commands.add_parser("run", parents=[debug], help="run a workload and print its result")
    run.add_argument("workload", metavar="WORKLOAD", help="workload name (see `core workloads`)")
    run.add_argument("--accelerator", default="cpu", help="accelerator name (see `core plugins`); default: cpu")
    _add_run_flags(run)
    run.add_argument(
        "-o",
        "--option",
        dest="workload_options",
        action="append",
        type=_option_pair,
        default=[],
        metavar="KEY=VALUE",
        help="workload hyper-parameter, e.g. -o layers=8 (repeatable)",
    )
    run.add_argument(
        "-a",
        "--accelerator-option",
        dest="accelerator_options",
        action="append",
        type=_option_pair,
        default=[],
        metavar="KEY=VALUE",
        help="vendor placement option, e.g. -a mode=package (AMD), -a ipu_model=true (Graphcore)",
    )
    run.add_argument(
        "-l",
        "--loadgen",
        dest="loadgen",
        action="append",
        type=_option_pair,
        default=[],
        metavar="KEY=VALUE",
        help="LoadGen setting with --scenario offline/single-stream/server, e.g. -l min_duration_seconds=60",
    )
    run.add_argument(
        "--timeout-seconds",
        type=float,
        metavar="TIMEOUT_SECONDS",
        help="stop the run after this long (it then runs in a child process); the result keeps the phases "
        "measured before",
    )
    run.add_argument("--json", action="store_true", help="print the result as JSON")
    run.add_argument("--output", type=Path, help="also write the result JSON to this file")
    run.add_argument(
        "--database",
        type=Path,
        help="also store the run, failed or not, in this results database (as a sweep does; "
        "`core report` shows it under Single runs)",
    )
    run.add_argument("--dry-run", action="store_true", help="validate and show the plan; run nothing")
    run.add_argument("--machine", help=_MACHINE_HELP)

    plugins = commands.add_parser(
        "plugins", parents=[debug], help="list plugins, what they register and whether it is available"
    )
    plugins.add_argument("--json", action="store_true")
    plugins.add_argument(
        "-v", "--verbose", action="store_true", help="show the traceback of every plugin that failed to load or raised"
    )
    devices = commands.add_parser("devices", parents=[debug], help="list the devices of every available accelerator")
    devices.add_argument("--json", action="store_true")
    machines = commands.add_parser(
        "machines", parents=[debug], help="list the machine profiles --dry-run --machine can plan for"
    )
    machines.add_argument("--json", action="store_true")
    workloads = commands.add_parser("workloads", parents=[debug], help="list registered workloads")
    workloads.add_argument("--json", action="store_true")

    database_help = "results database (default: $CORE_DATABASE, else results/core.db)"
    sweep = commands.add_parser(
        "sweep",
        parents=[debug],
        help="run a grid of runs declared in a TOML or YAML file",
        description="Run every cell of a grid file, each repeat in its own process, "
        "and store every result. See docs/sweeps.md.",
    )
    sweep.add_argument("file", metavar="FILE", type=Path, help="grid file (.toml, .yaml, .yml or .json)")
    sweep.add_argument("--dry-run", action="store_true", help="list the cells and validate them; run nothing")
    sweep.add_argument("--machine", help=_MACHINE_HELP + "; default: the file's `machine`")
    sweep.add_argument(
        "--toy",
        action="store_true",
        help="the file's cells shrunk to run on this CPU in seconds, stored as NAME-toy (docs/sweeps.md#toy-scale)",
    )
    sweep.add_argument("--resume", action="store_true", help="continue a sweep already in the database")
    sweep.add_argument(
        "--retry-failed", action="store_true", help="with --resume, run failed repeats (oom, error, timeout) again"
    )
    sweep.add_argument("--database", type=Path, help=database_help)
    sweep.add_argument("--repeats", type=int, help="runs per cell (overrides the file; default 3)")
    sweep.add_argument("--timeout-seconds", type=float, help="time limit of one repeat (overrides the file)")
    sweep.add_argument("--skip-invalid", action="store_true", help="run the valid cells when some are invalid")
    sweep.add_argument(
        "--workers",
        choices=("warm", "fresh"),
        default="warm",
        help="warm: fork each run from a parent that imported PyTorch once, where that is safe (default); "
        "fresh: a new interpreter per run (docs/sweeps.md#warm-workers)",
    )
    sweep.add_argument("--name", help="the sweep's name in the database (overrides the file)")
    sweep.add_argument(
        "--executor",
        choices=("local", "slurm"),
        default="local",
        help="local: one repeat after another on this machine (default); slurm: each repeat a Slurm job "
        "(docs/cluster.md#sweeps-on-a-cluster)",
    )
    slurm = sweep.add_argument_group("Slurm jobs (override the sweep file's [slurm] table)")
    for flag, kind, what in _SLURM_FLAGS:
        slurm.add_argument(f"--slurm-{flag.replace('_', '-')}", dest=f"slurm_{flag}", type=kind, help=what)
    slurm.add_argument(
        "--slurm-option",
        dest="slurm_extra_options",
        action="append",
        metavar="OPTION",
        help="a further sbatch option such as --slurm-option=--qos=high (repeatable)",
    )

    report = commands.add_parser(
        "report", parents=[debug], help="write a Markdown and HTML report with plots from the database"
    )
    report.add_argument(
        "databases",
        nargs="*",
        type=Path,
        metavar="DATABASE",
        help="results databases to report together, compared where they ran the same configurations on "
        "different platforms or hosts (default: --database, else $CORE_DATABASE, else results/core.db)",
    )
    report.add_argument("--database", type=Path, help=database_help)
    report.add_argument(
        "--epochs",
        type=int,
        help="add the estimated time and energy to train this many epochs (and the measured ones where a run "
        "did whole epochs)",
    )
    report.add_argument(
        "--epoch-definition",
        metavar="DEFINITION",
        help="with --epochs: what an epoch is (dataset, samples:N, global-batches:N, host-calls:N); default: "
        "each run's own epoch_definition",
    )
    report.add_argument(
        "--compare-ignore",
        action="append",
        default=[],
        metavar="OPTION",
        help="an option not matched when comparing platforms, which becomes part of what is compared, e.g. "
        "replicas for 1x A100 against 4x A100 (repeatable)",
    )
    report.add_argument(
        "--baseline", metavar="TEXT", help="compare against the side whose label (host: devices) contains TEXT"
    )
    report.add_argument(
        "--sweep",
        action="append",
        dest="sweeps",
        metavar="NAME",
        help="report this sweep (repeatable; default: every sweep)",
    )
    report.add_argument(
        "--output",
        type=Path,
        default=Path("results") / "report",
        help="directory for report.md, report.html and plots/ (default: results/report)",
    )

    results = commands.add_parser("results", parents=[debug], help="query or export the results database")
    results.add_argument("--database", type=Path, help=database_help)
    results.add_argument("--sweep", help="only this sweep")
    results.add_argument("--status", help="only runs in this state (ok, oom, error, timeout, ...)")
    results.add_argument(
        "--format",
        choices=("summary", "csv", "json", "parquet"),
        default="summary",
        help="summary (cells with median and spread; default), csv or json (one row per run), parquet",
    )
    results.add_argument("--output", type=Path, help="write to this file (required for parquet)")
    if plugin_commands:
        _add_plugin_commands(commands, debug)
    return parser


# Where a plugin command's parsed arguments say which command they are for.
_PLUGIN_COMMAND = "_core_plugin_command"


def _add_plugin_commands(commands: Any, debug: argparse.ArgumentParser) -> None:
    """The commands plugins registered (core_register_commands), after core's own.

    A command whose ``add_arguments`` raises, or adds an argument argparse refuses (``--debug`` is
    core's), is still listed: invoking it says why it cannot run, and every other command works.
    """
    from core.contract.manager import PluginFault, get_plugin_manager
    from core.report.document import one_line

    manager = get_plugin_manager()
    for name, registered in sorted(manager.commands.items()):
        command = registered.item
        arguments = argparse.ArgumentParser(add_help=False)
        try:
            with manager.plugin_code(command, f"command {name!r}: add_arguments()"):
                if command.add_arguments is not None:
                    command.add_arguments(arguments)
            # argparse's own checks (an argument clashing with --debug), before the command is listed.
            argparse.ArgumentParser(parents=[arguments, debug])
        except (PluginFault, ConfigError, argparse.ArgumentError) as error:
            problem = str(error) if isinstance(error, PluginFault) else f"plugin {registered.plugin!r}: {error}"
            broken = commands.add_parser(
                name, parents=[debug], help=f"(cannot run: {one_line(problem)})".replace("%", "%%")
            )
            broken.set_defaults(**{_PLUGIN_COMMAND: (name, problem)})
            continue
        parser = commands.add_parser(
            name,
            parents=[arguments, debug],
            help=f"{command.help} (plugin {registered.plugin})".replace("%", "%%"),  # argparse %-formats help
            description=command.description or command.help,
        )
        parser.set_defaults(**{_PLUGIN_COMMAND: (name, None)})


def _command_of_plugin(args: argparse.Namespace) -> int:
    """Run a plugin's command: what it raises is reported against the plugin, never a bare traceback."""
    from core.contract.manager import PluginFault, get_plugin_manager

    name, problem = getattr(args, _PLUGIN_COMMAND)
    if problem is not None:
        return _error(f"command {name!r} cannot run: {problem}", code=1)
    manager = get_plugin_manager()
    command = manager.commands[name].item
    try:
        with manager.plugin_code(command, f"command {name!r}"):
            code = command.run(args)
    except ConfigError as error:
        return _error(_describe_config_error(error))
    except PluginFault as fault:
        if args.debug:
            print(fault.traceback_text, file=sys.stderr, end="")
        return _error(f"{fault}{'' if args.debug else ' (core --debug shows the traceback)'}", code=1)
    if code is None:
        return 0
    if isinstance(code, bool) or not isinstance(code, int) or not 0 <= code <= 255:
        plugin = manager.commands[name].plugin
        return _error(f"plugin {plugin!r}: command {name!r} returned {code!r}, not an exit status 0-255", code=1)
    return code


def _run_options(args: argparse.Namespace) -> dict[str, Any]:
    fields = [name for name in run_flags() if name not in _OWN_SYNTAX]
    options = {name: getattr(args, name) for name in fields if getattr(args, name) is not None}
    if args.workload_options:
        options["workload_options"] = dict(args.workload_options)
    if args.accelerator_options:
        options["accelerator_options"] = dict(args.accelerator_options)
    if args.loadgen:
        options["loadgen"] = dict(args.loadgen)
    return options


# `core run`'s arguments that are no RunConfig field, by the name core.run's errors give them.
_OTHER_RUN_FLAGS = {"database": "--database", "timeout_seconds": "--timeout-seconds"}


def _flag_of(field: str) -> str | None:
    """The ``core run`` flag that sets ``field``: ``--batch-size``, ``-o layers`` (None: no flag)."""
    for prefix, short in (("workload_options.", "-o "), ("accelerator_options.", "-a "), ("loadgen.", "-l ")):
        if field.startswith(prefix):
            return short + field[len(prefix) :]
    return run_flags().get(field) or _OTHER_RUN_FLAGS.get(field)


def _describe_config_error(error: ConfigError) -> str:
    errors = getattr(error, "errors", [error])
    lines = []
    for e in errors:
        # A rule over several fields names each one's flag (getattr: a plugin's own subclass may lack fields).
        flags = ", ".join(flag for flag in map(_flag_of, getattr(e, "fields", (e.field,))) if flag)
        lines.append(f"invalid {e.field}{f' ({flags})' if flags else ''} = {e.value!r}: {e.allowed}")
    return "\n".join(lines)


def _format_seconds(value: float | None, scale: float = 1.0, unit: str = "s") -> str:
    return "n/a" if value is None else f"{value * scale:.4g} {unit}"


def _joules_and_watt_hours(joules: float) -> str:
    return f"{joules:.4g} J = {joules / JOULES_PER_WATT_HOUR:.4g} Wh"


def _meter_lines(result: Any) -> list[str]:
    """Each meter of a run with node meters: its role, what it includes, its figure, and whether the
    total counts it (a node meter that includes the devices holds the device meter's figure)."""
    from core.report.document import one_line

    items = result.energy.meters if result.energy is not None else []
    lines = []
    for item in items:
        figure = (
            _joules_and_watt_hours(item.energy_joules)
            if item.energy_joules is not None
            else f"unavailable: {one_line(item.unavailable_reason or 'it read nothing')}"
        )
        counted = "" if item.counted else ", inside a node meter's figure (not added)"
        label = f"{item.role} meter"
        covers = one_line(", ".join(item.includes))
        lines.append(f"  {label:<15} {one_line(item.meter)} ({covers}): {figure}{counted}")
    return lines


def _component_lines(result: Any) -> list[str]:
    """The meter's figure per device or zone, where it has more than one."""
    components = result.energy.components_joules if result.energy is not None else {}
    if len(components) < 2:
        return []
    return [
        "  by component    "
        + ", ".join(f"{name} {joules / JOULES_PER_WATT_HOUR:.4g} Wh" for name, joules in components.items())
    ]


def _loadgen_lines(result: Any) -> list[str]:
    """LoadGen's verdict and its own figures, under core's (which count samples over the same window)."""
    figures = result.loadgen
    if figures is None or result.throughput_per_second is None:
        return []
    unit = result.sample_unit or "samples"
    verdict = "VALID" if figures.valid else f"INVALID: {figures.invalid_reason or 'see its summary'}"
    own = [f"{figures.query_count:,} queries"] if figures.query_count is not None else []
    if figures.samples_per_second is not None:
        own.append(f"{figures.samples_per_second:.6g} {unit}/s by its count")
    if figures.early_stopping_latency_seconds is not None:
        share = figures.settings.get("single_stream_target_latency_percentile", 0.9)
        own.append(
            f"early-stopping p{share * 100:g} {_format_seconds(figures.early_stopping_latency_seconds, 1e3, 'ms')}"
        )
    return [f"  loadgen         {figures.scenario}, {verdict}" + (f" ({', '.join(own)})" if own else "")]


def _node_lines(result: Any) -> list[str]:
    if not result.nodes:
        return []
    each = ", ".join(
        f"node {node.node_rank} ({node.hostname}) "
        + (f"{node.energy_joules:.4g} J" if node.energy_joules is not None else "no energy")
        for node in result.nodes
    )
    return [f"  nodes           {len(result.nodes)}: {each}"]


def _warning_lines(result: Any) -> list[str]:
    """Every warning the result holds (recompilation, meter cross-check, deprecations), one line each."""
    from core.report.document import one_line

    return [f"  warning         {one_line(warning)}" for warning in result.warnings]


# The lines of `core run`'s text that show the result's structure rather than declared figures.
_STRUCTURAL_LINES: dict[str, Callable[[Any], list[str]]] = {
    "loadgen": _loadgen_lines,
    "components": _component_lines,
    "meters": _meter_lines,
    "nodes": _node_lines,
    "error": lambda result: _status_lines(result.status),
    "warnings": _warning_lines,
}


def _text_context(result: Any) -> dict[str, Any]:
    """What the declared texts of `core run`'s figures may name besides their value."""
    unit = result.sample_unit or "samples"
    epoch = result.config.epoch
    method = result.energy.method if result.energy is not None else None
    return {
        "unit": unit,
        "sample": unit.removesuffix("s") or "sample",
        "passes": "batches" if result.config.mode == "inference" else "updates",
        "devices": len(result.devices),
        "method": f" ({method})" if method else "",
        "epoch": epoch.describe()
        if epoch.kind != "dataset" or result.samples_per_epoch is None
        else f"dataset ({result.samples_per_epoch:,} samples)",
    }


def _figure_parts(result: Any, line: str, context: dict[str, Any]) -> tuple[list[str], list[str], bool]:
    """The main parts and the asides of one declared line, and whether any figure had a value."""
    from core.storage.metrics import printed_on

    main: list[str] = []
    asides: list[str] = []
    measured = False
    for metric, part in printed_on(line):
        if part.shown is not None and not part.shown(result):
            continue
        value = metric.value(result)
        if value is None:
            if part.missing is None:
                continue
            text = part.missing
        else:
            measured = measured or not part.aside
            shown = value * part.scale if part.scale != 1.0 else value
            text = part.text.format(value=shown, **context)
        parts = asides if part.aside else main
        if part.attach and parts:
            parts[-1] += " " + text
        else:
            parts.append(text)
    return main, asides, measured


def _declared_line(result: Any, line: Any, context: dict[str, Any]) -> list[str]:
    if line.structural:
        return _STRUCTURAL_LINES[line.key](result)
    if line.shown is not None and not line.shown(result):
        return []
    main, asides, measured = _figure_parts(result, line.key, context)
    if not main or not (measured or line.always):
        return []
    label = line.label(result) if callable(line.label) else line.label
    text = f"  {label:<15} " + ", ".join(main) + (f" ({', '.join(asides)})" if asides else "")
    return [text] + ([f"{'':<18}{line.note}"] if line.note else [])


def format_result(result: Any) -> str:
    """`core run`'s text: a header, the batch arithmetic, then each figure as core.storage.metrics
    declares it (PRINTED_LINES and each metric's Printed), line by line."""
    from core.storage.metrics import PRINTED_LINES

    c = result.config
    inference = c.mode == "inference"
    lines = [
        f"{result.workload} on {result.accelerator} ({result.framework}, {c.precision.value}"
        + (", inference" if inference else "")
        + f"): {result.status.state.value}",
        f"  samples/query   1; warm-up batches of {c.micro_batch_size}"
        if c.scenario in ("single-stream", "server")
        else f"  samples/step    {result.samples_per_update} (micro {c.micro_batch_size} x replicas {c.replicas})"
        if inference
        else f"  samples/update  {result.samples_per_update} (micro {c.micro_batch_size} x accumulation "
        f"{c.gradient_accumulation} x replicas {c.replicas})",
    ]
    context = _text_context(result)
    for line in PRINTED_LINES:
        lines += _declared_line(result, line, context)
    return "\n".join(lines)


def _status_lines(status: Any) -> list[str]:
    """What went wrong, where: the parts the status knows (a killed process may name no phase)."""
    if status.ok:
        return []
    where = f"in {status.phase}: " if status.phase else ""
    from core.report.document import clean_text

    what = ": ".join(clean_text(part) for part in (status.error_type, status.message) if part) or status.state.value
    lines = [f"  error           {where}{what}"]
    if status.location:
        lines.append(f"  raised at       {status.location}")
    return lines


_MACHINE_HELP = (
    "with --dry-run: validate for this machine instead of this host: a shipped profile (see `core machines`) "
    "or a profile file (.toml)"
)


def _load_machine_argument(args: argparse.Namespace, relative_to: Path | None = None) -> Any:
    """The --machine profile (None without one); ConfigError when it is unknown or used without --dry-run.

    :param relative_to: where a relative profile path is read from (a sweep file's folder, for the
        file's own ``machine`` key); None: the working directory, as for any path on the command line.
    """
    if args.machine is None:
        return None
    if not args.dry_run:
        raise ConfigError("--machine", args.machine, "plans for a machine not at hand: use it with --dry-run")
    from core.machines import load_machine

    return load_machine(args.machine, relative_to=relative_to)


def _command_run_dry(args: argparse.Namespace, options: dict[str, Any]) -> int:
    from core.contract.manager import PluginFault, get_plugin_manager
    from core.running.planning import plan_run

    try:
        machine = _load_machine_argument(args)
        plan = plan_run(get_plugin_manager(), args.workload, args.accelerator, options, machine=machine)
        _check_database_for_dry_run(args.database)
    except ConfigError as error:
        return _error(_describe_config_error(error))
    except PluginFault as fault:
        return _error(str(fault))
    from core.running.distributed import SINGLE_PROCESS

    manager = get_plugin_manager()
    context = plan.context(SINGLE_PROCESS)
    try:
        with manager.plugin_code(plan.accelerator, f"{type(plan.accelerator).__name__}.placement_summary()"):
            extra_placement = plan.accelerator.placement_summary(context)
    except PluginFault as fault:
        return _error(str(fault))
    described = describe_plan(plan, extra_placement)
    if args.json:
        print(json.dumps(described, indent=2))
    else:
        for label, text in _plan_lines(described):
            print(f"  {label:<15} {text}")
    return 0


def _check_database_for_dry_run(database: Path | None) -> None:
    """A dry run writes nothing: an existing --database is opened read-only to check it is one."""
    from core.storage.single_runs import database_path
    from core.storage.store import ResultStore, StoreError

    if database is None:
        return
    path = database_path(database)
    if not path.exists() and not path.is_symlink():
        return
    try:
        ResultStore(path, create=False).close()
    except StoreError as error:
        raise ConfigError("database", str(path), str(error)) from None


def describe_plan(plan: Any, extra_placement: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a dry run of one run shows, as data (``--json``): where it was planned for, its
    placement, a memory estimate where the model's size is known, and what it warns of."""
    from core.running.planning import memory_estimate

    config = plan.config
    machine = plan.machine
    estimate = memory_estimate(plan.workload, plan.workload_options, config)
    memory: dict[str, Any] | None = None
    if estimate is not None:
        memory = {
            "kept": estimate["kept"],
            "model_state_gib": round(estimate["weights_and_gradients_bytes"] / _GIB, 3),
            "optimizer_state_gib": round(estimate["optimizer_state_bytes"] / _GIB, 3),
            "optimizer_state_assumed": estimate["optimizer_state_assumed"],
            "activations": "not counted",
            "device_memory_gib": machine.memory_gib_per_device if machine is not None else None,
        }
    return {
        "planned_for": machine.name if machine is not None else None,
        "workload": config.workload,
        "accelerator": config.accelerator,
        "framework": config.framework.value,
        "mode": config.mode,
        "placement": {
            "replicas": config.replicas,
            "devices_per_replica": config.devices_per_replica,
            "micro_batch_size": config.micro_batch_size,
            "gradient_accumulation": config.gradient_accumulation,
            **(extra_placement or {}),
        },
        "precision": config.precision.value,
        "launcher": plan.launcher.name if plan.launcher is not None else None,
        "parameters": estimate["parameters"] if estimate is not None else None,
        "memory_per_device": memory,
        "power_meter": plan.meter_factory.name if plan.meter_factory is not None else None,
        "energy_unavailable_reason": None if plan.meter_factory is not None else plan.meter_unavailable_reason,
        "node_meters": [factory.name for factory in getattr(plan, "node_meter_factories", ())],
        "warnings": list(plan.warnings),
        "config": config.model_dump(mode="json"),
    }


def _plan_lines(described: dict[str, Any]) -> list[tuple[str, str]]:
    """The text view of ``describe_plan``: one labelled line per item, warnings last."""
    placement = dict(described["placement"])
    replicas, per_replica = placement.pop("replicas"), placement.pop("devices_per_replica")
    text = (
        f"{_count(replicas, 'replica')} x {_count(per_replica, 'device')}, micro-batch "
        f"{placement.pop('micro_batch_size')}, gradient accumulation {placement.pop('gradient_accumulation')}"
    )
    notes = placement.pop("placement_notes", None) or []
    if placement:
        text += "; " + ", ".join(f"{key.replace('_', ' ')} {value}" for key, value in placement.items())
    parameters = described["parameters"]
    lines = [
        ("planned for", described["planned_for"] or "this host"),
        ("workload", described["workload"]),
        ("accelerator", f"{described['accelerator']} ({described['framework']})"),
        ("placement", text),
        *[("", note) for note in notes],
        ("precision", described["precision"]),
        ("launcher", described["launcher"] or "none (one process)"),
        ("parameters", f"{parameters:,}" if parameters else "unknown"),
    ]
    memory = described["memory_per_device"]
    if memory is not None:
        state = "an optimizer state like Adam's, assumed" if memory["optimizer_state_assumed"] else "optimizer state"
        of = f" of {memory['device_memory_gib']:.1f} GiB" if memory["device_memory_gib"] is not None else ""
        kept = f"{memory['model_state_gib']:.2f} GiB {memory['kept']}"
        if memory["optimizer_state_gib"]:
            kept += f" + {memory['optimizer_state_gib']:.2f} GiB {state}"
        lines.append(("memory", f"{kept} per device{of} (activations not counted)"))
    lines.append(("energy", described["power_meter"] or described["energy_unavailable_reason"]))
    if described["node_meters"]:
        lines.append(("node meters", ", ".join(described["node_meters"])))
    lines.extend(("warning", warning) for warning in described["warnings"])
    return lines


def _command_run(args: argparse.Namespace) -> int:
    from core.api import run
    from core.contract.manager import PluginFault
    from core.running.progress import ProgressLine, RunProgress
    from core.storage.files import OutputError, check_writable
    from core.storage.single_runs import UnrecordedRunError
    from core.storage.store import StoreError

    options = _run_options(args)
    if args.dry_run or args.machine is not None:
        return _command_run_dry(args, options)
    if args.output is not None:
        # Before the run: a bad path must not cost what the run measures.
        try:
            check_writable(args.output, "--output")
        except OutputError as error:
            return _error(str(error))
    line = ProgressLine()
    progress = None
    if line.enabled:
        progress = RunProgress(
            line, f"{args.workload} on {args.accelerator}", options.get("steps", 20), options.get("warmup_steps", 3)
        )
        progress.start()
    unrecorded: UnrecordedRunError | None = None
    try:
        result = run(
            args.workload,
            args.accelerator,
            on_progress=progress,
            timeout_seconds=args.timeout_seconds,
            database=args.database,
            **options,
        )
    except UnrecordedRunError as error:  # measured, but the database refused it: print it all the same
        unrecorded, result = error, error.result
    except ConfigError as error:
        line.clear()
        return _error(_describe_config_error(error))
    except PluginFault as fault:
        line.clear()
        if args.debug:
            print(fault.traceback_text, file=sys.stderr, end="")
        return _error(f"{fault}{'' if args.debug else ' (core --debug shows the traceback)'}")
    except StoreError as error:  # before the run: another sweep or run holds --database
        line.clear()
        return _error(str(error))
    except KeyboardInterrupt:
        line.clear()
        print(f"core: run of {args.workload} on {args.accelerator} interrupted; nothing was recorded", file=sys.stderr)
        return 130
    finally:
        line.clear()
    return _show_run_result(args, result, unrecorded)


def _show_run_result(args: argparse.Namespace, result: Any, unrecorded: Exception | None) -> int:
    """Print the result, write --output, and say what could not be kept where it was asked."""
    from core.storage.files import OutputError, write_atomically

    text = result.to_json()
    # The result first: whatever happens to the files, what was measured reaches the terminal.
    print(text if args.json else format_result(result))
    if args.debug and result.status.traceback:
        print(result.status.traceback, file=sys.stderr, end="")
    problems = []
    written = False
    if args.output is not None:
        try:
            write_atomically(args.output, text + "\n", "--output")
            written = True
        except OutputError as error:
            problems.append(str(error))
    if unrecorded is not None:
        problems.append(f"--database {args.database}: {unrecorded}")
    if problems:
        kept = (
            f"the result is in {args.output}"
            if written
            else "the result is printed above" + ("" if args.json else " (--json prints it whole)")
        )
        return _error(f"{'; '.join(problems)}; {kept}", code=1)
    return 0 if result.status.ok else 1


def plugin_report() -> list[dict[str, Any]]:
    """Everything ``core plugins`` shows, as plain data."""
    from core.contract.manager import get_plugin_manager

    manager = get_plugin_manager()
    rows = []
    for record in manager.plugins.values():
        provides: dict[str, list[dict[str, Any]]] = {}
        for kind, names in record.registered.items():
            entries = []
            for name in names:
                item = getattr(manager, kind)[name].item
                entry: dict[str, Any] = {"name": name}
                if hasattr(item, "availability"):
                    availability = manager.availability(item)
                    entry.update(available=availability.available, reason=availability.reason)
                if kind == "power_meters":
                    entry["reads"] = [name for name in manager.accelerators if manager.meter_reads(item, name)]
                entries.append(entry)
            provides[kind] = entries
        rows.append(
            {
                "name": record.name,
                "version": record.version,
                "distribution": record.distribution,
                "module": record.module,
                "builtin": record.builtin,
                "state": record.state.value,
                "error": record.error,
                "warnings": record.warnings,
                "traceback": record.traceback,
                "hooks": record.hooks,
                "registers": provides,
                "faults": [
                    {"call": fault.call, "error": str(fault), "traceback": fault.traceback_text}
                    for fault in record.faults
                ],
            }
        )
    return rows


def _command_plugins(args: argparse.Namespace) -> int:
    rows = plugin_report()
    if args.json:
        if not args.verbose:
            for row in rows:
                row.pop("traceback")
                for fault in row["faults"]:
                    fault.pop("traceback")
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        _print_plugin(row, args.verbose)
    if not args.verbose and any(row["traceback"] or row["faults"] for row in rows):
        print("(core plugins --verbose shows the tracebacks)")
    return 0


def _print_plugin(row: dict[str, Any], verbose: bool) -> None:
    version = f" {row['version']}" if row["version"] else ""
    origin = ", built-in" if row["builtin"] else ""
    print(f"{row['name']}{version} [{row['state']}] ({row['module']}{origin})")
    if row["error"]:
        print(f"  error: {row['error']}")
        if verbose and row["traceback"]:
            print(_indent(row["traceback"], "    "))
    for kind, entries in row["registers"].items():
        for entry in entries:
            state = ""
            if "available" in entry:
                state = ": available" if entry["available"] else f": unavailable: {entry['reason']}"
            print(f"  {kind[:-1].replace('_', ' ')} {entry['name']}{state}")
    for warning in row["warnings"]:
        print(f"  warning: {warning}")
    if row["hooks"]:
        print(f"  hooks: {', '.join(row['hooks'])}")
    if verbose:
        for fault in row["faults"]:
            print(f"  fault: {fault['error']}")
            print(_indent(fault["traceback"], "    "))


def _indent(text: str, prefix: str) -> str:
    return "\n".join(prefix + line for line in text.rstrip().splitlines())


def _command_devices(args: argparse.Namespace) -> int:
    from core.contract.manager import PluginFault, get_plugin_manager

    manager = get_plugin_manager()
    listing: dict[str, Any] = {}
    for name, registered in manager.accelerators.items():
        availability = manager.availability(registered.item)
        if not availability.available:
            listing[name] = {"unavailable": availability.reason}
            continue
        try:
            with manager.plugin_code(registered.item, f"{type(registered.item).__name__}.devices()"):
                listing[name] = [device.model_dump() for device in registered.item.devices()]
        except PluginFault as fault:
            listing[name] = {"unavailable": str(fault)}
    if args.json:
        print(json.dumps(listing, indent=2))
        return 0
    for name, devices in listing.items():
        if isinstance(devices, dict):
            print(f"{name}: unavailable: {devices['unavailable']}")
            continue
        for device in devices:
            memory = f", {device['memory_bytes'] / 2**30:.1f} GiB" if device.get("memory_bytes") else ""
            print(f"{name}:{device['index']} {device['name']}{memory}")
    return 0


def workload_report() -> list[dict[str, Any]]:
    from core.contract.manager import PluginFault, get_plugin_manager

    manager = get_plugin_manager()
    rows = []
    for name, registered in manager.workloads.items():
        workload = registered.item
        try:
            with manager.plugin_code(workload, f"workload {name!r}"):
                rows.append(_workload_row(name, registered.plugin, workload))
        except PluginFault as fault:
            rows.append({"name": name, "plugin": registered.plugin, "error": str(fault)})
    return rows


def _workload_row(name: str, plugin: str, workload: Any) -> dict[str, Any]:
    defaults = workload.options_model()
    details = workload.details(defaults)
    # Zoo workloads name one source per framework; others at most one for all.
    sources = {
        framework: implementation.get("source")
        for framework, implementation in details.get("implementations", {}).items()
    }
    return {
        "name": name,
        "plugin": plugin,
        "description": workload.description,
        "frameworks": [f.value for f in workload.frameworks],
        "task": workload.task,
        "sample_unit": workload.sample_unit,
        "default_micro_batch_size": workload.default_micro_batch_size,
        "parameter_count": workload.parameter_count(defaults),
        "flops_per_sample": workload.flops_per_sample(defaults),
        "samples_per_epoch": workload.samples_per_epoch(defaults),
        "sources": sources or {f.value: details.get("source") for f in workload.frameworks},
        "options": defaults.model_dump(),
    }


def _command_workloads(args: argparse.Namespace) -> int:
    rows = workload_report()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        if "error" in row:
            print(f"{row['name']}: unavailable: {row['error']}")
            continue
        params = f", {row['parameter_count']:,} parameters" if row["parameter_count"] else ""
        print(
            f"{row['name']} ({', '.join(row['frameworks'])}; {row['task']}, {row['sample_unit']}{params}): "
            f"{row['description']}"
        )
    return 0


def _error(message: str, code: int = 2) -> int:
    print(f"core: error: {message}", file=sys.stderr)
    return code


class _SweepDisplay(SweepObserver):
    """The sweep's progress line on stderr (terminals only) and one line per finished run on stdout:
    a sweep observer (core.sweep.SweepObserver)."""

    def __init__(self) -> None:
        from core.running.progress import ProgressLine

        self.line = ProgressLine()
        self._position = ""
        self._cells = 0

    def started(self, plan: Any, runs_total: int, runs_finished: int, runs_recorded: int | None = None) -> None:
        self._cells = len(plan.valid_cells)
        beyond = max(0, (runs_recorded or 0) - runs_finished)
        if runs_finished or beyond:
            text = f"resuming sweep {plan.spec.name}: {runs_finished} of {_count(runs_total, 'run')} already recorded"
            if beyond:
                text += (
                    f"; {beyond} more, beyond the {_count(plan.spec.repeats, 'repeat')} per cell asked now, stay in "
                    "the database and count in its summaries"
                )
            self.line.print(text)

    def run_started(self, cell: Any, repeat: int, runs_done: int, runs_total: int, seconds_left: float | None) -> None:
        from core.running.progress import format_duration

        self._position = (
            f"[{runs_done + 1}/{runs_total}] cell {cell.index + 1}/{self._cells} {cell.label} repeat {repeat + 1}"
        )
        self.line.show(f"{self._position} | ~{format_duration(seconds_left)} left")

    def waiting(self, cell: Any, repeat: int, elapsed_seconds: float, seconds_left: float | None) -> None:
        from core.running.progress import format_duration

        self.line.show(
            f"{self._position} | {format_duration(elapsed_seconds)} in this run | ~{format_duration(seconds_left)} left"
        )

    def run_finished(self, cell: Any, repeat: int, result: Any, process_seconds: float) -> None:
        from core.running.processes import summary_line

        if result.status.ok:
            what = f"ok, {result.throughput_per_second:.6g} {result.sample_unit or 'samples'}/s"
        else:
            first_line = summary_line(result.status.message or "")
            where = f" in {result.status.phase}" if result.status.phase else ""
            what = f"{result.status.state.value}{where}" + (f": {first_line[:200]}" if first_line else "")
        took = f" ({process_seconds:.1f} s)" if process_seconds > 0 else ""  # 0: unknown (a job Slurm ended)
        self.line.print(f"{cell.label} repeat {repeat + 1}: {what}{took}")


def _print_plan(plan: Any, repeats: int, finished: dict[tuple[str, int], str]) -> None:
    width = len(str(len(plan.cells)))
    for cell in plan.cells:
        done = sum(1 for repeat in range(repeats) if (cell.key, repeat) in finished)
        beyond = sum(1 for key, repeat in finished if key == cell.key and repeat >= repeats)
        state = (
            f"invalid: {cell.invalid_reason}"
            if not cell.valid
            else (f"{done}/{repeats} repeats recorded" if done else "to run")
        )
        if beyond and cell.valid:
            state += f", {beyond} more recorded beyond {repeats}"
        print(f"{cell.index + 1:>{width}}  {cell.label}  [{state}]")
        for warning in cell.warnings:
            print(f"{'':>{width}}  warning: {warning}")
    valid = len(plan.valid_cells)
    print(
        f"{_count(len(plan.cells), 'cell')} ({valid} valid, {len(plan.invalid_cells)} invalid) x "
        f"{_count(repeats, 'repeat')} = {_count(valid * repeats, 'run')}; "
        f"timeout {plan.spec.timeout_seconds:g} s per run"
    )


#: (field of the [slurm] table, type, help) for each ``--slurm-*`` flag
_SLURM_FLAGS: tuple[tuple[str, Callable[[str], Any], str], ...] = (
    ("partition", str, "sbatch --partition"),
    ("account", str, "sbatch --account"),
    ("time_limit_minutes", int, "sbatch --time of each job (default: the repeat's time limit, in minutes)"),
    ("gpus_per_node", int, "sbatch --gpus-per-node"),
    ("cpus_per_task", int, "sbatch --cpus-per-task"),
    ("memory_megabytes", int, "sbatch --mem, in megabytes"),
    ("poll_seconds", float, "how often the sweep asks Slurm about its jobs (default 10)"),
    ("jobs_directory", str, "the jobs' folders, on a filesystem the nodes share (default: <database>.jobs)"),
)


def _sweep_overrides(args: argparse.Namespace, spec: Any) -> dict[str, Any]:
    """What the flags change in the sweep file: ``--repeats``, ``--name``..., ``--slurm-*`` as [slurm] fields."""
    overrides: dict[str, Any] = {
        key: value
        for key, value in (("repeats", args.repeats), ("timeout_seconds", args.timeout_seconds), ("name", args.name))
        if value is not None
    }
    fields = [flag for flag, _, _ in _SLURM_FLAGS] + ["extra_options"]
    slurm = {name: getattr(args, f"slurm_{name}") for name in fields if getattr(args, f"slurm_{name}") is not None}
    if slurm:
        overrides["slurm"] = {**(spec.slurm.model_dump() if spec.slurm is not None else {}), **slurm}
    return overrides


def _sweep_dry_run(args: argparse.Namespace, plan: Any, machine: Any, database: Path) -> int:
    """``core sweep --dry-run``: the cells, validated, and what the database already holds; what a
    sweep would refuse before running (its jobs directory, a --resume of an unknown sweep) too."""
    from core.storage.store import ResultStore, StoreError
    from core.sweep import SweepError
    from core.sweep.run import unknown_sweep_message

    spec = plan.spec
    finished: dict[tuple[str, int], str] = {}
    try:
        if args.executor == "slurm":
            from core.sweep.cluster import check_jobs_directory
            from core.sweep.slurm_settings import SlurmSettings

            check_jobs_directory(database, spec.slurm or SlurmSettings(), spec.name)
        if args.resume and not database.exists():
            raise SweepError(f"--resume: no results database at {database}, so no sweep {spec.name!r} to resume")
        if database.exists():
            with ResultStore(database, create=False) as store:  # read only: a dry run writes nothing
                finished = store.finished(spec.name)
                if args.resume and not finished and store.sweep(spec.name) is None:
                    raise SweepError(unknown_sweep_message(store, spec.name))
    except (StoreError, SweepError) as error:
        return _error(str(error))
    target = f", planned for machine {machine.name!r}" if machine is not None else ""
    print(f"sweep {spec.name} ({args.file}), database {database}{target}")
    _print_plan(plan, spec.repeats, finished)
    if plan.invalid_cells and not args.skip_invalid:
        return _error(
            f"{_count(len(plan.invalid_cells), 'invalid cell')}: fix the grid, exclude them, or pass --skip-invalid"
        )
    return 0


#: ``core sweep`` options a resume command gives as they were given (dest -> flag); with ``file``,
#: ``--database``, ``--executor``, the ``--slurm-*`` flags and those in _NOT_RESUMED, every option
#: of the command (tests/test_sweep_resume.py checks that none is forgotten)
_RESUMED_FLAGS = {
    "toy": "--toy",
    "retry_failed": "--retry-failed",
    "skip_invalid": "--skip-invalid",
    "name": "--name",
    "repeats": "--repeats",
    "timeout_seconds": "--timeout-seconds",
    "workers": "--workers",
}
#: options a resume command leaves out: it resumes (--resume), runs (not --dry-run, so no --machine)
_NOT_RESUMED = frozenset({"command", "debug", "dry_run", "machine", "resume"})


def _core_program() -> list[str]:
    """How to start this ``core`` again from a shell: ``core`` where that is the one on PATH, else
    this script's path, else this interpreter with ``-m core.cli`` (core run from Python)."""
    import shutil

    script = sys.argv[0] if sys.argv else ""
    if Path(script).name == "core":
        on_path = shutil.which("core")
        try:
            if on_path is not None and os.path.samefile(on_path, script):
                return ["core"]
        except OSError:
            pass
        if os.path.exists(script):
            return [os.path.abspath(script)]
    return [sys.executable, "-m", "core.cli"]


def resume_command(args: argparse.Namespace, database: Path, spec: Any, *, resume: bool = True) -> str:
    """The shell command that resumes this sweep, word for word: the same file, database, executor
    and every option that shapes the sweep, paths made absolute, each word quoted for a POSIX shell.
    ``resume=False``: the command that starts it (a sweep stopped before it was recorded)."""
    import shlex

    words = [*_core_program(), "sweep", os.path.abspath(args.file), *(["--resume"] if resume else [])]
    words += ["--database", os.path.abspath(database), "--executor", args.executor]
    for dest, flag in _RESUMED_FLAGS.items():
        value = getattr(args, dest)
        if value is True:
            words.append(flag)
        elif value not in (None, False):
            words.append(f"{flag}={value}")
    for name, _, _ in _SLURM_FLAGS:
        value = getattr(args, f"slurm_{name}")
        if name == "jobs_directory" and args.executor == "slurm":
            from core.sweep.cluster import jobs_directory
            from core.sweep.slurm_settings import SlurmSettings

            given = value or (spec.slurm.jobs_directory if spec.slurm is not None else None)
            value = jobs_directory(database, SlurmSettings(jobs_directory=given))  # the one this sweep used
        if value is not None:
            words.append(f"--slurm-{name.replace('_', '-')}={value}")
    words += [f"--slurm-option={option}" for option in args.slurm_extra_options or ()]
    return shlex.join(words)


def _command_sweep(args: argparse.Namespace) -> int:
    import signal

    from core.storage.store import StoreError, default_database
    from core.sweep import SweepError, UnsavedResultError, load_sweep, make_sweep_spec, plan_sweep, run_sweep
    from core.sweep.run import sweep_in_database

    try:
        spec = load_sweep(args.file)
        overrides = _sweep_overrides(args, spec)
        if overrides:
            spec = make_sweep_spec({**spec.model_dump(), **overrides})
        machine_from_file = args.machine is None and args.dry_run and not args.toy and spec.machine is not None
        if machine_from_file:
            args.machine = spec.machine
        if args.toy and args.machine is not None:
            raise ConfigError("--machine", args.machine, "a toy sweep runs on this CPU: leave --machine out")
        machine = _load_machine_argument(args, relative_to=Path(args.file).parent if machine_from_file else None)
        plan = plan_sweep(spec, source=str(args.file), machine=machine, toy=args.toy, executor=args.executor)
        spec = plan.spec
    except ConfigError as error:
        return _error(f"{args.file}: {_describe_config_error(error)}")
    except SweepError as error:
        return _error(str(error))
    database = args.database or default_database()
    if args.dry_run:
        return _sweep_dry_run(args, plan, machine, database)

    # SIGTERM ends the sweep the way Ctrl-C does: the running cell is stopped, nothing half-done is stored.
    previous_handler = signal.signal(signal.SIGTERM, signal.default_int_handler)
    display = _SweepDisplay()
    try:
        outcome = run_sweep(
            plan,
            database=database,
            resume=args.resume,
            retry_failed=args.retry_failed,
            skip_invalid=args.skip_invalid,
            observer=display,
            executor=args.executor,
            workers=args.workers,
        )
    except UnsavedResultError as error:  # mid-sweep, the database refused a result: keep what was measured
        display.line.clear()
        if error.saved_to is None:
            from core.storage.files import json_text

            print(json_text(error.document), flush=True)  # JSON any reader takes: null, never NaN
        return _error(f"{error}. Once the database can be written: {resume_command(args, database, spec)}", code=1)
    except (SweepError, StoreError) as error:  # before anything ran: the grid, the database, its lock
        return _error(str(error))
    except KeyboardInterrupt:
        display.line.clear()
        if not sweep_in_database(database, spec.name):  # stopped before it was recorded: nothing to resume
            command = resume_command(args, database, spec, resume=False)
            print(
                f"core: sweep {spec.name} interrupted before it was recorded in {database}; start it with: {command}",
                file=sys.stderr,
            )
            return 130
        print(
            f"core: sweep {spec.name} interrupted; finished runs are in {database}. "
            f"Continue with: {resume_command(args, database, spec)}",
            file=sys.stderr,
        )
        return 130
    finally:
        display.line.clear()
        signal.signal(signal.SIGTERM, previous_handler)
    if outcome.runs_recovered:
        print(
            f"recorded {outcome.runs_recovered} result(s) that an earlier run of this sweep could not write to "
            f"{outcome.database}"
        )
    print()
    print(format_cells(outcome.cells))
    failed = sum(1 for cell in outcome.cells if cell.status != "ok")
    print(
        f"sweep {outcome.name}: {_count(outcome.runs_done, 'run')} now, {outcome.runs_already_finished} before; "
        f"{_count(len(outcome.cells), 'cell')}, {failed} failed, {sum(c.flagged for c in outcome.cells)} flagged; "
        f"results in {outcome.database}"
    )
    return 0


def _count(number: int, noun: str) -> str:
    """``1 run``, ``2 runs``: a count with its noun in the right number."""
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def _common_unit(cells: Sequence[Any]) -> str:
    """The cells' sample unit ('images') where they share one, else 'samples'."""
    units = {getattr(cell, "sample_unit", "samples") for cell in cells}
    return units.pop() if len(units) == 1 else "samples"


def format_cells(cells: Sequence[Any], sweep_column: bool | None = None) -> str:
    """A plain-text table of cell summaries: state, repeats, and the figures core.storage.metrics
    declares for it (RESULTS: median throughput and its spread, samples per Wh, energy...).

    ``sweep_column``: show each cell's sweep first; by default only when the cells come from
    more than one sweep ("-" is a single run's). Text from the database is shown on one line,
    control characters escaped.
    """
    from core.report import format_percent, one_line
    from core.report.tables import metric_header, metric_value
    from core.storage.metrics import RESULTS, Summary, reported

    if sweep_column is None:
        sweep_column = len({cell.sweep for cell in cells}) > 1
    unit = _common_unit(cells)
    figures = reported(RESULTS)
    header: list[str] = ["sweep"] * sweep_column + ["cell", "status", "ok/runs"]
    for metric in figures:
        header.append(metric_header(metric, unit, short=True))
        if metric.summary is Summary.median_spread:
            header.append("spread")
    rows = [header]
    for cell in cells:
        row = ["-" if cell.sweep is None else one_line(cell.sweep)] * sweep_column
        row += [
            one_line(cell.label),
            cell.status + (" (flagged)" if cell.flagged else ""),
            f"{cell.repeats_ok}/{cell.repeats_recorded}",
        ]
        for metric in figures:
            row.append(metric_value(cell, metric).text)
            if metric.summary is Summary.median_spread:
                row.append(format_percent(cell.spread_of(metric.name)))
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(value.ljust(width) for value, width in zip(row, widths)).rstrip() for row in rows)


def _command_report(args: argparse.Namespace) -> int:
    from core.report import ComparisonRequest, ReportError, ReportWriteError, TrainingPlan, write_report
    from core.storage.files import OutputError
    from core.storage.store import StoreError, default_database

    databases = ([args.database] if args.database else []) + list(args.databases)
    database = databases or [default_database()]
    if args.epoch_definition is not None and args.epochs is None:
        return _error("--epoch-definition needs --epochs N")
    try:
        training = None if args.epochs is None else TrainingPlan(args.epochs, args.epoch_definition)
    except ValueError as error:
        return _error(f"--epochs {args.epochs} --epoch-definition {args.epoch_definition}: {error}")
    try:
        comparison = ComparisonRequest(tuple(args.compare_ignore), args.baseline)
        files = write_report(database, args.output, args.sweeps, training, comparison)
    except ReportWriteError as error:  # after the work: the report was built, the disk refused it
        return _error(str(error), code=1)
    except (ReportError, StoreError, OutputError) as error:  # before the work, or a damaged database: nothing written
        return _error(str(error))
    for warning in files.warnings:
        print(f"core: warning: {warning}", file=sys.stderr)
    print(f"wrote {files.markdown}, {files.html} and {len(files.plots)} plots in {files.markdown.parent / 'plots'}")
    return 0


def _status_filter(status: str | None) -> None:
    """An unknown --status is an error listing the states a run can end in."""
    from core.errors import CoreError
    from core.storage.results import RunState

    allowed = [state.value for state in RunState]
    if status is not None and status not in allowed:
        raise CoreError(f"unknown --status {status!r}; a run's status is one of: {', '.join(allowed)}")


def _sweep_filter(sweep: str | None, store: Any) -> None:
    """An unknown --sweep is an error listing the sweeps in the database."""
    from core.errors import CoreError
    from core.report import list_names

    if sweep is not None and not store.matching_sweeps(sweep):  # "é" composed or not, as --name
        raise CoreError(f"no sweep named {sweep!r} in {store.path}; it has: {list_names(store.sweep_names())}")


def _results_content(args: argparse.Namespace, store: Any, filters: dict[str, str]) -> tuple[str | bytes, int]:
    """The export, whole, in memory: (text or Parquet bytes, runs in it)."""
    import io
    import tempfile

    from core.storage.summary import summarise

    if args.format == "summary":
        cells = summarise(store.runs(**filters))
        return format_cells(cells, sweep_column=True) + "\n", sum(cell.repeats_recorded for cell in cells)
    if args.format == "parquet":
        # pyarrow writes to a path: a private temporary one beside the output, read back whole.
        with tempfile.TemporaryDirectory(prefix=".core-results-", dir=args.output.parent) as directory:
            path = Path(directory) / "runs.parquet"
            rows = store.export_parquet(path, **filters)
            return path.read_bytes(), rows
    stream = io.StringIO()
    rows = (store.export_csv if args.format == "csv" else store.export_json)(stream, **filters)
    return stream.getvalue(), rows


def _command_results(args: argparse.Namespace) -> int:
    from core.errors import CoreError
    from core.report import store_warnings
    from core.storage.files import OutputError, check_writable, describe_os_error, write_atomically
    from core.storage.store import ResultStore, default_database

    database = args.database or default_database()
    if args.format == "parquet" and args.output is None:
        return _error("--format parquet needs --output FILE")
    filters = {key: value for key, value in (("sweep", args.sweep), ("status", args.status)) if value is not None}
    try:
        _status_filter(args.status)
        with ResultStore(database, create=False) as store:
            _sweep_filter(args.sweep, store)
            if args.output is not None:
                check_writable(args.output, "--output")  # before the query: a bad path costs nothing
            content, rows = _results_content(args, store, filters)
            warnings = store_warnings(store)
    except CoreError as error:  # a bad filter or path, no or a damaged database, a missing library: nothing written
        return _error(str(error))
    except OSError as error:  # the Parquet export's temporary file
        return _error(f"cannot export to {args.output}: {describe_os_error(error)}", code=1)
    for warning in warnings:
        print(f"core: warning: {warning}", file=sys.stderr)
    if rows == 0:
        from core.report import list_names

        asked = " ".join(f"--{key} {list_names([value])}" for key, value in filters.items())
        print(f"core: no runs in {database}" + (f" match {asked}" if asked else ""), file=sys.stderr)
    if args.output is None:
        sys.stdout.write(content if isinstance(content, str) else "")
        return 0
    try:
        write_atomically(args.output, content, "--output")
    except OutputError as error:
        return _error(str(error), code=1)
    if args.format != "summary":
        print(f"wrote {rows} runs to {args.output}", file=sys.stderr)
    return 0


def _command_machines(args: argparse.Namespace) -> int:
    from core.contract.manager import get_plugin_manager

    manager = get_plugin_manager()
    profiles = manager.machine_profiles()
    if args.json:
        print(json.dumps([profile.model_dump(mode="json") for profile in profiles.values()], indent=2))
        return 0
    if not profiles:
        print("no machine profiles: no loaded plugin ships one (core plugins lists them)", file=sys.stderr)
        return 0
    width = max(len(name) for name in profiles)
    for name, profile in profiles.items():
        print(f"{name:<{width}}  {profile.accelerator:<9} {profile.description}")
    return 0


_COMMANDS = {
    "run": _command_run,
    "machines": _command_machines,
    "plugins": _command_plugins,
    "devices": _command_devices,
    "workloads": _command_workloads,
    "sweep": _command_sweep,
    "report": _command_report,
    "results": _command_results,
}


def main(argv: Sequence[str] | None = None) -> int:
    from core.running.progress import escaping_standard_streams

    # Everything the command prints goes through one filter (argparse's messages too): a name from a
    # database, a plugin, a file or the command line with ESC or another control character in it is
    # shown escaped, never obeyed by the terminal.
    with escaping_standard_streams():
        # One of core's own commands needs no plugin loaded to be parsed (`core results` stays quick).
        words = [word for word in (sys.argv[1:] if argv is None else argv) if not word.startswith("-")]
        parser = build_parser(plugin_commands=not words or words[0] not in BUILTIN_COMMANDS)
        args, unknown = parser.parse_known_args(argv)
        if unknown and getattr(args, _PLUGIN_COMMAND, (None, None))[1] is None:
            parser.parse_args(argv)  # argparse's own error for them; a broken plugin command says why instead
        return _main(args)


def _main(args: argparse.Namespace) -> int:
    try:
        # A plugin command is told by what core set on its parser, never by args.command, which an
        # argument of the plugin's own could overwrite (a positional named "command").
        code = _command_of_plugin(args) if hasattr(args, _PLUGIN_COMMAND) else _COMMANDS[args.command](args)
        sys.stdout.flush()  # here, where a closed pipe can still be handled, not at interpreter exit
        return code
    except BrokenPipeError:
        # `core plugins | head`: the reader left. Point stdout at /dev/null so the interpreter's
        # final flush does not raise again, and end quietly, as other Unix tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a tool killed by the broken pipe
    except KeyboardInterrupt:
        print(f"core: {args.command} interrupted", file=sys.stderr)
        return 130
    except Exception as error:
        if args.debug:
            raise
        from core.errors import CoreError

        kind = "error" if isinstance(error, CoreError) else f"internal error ({type(error).__name__})"
        print(f"core: {kind}: {error} (--debug shows the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
