"""One torchrun worker: ``python -m core.worker CONFIG_JSON RESULT_JSON``.

Rank 0 rewrites RESULT_JSON atomically after every phase, so nothing measured is lost if a
process dies later.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from core.config import RunConfig
from core.distributed import ProcessContext
from core.planning import plan_run
from core.plugins import get_plugin_manager
from core.results import RunResult
from core.runner import execute


def write_atomically(path: Path, text: str) -> None:
    partial = path.with_suffix(path.suffix + ".partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


def main(argv: list[str]) -> int:
    config_path, result_path = Path(argv[0]), Path(argv[1])
    config = RunConfig.model_validate_json(config_path.read_text(encoding="utf-8"))
    options = config.model_dump(mode="json", exclude={"workload", "accelerator"})
    plan = plan_run(get_plugin_manager(), config.workload, config.accelerator, options)

    def save(result: RunResult) -> None:
        write_atomically(result_path, result.model_dump_json())

    result = execute(plan, ProcessContext.from_environment(), on_progress=save)
    return 0 if result.status.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
