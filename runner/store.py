"""The runner's view of storage: blocking read/write of whole objects.

A ``file://`` store is a plain directory (the local backend), read with the
standard library only. A ``gs://`` store reuses Kinetic's async GCS store on a
private event loop; it is imported only then, so local jobs start fast.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol

from runner.fs import atomic_copy, atomic_write, iter_files


class RunnerStore(Protocol):
    """Blocking whole-object access. Missing objects raise FileNotFoundError, other
    failures OSError."""

    def read(self, key: str) -> bytes: ...

    def write(self, key: str, data: bytes) -> None: ...

    def create_if_absent(self, key: str, data: bytes) -> bool:
        """Create the object unless one exists; whether it was created (atomic)."""
        ...

    def download(self, key: str, path: Path) -> None:
        """Stream the object into ``path`` (parents created; written atomically)."""
        ...

    def list(self, prefix: str) -> list[str]: ...

    def close(self) -> None: ...


class FileStore:
    """Objects as files under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def read(self, key: str) -> bytes:
        return (self.root / key).read_bytes()

    def write(self, key: str, data: bytes) -> None:
        atomic_write(self.root / key, data)

    def create_if_absent(self, key: str, data: bytes) -> bool:
        path = self.root / key
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        atomic_write(tmp, data)
        try:
            os.link(tmp, path)  # fails if the name exists: the atomic check
        except FileExistsError:
            return False
        finally:
            tmp.unlink()
        return True

    def download(self, key: str, path: Path) -> None:
        with open(self.root / key, "rb") as src:
            atomic_copy(src, path)

    def list(self, prefix: str) -> list[str]:
        base = self.root / prefix.rsplit("/", 1)[0] if "/" in prefix else self.root
        keys = (p.relative_to(self.root).as_posix() for p in iter_files(base))
        return sorted(k for k in keys if k.startswith(prefix))

    def close(self) -> None:
        return None


class GCSStore:
    """Kinetic's GCS store driven from blocking code on one private loop."""

    def __init__(self, bucket: str) -> None:
        import asyncio

        from kinetic._storage.gcs import GCSStorage

        self._runner = asyncio.Runner()
        self._storage: Any = GCSStorage(bucket)

    def _run(self, coro: Any) -> Any:
        from kinetic._exceptions import ObjectNotFoundError, StorageError

        try:
            return self._runner.run(coro)
        except ObjectNotFoundError as exc:
            raise FileNotFoundError(str(exc)) from exc
        except StorageError as exc:
            raise OSError(str(exc)) from exc

    def read(self, key: str) -> bytes:
        data = self._run(self._storage.read(key))
        assert isinstance(data, bytes)
        return data

    def write(self, key: str, data: bytes) -> None:
        self._run(self._storage.write(key, data))

    def create_if_absent(self, key: str, data: bytes) -> bool:
        return bool(self._run(self._storage.create_if_absent(key, data)))

    def download(self, key: str, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._run(self._storage.download_file(key, path))

    def list(self, prefix: str) -> list[str]:
        async def collect() -> list[str]:
            return [k async for k in self._storage.list(prefix)]

        keys = self._run(collect())
        assert isinstance(keys, list)
        return keys

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
