"""The one async interface every object store implements.

Keys are ``/``-separated relative names (``job-1a2b3c4d/result.pkl``); a store
never sees a leading slash or a ``..`` segment (:func:`check_key` enforces it).
Each operation takes a ``timeout`` in seconds; running out of it raises
:class:`~kinetic.StorageError` (an IO failure, not the user's wait running out).

Implementations: :class:`kinetic._storage.local.LocalStorage` (a directory,
atomic writes) and :class:`kinetic._storage.gcs.GCSStorage` (gcloud-aio-storage).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Protocol, runtime_checkable

from kinetic._exceptions import ConfigError

DEFAULT_TIMEOUT = 60.0
"""Seconds allowed for one small-object operation."""

TRANSFER_TIMEOUT = 3600.0
"""Seconds allowed for one file upload or download."""


@runtime_checkable
class Storage(Protocol):
    """An object store addressed by keys.

    Every method raises :class:`~kinetic.StorageError` on failure (a missing
    object is the subclass :class:`~kinetic.ObjectNotFoundError`); foreign
    exceptions never escape. Cancellation leaves no partial object visible:
    writes are all-or-nothing.
    """

    @property
    def url(self) -> str:
        """Where this store lives: ``file:///abs/dir`` or ``gs://bucket``."""
        ...

    async def read(self, key: str, *, timeout: float = DEFAULT_TIMEOUT) -> bytes:
        """Return the object's bytes. Raises ObjectNotFoundError when absent."""
        ...

    async def write(
        self, key: str, data: bytes, *, timeout: float = DEFAULT_TIMEOUT, fresh: bool = False
    ) -> None:
        """Create or replace the object atomically. ``fresh``: the caller knows no object
        of that name was ever written (a store with a per-name write rate retries a
        refusal sooner)."""
        ...

    async def write_many(
        self, objects: Mapping[str, bytes], *, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        """Create or replace several objects, each atomically, at once where the store
        allows. Not atomic as a set: after a failure some may have been written."""
        ...

    async def create_if_absent(
        self, key: str, data: bytes, *, timeout: float = DEFAULT_TIMEOUT
    ) -> bool:
        """Create the object only if no object has that key; return whether it was created.

        Atomic across processes and machines sharing the store: of concurrent callers,
        exactly one gets True (GCS: the ``ifGenerationMatch=0`` precondition).
        """
        ...

    async def read_versioned(
        self, key: str, *, timeout: float = DEFAULT_TIMEOUT
    ) -> tuple[bytes, int]:
        """The object's bytes and its generation, from one read (every change of the
        object changes its generation). Raises ObjectNotFoundError when absent."""
        ...

    async def create_versioned(
        self, key: str, data: bytes, *, timeout: float = DEFAULT_TIMEOUT
    ) -> int | None:
        """:meth:`create_if_absent`, with the new object's generation (None: one existed)."""
        ...

    async def replace_if(
        self, key: str, data: bytes, generation: int, *, timeout: float = DEFAULT_TIMEOUT
    ) -> int | None:
        """Replace the object with ``data`` if it is still at ``generation`` (atomic; GCS:
        the ``ifGenerationMatch`` precondition); its new generation, or None when it
        changed or is missing."""
        ...

    async def exists(self, key: str, *, timeout: float = DEFAULT_TIMEOUT) -> bool:
        """Whether the object exists."""
        ...

    async def size(self, key: str, *, timeout: float = DEFAULT_TIMEOUT) -> int:
        """The object's size in bytes. Raises ObjectNotFoundError when absent."""
        ...

    def list(self, prefix: str = "", *, timeout: float = DEFAULT_TIMEOUT) -> AsyncIterator[str]:
        """Yield every key starting with ``prefix``, across pages, in no given order.

        ``timeout`` applies to each page request.
        """
        ...

    async def delete(self, key: str, *, timeout: float = DEFAULT_TIMEOUT) -> bool:
        """Delete one object; return whether it existed."""
        ...

    async def delete_prefix(self, prefix: str, *, timeout: float = DEFAULT_TIMEOUT) -> int:
        """Delete every object under ``prefix``; return how many were deleted."""
        ...

    async def upload_file(self, key: str, path: Path, *, timeout: float = TRANSFER_TIMEOUT) -> None:
        """Stream a local file into the object, without reading it whole into memory."""
        ...

    async def download_file(
        self, key: str, path: Path, *, timeout: float = TRANSFER_TIMEOUT
    ) -> None:
        """Stream the object into a local file (written atomically)."""
        ...

    async def aclose(self) -> None:
        """Release connections. The store cannot be used afterwards."""
        ...


def check_key(key: str) -> str:
    """Return ``key`` if it is a safe relative object key, else raise ConfigError."""
    if (
        not key
        or key.startswith("/")
        or "\\" in key
        or "\0" in key
        or any(part in ("", ".", "..") for part in key.rstrip("/").split("/"))
    ):
        raise ConfigError(f"invalid storage key {key!r}")
    return key
