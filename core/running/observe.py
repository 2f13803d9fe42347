"""Who watches a run: one observer interface, told of each event once, by the process that owns the run.

Events of one run (``core.run``, and each repeat of a sweep):

- :meth:`Observer.run_starting`: the run passed validation and its devices are about to be set up;
- :meth:`Observer.phase_ended`: a phase ended, with the result measured so far;
- :meth:`Observer.result_ready`: the run is over (successfully or not) and its result complete.

A sweep adds its own events (:class:`core.sweep.SweepObserver`). The plugins' lifecycle hooks
(``core_run_started``, ``core_result_ready``), ``core.run(on_progress=...)`` and the CLI's progress
displays are adapters of this interface, so each is told in the same places: the process that called
``core.run`` (or runs the sweep) tells them; a child process or a rank only writes what it measured,
which that process reads and passes on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from core.base.config import RunConfig
    from core.base.results import RunResult
    from core.contract.manager import PluginManager
    from core.running.step_progress import StepProgress


class Observer:
    """Whoever watches a run. Every method is a no-op: subclass it and implement the events you need."""

    def run_starting(self, config: RunConfig) -> None:
        """The run passed validation and is about to set up its devices.

        :param config: the validated configuration, ``micro_batch_size`` resolved.
        """

    def phase_ended(self, partial: RunResult) -> None:
        """A phase ended (setup, first step, warm-up, the window).

        :param partial: the result so far; a warning appended to ``partial.warnings`` is kept in the
            run's final result.
        """

    def steps_progress(self, progress: StepProgress) -> None:
        """Within a phase of many steps (the warm-up, the window): how many are done, about once a
        second (core.running.step_progress). Told from the step clock, never by waiting on the device."""

    def wants_steps_progress(self) -> bool:
        """Whether :meth:`steps_progress` does anything: where nothing listens, the runner counts no
        steps (a tiny model's step is tens of microseconds, and counting one costs a few tenths)."""
        return type(self).steps_progress is not Observer.steps_progress

    def result_ready(self, result: RunResult) -> None:
        """The run is over, successfully or not, and ``result`` is final (its status says how it ended)."""


class ObserverGroup(Observer):
    """Several observers told of each event in turn. A member may be any object with some of the
    events' methods (an older sweep observer, say): an event it has no method for passes it by."""

    def __init__(self, observers: Iterable[object | None] = ()) -> None:
        self.observers = [observer for observer in observers if observer is not None]

    def tell(self, event: str, *arguments: Any) -> None:
        for observer in self.observers:
            method = getattr(observer, event, None)
            if method is not None:
                method(*arguments)

    def run_starting(self, config: RunConfig) -> None:
        self.tell("run_starting", config)

    def phase_ended(self, partial: RunResult) -> None:
        self.tell("phase_ended", partial)

    def steps_progress(self, progress: StepProgress) -> None:
        self.tell("steps_progress", progress)

    def wants_steps_progress(self) -> bool:
        return any(_listens_to_steps(observer) for observer in self.observers)

    def result_ready(self, result: RunResult) -> None:
        self.tell("result_ready", result)


def _listens_to_steps(observer: object) -> bool:
    """An ObserverGroup member's interest in step progress: an Observer says; any other object
    listens where it has the method."""
    if isinstance(observer, Observer):
        return observer.wants_steps_progress()
    return callable(getattr(observer, "steps_progress", None))


class PluginHooks(Observer):
    """The plugins' lifecycle hooks as an observer: ``core_run_started`` and ``core_result_ready``.

    A hook implementation that raises is a warning on stderr (``core: warning: a run-started observer
    failed: ...``), never a changed run.
    """

    def __init__(self, manager: PluginManager) -> None:
        self._manager = manager

    def run_starting(self, config: RunConfig) -> None:
        from core.contract.manager import call_observers

        call_observers(lambda: self._manager.hook.core_run_started(config=config), "run-started")

    def result_ready(self, result: RunResult) -> None:
        from core.contract.manager import call_observers

        call_observers(lambda: self._manager.hook.core_result_ready(result=result), "result-ready")


ProgressCallback = Callable[["RunResult"], None]


class ProgressCallbackObserver(Observer):
    """``core.run(on_progress=callback)`` as an observer: the callback gets each phase's partial result.

    A callback that raises is the caller's problem, not a fault of a healthy run: it becomes a warning
    in the result (``on_progress callback failed: ...``, once per message). KeyboardInterrupt and
    SystemExit still propagate.
    """

    def __init__(self, callback: ProgressCallback) -> None:
        self._callback = callback

    def phase_ended(self, partial: RunResult) -> None:
        try:
            self._callback(partial)
        except Exception as exc:
            warning = f"on_progress callback failed: {type(exc).__name__}: {exc}"
            if warning not in partial.warnings:
                partial.warnings.append(warning)

    def wants_steps_progress(self) -> bool:
        return callable(getattr(self._callback, "steps_progress", None))

    def run_starting(self, config: RunConfig) -> None:
        """Passed on to the callback's own ``run_starting``, where it has one (the CLI's display says
        "setting up" once the configuration is valid, not before a refusal)."""
        method = getattr(self._callback, "run_starting", None)
        if method is None:
            return
        try:
            method(config)
        except Exception:  # noqa: S110 - a display's fault must not end the run
            pass

    def steps_progress(self, progress: StepProgress) -> None:
        """Passed on to the callback's own ``steps_progress``, where it has one (the CLI's display)."""
        method = getattr(self._callback, "steps_progress", None)
        if method is None:
            return
        try:
            method(progress)
        except Exception:  # noqa: S110 - told inside the timed window: a display's fault must not end the run
            pass


def tell_phase(observer: Observer, partial: RunResult, kept: list[str]) -> None:
    """Tell ``observer`` of a phase's partial result read from another process, keeping in ``kept``
    the warnings it added: the next read replaces ``partial``, and the final result must have them."""
    before = list(partial.warnings)
    observer.phase_ended(partial)
    kept.extend(warning for warning in partial.warnings if warning not in before and warning not in kept)


class ResultWriter(Observer):
    """Writes each phase's result to a file, whole (atomically), for the process that watches it: how
    a child process or a rank passes its phases to the process that owns the run."""

    def __init__(self, path: Path, what: str, steps_progress: bool = True) -> None:
        """:param steps_progress: whether the watching process reads the steps' progress (written
        beside ``path``); without it the run counts no steps."""
        self.path = path
        self.what = what
        self._steps_progress = steps_progress

    def phase_ended(self, partial: RunResult) -> None:
        self.save(partial)

    def steps_progress(self, progress: StepProgress) -> None:
        from core.running.step_progress import progress_path, write_progress

        write_progress(progress_path(self.path), progress)

    def wants_steps_progress(self) -> bool:
        return self._steps_progress

    def save(self, result: RunResult) -> None:
        from core.base.files import write_atomically

        write_atomically(self.path, result.model_dump_json(), self.what)
