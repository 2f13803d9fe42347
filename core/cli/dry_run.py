"""``core run --dry-run``: the plan of one run, validated and shown, nothing run; ``--machine``
(also ``core sweep``'s) plans for a machine profile instead of this host."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.base.config import AUTO_NODE_METERS
from core.base.errors import ConfigError
from core.cli.errors import config_error, error
from core.cli.text import count

if TYPE_CHECKING:
    from collections.abc import Mapping

    from core.base.config import RunConfig
    from core.base.precision import PrecisionPolicy
    from core.contract.workload import Workload
    from core.machines import MachineProfile
    from core.running.planning import PlannedRun, RunPlan

_GIB = 1024**3

MACHINE_HELP = (
    "with --dry-run: validate for this machine instead of this host: a shipped profile (see `core machines`) "
    "or a profile file (.toml)"
)


def load_machine_argument(
    args: argparse.Namespace,
    relative_to: Path | None = None,
    site_machines: Mapping[str, MachineProfile] | None = None,
    *,
    name: str | None = None,
    runs_there: bool = False,
) -> MachineProfile | None:
    """The --machine profile (None without one); ConfigError when it is unknown, or used without
    --dry-run where nothing runs on that machine.

    :param relative_to: where a relative profile path is read from (a sweep file's folder, for the
        file's own ``machine`` key); None: the working directory, as for any path on the command line.
    :param site_machines: the site file's profiles (core/sweep/site.py), looked up before the plugins'.
    :param name: the profile to load instead of ``args.machine`` (the sweep file's ``machine``).
    :param runs_there: the runs go to that machine (``core sweep --executor slurm``); False: only
        a dry run may name a machine.
    """
    name = args.machine if name is None else name
    if name is None:
        return None
    if not args.dry_run and not runs_there:
        raise ConfigError("--machine", name, "plans for a machine not at hand: use it with --dry-run")
    from core.machines import load_machine, shipped_machines

    shipped = {**shipped_machines(), **site_machines} if site_machines else None
    return load_machine(name, relative_to=relative_to, shipped=shipped)


def command_run_dry(args: argparse.Namespace, options: dict[str, Any]) -> int:
    """Plan the run as ``core run`` would (for ``--machine`` where given) and show the plan."""
    from core.base.distributed import SINGLE_PROCESS
    from core.contract.manager import PluginFault, get_plugin_manager
    from core.running.planning import plan_run

    manager = get_plugin_manager()
    try:
        machine = load_machine_argument(args)
        plan = plan_run(manager, args.workload, args.accelerator, options, machine=machine)
        _check_database_for_dry_run(args.database)
        with manager.plugin_code(plan.accelerator, f"{type(plan.accelerator).__name__}.placement_summary()"):
            extra_placement = plan.accelerator.placement_summary(plan.context(SINGLE_PROCESS))
    except ConfigError as problem:
        return config_error(problem)
    except PluginFault as fault:
        return error(str(fault))
    described = describe_plan(plan, extra_placement)
    if args.json:
        print(json.dumps(described, indent=2))
    else:
        for label, text in plan_lines(described):
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
    except StoreError as problem:
        raise ConfigError("database", str(path), str(problem)) from None


def describe_plan(plan: RunPlan, extra_placement: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a dry run of one run shows, as data (``--json``): where it was planned for, its
    placement, a memory estimate where the model's size is known, and what it warns of."""
    config = plan.config
    machine = plan.machine
    memory = memory_summary(plan.workload, plan.workload_options, config, plan.precision_policy, machine)
    split = {}
    if config.devices_per_replica > 1 or config.tensor_parallel > 1:
        split = {"tensor_parallel": config.tensor_parallel, "pipeline_stages": config.pipeline_parallel}
    for field, plain in (("sharding", "none"), ("recompute", "none"), ("pipeline_schedule", None)):
        if getattr(config, field) != plain:
            split[field] = getattr(config, field)
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
            **split,
            # Where the run gave the global batch, say so beside what was derived from it.
            **({"global_batch_size": config.global_batch_size} if config.global_batch_size is not None else {}),
            **(extra_placement or {}),
        },
        "precision": config.precision.value,
        "launcher": plan.launcher.name if plan.launcher is not None else None,
        "parameters": memory["parameters"] if memory is not None else None,
        "memory_per_device": memory,
        "power_meter": plan.meter_factory.name if plan.meter_factory is not None else None,
        "energy_unavailable_reason": None if plan.meter_factory is not None else plan.meter_unavailable_reason,
        "node_meters": [factory.name for factory in plan.node_meter_factories],
        "warnings": list(plan.warnings),
        "config": config.model_dump(mode="json"),
    }


