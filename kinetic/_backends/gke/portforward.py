"""Port-forward to a pod through the Kubernetes API: websockets, no ``kubectl``.

Theory of operation
-------------------
Each call of :meth:`PodPortForward.connect` opens one websocket on the pod's
``portforward`` subresource (``GET /api/v1/namespaces/{ns}/pods/{pod}/portforward
?ports={port}``, upgraded, subprotocol ``v4.channel.k8s.io``), which the API server
relays to the kubelet, which connects to the port on the pod's loopback. One
websocket carries one TCP connection; the framing rules are in
:mod:`kinetic._core.debug`. The result is an anyio :class:`~anyio.abc.ByteStream`,
so the relay that uses it treats a pod and a local socket alike.

The forward runs on a loop of its own (:mod:`kinetic._debug.forward`), so it opens
its own aiohttp session from the client's endpoint and uses its own copy of the
client's credentials (:meth:`KubeClient.credentials_for_another_loop`); a handshake
refused with 401 renews a credential that can change and is tried once more.

Bounds: opening (handshake and the server's first frame) is bounded by
``connect_timeout``; each send by ``send_timeout``; a quiet connection is legitimate
(a debugger sitting at a breakpoint), so reads have no deadline, but the websocket's
heartbeat (a ping every ``heartbeat`` seconds) ends a connection whose peer went
away. aiohttp, ``ssl`` and ``OSError`` errors become :class:`~kinetic.BackendError`
(or ``anyio.BrokenResourceError`` inside an open stream).

The kubelet needs help from the node to reach a pod's port: with the Docker runtime
(dockershim) it runs ``nsenter`` + ``socat`` on the node, and reports "unable to do
port forwarding: socat not found" on the error channel when socat is missing; that
text is what :meth:`PodPortForward.connect` raises.
"""

from __future__ import annotations

import logging
from types import TracebackType
from typing import Self

import aiohttp
import anyio
from anyio.abc import ByteStream

from kinetic._backends.gke.credentials import Credentials
from kinetic._core.debug import ForwardError, PortForwardDecoder, encode_data
from kinetic._exceptions import BackendError, KineticError

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 30.0
SEND_TIMEOUT = 30.0
HEARTBEAT = 30.0
CLOSE_TIMEOUT = 5.0
PROTOCOL = "v4.channel.k8s.io"
ERROR_GRACE = 0.3
"""Seconds a new connection waits for an error right behind the server's opening frames."""


class PodPortForward:
    """Connections to ``port`` of pod ``namespace/pod`` through the API server.

    Use as an async context manager on the loop that will make the connections (it
    holds an aiohttp session).

    :param credentials: the API server and credentials to use, for this forward's
        loop alone (:meth:`KubeClient.credentials_for_another_loop`).
    """

    def __init__(
        self,
        credentials: Credentials,
        namespace: str,
        pod: str,
        port: int,
        *,
        connect_timeout: float = CONNECT_TIMEOUT,
        send_timeout: float = SEND_TIMEOUT,
        heartbeat: float = HEARTBEAT,
    ) -> None:
        self.credentials = credentials
        self.namespace = namespace
        self.pod = pod
        self.port = port
        self.connect_timeout = connect_timeout
        self.send_timeout = send_timeout
        self.heartbeat = heartbeat
        self._session: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:
        return f"PodPortForward({self.namespace}/{self.pod}:{self.port})"

    def describe(self) -> str:
        return f"pod {self.namespace}/{self.pod} port {self.port} (Kubernetes API port-forward)"

    async def __aenter__(self) -> Self:
        self._session = self.credentials.endpoint.open_session()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        session, self._session = self._session, None
        if session is not None:
            with anyio.CancelScope(shield=True), anyio.move_on_after(CLOSE_TIMEOUT):
                try:
                    await session.close()
                except Exception as err:  # noqa: BLE001 - closing must not fail loudly
                    log.debug("closing the port-forward session failed: %s", err)

    async def connect(self) -> ByteStream:
        """Open one connection to the pod's port.

        :raises BackendError: the API server refused (RBAC, no such pod, pod not
            running), the kubelet could not reach the port (its message), or the
            connection did not open within ``connect_timeout``.
        :raises ConfigError: no credential could be obtained (an exec plugin failed).
        """
        if self._session is None:
            raise RuntimeError("PodPortForward is not open")
        what = f"port-forward to {self.namespace}/{self.pod}:{self.port}"
        ws: aiohttp.ClientWebSocketResponse | None = None
        try:
            with anyio.fail_after(self.connect_timeout):
                ws = await self._open(self._session)
                stream = _PodStream(ws, self.port, self.send_timeout)
                await stream.handshake(what)
                return stream
        except BaseException as exc:
            if ws is not None:
                with anyio.CancelScope(shield=True), anyio.move_on_after(CLOSE_TIMEOUT):
                    await ws.close()
            if isinstance(exc, KineticError):
                raise
            if isinstance(exc, TimeoutError):
                raise BackendError(
                    f"Kubernetes API: {what} did not open within {self.connect_timeout}s"
                ) from exc
            if isinstance(exc, aiohttp.WSServerHandshakeError):
                raise BackendError(
                    f"Kubernetes API refused {what} (HTTP {exc.status}): {exc.message}"
                ) from exc
            if isinstance(exc, Exception) and not isinstance(exc, anyio.get_cancelled_exc_class()):
                raise BackendError(
                    f"Kubernetes API: {what} failed: {type(exc).__name__}: {exc}"
                ) from exc
            raise

    async def _open(self, session: aiohttp.ClientSession) -> aiohttp.ClientWebSocketResponse:
        """The upgraded websocket; a 401 to a credential that can change is tried
        once more with a new one.

        :raises aiohttp.WSServerHandshakeError: the API server refused the upgrade.
        """
        endpoint = self.credentials.endpoint
        path = f"/api/v1/namespaces/{self.namespace}/pods/{self.pod}/portforward"
        for send in (1, 2):
            auth = await self.credentials.auth()
            try:
                ws: aiohttp.ClientWebSocketResponse = await session.ws_connect(
                    endpoint.url(path),
                    params={"ports": str(self.port)},
                    protocols=(PROTOCOL,),
                    heartbeat=self.heartbeat,
                    headers=dict(auth.headers),
                    **endpoint.options(auth),
                )
            except aiohttp.WSServerHandshakeError as exc:
                if exc.status == 401 and send == 1 and self.credentials.invalidate(auth):
                    continue
                raise
            return ws
        raise AssertionError("unreachable")


