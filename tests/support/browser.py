"""Headless Chromium (Debian's `chromium`) driven over the DevTools protocol, for tests that look at a page
as a person would: it renders, images decode, text is visible; and a full-page screenshot to look at.

The protocol client is `websockets` (already installed as a Prefect dependency): no browser-automation
package is needed. Without chromium the tests are skipped, except in CI (env CI set), where its absence is
a failure (scripts/bootstrap.sh --test installs it).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio"]


def chromium_path() -> str:
    path = os.environ.get("QUALIFY_TEST_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        message = "chromium is not installed (apt-get install -y chromium, or scripts/bootstrap.sh --test)"
        if os.environ.get("CI"):
            pytest.fail(message + ": CI must have it")
        pytest.skip(message)
    return path


class Browser:
    """One headless Chromium with one page; `close()` ends the process it started."""

    def __init__(self, workdir: Path, width: int = 1300, height: int = 900, timeout: float = 60.0) -> None:
        from websockets.sync.client import connect

        self.profile = workdir / f"chromium-profile-{time.monotonic_ns()}"
        self.profile.mkdir(parents=True)
        self.width = width
        self.log = open(workdir / "chromium.log", "ab")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen([chromium_path(), *FLAGS, f"--user-data-dir={self.profile}",
                                      "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1",
                                      f"--window-size={width},{height}", "about:blank"],
                                     stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"chromium did not start (see {workdir / 'chromium.log'})")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        targets: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            targets = [t for t in httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=5, trust_env=False).json()
                       if t.get("type") == "page"]
            if targets:
                break
            time.sleep(0.1)
        self.ws = connect(targets[0]["webSocketDebuggerUrl"], max_size=None, open_timeout=timeout)
        self._id = 0
        self.call("Page.enable")
        self.call("Runtime.enable")

    def call(self, method: str, timeout: float = 60.0, **params: Any) -> dict[str, Any]:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            message = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if message.get("id") == self._id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def goto(self, url: str, until: str | None = None, timeout: float = 60.0) -> None:
        """Navigate and wait for the load to complete and, when given, for the JS expression `until` to be truthy."""
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + timeout
        while self.evaluate("document.readyState") != "complete":
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not load in {timeout:g} s")
            time.sleep(0.1)
        while until and not self.evaluate(until):
            if time.monotonic() > deadline:
                text = self.evaluate("document.body ? document.body.innerText.slice(0, 600) : ''")
                raise TimeoutError(f"{url}: {until!r} not true after {timeout:g} s; the page shows: {text!r}")
            time.sleep(0.25)

    def screenshot(self, path: Path, full_page: bool = True) -> Path:
        if full_page:
            height = int(self.evaluate("Math.ceil(document.documentElement.scrollHeight)") or 900)
            self.call("Emulation.setDeviceMetricsOverride", width=self.width, height=min(height, 16000),
                      deviceScaleFactor=1, mobile=False)
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=full_page)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        ws = getattr(self, "ws", None)
        if ws is not None:
            try:
                ws.close()
            except Exception:  # noqa: BLE001 - the browser may already be gone
                pass
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
