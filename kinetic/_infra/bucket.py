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

from collections.abc import Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any, Self

import anyio
import httpx
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from kinetic._exceptions import KineticError, StorageError
from kinetic._net import trust_context

GCS_API = "https://storage.googleapis.com"
DEFAULT_TIMEOUT = 30.0
TokenSource = Callable[[], Awaitable[str]]


class _Transient(Exception):
    pass


def emulator_url(env: Mapping[str, str]) -> str | None:
    """The storage emulator's root (``STORAGE_EMULATOR_HOST``, scheme added), or None."""
    host = (env.get("STORAGE_EMULATOR_HOST") or "").strip().rstrip("/")
    if not host:
        return None
    return host if "://" in host else f"http://{host}"


class BucketAdmin:
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
        self._http = httpx.AsyncClient(
            base_url=base_url, transport=transport, timeout=None, verify=trust_context()
        )
        self._attempts = attempts
        self._backoff = backoff

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
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self._attempts),
            wait=wait_random_exponential(multiplier=self._backoff, max=5.0),
            retry=retry_if_exception(lambda e: isinstance(e, _Transient | httpx.TransportError)),
            sleep=anyio.sleep,
            reraise=True,
        )
        try:
            with anyio.fail_after(timeout):
                async for attempt in retrying:
                    with attempt:
                        headers = {}
                        if self._token is not None:
                            headers["Authorization"] = f"Bearer {await self._token()}"
                        resp = await self._http.request(
                            method, path, params=params, json=body, headers=headers
                        )
                        if resp.status_code == 429 or resp.status_code >= 500:
                            raise _Transient(f"HTTP {resp.status_code}: {_message(resp)}")
                        return resp
        except KineticError:
            raise
        except TimeoutError as exc:
            raise StorageError(f"{what}: no answer within {timeout:g}s") from exc
        except (_Transient, httpx.HTTPError) as exc:
            raise StorageError(f"{what} failed: {exc}") from exc
        raise AssertionError("unreachable: tenacity either returns or raises")

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


def _message(resp: httpx.Response) -> str:
    try:
        return str(resp.json().get("error", {}).get("message") or resp.reason_phrase)
    except (ValueError, AttributeError):
        return resp.text[:200]


def _check(resp: httpx.Response, what: str) -> None:
    if resp.status_code >= 300:
        raise StorageError(f"{what} failed: HTTP {resp.status_code} {_message(resp)}")
