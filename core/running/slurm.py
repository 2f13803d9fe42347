"""The Slurm allocation this process runs in, as its environment describes it: for launching a
multi-node run (:class:`SlurmAllocation`) and for recording where a run ran (:func:`slurm_job`).

Slurm sets ``SLURM_JOB_ID``, ``SLURM_JOB_NUM_NODES`` and ``SLURM_JOB_NODELIST`` (a compressed host
list such as ``node[01-04]``) in every step of a job (sbatch, salloc, srun); ``scontrol show
hostnames`` expands the list, Slurm's own parser rather than ours. A multi-node run inside an
allocation starts one torchrun agent per node with ``srun`` and takes the first node as its
rendezvous.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from core.base.results import SlurmJob

#: torchrun's own default rendezvous port
DEFAULT_RENDEZVOUS_PORT = 29500


@dataclass(frozen=True)
class SlurmAllocation:
    job_id: str
    node_count: int
    nodelist: str  # compressed, as Slurm sets it

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> SlurmAllocation | None:
        """The allocation this process is in, or None outside Slurm."""
        env = os.environ if environ is None else environ
        job_id = env.get("SLURM_JOB_ID")
        count = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES")
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        if not job_id or not count or not count.isdigit() or not nodelist:
            return None
        return cls(job_id=job_id, node_count=int(count), nodelist=nodelist)

    def hostnames(self) -> list[str]:
        """The allocation's hosts, in Slurm's order (``scontrol show hostnames``)."""
        scontrol = shutil.which("scontrol")
        if scontrol is None:
            raise RuntimeError("scontrol is not on PATH: cannot expand SLURM_JOB_NODELIST")
        listed = subprocess.run(
            [scontrol, "show", "hostnames", self.nodelist], capture_output=True, text=True, check=True, timeout=30
        )
        return listed.stdout.split()

    def rendezvous(self, port: int = DEFAULT_RENDEZVOUS_PORT) -> str:
        """The first node, where every node's torchrun agent meets."""
        return f"{self.hostnames()[0]}:{port}"


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
