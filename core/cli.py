"""The ``core`` command. ``core --help`` and ``core plugins`` import no framework or vendor SDK."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

from core.errors import ConfigError

# CLI flag -> RunConfig field, so an error can name both.
_RUN_FLAGS: dict[str, str] = {
    "micro_batch_size": "--batch-size",
    "gradient_accumulation": "--gradient-accumulation",
    "replicas": "--replicas",
    "devices_per_replica": "--devices-per-replica",
    "device_iterations": "--device-iterations",
    "precision": "--precision",
    "steps": "--steps",
    "warmup_steps": "--warmup-steps",
    "seed": "--seed",
    "framework": "--framework",
    "power_meter": "--power-meter",
    "power_sample_interval_seconds": "--power-sample-interval",
    "threads_per_replica": "--threads",
    "accelerator": "--accelerator",
    "workload": "WORKLOAD",
}


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="core", description="Run one ML workload on any accelerator and measure it.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    run = commands.add_parser("run", help="run a workload and print its result")
    run.add_argument("workload", metavar="WORKLOAD", help="workload name (see `core workloads`)")
    run.add_argument("--accelerator", default="cpu", help="accelerator name (see `core plugins`); default: cpu")
    run.add_argument("--framework", choices=None, help="torch or tensorflow (default: torch)")
    run.add_argument("--batch-size", dest="micro_batch_size", type=int, help="micro-batch per device")
    run.add_argument("--gradient-accumulation", type=int)
    run.add_argument("--replicas", type=int)
    run.add_argument("--devices-per-replica", type=int)
    run.add_argument("--device-iterations", type=int)
    run.add_argument("--precision", help="fp32, tf32, bf16 or fp16")
    run.add_argument("--steps", type=int, help="weight updates in the timed window")
    run.add_argument("--warmup-steps", type=int)
    run.add_argument("--seed", type=int)
    run.add_argument("--compile", action="store_true", default=None, help="torch.compile / XLA")
    run.add_argument("--power-meter", help="auto, none, or a meter name")
    run.add_argument("--power-sample-interval", dest="power_sample_interval_seconds", type=float)
    run.add_argument("--threads", dest="threads_per_replica", type=int, help="host threads per replica")
    run.add_argument("-o", "--option", dest="workload_options", action="append", type=_option_pair, default=[],
                     metavar="KEY=VALUE", help="workload hyper-parameter, e.g. -o layers=8 (repeatable)")
    run.add_argument("--json", action="store_true", help="print the result as JSON")
    run.add_argument("--output", type=Path, help="also write the result JSON to this file")

    plugins = commands.add_parser("plugins", help="list plugins, what they register and whether it is available")
    plugins.add_argument("--json", action="store_true")
    devices = commands.add_parser("devices", help="list the devices of every available accelerator")
    devices.add_argument("--json", action="store_true")
    workloads = commands.add_parser("workloads", help="list registered workloads")
    workloads.add_argument("--json", action="store_true")
    return parser


def _run_options(args: argparse.Namespace) -> dict[str, Any]:
    fields = ("framework", "micro_batch_size", "gradient_accumulation", "replicas", "devices_per_replica",
              "device_iterations", "precision", "steps", "warmup_steps", "seed", "compile", "power_meter",
              "power_sample_interval_seconds", "threads_per_replica")
    options = {name: getattr(args, name) for name in fields if getattr(args, name) is not None}
    if args.workload_options:
        options["workload_options"] = dict(args.workload_options)
    return options


def _describe_config_error(error: ConfigError) -> str:
    errors = getattr(error, "errors", [error])
    lines = []
    for e in errors:
        flag = _RUN_FLAGS.get(e.field) or ("-o " + e.field.split(".", 1)[1] if e.field.startswith("workload_options.") else None)
        lines.append(f"invalid {e.field}{f' ({flag})' if flag else ''} = {e.value!r}: {e.allowed}")
    return "\n".join(lines)


def _format_seconds(value: float | None, scale: float = 1.0, unit: str = "s") -> str:
    return "n/a" if value is None else f"{value * scale:.4g} {unit}"


def format_result(result: Any) -> str:
    c = result.config
    lines = [
        f"{result.workload} on {result.accelerator} ({result.framework}, {c.precision.value}): {result.status.state.value}",
        f"  samples/update  {result.samples_per_update} (micro {c.micro_batch_size} x accumulation "
        f"{c.gradient_accumulation} x replicas {c.replicas})",
    ]
    if result.throughput_per_second is not None:
        lines.append(f"  throughput      {result.throughput_per_second:.6g} samples/s "
                     f"(window {result.window_seconds:.4g} s, {result.window_steps} updates)")
        lines.append(f"  step time       median {_format_seconds(result.step_seconds_median, 1e3, 'ms')}, "
                     f"p90 {_format_seconds(result.step_seconds_p90, 1e3, 'ms')}")
    lines.append(f"  phases          setup {_format_seconds(result.setup_seconds)}, first step "
                 f"{_format_seconds(result.first_step_seconds)}, warm-up {_format_seconds(result.warmup_seconds)}")
    if result.flops_per_second is not None:
        lines.append(f"  achieved        {result.flops_per_second / 1e12:.4g} TFLOP/s "
                     f"({result.flops_per_sample:.4g} FLOP/sample)")
    if result.energy_joules is not None:
        lines.append(f"  energy          {result.energy_joules:.4g} J over the window "
                     f"({result.samples_per_watt_hour:.4g} samples/Wh, {result.energy.method})")
    else:
        lines.append(f"  energy          unavailable: {result.energy_unavailable_reason}")
    if not result.status.ok:
        lines.append(f"  error           in {result.status.phase}: {result.status.error_type}: {result.status.message}")
    return "\n".join(lines)


def _command_run(args: argparse.Namespace) -> int:
    from core.api import run

    try:
        result = run(args.workload, args.accelerator, **_run_options(args))
    except ConfigError as error:
        print(f"core: error: {_describe_config_error(error)}", file=sys.stderr)
        return 2
    text = result.to_json()
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text + "\n", encoding="utf-8")
    print(text if args.json else format_result(result))
    return 0 if result.status.ok else 1


def plugin_report() -> list[dict[str, Any]]:
    """Everything ``core plugins`` shows, as plain data."""
    from core.plugins import get_plugin_manager

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
                    availability = item.availability()
                    entry.update(available=availability.available, reason=availability.reason)
                entries.append(entry)
            provides[kind] = entries
        rows.append({
            "name": record.name, "version": record.version, "distribution": record.distribution,
            "module": record.module, "state": record.state.value, "error": record.error,
            "hooks": record.hooks, "registers": provides,
        })
    return rows


def _command_plugins(args: argparse.Namespace) -> int:
    rows = plugin_report()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        version = f" {row['version']}" if row["version"] else ""
        print(f"{row['name']}{version} [{row['state']}] ({row['module']})")
        if row["error"]:
            print(f"  error: {row['error']}")
        for kind, entries in row["registers"].items():
            for entry in entries:
                state = ""
                if "available" in entry:
                    state = ": available" if entry["available"] else f": unavailable: {entry['reason']}"
                print(f"  {kind[:-1].replace('_', ' ')} {entry['name']}{state}")
        if row["hooks"]:
            print(f"  hooks: {', '.join(row['hooks'])}")
    return 0


def _command_devices(args: argparse.Namespace) -> int:
    from core.plugins import get_plugin_manager

    listing: dict[str, Any] = {}
    for name, registered in get_plugin_manager().accelerators.items():
        availability = registered.item.availability()
        if availability.available:
            listing[name] = [device.model_dump() for device in registered.item.devices()]
        else:
            listing[name] = {"unavailable": availability.reason}
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
    from core.plugins import get_plugin_manager

    rows = []
    for name, registered in get_plugin_manager().workloads.items():
        workload = registered.item
        defaults = workload.options_model()
        rows.append({
            "name": name, "plugin": registered.plugin, "description": workload.description,
            "frameworks": [f.value for f in workload.frameworks], "task": workload.task,
            "sample_unit": workload.sample_unit, "default_micro_batch_size": workload.default_micro_batch_size,
            "parameter_count": workload.parameter_count(defaults),
            "flops_per_sample": workload.flops_per_sample(defaults),
            "options": defaults.model_dump(),
        })
    return rows


def _command_workloads(args: argparse.Namespace) -> int:
    rows = workload_report()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        params = f", {row['parameter_count']:,} parameters" if row["parameter_count"] else ""
        print(f"{row['name']} ({', '.join(row['frameworks'])}; {row['task']}, {row['sample_unit']}{params}): "
              f"{row['description']}")
    return 0


_COMMANDS = {"run": _command_run, "plugins": _command_plugins, "devices": _command_devices,
             "workloads": _command_workloads}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return _COMMANDS[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
