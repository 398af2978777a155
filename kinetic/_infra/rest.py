"""The one HTTP edge of ``kinetic up``'s REST clients (Container, IAM, Artifact Registry,
Resource Manager, the bucket's Storage calls): retries, deadline, translation.

:class:`RestSession` owns one httpx connection pool (trusting :func:`kinetic._net.
trust_context`) and sends each call under the same rules:

* **Auth.** Each attempt carries a fresh ``Authorization: Bearer`` token from the token
  source (none for an emulator).
* **Deadline.** The whole call, retries included, runs under ``anyio.fail_after``.
* **Retries.** :class:`Transient` answers (the caller's ``answer`` raises it: HTTP 429
  and 5xx, and whatever else an API asks to be tried again) and httpx transport errors
  are retried with jittered exponential back-off (tenacity).
* **Translation.** What the retries could not mend becomes the caller's error type,
  naming the call; ``answer`` turns each response into a value or a
  :class:`~kinetic.KineticError`. No httpx exception escapes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any, Self, TypeVar

import anyio
import httpx
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from kinetic._exceptions import KineticError
from kinetic._net import trust_context

T = TypeVar("T")
TokenSource = Callable[[], Awaitable[str]]


class Transient(Exception):
    """One attempt's answer worth asking again (internal to the REST clients)."""


class RestSession:
    """One connection pool and the rules every call of a REST client follows.

    :param base_url: prefixed to relative paths ("" for absolute URLs).
    :param transport: an httpx transport (tests: ``httpx.MockTransport``).
    :param attempts: tries per call, the first included.
    :param backoff: upper bound of the first back-off, in seconds.
    :param max_backoff: the longest back-off, in seconds.
    :param error: the error type of a call that failed (``BackendError``,
        ``StorageError``), and ``prefix`` the words its messages start with.

    Its owner (a :class:`RestClient`) closes it with :meth:`aclose`.
    """

    def __init__(
        self,
        *,
        base_url: str = "",
        transport: httpx.AsyncBaseTransport | None = None,
        attempts: int,
        backoff: float,
        max_backoff: float = 10.0,
        error: Callable[[str], KineticError],
        prefix: str = "",
    ) -> None:
        self.http = httpx.AsyncClient(
            base_url=base_url, transport=transport, timeout=None, verify=trust_context()
        )
        self._attempts, self._backoff, self._max_backoff = attempts, backoff, max_backoff
        self._error, self._prefix = error, prefix

    async def aclose(self) -> None:
        """Close the connection pool (shielded from cancellation)."""
        with anyio.CancelScope(shield=True):
            await self.http.aclose()

    async def call(
        self,
        method: str,
        url: str,
        *,
        what: str,
        token: TokenSource | None,
        answer: Callable[[httpx.Response], T],
        timeout: float,
        params: Mapping[str, str] | None = None,
        json: Any = None,
    ) -> T:
        """Send one request (again while ``answer`` raises :class:`Transient`); what
        ``answer`` made of the response.

        :raises KineticError: what ``answer`` raised; else the session's error type when
            the call failed after its retries, or got no answer within ``timeout``.
        """
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self._attempts),
            wait=wait_random_exponential(multiplier=self._backoff, max=self._max_backoff),
            retry=retry_if_exception(lambda e: isinstance(e, Transient | httpx.TransportError)),
            sleep=anyio.sleep,
            reraise=True,
        )
        what = self._prefix + what
        try:
            with anyio.fail_after(timeout):
                async for attempt in retrying:
                    with attempt:
                        headers = {}
                        if token is not None:
                            headers["Authorization"] = f"Bearer {await token()}"
                        resp = await self.http.request(
                            method,
                            url,
                            params=dict(params) if params is not None else None,
                            json=json,
                            headers=headers,
                        )
                        return answer(resp)
        except KineticError:
            raise
        except Transient as exc:
            raise self._error(f"{what} failed ({exc})") from exc
        except TimeoutError as exc:
            raise self._error(f"{what}: no answer within {timeout:g}s") from exc
        except httpx.HTTPError as exc:
            raise self._error(f"{what} failed: {type(exc).__name__}: {exc}") from exc
        raise AssertionError("unreachable: tenacity either returns or raises")


class RestClient:
    """The base of the REST clients: an async context manager over their
    :class:`RestSession` (``self._rest``), which :meth:`aclose` closes."""

    _rest: RestSession

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
        await self._rest.aclose()
