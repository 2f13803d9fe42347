"""Child processes that cannot outlive the process that started them, and one reading of how they ended.

Every process core starts (a sweep's cell, torchrun's agent, torchrun's workers) is supervised
the same way:

* :func:`start` puts the child in a session of its own, so the whole tree below it can be
  stopped as one group and a terminal's Ctrl-C reaches only the parent, which then stops the
  child in order. The child learns its parent's pid from ``$CORE_PARENT_PID``.
* :func:`die_with_parent`, called first thing in the child, makes the kernel send it a signal
  when the parent dies, ``kill -9`` included (Linux ``prctl(PR_SET_PDEATHSIG)``; elsewhere a
  watchdog thread that polls ``getppid``).
* :func:`stop_process_group` ends a child's group: SIGTERM, a grace period, then SIGKILL. Callers
  use it in ``finally``, so every exit path (normal, exception, Ctrl-C, SIGTERM under
  :func:`sigterm_exits`) stops the children.
* :func:`work_directory` is a temporary directory that is always removed; one abandoned by a
  process that was killed is removed by the next one, or by the orphaned child
  (``python -m core.running.processes --remove-when-orphaned DIR -m MODULE ...``, see :func:`main`).

:func:`phase_after`, :func:`exit_status` and :func:`timeout_status` turn what is known when a
child ends without a result into the run's Status, in the same words for a sweep cell and for
a torchrun launch.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from core.base.results import RunResult, RunState, Status

PARENT_PID_VARIABLE = "CORE_PARENT_PID"  # the pid of the process that started this one (see start)
STOP_GRACE_SECONDS = 10.0  # between SIGTERM and SIGKILL when a child's group is stopped
OUTPUT_TAIL_CHARS = 4000  # how much of a failed child's output a status quotes
_KILL_WAIT_SECONDS = 30.0
_WATCHDOG_INTERVAL_SECONDS = 1.0  # where prctl is missing: how often a child checks its parent
_PR_SET_PDEATHSIG = 1
_OWNER_FILE = ".owner"


# --- what a child's end means -----------------------------------------------------------------


_PHASE_AFTER = (
    ("window_seconds", "teardown"),
    ("warmup_seconds", "window"),
    ("first_step_seconds", "warmup"),
    ("setup_seconds", "first_step"),
)


def phase_after(result: RunResult) -> str:
    """The phase a run was in when it stopped: the one after the last it completed."""
    for field, following in _PHASE_AFTER:
        if getattr(result, field) is not None:
            return following
    return "setup"


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # a real-time signal has no name
        return f"signal {number}"


_OUTPUT_LABEL = "Output tail:"


def describe_output(output: str) -> str:
    """The tail of what a child printed, for a status message (:func:`summary_line` leaves it out)."""
    tail = output[-OUTPUT_TAIL_CHARS:].strip()
    return f"{_OUTPUT_LABEL}\n{tail}" if tail else "The process printed nothing."


def summary_line(message: str) -> str:
    """A status message's first line, for a one-line account of a run: without the label of the
    output tail that :func:`describe_output` puts after it (the tail itself is on the lines below)."""
    first = (message.strip().splitlines() or [""])[0]
    return first.removesuffix(_OUTPUT_LABEL).rstrip()


_OOM_HINT = " (the kernel's out-of-memory killer sends SIGKILL)"


def exit_status(
    returncode: int,
    *,
    process: str,
    phase: str,
    output: str = "",
    killed_inside: bool = False,
    ended: str = "without a result",
) -> Status:
    """How a child that failed is recorded.

    :param returncode: as ``Popen.returncode`` gives it (negative: killed by that signal).
    :param process: what the child was, as the message names it ("the cell's process", "torchrun").
    :param phase: the phase the run was in (see :func:`phase_after`).
    :param output: what the child printed; its tail goes into the message.
    :param killed_inside: the child exited by itself but reports that a process below it was
        killed with SIGKILL (torchrun does so for a worker); recorded as killed, not as an error.
    :param ended: what the message says after the exit code.
    """
    text = describe_output(output)
    if returncode < 0:
        killed = -returncode == signal.SIGKILL
        return Status(
            state=RunState.killed if killed else RunState.error,
            phase=phase,
            error_type="ProcessKilled",
            message=f"{process} was killed by {signal_name(-returncode)}{_OOM_HINT if killed else ''}. {text}",
        )
    if killed_inside:
        return Status(
            state=RunState.killed,
            phase=phase,
            error_type="ProcessKilled",
            message=f"{process} exited with code {returncode}: a process below it was killed by "
            f"SIGKILL{_OOM_HINT}. {text}",
        )
    if returncode == 128 + signal.SIGINT:
        ended = f"{ended} (interrupted)"
    return Status(
        state=RunState.error,
        phase=phase,
        error_type="ProcessFailed",
        message=f"{process} exited with code {returncode} {ended}. {text}",
    )


def timeout_status(timeout_seconds: float, *, phase: str, output: str = "", limit: str = "the time limit") -> Status:
    return Status(
        state=RunState.timeout,
        phase=phase,
        error_type="Timeout",
        message=f"no result after {timeout_seconds:g} s ({limit}); the processes were stopped. "
        f"{describe_output(output)}",
    )


def exit_code(request: SystemExit) -> int:
    """The status a SystemExit asks for; a message is printed as the interpreter would."""
    if request.code is None or isinstance(request.code, int):
        return request.code or 0
    print(request.code, file=sys.stderr)
    return 1


# --- the child's side -----------------------------------------------------------------------------


def _set_parent_death_signal(sig: int) -> bool:
    """Ask Linux to send ``sig`` to this process when its parent dies; False where that is impossible."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent_pid: int, sig: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(_WATCHDOG_INTERVAL_SECONDS)
    # The parent is gone. Only a group this process leads (start() makes it so) is ours to stop.
    if os.getpgid(0) == os.getpid():
        os.killpg(os.getpid(), sig)
    os.kill(os.getpid(), sig)


