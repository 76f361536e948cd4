"""Headless Chromium driven over the DevTools protocol, for the report page's tests and benchmark.

One browser per Browser(), on a port of its own choosing (--remote-debugging-port=0: the port is
read back from DevToolsActivePort in its profile folder); each open() is a new tab, attached in
flattened mode so that one websocket carries every command and event. Console errors, uncaught
exceptions and failed loads are collected per tab.
"""

import base64
import itertools
import json
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import websocket

TIMEOUT_S = 60.0


def chromium() -> str | None:
    """The Chromium binary, or None where none is installed."""
    return next(filter(None, map(shutil.which, ("chromium", "chromium-browser"))), None)


class Browser:
    def __init__(self, width: int = 1280, height: int = 900):
        self.size = (width, height)
        self.ids = itertools.count(1)
        self.events: list[dict] = []

    def __enter__(self) -> "Browser":
        binary = chromium()
        if binary is None:
            raise RuntimeError("no chromium on PATH (Debian: apt-get install chromium)")
        self.profile = Path(tempfile.mkdtemp(prefix="chromium-"))
        self.process = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--remote-debugging-port=0", f"--user-data-dir={self.profile}",
             f"--window-size={self.size[0]},{self.size[1]}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        active = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + TIMEOUT_S
        while not (active.exists() and len(active.read_text().split()) == 2):
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError("chromium did not start its DevTools endpoint")
            time.sleep(0.05)
        port, path = active.read_text().split()
        self.socket = websocket.create_connection(f"ws://127.0.0.1:{port}{path}", timeout=TIMEOUT_S)
        self.session = None
        return self

    def __exit__(self, *exc) -> None:
        self.socket.close()
        self.process.terminate()
        self.process.wait(timeout=30)
        shutil.rmtree(self.profile, ignore_errors=True)

    def send(self, method: str, session: bool = True, **params) -> dict:
        """A command's result; the events that arrive meanwhile are kept in self.events."""
        number = next(self.ids)
        message = {"id": number, "method": method, "params": params}
        if session and self.session:
            message["sessionId"] = self.session
        self.socket.send(json.dumps(message))
        while True:
            reply = json.loads(self.socket.recv())
            if reply.get("id") == number:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for_event(self, method: str, timeout_s: float = TIMEOUT_S) -> dict:
        deadline = time.monotonic() + timeout_s
        while True:
            for event in self.events:
                if event.get("method") == method:
                    self.events.remove(event)
                    return event
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {method} within {timeout_s} s")
            self.socket.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                self.events.append(json.loads(self.socket.recv()))
            except websocket.WebSocketTimeoutException:
                pass
            finally:
                self.socket.settimeout(TIMEOUT_S)

    def open(self, url: str, drawn: str = "document.body?.dataset.drawn === 'yes'") -> dict:
        """A new tab at `url`; returns once its load event fired and `drawn` holds (the page
        says so when its plots are drawn), with the seconds from navigation to then."""
        if self.session:
            self.send("Target.closeTarget", session=False, targetId=self.target)
        self.target = self.send("Target.createTarget", session=False, url="about:blank")["targetId"]
        self.session = self.send(
            "Target.attachToTarget", session=False, targetId=self.target, flatten=True
        )["sessionId"]
        self.events.clear()
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable")
        began = time.perf_counter()
        self.send("Page.navigate", url=url)
        self.wait_for_event("Page.loadEventFired")
        self.wait_until(drawn)
        return {"drawn_s": time.perf_counter() - began}

    def wait_until(self, condition: str, timeout_s: float = TIMEOUT_S):
        """Poll a JavaScript expression until it is truthy; its value. An expression that
        throws (the page is reloading: no body yet, its context gone) is polled again."""
        deadline, failed = time.monotonic() + timeout_s, None
        while True:
            try:
                value = self.evaluate(condition)
                if value:
                    return value
            except RuntimeError as error:
                failed = error
            if time.monotonic() > deadline:
                raise TimeoutError(f"{condition!r} did not hold within {timeout_s} s ({failed})")
            time.sleep(0.02)

    def evaluate(self, expression: str):
        """A JavaScript expression's value in the tab (promises awaited); raises on an error."""
        result = self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def errors(self) -> list[str]:
        """The tab's console errors, uncaught exceptions and failed loads so far."""
        self.send("Runtime.evaluate", expression="0")  # drain the events that arrived
        said = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                said.append(details.get("exception", {}).get("description") or details["text"])
            elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
                said.append(
                    " ".join(str(a.get("value", a.get("description"))) for a in params["args"])
                )
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                said.append(params["entry"]["text"])
        return said

    def mouse(self, kind: str, x: float, y: float) -> None:
        """A mouse event at page coordinates: moved, or pressed and released (a click)."""
        if kind == "move":
            self.send("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
            return
        for action in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", type=action, x=x, y=y, button="left",
                      clickCount=1)  # fmt: skip

    def screenshot(self, path: Path, full_page: bool = True) -> Path:
        """A PNG of the tab (all of the page's height when full_page)."""
        params = {"format": "png", "captureBeyondViewport": full_page}
        if full_page:
            height = self.evaluate("document.documentElement.scrollHeight")
            params["clip"] = {"x": 0, "y": 0, "width": self.size[0], "height": height, "scale": 1}
        path.write_bytes(base64.b64decode(self.send("Page.captureScreenshot", **params)["data"]))
        return path


def page_data(path, block: str = "report-data") -> dict:
    """The JSON block `block` of the report page at `path` (its data, its catalogs)."""
    text = Path(path).read_text()
    found = re.search(rf'<script type="application/json" id="{block}">(.*?)</script>', text, re.S)
    return json.loads(found[1])
