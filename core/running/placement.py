"""Where a run ran, beyond its host: the Slurm job, as Slurm's environment tells every process of a
job (sbatch, an array task, srun). Read, never asked of Slurm: a run outside Slurm records none."""

from __future__ import annotations

import os
from collections.abc import Mapping

from core.base.results import SlurmJob


def slurm_job(environ: Mapping[str, str] | None = None) -> SlurmJob | None:
    """The job this process runs in (SLURM_JOB_ID, SLURM_ARRAY_JOB_ID, SLURM_ARRAY_TASK_ID,
    SLURM_JOB_NODELIST, SLURM_JOB_PARTITION), or None outside Slurm. A variable Slurm left empty or
    spelt oddly (an array index that is no number) is left out, never a reason to fail the run."""
    env = os.environ if environ is None else environ
    job_id = env.get("SLURM_JOB_ID", "").strip()
    if not job_id:
        return None

    def text(*names: str) -> str | None:
        return next((value.strip() for name in names if (value := env.get(name, "")).strip()), None)

    task = text("SLURM_ARRAY_TASK_ID")
    return SlurmJob(
        job_id=job_id,
        array_job_id=text("SLURM_ARRAY_JOB_ID"),
        array_task_id=int(task) if task is not None and task.isdecimal() else None,
        nodelist=text("SLURM_JOB_NODELIST", "SLURM_NODELIST"),
        partition=text("SLURM_JOB_PARTITION"),
    )
