"""A loopback fault proxy for the fault suite (a test utility, not part of Kinetic).

:class:`FaultProxy` listens on ``127.0.0.1`` (a free port) in a thread of its own,
with its own event loop, and forwards HTTP requests to one upstream: fake-gcs-server
(plain HTTP) or the kube-apiserver (HTTPS: the proxy then serves TLS with a
self-signed certificate made here, and clients reach it through a kubeconfig with
``insecure-skip-tls-verify``). Responses are streamed, so watches and followed logs
pass through as they come.

Per request, a generator seeded with :attr:`Faults.seed` decides:

* with probability ``rate``, a fault: one of ``statuses`` (5xx and 429, answered
  without reaching the upstream), or a connection reset, either *before* the
  request reaches the upstream or *after* it was served (the work is done, the
  answer is lost; a watch is cut after its first chunk);
* independently, with probability ``latency_rate``, a delay drawn from ``latency``
  before the request is forwarded.

:meth:`FaultProxy.outage` stands in for an upstream restart: it drops every open
connection (watches included) and refuses connections for a while (the listening
socket is closed), then listens again on the same port. :meth:`FaultProxy.forget_history`
stands in for a restart of the kube-apiserver that lost its watch history: it drops
every open connection, and from then on answers ``410 Gone`` to a watch that resumes
from a resourceVersion of before (as an HTTP 410, or as the watch's one ``ERROR``
event), as the apiserver does for a version it no longer holds.

Every decision is counted in :attr:`FaultProxy.counts`. The proxy is bounded: it
stops by itself after ``lifetime`` seconds, and :meth:`FaultProxy.close` stops it.
"""

from __future__ import annotations

import asyncio
import gc
import io
import json
import random
import ssl
import subprocess
import threading
import warnings
from collections import Counter
from collections.abc import Collection, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "host", "content-length", "upgrade"}
)


@dataclass(frozen=True)
class Faults:
    """What the proxy injects, per request, from ``seed``."""

    rate: float = 0.0
    """Share of requests that meet a fault (an error status or a reset)."""
    statuses: tuple[int, ...] = (500, 502, 503, 429)
    reset_share: float = 0.25
    """Share of the faults that are connection resets (half before, half after)."""
    latency_rate: float = 0.0
    latency: tuple[float, float] = (0.02, 0.2)
    seed: int = 0
    script: tuple[str, ...] = ()
    """Decisions for the first requests, in order ("pass", "status-503", "reset-before",
    "reset-after"), before the random ones."""


def self_signed(where: Path) -> tuple[Path, Path]:
    """A certificate and key for ``127.0.0.1``, made with ``openssl`` in ``where``."""
    cert, key = where / "proxy.crt", where / "proxy.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


