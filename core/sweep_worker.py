"""One repeat of one sweep cell, in its own process: ``python -m core.sweep_worker REQUEST RESULT``.

REQUEST is a JSON file ``{"options": {...RunConfig fields...}, "parent_pid": N}``. The worker
runs ``core.run`` and writes the result to RESULT atomically when the run is over; after each
phase it writes what it has to RESULT.partial, so a run that later crashes or hangs still
leaves its earlier figures. The sweep, not this process, decides what a missing RESULT means.

A worker must not outlive its sweep: if the sweep process dies (``kill -9``), a watchdog thread
stops this process group, so a resumed sweep never measures next to an orphan.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from core.errors import ConfigError
from core.results import RunResult

PARTIAL_SUFFIX = ".partial"
_WATCHDOG_INTERVAL_SECONDS = 1.0  # how often the worker checks that its sweep is alive


def write_atomically(path: Path, text: str) -> None:
    """Write to a sibling temporary file, then rename: a reader sees the old or the new text."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def _watch_parent(parent_pid: int) -> None:
    while True:
        if os.getppid() != parent_pid:
            # The sweep is gone. SIGTERM lets torchrun stop its workers (they run in sessions of their own).
            # Only a group this process leads (the sweep starts it so) is ours to stop.
            if os.getpgid(0) == os.getpid():
                os.killpg(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        time.sleep(_WATCHDOG_INTERVAL_SECONDS)


def main(argv: list[str]) -> int:
    request_path, result_path = Path(argv[0]), Path(argv[1])
    request = json.loads(request_path.read_text(encoding="utf-8"))
    parent_pid = int(request["parent_pid"])
    if os.getppid() != parent_pid:
        return 3  # the sweep died before this process started
    threading.Thread(target=_watch_parent, args=(parent_pid,), name="sweep-watchdog", daemon=True).start()

    from core.api import run

    options = dict(request["options"])
    workload, accelerator = options.pop("workload"), options.pop("accelerator")
    partial_path = result_path.with_name(result_path.name + PARTIAL_SUFFIX)

    def save_partial(result: RunResult) -> None:
        write_atomically(partial_path, result.model_dump_json())

    try:
        result = run(workload, accelerator, on_progress=save_partial, **options)
    except ConfigError as error:
        # Validated before the sweep began; refused here only if the machine changed since.
        print(f"core: error: the run was refused: {error}", file=sys.stderr)
        return 2
    write_atomically(result_path, result.model_dump_json())
    return 0 if result.status.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