def expected_parent() -> int | None:
    """The parent pid :func:`start` recorded in the environment, or None."""
    try:
        return int(os.environ[PARENT_PID_VARIABLE])
    except (KeyError, ValueError):
        return None


def die_with_parent(parent_pid: int | None = None, sig: int = signal.SIGTERM) -> None:
    """Make this process receive ``sig`` when its parent dies, ``kill -9`` of the parent included.

    :param parent_pid: the parent this process must not outlive (default: ``$CORE_PARENT_PID``,
        else the current parent). If it is already gone, ``sig`` comes at once.
    :param sig: SIGTERM for a process with children or files to clean up (it must end on it),
        SIGKILL for one that has nothing to clean.

    Linux ties the signal to the parent *thread* that started this process: the parent must
    start children from a thread that outlives them (core does: it waits for them there).
    """
    parent = parent_pid or expected_parent() or os.getppid()
    if parent_pid is None and parent != os.getppid() and _alive(parent):
        parent = os.getppid()  # $CORE_PARENT_PID was inherited from further up: not ours
    if not _set_parent_death_signal(sig):
        threading.Thread(target=_watch_parent, args=(parent, sig), name="parent-watchdog", daemon=True).start()
    if os.getppid() != parent:  # the parent died before the kernel was told to watch it
        os.kill(os.getpid(), sig)


def exit_now(code: int) -> None:
    """End this process at once with ``code``, without interpreter finalization.

    For processes that ran collectives: a C++ communication thread (gloo's) can still be
    releasing a finished operation that holds a Python object; if the interpreter is finalizing
    when it asks for the GIL, CPython ends that thread with a forced unwind and the C++ runtime
    aborts the process ("terminate called without an active exception", SIGABRT). Everything
    the process owed its caller must be written before this call.
    """
    remove_generated_sources()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    os._exit(code)


