"""A runner process's scratch directory, removed however the process ends.

A single job (``kinetic-scratch-job-*``) and a pool worker
(``kinetic-scratch-worker-*``) each work in a private directory under ``$TMPDIR`` (the
job's workspace, its resolved Data). It is removed

* when the process returns or raises: :func:`scratch_dir`'s ``finally``;
* on ``SIGTERM``, which a local cancel sends to the job's process group: a handler
  removes it, then lets the signal end the process as it did before (same exit
  status). Children the job forks die of ``SIGTERM`` as before and never touch the
  directory (:class:`_ForkGuard`). Not as PID 1: a container's init ignores
  ``SIGTERM`` without a handler, and a pod's filesystem goes with the pod;
* when the process was killed outright (``SIGKILL`` after the cancel's grace, the OOM
  killer, ``kill -9``), or something in the directory could not go yet (a volume's
  mount point, busy while the job's mount namespace lives): the directory is locked
  (``flock`` on the directory itself) for the life of the process and of any child it
  forked. The next runner that starts in the same ``$TMPDIR``, at most once a minute
  (the mtime of a stamp file, ``kinetic-{uid}.swept``, says when), removes every
  scratch directory of this user whose lock it can take. A directory younger than a
  minute is never touched (its owner may not have locked it yet), nor one named as
  older versions named theirs (``kinetic-run-*``, ``kinetic-pool-*``: never locked,
  so their owners cannot be told alive).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

from runner.fs import remove_tree

SWEEP_EVERY = 60.0  # seconds; also the age below which a directory is never swept
_PREFIX = "kinetic-scratch-"
_HEX = frozenset("0123456789abcdef")


def _is_scratch_name(name: str) -> bool:
    """``kinetic-scratch-job-{16 hex}`` or ``kinetic-scratch-worker-{16 hex}``."""
    kind, _, suffix = name.removeprefix(_PREFIX).partition("-")
    return (
        name.startswith(_PREFIX)
        and kind in ("job", "worker")
        and len(suffix) == 16
        and _HEX.issuperset(suffix)
    )


@contextlib.contextmanager
def scratch_dir(kind: str) -> Iterator[Path]:
    """A new private directory ``kinetic-scratch-{kind}-{16 hex}`` (``kind``: ``job`` or
    ``worker``) under ``$TMPDIR`` (else ``/tmp``), locked as its owner's while the block
    runs and removed when it ends (module docstring). The working directory is ``/``
    afterwards, as the directory is gone.

    :raises OSError: when the directory cannot be created.
    """
    root = Path(os.environ.get("TMPDIR") or "/tmp")
    sweep_orphans(root)
    path = root / f"{_PREFIX}{kind}-{os.urandom(8).hex()}"
    path.mkdir(mode=0o700)
    lock = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    # Where the filesystem has no flock (some network filesystems), no sweep can take
    # the lock either, so the directory is never mistaken for an orphan.
    with contextlib.suppress(OSError):
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    restore = _remove_on_sigterm(path)
    try:
        yield path
    finally:
        restore()
        with contextlib.suppress(OSError):
            os.chdir("/")
        remove_tree(path)
        os.close(lock)


def _remove_on_sigterm(path: Path) -> Callable[[], None]:
    """Install the ``SIGTERM`` handler, unless as PID 1 or off the main thread (where no
    handler can be set); returns what puts the previous handler back."""
    if os.getpid() == 1 or threading.current_thread() is not threading.main_thread():
        return lambda: None

    owner = os.getpid()

    def terminated(signum: int, frame: FrameType | None) -> None:
        signal.signal(signum, signal.SIG_DFL)
        # A child forked where the fork guard does not run (from C, say) inherits this
        # handler: it only dies, the directory stays the job's.
        if os.getpid() == owner:
            with contextlib.suppress(OSError):
                os.chdir("/")
            remove_tree(path)
        os.kill(os.getpid(), signum)  # ends the process as the signal would have
        os._exit(128 + signum)  # only if it did not (the signal was blocked)

    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, terminated)
    _forks.handler = terminated
    _forks.register()

    def restore() -> None:
        _forks.handler = None
        # None: a handler not set from Python; the default is the closest we can put back.
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)

    return restore


class _ForkGuard:
    """A child the job forks (``os.fork``, multiprocessing) dies of ``SIGTERM`` as it
    would without our handler. Inheriting the handler is not enough: a signal that
    reaches the child before its interpreter is ready is dropped (CPython clears what
    its handlers caught in that window), and ``Process.terminate()`` right after
    ``start()`` would leave the child running. So ``SIGTERM`` is blocked across the fork
    (the kernel keeps it pending) and the child restores the default action first."""

    def __init__(self) -> None:
        self.handler: Callable[[int, FrameType | None], None] | None = None
        self._registered = False
        self._mask: set[int | signal.Signals] | None = None

    def register(self) -> None:
        if not self._registered:
            self._registered = True
            os.register_at_fork(
                before=self._before, after_in_parent=self._unblock, after_in_child=self._child
            )

    def _before(self) -> None:
        if self.handler is not None and signal.getsignal(signal.SIGTERM) is self.handler:
            self._mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

    def _child(self) -> None:
        if self._mask is not None:
            self.handler = None
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        self._unblock()

    def _unblock(self) -> None:
        if self._mask is not None:
            mask, self._mask = self._mask, None
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)


_forks = _ForkGuard()


def sweep_orphans(root: Path, *, min_age: float = SWEEP_EVERY) -> int:
    """Remove the scratch directories under ``root`` whose owner has died; at most once
    every ``min_age`` seconds per ``root`` and user, never one younger than ``min_age``.
    Never raises.

    :returns: how many directories it removed.
    """
    now = time.time()
    if not _sweep_due(root / f"kinetic-{os.getuid()}.swept", now, min_age):
        return 0
    removed = 0
    try:
        entries = list(os.scandir(root))
    except OSError:
        return 0
    for entry in entries:
        if not _is_scratch_name(entry.name):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if info.st_uid != os.getuid() or now - info.st_mtime < min_age:
            continue
        removed += _remove_if_orphaned(Path(entry.path))
    return removed


def _sweep_due(stamp: Path, now: float, min_age: float) -> bool:
    """Whether a sweep is due by the stamp's mtime; the stamp is touched when one is.

    ``$TMPDIR`` may be shared (``/tmp``), and the stamp's name is predictable: it is
    opened without following a link (one planted there made the touch create, say, an
    empty ``~/.kinetic/profiles.json``), and used only when it is this user's own
    regular file with one link. Anything else is not our stamp: a sweep is due then,
    and the impostor is left alone (it must not disable the sweep either).
    """
    flags = os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(stamp, flags, 0o600)
    except OSError:  # a link (ELOOP), or another user's file we may not open
        return True
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid() or not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            return True
        if now - st.st_mtime < min_age:
            return False
        with contextlib.suppress(OSError):
            os.utime(fd)
        return True
    finally:
        os.close(fd)


def _remove_if_orphaned(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # its owner (or a child it forked) is alive, another sweep has it,
        os.close(fd)  # or the filesystem cannot lock: not ours to judge
        return False
    try:
        remove_tree(path)
    finally:
        os.close(fd)
    return True
