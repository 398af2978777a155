"""A store in a local directory: the local backend's storage.

Objects are files under ``root``; writes go through a temporary file and a
rename, so a reader never sees half an object, and directories are created
0700 because job payloads may hold secrets. File IO runs in worker threads.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import os
import shutil
import weakref
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import TypeVar

import anyio
import anyio.to_thread

from kinetic._exceptions import ConfigError, ObjectNotFoundError, StorageError
from kinetic._storage.base import DEFAULT_TIMEOUT, TRANSFER_TIMEOUT, check_key
from runner import versioned
from runner.fs import (
    atomic_copy,
    atomic_write,
    check_private_dir,
    iter_files,
    make_private_dirs,
    remove_tree,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

IO_CONCURRENCY = 2
"""Worker threads one event loop gives its local store's file operations. Each takes
microseconds, and more threads only fight the loop's thread for the GIL: a worker that
takes it back after each quick syscall keeps the loop's thread waiting a whole switch
interval (5 ms). Under a hundred concurrent jobs on 2 cores, the heartbeat's lag p99 /
max were about 8 / 10 ms with 8 threads and 4 / 6 ms with 2, at the same throughput (and
worse still with anyio's default 40)."""

_IO_LIMITERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, anyio.CapacityLimiter] = (
    weakref.WeakKeyDictionary()
)


def _io_limiter() -> anyio.CapacityLimiter:
    loop = asyncio.get_running_loop()
    limiter = _IO_LIMITERS.get(loop)
    if limiter is None:
        limiter = _IO_LIMITERS[loop] = anyio.CapacityLimiter(IO_CONCURRENCY)
    return limiter