#: The module names TensorFlow's autograph gives the sources it writes to $TMPDIR (one per
#: converted function), which only an atexit handler of its own removes.
GENERATED_SOURCE_PREFIX = "__autograph_generated_file"


def remove_generated_sources() -> None:
    """Remove the Python sources TensorFlow's autograph wrote to the temporary folder for this
    process: a process that ends without running atexit handlers (:func:`exit_now`) left one
    ``__autograph_generated_file*.py`` in $TMPDIR per converted function, run after run."""
    temporary = os.path.realpath(tempfile.gettempdir())
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if name.startswith(GENERATED_SOURCE_PREFIX) and isinstance(path, str):
            if os.path.dirname(os.path.realpath(path)) == temporary:
                with contextlib.suppress(OSError):
                    os.remove(path)


# --- the parent's side ----------------------------------------------------------------------------


class Terminated(SystemExit):
    """SIGTERM arrived while :func:`sigterm_exits` was active: the process exits, cleaning up first."""

    def __init__(self) -> None:
        super().__init__(128 + signal.SIGTERM)


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated()


@contextlib.contextmanager
def sigterm_exits() -> Iterator[None]:
    """Inside the block, SIGTERM raises :class:`Terminated` (a SystemExit with code 143), so every
    ``finally`` below (children stopped, temporary files removed) runs before the process ends.

    Only where SIGTERM would otherwise kill the process outright (its default action) and only in
    the main thread; a handler the program installed itself is left alone.
    """
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return

    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


class ChildProcess(Protocol):
    """What supervision needs of a child: a ``subprocess.Popen``, or a run forked by a fork server
    (core.running.forkserver), which is not this process's child and so cannot be a Popen."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | Any: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


class ChildStarter(Protocol):
    """Starts a supervised child otherwise than as a fresh interpreter (a fork server)."""

    def start(self, command: Sequence[str], output: IO[bytes]) -> ChildProcess:
        """Start ``command`` as :func:`start` would (a session of its own, its parent's pid in
        ``$CORE_PARENT_PID``), both its output streams in ``output``."""
        ...


def start(
    command: Sequence[str],
    *,
    stdout: IO[Any] | int | None = None,
    stderr: IO[Any] | int | None = None,
    env: dict[str, str] | None = None,
    pass_fds: Sequence[int] = (),
) -> subprocess.Popen[bytes]:
    """Start ``command`` in a session of its own, its parent pid in ``$CORE_PARENT_PID``.

    The caller must stop it with :func:`stop_process_group` on every path (a ``finally``).
    """
    return subprocess.Popen(
        list(command),
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
        env=child_environment(env),
        start_new_session=True,
        pass_fds=tuple(pass_fds),
    )


def child_environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment :func:`start` gives a child: ``env`` (default: this process's), with this
    process's pid in ``$CORE_PARENT_PID`` and unbuffered Python output."""
    environment = dict(os.environ if env is None else env)
    environment[PARENT_PID_VARIABLE] = str(os.getpid())
    environment.setdefault("PYTHONUNBUFFERED", "1")
    return environment


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_process_group(process: ChildProcess, grace_seconds: float = STOP_GRACE_SECONDS) -> None:
    """SIGTERM the group ``process`` leads, SIGKILL what remains after ``grace_seconds``.

    Harmless on a process that already ended (what it left in its group is killed). A second
    Ctrl-C during the grace period skips to SIGKILL.
    """
    if process.poll() is None:
        _signal_group(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=grace_seconds)
        except subprocess.TimeoutExpired:
            pass
        except BaseException:
            _signal_group(process.pid, signal.SIGKILL)
            raise
    # The leader is gone or past its grace: anything left in the group gets the same end.
    _signal_group(process.pid, signal.SIGKILL)
    try:
        process.wait(timeout=_KILL_WAIT_SECONDS)
    except subprocess.TimeoutExpired:
        pass


