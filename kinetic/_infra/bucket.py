"""The jobs bucket itself: look, create, delete (the Storage JSON API over
Kinetic's HTTP edge, :mod:`kinetic._http`).

Objects in the bucket go through :class:`~kinetic._storage.gcs.GCSStorage`; the
bucket calls it does not have live here: ``GET /storage/v1/b/{name}``,
``POST /storage/v1/b?project=P`` and ``DELETE /storage/v1/b/{name}``. With
``STORAGE_EMULATOR_HOST`` set (fake-gcs-server in the tests), requests go there
and carry no credentials, as the object calls do; otherwise each request carries a
token from the Google auth library. Every call is bounded by its timeout, retried on
429/5xx and transport errors, and its failures are :class:`~kinetic.StorageError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kinetic._exceptions import StorageError
from kinetic._http import HttpClient, HttpOwner, Reply, TokenSource, Transient

GCS_API = "https://storage.googleapis.com"
DEFAULT_TIMEOUT = 30.0


def emulator_url(env: Mapping[str, str]) -> str | None:
    """The storage emulator's root (``STORAGE_EMULATOR_HOST``, scheme added), or None."""
    host = (env.get("STORAGE_EMULATOR_HOST") or "").strip().rstrip("/")
    if not host:
        return None
    return host if "://" in host else f"http://{host}"


class BucketAdmin(HttpOwner):
    """Bucket-level calls.

    :param token: a token source, or None to send no credentials (an emulator).
    :param base_url: the API root (the emulator's, or :data:`GCS_API`).
    """

    def __init__(
        self,
        token: TokenSource | None,
        *,
        base_url: str = GCS_API,
        attempts: int = 4,
        backoff: float = 0.25,
    ) -> None:
        self._token = token
        self._http = HttpClient(
            base_url=base_url,
            attempts=attempts,
            backoff=backoff,
            max_backoff=5.0,
            error=StorageError,
        )

    async def _send(
        self,
        method: str,
        path: str,
        *,
        what: str,
        params: dict[str, str] | None = None,
        body: Any = None,
        timeout: float,
    ) -> Reply:
        return await self._http.request(
            method,
            path,
            what=what,
            token=self._token,
            answer=_retry_overloaded,
            timeout=timeout,
            params=params,
            json=body,
        )

    async def exists(self, bucket: str, *, timeout: float = DEFAULT_TIMEOUT) -> bool:
        """Whether ``bucket`` exists (and these credentials may see it).

        :raises StorageError: the API refused or failed.
        """
        what = f"look up gs://{bucket}"
        reply = await self._send("GET", f"/storage/v1/b/{bucket}", what=what, timeout=timeout)
        if reply.status == 404:
            return False
        _check(reply, what)
        return True

    async def project_number(self, bucket: str, *, timeout: float = DEFAULT_TIMEOUT) -> str | None:
        """The number of the project that owns ``bucket``; None when it does not exist.

        :raises StorageError: the API refused (a bucket of another project these
            credentials may not see: 403) or failed.
        """
        what = f"look up gs://{bucket}"
        reply = await self._send("GET", f"/storage/v1/b/{bucket}", what=what, timeout=timeout)
        if reply.status == 404:
            return None
        _check(reply, what)
        number = reply.json().get("projectNumber")
        return str(number) if number is not None else None

    async def create(
        self,
        bucket: str,
        *,
        project: str,
        location: str | None,
        labels: Mapping[str, str] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> bool:
        """Create ``bucket`` (uniform bucket-level access); False when it exists already.

        :raises StorageError: refused (name taken by another project, no permission).
        """
        body: dict[str, Any] = {
            "name": bucket,
            "iamConfiguration": {"uniformBucketLevelAccess": {"enabled": True}},
        }
        if location:
            body["location"] = location.upper()
        if labels:
            body["labels"] = dict(labels)
        what = f"create gs://{bucket} in project {project}"
        reply = await self._send(
            "POST",
            "/storage/v1/b",
            what=what,
            params={"project": project},
            body=body,
            timeout=timeout,
        )
        if reply.status == 409:
            return False
        _check(reply, what)
        return True

    async def delete(self, bucket: str, *, timeout: float = DEFAULT_TIMEOUT) -> bool:
        """Delete the (empty) bucket; False when it did not exist.

        :raises StorageError: refused (not empty: empty it first), or failed.
        """
        what = f"delete gs://{bucket}"
        reply = await self._send("DELETE", f"/storage/v1/b/{bucket}", what=what, timeout=timeout)
        if reply.status == 404:
            return False
        _check(reply, what)
        return True


def _retry_overloaded(reply: Reply) -> Reply:
    """The answer, unless it asks to be tried again (429, 5xx): the callers judge it."""
    if reply.status == 429 or reply.status >= 500:
        raise Transient(f"HTTP {reply.status}: {_message(reply)}")
    return reply


def _message(reply: Reply) -> str:
    try:
        return str(reply.json().get("error", {}).get("message") or reply.reason)
    except (ValueError, AttributeError):
        return reply.text[:200]


def _check(reply: Reply, what: str) -> None:
    if reply.status >= 300:
        raise StorageError(f"{what} failed: HTTP {reply.status} {_message(reply)}")
