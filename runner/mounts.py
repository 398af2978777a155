"""Volumes of a local job, placed in a private mount namespace, never on the host.

A pod's volumes live in the pod's own filesystem. A local job shares the user's:
placing ``/data`` there would create (and leave) a path outside the job's own
space, write to ``/`` on the user's machine, and collide with the next job. So the
job process enters a user and mount namespace of its own (Linux; no privilege
needed where unprivileged user namespaces are allowed) and mounts each volume
there, seen by this process and its children only:

- a mount path that exists is covered by a bind mount (the host's entry stays as
  it is; only this job sees the data in its place);
- a missing one is made on a tmpfs covering its deepest existing ancestor, with
  every entry of that ancestor bound back in place. When that ancestor is ``/``
  (which cannot be covered in place) the process changes its root to the tmpfs.

Nothing is created outside a scratch directory of the job's, which is removed (by
``rmdir`` only) after the job, and the mounts end with the process. The namespace
maps the user's own uid and gid onto themselves, so files keep their owners;
capabilities inside it are lost at the next ``exec``.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterable
from pathlib import Path

from runner.isolation import refusal
from runner.userns import CLONE_NEWNS, enter_user_namespace, entered, unshare

_MS_BIND = 0x1000
_MS_REC = 0x4000
_MS_PRIVATE = 0x40000
_MNT_DETACH = 2


class MountError(Exception):
    """A volume could not be placed (the message says which, and why)."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _call(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str | Path, fstype: str | None, flags: int) -> None:
    libc = _libc()
    libc.mount.argtypes = [
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_ulong,
        ctypes.c_void_p,
    ]
    encoded = [None if s is None else os.fsencode(s) for s in (source, str(target), fstype)]
    _call(libc.mount(*encoded, flags, None), f"mount {source or fstype} on {target}")


def enter_private_namespace() -> None:
    """Move this process into a new user + mount namespace whose mounts are private.

    The process must have one thread (the kernel's rule for a new user namespace),
    unless it entered its user namespace already (:mod:`runner.isolation`, at the
    job's start): then only the calling thread, and what it starts from now on, moves
    to the new mount namespace (threads the job's imports started keep the machine's).

    :raises OSError: when the kernel refuses (user namespaces off or restricted), or
        the process is not dumpable (:mod:`runner.userns`).
    """
    if entered():
        unshare(CLONE_NEWNS)
    else:
        enter_user_namespace(also=CLONE_NEWNS)
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)


def place_volumes(volumes: Iterable[tuple[str, str]], scratch: Path) -> None:
    """Enter a private namespace and make each ``(mount path, source path)`` show the
    source at the mount path, for this process and its children only.

    :param scratch: a new, empty directory for the tmpfs mount points, outside the
        job's work directory (whose clean-up must never walk into a bound tree). It is
        removed once this process and its children are gone.
    :raises MountError: naming the volume, when the kernel refuses the namespace or a
        mount, or a mount path is a file where the data is a directory (or the reverse).
    """
    pairs = sorted(volumes)  # parents before their children
    cwd = os.getcwd()
    _remove_when_gone(scratch)
    try:
        enter_private_namespace()
    except OSError as exc:
        raise MountError(
            f"local volumes need a private mount namespace, and this machine refuses one "
            f"({refusal() or exc}); unprivileged user namespaces may be disabled or restricted. Pass the "
            "data as an argument (kinetic.Data) instead, or run on GKE"
        ) from exc
    placer = _Placer(scratch)
    for target, source in pairs:
        try:
            placer.place(target, source)
        except OSError as exc:
            raise MountError(f"volume {target}: {exc}") from exc
    os.chdir(cwd)


