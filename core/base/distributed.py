"""Where this process stands in a multi-process run (as torchrun describes it in the environment)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class ProcessContext:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0  # torchrun's GROUP_RANK: which node (agent) of a multi-node run
    #: every process reads a meter of its own devices (poprun's instances: each its IPUs), rather
    #: than one process per node reading the node's
    meter_per_process: bool = False
    #: a folder every process of the run can write, for gathering without a process group
    exchange_dir: str | None = None

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def reads_node_meter(self) -> bool:
        """One rank per node reads the node's meters, so energy is never counted twice; or every
        process its own devices' meter, where the launcher says so."""
        return self.meter_per_process or self.local_rank == 0

    @property
    def meter_readers_gathered(self) -> bool:
        """Whether the run's energy is several processes' readings, to be gathered and summed."""
        return self.is_distributed and (self.meter_per_process or self.world_size > self.local_world_size)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> ProcessContext:
        """torchrun sets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE and GROUP_RANK for each worker."""
        env = os.environ if environ is None else environ
        return cls(
            rank=int(env.get("RANK", 0)),
            local_rank=int(env.get("LOCAL_RANK", 0)),
            world_size=int(env.get("WORLD_SIZE", 1)),
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", 1)),
            node_rank=int(env.get("GROUP_RANK", 0)),
        )


SINGLE_PROCESS = ProcessContext()


def release_finished_collectives(timeout_seconds: float = 5.0) -> None:
    """Wait until communication threads have let go of the Python objects finished collectives hold.

    Call it when a process's last collective is done, before the interpreter can exit. The
    abort it prevents (torch 2.13, gloo, CPython 3.11): ``backward()`` stashes a
    ``contextvars.Context`` in thread-local state, and DDP's gradient all-reduce, launched inside
    backward, captures that state. gloo's worker thread drops the finished operation, and with it
    the last reference to the Context, only after the caller has moved on; the decref needs the
    GIL. If by then the interpreter is finalizing, CPython ends the thread with a forced unwind
    through a noexcept destructor and the process dies of SIGABRT ("terminate called without an
    active exception"). Destroying the process group does not help: gloo joins its threads only
    when the group object is freed, which is at interpreter teardown.

    This finds such Contexts (held by nothing in Python and not this thread's own) and sleeps,
    the GIL released, until only this function holds them, then frees them here. Nothing is
    waited for when no collective is in flight; ``timeout_seconds`` bounds the wait otherwise.
    """
    import contextvars
    import gc
    import types

    own: contextvars.ContextVar[bool] = contextvars.ContextVar("core_own_context")
    token = own.set(True)  # marks this thread's current Context, which is never released
    try:
        found = [item for item in gc.get_objects() if type(item) is contextvars.Context and own not in item]
    finally:
        own.reset(token)
    if not found:
        return
    held: list[contextvars.Context] = []
    for context in found:
        # A Context some Python object refers to is not a finished collective's: not waited for.
        if all(referrer is found or isinstance(referrer, types.FrameType) for referrer in gc.get_referrers(context)):
            held.append(context)
    del found, context
    if not held:
        return
    held.append(contextvars.Context())  # held by the list alone: its count is what "nobody else" reads
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        counts = [sys.getrefcount(item) for item in held]
        if all(count <= counts[-1] for count in counts):
            break
        time.sleep(0.002)  # the GIL is free for the thread that releases them
    del held
