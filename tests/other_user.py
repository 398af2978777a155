"""Acting as another local user: what a second account on a shared machine can reach.

:func:`as_other_user` runs a function in a forked child that drops to uid/gid 65534
(``nobody``: ``setgroups([])``, ``setgid``, ``setuid``), the way a second account would
be, and returns what it returned. It needs root (CI runs the tests as root).

:func:`knock_on_kinetic_sockets` is the second account's probe: it lists the abstract
Unix sockets named ``@kinetic-…`` (any user can read ``/proc/net/unix``), connects to
each, sends ``payload`` and reads what comes back.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import socket
from collections.abc import Callable
from typing import Any

import pytest

OTHER_UID = 65534
_PR_SET_DUMPABLE = 4


def need_root() -> None:
    """Skip unless the tests run as root: only root can become another user."""
    if os.geteuid() != 0:
        pytest.skip("acting as another user needs root (CI runs the tests as root)")


class OtherUserRun:
    """A function running as uid/gid 65534 in a forked child (:func:`start_as_other_user`)."""

    def __init__(self, pid: int, ready_fd: int, result_fd: int) -> None:
        self.pid, self._ready_fd, self._result_fd = pid, ready_fd, result_fd

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Return once the function called its ``ready()``."""
        ready, _, _ = select.select([self._ready_fd], [], [], timeout)
        assert ready, f"the other user did not get ready in {timeout}s"
        assert os.read(self._ready_fd, 1) == b"1", "the other user ended before it was ready"

    def result(self, timeout: float = 30.0) -> Any:
        """The function's JSON-able return value.

        :raises AssertionError: when it failed, or said nothing within ``timeout``.
        """
        chunks = []
        try:
            while True:
                ready, _, _ = select.select([self._result_fd], [], [], timeout)
                assert ready, f"the other user's probe said nothing in {timeout}s"
                chunk = os.read(self._result_fd, 1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
        finally:
            os.close(self._result_fd)
            os.close(self._ready_fd)
            os.waitpid(self.pid, 0)
        answer = json.loads(b"".join(chunks) or b"{}")
        assert "ok" in answer, f"the other user's probe failed: {answer.get('error')}"
        return answer["ok"]


def start_as_other_user(fn: Callable[[Callable[[], None]], Any]) -> OtherUserRun:
    """Start ``fn(ready)`` as uid/gid 65534 in a forked child.

    The child drops its groups, then its gid and uid, as a login of that user would have
    them. It uses only calls that are safe after ``fork`` in a threaded process
    (sockets, files, ``json``), and ends with ``os._exit``.
    """
    need_root()
    ready_r, ready_w = os.pipe()
    result_r, result_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the other user
        code = 1
        try:
            os.close(ready_r)
            os.close(result_r)
            os.setgroups([])
            os.setgid(OTHER_UID)
            os.setuid(OTHER_UID)
            # Changing uid made us non-dumpable (our /proc files root's); a process of a
            # user who logged in is dumpable.
            ctypes.CDLL(None).prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)
            out = json.dumps({"ok": fn(lambda: os.write(ready_w, b"1") and None)}).encode()
            code = 0
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            out = json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode()
        try:
            os.write(result_w, out)
        finally:
            os._exit(code)
    os.close(ready_w)
    os.close(result_w)
    return OtherUserRun(pid, ready_r, result_r)


def as_other_user(fn: Callable[[], Any], timeout: float = 30.0) -> Any:
    """``fn()`` run as uid/gid 65534 (:func:`start_as_other_user`); its return value."""
    return start_as_other_user(lambda ready: fn()).result(timeout)


def kinetic_socket_names() -> list[str]:
    """The abstract Unix socket names starting with ``@kinetic-`` that anyone can see."""
    names = set()
    with open("/proc/net/unix") as f:
        next(f)  # the header
        for line in f:
            fields = line.split()
            if len(fields) >= 8 and fields[7].startswith("@kinetic-"):
                names.add(fields[7])
    return sorted(names)


def knock(name: str, payload: bytes, wait: float = 3.0) -> dict[str, Any]:
    """Connect to the abstract socket ``name``, send ``payload``, read until it closes.

    :returns: ``name``, whether the connection was made, the bytes received, and how it
        ended (``closed``, ``reset``, ``timeout``, or the error).
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(wait)
    got = b""
    try:
        sock.connect(b"\0" + name[1:].encode())
    except OSError as exc:
        sock.close()
        return {"name": name, "connected": False, "received": "", "end": str(exc)}
    end = "closed"
    try:
        sock.sendall(payload)
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
    except TimeoutError:
        end = "timeout"
    except ConnectionResetError:
        end = "reset"
    except BrokenPipeError:
        end = "reset"
    finally:
        sock.close()
    return {"name": name, "connected": True, "received": got.decode(errors="replace"), "end": end}


def knock_on_kinetic_sockets(payload_for: Callable[[str], bytes]) -> list[dict[str, Any]]:
    """As the probe: knock on every ``@kinetic-`` socket with ``payload_for(name)``."""
    return [knock(name, payload_for(name)) for name in kinetic_socket_names()]
