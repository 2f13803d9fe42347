"""One torchrun worker: ``python -m core.worker CONFIG_JSON RESULT_JSON``.

Rank 0 rewrites RESULT_JSON atomically after every phase, so nothing measured is lost if a
process dies later; the launcher reads it as it changes.

A worker ends with its agent (torchrun's, under ``python -m core.processes``): the kernel kills it
when the agent dies, whatever killed the agent. It ends without interpreter finalization
(:func:`core.processes.exit_now`): gloo's threads may still be releasing the last collective.
"""

from __future__ import annotations

import signal
import sys
import traceback
from pathlib import Path

from core import processes
from core.config import RunConfig
from core.distributed import ProcessContext
from core.files import write_atomically
from core.planning import plan_run
from core.plugins import get_plugin_manager
from core.results import RunResult
from core.runner import execute


def main(argv: list[str]) -> int:
    # A worker holds nothing to clean up: SIGKILL, so one stuck in a collective ends too.
    processes.die_with_parent(sig=signal.SIGKILL)
    config_path, result_path = Path(argv[0]), Path(argv[1])
    config = RunConfig.model_validate_json(config_path.read_text(encoding="utf-8"))
    options = config.model_dump(mode="json", exclude={"workload", "accelerator"})
    plan = plan_run(get_plugin_manager(), config.workload, config.accelerator, options)

    def save(result: RunResult) -> None:
        write_atomically(result_path, result.model_dump_json(), "the worker's result")

    result = execute(plan, ProcessContext.from_environment(), on_progress=save)
    return 0 if result.status.ok else 1


if __name__ == "__main__":
    try:
        code = main(sys.argv[1:])
    except KeyboardInterrupt:
        code = 128 + signal.SIGINT
    except SystemExit as request:
        code = processes.exit_code(request)
    except BaseException:
        traceback.print_exc()
        code = 1
    processes.exit_now(code)
