"""A minimal DevTools-protocol client: headless Chromium, driven over its websocket.

Enough to load a page, read its DOM (``Runtime.evaluate``), wait for a condition and
take a screenshot. Chromium is Debian's ``chromium`` package: :func:`chromium_binary`
installs it with apt when it is missing and this process may (root), and fails with a
clear message otherwise; the browser tests never skip.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, BinaryIO

import aiohttp
import anyio
import anyio.to_thread

_NAMES = ("chromium", "chromium-browser", "google-chrome")

ARTIFACTS = (
    Path(
        os.environ.get("KINETIC_ARTIFACTS")
        or Path(__file__).resolve().parents[1] / "build" / "artifacts"
    )
    / "dashboard"
)
"""Where the browser tests keep their screenshots: ``$KINETIC_ARTIFACTS/dashboard/``
(read at import, before the tests' environment isolation), by default
``build/artifacts/dashboard/`` in the repository."""


def chromium_binary() -> str:
    """The path of a Chromium, installed with apt when missing (as tests/testbed/up
    installs packages).

    :raises RuntimeError: none can be found or installed.
    """
    for name in _NAMES:
        found = shutil.which(name)
        if found:
            return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        for argv in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "chromium"]):
            subprocess.run(argv, check=False, capture_output=True, timeout=900)
        found = shutil.which("chromium")
        if found:
            return found
    raise RuntimeError(
        "the dashboard's browser tests need headless Chromium: install Debian's `chromium` "
        "package (apt-get install chromium), or run the tests as root so they install it"
    )


class Page:
    """One tab, attached in flat mode: commands carry its session id."""

    def __init__(self, browser: Browser, session: str) -> None:
        self.browser = browser
        self.session = session

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        answer: dict[str, Any] = await self.browser.send(method, session=self.session, **params)
        return answer

    async def goto(self, url: str) -> None:
        await self.send("Page.navigate", url=url)
        await self.wait_for("document.readyState === 'complete'", timeout=20)

    async def eval(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-able values)."""
        answer = await self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in answer:
            raise RuntimeError(f"{expression}: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    async def wait_for(self, expression: str, *, timeout: float = 60.0) -> Any:
        """Poll ``expression`` until it is truthy; return its value.

        :raises TimeoutError: when ``timeout`` seconds pass first.
        """
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = await self.eval(expression)
            except RuntimeError:
                value = None  # the page is being replaced
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout}s for {expression}")
            await anyio.sleep(0.1)

    async def screenshot(self, path: Path) -> Path:
        await self.send(
            "Emulation.setDeviceMetricsOverride",
            width=1100,
            height=900,
            deviceScaleFactor=1,
            mobile=False,
        )
        shot = await self.send("Page.captureScreenshot", format="png")
        await anyio.to_thread.run_sync(_write, path, base64.b64decode(shot["data"]))
        return path


class Browser:
    """The browser-wide DevTools connection, with a reader that routes the answers."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self._ids = itertools.count(1)
        self._waiting: dict[int, anyio.Event] = {}
        self._answers: dict[int, dict[str, Any]] = {}

    async def read(self) -> None:
        async for msg in self.ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            data = json.loads(msg.data)
            event = self._waiting.pop(data.get("id", -1), None)
            if event is not None:
                self._answers[data["id"]] = data
                event.set()

    async def send(self, method: str, *, session: str | None = None, **params: Any) -> Any:
        ident = next(self._ids)
        message: dict[str, Any] = {"id": ident, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        done = self._waiting[ident] = anyio.Event()
        await self.ws.send_str(json.dumps(message))
        with anyio.fail_after(30):
            await done.wait()
        answer = self._answers.pop(ident)
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return answer.get("result", {})

    async def new_page(self) -> Page:
        target = await self.send("Target.createTarget", url="about:blank")
        attached = await self.send(
            "Target.attachToTarget", targetId=target["targetId"], flatten=True
        )
        page = Page(self, attached["sessionId"])
        await page.send("Page.enable")
        await page.send("Runtime.enable")
        return page


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _start(profile: Path) -> tuple[subprocess.Popen[bytes], BinaryIO]:
    """Start headless Chromium with its own profile folder; its output to a log there."""
    binary = chromium_binary()
    profile.mkdir(parents=True, exist_ok=True)
    argv = [
        binary,
        "--headless",
        "--no-sandbox",  # root in CI containers; the pages are our own, on loopback
        "--disable-gpu",
        "--no-first-run",
        "--remote-debugging-address=127.0.0.1",
        "--remote-debugging-port=0",
        f"--user-data-dir={profile}",
        "about:blank",
    ]
    log = open(profile / "chromium.log", "wb")  # noqa: SIM115 - closed by launch()
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT), log


def _endpoint(profile: Path, proc: subprocess.Popen[bytes]) -> tuple[str, str] | None:
    """(port, path) of the browser's DevTools websocket, once Chromium wrote them."""
    if proc.poll() is not None:
        raise RuntimeError(f"chromium exited: {(profile / 'chromium.log').read_text()}")
    try:
        words = (profile / "DevToolsActivePort").read_text().split()
    except FileNotFoundError:
        return None
    return (words[0], words[1]) if len(words) >= 2 else None


@asynccontextmanager
async def launch(profile: Path) -> AsyncIterator[Browser]:
    """Start headless Chromium with its own profile folder; end it on exit."""
    proc, log = await anyio.to_thread.run_sync(_start, profile)
    try:
        with anyio.fail_after(30):
            while True:
                found = await anyio.to_thread.run_sync(_endpoint, profile, proc)
                if found is not None:
                    break
                await anyio.sleep(0.1)  # Chromium writes the file; nothing to wait on
        port, path = found
        async with (
            aiohttp.ClientSession() as http,
            http.ws_connect(f"ws://127.0.0.1:{port}{path}", max_msg_size=64 << 20) as ws,
            anyio.create_task_group() as tg,
        ):
            browser = Browser(ws)
            tg.start_soon(browser.read)
            try:
                yield browser
            finally:
                tg.cancel_scope.cancel()
    finally:
        proc.terminate()
        try:
            await anyio.to_thread.run_sync(lambda: proc.wait(10))
        except subprocess.TimeoutExpired:
            proc.kill()
            await anyio.to_thread.run_sync(proc.wait)
        log.close()
