"""Content-hash rules for local ``Data`` paths (pure: no IO, no clocks, no event loop).

These rules reproduce keras-kinetic 0.0.4's ``Data.content_hash()`` bit for bit, so a
data cache keyed by the hash is shared with the original (DESIGN §5)::

    file digest  = SHA-256(relpath.encode("utf-8") + b"\\0" + file bytes)   (32 raw bytes)
    single file  = hex SHA-256(b"file:" + file digest)   relpath = the file's base name
    directory    = hex SHA-256(b"dir:" + file digests, concatenated in walk order)

Walk order is ``os.walk(root, topdown=True, followlinks=False)`` with ``dirs`` and
``files`` sorted: a directory's own files (sorted by name) come first, then each
subdirectory (sorted by name), recursively. ``relpath`` is relative to the root, joined
with ``os.sep``. Entries that are directories after following symlinks are never hashed
as files; a symlinked directory is not descended, so it contributes nothing. A symlinked
file contributes its target's bytes under the link's own name. Empty directories
contribute nothing. Names are compared as ``str`` (code point order).

The IO side (walking, reading, the stat cache) lives in :mod:`kinetic._data.hashing`.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from typing import Protocol

__all__ = [
    "DIGEST_SIZE",
    "DIR_PREFIX",
    "FILE_PREFIX",
    "SEP",
    "Hasher",
    "dir_hash",
    "dir_hasher",
    "encode_relpath",
    "file_digest",
    "file_hasher",
    "is_settled",
    "join_relpath",
    "racy_window_ns",
    "single_file_hash",
    "walk_order",
]

DIGEST_SIZE = 32
"""Length in bytes of a per-file digest."""

FILE_PREFIX = b"file:"
"""Domain prefix of a single-file hash: a file and a directory holding it never collide."""

DIR_PREFIX = b"dir:"
"""Domain prefix of a directory hash."""

SEP = os.sep
"""Separator inside relpaths. The original used ``os.path.relpath``, hence the platform's."""

# Timestamps on ext4/xfs/btrfs/tmpfs come from the kernel's coarse clock (one tick, at most
# 10 ms at HZ=100), so a write in the same tick as the previous one leaves mtime unchanged.
# Twice a tick leaves room for the tick boundary. Filesystems with whole-second timestamps
# (FAT: 2 s, ext3: 1 s) need a window as wide as their granularity.
_FINE_WINDOW_NS = 20_000_000
_COARSE_WINDOW_NS = 2_000_000_000
_NS_PER_S = 1_000_000_000


class Hasher(Protocol):
    """The subset of a :mod:`hashlib` object the rules use."""

    def update(self, data: bytes | bytearray | memoryview, /) -> None:
        """Feed more bytes."""

    def digest(self) -> bytes:
        """Return the raw digest of the bytes fed so far."""

    def hexdigest(self) -> str:
        """Return the digest as lowercase hex."""


def encode_relpath(relpath: str) -> bytes:
    """Encode a relpath as it enters the file digest.

    UTF-8, as the original. Names that are not valid UTF-8 on disk reach Python as lone
    surrogates (``surrogateescape``); the original crashed on them, we hash their raw
    bytes instead, which cannot disagree with any digest the original produced.
    """
    return relpath.encode("utf-8", "surrogateescape")


def file_hasher(relpath: str) -> Hasher:
    """Start a per-file digest: a SHA-256 already fed ``relpath + b"\\0"``.

    Feed the file's bytes with ``update`` (in chunks of any size), then take ``digest()``.
    The NUL keeps ``("a", b"bc")`` and ``("ab", b"c")`` apart.
    """
    return hashlib.sha256(encode_relpath(relpath) + b"\0")


def file_digest(relpath: str, data: bytes | bytearray | memoryview) -> bytes:
    """Return the raw 32-byte digest of one file given its whole content."""
    h = file_hasher(relpath)
    h.update(data)
    return h.digest()


def single_file_hash(digest: bytes) -> str:
    """Return the hex content hash of a ``Data`` that is a single file.

    :param digest: the file's digest, computed with its base name as relpath.
    :raises ValueError: if ``digest`` is not 32 bytes.
    """
    _check_digest(digest)
    return hashlib.sha256(FILE_PREFIX + digest).hexdigest()


def dir_hasher() -> Hasher:
    """Start a directory hash; feed per-file digests in walk order, then ``hexdigest()``."""
    return hashlib.sha256(DIR_PREFIX)


def dir_hash(digests: Iterable[bytes]) -> str:
    """Return the hex content hash of a directory from its file digests in walk order.

    :raises ValueError: if a digest is not 32 bytes.
    """
    h = dir_hasher()
    for digest in digests:
        _check_digest(digest)
        h.update(digest)
    return h.hexdigest()


def walk_order(names: Iterable[str]) -> list[str]:
    """Return directory entry names in walk order (the original sorted ``str`` names)."""
    return sorted(names)


def join_relpath(parent: str, name: str) -> str:
    """Return the relpath of ``name`` inside the directory whose relpath is ``parent``.

    ``parent`` is ``""`` for the root.
    """
    return f"{parent}{SEP}{name}" if parent else name


def racy_window_ns(mtime_ns: int, ctime_ns: int) -> int:
    """Return how long after its last change a file's stat may not reveal a new change.

    Whole-second timestamps betray a coarse filesystem; otherwise one kernel tick, padded.
    """
    if mtime_ns % _NS_PER_S == 0 and ctime_ns % _NS_PER_S == 0:
        return _COARSE_WINDOW_NS
    return _FINE_WINDOW_NS


def is_settled(mtime_ns: int, ctime_ns: int, now_ns: int) -> bool:
    """Tell whether any change made at or after ``now_ns`` must change mtime or ctime.

    Only then do equal (size, mtime, ctime) before and after a read prove the bytes read
    are one state, and only then may the digest be cached under that stat (git's
    "racily clean" problem). A timestamp in the future is never settled.
    """
    latest = max(mtime_ns, ctime_ns)
    if latest + _COARSE_WINDOW_NS <= now_ns:  # the common case, decided without a modulo
        return True
    return latest + racy_window_ns(mtime_ns, ctime_ns) <= now_ns


def _check_digest(digest: bytes) -> None:
    if len(digest) != DIGEST_SIZE:
        raise ValueError(f"a file digest is {DIGEST_SIZE} bytes, got {len(digest)}")
