"""A warm parent for runs: one process that imports core and PyTorch once and forks every run from
itself (a fork server, or "zygote"), so a small run does not pay for a new interpreter and its
imports (``import torch`` alone takes seconds).

Each run is still a process of its own, and behaves as one that :func:`core.running.processes.start`
started: a session of its own (its process group is stopped as a whole on a time limit or Ctrl-C),
``$CORE_PARENT_PID`` set to its parent, dying with its parent (the server, which dies with the
sweep: ``kill -9`` of the sweep reaches both), standard input from ``/dev/null`` and both output
streams in the log the supervisor opened, and an exit code read as ``Popen.returncode`` reads it
(negative: the signal that ended it).

Fork safety. The server never initialises a device or runs a framework operation: only imports.
``fork()`` copies the calling thread alone, so anything that keeps threads or device state must not
exist yet when the server forks:

* CUDA cannot be used in a child forked after the parent initialised it (torch marks the child
  "in bad fork" and refuses: torch/cuda/__init__.py ``_lazy_init``); importing torch does not
  initialise it, and :func:`status` reports ``torch.cuda.is_initialized()`` so tests can check.
* PyTorch's intra-op pool (GNU OpenMP, libgomp, in the Linux wheels) is created at the first
  parallel region; a child forked after that finds a pool whose threads it does not have. Autograd's
  device threads are likewise lost on fork (torch/csrc/autograd/engine.cpp: ``in_bad_autograd_fork``).
  The server runs no torch operation, and :func:`status` reports its threads: only those the
  imports start (OpenBLAS's, through numpy, which OpenBLAS stops before a fork and restarts after:
  ``pthread_atfork`` in its driver/others/memory.c).
* TensorFlow starts threads when imported (its allocator's, jemalloc_bg_thd) and its runtime is
  not fork-safe (a child forked after one operation hangs): TensorFlow runs are never forked (see
  core.sweep.repeat and docs/sweeps.md, "TensorFlow runs are not forked").

The channel is a Unix socket pair: newline-delimited JSON, the run's log passed as a file
descriptor (SCM_RIGHTS). Requests: ``{"run": [argv], "env": {...}, "cwd": "..."}`` (answered
``{"started": pid}``) and ``{"status": true}``; the server adds ``{"exited": pid, "returncode": N}``
when a run ends. The server ends when the channel closes, killing the runs still going.

``python -m core.running.forkserver FD [MODULE[:FUNCTION] ...]``: serve on the inherited socket FD
after importing each MODULE (and calling its FUNCTION).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from core.running import processes

READY_TIMEOUT_SECONDS = 300.0  # imports on a loaded machine; past it the sweep starts runs fresh
_MAX_MESSAGE_BYTES = 1 << 20  # a request carries an environment: small, but not tiny
SERVER_EXIT_GRACE_SECONDS = 5.0
ANSWER_TIMEOUT_SECONDS = 60.0  # a fork takes milliseconds; a server this slow to answer is stuck
# The server reaps a run the moment it ends (SIGCHLD wakes it): a run ended this long without its
# exit reported means the server has stopped serving (stopped, or stuck), not that it is slow.
REAP_GRACE_SECONDS = 5.0
_WATCH_SECONDS = 0.25  # how often a wait on the server also looks at the run itself
# Not ``-m core.running.forkserver``: core's package imports this module first, and runpy would
# run a second copy of it as __main__.
_SERVER_MAIN = "import sys; from core.running.forkserver import main; sys.exit(main(sys.argv[1:]))"


class ForkServerError(RuntimeError):
    """The fork server could not start, or died: runs are started as fresh interpreters instead."""


def forkable_command(command: Sequence[str]) -> bool:
    """Whether a fork server can run ``command``: this interpreter with ``-m MODULE`` or ``-c CODE``."""
    return len(command) >= 3 and command[0] == sys.executable and command[1] in ("-m", "-c")


# --- the sweep's side ------------------------------------------------------------------------------


class _Channel:
    """Newline-delimited JSON over a socket, file descriptors beside a message."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buffer = b""
        self._fds: list[int] = []

    def send(self, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
        data = (json.dumps(message) + "\n").encode()
        if fds:
            socket.send_fds(self.sock, [data], list(fds))
        else:
            self.sock.sendall(data)

    def receive(self, timeout: float | None) -> tuple[dict[str, Any], list[int]] | None:
        """The next message and the descriptors that came with it; None when none came in ``timeout``.

        :raises EOFError: the other side closed the channel (or died).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            readable, _, _ = select.select([self.sock], [], [], left)
            if not readable:
                return None
            data, fds, _, _ = socket.recv_fds(self.sock, _MAX_MESSAGE_BYTES, 4)
            self._fds.extend(fds)
            if not data:
                raise EOFError("the channel closed")
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        # One request at a time carries descriptors (the client waits for each answer), so every
        # descriptor received so far belongs to the first message.
        fds, self._fds = self._fds, []
        return json.loads(line), fds


class ForkedProcess:
    """A run the fork server forked, seen from the sweep: the fork server's child, not this
    process's, so it is waited for through the server; it leads a process group of its own.

    Should the server die or hang, the run is still watched through ``/proc``: its end is seen
    without the server, and ``lost`` says whether the server's death ended it."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self._server = server
        self.pid = pid
        self.returncode: int | None = None
        # The kernel's start time tells this run from a later process that reuses its pid.
        self.start_time = _start_time(pid)

    @property
    def lost(self) -> bool:
        """The server died before it reported this run's end: the run was ended with it (the
        parent-death signal), or its exit status went to whoever adopted it."""
        return self.pid in self._server.lost_runs

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.exit_code(self.pid, timeout=0.0, start_time=self.start_time)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self._server.exit_code(self.pid, timeout=timeout, start_time=self.start_time)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(f"forked run {self.pid}", timeout or 0.0)
        return self.returncode


class ForkServer:
    """The sweep's handle on its fork server: start it, fork runs from it, close it.

    A :class:`core.running.processes.ChildStarter`: ``processes.supervise(..., starter=server)``.
    """

    def __init__(self, process: subprocess.Popen[bytes], channel: _Channel, log_path: Path, ready: dict[str, Any]):
        self.process = process
        self._channel = channel
        self.log_path = log_path
        self.ready = ready  # what the server said when ready: its pid, imports, threads
        self._exits: dict[int, int] = {}
        self.failure: str | None = None  # why it can no longer be used
        self.lost_runs: set[int] = set()  # runs whose end the server died before reporting
        self._ended_unreported: dict[int, float] = {}  # run -> when it was first seen ended, unreported

    # --- ChildStarter ---

    def start(
        self, command: Sequence[str], output: IO[bytes], answer_timeout: float = ANSWER_TIMEOUT_SECONDS
    ) -> ForkedProcess:
        """Fork ``command`` (see :func:`forkable_command`) with both output streams in ``output``.

        :param answer_timeout: how long to wait for the server to say it forked (a fork takes
            milliseconds): past it the server is taken for stuck, and stopped.
        :raises ForkServerError: the server is gone or stuck (the caller starts the run fresh instead).
        """
        if self.failure is not None:
            raise ForkServerError(self.failure)
        request = {"run": list(command), "env": processes.child_environment(), "cwd": os.getcwd()}
        try:
            self._channel.send(request, [output.fileno()])
            answer = self._answer("started", timeout=answer_timeout)
        except TimeoutError:
            self._fail(f"the fork server stopped answering (no answer to a fork request in {answer_timeout:g} s)")
            # Stuck: no grace. A child it forked and holds waiting to run ends with it (core's
            # _fork_run: it runs only once told to).
            self.close(grace_seconds=0.0)
            raise ForkServerError(self.failure or "the fork server stopped answering") from None
        except (EOFError, OSError) as error:
            self._fail(f"the fork server died ({error or type(error).__name__})")
            self.close()
            raise ForkServerError(self.failure or "the fork server died") from None
        return ForkedProcess(self, int(answer["started"]))

    def status(self) -> dict[str, Any]:
        """The server's state now: pid, threads, imported frameworks, whether CUDA is initialised."""
        self._channel.send({"status": True})
        status: dict[str, Any] = self._answer("status", timeout=ANSWER_TIMEOUT_SECONDS)["status"]
        return status

    def exit_code(self, pid: int, timeout: float | None, start_time: str | None = None) -> int | None:
        """``pid``'s exit code (negative: the signal), once the server reports it; None if not in ``timeout``.

        A server that died or stopped serving does not leave the caller waiting on it: the run is
        then watched through ``/proc`` (``start_time``, from :func:`_start_time`, tells it from a
        later process with its pid), and a run that ended while the server was silent for
        ``REAP_GRACE_SECONDS`` marks the server failed.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while pid not in self._exits:
            if self.failure is not None:
                self._drain()  # an exit it reported before it went silent still counts
                if pid in self._exits:
                    break
                return _exit_without_server(pid, start_time, deadline)
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                received = self._receive(_WATCH_SECONDS if left is None else min(left, _WATCH_SECONDS))
            except (EOFError, OSError, ValueError):
                # The server died: the kernel sent the run SIGTERM (die_with_parent), and its exit
                # status, should it have ended first, went to whoever adopted it.
                self._fail("the fork server died while a run was going")
                self.lost_runs.add(pid)
                continue
            if received is None:
                self._notice_unreported_end(pid, start_time)
                if self.failure is None and deadline is not None and time.monotonic() >= deadline:
                    return None
        self._ended_unreported.pop(pid, None)
        return self._exits.pop(pid)

    def close(self, grace_seconds: float = SERVER_EXIT_GRACE_SECONDS) -> None:
        """End the server (its runs still going are killed) and wait for it."""
        with contextlib.suppress(OSError):
            self._channel.sock.close()
        try:
            self.process.wait(timeout=grace_seconds)
        except subprocess.TimeoutExpired:
            pass
        processes.stop_process_group(self.process, grace_seconds=grace_seconds)

    # --- internals ---

    def _notice_unreported_end(self, pid: int, start_time: str | None) -> None:
        """Mark the server failed once ``pid`` has ended and stayed unreported past the grace."""
        if _ended_status(pid, start_time) is None:
            return
        first_seen = self._ended_unreported.setdefault(pid, time.monotonic())
        if time.monotonic() - first_seen > REAP_GRACE_SECONDS:
            self._fail(
                "the fork server stopped answering (a run it forked ended, and it did not report that "
                f"in {REAP_GRACE_SECONDS:g} s)"
            )

    def _drain(self) -> None:
        """Take the messages already sent, without waiting (the server may be gone)."""
        with contextlib.suppress(EOFError, OSError, ValueError):
            while self._receive(0.0) is not None:
                pass

    def _fail(self, why: str) -> None:
        if self.failure is None:
            try:
                tail = self.log_path.read_text(encoding="utf-8", errors="replace")[-2000:].strip()
            except OSError:
                tail = ""
            self.failure = why + (f"; its output: {tail}" if tail else "")

    def _receive(self, timeout: float | None) -> dict[str, Any] | None:
        received = self._channel.receive(timeout)
        if received is None:
            return None
        message, fds = received
        for fd in fds:
            os.close(fd)
        if "exited" in message:
            self._exits[int(message["exited"])] = int(message["returncode"])
        return message

    def _answer(self, key: str, timeout: float | None = None) -> dict[str, Any]:
        """The next message with ``key`` (exits reported meanwhile are kept).

        :raises TimeoutError: none came in ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"no answer in {timeout:g} s")
            message = self._receive(left)
            if message is not None and key in message:
                return message
            if message is not None and "error" in message:
                raise OSError(message["error"])


