"""A simulated Slurm for the cluster sweep's tests: injected as core.sweep.cluster.make_scheduler,
its jobs end when a test says, leaving the files a real job leaves, and its clock moves only when the
sweep sleeps. No Slurm, no waiting."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from core.base.config import RunConfig
from core.base.results import RunResult, RunState, Status
from core.sweep.cluster import ENDED_NAME
from core.sweep.slurm_arrays import INDEX_NAME
from core.sweep.slurm_jobs import ACTIVE_STATES, SlurmError


class SimulatedSlurm:
    """Answers as sbatch, sacct and scancel would; ``on_poll`` runs before each answer (jobs end there).

    A job array (``--array=0-N%T``) is a job per task, ``ARRAYID_TASK``, whose folder is the one the
    array's index names (core.sweep.slurm_arrays), as the array's script finds it.
    """

    def __init__(self, refuse_submission: int | None = None, max_array_size: int = 1001) -> None:
        self.jobs: dict[str, dict[str, Any]] = {}
        self.submissions: list[dict[str, Any]] = []  # every sbatch: its job name, options and id
        self.array_size = max_array_size  # the cluster's MaxArraySize
        self.refuse_arrays = False  # sbatch refuses every --array, as a cluster that turned them off
        self.cancelled: list[str] = []
        self.polls = 0
        self.clock = 1_000_000.0
        self.refuse_submission = refuse_submission  # the n-th sbatch (1-based) is refused
        #: the n-th sbatch (1-based) submits its job, then its answer is lost: this is raised instead
        #: (KeyboardInterrupt: Ctrl-C while sbatch answered; SlurmError: sbatch timed out)
        self.lose_answer: dict[int, BaseException] = {}
        self.find_fails = False  # squeue cannot be asked for a job by its name
        self.on_submit: Callable[[SimulatedSlurm, int], None] = lambda slurm, number: None
        self.on_poll: Callable[[SimulatedSlurm, int], None] = lambda slurm, poll: None

    def submit(self, script: Path, options: Sequence[str], *, job_name: str, log: str, directory: Path) -> str:
        number = len(self.submissions) + 1
        self.on_submit(self, number)
        array = next((option.split("=", 1)[1] for option in options if option.startswith("--array=")), None)
        if array is not None and self.refuse_arrays:
            raise SlurmError("sbatch refused the job: sbatch: error: Invalid job array specification", refused=True)
        if self.refuse_submission is not None and number == self.refuse_submission:
            raise SlurmError("sbatch refused the job: sbatch: error: invalid partition specified: nope", refused=True)
        job_id = str(100 + len(self.jobs))
        self.submissions.append({"name": job_name, "options": list(options), "id": job_id})
        if array is None:
            assert script.parent == directory and (directory / "request.json").exists()
            self.jobs[job_id] = {
                "folder": directory,
                "name": job_name,
                "log": log,
                "state": "PENDING",
                "options": options,
            }
        else:
            tasks = (directory / INDEX_NAME).read_text().split()
            assert array.split("%")[0] == f"0-{len(tasks) - 1}" and len(tasks) <= self.array_size, array
            for task, folder_name in enumerate(tasks):
                folder = directory.parent / folder_name
                assert (folder / "request.json").exists() and (folder / "job.sh").exists()
                self.jobs[f"{job_id}_{task}"] = {
                    "folder": folder,
                    "array_folder": directory,
                    "name": job_name,
                    "log": log,
                    "state": "PENDING",
                    "options": options,
                }
        if number in self.lose_answer:
            raise self.lose_answer[number]
        return job_id

    def find(self, job_name: str, directory: Path) -> list[str]:
        if self.find_fails:
            raise SlurmError("squeue failed: slurm_load_jobs error: Unable to contact slurm controller")
        found = []
        for job_id, job in self.jobs.items():
            if job["name"] == job_name and job.get("array_folder", job["folder"]) == directory:
                found.append(job_id.split("_")[0])  # squeue's %F: an array's id
        return list(dict.fromkeys(found))

    def states(self, job_ids: Sequence[str]) -> dict[str, str | None]:
        self.polls += 1
        assert self.polls <= 50, "the sweep went on polling jobs that the test never ends"  # a hang guard
        self.on_poll(self, self.polls)
        return {job_id: self.jobs[job_id]["state"] for job_id in job_ids}

    def pending_reasons(self, job_ids: Sequence[str]) -> dict[str, str]:
        """squeue's reason for each pending job: a job's ``reason`` (set by a test), else Priority."""
        return {
            job_id: self.jobs[job_id].get("reason", "Priority")
            for job_id in job_ids
            if self.jobs[job_id]["state"] == "PENDING"
        }

    def cancel(self, job_ids: Sequence[str]) -> None:
        self.cancelled += job_ids
        for job_id in job_ids:
            if self.jobs[job_id]["state"] in ACTIVE_STATES:
                self.jobs[job_id]["state"] = "CANCELLED"

    def now(self) -> float:
        return self.clock

    def max_array_size(self) -> int:
        return self.array_size

    def sleep(self, seconds: float) -> None:
        self.clock += seconds

    def job(self, cell: int, repeat: int) -> str:
        """The id of cell ``cell``'s repeat ``repeat`` (both 1-based), as the sweep named its job."""
        return next(
            job_id for job_id, job in self.jobs.items() if job["folder"].name.startswith(f"cell{cell}-repeat{repeat}-")
        )

    def end(self, job_id: str, state: str, *, result: str | None = None, exit_code: int | None = None) -> None:
        """End a job in ``state``, leaving what its worker wrote: a partial result (setup measured),
        a whole one with status ``result``, the batch script's exit record."""
        job = self.jobs[job_id]
        folder: Path = job["folder"]
        request = json.loads((folder / "request.json").read_text())
        options = dict(request["options"])
        config = RunConfig(**options)
        measured = RunResult.of_config(config, world_size=1)
        measured.setup_seconds = float(job_id)  # each job's own figure: a mix-up would show
        (folder / "result.json.partial").write_text(measured.model_dump_json())
        if result is not None:
            measured.status = Status(state=RunState(result), phase="window", message="the worker's own account")
            measured.throughput_per_second = 10.0 if result == "ok" else None
            (folder / "result.json").write_text(measured.model_dump_json())
        if exit_code is not None:
            (folder / ENDED_NAME).write_text(json.dumps({"exit_code": exit_code, "seconds": 2.5}))
        (folder / f"slurm-{job_id}.out").write_text(f"job {job_id}'s output\n")
        job["state"] = state


def simulated_sweep_file(tmp_path: Path, *, cells: int, repeats: int, slurm_table: str = "") -> Path:
    """A sweep file of ``cells`` tiny CPU cells (2, 3, ... steps) of ``repeats`` each, for a simulated
    Slurm (``poll_seconds = 5`` of its clock); ``slurm_table``: more lines of its ``[slurm]`` table."""
    steps = ", ".join(str(2 + index) for index in range(cells))
    path = tmp_path / "sim.toml"
    path.write_text(
        f'name = "sim"\nrepeats = {repeats}\ntimeout_seconds = 60\n[grid]\nworkload = "fcnn"\n'
        f'accelerator = "cpu"\nsteps = [{steps}]\nmicro_batch_size = 4\n'
        "workload_options = {layers = 1, hidden_width = 8}\n"
        f"[slurm]\npoll_seconds = 5\n{slurm_table}"
    )
    return path
