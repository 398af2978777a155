"""Who is at the other end of a local socket: Kinetic's local channels serve one user.

The launcher (:mod:`runner.launcher`) and a batch's supervisor (:mod:`runner.batch`)
listen on abstract Unix sockets. An abstract name has no file, hence no permissions:
any process of any user in the same network namespace may connect to it, and may bind
it first. So both ends ask the kernel who the other is (``SO_PEERCRED``: the pid, uid
and gid it recorded at ``connect``/``listen``, which the peer cannot forge):

- a server admits a connection only from a process of its own effective uid
  (:class:`Gate`), and drops any other before reading a byte of its request; each
  refusal is logged (up to a bound, so that a flood cannot fill the log);
- a client talks only to a server of its own effective uid (:func:`check_server`):
  another user who bound the name first must not receive the job's environment, nor
  hand back a process id to signal.

A TCP listener on loopback (the debug forward an IDE attaches to) gets the same rule:
the kernel's table of TCP sockets names the owner of the connecting socket.

Linux only, like the sockets themselves. Standard library only.
"""

from __future__ import annotations

import os
import socket
import struct
import sys
from collections.abc import Callable
from typing import NamedTuple

# struct ucred { pid_t pid; uid_t uid; gid_t gid; }
_UCRED = struct.Struct("=iII")
# Refusals logged in full per server; the rest are counted in one last line.
_LOGGED = 20


class Peer(NamedTuple):
    """The credentials the kernel recorded for the other end of a Unix socket."""

    pid: int
    uid: int
    gid: int


def peer_of(sock: socket.socket) -> Peer:
    """The other end's credentials: from ``SO_PEERCRED`` for a Unix socket; for a TCP
    connection over loopback, the owner of the other end's socket as the kernel lists
    it (``/proc/net/tcp``, ``tcp6``; the pid is then unknown: 0).

    :raises OSError: where neither applies (another family, a remote peer, the
        platform has no ``SO_PEERCRED`` or ``/proc``), or the other end is gone.
    """
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        return _tcp_peer(sock)
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        raise OSError("SO_PEERCRED is not available on this platform")
    raw = sock.getsockopt(socket.SOL_SOCKET, option, _UCRED.size)
    return Peer(*_UCRED.unpack(raw))


def proc_address(family: socket.AddressFamily, host: str, port: int) -> str:
    """An address as ``/proc/net/tcp*`` writes it: the address's 32-bit words in the
    machine's byte order (little-endian here), in hex, then ``:`` and the port."""
    packed = socket.inet_pton(family, host)
    words = b"".join(packed[i : i + 4][::-1] for i in range(0, len(packed), 4))
    return f"{words.hex().upper()}:{port:04X}"


def _tcp_peer(sock: socket.socket) -> Peer:
    import ipaddress  # (here: the runner's start-up does not need it)

    family = socket.AddressFamily(sock.family)
    here, there = sock.getsockname(), sock.getpeername()
    if not ipaddress.ip_address(there[0]).is_loopback:
        raise OSError(f"{there[0]} is not on this machine: its user is unknown")
    # The other end's socket: its local address is our peer's, its remote ours.
    wanted = (proc_address(family, there[0], there[1]), proc_address(family, here[0], here[1]))
    table = "/proc/net/tcp6" if family == socket.AF_INET6 else "/proc/net/tcp"
    with open(table) as f:
        next(f)  # the header
        for line in f:
            fields = line.split()
            if (fields[1], fields[2]) == wanted:
                return Peer(0, int(fields[7]), -1)
    raise OSError(f"the connection from {there[0]}:{there[1]} is gone")


class PeerRefused(PermissionError):
    """The other end of a local socket belongs to another user."""

    def __init__(self, what: str, peer: Peer) -> None:
        self.peer = peer
        super().__init__(
            f"{what} is held by a process of another user (pid {peer.pid}, uid "
            f"{peer.uid}; this process runs as uid {os.geteuid()}): refusing to talk to it. "
            "Another user may have taken its name; see docs/security.md"
        )


def check_server(sock: socket.socket, what: str) -> None:
    """Client side: return if the connected server runs as our effective uid.

    :param what: names the server in the error (e.g. ``"the launcher's socket"``).
    :raises PeerRefused: when it runs as another user (the caller closes ``sock``).
    """
    peer = peer_of(sock)
    if peer.uid != os.geteuid():
        raise PeerRefused(what, peer)


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Gate:
    """Server side: admits the connections of the server's own user only.

    :param what: the server, as the refusal lines name it.
    :param log: where a refusal is written (one line each; stderr, which a detached
        server's log file receives, by default).
    """

    def __init__(self, what: str, log: Callable[[str], None] = _to_stderr) -> None:
        self.what = what
        self.log = log
        self.uid = os.geteuid()
        self.refused = 0

    def admit(self, conn: socket.socket) -> bool:
        """Whether ``conn`` comes from a process of our user. A refusal is logged; the
        caller closes the connection unread."""
        try:
            peer: Peer | None = peer_of(conn)
        except OSError:
            peer = None  # no credentials: nobody we can vouch for
        if peer is not None and peer.uid == self.uid:
            return True
        self.refused += 1
        if self.refused <= _LOGGED:
            who = "unknown" if peer is None else f"pid {peer.pid}, uid {peer.uid}"
            self.log(
                f"kinetic {self.what}: refused a connection from another user ({who}); "
                f"it serves uid {self.uid} only"
            )
        elif self.refused == _LOGGED + 1:
            self.log(f"kinetic {self.what}: further refused connections are not logged")
        return False
