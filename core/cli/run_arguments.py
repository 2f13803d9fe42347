"""``core run``'s arguments: one flag per RunConfig field, generated, in groups, with examples.

A new RunConfig field gets its flag, its help (the field's description, what it allows, its default)
and the flag's name in errors without a line here; only its group in ``core run --help`` is chosen
here (:data:`RUN_GROUPS`; tests/test_cli_parser.py fails for a field without one).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.base.files import parse_json

if TYPE_CHECKING:
    from pydantic.fields import FieldInfo

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
    "target": "--target",
}
#: the flags of ``target``'s other keys (``--target METRIC=VALUE`` sets its metric and value)
TARGET_FLAGS = {
    "max_epochs": "--max-epochs",
    "max_seconds": "--max-seconds",
    "evaluate_every_epochs": "--evaluate-every-epochs",
    "evaluate_every_samples": "--evaluate-every-samples",
}

#: ``core run --help``'s groups in order: title -> the RunConfig fields and other arguments (by
#: dest) it shows. A RunConfig field in none of them is shown under the last.
RUN_GROUPS: dict[str, tuple[str, ...]] = {
    "what to run": (
        "workload",
        "accelerator",
        "mode",
        "framework",
        "workload_options",
        "accelerator_options",
        "weights",
        "seed",
    ),
    "batch and steps": (
        "micro_batch_size",
        "gradient_accumulation",
        "global_batch_size",
        "steps",
        "duration_seconds",
        "warmup_steps",
        "device_iterations",
    ),
    "precision and compile": ("precision", "compile"),
    "data": ("data", "data_format", "data_workers", "epoch_definition"),
    "energy": ("power_meter", "node_meters", "energy_scope", "power_sample_interval_seconds", "power_timeline_points"),
    "inference and LoadGen": ("scenario", "loadgen", "accuracy"),
    "training to a target": ("target", *TARGET_FLAGS),
    "processes and nodes": (
        "replicas",
        "devices_per_replica",
        "tensor_parallel",
        "sharding",
        "recompute",
        "pipeline_schedule",
        "profile_communication",
        "nodes",
        "rendezvous",
        "tensorflow_strategy",
        "threads_per_replica",
        "timeout_seconds",
    ),
    "output": ("json", "quiet", "output", "database", "dry_run", "machine"),
}

#: commands from the README, shown under ``core run --help`` (tests/test_cli_parser.py parses each
#: and finds it in the README)
RUN_EXAMPLES = (
    "core run fcnn --accelerator cpu --batch-size 64 --precision bf16 --steps 50 -o layers=8 --output result.json",
    "core run fcnn --batch-size 64 --database results/core.db",
    "core run fcnn --replicas 2 --batch-size 16",
    "core run resnet50 -o variant=small --data path/to/imagenet-folder --data-workers 4",
    "core run resnet50 -o variant=small --mode inference --scenario single-stream",
    "core run fcnn --accelerator amd --replicas 4 -a mode=package",
    "core run resnet50 --accelerator nvidia --nodes 2 --replicas 8",
    "core run digits --target top1=0.95 --max-epochs 30",
)


def run_flags() -> dict[str, str]:
    """RunConfig field -> the ``core run`` flag that sets it (so an error can name both)."""
    from core.base.config import RunConfig

    flags = {name: _FLAG_NAMES.get(name, "--" + name.replace("_", "-")) for name in RunConfig.model_fields}
    target = {
        f"target.{key}": flag for key, flag in {"metric": "--target", "value": "--target", **TARGET_FLAGS}.items()
    }
    return {**flags, **_OWN_SYNTAX, **target}


def _flag_help(info: FieldInfo) -> tuple[Any, str]:
    """(argparse type, help) for one RunConfig field: its description, what it allows, its default."""
    import enum
    import types
    import typing

    from core.base.precision import BUILTIN_POLICIES, Precision

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


def option_pair(text: str) -> tuple[str, Any]:
    """``key=value`` with value parsed as JSON where it can be (numbers, true/false)."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    key, raw = text.split("=", 1)
    try:
        value = parse_json(raw)
    except ValueError:  # not JSON (or nested too deeply to read as JSON): the text itself
        value = raw
    return key.strip(), value


def add_run_arguments(run: argparse.ArgumentParser, machine_help: str) -> None:
    """``core run``'s arguments, in the groups of :data:`RUN_GROUPS`."""
    groups = {title: run.add_argument_group(title) for title in RUN_GROUPS}
    group_of = {dest: groups[title] for title, dests in RUN_GROUPS.items() for dest in dests}
    last = groups[list(RUN_GROUPS)[-1]]

    def group(dest: str) -> argparse._ArgumentGroup:
        return group_of.get(dest, last)

    group("workload").add_argument("workload", metavar="WORKLOAD", help="workload name (see `core workloads`)")
    group("accelerator").add_argument(
        "--accelerator", default="cpu", help="accelerator name (see `core plugins`); default: cpu"
    )
    _add_config_flags(group)
    _add_option_pairs(group)
    _add_target_flags(group)
    group("timeout_seconds").add_argument(
        "--timeout-seconds",
        type=float,
        metavar="TIMEOUT_SECONDS",
        help="stop the run after this long (it then runs in a child process); the result keeps the phases "
        "measured before",
    )
    group("json").add_argument("--json", action="store_true", help="print the result as JSON")
    group("quiet").add_argument(
        "--quiet", action="store_true", help="no progress on stderr (a line per phase, the steps and the time left)"
    )
    group("output").add_argument("--output", type=Path, help="also write the result JSON to this file")
    group("database").add_argument(
        "--database",
        type=Path,
        help="also store the run, failed or not, in this results database (as a sweep does; "
        "`core report` shows it under Single runs)",
    )
    group("dry_run").add_argument("--dry-run", action="store_true", help="validate and show the plan; run nothing")
    group("machine").add_argument("--machine", help=machine_help)