class LocalStorage:
    """:class:`~kinetic._storage.base.Storage` on a directory.

    :param root: the directory holding the objects; created (0700) on first write.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root).absolute()

    def __repr__(self) -> str:
        return f"LocalStorage({str(self.root)!r})"

    @property
    def url(self) -> str:
        return self.root.as_uri()

    def path_for(self, key: str) -> Path:
        """The file that holds ``key`` (for processes that write it directly)."""
        return self.root / check_key(key)

    async def _run(
        self, timeout: float, fn: Callable[..., T], *args: object, bulk: bool = False
    ) -> T:
        # Whole-file transfers may take long: they go to anyio's threads, so that a large
        # upload never holds the few threads every job's small reads and writes wait for.
        limiter = anyio.to_thread.current_default_thread_limiter() if bulk else _io_limiter()
        try:
            with anyio.fail_after(timeout):
                return await anyio.to_thread.run_sync(fn, *args, limiter=limiter)
        except TimeoutError as exc:
            raise StorageError(f"{self.url}: operation timed out after {timeout}s") from exc
        except FileNotFoundError as exc:
            raise ObjectNotFoundError(_key_of(self.root, exc.filename), self.url + "/") from exc
        except OSError as exc:
            raise StorageError(f"{self.url}: {exc}") from exc

    async def run_io(
        self, fn: Callable[..., T], *args: object, timeout: float = DEFAULT_TIMEOUT
    ) -> T:
        """Run ``fn(*args)``, blocking work on this store's files, in its worker threads.

        For callers that look at several files at once (one thread hop instead of one
        per file). Errors are translated as every operation's are.

        :raises ObjectNotFoundError: for a ``FileNotFoundError``.
        :raises StorageError: for another ``OSError``, or when ``timeout`` passes.
        """
        return await self._run(timeout, fn, *args)

    async def read(self, key: str, *, timeout: float = DEFAULT_TIMEOUT) -> bytes:
        data = await self._run(timeout, self.path_for(key).read_bytes)
        assert isinstance(data, bytes)
        return data

    async def write(
        self, key: str, data: bytes, *, timeout: float = DEFAULT_TIMEOUT, fresh: bool = False
    ) -> None:
        await self._run(timeout, atomic_write, self.path_for(key), data)  # no rate to meet

    async def write_many(
        self, objects: Mapping[str, bytes], *, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        """Each object as :meth:`write` does, all in one worker-thread call."""
        paths = [(self.path_for(key), data) for key, data in objects.items()]

        def _write_all() -> None:
            for path, data in paths:
                atomic_write(path, data)

        await self._run(timeout, _write_all)

    async def create_if_absent(
        self, key: str, data: bytes, *, timeout: float = DEFAULT_TIMEOUT
    ) -> bool:
        return await self.create_versioned(key, data, timeout=timeout) is not None

    async def read_versioned(
        self, key: str, *, timeout: float = DEFAULT_TIMEOUT
    ) -> tuple[bytes, int]:
        return await self._run(timeout, versioned.read_versioned, self.path_for(key))

    async def create_versioned(
        self, key: str, data: bytes, *, timeout: float = DEFAULT_TIMEOUT
    ) -> int | None:
        # Written aside, then hard-linked into place: link() fails if the name exists,
        # so the object appears whole and only one creator wins.
        return await self._run(timeout, versioned.create_versioned, self.path_for(key), data)

    async def replace_if(
        self, key: str, data: bytes, generation: int, *, timeout: float = DEFAULT_TIMEOUT
    ) -> int | None:
        path = self.path_for(key)
        return await self._run(timeout, versioned.replace_if, path, data, generation)

    async def exists(self, key: str, *, timeout: float = DEFAULT_TIMEOUT) -> bool:
        return bool(await self._run(timeout, self.path_for(key).is_file))

    async def size(self, key: str, *, timeout: float = DEFAULT_TIMEOUT) -> int:
        st = await self._run(timeout, os.stat, self.path_for(key))
        assert isinstance(st, os.stat_result)
        return st.st_size

    async def list(
        self, prefix: str = "", *, timeout: float = DEFAULT_TIMEOUT
    ) -> AsyncIterator[str]:
        keys = await self._run(timeout, self._list_sync, prefix)
        assert isinstance(keys, list)
        for key in keys:
            yield key

    def _list_sync(self, prefix: str) -> builtins.list[str]:
        if prefix:
            check_key(prefix)
        # Walk only the directory the prefix names, then filter by the rest.
        base = self.root / prefix.rsplit("/", 1)[0] if "/" in prefix else self.root
        if not base.is_dir():
            return []
        keys = (p.relative_to(self.root).as_posix() for p in iter_files(base))
        return sorted(k for k in keys if k.startswith(prefix))

    async def delete(self, key: str, *, timeout: float = DEFAULT_TIMEOUT) -> bool:
        path = self.path_for(key)

        def _delete() -> bool:
            try:
                path.unlink()
            except FileNotFoundError:
                return False
            return True

        return bool(await self._run(timeout, _delete))

    async def delete_prefix(self, prefix: str, *, timeout: float = DEFAULT_TIMEOUT) -> int:
        def _delete_all() -> int:
            if prefix.endswith("/"):
                return self._delete_dir(prefix)
            keys = self._list_sync(prefix)
            for key in keys:
                (self.root / key).unlink(missing_ok=True)
            if prefix.endswith("/"):
                shutil.rmtree(self.root / prefix, ignore_errors=True)
            self._prune_empty_parents(self.root / prefix.rstrip("/"))
            return len(keys)

        n = await self._run(timeout, _delete_all)
        assert isinstance(n, int)
        return n

    def _delete_dir(self, prefix: str) -> int:
        """Delete the objects under ``prefix`` (a folder: one walk, no key listing)."""
        directory = self.root / check_key(prefix.rstrip("/"))
        deleted = remove_tree(directory)
        self._prune_empty_parents(directory)
        return deleted

    def _prune_empty_parents(self, path: Path) -> None:
        """Remove directories left empty up to the root (directories are not objects)."""
        for parent in path.parents:
            if parent == self.root or not parent.is_relative_to(self.root):
                return
            try:
                parent.rmdir()
            except OSError:
                return

    async def upload_file(self, key: str, path: Path, *, timeout: float = TRANSFER_TIMEOUT) -> None:
        dest = self.path_for(key)

        def _copy() -> None:
            with open(path, "rb") as src:
                atomic_copy(src, dest)

        await self._run(timeout, _copy, bulk=True)

    async def download_file(
        self, key: str, path: Path, *, timeout: float = TRANSFER_TIMEOUT
    ) -> None:
        src_path = self.path_for(key)

        def _copy() -> None:
            with open(src_path, "rb") as src:
                atomic_copy(src, Path(path))

        await self._run(timeout, _copy, bulk=True)

    async def aclose(self) -> None:
        return None

    def ensure_root(self) -> None:
        """Create the root directory (0700) if it is missing."""
        make_private_dirs(self.root)


_WARNED_READABLE: set[Path] = set()


def check_root(root: Path) -> None:
    """Refuse a local root (the directory above a local backend's store) that is another
    user's, or that others may write; warn, once per process, about one that others may
    read (Kinetic makes it ``0700``: a directory made before may not be). Blocking.

    :raises ConfigError: naming the owner or mode, and the fix.
    """
    try:
        check_private_dir(root)
    except PermissionError as exc:
        raise ConfigError(f"unsafe local root: {exc}") from None
    try:
        mode = root.stat().st_mode & 0o777
    except OSError:
        return
    if mode & 0o055 and root not in _WARNED_READABLE:
        _WARNED_READABLE.add(root)
        logger.warning(
            "the local root %s is readable by other users (mode %o): they can read your "
            "jobs' arguments, results, logs and outputs; make it private with `chmod 700 %s`",
            root,
            mode,
            root,
        )


def _key_of(root: Path, filename: object) -> str:
    try:
        return Path(str(filename)).relative_to(root).as_posix()
    except ValueError:
        return str(filename)
