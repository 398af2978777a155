"""The runner's view of storage: blocking read/write of whole objects.

A ``file://`` store is a plain directory (the local backend), read with the
standard library only. A ``gs://`` store reuses Kinetic's async GCS store on a
private event loop; it is imported only then, so local jobs start fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from runner._fs import atomic_write


class RunnerStore(Protocol):
    def read(self, key: str) -> bytes: ...

    def write(self, key: str, data: bytes) -> None: ...

    def close(self) -> None: ...


class FileStore:
    """Objects as files under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def read(self, key: str) -> bytes:
        return (self.root / key).read_bytes()

    def write(self, key: str, data: bytes) -> None:
        atomic_write(self.root / key, data)

    def close(self) -> None:
        return None


class GCSStore:
    """Kinetic's GCS store driven from blocking code on one private loop."""

    def __init__(self, bucket: str) -> None:
        import asyncio

        from kinetic._storage.gcs import GCSStorage

        self._runner = asyncio.Runner()
        self._storage: Any = GCSStorage(bucket)

    def read(self, key: str) -> bytes:
        data = self._runner.run(self._storage.read(key))
        assert isinstance(data, bytes)
        return data

    def write(self, key: str, data: bytes) -> None:
        self._runner.run(self._storage.write(key, data))

    def close(self) -> None:
        try:
            self._runner.run(self._storage.aclose())
        finally:
            self._runner.close()


def open_store(url: str) -> RunnerStore:
    """Open the store named by ``file:///abs/dir`` or ``gs://bucket``."""
    if url.startswith("file://"):
        from urllib.parse import unquote  # only for paths with escapes

        path = url.removeprefix("file://")
        return FileStore(Path(unquote(path) if "%" in path else path))
    bucket = url.removeprefix("gs://").rstrip("/")
    if url.startswith("gs://") and bucket and "/" not in bucket:
        return GCSStore(bucket)
    raise SystemExit(f"kinetic runner: unsupported storage URL {url!r}")
