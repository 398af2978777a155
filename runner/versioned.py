"""Objects as files, with generations: read one with its generation, create one, and
replace one only if it is still the generation the caller read. Blocking.

What GCS gives every object (``generation``, and the ``ifGenerationMatch``
precondition), for the ``file://`` stores (:class:`runner.store.FileStore`, Kinetic's
local storage): a pool's claims are renewed and taken over with it, so that of a late
renewal and a takeover exactly one wins (``docs/pool-protocol.md``, invariant 1).

A file's generation is a digest of its inode, its modification time and its bytes:
every replace writes a new file and renames it into place (a new inode, written
whole), and the digest covers the bytes, so two versions that a reader could tell apart
never share a generation (a reused inode number with the same time and bytes is the
same content). Replaces under one folder are serialized by a lock on the folder itself
(``flock``): the check and the rename are one step for every other replacer. Readers
take no lock: a file is never changed in place, only renamed over.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path

from runner.fs import atomic_write

__all__ = ["create_versioned", "read_versioned", "replace_if"]


def _generation(st: os.stat_result, data: bytes) -> int:
    digest = hashlib.sha256(b"%d:%d:" % (st.st_ino, st.st_mtime_ns))
    digest.update(data)
    return int.from_bytes(digest.digest()[:8], "big") >> 1  # a positive int64, as GCS's


def read_versioned(path: Path) -> tuple[bytes, int]:
    """The file's bytes and their generation.

    :raises FileNotFoundError: there is no such file.
    """
    with open(path, "rb") as f:
        data = f.read()
        return data, _generation(os.fstat(f.fileno()), data)


def create_versioned(path: Path, data: bytes) -> int | None:
    """Create the file with ``data`` unless it exists (atomic: of concurrent creators
    one wins); its generation, or None when it existed."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{os.urandom(4).hex()}.create.tmp")
    atomic_write(tmp, data)
    try:
        st = os.stat(tmp)  # the object's inode, once linked (a link keeps the mtime)
        os.link(tmp, path)  # fails if the name exists: the atomic check
    except FileExistsError:
        return None
    finally:
        tmp.unlink(missing_ok=True)
    return _generation(st, data)


def replace_if(path: Path, data: bytes, generation: int) -> int | None:
    """Replace the file with ``data`` if it is still at ``generation``; the new
    generation, or None when it is not (changed, or missing)."""
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        try:
            current = read_versioned(path)[1]
        except FileNotFoundError:
            return None
        if current != generation:
            return None
        atomic_write(path, data)
        return read_versioned(path)[1]
    finally:
        os.close(folder)  # releases the lock
