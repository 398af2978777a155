"""Entering a user namespace of one's own: the capabilities a job needs to make mount and
network namespaces of its own, without privilege.

Local ``volumes=`` (:mod:`runner.mounts`) and local debug mode (:mod:`runner.debug_net`)
both start here. The namespace maps the user's own uid and gid onto themselves, so files
keep their owners. The kernel allows it to a process with one thread, where unprivileged
user namespaces are on; the uid map can be written only by a *dumpable* process (one
that changed its uid is not: its ``/proc`` files are then root's), so that is checked
first: a process must never be left in a namespace with no uid map. Standard library
only.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
_PR_GET_DUMPABLE = 3

_entered = 0  # the namespaces this process entered through enter_user_namespace


def entered() -> int:
    """The ``CLONE_*`` flags of the namespaces this process entered here (0: none): a
    process in a user namespace of its own has the capabilities it needs for a mount or
    network namespace, whatever its threads."""
    return _entered


def unshare(flags: int) -> None:
    """``unshare(2)``. :raises OSError: when the kernel refuses."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare: {os.strerror(err)}")


def enter_user_namespace(also: int = 0) -> None:
    """Move this process into a new user namespace (and the namespaces ``also`` names,
    e.g. :data:`CLONE_NEWNS`), mapping our uid and gid onto themselves.

    :raises OSError: when the process is not dumpable, or the kernel refuses (user
        namespaces off or restricted, threads running); the process is then unchanged.
    """
    if ctypes.CDLL(None, use_errno=True).prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0) != 1:
        raise OSError("the process is not dumpable, so it cannot map its uid")
    global _entered
    uid, gid = os.geteuid(), os.getegid()
    unshare(CLONE_NEWUSER | also)
    _entered = CLONE_NEWUSER | also
    # A process without CAP_SETGID may map its gid only once setgroups is denied.
    if os.path.exists("/proc/self/setgroups"):
        Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
    Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
