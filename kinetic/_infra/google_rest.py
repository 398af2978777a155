"""Send the Google REST calls of :mod:`kinetic._infra.iam`, ``registry`` and ``identity``.

Theory of operation
-------------------
One client, several API roots (IAM, Artifact Registry, Resource Manager, Storage),
each :class:`~kinetic._infra.iam.Call` sent through :meth:`GoogleRest.send`, under
the rules of Kinetic's HTTP edge (:mod:`kinetic._http`: a fresh bearer token per
attempt, one deadline per call, retries of HTTP 429 and 5xx and transport errors),
with these answer rules:

* **Translation.** 404 is None for the caller; 409 is :class:`Conflict` (it exists
  already; a stale policy etag); 400 is :class:`~kinetic.ConfigError`; 401/403 are
  :class:`~kinetic.BackendError` naming the API to enable and the role to hold;
  anything else is BackendError naming the call. No aiohttp exception escapes.

:meth:`GoogleRest.wait` polls a long-running operation (Artifact Registry's) until
it is done, bounded by its own timeout.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kinetic._exceptions import BackendError, ConfigError
from kinetic._http import HttpClient, HttpOwner, Reply, TokenSource, Transient
from kinetic._infra import identity, registry
from kinetic._infra.gke_api import error_message
from kinetic._infra.iam import Call
from kinetic._infra.long_ops import poll_until_done

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


class GoogleRest(HttpOwner):
    """An async client for the Google REST calls ``kinetic up`` makes beside GKE's.

    :param token: returns a valid access token.
    :param roots: API roots by API key (default: Google's; tests and emulators
        override some).
    :param attempts: tries per call (with ``backoff`` and ``poll_interval``, as for
        :class:`~kinetic._infra.container.ContainerClient`).

    An async context manager: it owns one connection pool.
    """

    def __init__(
        self,
        token: TokenSource,
        *,
        roots: Mapping[str, str] | None = None,
        attempts: int = 4,
        backoff: float = 0.5,
        poll_interval: float = 2.0,
    ) -> None:
        self._token = token
        self._roots = {**ROOTS, **(roots or {})}
        self._http = HttpClient(attempts=attempts, backoff=backoff, error=BackendError)
        self.poll_interval = poll_interval

    async def send(self, call: Call, *, timeout: float = DEFAULT_TIMEOUT) -> Any:
        """Send ``call``; its JSON answer (``{}`` when empty), or None on 404.

        :raises Conflict: HTTP 409.
        :raises ConfigError: HTTP 400 (the request is wrong).
        :raises BackendError: refused, failed, or no answer within ``timeout``.
        """
        what = call.what or f"{call.method} {call.path}"
        return await self._http.request(
            call.method,
            self._roots[call.api].rstrip("/") + call.path,
            what=what,
            token=self._token,
            answer=lambda reply: _answer(call.api, reply, what),
            timeout=timeout,
            params=call.params,
            json=call.body,
        )

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

        async def fetch(name: str) -> Mapping[str, Any] | None:
            doc: Mapping[str, Any] | None = await self.send(registry.get_operation(name))
            return doc

        await poll_until_done(
            op,
            fetch=fetch,
            parse=registry.parse_operation,
            interval=self.poll_interval,
            timeout=timeout,
            label=lambda op: f"{what}: operation {op.name}",
            late=lambda op: f"{what}: operation {op.name} not done after {timeout:g}s; it goes on",
        )


def _answer(api: str, reply: Reply, what: str) -> Any:
    status = reply.status
    if status < 300:
        return reply.json() if reply.body else {}
    word, message = error_message(status, reply.body)
    if status == 404:
        return None
    if status == 429 or status >= 500:
        raise Transient(f"HTTP {status} {word}: {message}")
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
