"""The one HTTP edge of Kinetic's own REST and streaming calls, on aiohttp.

Theory of operation
-------------------
Every client Kinetic speaks HTTP with (the Kubernetes API, the Container, IAM,
Artifact Registry, Resource Manager and Storage admin APIs, Cloud Build, a registry's
v2 API, the Docker Engine over its unix socket) owns one :class:`HttpClient`, and
keeps only its answer rules: which answers are values, which are worth asking again
(:class:`Transient`), which are errors of its own. gcloud-aio-storage's session (the
objects in GCS) is that library's, outside this edge.

An :class:`HttpClient` owns one ``aiohttp.ClientSession``, opened lazily inside the
event loop that uses it (on its first call: the session belongs to that loop) and
closed by :meth:`HttpClient.aclose`, shielded. Over TCP it verifies with the one
trust configuration, :func:`kinetic._net.trust_context` (built in a worker thread,
never on the loop), and consults the proxy variables only where some are set
(:func:`kinetic._net.trust_env_needed`); over a unix socket (Docker) it speaks plain
HTTP. A Kubernetes client passes its own opener (its endpoint's session: the
cluster's CA, a client certificate).

:meth:`HttpClient.call` runs one call under the same rules for every client:

* **Deadline.** The whole call, retries (and obtaining a credential) included, runs
  under ``anyio.fail_after(timeout)``; ``None`` leaves it to the caller's own deadline.
* **Retries.** :class:`Transient` (an answer the client's rules ask to try again:
  HTTP 429 and 5xx, and what else an API says), connection errors and resets, a
  truncated body and one attempt's timeout are retried with jittered exponential
  back-off (tenacity), ``attempts`` tries in all.
* **Translation.** What the retries could not mend becomes the client's error type
  (``BackendError``, ``StorageError``, ``ImageBuildError``) naming the call:
  ``"{what} failed (HTTP 503 ...)"``, ``"{what} failed: cannot connect to ...``,
  ``"{what}: no answer within 30s"``. Kinetic errors the rules raise pass unchanged.
  No aiohttp, ``ssl`` or ``OSError`` exception escapes.

:meth:`HttpClient.request` is such a call with the usual attempt: a fresh bearer token
from a token source (none for an emulator), the request, its body read, and the
client's ``answer`` applied to the :class:`Reply`. Clients with more to do per attempt
(the Kubernetes client: a rate limit, a credential renewed on 401) pass
:meth:`~HttpClient.call` their own attempt built on :meth:`HttpClient.open`.

:meth:`HttpClient.streaming` opens a long-lived response (a Kubernetes watch or
followed log, a Docker build's progress): opening is bounded and translated, reading
is translated ("broke off"); it is never retried, as the caller decides how to resume.
"""

from __future__ import annotations

import contextlib
import json as jsonlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Self, TypeVar

import aiohttp
import anyio
import anyio.to_thread
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)

from kinetic._exceptions import KineticError
from kinetic._net import tls_closing_connector, trust_context, trust_env_needed

__all__ = [
    "FOREIGN",
    "HttpClient",
    "HttpOwner",
    "Reply",
    "TokenSource",
    "Transient",
    "describe",
    "is_transient",
]

log = logging.getLogger(__name__)

T = TypeVar("T")
TokenSource = Callable[[], Awaitable[str]]
"""Returns a valid access token (refreshed by the auth library when it expires)."""
Opener = Callable[[], aiohttp.ClientSession]

FOREIGN = (aiohttp.ClientError, OSError, ValueError)
"""The transport's and the wire's exceptions (connections, TLS, timeouts, bodies that
do not parse): translated at this edge, never leaked."""


class Transient(Exception):
    """One attempt's answer worth asking again (an HTTP 429 or 5xx, an operation that
    must wait its turn). Its message says what was answered ("HTTP 503 UNAVAILABLE:
    ..."); when no try is left, the call fails with ``"{what} failed ({message})"``."""


def is_transient(exc: BaseException) -> bool:
    """Whether one attempt's failure is worth another try: :class:`Transient`, a
    connection error or reset, a truncated body, or one attempt's timeout (the call's
    own deadline is outside the attempts)."""
    return isinstance(
        exc,
        Transient
        | aiohttp.ClientConnectionError  # refused, reset, disconnected, TLS
        | aiohttp.ClientPayloadError  # the answer broke off mid-body
        | ConnectionError
        | TimeoutError,
    )


