"""A headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``).

No package beyond the standard library: Chromium reads protocol messages (JSON, each
ended by a NUL byte) on file descriptor 3 and writes its answers and events on 4. The
flags keep it off the network (this machine refuses connections; without the
background-networking flags Chromium keeps trying) and in a fresh profile.

    with Browser() as browser:
        page = browser.open("file:///.../report.html")
        page.evaluate("document.title"), page.errors, page.screenshot()
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from typing import Any, Dict, List, Optional

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-pipe",
)
CANDIDATES = ("chromium", "chromium-browser", "google-chrome")


def find_chromium() -> Optional[str]:
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def needs_chromium(test):
    """Skip a test, saying why, where no Chromium is installed."""
    import pytest

    return pytest.mark.skipif(
        find_chromium() is None,
        reason="headless Chromium not installed (Debian: apt-get install -y chromium chromium-driver; .ci/run does)",
    )(test)


class BrowserError(RuntimeError):
    pass


class Browser:
    def __init__(self, executable: Optional[str] = None, timeout: float = 60.0):
        self.executable = executable or find_chromium()
        if not self.executable:
            raise BrowserError("no Chromium found (Debian: apt-get install chromium)")
        self.timeout = timeout
        self._id = 0
        self._buffer = b""
        self._events: List[Dict[str, Any]] = []

    def __enter__(self) -> Browser:
        self.profile = tempfile.mkdtemp(prefix="chromium-profile-")
        to_chrome_r, to_chrome_w = os.pipe()
        from_chrome_r, from_chrome_w = os.pipe()

        def child_fds():  # Chromium expects its pipe ends at 3 (read) and 4 (write)
            high_r, high_w = os.dup(to_chrome_r), os.dup(from_chrome_w)
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        self.process = subprocess.Popen(
            [self.executable, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            pass_fds=(3, 4, to_chrome_r, from_chrome_w),
            preexec_fn=child_fds,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._write = os.fdopen(to_chrome_w, "wb", buffering=0)
        self._read = os.fdopen(from_chrome_r, "rb", buffering=0)
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.call("Browser.close")
        except (BrowserError, OSError):
            pass
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._write.close()
        self._read.close()
        shutil.rmtree(self.profile, ignore_errors=True)

    def call(self, method: str, params: Optional[dict] = None, session: Optional[str] = None) -> Dict[str, Any]:
        self._id += 1
        message: Dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        self._write.write(json.dumps(message).encode() + b"\0")
        while True:
            answer = self._next()
            if answer.get("id") == self._id:
                if "error" in answer:
                    raise BrowserError(f"{method}: {answer['error']}")
                return answer.get("result", {})
            self._events.append(answer)

    def _next(self) -> Dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise BrowserError("Chromium did not answer in time")
            chunk = self._read.read(1 << 16)
            if not chunk:
                raise BrowserError("Chromium closed the pipe")
            self._buffer += chunk
        raw, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(raw)

    def open(self, url: str, width: int = 1300, height: int = 1800) -> Page:
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, session)
        for domain in ("Runtime", "Log", "Page"):
            self.call(f"{domain}.enable", session=session)
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session=session)
        self.call("Page.navigate", {"url": url}, session=session)
        page.wait_for_event("Page.loadEventFired")
        return page


class Page:
    def __init__(self, browser: Browser, session: str):
        self.browser, self.session = browser, session

    def _mine(self) -> List[Dict[str, Any]]:
        return [e for e in self.browser._events if e.get("sessionId") == self.session]

    def wait_for_event(self, method: str) -> Dict[str, Any]:
        while True:
            for event in self._mine():
                if event.get("method") == method:
                    return event
            self.browser._events.append(self.browser._next())

    def evaluate(self, expression: str) -> Any:
        result = self.browser.call(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True},
            session=self.session,
        )
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression!r}: {result['exceptionDetails']}")
        return result["result"].get("value")

    @property
    def errors(self) -> List[str]:
        """Console errors, uncaught exceptions and error log entries seen so far."""
        self.evaluate("0")  # collect the events queued so far
        out = []
        for event in self._mine():
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                out.append(json.dumps(params.get("exceptionDetails", {}))[:500])
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                out.append(" ".join(str(a.get("value", a.get("description"))) for a in params.get("args", [])))
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                out.append(params["entry"].get("text", ""))
        return out

    def screenshot(self) -> bytes:
        data = self.browser.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": False},
                                 session=self.session)["data"]
        return base64.b64decode(data)


def main(argv=None) -> int:
    """``python -m tests.support.chromium PAGE.html OUT.png [--height N]``: a screenshot of a page
    (how docs/compare-report-w3.png was made)."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("page")
    parser.add_argument("out")
    parser.add_argument("--height", type=int, default=1800)
    args = parser.parse_args(argv)
    with Browser() as browser:
        page = browser.open("file://" + os.path.abspath(args.page))
        browser.call("Emulation.setDeviceMetricsOverride",
                     {"width": 1300, "height": args.height, "deviceScaleFactor": 1, "mobile": False},
                     session=page.session)
        if page.errors:
            raise SystemExit(f"the page logged errors: {page.errors}")
        with open(args.out, "wb") as handle:
            handle.write(page.screenshot())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
