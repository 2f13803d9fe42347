"""The Slurm logs of a cluster sweep's jobs, kept once their repeats are recorded: a job's folder
goes, its ``slurm-JOBID.out`` moves to ``<jobs directory>/_logs/<sweep>/`` (``_``: no sweep has
that name), where logs older than ``slurm.log_retention_days`` are pruned when the sweep next runs.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Collection
from pathlib import Path

from core.base.files import describe_os_error

_log = logging.getLogger(__name__)
LOGS_FOLDER = "_logs"
SECONDS_PER_DAY = 86400.0
#: a kept log: ``slurm-JOBID-FOLDER.out``, JOBID ``123`` or an array task's ``123_4``
_KEPT_LOG = re.compile(r"slurm-(?P<job>\d+(?:_\d+)?)-[^/]*\.out")


def logs_folder(jobs_root: Path, sweep: str) -> Path:
    return jobs_root / LOGS_FOLDER / sweep


def keep_log(job_folder: Path, job_id: str, logs: Path) -> Path | None:
    """Move ``job_folder``'s ``slurm-JOBID.out`` to ``logs`` (named after the job and its folder:
    ``slurm-123_4-cell1-repeat2-TOKEN.out``) before the folder goes; the kept path, None where there
    was none. A log that cannot be kept (a full disk) is a warning: the result is recorded already."""
    log = job_folder / f"slurm-{job_id}.out"
    if not log.exists():
        return None
    kept = logs / f"slurm-{job_id}-{job_folder.name}.out"
    try:
        logs.mkdir(parents=True, exist_ok=True)
        os.replace(log, kept)  # the same filesystem: the jobs directory's
    except OSError as error:
        _log.warning("core: warning: cannot keep the log %s in %s: %s", log, logs, describe_os_error(error))
        return None
    return kept


def prune_logs(logs: Path, *, now: float, retention_days: float, in_flight: Collection[str]) -> list[Path]:
    """Remove the kept logs in ``logs`` last written more than ``retention_days`` before ``now``
    (seconds since the epoch), never one of a job of ``in_flight`` (the ledger's job ids); returns
    those removed. Only files named as :func:`keep_log` names them go."""
    try:
        children = list(logs.iterdir())
    except OSError:
        return []  # none kept yet
    oldest = now - retention_days * SECONDS_PER_DAY
    removed = []
    for child in children:
        match = _KEPT_LOG.fullmatch(child.name)
        if match is None or match.group("job") in in_flight:
            continue
        try:
            if child.is_file() and not child.is_symlink() and child.stat().st_mtime < oldest:
                child.unlink()
                removed.append(child)
        except OSError as error:
            _log.warning("core: warning: cannot prune the old log %s: %s", child, describe_os_error(error))
    return removed