class FaultProxy:
    """A fault-injecting proxy to ``upstream``; see the module docstring.

    :param upstream: ``http://host:port`` or ``https://host:port`` (its certificate is
        not checked: the testbed's apiserver signs its own).
    :param tls: certificate and key to serve TLS with, or None for plain HTTP.
    :param lifetime: seconds after which the proxy stops by itself.
    """

    def __init__(
        self,
        upstream: str,
        faults: Faults = Faults(),
        *,
        tls: tuple[Path, Path] | None = None,
        lifetime: float = 900.0,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.faults = faults
        self.counts: Counter[str] = Counter()
        self.port = 0
        self._tls = tls
        self._lifetime = lifetime
        self._rng = random.Random(faults.seed)
        self._script = list(faults.script)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._session: aiohttp.ClientSession | None = None
        self._refusing = False
        self._forgotten: tuple[int, frozenset[str]] | None = None
        self._streams: set[aiohttp.ClientResponse] = set()  # open upstream watches, logs
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self._tls else 'http'}://127.0.0.1:{self.port}"

    @property
    def injected(self) -> int:
        """Faults injected so far (error statuses and resets; not delays or outages)."""
        return sum(n for k, n in self.counts.items() if k.startswith(("status-", "reset-")))

    def set_faults(self, faults: Faults) -> None:
        """Use other rates from now on (a fresh generator from ``faults.seed``)."""
        self.faults, self._rng = faults, random.Random(faults.seed)
        self._script = list(faults.script)

    # -- lifecycle (called from the test's thread) -------------------------------------

    def start(self) -> Self:
        self._thread = threading.Thread(target=self._main, name="fault-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(30) or self._error is not None:
            raise RuntimeError(f"the fault proxy did not start: {self._error}")
        return self

    def close(self) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            with suppress(RuntimeError):  # its loop ended meanwhile
                loop.call_soon_threadsafe(stop.set)
        if self._thread is not None:
            self._thread.join(timeout=30)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def outage(self, seconds: float) -> None:
        """Drop every connection and refuse new ones for ``seconds`` (returns at once)."""
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(self._outage(seconds), self._loop)

    def forget_history(self, up_to: int, *, as_event: Collection[str] = ()) -> None:
        """Drop every connection; from now on, answer a watch that resumes from a
        resourceVersion up to ``up_to`` with ``410 Gone`` (module docstring), never
        forwarding it: an HTTP 410 ``Status``, or for the collections named in
        ``as_event`` (a path's last segment: ``"pods"``) an HTTP 200 whose one event is
        an ``ERROR`` carrying that ``Status`` (counted as ``gone-status`` and
        ``gone-event``). Returns once in effect."""
        assert self._loop is not None

        async def forget() -> None:
            self._forgotten = (up_to, frozenset(as_event))
            self._drop_all()

        asyncio.run_coroutine_threadsafe(forget(), self._loop).result(timeout=30)

    # -- the proxy's own loop ----------------------------------------------------------

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # noqa: BLE001 - reported by start()
            self._error = exc
            self._ready.set()
        finally:
            self._collect_own_connections()

    def _collect_own_connections(self) -> None:
        """Collect what this proxy's loop left for the garbage collector, here.

        The proxy cuts connections mid-stream and mid-handshake by design, and an upstream
        connection cut that way can outlive its (closed) loop as unreachable objects. The
        collector would report them as unclosed in whatever test it next ran in, failing
        that test for this proxy's doing. Collected now, while the test that used the
        proxy stops it, they are quiet: the sockets to this proxy's upstream, and the bare
        transports (which name no address). A leaked socket of the code under test is a
        connection to the proxy itself, and is still reported.
        """
        port = urlsplit(self.upstream).port
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "unclosed transport", ResourceWarning)
            warnings.filterwarnings(
                "ignore", rf"unclosed <socket\.socket .*raddr=\('[^']*', {port}\)", ResourceWarning
            )
            gc.collect()

    def _ssl(self) -> ssl.SSLContext | None:
        if self._tls is None:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(*self._tls)
        return context

    async def _listen(self) -> None:
        assert self._runner is not None
        self._site = web.TCPSite(
            self._runner, "127.0.0.1", self.port, ssl_context=self._ssl(), reuse_address=True
        )
        await self._site.start()
        if not self.port:
            self.port = self._runner.addresses[0][1]

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        app = web.Application(client_max_size=1 << 30, handler_args={"max_field_size": 65536})
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        connector = aiohttp.TCPConnector(limit=256, ssl=False)
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        try:
            await self._listen()
            self._ready.set()
            with suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self._lifetime)
        finally:
            self._drop_all()
            await self._runner.cleanup()
            await self._session.close()

    def _drop_all(self) -> None:
        assert self._runner is not None
        server = self._runner.server
        for proto in list(server.connections if server is not None else ()):
            transport = proto.transport
            if transport is not None and not transport.is_closing():
                transport.abort()
                self.counts["dropped"] += 1
        # A stream's client is gone, but its handler would wait on the upstream until
        # the server ends it (minutes): end the upstream side too, as a restart would.
        for stream in list(self._streams):
            stream.close()

    async def _outage(self, seconds: float) -> None:
        self.counts["outages"] += 1
        self._refusing = True
        if self._site is not None:
            await self._site.stop()  # connections are now refused
        self._drop_all()
        await asyncio.sleep(seconds)
        self._refusing = False
        await self._listen()

    def _decide(self) -> tuple[str, float]:
        """The fault for one request ("pass", "status-N", "reset-before", "reset-after")
        and its delay."""
        if self._script:
            return self._script.pop(0), 0.0
        f, rng = self.faults, self._rng
        delay = rng.uniform(*f.latency) if rng.random() < f.latency_rate else 0.0
        if rng.random() >= f.rate:
            return "pass", delay
        if rng.random() < f.reset_share:
            return ("reset-before" if rng.random() < 0.5 else "reset-after"), delay
        return f"status-{rng.choice(f.statuses)}", delay

    def _expired(self, request: web.Request) -> str | None:
        """How a watch from a forgotten resourceVersion is answered ("gone-status",
        "gone-event"), or None: it is not one."""
        if self._forgotten is None or request.query.get("watch") != "true":
            return None
        up_to, as_event = self._forgotten
        try:
            version = int(request.query.get("resourceVersion") or "")
        except ValueError:  # none (a fresh watch) or not a number: the server's own
            return None
        if version > up_to:
            return None
        return "gone-event" if request.path.rsplit("/", 1)[-1] in as_event else "gone-status"

    async def _gone(self, request: web.Request, how: str) -> web.StreamResponse:
        version = request.query.get("resourceVersion")
        status = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f"too old resource version: {version} (the fault proxy forgot it)",
            "reason": "Expired",
            "code": 410,
        }
        if how == "gone-status":
            return web.json_response(status, status=410)
        out = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        await out.prepare(request)
        await out.write(json.dumps({"type": "ERROR", "object": status}).encode() + b"\n")
        await out.write_eof()
        return out

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.counts["requests"] += 1
        expired = self._expired(request)
        if expired is not None:
            self.counts[expired] += 1
            return await self._gone(request, expired)
        fault, delay = self._decide()
        if self._refusing:
            fault = "reset-before"
        if delay:
            self.counts["delayed"] += 1
            self.counts["delay_ms"] += round(delay * 1000)
            await asyncio.sleep(delay)
        if fault != "pass":
            self.counts[fault] += 1
        if fault == "reset-before":
            return _abort(request)
        if fault.startswith("status-"):
            status = int(fault.removeprefix("status-"))
            body = {"code": status, "message": f"injected {status} by the fault proxy"}
            body = {"kind": "Status", **body, "error": dict(body)}
            headers = {"Retry-After": "0"} if status == 429 else {}
            return web.json_response(body, status=status, headers=headers)
        return await self._forward(request, cut=fault == "reset-after")

    async def _forward(self, request: web.Request, *, cut: bool) -> web.StreamResponse:
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        streaming = request.query.get("watch") == "true" or request.query.get("follow") == "true"
        body = await request.read() if request.body_exists else b""
        try:
            async with self._session.request(
                request.method,
                self.upstream + request.path_qs,
                headers=headers,
                data=io.BytesIO(body) if body else None,  # (aiohttp warns on large bytes)
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
                allow_redirects=False,
            ) as upstream:
                out = web.StreamResponse(status=upstream.status, reason=upstream.reason)
                for key, value in upstream.headers.items():
                    if key.lower() not in _HOP:
                        out.headers.add(key, value)
                if not streaming:
                    answer = await upstream.read()
                    if cut:  # served upstream; the answer is lost on the way back
                        return _abort(request)
                    out.content_length = len(answer)
                    await out.prepare(request)
                    await out.write(answer)
                    await out.write_eof()
                    return out
                self.counts["streams"] += 1
                self._streams.add(upstream)
                try:
                    await out.prepare(request)
                    async for chunk in upstream.content.iter_any():
                        await out.write(chunk)
                        if cut:
                            return _abort(request)
                    await out.write_eof()
                    return out
                finally:
                    self._streams.discard(upstream)
        except (aiohttp.ClientError, ConnectionError) as exc:
            if request.transport is None or request.transport.is_closing():
                self.counts["client_gone"] += 1  # it closed a watch, say
                raise asyncio.CancelledError from exc
            self.counts["upstream_errors"] += 1
            return web.json_response({"message": f"proxy: {exc}"}, status=502)


def _abort(request: web.Request) -> web.StreamResponse:
    """Drop the connection without an answer (aiohttp sends nothing on a dead transport)."""
    if request.transport is not None:
        request.transport.abort()
    raise asyncio.CancelledError


@contextmanager
def proxies(
    gcs_upstream: str, kube_upstream: str, storage: Faults, api: Faults, tmp: Path
) -> Iterator[tuple[FaultProxy, FaultProxy]]:
    """A storage proxy (plain HTTP) and an API proxy (TLS), both stopped afterwards."""
    with (
        FaultProxy(gcs_upstream, storage) as gcs,
        FaultProxy(kube_upstream, api, tls=self_signed(tmp)) as kube,
    ):
        yield gcs, kube