def memory_summary(
    workload: Workload,
    options: Any,
    config: RunConfig,
    policy: type[PrecisionPolicy] | None,
    machine: MachineProfile | None,
) -> dict[str, Any] | None:
    """One device's memory for the run as data (``memory_per_device`` of ``--json``), None where the
    workload does not know its parameter count."""
    from core.running.planning import memory_estimate

    estimate = memory_estimate(workload, options, config, policy, machine)
    if estimate is None:
        return None
    counted = estimate.activation_bytes is not None
    return {
        "parameters": estimate.parameters,
        "kept": estimate.kept,
        "model_state_gib": _gib(estimate.weights_bytes + estimate.gradients_bytes),
        "optimizer_state_gib": _gib(estimate.optimizer_state_bytes),
        "optimizer_state_assumed": estimate.optimizer_state_assumed,
        "weights_gib": _gib(estimate.weights_bytes),
        "gradients_gib": _gib(estimate.gradients_bytes),
        "replicas": config.replicas,
        "devices_per_replica": config.devices_per_replica,
        "tensor_parallel": config.tensor_parallel,
        "sharding": estimate.sharding,
        "pipeline_stage": estimate.stage + 1,
        "layers_per_stage": list(estimate.layers_per_stage),
        "activations": f"recompute {estimate.recompute!r}" if counted else "not counted",
        "activations_gib": _gib(estimate.activation_bytes) if estimate.activation_bytes is not None else None,
        "activations_gib_by_recompute": {
            recompute: _gib(size) for recompute, size in estimate.activations_by_recompute.items()
        },
        "micro_batches_in_flight": estimate.micro_batches_in_flight,
        "total_gib": _gib(estimate.total_bytes),
        "total_gib_by_recompute": {
            recompute: _gib(total)
            for recompute in estimate.activations_by_recompute
            if (total := estimate.total_with(recompute)) is not None
        },
        "device_memory_gib": machine.memory_gib_per_device if machine is not None else None,
    }


def cell_memory_lines(planned: PlannedRun, machine: MachineProfile) -> list[str]:
    """A sweep cell's memory table for ``core sweep --dry-run`` on a machine (empty where the
    workload gives no transformer shape: its activations are not counted, and a grid of thousands of
    such cells, AI4NP's FCNN, would print a line each for little)."""
    from core.contract.manager import get_plugin_manager
    from core.running.planning import rebuild_policy

    workload = get_plugin_manager().workload(planned.config.workload)
    options = workload.parse_options(dict(planned.config.workload_options))
    policy = rebuild_policy(planned.precision_policy) if planned.precision_policy is not None else None
    memory = memory_summary(workload, options, planned.config, policy, machine)
    if memory is None or memory["activations_gib"] is None:
        return []
    return [f"memory: {_memory_text(memory)}", *_memory_table(memory)]


