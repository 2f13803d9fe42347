"""Helpers for plugins that drive a vendor's C library through Python bindings."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class SharedLibrarySession:
    """Initialise a vendor library once for every overlapping user, shut it down after the last.

    NVML and amdsmi each keep one library-wide state: a meter and a device listing that overlap
    must not shut it down under each other (amdsmi's init is not reference counted at all).
    """

    def __init__(self, start: Callable[[], Any], stop: Callable[[Any], None]) -> None:
        """:param start: imports and initialises the library, returning the module.
        :param stop: shuts it down; exceptions it raises are ignored."""
        self._start, self._stop = start, stop
        self._lock = threading.Lock()
        self._users = 0
        self._library: Any = None

    @property
    def users(self) -> int:
        """Sessions open now (tests check none is left open)."""
        return self._users

    @contextmanager
    def __call__(self) -> Iterator[Any]:
        with self._lock:
            if self._users == 0:
                self._library = self._start()
            self._users += 1
            library = self._library
        try:
            yield library
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    try:
                        self._stop(library)
                    except Exception:  # a failing shut-down must not mask the work's own outcome
                        pass
