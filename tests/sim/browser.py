"""A real headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe): no
websocket library, standard library only. Used by tests/output/test_html.py and benchmarks/html_render.py to
open the --html page, collect every console error, exception and log error, time the load, and take
a screenshot.

Chromium reads protocol messages from its fd 3 and writes them to its fd 4, each a JSON document
ended by a NUL byte. The browser runs in its own process group (it forks renderers and helpers);
close() ends that group and removes its profile directory, also when a test failed.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from typing import Any, Dict, List, Optional


def chromium() -> Optional[str]:
    """The chromium executable (Debian's `chromium` package), or None where it is not installed."""
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _above(fd: int, low: int) -> int:
    """fd moved to the lowest free descriptor >= low (the old one closed)."""
    import fcntl

    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, low)
    os.close(fd)
    return moved


class BrowserError(RuntimeError):
    """Chromium died, answered an error, or said nothing before the deadline."""


class Browser:
    """One headless Chromium with one page; `open(path)` loads a file and returns what happened."""

    def __init__(self, width: int = 1280, height: int = 900, deadline_s: float = 120.0) -> None:
        exe = chromium()
        if exe is None:
            raise BrowserError("chromium is not installed")
        self.deadline_s = deadline_s
        self.profile = tempfile.mkdtemp(prefix="preflight-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # the child's ends above 9, so that moving them to 3 and 4 never overwrites one with the other
        to_browser_r, from_browser_w = (_above(fd, 10) for fd in (to_browser_r, from_browser_w))
        args = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
                "--user-data-dir=" + self.profile, "--remote-debugging-pipe", "about:blank"]
        # the browser's fds 3 and 4 are the pipe ends (bash moves them there, then becomes chromium)
        wrapper = 'exec "$@" 3<&%d 4>&%d %d<&- %d>&-' % (to_browser_r, from_browser_w, to_browser_r, from_browser_w)
        self.proc = subprocess.Popen(["bash", "-c", wrapper, "bash"] + args, pass_fds=(to_browser_r, from_browser_w),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next = 0
        self.events: List[Dict[str, Any]] = []
        try:
            target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
            self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Page", "Runtime", "Log"):
                self.call(domain + ".enable", session=True)
            self.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1,
                                                            "mobile": False}, session=True)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """End the browser's whole process group and remove its profile."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)

    def call(self, method: str, params: Optional[Dict[str, Any]] = None, session: bool = False) -> Dict[str, Any]:
        """Send one command and return its result (events that arrive meanwhile are kept in self.events)."""
        self._next += 1
        message: Dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self.session
        data = json.dumps(message).encode() + b"\0"
        while data:
            data = data[os.write(self._to_browser, data):]
        while True:
            reply = self._read()
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise BrowserError("%s: %s" % (method, reply["error"]))
                return reply.get("result") or {}
            self.events.append(reply)

    def wait_event(self, method: str) -> Dict[str, Any]:
        """The next event `method` (one already received counts), removed from self.events."""
        while True:
            for i, event in enumerate(self.events):
                if event.get("method") == method:
                    return self.events.pop(i)
            self.events.append(self._read())

    def _read(self) -> Dict[str, Any]:
        end = time.monotonic() + self.deadline_s
        while b"\0" not in self._buffer:
            left = end - time.monotonic()
            ready, _w, _x = select.select([self._from_browser], [], [], max(0.0, left))
            if not ready:
                raise BrowserError("chromium said nothing for %.0f s" % self.deadline_s)
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise BrowserError("chromium closed its protocol pipe (exit %s)" % self.proc.poll())
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=True)
        if "exceptionDetails" in result:
            raise BrowserError("evaluate %s: %s" % (expression, result["exceptionDetails"]))
        return result["result"].get("value")

    def open(self, path: str) -> Dict[str, Any]:
        """Load a local file; {"errors": [console errors, exceptions, log errors], "load_s": seconds from
        the navigation to the load event with the page laid out, "navigation": the page's own timing}."""
        self.events = [e for e in self.events if e.get("method") not in ("Page.loadEventFired",)]
        begun = time.monotonic()
        self.call("Page.navigate", {"url": "file://" + os.path.abspath(path)}, session=True)
        self.wait_event("Page.loadEventFired")
        height = self.evaluate("document.documentElement.getBoundingClientRect().height")  # forces layout
        load_s = time.monotonic() - begun
        timing = self.evaluate("JSON.stringify(performance.getEntriesByType('navigation')[0] || {})")
        return {"errors": self.errors(), "load_s": load_s, "height": height, "navigation": json.loads(timing or "{}")}

    def errors(self) -> List[str]:
        """Every console error, uncaught exception and error-level log entry received so far."""
        out = []
        for e in self.events:
            method, params = e.get("method"), e.get("params") or {}
            if method == "Runtime.exceptionThrown":
                out.append("exception: %s" % params.get("exceptionDetails", {}).get("text"))
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                out.append("console.%s: %s" % (params.get("type"), [a.get("value") for a in params.get("args") or []]))
            elif method == "Log.entryAdded" and (params.get("entry") or {}).get("level") == "error":
                out.append("log: %s" % (params.get("entry") or {}).get("text"))
        return out

    def screenshot(self, path: str) -> None:
        """The whole page (beyond the viewport) as a PNG."""
        metrics = self.call("Page.getLayoutMetrics", session=True)
        size = metrics.get("cssContentSize") or metrics["contentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], 16000), "scale": 1}
        shot = self.call("Page.captureScreenshot", {"format": "png", "clip": clip, "captureBeyondViewport": True}, session=True)
        with open(path, "wb") as out:
            out.write(base64.b64decode(shot["data"]))