def _remove_when_gone(scratch: Path) -> None:
    """Remove ``scratch`` and its (then empty) mount points once this process and every
    process that inherited its files are gone. While any lives, the mount points are
    busy, even for this process's own clean-up. A helper outside the namespace, in a
    session of its own (a cancel ends the job's process group, not it), removes them
    after with ``rmdir`` alone: it can never delete a file."""
    read_end, write_end = os.pipe()
    if os.fork() == 0:  # pragma: no cover - the helper's own process
        try:
            os.close(write_end)
            os.setsid()
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            # Hold nothing of the job's (its log, a GPU lease) while waiting for it.
            os.closerange(3, read_end)
            os.closerange(read_end + 1, 1 << 16)
            while os.read(read_end, 1):
                pass
            for entry in os.scandir(scratch):
                os.rmdir(entry.path)
            os.rmdir(scratch)
        finally:
            os._exit(0)
    os.close(read_end)
    # ``write_end`` stays open, unused, until this process and its children end; they
    # inherit it across exec too (a training script's own subprocesses see the mounts).
    os.set_inheritable(write_end, True)


class _Placer:
    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.covered = 0
        self.ours: set[str] = set()
        """Directories on our own tmpfs: new entries can be made there directly."""

    def place(self, target: str, source: str) -> None:
        path = os.path.realpath(target)
        is_dir = os.path.isdir(source)
        if os.path.lexists(path):
            if os.path.isdir(path) != is_dir:
                kinds = ("a directory", "a file")
                raise MountError(
                    f"volume {target} is {kinds[not os.path.isdir(path)]} on this machine, "
                    f"and its data is {kinds[not is_dir]}"
                )
        else:
            self._make(path, is_dir)
        _mount(source, path, None, _MS_BIND | _MS_REC)

    def _make(self, path: str, is_dir: bool) -> None:
        ancestor = os.path.dirname(path)
        while not os.path.exists(ancestor):
            ancestor = os.path.dirname(ancestor)
        if not os.path.isdir(ancestor):
            raise MountError(f"volume {path}: {ancestor} is a file on this machine")
        if ancestor not in self.ours:
            self._cover(ancestor)
        parent = os.path.dirname(path)
        os.makedirs(parent, exist_ok=True)
        self.ours.update(_chain(parent, ancestor))
        if is_dir:
            os.mkdir(path)
            self.ours.add(path)
        else:
            Path(path).touch()

    def _cover(self, ancestor: str) -> None:
        """Cover ``ancestor`` with a tmpfs holding its entries bound in place."""
        self.covered += 1
        stage = self.scratch / f"root{self.covered}"
        stage.mkdir()
        _mount("tmpfs", stage, "tmpfs", 0)
        stage.chmod(0o755)
        with os.scandir(ancestor) as entries:
            for entry in entries:
                copy = stage / entry.name
                if entry.is_symlink():
                    copy.symlink_to(os.readlink(entry.path))
                    continue
                if entry.is_dir():
                    copy.mkdir()
                else:
                    copy.touch()
                _mount(entry.path, copy, None, _MS_BIND | _MS_REC)
        if ancestor == "/":
            # "/" cannot be covered in place: it becomes the process's root instead.
            os.chroot(stage)
        else:
            _mount(str(stage), ancestor, None, _MS_BIND | _MS_REC)
        # The stage's path now leads to a (partial) copy of it, bound in with the entry
        # that holds the scratch directory, or to the stage itself: neither may stay
        # reachable under a name of the job's.
        while True:
            try:
                _call(_libc().umount2(os.fsencode(stage), _MNT_DETACH), "umount")
            except OSError:
                break
        self.ours.add(ancestor)


def _chain(path: str, top: str) -> list[str]:
    """``path`` and its ancestors up to ``top``."""
    out = []
    while path != top and path != "/":
        out.append(path)
        path = os.path.dirname(path)
    return [*out, top]


def probe() -> None:
    """Exit 0 when this process may place volumes here, 1 with the reason otherwise."""
    import sys
    import tempfile

    scratch = tempfile.mkdtemp(prefix="kinetic-probe-")
    try:
        enter_private_namespace()
        _mount("tmpfs", scratch, "tmpfs", 0)
        _call(_libc().umount2(os.fsencode(scratch), _MNT_DETACH), f"umount {scratch}")
    except OSError as exc:
        print(exc, file=sys.stderr)
        raise SystemExit(1) from None
    finally:
        os.rmdir(scratch)


if __name__ == "__main__":
    probe()
