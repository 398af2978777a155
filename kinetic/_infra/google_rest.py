"""Send the Google REST calls of :mod:`kinetic._infra.iam`, ``registry`` and ``identity``.

Theory of operation
-------------------
One client, several API roots (IAM, Artifact Registry, Resource Manager, Storage),
each :class:`~kinetic._infra.iam.Call` sent through :meth:`GoogleRest.send`, where
the rules of :mod:`kinetic._infra.container` hold too:

* **Auth.** Each attempt carries a fresh bearer token from the token source.
* **Deadline.** The whole call, retries included, runs under ``anyio.fail_after``.
* **Retries.** HTTP 429 and 5xx and transport errors, with jittered exponential
  back-off (tenacity).
* **Translation.** 404 is None for the caller; 409 is :class:`Conflict` (it exists
  already; a stale policy etag); 400 is :class:`~kinetic.ConfigError`; 401/403 are
  :class:`~kinetic.BackendError` naming the API to enable and the role to hold;
  anything else is BackendError naming the call. No httpx exception escapes.

:meth:`GoogleRest.wait` polls a long-running operation (Artifact Registry's) until
it is done, bounded by its own timeout.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any, Self

import anyio
import httpx
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from kinetic._exceptions import BackendError, ConfigError, JobTimeoutError, KineticError
from kinetic._infra import identity, registry
from kinetic._infra.gke_api import error_message
from kinetic._infra.iam import Call
from kinetic._net import trust_context

TokenSource = Callable[[], Awaitable[str]]
DEFAULT_TIMEOUT = 30.0
OPERATION_TIMEOUT = 300.0
ROOTS: Mapping[str, str] = {
    identity.IAM_API: identity.IAM_ROOT,
    identity.CRM_API: identity.CRM_ROOT,
    identity.STORAGE_API: identity.STORAGE_ROOT,
    registry.API: registry.API_ROOT,
}
_ENABLE = {
    identity.IAM_API: "Identity and Access Management (IAM) API (iam.googleapis.com)",
    identity.CRM_API: "Cloud Resource Manager API (cloudresourcemanager.googleapis.com)",
    identity.STORAGE_API: "Cloud Storage API",
    registry.API: "Artifact Registry API (artifactregistry.googleapis.com)",
}


class Conflict(BackendError):
    """HTTP 409: the thing exists already, or a policy changed since it was read."""


class _Transient(Exception):
    def __init__(self, status: int, word: str, message: str) -> None:
        super().__init__(f"HTTP {status} {word}: {message}")


class GoogleRest:
    """An async client for the Google REST calls ``kinetic up`` makes beside GKE's.

    :param token: returns a valid access token.
    :param roots: API roots by API key (default: Google's; tests and emulators
        override some).
    :param transport: an httpx transport (tests: ``httpx.MockTransport``).
    :param attempts: tries per call, the first included.
    :param backoff: upper bound of the first back-off, in seconds.
    :param poll_interval: seconds between two polls of an operation.

    Use it as an async context manager (it owns one connection pool).
    """

    def __init__(
        self,
        token: TokenSource,
        *,
        roots: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        attempts: int = 4,
        backoff: float = 0.5,
        poll_interval: float = 2.0,
    ) -> None:
        self._token = token
        self._roots = {**ROOTS, **(roots or {})}
        self._http = httpx.AsyncClient(transport=transport, timeout=None, verify=trust_context())
        self._attempts = attempts
        self._backoff = backoff
        self.poll_interval = poll_interval

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool (shielded from cancellation)."""
        with anyio.CancelScope(shield=True):
            await self._http.aclose()

    async def send(self, call: Call, *, timeout: float = DEFAULT_TIMEOUT) -> Any:
        """Send ``call``; its JSON answer (``{}`` when empty), or None on 404.

        :raises Conflict: HTTP 409.
        :raises ConfigError: HTTP 400 (the request is wrong).
        :raises BackendError: refused, failed, or no answer within ``timeout``.
        """
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self._attempts),
            wait=wait_random_exponential(multiplier=self._backoff, max=10.0),
            retry=retry_if_exception(lambda e: isinstance(e, _Transient | httpx.TransportError)),
            sleep=anyio.sleep,
            reraise=True,
        )
        what = call.what or f"{call.method} {call.path}"
        url = self._roots[call.api].rstrip("/") + call.path
        try:
            with anyio.fail_after(timeout):
                async for attempt in retrying:
                    with attempt:
                        token = await self._token()
                        resp = await self._http.request(
                            call.method,
                            url,
                            params=dict(call.params),
                            json=call.body,
                            headers={"Authorization": f"Bearer {token}"},
                        )
                        return _answer(call.api, resp, what)
        except KineticError:
            raise
        except _Transient as exc:
            raise BackendError(f"{what} failed ({exc})") from exc
        except TimeoutError as exc:
            raise BackendError(f"{what}: no answer within {timeout:g}s") from exc
        except httpx.HTTPError as exc:
            raise BackendError(f"{what} failed: {type(exc).__name__}: {exc}") from exc
        raise AssertionError("unreachable: tenacity either returns or raises")

    async def wait(
        self, operation: Mapping[str, Any], *, what: str, timeout: float = OPERATION_TIMEOUT
    ) -> None:
        """Poll an Artifact Registry operation until it is done.

        :raises BackendError: it failed (its message), or vanished.
        :raises JobTimeoutError: not done within ``timeout`` (it goes on).
        """
        try:
            op = registry.parse_operation(operation)
        except ValueError as exc:
            raise BackendError(f"{what}: the answer is not an operation ({exc})") from exc
        try:
            with anyio.fail_after(timeout):
                while not op.done:
                    await anyio.sleep(self.poll_interval)
                    doc = await self.send(registry.get_operation(op.name))
                    if doc is None:
                        raise BackendError(f"{what}: operation {op.name} vanished")
                    op = registry.parse_operation(doc)
        except TimeoutError as exc:
            raise JobTimeoutError(
                f"{what}: operation {op.name} not done after {timeout:g}s; it goes on"
            ) from exc
        if op.error:
            raise BackendError(f"{what} failed: {op.error}")


def _answer(api: str, resp: httpx.Response, what: str) -> Any:
    status = resp.status_code
    if status < 300:
        return resp.json() if resp.content else {}
    word, message = error_message(status, resp.content)
    if status == 404:
        return None
    if status == 429 or status >= 500:
        raise _Transient(status, word, message)
    if status == 409:
        raise Conflict(f"{what}: HTTP 409 {word}: {message}")
    if status == 400:
        raise ConfigError(f"{what} was refused: {message or word}")
    if status in (401, 403):
        raise BackendError(
            f"{what} was refused (HTTP {status} {word}): {message}. Check the credentials "
            "(gcloud auth application-default login), that they may administer IAM, "
            f"buckets and repositories in the project, and that the {_ENABLE[api]} is enabled"
        )
    raise BackendError(f"{what} failed (HTTP {status} {word}): {message}")