def start_fork_server(
    preload: Sequence[str], log_path: Path, ready_timeout: float = READY_TIMEOUT_SECONDS
) -> ForkServer:
    """Start a fork server that imports ``preload`` (module names), and wait until it is ready.

    :param log_path: where the server's own output goes (an import's warnings, a crash).
    :raises ForkServerError: it exited, or was not ready in ``ready_timeout`` seconds (it is stopped).
    """
    return spawn_fork_server(preload, log_path).ready(ready_timeout)


def spawn_fork_server(preload: Sequence[str], log_path: Path) -> StartingForkServer:
    """Start a fork server that imports ``preload`` without waiting for it: its imports run while
    the caller does other work (a sweep plans), and :meth:`StartingForkServer.ready` waits for them.

    :param log_path: where the server's own output goes (an import's warnings, a crash).
    """
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with open(log_path, "wb") as log:
            process = processes.start(
                [sys.executable, "-c", _SERVER_MAIN, str(theirs.fileno()), *preload],
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=[theirs.fileno()],
            )
    finally:
        theirs.close()
    return StartingForkServer(process, _Channel(ours), log_path)


class StartingForkServer:
    """A fork server started and still importing: :meth:`ready` waits for it, :meth:`close` stops it."""

    def __init__(self, process: subprocess.Popen[bytes], channel: _Channel, log_path: Path) -> None:
        self.process = process
        self._channel = channel
        self.log_path = log_path

    def ready(self, ready_timeout: float = READY_TIMEOUT_SECONDS) -> ForkServer:
        """The server, once it said it is ready (at most ``ready_timeout`` seconds from now).

        :raises ForkServerError: it exited, or was not ready in time (it is stopped).
        """
        process, channel, log_path = self.process, self._channel, self.log_path
        silent = False  # no word in ready_timeout: still importing, stuck, or stopped (SIGSTOP)
        try:
            received = channel.receive(ready_timeout)
            silent = received is None
        except (EOFError, OSError, ValueError):
            received = None
            # The channel closed: the server is ending on its own; its exit code says how.
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=SERVER_EXIT_GRACE_SECONDS)
        if received is None or "ready" not in received[0]:
            # Read before core stops it: a code after that (-9 for a server that ignored SIGTERM or
            # was stopped) would be core's own kill, not how the server ended.
            own_exit = process.poll()
            processes.stop_process_group(process, grace_seconds=SERVER_EXIT_GRACE_SECONDS)
            channel.sock.close()
            if received is not None:
                ended = "answered nonsense"
            elif silent:
                ended = (
                    f"was not ready in {ready_timeout:g} s (its imports hung, or it was stopped), so core stopped it"
                )
            elif own_exit is None:
                ended = "closed its channel before it was ready but did not exit, so core stopped it"
            else:
                ended = f"exited with code {own_exit}"
            tail = log_path.read_text(encoding="utf-8", errors="replace")[-2000:].strip()
            raise ForkServerError(f"the fork server {ended}" + (f": {tail}" if tail else ""))
        return ForkServer(process, channel, log_path, received[0])

    def close(self, grace_seconds: float = SERVER_EXIT_GRACE_SECONDS) -> None:
        """Stop the server before it was used (it has no runs)."""
        with contextlib.suppress(OSError):
            self._channel.sock.close()
        processes.stop_process_group(self.process, grace_seconds=grace_seconds)


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/PID/stat`` after the command name (field 3 onwards), or None if there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None  # gone (a fork server runs on Linux only: core.sweep.repeat)