def _add_config_flags(group: Callable[[str], argparse._ArgumentGroup]) -> None:
    """One flag per RunConfig field, generated: a new field gets its flag, help and error naming."""
    from core.base.config import RunConfig

    flags = run_flags()
    for name, info in RunConfig.model_fields.items():
        if name in _OWN_SYNTAX:
            continue
        kind, text = _flag_help(info)
        # default None: only what the user typed reaches RunConfig, which keeps its own defaults.
        if kind is bool:
            group(name).add_argument(flags[name], dest=name, action="store_true", default=None, help=text)
        else:
            metavar = flags[name].lstrip("-").upper().replace("-", "_")
            group(name).add_argument(flags[name], dest=name, type=kind, default=None, metavar=metavar, help=text)


def _add_option_pairs(group: Callable[[str], argparse._ArgumentGroup]) -> None:
    """-o, -a and -l: KEY=VALUE pairs of the workload's, the accelerator's and LoadGen's options."""
    pairs = (
        ("-o", "--option", "workload_options", "workload hyper-parameter, e.g. -o layers=8 (repeatable)"),
        (
            "-a",
            "--accelerator-option",
            "accelerator_options",
            "vendor placement option, e.g. -a mode=package (AMD), -a ipu_model=true (Graphcore)",
        ),
        (
            "-l",
            "--loadgen",
            "loadgen",
            "LoadGen setting with --scenario offline/single-stream/server, e.g. -l min_duration_seconds=60",
        ),
    )
    for short, long, dest, text in pairs:
        group(dest).add_argument(
            short, long, dest=dest, action="append", type=option_pair, default=[], metavar="KEY=VALUE", help=text
        )


def target_pair(text: str) -> tuple[str, Any]:
    """``--target METRIC=VALUE``: the metric's name and the value to reach, a number."""
    metric, value = option_pair(text)
    if not metric or isinstance(value, bool) or not isinstance(value, (int, float)):
        raise argparse.ArgumentTypeError(f"expected METRIC=NUMBER (e.g. top1=0.95), got {text!r}")
    return metric, float(value)


def _add_target_flags(group: Callable[[str], argparse._ArgumentGroup]) -> None:
    """``--target METRIC=VALUE`` and the target's interval and budget (docs/to-target.md)."""
    from core.base.config import RunConfig, TargetConfig

    group("target").add_argument(
        "--target",
        dest="target",
        type=target_pair,
        metavar="METRIC=VALUE",
        help=f"{RunConfig.model_fields['target'].description}: METRIC=VALUE on the workload's held-out split "
        "(e.g. --target top1=0.95 or --target loss=0.2), with --max-epochs or --max-seconds",
    )
    for key, flag in TARGET_FLAGS.items():
        kind, text = _flag_help(TargetConfig.model_fields[key])
        group(key).add_argument(flag, dest=key, type=kind, default=None, metavar=key.upper(), help=text)


def target_options(args: argparse.Namespace) -> dict[str, Any] | None:
    """``target`` as the flags give it; None without any target flag."""
    from core.base.errors import ConfigError

    given = {key: getattr(args, key, None) for key in TARGET_FLAGS}
    given = {key: value for key, value in given.items() if value is not None}
    pair = getattr(args, "target", None)
    if pair is None:
        if given:
            key = next(iter(given))
            raise ConfigError(
                f"target.{key}", given[key], "a target to train to: add --target METRIC=VALUE (e.g. top1=0.95)"
            )
        return None
    metric, value = pair
    return {"metric": metric, "value": value, **given}


def run_examples() -> str:
    """The epilog of ``core run --help``."""
    return "examples:\n" + "\n".join(f"  {example}" for example in RUN_EXAMPLES)


def run_options(args: argparse.Namespace) -> dict[str, Any]:
    """The RunConfig options the user typed (only those: RunConfig keeps its own defaults)."""
    fields = [name for name in run_flags() if name not in _OWN_SYNTAX and "." not in name]
    options = {name: getattr(args, name) for name in fields if getattr(args, name) is not None}
    for dest in ("workload_options", "accelerator_options", "loadgen"):
        if getattr(args, dest):
            options[dest] = dict(getattr(args, dest))
    target = target_options(args)
    if target is not None:
        options["target"] = target
    return options
