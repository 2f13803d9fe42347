"""A single run in the results database: ``core run ... --database PATH`` and
``core.run(..., database=PATH)``.

A single run is stored in the same table as a sweep's runs, with no sweep, no cell key and no
repeat (NULL): it belongs to no grid and is no repeat of another run, so nothing can count it as
one; ``cell_label`` names what ran ("fcnn on cpu: micro_batch_size=64 precision=bf16"). Readers
find single runs with ``ResultStore.runs(single=True)``; ``core report`` shows them in a section
of their own, ``core results`` with ``-`` as their sweep.

The database is opened, checked and locked *before* the run (:class:`SingleRunDatabase`): a path
that is no usable database is a ConfigError naming it before any device is touched, and a sweep
that holds the database (:class:`~core.storage.store.SweepLock`) refuses the run rather than have
it measure beside the sweep; the run holds the lock until its result is stored, so a sweep started
meanwhile is refused in turn. A failed run is stored like any other, with its status and every
figure measured before the fault. A result the database refuses at the end is not lost: it comes
back in :class:`UnrecordedRunError`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from core.base.errors import ConfigError
from core.base.results import RunResult
from core.storage.store import DatabaseInUseError, ResultStore, StoreError, StoreWriteError, SweepLock

_LABEL_VALUE_CHARS = 60  # of one option's value in a single run's label
_LABEL_CHARS = 300
_PATH_ALLOWED = "the path of a results database file (str or os.PathLike), or None not to store the run"


class UnrecordedRunError(StoreWriteError):
    """The run finished but the database could not take its result; ``result`` is what it measured."""

    def __init__(self, message: str, result: RunResult) -> None:
        super().__init__(message)
        self.result = result


def database_path(database: object) -> Path:
    """``database`` as a path, or a ConfigError naming it: checked before any work."""
    if isinstance(database, bool) or not isinstance(database, (str, os.PathLike)):
        raise ConfigError("database", database, _PATH_ALLOWED)
    text = os.fspath(database)
    if not isinstance(text, str) or not text.strip() or "\x00" in text:
        raise ConfigError("database", database, _PATH_ALLOWED)
    return Path(text)


def _shown(value: Any) -> str:
    text = str(value)
    return text if len(text) <= _LABEL_VALUE_CHARS else text[: _LABEL_VALUE_CHARS - 3] + "..."


def run_label(workload: str, accelerator: str, options: Mapping[str, Any]) -> str:
    """What a single run ran, for people: ``fcnn on cpu: micro_batch_size=64 layers=8`` (the options
    given; those inside workload_options and accelerator_options by their own name)."""
    given: list[str] = []
    for name, value in options.items():
        if isinstance(value, Mapping):
            given += [f"{key}={_shown(item)}" for key, item in value.items()]
        else:
            given.append(f"{name}={_shown(getattr(value, 'value', value))}")
    label = f"{workload} on {accelerator}" + (f": {' '.join(given)}" if given else "")
    return label if len(label) <= _LABEL_CHARS else label[: _LABEL_CHARS - 3] + "..."


class SingleRunDatabase:
    """The database one run is stored in: opened, checked and locked when made, before the run.

        with SingleRunDatabase("results/core.db", "fcnn on cpu") as database:
            result = ...  # run
            database.record(result)

    :raises ConfigError: ``database`` is no usable results database (a directory, another
        application's file, a damaged or read-only one, a folder that cannot be made).
    :raises DatabaseInUseError: a sweep or another single run holds it.
    """

    def __init__(self, database: object, label: str) -> None:
        self.path = database_path(database)
        self.label = label
        try:
            self._store = ResultStore(self.path)
        except StoreError as error:
            raise ConfigError("database", str(self.path), str(error)) from None
        try:
            self._lock: SweepLock = self._store.lock(run=label)
        except DatabaseInUseError:
            self._store.close()
            raise
        except StoreError as error:  # the lock file cannot be made
            self._store.close()
            raise ConfigError("database", str(self.path), str(error)) from None
        except BaseException:
            self._store.close()
            raise

    def record(self, result: RunResult) -> int:
        """Store ``result`` (whatever its status) and return its row id.

        :raises UnrecordedRunError: the database refused it (a full disk); the error holds the result.
        """
        try:
            return self._store.add(result, cell_label=self.label)
        except StoreError as error:
            raise UnrecordedRunError(
                f"the run ended ({result.status.state.value}) but its result could not be recorded: {error}", result
            ) from None

    def close(self) -> None:
        try:
            self._lock.release()
        finally:
            self._store.close()

    def __enter__(self) -> SingleRunDatabase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
