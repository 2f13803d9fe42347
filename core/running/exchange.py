"""Gathering a small value from every process of a run through files, for runs whose processes
share no process group (poprun's instances: PopTorch's replicas talk through the IPU fabric, not
through the hosts). The launch's work directory holds one file per process; every process waits
until all are there. A host-side collective where one exists (torch.distributed) is preferred.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from core.base.files import write_atomically

_POLL_SECONDS = 0.05


class ExchangeTimeoutError(TimeoutError):
    """Some process never wrote its value (it died, or never reached this point)."""


def gather_through_files(
    directory: Path, name: str, rank: int, world_size: int, value: object, timeout_seconds: float = 120.0
) -> list[object]:
    """``value`` from every rank, in rank order: each writes ``NAME-RANK.json`` atomically (so a
    reader never sees half a file) and reads the others' once all exist."""
    write_atomically(directory / f"{name}-{rank}.json", json.dumps(value), f"rank {rank}'s {name}")
    paths = [directory / f"{name}-{other}.json" for other in range(world_size)]
    deadline = time.monotonic() + timeout_seconds
    while not all(path.exists() for path in paths):
        if time.monotonic() > deadline:
            missing = [other for other, path in enumerate(paths) if not path.exists()]
            raise ExchangeTimeoutError(f"no {name} from rank(s) {missing} after {timeout_seconds:g} s")
        time.sleep(_POLL_SECONDS)
    return [json.loads(path.read_text(encoding="utf-8")) for path in paths]
