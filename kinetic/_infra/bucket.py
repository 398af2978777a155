"""The jobs bucket itself: look, create, delete (the Storage JSON API over httpx).

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

import httpx

from kinetic._exceptions import StorageError
from kinetic._infra.rest import RestClient, RestSession, TokenSource, Transient

GCS_API = "https://storage.googleapis.com"
DEFAULT_TIMEOUT = 30.0


def emulator_url(env: Mapping[str, str]) -> str | None:
    """The storage emulator's root (``STORAGE_EMULATOR_HOST``, scheme added), or None."""
    host = (env.get("STORAGE_EMULATOR_HOST") or "").strip().rstrip("/")
    if not host:
        return None
    return host if "://" in host else f"http://{host}"


class BucketAdmin(RestClient):
    """Bucket-level calls.

    :param token: a token source, or None to send no credentials (an emulator).
    :param base_url: the API root (the emulator's, or :data:`GCS_API`).
    :param transport: an httpx transport (tests).
    """

    def __init__(
        self,
        token: TokenSource | None,
        *,
        base_url: str = GCS_API,
        transport: httpx.AsyncBaseTransport | None = None,
        attempts: int = 4,
        backoff: float = 0.25,
    ) -> None:
        self._token = token
        self._rest = RestSession(
            base_url=base_url,
            transport=transport,
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
    ) -> httpx.Response:
        return await self._rest.call(
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
        resp = await self._send("GET", f"/storage/v1/b/{bucket}", what=what, timeout=timeout)
        if resp.status_code == 404:
            return False
        _check(resp, what)
        return True

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
        resp = await self._send(
            "POST",
            "/storage/v1/b",
            what=what,
            params={"project": project},
            body=body,
            timeout=timeout,
        )
        if resp.status_code == 409:
            return False
        _check(resp, what)
        return True

    async def delete(self, bucket: str, *, timeout: float = DEFAULT_TIMEOUT) -> bool:
        """Delete the (empty) bucket; False when it did not exist.

        :raises StorageError: refused (not empty: empty it first), or failed.
        """
        what = f"delete gs://{bucket}"
        resp = await self._send("DELETE", f"/storage/v1/b/{bucket}", what=what, timeout=timeout)
        if resp.status_code == 404:
            return False
        _check(resp, what)
        return True


def _retry_overloaded(resp: httpx.Response) -> httpx.Response:
    """The response, unless it asks to be tried again (429, 5xx): the callers judge it."""
    if resp.status_code == 429 or resp.status_code >= 500:
        raise Transient(f"HTTP {resp.status_code}: {_message(resp)}")
    return resp


def _message(resp: httpx.Response) -> str:
    try:
        return str(resp.json().get("error", {}).get("message") or resp.reason_phrase)
    except (ValueError, AttributeError):
        return resp.text[:200]


def _check(resp: httpx.Response, what: str) -> None:
    if resp.status_code >= 300:
        raise StorageError(f"{what} failed: HTTP {resp.status_code} {_message(resp)}")