def _start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (field 22), which a later process reusing the pid lacks."""
    fields = _stat_fields(pid)
    return fields[19] if fields is not None and len(fields) > 19 else None


def _ended_status(pid: int, start_time: str | None) -> int | None:
    """How the run ``pid`` ended, read without its parent: its exit code (negative: the signal)
    while it is a zombie its parent has not reaped (field 52, the status ``waitpid`` would give);
    ``-SIGTERM`` once it is gone, reaped by whoever adopted it (the parent-death signal is what
    ends a forked run whose server died); None while it runs."""
    fields = _stat_fields(pid)
    if fields is None or (start_time is not None and len(fields) > 19 and fields[19] != start_time):
        return -signal.SIGTERM  # gone, and its pid maybe reused since: its exit status went elsewhere
    if fields[0] not in ("Z", "X"):
        return None
    try:
        return os.waitstatus_to_exitcode(int(fields[49]))
    except (IndexError, ValueError):
        return -signal.SIGTERM


def _exit_without_server(pid: int, start_time: str | None, deadline: float | None) -> int | None:
    """Wait for a forked run whose server can no longer report it, through ``/proc``; None at ``deadline``."""
    while True:
        status = _ended_status(pid, start_time)
        if status is not None:
            return status
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0.0:
            return None
        time.sleep(0.05 if left is None else min(0.05, left))


# --- the server's side -----------------------------------------------------------------------------


def _thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return -1


def _status() -> dict[str, Any]:
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    return {
        "pid": os.getpid(),
        "threads": _thread_count(),
        "torch_imported": torch is not None,
        "tensorflow_imported": "tensorflow" in sys.modules,
        "cuda_initialized": bool(cuda.is_initialized()) if cuda is not None else False,
    }


def serve(sock: socket.socket, preload: Sequence[str]) -> int:
    """Import ``preload`` ("module" or "module:function", called with no arguments), say so, then
    fork a run per request until the channel closes."""
    for name in preload:
        module, _, function = name.partition(":")
        imported = importlib.import_module(module)
        if function:
            getattr(imported, function)()
    channel = _Channel(sock)
    if _status()["cuda_initialized"]:
        # Something imported above initialised CUDA: a forked child could not use it. Say so and
        # stop; the sweep starts its runs as fresh interpreters.
        print(f"core: a preload initialised CUDA ({', '.join(preload)}): runs cannot be forked", file=sys.stderr)
        return 1
    # SIGCHLD wakes the loop through this pipe (a Python handler must exist for the wakeup fd).
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    os.set_blocking(wake_read, False)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    signal.set_wakeup_fd(wake_write)
    runs: set[int] = set()
    channel.send({"ready": True, **_status(), "preloaded": list(preload)})
    try:
        while True:
            try:
                readable, _, _ = select.select([sock.fileno(), wake_read], [], [])
            except InterruptedError:
                continue
            if wake_read in readable:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_read, 512)
                _reap(runs, channel)
            if sock.fileno() in readable:
                # Every request that has arrived, whole, before sleeping again.
                while (received := channel.receive(0.0)) is not None:
                    _handle(received, channel, runs, sock, (wake_read, wake_write))
    except EOFError:
        pass  # the sweep closed the channel, or died
    finally:
        for pid in runs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
    return 0


def _handle(
    received: tuple[dict[str, Any], list[int]],
    channel: _Channel,
    runs: set[int],
    sock: socket.socket,
    wake: tuple[int, int],
) -> None:
    message, fds = received
    if "status" in message:
        channel.send({"status": {**_status(), "runs": sorted(runs)}})
    elif "run" in message and len(fds) == 1:
        runs.add(_fork_run(message, fds[0], sock, wake))  # it sends {"started": pid}
    else:
        for fd in fds:
            os.close(fd)
        channel.send({"error": f"not a request: {str(message)[:200]}"})


def _reap(runs: set[int], channel: _Channel) -> None:
    while runs:
        try:
            pid, wait_status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        runs.discard(pid)
        channel.send({"exited": pid, "returncode": os.waitstatus_to_exitcode(wait_status)})


def _fork_run(message: dict[str, Any], log_fd: int, sock: socket.socket, wake: tuple[int, int]) -> int:
    """Fork one run. The child leads a session of its own (so its group can be signalled) before its
    pid is sent, and runs only once the pid was sent: a server that dies in between leaves no run
    the sweep does not know of (it then starts the run fresh)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()  # nothing buffered here may be written twice
    session_read, session_write = os.pipe()
    go_read, go_write = os.pipe()
    server_pid = os.getpid()
    pid = os.fork()
    if pid == 0:
        code = 70  # EX_SOFTWARE: should the lines below fail
        try:
            os.close(session_read)
            os.close(go_write)
            os.setsid()
            os.write(session_write, b"1")
            os.close(session_write)
            if os.read(go_read, 1) == b"1":
                os.close(go_read)
                code = _become_run(message, log_fd, sock, wake, server_pid)
        finally:
            os._exit(code)
    os.close(session_write)
    os.close(go_read)
    os.close(log_fd)
    os.read(session_read, 1)  # b"" if the child died first: its exit is reaped as any other
    os.close(session_read)
    try:
        channel = _Channel(sock)
        channel.send({"started": pid})
        os.write(go_write, b"1")
    finally:
        os.close(go_write)
    return pid


