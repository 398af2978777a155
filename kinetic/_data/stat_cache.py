"""What the persistent stat caches share: the stat key of a file and checksummed cache files.

Two caches let an unchanged tree be recognised from ``stat`` alone: Data hashing
(:mod:`kinetic._data.hashing`: per-file digests) and context packaging
(:mod:`kinetic._engine.context_files`: the context archive's content address).

**The stat key.** A file is taken as unchanged while its ``(size, mtime_ns,
ctime_ns, inode, device)`` is. A rename-over or a restored mtime (``touch -r``,
``rsync -t``) still changes ctime or the inode. A key may only be trusted once
the file is *settled* (:func:`kinetic._core.content_hash.is_settled`): a change in
the same timestamp tick as the previous one would leave it equal (git's "racily
clean" problem), so a key taken less than a tick after the file's last change is
never cached as proof of anything.

**Cache files.** One file per cached root under
``${KINETIC_CACHE_DIR:-~/.kinetic/cache}/{subdir}/``, named by the SHA-256 of what it
caches. Content: a magic line, the SHA-256 of the payload, then a :mod:`marshal`
payload (never :mod:`pickle`: loading must not run code). Writers write a private
temporary file and ``os.replace`` it, so concurrent processes only ever read a
complete file; the last writer wins. A missing, torn or foreign file reads as
``None``. Failing to read or write is logged, never raised: a cache only saves time.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import marshal
import os
import struct
import tempfile
import time
from collections.abc import Callable
from operator import attrgetter
from pathlib import Path
from typing import Any

__all__ = [
    "KEY_LEN",
    "KEY_STRUCT",
    "STAT_KEY",
    "StatKey",
    "cache_base",
    "cache_file",
    "read_blob",
    "write_blob",
]

logger = logging.getLogger(__name__)

StatKey = tuple[int, int, int, int, int]
"""``(size, mtime_ns, ctime_ns, inode, device)``."""

STAT_KEY: Callable[[os.stat_result], StatKey] = attrgetter(
    "st_size", "st_mtime_ns", "st_ctime_ns", "st_ino", "st_dev"
)
"""The stat key of a ``stat`` result."""

KEY_STRUCT = struct.Struct("<qqqQQ")
"""Stat keys are stored packed, 40 bytes each: a directory's keys compare as one bytes."""

KEY_LEN = KEY_STRUCT.size

_MAX_FILES = 512
_STALE_TMP_S = 3600.0


def cache_base() -> Path:
    """Return ``${KINETIC_CACHE_DIR:-~/.kinetic/cache}``, read at each call."""
    base = os.environ.get("KINETIC_CACHE_DIR") or os.path.join("~", ".kinetic", "cache")
    return Path(base).expanduser()


def cache_file(directory: Path, identity: str) -> Path:
    """Return the cache file in ``directory`` of whatever ``identity`` names."""
    key = hashlib.sha256(identity.encode("utf-8", "surrogateescape")).hexdigest()
    return directory / f"{key[:40]}.bin"


def read_blob(file: Path, magic: bytes) -> Any:
    """Return the object stored in ``file``, or ``None`` when it is missing or not ours.

    Callers still check the object's shape: the checksum proves only that the bytes
    are what some writer meant.
    """
    try:
        data = file.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        logger.warning("cannot read stat cache %s: %s", file, exc)
        return None
    head = len(magic)
    payload = data[head + 32 :]
    if not data.startswith(magic) or hashlib.sha256(payload).digest() != data[head : head + 32]:
        return None  # torn, foreign or from another format version: start over
    try:
        return marshal.loads(payload)
    except (EOFError, ValueError, TypeError):
        return None


def write_blob(file: Path, magic: bytes, obj: Any, *, what: str = "stat cache") -> bool:
    """Write ``obj`` to ``file`` atomically; return whether it was written.

    ``obj`` must be marshallable. When a new file appears, the directory is pruned to
    the 512 most recently written ones (``what`` names the cache in log messages).
    """
    payload = marshal.dumps(obj, 4)
    blob = magic + hashlib.sha256(payload).digest() + payload
    tmp: str | None = None
    try:
        file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=file.name + ".", suffix=".tmp", dir=file.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        new_file = not file.exists()
        os.replace(tmp, file)
        tmp = None
        if new_file:
            _prune(file.parent)
    except OSError as exc:
        logger.warning("cannot write %s %s: %s", what, file, exc)
        return False
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return True


def _prune(directory: Path) -> None:
    """Keep a cache directory bounded: drop the least recently written roots."""
    now = time.time()
    files: list[tuple[float, Path]] = []
    for p in directory.iterdir():
        with contextlib.suppress(OSError):
            mtime = p.stat().st_mtime
            if p.name.endswith(".tmp"):
                if now - mtime > _STALE_TMP_S:  # left by a writer that died
                    p.unlink()
            elif p.name.endswith(".bin"):
                files.append((mtime, p))
    if len(files) > _MAX_FILES:
        files.sort()
        for _, p in files[: len(files) - _MAX_FILES * 3 // 4]:
            with contextlib.suppress(OSError):
                p.unlink()
