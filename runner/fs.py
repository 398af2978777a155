"""Atomic file primitives shared by the runner and Kinetic's local store.

The runner imports this at start-up, so it avoids ``tempfile`` and ``shutil``
(several milliseconds of imports) on the common path.

Readers never see a partial file: data goes to a temporary file in the same
directory, is flushed, then renamed over the destination. Directories that
hold job records are created private (0700).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

DIR_MODE = 0o700


def make_private_dirs(path: Path) -> None:
    """Create ``path`` and its missing parents, each with mode 0700.

    (``Path.mkdir(parents=True)`` would give the parents the default mode.)
    """
    if path.is_dir():
        return
    missing = []
    for p in (path, *path.parents):
        if p.is_dir():
            break
        missing.append(p)
    for p in reversed(missing):
        p.mkdir(mode=DIR_MODE, exist_ok=True)


def check_private_dir(path: Path) -> None:
    """Return if ``path`` is missing, or a directory of ours that no one else may write.

    A local root holds payloads that jobs unpickle: another user who can write there can
    run code as us. So it must be owned by our effective uid, with no write permission
    for group or others (created by :func:`make_private_dirs`, it is 0700).

    :raises PermissionError: naming the owner or mode that is wrong, and the fix.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    if st.st_uid != os.geteuid():
        raise PermissionError(
            f"{path} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()}): "
            "a local root must be your own; point KINETIC_LOCAL_ROOT at a directory of yours"
        )
    if st.st_mode & 0o022:
        raise PermissionError(
            f"{path} is writable by other users (mode {st.st_mode & 0o777:o}): they could "
            f"plant jobs that run as you; make it private with `chmod 700 {path}`"
        )


def _temp_file(directory: Path) -> tuple[int, str]:
    """A new private file in ``directory`` (tempfile's mkstemp, without its import cost)."""
    while True:
        name = os.path.join(directory, f".tmp-{os.urandom(6).hex()}")
        try:
            return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), name
        except FileExistsError:
            continue


def atomic_write(path: Path, data: bytes) -> None:
    """Create or replace ``path`` with ``data``, all or nothing."""
    make_private_dirs(path.parent)
    fd, tmp = _temp_file(path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise


def atomic_copy(src: BinaryIO, path: Path, chunk_size: int = 1 << 20) -> None:
    """Stream ``src`` into ``path`` in chunks, all or nothing."""
    import shutil

    make_private_dirs(path.parent)
    fd, tmp = _temp_file(path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            shutil.copyfileobj(src, f, chunk_size)
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise


def remove_tree(root: Path) -> int:
    """Delete a directory tree, ignoring errors (``shutil.rmtree`` without its import).

    :returns: how many files it deleted, not counting the temporary files of writes in
        flight (:func:`atomic_write`'s).
    """
    deleted = 0
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        for name in filenames:
            try:
                os.unlink(os.path.join(dirpath, name))
            except OSError:
                continue
            deleted += not name.startswith(".tmp-")
        for name in dirnames:
            path = os.path.join(dirpath, name)
            with contextlib.suppress(OSError):
                if os.path.islink(path):
                    os.unlink(path)
                else:
                    os.rmdir(path)
    with contextlib.suppress(OSError):
        os.rmdir(root)
    return deleted


def iter_files(root: Path) -> Iterator[Path]:
    """Yield every regular file under ``root`` (skipping temporary files)."""
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            if not name.startswith(".tmp-"):
                yield Path(dirpath, name)


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def try_lock(path: Path) -> int | None:
    """An exclusive ``flock`` on ``path`` (created, 0600, when missing) as the open file
    descriptor that holds it: closing it lets go, and so does the process's death.
    None while another process holds the lock. Blocking but instant."""
    import fcntl

    fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def lock_held(path: Path) -> bool:
    """Whether a process holds an exclusive ``flock`` on ``path`` (a live launcher or
    supervisor: the kernel drops the lock when it dies). Blocking but instant."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
