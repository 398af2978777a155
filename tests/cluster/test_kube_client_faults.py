"""The Kubernetes client under faults: a proxy in front of the REAL apiserver injects them.

The proxy terminates TLS on 127.0.0.1 and forwards each request to the testbed's
apiserver, unless its plan says to answer with an error status or to drop the
connection first. Our client must retry 429/5xx/resets with a bound, give up with a
``BackendError``, never leak aiohttp's exceptions, and respect its rate limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import anyio
import anyio.to_thread
import pytest
from aiohttp import web

from kinetic._backends.gke.client import KubeClient
from kinetic._exceptions import BackendError, KineticError
from tests import fix_cluster

pytestmark = pytest.mark.cluster

STALL = 3.0


@dataclass
class FaultProxy:
    """``plan`` is consumed one entry per request: an int status, "reset", "stall", or
    "pass". "stall" answers with the first chunk of a watch, then stops reading the
    connection (so a TLS close from the client is never answered) for a few seconds."""

    url: str
    upstream: str
    plan: list[int | str] = field(default_factory=list)
    seen: list[tuple[float, str, str]] = field(default_factory=list)  # time, method, path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _serve(proxy: FaultProxy, port: int, cert: Path, key: Path, ready: threading.Event,
           stop: threading.Event) -> None:  # fmt: skip
    async def handle(request: web.Request) -> web.StreamResponse:
        proxy.seen.append((time.monotonic(), request.method, request.path))
        action = proxy.plan.pop(0) if proxy.plan else "pass"
        if action == "reset":
            transport = request.transport
            if transport is not None:
                transport.abort()  # the connection drops without an answer
            return web.Response(status=500)
        if action == "stall":
            response = web.StreamResponse()
            await response.prepare(request)
            await response.write(b'{"type": "ADDED", "object": {}}\n')
            transport = request.transport
            if transport is not None:
                transport.pause_reading()
                await asyncio.sleep(STALL)
                transport.abort()  # paused, it would never see the client go
            return response
        if isinstance(action, int):
            body = {"kind": "Status", "code": action, "message": f"injected {action}"}
            headers = {"Retry-After": "0"} if action == 429 else {}
            return web.json_response(body, status=action, headers=headers)
        async with (
            aiohttp.ClientSession() as session,
            session.request(
                request.method,
                proxy.upstream + request.path_qs,
                headers={k: v for k, v in request.headers.items() if k.lower() != "host"},
                data=await request.read(),
                ssl=False,
            ) as upstream,
        ):
            return web.Response(
                status=upstream.status,
                body=await upstream.read(),
                content_type=upstream.content_type,
            )

    async def main() -> None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        runner = web.AppRunner(web.Application(handler_args={"max_field_size": 65536}))
        runner.app.router.add_route("*", "/{tail:.*}", handle)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", port, ssl_context=context)
        await site.start()
        ready.set()
        await anyio.to_thread.run_sync(stop.wait)  # until the fixture's teardown
        await runner.cleanup()

    anyio.run(main)


@pytest.fixture
def fault_proxy(testbed: fix_cluster.Testbed, tmp_path: Path) -> Iterator[tuple[FaultProxy, Path]]:
    cert, key = tmp_path / "proxy.crt", tmp_path / "proxy.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    port = _free_port()
    proxy = FaultProxy(url=f"https://127.0.0.1:{port}", upstream="https://127.0.0.1:6443")
    ready, stop = threading.Event(), threading.Event()
    thread = threading.Thread(
        target=_serve, args=(proxy, port, cert, key, ready, stop), daemon=True
    )
    thread.start()
    if not ready.wait(30):
        pytest.fail("the fault proxy did not start")
    token = testbed.env.get("KINETIC_TESTBED_TOKEN", "test-token")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "p",
                        "cluster": {"server": proxy.url, "insecure-skip-tls-verify": True},
                    }
                ],
                "users": [{"name": "u", "user": {"token": token}}],
                "contexts": [{"name": "c", "context": {"cluster": "p", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    yield proxy, kubeconfig
    stop.set()
    thread.join(timeout=10)


def _client(kubeconfig: Path, **kw: float) -> KubeClient:
    return KubeClient(kubeconfig=str(kubeconfig), backoff=0.01, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("fault", [503, 500, 429, "reset"])
def test_transient_faults_are_retried(
    fault_proxy: tuple[FaultProxy, Path], fault: int | str
) -> None:
    proxy, kubeconfig = fault_proxy
    proxy.plan = [fault, fault]

    async def go() -> object:
        client = _client(kubeconfig)
        try:
            return await client.read_namespace("default")
        finally:
            await client.aclose()

    namespace = anyio.run(go)
    assert isinstance(namespace, dict)
    assert namespace["metadata"]["name"] == "default"
    assert len(proxy.seen) == 3  # two faults, then the real answer


def test_persistent_faults_end_in_a_backend_error_after_the_attempts(
    fault_proxy: tuple[FaultProxy, Path],
) -> None:
    proxy, kubeconfig = fault_proxy
    proxy.plan = [503] * 10

    async def go() -> None:
        client = _client(kubeconfig, attempts=3)
        try:
            await client.read_namespace("default")
        finally:
            await client.aclose()

    with pytest.raises(BackendError) as info:
        anyio.run(go)
    assert isinstance(info.value, KineticError)
    assert "503" in str(info.value) or "injected" in str(info.value)
    assert len(proxy.seen) == 3


def test_refusals_are_not_retried(fault_proxy: tuple[FaultProxy, Path]) -> None:
    proxy, kubeconfig = fault_proxy
    proxy.plan = [403]

    async def go() -> None:
        client = _client(kubeconfig)
        try:
            await client.read_namespace("default")
        finally:
            await client.aclose()

    with pytest.raises(BackendError, match="403"):
        anyio.run(go)
    assert len(proxy.seen) == 1


def test_the_client_side_rate_limit_spaces_requests(fault_proxy: tuple[FaultProxy, Path]) -> None:
    proxy, kubeconfig = fault_proxy

    async def go() -> None:
        client = _client(kubeconfig, qps=5.0, burst=1)
        try:
            async with anyio.create_task_group() as tg:
                for _ in range(6):
                    tg.start_soon(client.read_namespace, "default")
        finally:
            await client.aclose()

    anyio.run(go)
    times = sorted(t for t, _, _ in proxy.seen)
    assert len(times) == 6
    # 6 requests at 5 per second with a burst of 1 cannot arrive within one second.
    assert times[-1] - times[0] >= 0.9


def test_closing_the_client_closes_connections_whose_tls_close_is_never_answered(
    fault_proxy: tuple[FaultProxy, Path],
) -> None:
    # A watch given up half-read ends its connection with a TLS close the server may
    # never answer. The loop then ends; the socket must have been closed, not left to
    # the garbage collector (a ResourceWarning, an error in this suite).
    proxy, kubeconfig = fault_proxy
    proxy.plan = ["stall"]

    async def go() -> bytes:
        client = _client(kubeconfig)
        try:
            stream = client.stream(
                "/api/v1/namespaces/default/pods",
                what="watch pods",
                query=[("watch", "true")],
                read_timeout=None,
            )
            async with contextlib.aclosing(stream) as chunks:
                async for chunk in chunks:
                    return chunk
            return b""
        finally:
            await client.aclose()

    assert b"ADDED" in anyio.run(go)
    gc.collect()