@dataclass(frozen=True)
class Supervised:
    """How a supervised child ended."""

    returncode: int  # negative: the signal that ended it
    timed_out: bool
    seconds: float


def supervise(
    command: Sequence[str],
    log_path: Path,
    *,
    timeout_seconds: float | None = None,
    on_wait: Callable[[float], None] | None = None,
    poll_seconds: float = 0.5,
    grace_seconds: float = STOP_GRACE_SECONDS,
    clock: Callable[[], float] = time.monotonic,
    starter: ChildStarter | None = None,
) -> Supervised:
    """Run ``command`` (:func:`start`) with its output in ``log_path`` and wait for it to end.

    Every ``poll_seconds`` it calls ``on_wait(elapsed)``, and past ``timeout_seconds`` it stops
    waiting. On every way out (the end, the time limit, an exception such as Ctrl-C, an
    ``on_wait`` that raises) the child's whole process group is stopped.

    :param starter: starts the child instead of :func:`start` (a fork server); the time limit,
        the grace period and the group stop are the same either way. The limit counts from the
        child's start: how long the starter may wait before it (for a fork server's answer) is
        the starter's to bound.
    """
    timed_out = False
    with open(log_path, "wb") as log:
        process: ChildProcess = (
            start(command, stdout=log, stderr=subprocess.STDOUT) if starter is None else starter.start(command, log)
        )
        # The limit counts from the child's start: a starter's own wait (a fork server's, bounded
        # by the starter) is not the child's time.
        started = clock()
        try:
            while True:
                try:
                    process.wait(timeout=poll_seconds)
                    break
                except subprocess.TimeoutExpired:
                    pass
                elapsed = clock() - started
                if timeout_seconds is not None and elapsed > timeout_seconds:
                    timed_out = True
                    break
                if on_wait is not None:
                    on_wait(elapsed)
        finally:
            stop_process_group(process, grace_seconds)
    # A child still there after SIGKILL's wait (stuck in the kernel) is reported as killed.
    returncode = process.returncode if process.returncode is not None else -signal.SIGKILL
    return Supervised(returncode=returncode, timed_out=timed_out, seconds=clock() - started)


def guarded_command(command: Sequence[str], remove_when_orphaned: Path | None = None) -> list[str]:
    """``command`` run under :func:`main`: it dies with its parent and, orphaned, removes
    ``remove_when_orphaned``. A ``python -m MODULE ARGS`` command (this interpreter) runs MODULE in
    the guard's own process; any other program runs as the guard's child."""
    guard = [sys.executable, "-m", "core.running.processes"]
    if remove_when_orphaned is not None:
        guard += ["--remove-when-orphaned", str(remove_when_orphaned)]
    if list(command[:2]) == [sys.executable, "-m"]:
        return guard + list(command[1:])
    return guard + ["--", *command]


# --- temporary directories ----------------------------------------------------------------------

#: how the name of every work directory core makes begins (then what it is for: "core-sweep-", ...)
WORK_DIRECTORY_PREFIX = "core-"


