"""What is installed: ``core plugins``, ``core devices``, ``core workloads`` and ``core machines``,
as text or ``--json``. ``core plugins`` imports no framework or vendor SDK."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from core.cli.argparser import CoreParser, Subcommands
    from core.contract.workload import Workload


def add_listing_commands(commands: Subcommands, debug: CoreParser) -> None:
    """The parsers of the four listings."""
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


def command_plugins(args: argparse.Namespace) -> int:
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


def command_devices(args: argparse.Namespace) -> int:
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
    """Everything ``core workloads`` shows, as plain data; a workload that raises is listed with its fault."""
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


def _workload_row(name: str, plugin: str, workload: Workload) -> dict[str, Any]:
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


def command_workloads(args: argparse.Namespace) -> int:
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


def command_machines(args: argparse.Namespace) -> int:
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
