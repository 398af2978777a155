"""A local debug job's debugger, reachable by its own user only.

debugpy listens on TCP, and runs whatever its client sends. On a machine's loopback
any local user may connect to it. So on the local backend (:func:`listen_privately`):

1. a thread of the job enters a *network namespace of its own* (``unshare``; network
   namespaces belong to threads, so the job's other threads keep the machine's
   network) and brings its loopback up. There it starts debugpy: debugpy's adapter
   (a child process of that thread) and the job's connection to it live in that
   namespace, where no other process can reach them;
2. the same thread listens on a Unix socket *file* in a new ``0700`` directory (a
   path, hence reachable across namespaces, by its owner only) and relays each
   connection of the job's own uid (:class:`runner.peer.Gate`) to debugpy's port.

The submitter's ``debug_attach`` connects to that socket (the ready marker names it).
Creating a network namespace needs ``CAP_SYS_ADMIN`` over the current one: root has
it; another user gets it by first entering a user namespace of their own, which the
kernel allows only to a process with one thread: the runner enters it at the job's
start, before the job's imports start threads (:mod:`runner.isolation`). When the
kernel refuses either, the job fails in phase ``debug``, unless its submitter accepted
a debugger on the machine's loopback (:mod:`runner.debug`).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import select
import signal
import socket
import struct
import tempfile
import threading
from collections.abc import Callable
from functools import partial

from runner import peer
from runner.procstat import PGID, START_TICKS, stat_fields
from runner.userns import CLONE_NEWNET, enter_user_namespace, entered, unshare

_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_IFREQ = struct.Struct("16sH22x")  # struct ifreq: name, then ifr_flags in the union
_SOCKET_NAME = "debugpy.sock"
_MAX_UNIX_PATH = 107
_CHUNK = 1 << 16


class Isolated:
    """debugpy in a private network, and the socket that reaches it.

    :ivar port: debugpy's port inside the private network.
    :ivar socket_path: the Unix socket (in a ``0700`` directory) that relays to it.
    :ivar helpers: the processes debugpy started there (its adapter, which daemonizes):
        pid, start ticks and process group each. The job ends them when it exits; a
        job killed instead leaves them to whoever cancelled it (the ready marker names
        them).
    """

    def __init__(self, port: int, socket_path: str, helpers: list[dict[str, int]]) -> None:
        self.port, self.socket_path, self.helpers = port, socket_path, helpers


def _threads() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return 0


def _loopback_up() -> None:
    """Bring ``lo`` up in the calling thread's (new) network namespace."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        raw = fcntl.ioctl(s, _SIOCGIFFLAGS, _IFREQ.pack(b"lo", 0))
        flags = _IFREQ.unpack(raw)[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, _IFREQ.pack(b"lo", flags | _IFF_UP))


def _private_socket_dir() -> str:
    """A new ``0700`` directory short enough to hold a Unix socket's path."""
    for base in (os.environ.get("TMPDIR"), "/tmp"):
        if base and len(base) + 40 < _MAX_UNIX_PATH and os.path.isdir(base):
            return tempfile.mkdtemp(prefix="kinetic-debug-", dir=base)
    raise OSError("no directory with a path short enough for a Unix socket")


def _process_record(pid: int) -> dict[str, int] | None:
    """A process as a ready marker names it: pid, start time (clock ticks since boot: a
    pid reused later is not mistaken for it) and process group; None once it is gone."""
    fields = stat_fields(pid)
    if fields is None:
        return None
    return {"pid": pid, "start_ticks": int(fields[START_TICKS]), "pgid": int(fields[PGID])}


def _others_in_network() -> list[dict[str, int]]:
    """The other processes in the calling thread's network namespace."""
    mine = os.readlink("/proc/thread-self/ns/net")
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            with contextlib.suppress(OSError, ValueError, IndexError):
                if os.readlink(f"/proc/{entry}/ns/net") == mine:
                    record = _process_record(int(entry))
                    if record is not None:
                        found.append(record)
    return found


