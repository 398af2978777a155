"""A store in a Google Cloud Storage bucket, through gcloud-aio-storage.

Theory of operation
-------------------
One :class:`GCSStorage` owns one aiohttp session. It is created lazily, inside the
running event loop, by the first operation, and closed by :meth:`GCSStorage.aclose`.
A session passed in by the caller is borrowed and never closed by the store.

Every public coroutine sends its requests through :meth:`GCSStorage._call`, the one
boundary where three rules hold:

* **Deadline.** The whole operation, retries and back-off sleeps included, runs under
  :func:`anyio.fail_after` with the operation's ``timeout``. A single attempt of a
  small operation is also capped at half of ``timeout`` (so a stalled request leaves
  time for another), while a transfer attempt may use all the time that is left.
* **Retries.** Only transient faults are retried: HTTP 408, 429 and 5xx, connection
  errors and resets, a truncated body, one attempt timing out. Back-off is
  exponential with jitter (tenacity), for at most ``attempts`` tries. After a 429 the
  sleep is at least ``slow_down`` (1 s) longer: GCS takes about one write a second
  per object name and answers 429 past that (or past the bucket's rate), so shorter
  sleeps would spend every attempt inside the same second. A request that cannot
  meet the per-name limit (a read, a listing, a create, a write of a name never
  written: ``write(fresh=True)``) was refused by the bucket's rate, which a herd's
  excess clears within a fraction of a second: it retries after the jittered
  exponential back-off alone.
* **Translation.** HTTP 404 on an object becomes
  :class:`~kinetic.ObjectNotFoundError`; every other failure becomes
  :class:`~kinetic.StorageError` with the original exception as ``__cause__``. No
  aiohttp or gcloud exception escapes.

``STORAGE_EMULATOR_HOST`` (``http://host:port``, with the scheme) is honoured by
gcloud-aio-storage itself. It is read when the first operation builds the client, and
then no credentials are looked up or sent.

Cancellation propagates unchanged. It never leaves a partial object visible: GCS
publishes an object only when its upload completes, and :meth:`GCSStorage.download_file`
writes to a temporary file that is removed, under a shield, unless it was renamed
into place.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self, TypeVar, cast

import aiohttp
import anyio
import anyio.abc
import anyio.to_thread
from gcloud.aio.storage import Storage as _GCloudStorage
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)

from kinetic._concurrency import for_each
from kinetic._core.exception_groups import one_error
from kinetic._exceptions import ConfigError, KineticError, ObjectNotFoundError, StorageError
from kinetic._net import tls_closing_connector
from kinetic._storage.base import DEFAULT_TIMEOUT, TRANSFER_TIMEOUT, check_key
from runner.fs import make_private_dirs

__all__ = ["GCSStorage"]

_T = TypeVar("_T")

log = logging.getLogger(__name__)

RESUMABLE_THRESHOLD = 8 * 1024 * 1024
"""Files at least this large are uploaded with a resumable upload session."""

DOWNLOAD_CHUNK = 1024 * 1024
"""Bytes read from the response and written to disk at a time."""

_CONTENT_TYPE = "application/octet-stream"
_TMP_PREFIX = ".tmp-"  # the prefix runner.fs.iter_files skips


class GCSStorage:
    """:class:`~kinetic._storage.base.Storage` on a GCS bucket.

    :param bucket: the bucket's name (no ``gs://``, no slash).
    :param session: an aiohttp session to borrow; by default the store creates its own
        on first use and closes it in :meth:`aclose`.
    :param page_size: objects asked for per list request (GCS caps it at 1000).
    :param attempts: tries per request, the first included, for transient faults.
    :param backoff: upper bound of the first back-off in seconds; it doubles per retry
        (full jitter: each sleep is uniform between 0 and the bound).
    :param max_backoff: cap on one back-off sleep, in seconds.
    :param slow_down: seconds added to the back-off after a 429 (Too Many Requests).
    :param max_concurrency: deletions in flight at once in :meth:`delete_prefix`.
    :raises ConfigError: on an invalid bucket name or option.

    Use it as an async context manager, or call :meth:`aclose` when done.
    """

    def __init__(
        self,
        bucket: str,
        *,
        session: aiohttp.ClientSession | None = None,
        page_size: int = 1000,
        attempts: int = 4,
        backoff: float = 0.25,
        max_backoff: float = 8.0,
        slow_down: float = 1.0,
        max_concurrency: int = 32,
    ) -> None:
        if not bucket or "/" in bucket or bucket.startswith("gs:"):
            raise ConfigError(f"invalid bucket name {bucket!r}")
        if page_size < 1 or attempts < 1 or max_concurrency < 1 or backoff < 0 or slow_down < 0:
            raise ConfigError(
                "page_size, attempts and max_concurrency must be >= 1, backoff and slow_down >= 0"
            )
        self._bucket = bucket
        self._session = session
        self._owns_session = session is None
        self._page_size = page_size
        self._attempts = attempts
        self._backoff = backoff
        self._max_backoff = max_backoff
        self._slow_down = slow_down
        self._max_concurrency = max_concurrency
        self._client: _GCloudStorage | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"GCSStorage({self._bucket!r})"

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    @property
    def url(self) -> str:
        """``gs://bucket``."""
        return f"gs://{self._bucket}"

    @property
    def bucket(self) -> str:
        """The bucket's name."""
        return self._bucket

    # -- the boundary --------------------------------------------------------------

    def _get_client(self) -> _GCloudStorage:
        if self._closed:
            raise StorageError(f"{self.url}: the store is closed")
        if self._client is None:
            if self._session is None:
                # Per-request timeouts are passed on every call; no session-wide cap.
                self._session = aiohttp.ClientSession(
                    connector=tls_closing_connector(), timeout=aiohttp.ClientTimeout(total=None)
                )
            # The library's annotation names requests' Session (its REST build's); this,
            # the aio build, takes aiohttp's.
            self._client = _GCloudStorage(session=cast(Any, self._session))
        return self._client

    async def _call(
        self,
        what: str,
        fn: Callable[[_GCloudStorage, int], Awaitable[_T]],
        *,
        key: str | None,
        timeout: float,
        transfer: bool = False,
        names_limit: bool = False,
    ) -> _T:
        """Run ``fn(client, attempt_timeout)`` under the deadline, retries and translation.

        :param key: the object concerned; a 404 then means ObjectNotFoundError. With
            ``None`` (listing), a 404 means the bucket is missing: StorageError.
        :param transfer: let one attempt use all the time left (large transfers).
        :param names_limit: the request mutates a name that may have been written in the
            last second (GCS's per-name limit): a 429 adds ``slow_down`` to the back-off.
        """
        jitter = wait_random_exponential(multiplier=self._backoff, max=self._max_backoff)

        def wait(state: RetryCallState) -> float:
            exc = state.outcome.exception() if state.outcome else None
            throttled = isinstance(exc, aiohttp.ClientResponseError) and exc.status == 429
            return jitter(state) + (self._slow_down if throttled and names_limit else 0.0)

        retrying = AsyncRetrying(
            stop=stop_after_attempt(self._attempts),
            wait=wait,
            retry=retry_if_exception(_is_transient),
            sleep=anyio.sleep,
            before_sleep=self._log_retry,
            reraise=True,
        )
        try:
            with anyio.fail_after(timeout) as scope:
                async for attempt in retrying:
                    with attempt:
                        left = scope.deadline - anyio.current_time()
                        per_attempt = left if transfer else min(left, timeout / 2)
                        return await fn(self._get_client(), max(1, math.ceil(per_attempt)))
        except KineticError:
            raise
        except aiohttp.ClientResponseError as exc:
            if exc.status == 404 and key is not None:
                raise ObjectNotFoundError(key, self.url + "/") from exc
            message = exc.message.splitlines()[0] if exc.message else ""
            raise StorageError(
                f"{self.url}: {what} failed: HTTP {exc.status} {message}",
                transient=_is_transient(exc),
            ) from exc
        except TimeoutError as exc:
            raise StorageError(
                f"{self.url}: {what} timed out after {timeout}s", transient=True
            ) from exc
        except Exception as exc:
            raise StorageError(
                f"{self.url}: {what} failed: {type(exc).__name__}: {exc}",
                transient=_is_transient(exc),
            ) from exc
        raise AssertionError("unreachable: tenacity either returns or raises")

    def _log_retry(self, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        log.debug(
            "%s: attempt %d failed (%s: %s), retrying",
            self.url,
            state.attempt_number,
            type(exc).__name__,
            exc,
        )

    # -- small objects -------------------------------------------------------------

    async def read(self, key: str, *, timeout: float = DEFAULT_TIMEOUT) -> bytes:
        """Return the object's bytes.

        :raises ConfigError: ``key`` is not a valid key.
        :raises ObjectNotFoundError: the object does not exist.
        :raises StorageError: any other failure, or ``timeout`` seconds ran out.
        """
        check_key(key)

        async def op(client: _GCloudStorage, t: int) -> bytes:
            return await client.download(self._bucket, key, timeout=t)

        return await self._call(f"read {key!r}", op, key=key, timeout=timeout)

    async def read_versioned(
        self, key: str, *, timeout: float = DEFAULT_TIMEOUT
    ) -> tuple[bytes, int]:
        """The object's bytes and their generation (the ``x-goog-generation`` header of
        the one download).

        :raises ConfigError: ``key`` is not a valid key.
        :raises ObjectNotFoundError: the object does not exist.
        :raises StorageError: any other failure, or ``timeout`` seconds ran out.
        """
        check_key(key)

        async def op(client: _GCloudStorage, t: int) -> tuple[bytes, int]:
            stream = await client.download_stream(self._bucket, key, timeout=t)
            async with stream as response:
                data = await response.read()
                header = response.headers.get("x-goog-generation", "")
            return data, _generation_of({"generation": header}, key)

        return await self._call(f"read {key!r}", op, key=key, timeout=timeout)

    async def write(
        self, key: str, data: bytes, *, timeout: float = DEFAULT_TIMEOUT, fresh: bool = False
    ) -> None:
        """Create or replace the object with ``data`` (one request; GCS makes it atomic).

        :param fresh: the caller knows no object of that name was ever written (a unique
            name): a 429 is then the bucket's rate, not the name's, and is retried sooner.
        :raises ConfigError: ``key`` is not a valid key.
        :raises StorageError: on failure, or when ``timeout`` seconds ran out.
        """
        check_key(key)

        async def op(client: _GCloudStorage, t: int) -> None:
            await client.upload(
                self._bucket,
                key,
                data,
                content_type=_CONTENT_TYPE,
                force_resumable_upload=False,
                timeout=t,
            )

        # A 404 here means the bucket is missing: StorageError, not ObjectNotFoundError.
        await self._call(f"write {key!r}", op, key=None, timeout=timeout, names_limit=not fresh)

    async def write_many(
        self, objects: Mapping[str, bytes], *, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        """Each object as :meth:`write` does, the requests at once.

        :raises StorageError: when a write fails (the others are cancelled, and those
            done stay written).
        """

        async def write(item: tuple[str, bytes]) -> None:
            await self.write(*item, timeout=timeout)

        await for_each(list(objects.items()), write, limit=self._max_concurrency)

    async def create_if_absent(
        self, key: str, data: bytes, *, timeout: float = DEFAULT_TIMEOUT
    ) -> bool:
        """Create the object unless one exists (``ifGenerationMatch=0``); return whether
        it was created (see :meth:`create_versioned`).

        :raises ConfigError: ``key`` is not a valid key.
        :raises StorageError: on failure, or when ``timeout`` seconds ran out.
        """
        return await self.create_versioned(key, data, timeout=timeout) is not None

    async def create_versioned(
        self, key: str, data: bytes, *, timeout: float = DEFAULT_TIMEOUT
    ) -> int | None:
        """Create the object unless one exists (``ifGenerationMatch=0``); its generation,
        or None when one existed.

        Each call tags its object with a token of its own (custom metadata): when an
        attempt's answer is lost (a reset) after the object was created, the retry meets
        ``412`` and finds its own token, which still reads as "created".

        :raises ConfigError: ``key`` is not a valid key.
        :raises StorageError: on failure, or when ``timeout`` seconds ran out.
        """
        return await self._conditional_upload(key, data, 0, "create", timeout)

    async def replace_if(
        self, key: str, data: bytes, generation: int, *, timeout: float = DEFAULT_TIMEOUT
    ) -> int | None:
        """Replace the object if it is still at ``generation`` (``ifGenerationMatch``);
        its new generation, or None when it changed or is missing. A lost answer is
        recognized as :meth:`create_versioned` recognizes one.

        :raises ConfigError: ``key`` is not a valid key.
        :raises StorageError: on failure, or when ``timeout`` seconds ran out.
        """
        if generation <= 0:
            raise ConfigError(f"replace_if needs an object's generation, got {generation}")
        return await self._conditional_upload(key, data, generation, "replace", timeout)

    async def _conditional_upload(
        self, key: str, data: bytes, generation: int, what: str, timeout: float
    ) -> int | None:
        check_key(key)
        token = os.urandom(12).hex()
        tries = 0

        async def op(client: _GCloudStorage, t: int) -> dict[str, Any]:
            nonlocal tries
            tries += 1
            # Metadata makes this a multipart upload: the one kind every GCS
            # implementation checks the precondition on.
            return await client.upload(
                self._bucket,
                key,
                data,
                content_type=_CONTENT_TYPE,
                parameters={"ifGenerationMatch": str(generation)},
                metadata={"metadata": {"kinetic": what, "writer": token}},
                force_resumable_upload=False,
                timeout=t,
            )

        try:
            made = await self._call(
                f"{what} {key!r}", op, key=None, timeout=timeout, names_limit=generation != 0
            )
        except StorageError as exc:
            cause = exc.__cause__
            if isinstance(cause, aiohttp.ClientResponseError) and cause.status == 412:
                return await self._written_by(key, token, timeout) if tries > 1 else None
            raise
        return _generation_of(made, key)

    async def _written_by(self, key: str, token: str, timeout: float) -> int | None:
        """The generation of ``key`` if it is the object a conditional upload with
        ``token`` made, else None."""
        try:
            found = await self._metadata(key, timeout)
        except ObjectNotFoundError:
            return None
        if (found.get("metadata") or {}).get("writer") != token:
            return None
        return _generation_of(found, key)

    async def _metadata(self, key: str, timeout: float) -> dict[str, Any]:
        check_key(key)

        async def op(client: _GCloudStorage, t: int) -> dict[str, Any]:
            return await client.download_metadata(self._bucket, key, timeout=t)

        return await self._call(f"stat {key!r}", op, key=key, timeout=timeout)

    async def exists(self, key: str, *, timeout: float = DEFAULT_TIMEOUT) -> bool:
        """Whether the object exists.

        :raises ConfigError: ``key`` is not a valid key.
        :raises StorageError: on failure, or when ``timeout`` seconds ran out.
        """
        try:
            await self._metadata(key, timeout)
        except ObjectNotFoundError:
            return False
        return True

    async def size(self, key: str, *, timeout: float = DEFAULT_TIMEOUT) -> int:
        """The object's size in bytes.

        :raises ConfigError: ``key`` is not a valid key.
        :raises ObjectNotFoundError: the object does not exist.
        :raises StorageError: any other failure, or ``timeout`` seconds ran out.
        """
        meta = await self._metadata(key, timeout)
        try:
            return int(meta["size"])
        except (KeyError, TypeError, ValueError) as exc:
            raise StorageError(f"{self.url}: no valid size in the metadata of {key!r}") from exc

    async def list(
        self, prefix: str = "", *, timeout: float = DEFAULT_TIMEOUT
    ) -> AsyncIterator[str]:
        """Yield every key starting with ``prefix`` (a plain string prefix), all pages.

        ``timeout`` bounds each page request. Keys come in the bucket's lexicographic
        order, one page at a time; closing the iterator early is safe.

        :raises ConfigError: a non-empty ``prefix`` is not a valid key.
        :raises StorageError: on failure (a missing bucket included), or when one page
            request ran out of time.
        """
        if prefix:
            check_key(prefix)
        page_token: str | None = None
        while True:
            params = {
                "prefix": prefix,
                "maxResults": str(self._page_size),
                "fields": "items(name),nextPageToken",
            }
            if page_token:
                params["pageToken"] = page_token

            async def op(
                client: _GCloudStorage, t: int, params: dict[str, str] = params
            ) -> tuple[tuple[str, ...], str | None]:
                page = await client.list_objects(self._bucket, params=params, timeout=t)
                names = tuple(str(item["name"]) for item in page.get("items", ()))
                token = page.get("nextPageToken")
                return names, str(token) if token else None

            names, page_token = await self._call(f"list {prefix!r}", op, key=None, timeout=timeout)
            for name in names:
                yield name
            if page_token is None:
                return

    async def delete(self, key: str, *, timeout: float = DEFAULT_TIMEOUT) -> bool:
        """Delete one object; return whether it existed.

        :raises ConfigError: ``key`` is not a valid key.
        :raises StorageError: on failure, or when ``timeout`` seconds ran out.
        """
        check_key(key)

        async def op(client: _GCloudStorage, t: int) -> None:
            await client.delete(self._bucket, key, timeout=t)

        try:
            await self._call(f"delete {key!r}", op, key=key, timeout=timeout, names_limit=True)
        except ObjectNotFoundError:
            return False
        return True

    async def delete_prefix(self, prefix: str, *, timeout: float = DEFAULT_TIMEOUT) -> int:
        """Delete every object under ``prefix``; return how many were deleted.

        Lists first, then deletes up to ``max_concurrency`` objects at once. ``timeout``
        bounds each request (a page, one deletion), not the whole sweep. On the first
        failed deletion the others are cancelled and StorageError is raised; objects
        already deleted stay deleted.

        :raises ConfigError: a non-empty ``prefix`` is not a valid key.
        :raises StorageError: on failure.
        """
        keys = [key async for key in self.list(prefix, timeout=timeout)]
        limiter = anyio.CapacityLimiter(self._max_concurrency)
        deleted = 0
        errors: list[StorageError] = []

        async def delete_one(key: str, borrower: object, tg: anyio.abc.TaskGroup) -> None:
            nonlocal deleted
            try:
                if await self.delete(key, timeout=timeout):
                    deleted += 1
            except StorageError as exc:
                errors.append(exc)
                tg.cancel_scope.cancel()
            finally:
                limiter.release_on_behalf_of(borrower)

        with one_error():
            async with anyio.create_task_group() as tg:
                for key in keys:
                    borrower = object()
                    await limiter.acquire_on_behalf_of(borrower)
                    if errors:
                        limiter.release_on_behalf_of(borrower)
                        break
                    tg.start_soon(delete_one, key, borrower, tg)
        if errors:
            raise StorageError(
                f"{self.url}: delete_prefix {prefix!r} stopped after {deleted} deletion(s): "
                f"{errors[0]}"
            ) from errors[0]
        return deleted

    # -- files ---------------------------------------------------------------------

    async def upload_file(self, key: str, path: Path, *, timeout: float = TRANSFER_TIMEOUT) -> None:
        """Stream a local file into the object; the file is never read whole into memory.

        Files of :data:`RESUMABLE_THRESHOLD` bytes or more go through a resumable upload
        session. A failed attempt restarts the upload from the beginning. The object
        appears only once the upload completes.

        :raises ConfigError: ``key`` is not a valid key.
        :raises StorageError: on failure (an unreadable local file included), or when
            ``timeout`` seconds ran out.
        """
        check_key(key)
        src = Path(path)

        async def op(client: _GCloudStorage, t: int) -> None:
            f, size = await anyio.to_thread.run_sync(_open_with_size, src)
            try:
                await client.upload(
                    self._bucket,
                    key,
                    f,
                    content_type=_CONTENT_TYPE,
                    force_resumable_upload=size >= RESUMABLE_THRESHOLD,
                    timeout=t,
                )
            finally:
                f.close()

        await self._call(
            f"upload_file {key!r}", op, key=None, timeout=timeout, transfer=True, names_limit=True
        )

    async def download_file(
        self, key: str, path: Path, *, timeout: float = TRANSFER_TIMEOUT
    ) -> None:
        """Stream the object into a local file, atomically.

        Chunks go to a temporary file next to ``path`` (missing parent directories are
        created 0700), which is renamed over ``path`` when complete and removed
        otherwise, also on cancellation. A failed attempt starts over.

        :raises ConfigError: ``key`` is not a valid key.
        :raises ObjectNotFoundError: the object does not exist.
        :raises StorageError: any other failure, or ``timeout`` seconds ran out.
        """
        check_key(key)
        dest = Path(path)

        async def op(client: _GCloudStorage, t: int) -> None:
            stream = await client.download_stream(self._bucket, key, timeout=t)
            async with stream as response:
                await _save_atomically(response, dest)

        await self._call(f"download_file {key!r}", op, key=key, timeout=timeout, transfer=True)

    # -- lifecycle -----------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the store's own session (a borrowed one is left open). Idempotent.

        Shielded from cancellation. Operations after this raise StorageError.

        :raises StorageError: closing the session failed.
        """
        if self._closed:
            return
        self._closed = True
        self._client = None
        session, self._session = self._session, None
        if session is not None and self._owns_session:
            with anyio.CancelScope(shield=True):
                try:
                    await session.close()
                except Exception as exc:
                    raise StorageError(f"{self.url}: closing the session failed") from exc


def _generation_of(found: Mapping[str, Any], key: str) -> int:
    """An object's generation, from its metadata (or a download's header).

    :raises StorageError: it names none.
    """
    try:
        return int(found["generation"])
    except (KeyError, TypeError, ValueError) as exc:
        raise StorageError(f"no generation in the answer for {key!r}") from exc


def _is_transient(exc: BaseException) -> bool:
    """Whether one attempt's failure is worth another try."""
    if isinstance(exc, aiohttp.ClientResponseError):
        return exc.status in (408, 429) or exc.status >= 500
    return isinstance(
        exc,
        aiohttp.ClientConnectionError  # resets, refused, server disconnected
        | aiohttp.ClientPayloadError  # truncated body
        | ConnectionError
        | TimeoutError,  # one attempt's aiohttp timeout; the deadline is outside
    )


async def _save_atomically(response: aiohttp.ClientResponse, dest: Path) -> None:
    """Write the response body to ``dest`` through a temporary file and a rename."""
    f, tmp = await anyio.to_thread.run_sync(_open_temp, dest)
    try:
        async for chunk in response.content.iter_chunked(DOWNLOAD_CHUNK):
            await anyio.to_thread.run_sync(f.write, chunk)
        await anyio.to_thread.run_sync(_finish, f, tmp, dest)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(_discard, f, tmp)
        raise


def _open_with_size(path: Path) -> tuple[IO[bytes], int]:
    f = path.open("rb")
    try:
        return f, os.fstat(f.fileno()).st_size
    except BaseException:
        f.close()
        raise


def _open_temp(dest: Path) -> tuple[IO[bytes], str]:
    make_private_dirs(dest.parent)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=_TMP_PREFIX)
    return os.fdopen(fd, "wb"), tmp


def _finish(f: IO[bytes], tmp: str, dest: Path) -> None:
    f.close()
    os.replace(tmp, dest)


def _discard(f: IO[bytes], tmp: str) -> None:
    f.close()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
