"""Headless Chromium (Debian's `chromium`) driven over the DevTools protocol, for testing HTML reports.

`--remote-debugging-pipe` gives the protocol on file descriptors 3 (commands in) and 4 (replies
and events out), NUL-separated JSON: no port, no websocket library, no Playwright download.
`open_page` loads a file:// URL and records what a person would not see: every JavaScript
exception and console error, and every request the page attempted.

Run as a script to take a screenshot of a report (what the README's docs/report.png is):

    python tests/helpers/chromium.py report.html docs/report.png [WIDTH HEIGHT]
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def chromium_binary() -> str | None:
    """The Chromium executable on PATH (Debian: chromium), or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class Page:
    """What loading a page produced."""

    url: str
    errors: list[str] = field(default_factory=list)  # JS exceptions, console errors, CSP violations
    requests: list[str] = field(default_factory=list)  # every URL the page asked for (the page itself included)
    browser: "Chromium | None" = None
    session: str = ""

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (awaited if it is a promise)."""
        assert self.browser is not None
        reply = self.browser.call(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True}, self.session
        )
        if "exceptionDetails" in reply:
            raise AssertionError(f"evaluating {expression!r} threw: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    def screenshot(self, path: Path, width: int = 1280, height: int = 1600) -> Path:
        """A PNG of the page's top `height` pixels at `width`."""
        assert self.browser is not None
        self.browser.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            self.session,
        )
        time.sleep(0.5)  # plotly redraws responsive charts on resize
        shot = self.browser.call("Page.captureScreenshot", {"format": "png"}, self.session)
        Path(path).write_bytes(base64.b64decode(shot["data"]))
        return Path(path)


class Chromium:
    """One headless Chromium process; use as a context manager."""

    def __init__(self, binary: str | None = None) -> None:
        self.binary = binary or chromium_binary()
        if self.binary is None:
            raise RuntimeError("no chromium on PATH (Debian: apt-get install -y chromium)")
        self._id = 0
        self._buffer = b""
        self.events: list[dict[str, Any]] = []

    def __enter__(self) -> "Chromium":
        self.profile = tempfile.mkdtemp(prefix="arle-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def fds() -> None:  # in the child: the protocol's fixed descriptors 3 and 4
            os.dup2(to_child_r, 3)
            os.dup2(from_child_w, 4)

        self.proc = subprocess.Popen(
            [
                self.binary,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--remote-debugging-pipe",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-dev-shm-usage",
                f"--user-data-dir={self.profile}",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # 3 and 4 are kept open: subprocess closes the other descriptors after preexec_fn runs.
            pass_fds=(3, 4),
            preexec_fn=fds,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.call("Browser.close", {}, timeout=10)
        except Exception:  # noqa: BLE001 - closing a browser that already died
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_child)
        os.close(self._from_child)
        shutil.rmtree(self.profile, ignore_errors=True)

    # -- the protocol ------------------------------------------------------------------------

    def _read_message(self, deadline: float) -> dict[str, Any]:
        import select

        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("chromium did not answer in time")
            ready, _, _ = select.select([self._from_child], [], [], left)
            if ready:
                chunk = os.read(self._from_child, 1 << 20)
                if not chunk:
                    raise RuntimeError(f"chromium exited (code {self.proc.poll()})")
                self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def call(
        self, method: str, params: dict[str, Any] | None = None, session: str = "", timeout: float = 60
    ) -> dict[str, Any]:
        """Send one command and return its result; events that arrive meanwhile are kept in `events`."""
        self._id += 1
        message: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_child, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def pump(self, seconds: float) -> None:
        """Collect events for `seconds`."""
        deadline = time.monotonic() + seconds
        try:
            while True:
                self.events.append(self._read_message(deadline))
        except TimeoutError:
            pass

    # -- pages ---------------------------------------------------------------------------------

    def open_page(
        self, path: Path, *, ready: str = "document.body && document.body.dataset.ready === '1'", timeout: float = 60
    ) -> Page:
        """Load a file in a new tab and wait until `ready` is true (or a timeout); then the page's
        errors and requests so far are in the returned Page."""
        url = Path(path).resolve().as_uri()
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Network", "Page"):
            self.call(f"{domain}.enable", {}, session)
        start = len(self.events)
        self.call("Page.navigate", {"url": url}, session)
        page = Page(url=url, browser=self, session=session)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if page.evaluate(f"!!({ready})"):
                break
            self.pump(0.2)
        self.pump(0.5)  # late errors (a chart drawn after the flag)
        for event in self.events[start:]:
            if event.get("sessionId") != session:
                continue
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                page.errors.append(str(details.get("exception", {}).get("description") or details.get("text")))
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                page.errors.append(
                    "console: " + " ".join(str(a.get("value", a.get("description"))) for a in params.get("args", []))
                )
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                page.errors.append("log: " + params["entry"].get("text", ""))
            elif method == "Network.requestWillBeSent":
                page.requests.append(params.get("request", {}).get("url", ""))
        return page


# ---------------------------------------------------------------------------------------------
# PNG checks without Pillow


def png_colours(path: Path, limit: int = 4096) -> int:
    """How many distinct colours an 8-bit RGB/RGBA PNG holds (counting stops at `limit`):
    a blank screenshot has one."""
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        chunk = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", chunk)
            assert depth == 8 and colour in (2, 6) and interlace == 0, "only 8-bit RGB(A), non-interlaced"
            bpp = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * bpp
    prev = bytearray(stride)
    colours: set[bytes] = set()
    for y in range(height):
        row_start = y * (stride + 1)
        kind, line = raw[row_start], bytearray(raw[row_start + 1 : row_start + 1 + stride])
        for i in range(stride):  # undo the PNG row filter
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        prev = line
        if y % 4 == 0:  # every 4th row is plenty to tell a page from a blank
            colours.update(bytes(line[i : i + 3]) for i in range(0, stride, bpp * 2))
            if len(colours) >= limit:
                break
    return len(colours)


if __name__ == "__main__":
    html_path, png_path = Path(sys.argv[1]), Path(sys.argv[2])
    size = (int(sys.argv[3]), int(sys.argv[4])) if len(sys.argv) > 4 else (1280, 1600)
    with Chromium() as browser:
        page = browser.open_page(html_path)
        if page.errors:
            sys.exit(f"page errors: {page.errors}")
        page.screenshot(png_path, *size)
    print(f"{png_path}: {png_colours(png_path)} colours")