def plan_lines(described: dict[str, Any]) -> list[tuple[str, str]]:
    """The text view of :func:`describe_plan`: one labelled line per item, warnings last."""
    parameters = described["parameters"]
    placement, notes = _placement_text(described["placement"])
    lines = [
        ("planned for", described["planned_for"] or "this host"),
        ("workload", described["workload"]),
        ("accelerator", f"{described['accelerator']} ({described['framework']})"),
        ("placement", placement),
        *[("", note) for note in notes],
        ("precision", described["precision"]),
        ("launcher", described["launcher"] or "none (one process)"),
        ("parameters", f"{parameters:,}" if parameters else "unknown"),
    ]
    memory = described["memory_per_device"]
    if memory is not None:
        lines.append(("memory", _memory_text(memory)))
        if memory["activations_gib"] is not None:
            lines.extend(("", row) for row in _memory_table(memory))
    lines.append(("energy", described["power_meter"] or described["energy_unavailable_reason"]))
    if described["node_meters"]:
        beside = described["config"].get("node_meters") == AUTO_NODE_METERS
        lines.append(
            ("node meters", ", ".join(described["node_meters"]) + (" (read beside, not counted)" if beside else ""))
        )
    lines.extend(("warning", warning) for warning in described["warnings"])
    return lines


def _placement_text(placement: dict[str, Any]) -> tuple[str, list[str]]:
    """The placement line (replicas, devices, batch arithmetic, the accelerator's own figures) and
    the accelerator's notes under it."""
    placement = dict(placement)
    replicas, per_replica = placement.pop("replicas"), placement.pop("devices_per_replica")
    text = (
        f"{count(replicas, 'replica')} x {count(per_replica, 'device')}, micro-batch "
        f"{placement.pop('micro_batch_size')}, gradient accumulation {placement.pop('gradient_accumulation')}"
    )
    notes = placement.pop("placement_notes", None) or []
    if placement:
        text += "; " + ", ".join(f"{key.replace('_', ' ')} {value}" for key, value in placement.items())
    return text, list(notes)


def _gib(size: int) -> float:
    return round(size / _GIB, 3)


def _memory_table(memory: dict[str, Any]) -> list[str]:
    """The memory of the heaviest device, row by row, and the activations under each recompute choice."""
    stages = memory["layers_per_stage"]
    placement = (
        f"{count(memory['replicas'], 'replica')} x {count(memory['devices_per_replica'], 'device')}: tensor "
        f"parallel {memory['tensor_parallel']} x {count(max(len(stages), 1), 'pipeline stage')}"
    )
    where = (
        f"pipeline stage {memory['pipeline_stage']} (layers per stage {', '.join(map(str, stages))})"
        if len(stages) > 1
        else "its one stage"
    )
    rows = [
        f"heaviest device of {placement}: {where}, sharding {memory['sharding']}",
        f"  {'weights':<17}{memory['weights_gib']:>10.2f} GiB",
        f"  {'gradients':<17}{memory['gradients_gib']:>10.2f} GiB",
        f"  {'optimizer state':<17}{memory['optimizer_state_gib']:>10.2f} GiB",
        f"  {'activations':<17}{memory['activations_gib']:>10.2f} GiB  ({memory['activations']}, "
        f"{memory['micro_batches_in_flight']} micro-batch(es) in flight)",
        f"  {'total':<17}{memory['total_gib']:>10.2f} GiB"
        + (f" of {memory['device_memory_gib']:.1f} GiB" if memory["device_memory_gib"] is not None else ""),
    ]
    others = ", ".join(
        f"{recompute} {activations:.2f} GiB (total {memory['total_gib_by_recompute'][recompute]:.2f})"
        for recompute, activations in memory["activations_gib_by_recompute"].items()
    )
    rows.append(f"  activations by recompute: {others}")
    return rows


def _memory_text(memory: dict[str, Any]) -> str:
    state = "an optimizer state like Adam's, assumed" if memory["optimizer_state_assumed"] else "optimizer state"
    of = f" of {memory['device_memory_gib']:.1f} GiB" if memory["device_memory_gib"] is not None else ""
    kept = f"{memory['model_state_gib']:.2f} GiB {memory['kept']}"
    if memory["optimizer_state_gib"]:
        kept += f" + {memory['optimizer_state_gib']:.2f} GiB {state}"
    if memory["activations_gib"] is not None:
        return f"{memory['total_gib']:.2f} GiB per device{of}, activations counted (the table below)"
    return f"{kept} per device{of} (activations not counted)"