def _start_time(pid: int) -> str | None:
    """When ``pid`` started (Linux clock ticks since boot), to tell a live owner from a reused pid."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner_is_gone(directory: Path) -> bool:
    try:
        host, pid_text, started = (directory / _OWNER_FILE).read_text(encoding="utf-8").split("\n")[:3]
        pid = int(pid_text)
    except (OSError, ValueError):
        return False  # not ours, or still being created: leave it
    if host != socket.gethostname():
        return False  # a /tmp shared with another machine or container
    if not _alive(pid):
        return True
    now = _start_time(pid)
    return started != "" and now is not None and now != started


def remove_abandoned(prefix: str, parent: Path | None = None) -> list[Path]:
    """Remove the work directories named ``prefix*`` whose owner process is dead; returns them."""
    removed = []
    for candidate in Path(parent or tempfile.gettempdir()).glob(f"{prefix}*"):
        try:
            if not candidate.is_dir() or candidate.is_symlink() or candidate.stat().st_uid != os.getuid():
                continue
        except OSError:
            continue
        if _owner_is_gone(candidate):
            shutil.rmtree(candidate, ignore_errors=True)
            removed.append(candidate)
    return removed


@contextlib.contextmanager
def work_directory(prefix: str, parent: Path | None = None) -> Iterator[Path]:
    """A temporary directory that is removed on every way out of the block.

    It records its owner (host, pid, start time); directories of owners that died without
    removing theirs (``kill -9``) are removed here first.

    :param parent: where to make it; None: the system's temporary directory.
    """
    if parent is None:
        remove_abandoned(prefix)
    path = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=parent))
    try:
        (path / _OWNER_FILE).write_text(
            f"{socket.gethostname()}\n{os.getpid()}\n{_start_time(os.getpid()) or ''}\n", encoding="utf-8"
        )
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# --- python -m core.running.processes: a module run so that it dies with its parent ----------------------------


_USAGE = "usage: python -m core.running.processes [--remove-when-orphaned DIR] (-m MODULE | -- PROGRAM) [ARGS...]"


def main(argv: Sequence[str]) -> int:
    """``python -m core.running.processes [--remove-when-orphaned DIR] (-m MODULE | -- PROGRAM) [ARGS...]``

    Runs MODULE as ``__main__`` in this process (torchrun's agent, for one), or PROGRAM as a child
    (poprun, srun), after arranging to get SIGTERM when the parent dies; SIGTERM before MODULE
    installs its own handler ends it through ``finally`` too, and stops PROGRAM. MODULE's and
    PROGRAM's children see this process in ``$CORE_PARENT_PID``. If the parent is gone when
    MODULE or PROGRAM ends, DIR (the parent's work directory) is removed here.
    """
    arguments = list(argv)
    orphan_directory: Path | None = None
    if arguments[:1] == ["--remove-when-orphaned"]:
        orphan_directory, arguments = Path(arguments[1]), arguments[2:]
    if arguments[:1] not in (["-m"], ["--"]) or len(arguments) < 2:
        print(_USAGE, file=sys.stderr)
        return 2
    parent = expected_parent() or os.getppid()
    signal.signal(signal.SIGTERM, _raise_terminated)
    os.environ[PARENT_PID_VARIABLE] = str(os.getpid())
    code: int = 0
    try:
        die_with_parent(parent, signal.SIGTERM)
        if arguments[0] == "-m":
            code = _run_module(arguments[1], arguments[2:])
        else:
            code = _run_program(arguments[1:])
    finally:
        if orphan_directory is not None and os.getppid() != parent:
            shutil.rmtree(orphan_directory, ignore_errors=True)
    return code


def _run_module(module: str, module_arguments: list[str]) -> int:
    import runpy

    try:
        sys.argv = [module, *module_arguments]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exit_request:
        return exit_code(exit_request)
    except Exception as error:
        sigval = getattr(error, "sigval", None)  # torchrun's SignalException: it already stopped its workers
        if type(error).__name__ != "SignalException" or sigval is None:
            raise
        return 128 + int(sigval)
    return 0


def _run_program(command: list[str]) -> int:
    """PROGRAM as a child in this process's group: the supervisor's group stop reaches it and its
    children; on SIGTERM here (the parent died, or the supervisor stops us) it gets SIGTERM too."""
    try:
        child = subprocess.Popen(command)
    except OSError as error:
        print(f"cannot start {command[0]}: {error.strerror or error}", file=sys.stderr)
        return 127
    try:
        return child.wait()
    except BaseException:
        _stop_child(child)
        raise


def _stop_child(child: subprocess.Popen[bytes], grace_seconds: float = 5.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        child.terminate()
    try:
        child.wait(grace_seconds)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            child.kill()
        child.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