def describe(exc: BaseException) -> str:
    """A transport failure in words: where a connection could not be made, and why
    (aiohttp's own text shows its SSL context's repr); else ``Type: message``."""
    if isinstance(exc, aiohttp.ClientConnectorError) and not isinstance(
        exc,
        aiohttp.ClientSSLError,  # a TLS failure: its own text says what did not verify
    ):
        code = exc.os_error.errno
        why = os.strerror(code) if code else str(exc.os_error)
        where = getattr(exc, "path", None) or f"{exc.host}:{exc.port}"  # a unix socket's
        return f"cannot connect to {where}: {why}"
    return f"{type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class Reply:
    """One answer, read whole: what a client's answer rules judge (pure).

    :ivar attempt: which try of the call it answers (1 for the first).
    """

    status: int
    reason: str
    headers: Mapping[str, str] = field(repr=False)
    body: bytes = field(repr=False)
    attempt: int = 1

    @property
    def text(self) -> str:
        """The body as text (UTF-8, invalid bytes replaced)."""
        return self.body.decode(errors="replace")

    def json(self) -> Any:
        """The body as JSON.

        :raises ValueError: it is not JSON.
        """
        return jsonlib.loads(self.body)


class HttpClient:
    """One session and the rules every call of one client follows (module docstring).

    :param error: the client's error type (``BackendError``, ``StorageError``, ...).
    :param prefix: the words its messages start with (``"GKE: "``).
    :param base_url: prefixed to URLs without a scheme ("" for absolute URLs only).
    :param attempts: tries per call, the first included.
    :param backoff: upper bound of the first back-off, in seconds (doubling per retry,
        full jitter).
    :param max_backoff: the longest back-off, in seconds.
    :param attempt_timeout: seconds one attempt may wait for a connection or for the
        next bytes of the answer (None: only the call's deadline).
    :param unix_socket: speak plain HTTP over this unix socket (the Docker Engine).
    :param opener: opens the session instead (a Kubernetes endpoint's).

    Use it as an async context manager, or close it with :meth:`aclose`.
    """

    def __init__(
        self,
        *,
        error: Callable[[str], KineticError],
        prefix: str = "",
        base_url: str = "",
        attempts: int = 4,
        backoff: float = 0.5,
        max_backoff: float = 10.0,
        attempt_timeout: float | None = None,
        unix_socket: str | None = None,
        opener: Opener | None = None,
    ) -> None:
        self._error, self.prefix = error, prefix
        self.base_url = base_url.rstrip("/")
        self._attempts, self._backoff, self._max_backoff = attempts, backoff, max_backoff
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=attempt_timeout, sock_read=attempt_timeout
        )
        self._unix_socket, self._opener = unix_socket, opener
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def url(self, url: str) -> str:
        """``url``, under :attr:`base_url` unless it is absolute."""
        return url if "://" in url else self.base_url + url

    def error(self, message: str) -> KineticError:
        """The client's error naming ``message`` (prefixed)."""
        return self._error(self.prefix + message)

    async def session(self) -> aiohttp.ClientSession:
        """The session, opened on the first use (in this loop: it belongs to it).

        :raises KineticError: the client is closed (its error type); the trust
            variables name nothing usable (:class:`~kinetic.ConfigError`).
        """
        if self._session is None and not self._closed and self._opener is not None:
            self._session = self._opener()
        elif self._session is None and not self._closed and self._unix_socket is not None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=self._unix_socket),
                timeout=self._timeout,
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        elif self._session is None and not self._closed:
            # Both block (CA files, the environment and ~/.netrc): not on the loop.
            await anyio.to_thread.run_sync(trust_context)
            trust_env = await anyio.to_thread.run_sync(trust_env_needed)
            if self._session is None and not self._closed:
                self._session = aiohttp.ClientSession(
                    connector=tls_closing_connector(),
                    trust_env=trust_env,
                    timeout=self._timeout,
                    cookie_jar=aiohttp.DummyCookieJar(),  # no API here sets one we need
                )
        if self._closed or self._session is None:
            raise self.error("the HTTP client is closed")
        return self._session

    async def aclose(self) -> None:
        """Close the session. Idempotent; shielded from cancellation; never raises."""
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            with anyio.CancelScope(shield=True):
                try:
                    await session.close()
                except Exception as exc:  # noqa: BLE001 - closing must not fail loudly
                    log.debug("closing an HTTP session failed: %s", exc)

    # -- one attempt ------------------------------------------------------------------

    async def open(
        self,
        method: str,
        url: str,
        *,
        params: Any = None,
        json: Any = None,
        data: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout: aiohttp.ClientTimeout | None = None,
        **options: Any,
    ) -> aiohttp.ClientResponse:
        """Send one request; the open response, whatever its status (release it).
        ``options`` are aiohttp's (``ssl``, ``proxy``, ``auth``, ...).

        :raises aiohttp.ClientError, OSError: the transport failed (for :meth:`call`
            or :meth:`streaming` to judge and translate).
        """
        session = await self.session()
        return await session.request(
            method,
            self.url(url),
            params=params,
            json=json,
            data=data,
            headers=headers,
            timeout=timeout or self._timeout,
            **options,
        )

    async def send(self, method: str, url: str, *, attempt: int = 1, **request: Any) -> Reply:
        """:meth:`open`, with the body read whole and the connection released."""
        resp = await self.open(method, url, **request)
        try:
            body = await resp.read()
        finally:
            resp.release()
        return Reply(resp.status, resp.reason or "", resp.headers, body, attempt)

    # -- the shell --------------------------------------------------------------------

    async def call(
        self, what: str, attempt: Callable[[int], Awaitable[T]], *, timeout: float | None
    ) -> T:
        """Run ``attempt`` (given the try's number, 1 first) under the module's rules:
        again while it fails transiently, all within ``timeout``.

        :raises KineticError: what ``attempt`` raised; else the client's error type when
            the call failed after its retries, or got no answer within ``timeout``.
        """
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self._attempts),
            wait=wait_random_exponential(multiplier=self._backoff, max=self._max_backoff),
            retry=retry_if_exception(is_transient),
            sleep=anyio.sleep,
            before_sleep=_log_retry,
            reraise=True,
        )
        try:
            with anyio.move_on_after(timeout) as deadline:
                async for tried in retrying:
                    with tried:
                        return await attempt(tried.retry_state.attempt_number)
        except KineticError:
            raise
        except Transient as exc:
            raise self.error(f"{what} failed ({exc})") from exc
        except FOREIGN as exc:  # one attempt's own timeout included
            raise self.error(f"{what} failed: {describe(exc)}") from exc
        if deadline.cancelled_caught:
            raise self.error(f"{what}: no answer within {timeout:g}s")
        raise AssertionError("unreachable: tenacity either returns or raises")

    async def request(
        self,
        method: str,
        url: str,
        *,
        what: str,
        answer: Callable[[Reply], T],
        timeout: float | None,
        token: TokenSource | None = None,
        headers: Mapping[str, str] | None = None,
        **request: Any,
    ) -> T:
        """One call (:meth:`call`) of the usual attempt: a fresh token from ``token``
        (none: send no credentials), the request (``request``: ``params``, ``json``,
        ``data``, as :meth:`open`), its body read, and what ``answer`` made of it.

        :raises KineticError: what ``answer`` raised; the client's error type when no
            token could be had, or as :meth:`call`.
        """

        async def attempt(number: int) -> T:
            sent = dict(headers or {})
            if token is not None:
                sent["Authorization"] = f"Bearer {await self._token(token)}"
            reply = await self.send(method, url, attempt=number, headers=sent, **request)
            return answer(reply)

        return await self.call(what, attempt, timeout=timeout)

    async def _token(self, token: TokenSource) -> str:
        try:
            value = await token()
        except KineticError:
            raise
        except Exception as exc:  # the auth library raises many kinds; translated here
            raise self.error(f"getting an access token failed: {describe(exc)}") from exc
        if not value:
            raise self.error("no access token (are Google credentials set up?)")
        return value

    @contextlib.asynccontextmanager
    async def streaming(
        self,
        what: str,
        opening: Callable[[], Awaitable[aiohttp.ClientResponse]],
        *,
        timeout: float,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """The response ``opening`` opens (bounded by ``timeout``), for the body of the
        ``async with`` to read; released at its end. Not retried.

        :raises KineticError: the client's error type: opening failed or got no answer
            within ``timeout`` (``"{what} failed: ..."``), or reading broke off
            (``"{what} broke off: ..."``); what the body raises otherwise passes.
        """
        resp: aiohttp.ClientResponse | None = None
        try:
            with anyio.move_on_after(timeout):
                resp = await opening()
        except KineticError:
            raise
        except FOREIGN as exc:
            raise self.error(f"{what} failed: {describe(exc)}") from exc
        if resp is None:
            raise self.error(f"{what}: no answer within {timeout:g}s")
        try:
            yield resp
        except KineticError:
            raise
        except FOREIGN as exc:
            raise self.error(f"{what} broke off: {describe(exc)}") from exc
        finally:
            resp.release()


def _log_retry(state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome else None
    log.debug("HTTP attempt %d failed (%s), retrying", state.attempt_number, exc)


class HttpOwner:
    """The base of a client that owns an :class:`HttpClient` (``self._http``): an async
    context manager over it, which :meth:`aclose` closes."""

    _http: HttpClient

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool (shielded from cancellation)."""
        await self._http.aclose()
