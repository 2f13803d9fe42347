"""Job arrays for a cluster sweep: the pending repeats that ask Slurm for the same job go in one
``sbatch --array=0-N%T`` each, so a large grid is a few submissions instead of one per repeat.

Each repeat keeps its own folder, request and batch script (core.sweep.cluster.batch_script); an
array adds a folder of its own holding an index (line ``k + 1``: the folder of task ``k``, written
before sbatch is asked) and a small script that looks up ``SLURM_ARRAY_TASK_ID`` there, sends its
output to that folder and runs the repeat's script. Slurm names a task ``ARRAYID_TASK``; that is
the task's id in the ledger, so waiting, cancelling and recording work per task as per job.

Facts relied on (Slurm 22.05): ``scontrol show config`` prints ``MaxArraySize = N`` (task indices
0 to N - 1; 0 turns arrays off); ``sbatch --parsable --array=...`` prints the array's id;
``squeue`` and ``sacct`` list a started task as ``ARRAYID_TASK`` and the tasks still pending
together, as ``ARRAYID_[0-3,7%2]``; scancel, sacct and squeue take ``ARRAYID_TASK``.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import TypeVar

#: the tasks of one array where the cluster's MaxArraySize cannot be read (Slurm's default is 1001)
DEFAULT_MAX_ARRAY_SIZE = 1000
INDEX_NAME = "tasks.txt"
SCRIPT_NAME = "array.sh"
#: an array's folder in its sweep's folder (beside the repeats' cellN-repeatM-TOKEN)
ARRAY_FOLDER = re.compile(r"array-[0-9a-f]+")
_MAX_ARRAY_SIZE = re.compile(r"^\s*MaxArraySize\s*=\s*(\d+)\s*$", re.MULTILINE)
_ONE_ID = re.compile(r"\d+(_\d+)?")
_PENDING_TASKS = re.compile(r"(?P<job>\d+)_\[(?P<ranges>[0-9,\-]+)(%\d+)?\]")
_SCONTROL_TIMEOUT_SECONDS = 30.0

Item = TypeVar("Item")


def expand_job_ids(listed: str) -> list[str]:
    """The job ids squeue's ``%i`` or sacct's JobID stands for: ``123`` and ``123_4`` are
    themselves, ``123_[0-2,7%2]`` (an array's tasks still pending) is ``123_0 123_1 123_2 123_7``;
    anything else (``123.batch``, a garbled line) stands for none."""
    listed = listed.strip()
    if _ONE_ID.fullmatch(listed):
        return [listed]
    match = _PENDING_TASKS.fullmatch(listed)
    if match is None:
        return []
    tasks: list[str] = []
    for part in match.group("ranges").split(","):
        first, dash, last = part.partition("-")
        last = last if dash else first
        if not first.isdigit() or not last.isdigit():
            return []
        tasks += [f"{match.group('job')}_{task}" for task in range(int(first), int(last) + 1)]
    return tasks


def task_job_id(array_id: str, task: int) -> str:
    """Slurm's name for task ``task`` of array ``array_id``."""
    return f"{array_id}_{task}"


def array_job_id(job_id: str) -> str:
    """``123_4`` -> ``123``: the array a task id belongs to (a plain job's id is its own)."""
    return job_id.split("_", 1)[0]


def read_max_array_size(run: Callable[[list[str]], subprocess.CompletedProcess[str]] | None = None) -> int:
    """The cluster's MaxArraySize (``scontrol show config``): how many tasks one array may have, 0
    where arrays are turned off; :data:`DEFAULT_MAX_ARRAY_SIZE` where it cannot be read."""
    run = run or _run_scontrol
    try:
        shown = run(["scontrol", "show", "config"])
    except (OSError, subprocess.SubprocessError):
        return DEFAULT_MAX_ARRAY_SIZE
    match = _MAX_ARRAY_SIZE.search(shown.stdout) if shown.returncode == 0 else None
    return int(match.group(1)) if match else DEFAULT_MAX_ARRAY_SIZE


def _run_scontrol(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, capture_output=True, text=True, timeout=_SCONTROL_TIMEOUT_SECONDS, stdin=subprocess.DEVNULL
    )


def arrays_refused(message: str) -> bool:
    """Whether sbatch's refusal is about the array itself (arrays turned off, an index past
    MaxArraySize, a submit filter that takes no arrays): single jobs may then be taken."""
    return "array" in message.lower()


def array_option(tasks: int, throttle: int | None) -> str:
    """``--array=0-N`` for ``tasks`` tasks, ``%T`` added: at most ``throttle`` of them at once."""
    return f"--array=0-{tasks - 1}" + (f"%{throttle}" if throttle is not None else "")


def in_arrays(items: Sequence[Item], same_job: Callable[[Item], Hashable], largest: int) -> list[list[Item]]:
    """``items`` in groups of at most ``largest`` that ask for the same job (``same_job``: its
    sbatch options), in their order; a group of one is a single job."""
    groups: dict[Hashable, list[Item]] = {}
    for item in items:
        groups.setdefault(same_job(item), []).append(item)
    size = max(1, largest)
    return [group[start : start + size] for group in groups.values() for start in range(0, len(group), size)]


def write_array_folder(folder: Path, task_folders: Sequence[Path], directives: Sequence[str] = ()) -> Path:
    """The index of an array's tasks and its script, in ``folder``; returns the script.

    The index holds each task's folder by its name in the sweep's folder (``cellN-repeatM-TOKEN``:
    one line, whatever the jobs directory's path holds); the script knows that folder.
    ``directives``: the site file's ``#SBATCH`` lines, which sbatch reads from the script it is
    given (the array's) and not from the repeat's job.sh that each task runs.
    """
    sweep_folder = folder.parent
    assert all(task.parent == sweep_folder for task in task_folders), "the repeats' folders are in the sweep's"
    index = folder / INDEX_NAME
    index.write_text("".join(f"{task.name}\n" for task in task_folders), encoding="utf-8")
    script = folder / SCRIPT_NAME
    # surrogateescape: a folder's bytes that are not UTF-8 are written back as they were
    script.write_text(array_script(sweep_folder, index, directives), encoding="utf-8", errors="surrogateescape")
    return script


def array_script(sweep_folder: Path, index: Path, directives: Sequence[str] = ()) -> str:
    """The array's script: task ``SLURM_ARRAY_TASK_ID`` finds its repeat's folder in ``index``,
    writes its output there (``slurm-ARRAYID_TASK.out``, as a single job's ``slurm-JOBID.out``)
    and runs the repeat's own batch script."""
    return (
        "#!/bin/bash\n"
        "# A job array of a core sweep (core/sweep/slurm_arrays.py): each task runs one repeat's job.sh.\n"
        + "".join(f"{line}\n" for line in directives)
        + f'name=$(sed -n "$(( SLURM_ARRAY_TASK_ID + 1 ))p" {shlex.quote(str(index))})\n'
        'if [ -z "$name" ]; then echo "core: task $SLURM_ARRAY_TASK_ID is not in the array\'s index" >&2; exit 2; fi\n'
        f'folder={shlex.quote(str(sweep_folder))}/"$name"\n'
        'exec > "$folder/slurm-${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}.out" 2>&1\n'
        'cd "$folder" || exit 2\n'
        'exec /bin/bash "$folder/job.sh"\n'
    )


def abridged(described: Sequence[str]) -> list[str]:
    """Jobs as a person reads them, each array's tasks together as Slurm writes them (``123_[0-2,7]``,
    which scancel takes): ``["9", "123_0", "123_1", "123_2", "123_7"]`` -> ``["9", "123_[0-2,7]"]``.
    Anything else (a job sbatch gave no id) is kept once, in its place."""
    tasks: dict[str, list[int]] = {}
    order: list[tuple[str, bool]] = []  # (text, is an array's id)
    for text in described:
        array, underscore, task = text.partition("_")
        if underscore and array.isdigit() and task.isdigit():
            if array not in tasks:
                tasks[array] = []
                order.append((array, True))
            tasks[array].append(int(task))
        elif (text, False) not in order:
            order.append((text, False))
    return [f"{text}_{_task_ranges(tasks[text])}" if is_array else text for text, is_array in order]


def _task_ranges(tasks: list[int]) -> str:
    """``[0, 1, 2, 7]`` -> ``[0-2,7]``; one task alone -> ``3``."""
    ordered = sorted(set(tasks))
    if len(ordered) == 1:
        return str(ordered[0])
    runs: list[list[int]] = []
    for task in ordered:
        if runs and task == runs[-1][1] + 1:
            runs[-1][1] = task
        else:
            runs.append([task, task])
    return "[" + ",".join(f"{first}-{last}" if first != last else str(first) for first, last in runs) + "]"
