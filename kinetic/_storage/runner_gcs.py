"""The runner's ``gs://`` store: Kinetic's async GCS store, driven from the runner's
blocking code on one private event loop (rather than a second GCS client).

A plug-in of :mod:`runner.store`: importing it registers the ``gs`` scheme. The runner
imports it because Kinetic's launchers name it (:mod:`kinetic._core.store_plugins`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from kinetic._exceptions import ObjectNotFoundError, StorageError
from kinetic._storage.gcs import GCSStorage
from runner.store import StoreUnavailable, register_store

T = TypeVar("T")


class GCSStore:
    """A :class:`runner.store.RunnerStore` on the GCS bucket ``bucket``. Missing objects
    raise FileNotFoundError, failures that may pass StoreUnavailable, others OSError.

    :param storage: the client to use (its own settings), else a default one.
    """

    def __init__(self, bucket: str, storage: GCSStorage | None = None) -> None:
        self._runner = asyncio.Runner()
        self._storage = GCSStorage(bucket) if storage is None else storage

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            return self._runner.run(coro)
        except ObjectNotFoundError as exc:
            raise FileNotFoundError(str(exc)) from exc
        except StorageError as exc:
            raise (StoreUnavailable if exc.transient else OSError)(str(exc)) from exc

    def read(self, key: str) -> bytes:
        return self._run(self._storage.read(key))

    def write(self, key: str, data: bytes, *, fresh: bool = False) -> None:
        self._run(self._storage.write(key, data, fresh=fresh))

    def create_if_absent(self, key: str, data: bytes) -> bool:
        return self._run(self._storage.create_if_absent(key, data))

    def read_versioned(self, key: str) -> tuple[bytes, int]:
        return self._run(self._storage.read_versioned(key))

    def create_versioned(self, key: str, data: bytes) -> int | None:
        return self._run(self._storage.create_versioned(key, data))

    def replace_if(self, key: str, data: bytes, generation: int) -> int | None:
        return self._run(self._storage.replace_if(key, data, generation))

    def download(self, key: str, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._run(self._storage.download_file(key, path))

    def list(self, prefix: str) -> list[str]:
        async def collect() -> list[str]:
            return [k async for k in self._storage.list(prefix)]

        return self._run(collect())

    def close(self) -> None:
        try:
            self._runner.run(self._storage.aclose())
        finally:
            self._runner.close()


def open_gcs(url: str) -> GCSStore:
    """The store of ``gs://bucket``.

    :raises ValueError: for a URL with a path after the bucket, or none.
    """
    bucket = url.removeprefix("gs://").rstrip("/")
    if not bucket or "/" in bucket:
        raise ValueError("a store is a whole bucket: gs://BUCKET")
    return GCSStore(bucket)


register_store("gs", open_gcs)
