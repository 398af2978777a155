"""Linux inotify for one question: did anything in these directories change since then?

The context walk (:mod:`kinetic._engine.context_files`) adds a watch on each directory it
enters *before* it lists or stats it, and on the directories whose ignore files decide
its rules. From then on every change to an entry of a watched directory (a file written,
created, removed, renamed, its mode or times set) is queued by the kernel before the
system call that made it returns. So when the queue holds nothing relevant, the tree is
the one the walk saw, and its archive holds; there is nothing to ``stat``.

What inotify cannot see, and how that is handled:

- a file's content changed through another hard link, or a symlinked file's target
  changed elsewhere: a tree with either is never trusted (the walk says so);
- a change made by another machine on a network filesystem: only local filesystem types
  are watched (a directory elsewhere makes the tree untrusted);
- a queue overflow, or a watch the kernel refuses (``max_user_watches``): counted as a
  change, or the tree is untrusted.

Untrusted trees, and every platform without inotify, take the stat walk each time.

Blocking (system calls), cheap: call it from the thread that walks.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import sys
import threading
from collections.abc import Iterable

__all__ = ["TreeWatch"]

_IN_MODIFY = 0x2
_IN_ATTRIB = 0x4
_IN_CLOSE_WRITE = 0x8
_IN_MOVED_FROM = 0x40
_IN_MOVED_TO = 0x80
_IN_CREATE = 0x100
_IN_DELETE = 0x200
_IN_DELETE_SELF = 0x400
_IN_MOVE_SELF = 0x800
_IN_Q_OVERFLOW = 0x4000
_IN_IGNORED = 0x8000
_IN_ONLYDIR = 0x1000000
_IN_DONT_FOLLOW = 0x2000000
_IN_EXCL_UNLINK = 0x4000000
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC

_CONTENT = _IN_MODIFY | _IN_ATTRIB | _IN_CLOSE_WRITE
_SELF = _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_IGNORED
_MASK = (
    _CONTENT
    | _IN_MOVED_FROM
    | _IN_MOVED_TO
    | _IN_CREATE
    | _IN_DELETE
    | _IN_DELETE_SELF
    | _IN_MOVE_SELF
)
_ADD_FLAGS = _MASK | _IN_ONLYDIR | _IN_DONT_FOLLOW | _IN_EXCL_UNLINK
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then len bytes of name)

# Filesystems whose every change is made, and so reported, on this machine (statfs
# magic numbers): ext2/3/4, xfs, btrfs, tmpfs, ramfs, overlay, zfs, f2fs, bcachefs.
_LOCAL_FILESYSTEMS = frozenset(
    {0xEF53, 0x58465342, 0x9123683E, 0x01021994, 0x858458F6, 0x794C7630, 0x2FC12FC1,
     0xF2F52010, 0xCA451A4E}
)  # fmt: skip


class TreeWatch:
    """One inotify instance, its watched directories, and a count of relevant events.

    Thread-safe. Use :meth:`open` (``None`` where inotify is not available).
    """

    def __init__(self, fd: int, libc: ctypes.CDLL) -> None:
        self._fd = fd
        self._libc = libc
        self._lock = threading.Lock()
        self._only: dict[int, frozenset[str] | None] = {}
        self._quiet: dict[int, frozenset[str]] = {}
        self._devices: dict[int, bool] = {}
        self._generation = 0

    @classmethod
    def open(cls) -> TreeWatch | None:
        """A new watch, or ``None`` off Linux or when the kernel refuses an instance."""
        if not sys.platform.startswith("linux"):
            return None
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
            fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        except (OSError, AttributeError):
            return None
        return cls(fd, libc) if fd >= 0 else None

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def add(self, path: str, dev: int, *, only: Iterable[str] | None = None) -> int | None:
        """Watch directory ``path`` (on device ``dev``); return its watch, or ``None``
        when it cannot be watched soundly (not a local filesystem, a kernel limit).

        :param only: the names whose changes count (the rest of a busy directory, such
            as an ancestor's other entries, do not); ``None``: every name. A directory
            added with both keeps every name.
        """
        if not self._local(path, dev):
            return None
        with self._lock:
            if self._fd < 0:
                return None
            wd = self._libc.inotify_add_watch(self._fd, os.fsencode(path), _ADD_FLAGS)
            if wd < 0:
                return None
            names = None if only is None else frozenset(only)
            if wd in self._only:
                known = self._only[wd]
                names = None if known is None or names is None else known | names
            self._only[wd] = names
            return int(wd)

    def quiet(self, wd: int, names: Iterable[str]) -> None:
        """Content changes (not creation, removal or renaming) of ``names`` in ``wd``'s
        directory do not count: files that do not travel (a log the user's script writes)."""
        with self._lock:
            self._quiet[wd] = frozenset(names)

    def mute(self, wd: int) -> None:
        """Changes of entries in ``wd``'s directory do not count (a virtualenv's)."""
        with self._lock:
            self._only[wd] = frozenset()

    def generation(self) -> int:
        """The number of relevant changes seen so far (the queue is read first): equal
        numbers at two moments mean nothing watched changed between them. A closed
        watch sees nothing, so it vouches for nothing: each call counts a change."""
        with self._lock:
            if self._fd < 0:
                self._generation += 1
            self._drain()
            return self._generation

    def _drain(self) -> None:
        while self._fd >= 0:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                self._generation += 1  # cannot tell: count it as a change
                return
            offset = 0
            while offset < len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
                offset += _EVENT.size
                name = data[offset : offset + length].rstrip(b"\0")
                offset += length
                if self._counts(wd, mask, os.fsdecode(name)):
                    self._generation += 1

    def _counts(self, wd: int, mask: int, name: str) -> bool:
        if mask & (_IN_Q_OVERFLOW | _SELF) or not name:
            return True  # events were lost, or a watched directory itself went
        only = self._only.get(wd)
        if only is not None and name not in only:
            return False
        # A content change of a file that does not travel changes nothing.
        return bool(mask & ~_CONTENT) or name not in self._quiet.get(wd, ())

    def _local(self, path: str, dev: int) -> bool:
        known = self._devices.get(dev)
        if known is None:
            known = self._devices[dev] = _filesystem_type(path) in _LOCAL_FILESYSTEMS
        return known


def _filesystem_type(path: str) -> int | None:
    """``statfs(path).f_type``, or ``None`` when it cannot be read."""
    buffer = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on 64-bit Linux
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.statfs(os.fsencode(path), buffer) != 0:
        return None
    return int(ctypes.c_long.from_buffer(buffer).value) & 0xFFFFFFFF
