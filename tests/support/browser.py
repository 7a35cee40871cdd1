"""Headless Chromium driven over its DevTools pipe (`--remote-debugging-pipe`: JSON messages, each
ended by a NUL byte, read by the browser on fd 3 and written on fd 4), so a browser test needs no
driver binary or WebSocket client. Debian's `chromium` package: .ci/ensure-chromium installs it."""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# The flags a closed network needs: no background fetches, no first-run or sync services.
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--remote-debugging-pipe", "--window-size=1100,1000", "--hide-scrollbars",
)  # fmt: skip


class Browser:
    """One headless Chromium with one page; `evaluate` runs JavaScript in it."""

    def __init__(self, profile_dir: Path) -> None:
        assert CHROMIUM is not None, "no chromium on PATH (.ci/ensure-chromium installs Debian's)"
        to_browser, self._commands = os.pipe()
        self._replies, from_browser = os.pipe()

        def pipes_at_3_and_4() -> None:
            # moved above 9 first: a pipe may already be fd 3 or 4, and dup2 onto itself keeps close-on-exec
            reads, writes = fcntl.fcntl(to_browser, fcntl.F_DUPFD, 10), fcntl.fcntl(from_browser, fcntl.F_DUPFD, 10)
            os.dup2(reads, 3)
            os.dup2(writes, 4)

        self._process = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile_dir}", "about:blank"],
            preexec_fn=pipes_at_3_and_4,
            close_fds=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser)
        os.close(from_browser)
        self._next_id = 0
        self._buffer = b""
        page = next(t for t in self._wait_for_page() if t["type"] == "page")
        self._session = self.send("Target.attachToTarget", targetId=page["targetId"], flatten=True)["sessionId"]
        self.send("Page.enable", session=True)
        self.send("Runtime.enable", session=True)

    def _wait_for_page(self) -> list[dict[str, Any]]:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            targets = self.send("Target.getTargets")["targetInfos"]
            if any(t["type"] == "page" for t in targets):
                return targets
            time.sleep(0.1)
        raise AssertionError("chromium opened no page")

    def send(self, method: str, *, session: bool = False, timeout: float = 60, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self._session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise AssertionError(f"{method}: {reply['error']}")
                return reply["result"]

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._replies], [], [], left)[0]:
                raise AssertionError("chromium did not answer in time")
            chunk = os.read(self._replies, 1 << 20)
            if not chunk:
                raise AssertionError("chromium closed its pipe")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)

    def goto(self, url: str) -> None:
        self.send("Page.navigate", session=True, url=url)
        self.wait_for("document.readyState === 'complete' && location.href !== 'about:blank'")

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", session=True, expression=expression, returnByValue=True,
                           awaitPromise=True)  # fmt: skip
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, condition: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not self.evaluate(f"Boolean({condition})"):
            assert time.monotonic() < deadline, f"the page never showed {condition}"
            time.sleep(0.1)

    def press(self, key: str, code: int) -> None:
        """A real key press (down, then up) on the focused element: `key` as KeyboardEvent.key names it."""
        text = "\r" if key == "Enter" else key
        for kind in ("keyDown", "keyUp"):
            self.send("Input.dispatchKeyEvent", session=True, type=kind, key=key, code=key,
                      windowsVirtualKeyCode=code, text=text if kind == "keyDown" else "")  # fmt: skip

    def screenshot(self, path: Path) -> None:
        data = self.send("Page.captureScreenshot", session=True, format="png", captureBeyondViewport=True)["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        with contextlib.suppress(AssertionError):  # it may close before it answers
            self.send("Browser.close", timeout=10)
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
        os.close(self._commands)
        os.close(self._replies)