class _PodStream(ByteStream):
    """One forwarded TCP connection over a port-forward websocket."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, port: int, send_timeout: float) -> None:
        self._ws = ws
        self._decoder = PortForwardDecoder(port)
        self._send_timeout = send_timeout
        self._pending = b""

    async def handshake(self, what: str) -> None:
        """Read the server's opening frames (the two port prefixes), then wait
        :data:`ERROR_GRACE` for an error that follows them at once (the kubelet cannot
        reach the port), so that ``connect`` reports it.

        :raises BackendError: the server reported an error or closed the stream.
        """
        try:
            while not self._decoder.ready:
                self._pending += await self._next()
            if not self._pending:
                with anyio.move_on_after(ERROR_GRACE):
                    self._pending = await self._next()
        except anyio.EndOfStream as exc:
            raise BackendError(f"{what}: the API server closed the stream at once") from exc
        except anyio.BrokenResourceError as exc:
            raise BackendError(f"{what} failed: {exc}") from exc

    async def _next(self) -> bytes:
        """The data of the next message from the pod (empty for a bare port prefix).

        :raises anyio.EndOfStream: the connection ended.
        :raises anyio.BrokenResourceError: the server reported an error (its text).
        """
        while True:
            msg = await self._ws.receive()
            if msg.type == aiohttp.WSMsgType.BINARY:
                try:
                    event = self._decoder.receive(msg.data)
                except ValueError as exc:
                    raise anyio.BrokenResourceError(str(exc)) from exc
                if isinstance(event, ForwardError):
                    raise anyio.BrokenResourceError(event.message)
                return event.data
            if msg.type in (
                aiohttp.WSMsgType.CLOSE,
                aiohttp.WSMsgType.CLOSING,
                aiohttp.WSMsgType.CLOSED,
            ):
                raise anyio.EndOfStream
            if msg.type == aiohttp.WSMsgType.ERROR:
                raise anyio.BrokenResourceError(str(self._ws.exception()))
            # TEXT, PING, PONG: not part of the binary protocol; skipped.

    async def receive(self, max_bytes: int = 65536) -> bytes:
        while not self._pending:
            self._pending = await self._next()
        data, self._pending = self._pending[:max_bytes], self._pending[max_bytes:]
        return data

    async def send(self, item: bytes) -> None:
        try:
            with anyio.fail_after(self._send_timeout):
                await self._ws.send_bytes(encode_data(item))
        except TimeoutError as exc:
            raise anyio.BrokenResourceError("port-forward send timed out") from exc
        except (aiohttp.ClientError, ConnectionError, RuntimeError) as exc:
            raise anyio.BrokenResourceError(str(exc)) from exc

    async def send_eof(self) -> None:
        """The protocol has no half-close: the connection ends with :meth:`aclose`."""

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(CLOSE_TIMEOUT):
            try:
                await self._ws.close()
            except Exception as exc:  # noqa: BLE001 - closing must not fail loudly
                log.debug("closing a port-forward websocket failed: %s", exc)