def listener_owners(host: str, port: int) -> list[dict[str, int]]:
    """The other processes holding the TCP socket that listens on ``host:port`` (IPv4):
    debugpy's adapter, which daemonizes, where it had to listen on the machine's
    loopback. Only processes we may inspect (our own user's) are found."""
    wanted = peer.proc_address(socket.AF_INET, host, port)
    inodes = set()
    with open("/proc/net/tcp") as f:
        next(f)  # the header
        for line in f:
            fields = line.split()
            if fields[1] == wanted and fields[3] == "0A":  # TCP_LISTEN
                inodes.add(f"socket:[{fields[9]}]")
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            fds = os.listdir(f"/proc/{entry}/fd")
            if any(os.readlink(f"/proc/{entry}/fd/{fd}") in inodes for fd in fds):
                record = _process_record(int(entry))
                if record is not None:
                    found.append(record)
    return found


def end_processes(helpers: list[dict[str, int]]) -> None:
    """SIGTERM to each of ``helpers`` (the job's, at its exit: it started them)."""
    for helper in helpers:
        with contextlib.suppress(OSError):
            os.kill(helper["pid"], signal.SIGTERM)


def _untraced_thread(target: Callable[[], None], name: str) -> threading.Thread:
    """A daemon thread the debugger leaves alone: it must keep relaying while the job
    stops at a breakpoint (which suspends every thread the debugger traces)."""
    thread = threading.Thread(target=target, name=name, daemon=True)
    # pydevd's own marks for its threads: never traced, never suspended.
    thread.is_pydev_daemon_thread = True  # type: ignore[attr-defined]
    thread.pydev_do_not_trace = True  # type: ignore[attr-defined]
    return thread


def _remove(directory: str, path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
    with contextlib.suppress(OSError):
        os.rmdir(directory)


def listen_privately(listen: Callable[[], int], timeout: float = 60.0) -> Isolated:
    """Run ``listen()`` (which starts debugpy and returns its port) in a private network
    namespace, and relay a private Unix socket to that port (module docstring).

    :raises OSError: when the kernel refuses a namespace, or the socket cannot be made;
        nothing was started then, and the caller may call ``listen()`` itself.
    :raises Exception: what ``listen()`` raised.
    """
    # Capable over the network namespace to come: root, or a user namespace of our own,
    # which the job entered at its start (runner.isolation) or enters now.
    if os.geteuid() != 0 and not entered():
        if _threads() != 1:
            raise OSError(
                "the job already runs threads, and a new user namespace needs one "
                "(the runner enters it before the job's code runs; see runner.isolation)"
            )
        enter_user_namespace()
    outcome: list[Isolated | BaseException] = []
    ready = threading.Event()

    def _main() -> None:
        listener = None
        try:
            unshare(CLONE_NEWNET)  # this thread only (and what it starts)
            _loopback_up()
            directory = _private_socket_dir()
            path = os.path.join(directory, _SOCKET_NAME)
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(path)
            atexit.register(_remove, directory, path)
            listener.listen(8)
            port = listen()
            # debugpy's adapter daemonizes, to outlive the job: it is the one process
            # in this network besides ours. It ends with the job instead.
            helpers = _others_in_network()
            atexit.register(end_processes, helpers)
            outcome.append(Isolated(port, path, helpers))
        except BaseException as exc:  # noqa: BLE001 - reported to the caller
            outcome.append(exc)
            if listener is not None:
                listener.close()
            return
        finally:
            ready.set()
        _serve(listener, port)

    _untraced_thread(_main, "kinetic-debug-relay").start()
    if not ready.wait(timeout):
        raise OSError(f"the private debug network did not start within {timeout:.0f}s")
    result = outcome[0]
    if isinstance(result, BaseException):
        raise result
    return result


def _serve(listener: socket.socket, port: int) -> None:
    """Relay each connection of our own user to ``127.0.0.1:port``, for the job's life."""
    gate = peer.Gate("debug relay")
    with listener:
        while True:
            conn, _ = listener.accept()
            if not gate.admit(conn):
                conn.close()
                continue
            _untraced_thread(partial(_relay, conn, port), "kinetic-debug-pipe").start()


def _relay(conn: socket.socket, port: int) -> None:
    """Copy both ways between ``conn`` and debugpy until either side ends."""
    with (
        conn,
        contextlib.suppress(OSError),
        socket.create_connection(("127.0.0.1", port), timeout=10.0) as upstream,
    ):
        upstream.settimeout(None)
        ends = {conn: upstream, upstream: conn}
        while True:
            readable, _, _ = select.select(list(ends), [], [])
            for src in readable:
                data = src.recv(_CHUNK)
                if not data:
                    return
                ends[src].sendall(data)