def _become_run(message: dict[str, Any], log_fd: int, sock: socket.socket, wake: tuple[int, int], server: int) -> int:
    """In the forked child: become the process ``python ARGV`` would be, run it, and exit."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    sock.close()
    for fd in wake:
        os.close(fd)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    os.environ.clear()
    os.environ.update(message["env"])
    os.environ[processes.PARENT_PID_VARIABLE] = str(server)
    os.chdir(message["cwd"])
    processes.die_with_parent(server, signal.SIGTERM)
    _reseed()
    _leave_server_finalizers()
    code = _run_python(list(message["run"])[1:])
    _finish_interpreter()
    return code


def _reseed() -> None:
    """A fresh interpreter seeds numpy's global generator from the OS; every fork would otherwise share
    the server's state. (Python's ``random`` reseeds itself after a fork; torch's default generator
    has a fixed seed in every interpreter, and the server never used it.)"""
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()


def _leave_server_finalizers() -> None:
    """The ``weakref.finalize`` callbacks alive now are the server's, registered by its imports:
    PyTorch registers one per operator library (174 here), and running them at this run's exit
    took 40 to 55 ms of every tiny forked run, tearing down what ``os._exit`` then drops anyway. A
    server's finalizer may also clean up what is the server's (a temporary folder its imports
    made), which a run must not. So they do not run at this run's exit; those the run registers
    (its own temporary folders, say) still do."""
    # weakref.finalize keeps its live finalizers in a class attribute (CPython's Lib/weakref.py);
    # without it (another interpreter) the run just pays for their teardown.
    registry = getattr(weakref.finalize, "_registry", None)
    if isinstance(registry, dict):
        for finalizer in list(registry):
            finalizer.atexit = False


def _run_python(arguments: list[str]) -> int:
    """``python -m MODULE ARGS`` or ``python -c CODE ARGS`` in this process, with the exit code that
    interpreter would have (an uncaught exception: 1 and its traceback; Ctrl-C: killed by SIGINT)."""
    import runpy
    import types

    option, target, rest = arguments[0], arguments[1], arguments[2:]
    try:
        if option == "-m":
            sys.argv = [target, *rest]
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.argv = ["-c", *rest]
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(target, "<string>", "exec"), main.__dict__)  # noqa: S102 - what python -c does
    except SystemExit as request:
        return processes.exit_code(request)
    except KeyboardInterrupt as interrupt:
        _print_traceback(interrupt)
        _finish_interpreter()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)  # as CPython ends on an uncaught KeyboardInterrupt
        return 128 + signal.SIGINT
    except BaseException as error:
        _print_traceback(error)
        return 1
    return 0


def _print_traceback(error: BaseException) -> None:
    """The traceback as the interpreter prints it, without this module's frame."""
    import traceback

    traceback.print_exception(type(error), error, error.__traceback__.tb_next if error.__traceback__ else None)


def _finish_interpreter() -> None:
    """What an interpreter does at exit that matters to a run: atexit handlers, flushed streams.
    (The child then leaves with ``os._exit``: the server's own state is not the run's to finalise.)"""
    import atexit

    with contextlib.suppress(Exception):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()


def main(argv: Sequence[str]) -> int:
    if not argv or not argv[0].isdigit():
        print("usage: python -m core.running.forkserver FD [MODULE[:FUNCTION] ...]", file=sys.stderr)
        return 2
    processes.die_with_parent(None, signal.SIGTERM)
    sock = socket.socket(fileno=int(argv[0]))
    code = serve(sock, list(argv[1:]))
    # Leave without the interpreter's finalisation: the server only imported, so it has nothing of
    # its own to finish, and tearing down PyTorch's modules takes seconds on a loaded machine,
    # which the sweep spends waiting for it at its end (close()).
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
