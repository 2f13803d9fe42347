"""Open a page in headless Chromium and report its console errors, over the DevTools protocol.

The protocol runs over a pipe (``--remote-debugging-pipe``: Chromium reads commands on fd 3 and
writes replies and events on fd 4, each a JSON message ended by a NUL byte), so no port, no
websocket library and no network are involved. Errors are collected from three event streams:
``Runtime.consoleAPICalled`` (console.error), ``Runtime.exceptionThrown`` (uncaught exceptions)
and ``Log.entryAdded`` at level "error" (failed loads, Content-Security-Policy violations).
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CANDIDATES = ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--mute-audio",
    "--no-default-browser-check",
    "--disable-dev-shm-usage",  # containers often give /dev/shm 64 MB, too little for a renderer
    "--disable-crash-reporter",
    "--disable-breakpad",
    "--remote-debugging-pipe",
)


def find_chromium() -> str | None:
    for candidate in CANDIDATES:
        found = shutil.which(candidate)
        if found:
            return found
    return None


@dataclass
class PageReport:
    errors: list[str] = field(default_factory=list)  # console errors, exceptions, error log entries
    values: dict[str, Any] = field(default_factory=dict)  # results of the expressions evaluated
    dom: str = ""  # document.documentElement.outerHTML after load


class DevToolsPipe:
    def __init__(self, binary: str, user_data_dir: Path) -> None:
        commands_read, commands_write = os.pipe()
        events_read, events_write = os.pipe()
        # Chromium's ends, moved above 9 (close-on-exec) so that placing them on 3 and 4 in the
        # child cannot overwrite one with the other.
        child_in, child_out = (fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (commands_read, events_write))
        os.close(commands_read)
        os.close(events_write)

        def place_pipe_ends() -> None:  # runs in the child between fork and exec
            os.dup2(child_in, 3)
            os.dup2(child_out, 4)

        command = [binary, *FLAGS, f"--user-data-dir={user_data_dir}", "about:blank"]
        # close_fds=False: it would close 3 and 4 after preexec_fn; every other descriptor of
        # this process is close-on-exec already (PEP 446).
        # HOME inside the throwaway profile: nothing is written to the real home directory.
        environment = dict(os.environ, HOME=str(user_data_dir))
        self.process = subprocess.Popen(
            command,
            preexec_fn=place_pipe_ends,
            close_fds=False,
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        os.close(child_in)
        os.close(child_out)
        self._writer = os.fdopen(commands_write, "wb", buffering=0)
        self._reader = os.fdopen(events_read, "rb", buffering=0)
        self._messages: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._events: list[dict[str, Any]] = []
        self._next_id = 0
        threading.Thread(target=self._read, daemon=True).start()
        self.stderr_lines: list[str] = []
        threading.Thread(target=self._drain_stderr, daemon=True).start()

    def _drain_stderr(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.stderr_lines.append(line.decode("utf-8", errors="replace").rstrip())

    def _read(self) -> None:
        buffer = b""
        while True:
            chunk = self._reader.read(65536)
            if not chunk:
                self._messages.put(None)
                return
            buffer += chunk
            while b"\0" in buffer:
                message, buffer = buffer.split(b"\0", 1)
                self._messages.put(json.loads(message))

    def _pump(self, deadline: float, until: Any) -> dict[str, Any]:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("Chromium did not answer in time; stderr:\n" + "\n".join(self.stderr_lines[-20:]))
            try:
                message = self._messages.get(timeout=left)
            except queue.Empty:
                continue
            if message is None:
                raise RuntimeError("Chromium closed the DevTools pipe; stderr:\n" + "\n".join(self.stderr_lines[-20:]))
            if "id" not in message:
                self._events.append(message)
            if until(message):
                return message

    def call(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None, timeout: float = 30.0
    ) -> dict[str, Any]:
        self._next_id += 1
        request: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            request["sessionId"] = session
        self._writer.write(json.dumps(request).encode() + b"\0")
        ident = self._next_id
        reply = self._pump(time.monotonic() + timeout, lambda m: m.get("id") == ident)
        if "error" in reply:
            raise RuntimeError(f"{method} failed: {reply['error']}")
        return reply.get("result", {})

    def wait_for_event(self, method: str, session: str, timeout: float = 30.0) -> dict[str, Any]:
        for event in self._events:
            if event.get("method") == method and event.get("sessionId") == session:
                return event
        return self._pump(
            time.monotonic() + timeout, lambda m: m.get("method") == method and m.get("sessionId") == session
        )

    def settle(self, seconds: float) -> None:
        """Collect the events that arrive within ``seconds``."""
        try:
            self._pump(time.monotonic() + seconds, lambda m: False)
        except TimeoutError:
            pass

    @property
    def events(self) -> list[dict[str, Any]]:
        return self._events

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=10)
        except Exception:
            pass
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for stream in (self._writer, self._reader):
            try:
                stream.close()
            except OSError:
                pass


def _describe(event: dict[str, Any]) -> str | None:
    method, params = event.get("method"), event.get("params", {})
    if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
        texts = [str(argument.get("value", argument.get("description", ""))) for argument in params.get("args", [])]
        return "console.error: " + " ".join(texts)
    if method == "Runtime.exceptionThrown":
        details = params.get("exceptionDetails", {})
        return "exception: " + str(details.get("exception", {}).get("description") or details.get("text"))
    if method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
        entry = params["entry"]
        return f"log ({entry.get('source')}): {entry.get('text')} {entry.get('url', '')}".strip()
    return None


def open_page(
    path: Path,
    expressions: dict[str, str] | None = None,
    binary: str | None = None,
    timeout: float = 60.0,
    width: int | None = None,
    screenshot: Path | None = None,
) -> PageReport:
    """Load ``path`` in headless Chromium, wait for its load event, evaluate ``expressions``.

    ``width``: the window's width in CSS pixels (a desktop window, scale 1); ``screenshot``: where
    to write a PNG of the whole page as it was laid out."""
    binary = binary or find_chromium()
    if binary is None:
        raise FileNotFoundError("no Chromium found (apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="core-chromium-") as profile:
        pipe = DevToolsPipe(binary, Path(profile))
        try:
            target = pipe.call("Target.createTarget", {"url": "about:blank"}, timeout=timeout)["targetId"]
            session = pipe.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Runtime", "Log", "Page"):
                pipe.call(f"{domain}.enable", session=session)
            if width is not None:
                metrics = {"width": width, "height": 1000, "deviceScaleFactor": 1, "mobile": False}
                pipe.call("Emulation.setDeviceMetricsOverride", metrics, session=session)
            pipe.call("Page.navigate", {"url": path.resolve().as_uri()}, session=session)
            pipe.wait_for_event("Page.loadEventFired", session, timeout=timeout)
            pipe.settle(1.0)  # late errors (image decoding, deferred work) arrive after the load event
            report = PageReport()
            for name, expression in (expressions or {}).items():
                reply = pipe.call(
                    "Runtime.evaluate",
                    {"expression": expression, "returnByValue": True, "awaitPromise": True},
                    session=session,
                )
                if "exceptionDetails" in reply:
                    report.errors.append(f"evaluating {name}: {reply['exceptionDetails'].get('text')}")
                report.values[name] = reply.get("result", {}).get("value")
            dom = pipe.call(
                "Runtime.evaluate",
                {"expression": "document.documentElement.outerHTML", "returnByValue": True},
                session=session,
            )
            report.dom = dom.get("result", {}).get("value", "")
            if screenshot is not None:
                shot = pipe.call(
                    "Page.captureScreenshot",
                    {"format": "png", "captureBeyondViewport": True},
                    session=session,
                    timeout=timeout,
                )
                screenshot.write_bytes(base64.b64decode(shot["data"]))
            report.errors += [
                text
                for text in (_describe(event) for event in pipe.events if event.get("sessionId") == session)
                if text
            ]
            return report
        finally:
            pipe.close()
