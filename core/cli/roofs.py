"""``core roofs``: measure this host's roofs (memory bandwidth, matmul peaks), cache them and record
them in a results database, where ``core report --roofs measured`` (or auto) finds them."""

from __future__ import annotations

import argparse
import sys

from core.cli.errors import FAULT, error
from core.cli.sweep_arguments import DATABASE_HELP


def add_roofs_arguments(roofs: argparse.ArgumentParser) -> None:
    roofs.add_argument("--database", type=str, help=DATABASE_HELP)
    roofs.add_argument(
        "--no-database", action="store_true", help="only measure (or read the cache) and print; record nothing"
    )
    roofs.add_argument(
        "--accelerator",
        default="cpu",
        help="the accelerator whose first device is probed; its device model names the figures (default: cpu)",
    )
    roofs.add_argument(
        "--torch-device",
        default="cpu",
        metavar="DEVICE",
        help="the torch device the probe runs on, e.g. cuda:0 with --accelerator nvidia (default: cpu)",
    )
    roofs.add_argument("--fresh", action="store_true", help="measure again even where this host's cache has figures")


def command_roofs(args: argparse.Namespace) -> int:
    from core.base.config import Framework
    from core.base.errors import ConfigError
    from core.base.files import OutputError
    from core.contract.manager import get_plugin_manager
    from core.roofs import host_roofs
    from core.storage.store import ResultStore, StoreError, default_database

    try:
        accelerator = get_plugin_manager().accelerator(args.accelerator)
        devices = accelerator.devices()
    except ConfigError as problem:
        return error(str(problem))
    if not devices:
        return error(f"--accelerator {args.accelerator}: it sees no device on this host")
    precisions = [str(precision) for precision in accelerator.precisions(Framework.torch)]
    store = None
    try:
        if not args.no_database:  # refused before the probe, not after it
            store = ResultStore(args.database or default_database())
        found = host_roofs(args.accelerator, devices[0].name, precisions, args.torch_device, fresh=args.fresh)
        if store is not None:
            store.save_host_roofs(found.roofs)
    except (StoreError, OutputError) as problem:
        return error(str(problem), code=FAULT if store is not None else 2)
    except (RuntimeError, ValueError) as problem:  # torch: an unknown or absent device
        return error(f"--torch-device {args.torch_device}: {problem}")
    finally:
        if store is not None:
            store.close()
    for warning in found.warnings:
        print(f"core: warning: {warning}", file=sys.stderr)
    roofs = found.roofs
    how = "from the cache" if found.cached else f"probed in {roofs.probe_seconds:.1f} s"
    print(f"{roofs.device} on {roofs.host} ({roofs.label}; {how})")
    print(f"  memory bandwidth (triad): {roofs.memory_bandwidth_bytes_per_second / 1e9:.4g} GB/s")
    for dtype, peak in roofs.peak_flops_per_second.items():
        print(f"  matmul peak, {dtype}: {peak / 1e9:.4g} GFLOP/s")
    print(f"  method: {roofs.method}")
    if store is not None:
        print(f"recorded in {store.path}")
    return 0
