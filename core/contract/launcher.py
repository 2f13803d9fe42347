"""How the processes of a multi-process run are started: torchrun, poprun, and launchers to come.

A run whose replicas (or instances) live in processes of their own is started by a launcher.
core does the rest, the same for every launcher (core.running.launch): it writes the run's
configuration, runs the launcher's command under its supervisor (a session of its own that dies
with core, the time limit), reads the main process's result as it is rewritten after every
phase, and turns the command's exit into the result's status.

A launcher says only what differs: the command line that starts the processes, and how a started
process learns where it stands. Each started process rebuilds the launcher from its class path
(``module:QualifiedName``, see :func:`launcher_path`), so a launcher class must be importable and
constructible without arguments.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from core.base.distributed import ProcessContext
    from core.contract.context import RunContext


class Launcher(ABC):
    """Starts one run's processes, each running core's worker."""

    #: names the launcher in messages and statuses ("torchrun exited with code 1")
    name: ClassVar[str]

    @abstractmethod
    def command(self, context: RunContext, worker: Sequence[str], work: Path) -> list[str]:
        """The command line that starts the run's processes, each running ``worker``.

        :param worker: the argv of one process (``python -m core.running.worker ...``), to run as
            many times as the run needs, with whatever environment the launcher gives each.
        :param work: a private directory for the launcher's own files (logs); removed afterwards.
        """

    @abstractmethod
    def process_context(self, environ: Mapping[str, str]) -> ProcessContext:
        """In a started process: its rank, local rank and world size, from what the launcher set."""

    def work_parent(self, context: RunContext) -> Path | None:
        """Where the launch's work directory goes (its config, the main result): None for the
        system's temporary directory; a shared folder where processes on other hosts read it."""
        return None

    def killed_inside(self, output: str) -> bool:
        """Whether the launcher's output says one of its processes was killed by SIGKILL."""
        return "Signal 9" in output or "SIGKILL" in output


def class_path(cls: type) -> str:
    """``module:QualifiedName`` of a class, for a started process to import it again (:func:`load_class`)."""
    return f"{cls.__module__}:{cls.__qualname__}"


def load_class(path: str) -> object:
    """What :func:`class_path` named (ImportError, AttributeError where it names nothing)."""
    module_name, _, qualified_name = path.partition(":")
    target: object = importlib.import_module(module_name)
    for part in qualified_name.split("."):
        target = getattr(target, part)
    return target


def launcher_path(launcher: Launcher) -> str:
    """``module:QualifiedName`` of the launcher's class, for a started process to rebuild it."""
    return class_path(type(launcher))


def load_launcher(path: str) -> Launcher:
    """The launcher that :func:`launcher_path` named (raises ValueError if it names none)."""
    target = load_class(path)
    if not (isinstance(target, type) and issubclass(target, Launcher)):
        raise ValueError(f"{path} is not a Launcher class")
    return target()
