"""Starting local jobs through the launcher of their root (:mod:`runner.launcher`).

Theory of operation. :func:`spawn_via_launcher` asks the launcher of a local root to
fork the job, over the launcher's abstract Unix socket. When nobody listens, it starts
a launcher (detached, like a batch supervisor, through
:func:`kinetic._backends._process.spawn_detached`) and waits for it to listen; when
the launcher answers ``stale`` (the installed code changed under it), it starts a fresh
one. Any process finds the same launcher: its address is derived from the root and
the launcher's tag (the interpreter and the start-up environment), and a ``flock``
makes sure one launcher serves a tag.

When the launcher cannot be used (``KINETIC_LOCAL_LAUNCHER=0``, a platform without
``fork``, a command other than the runner, a launcher that does not start or answers
with an error), the caller falls back to spawning ``python -m runner`` directly; the
reason is logged once per process. Everything here blocks: call it from a worker thread.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kinetic._backends._process import ProcessRef, is_alive, spawn_detached
from kinetic._exceptions import BackendError
from runner.fs import lock_held
from runner.launcher import PROTOCOL, launcher_dir, launcher_tag, socket_address
from runner.peer import check_server

logger = logging.getLogger(__name__)

DISABLE_ENV = "KINETIC_LOCAL_LAUNCHER"
"""``0`` turns the launcher off: every job starts its own interpreter."""
IDLE_ENV = "KINETIC_LOCAL_LAUNCHER_IDLE"
"""Seconds a launcher waits for its next job before it exits (default 120)."""
_START_TIMEOUT = 15.0
_REQUEST_TIMEOUT = 30.0

_start_lock = threading.Lock()
_warned: set[str] = set()
_warn_lock = threading.Lock()


def spawn_via_launcher(
    argv: Sequence[str],
    *,
    root: Path,
    log_file: Path,
    status_file: Path,
    final_file: Path | None = None,
    cwd: Path,
    env: Mapping[str, str],
) -> ProcessRef | None:
    """Start ``argv`` (``python -m runner ...``) as a job forked by the launcher of ``root``.

    The job is in its own session and process group, with ``cwd`` and ``env``, its
    output in ``log_file`` and its exit status in ``status_file``: what
    :func:`~kinetic._backends._process.spawn_detached` does, without a new interpreter.
    The exit status is not written when the job left ``final_file`` (the runner's final
    record, which then says more than the status would): one file fewer per job.

    :returns: the job's leader, or None when the launcher cannot be used (the reason is
        logged once per process); the caller then spawns the job itself.
    """
    reason = _unusable(argv, env)
    if reason is not None:
        _say_once(reason)
        return None
    tag = launcher_tag(argv[0], env)
    request = {
        "v": PROTOCOL,
        "args": list(argv[3:]),
        "cwd": str(cwd),
        "env": dict(env),
        "log": str(log_file),
        "status": str(status_file),
    }
    if final_file is not None:
        request["final"] = str(final_file)
    line = json.dumps(request).encode() + b"\n"
    failure = "no launcher answered"
    for _ in range(3):
        try:
            reply = _ask(root, tag, line)
        except OSError as exc:
            failure = f"the launcher did not answer ({exc})"
            break
        if reply is None or "stale" in reply:
            try:
                _start(root, tag, argv[0], env)
            except (BackendError, OSError) as exc:
                failure = str(exc)
                break
            continue
        if "error" in reply:
            failure = f"the launcher could not start the job: {reply['error']}"
            break
        try:
            return ProcessRef.from_dict(reply)
        except (KeyError, ValueError) as exc:
            failure = f"the launcher's answer is malformed ({exc})"
            break
    _say_once(failure)
    return None


def _unusable(argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    if os.environ.get(DISABLE_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return f"{DISABLE_ENV}=0"
    if not hasattr(os, "fork") or not sys.platform.startswith("linux"):
        return "the launcher needs Linux (fork, abstract Unix sockets)"
    if len(argv) < 3 or list(argv[1:3]) != ["-m", "runner"]:
        return f"the launcher runs only the runner, not {list(argv[:3])}"
    return None


def _say_once(reason: str) -> None:
    with _warn_lock:
        if reason in _warned:
            return
        _warned.add(reason)
    logger.warning("local jobs start their own interpreter (slower) because %s", reason)


def _connect(root: Path, tag: str, timeout: float) -> socket.socket | None:
    """A connection to the launcher of ``root`` and ``tag``; None when none listens.

    :raises PeerRefused: when the socket is held by another user's process (it must not
        see the job's environment, nor name a process for us to signal).
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(socket_address(root, tag))
        check_server(sock, "the launcher's socket")
    except (ConnectionRefusedError, FileNotFoundError):
        sock.close()
        return None
    except BaseException:
        sock.close()
        raise
    return sock


def _ask(root: Path, tag: str, line: bytes) -> dict[str, Any] | None:
    """The launcher's answer to ``line``; None when no launcher listens.

    :raises OSError: when it listens but does not answer in time, or hangs up.
    """
    sock = _connect(root, tag, _REQUEST_TIMEOUT)
    if sock is None:
        return None
    with sock:
        sock.sendall(line)
        buf = bytearray()
        while not buf.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                if not buf:  # it stopped (idle, or replaced) between accept and answer
                    return None
                raise ConnectionResetError("the launcher hung up mid-answer")
            buf += chunk
    try:
        reply = json.loads(buf)
    except ValueError as exc:
        raise ConnectionResetError(f"unreadable answer: {exc}") from exc
    if not isinstance(reply, dict):
        raise ConnectionResetError("unreadable answer")
    return reply


def _start(root: Path, tag: str, executable: str, env: Mapping[str, str]) -> None:
    """Start a launcher for ``root`` and ``tag`` unless one listens; return once one does.

    :raises BackendError: when none listens within the start timeout.
    """
    with _start_lock:  # one start per process at a time; other processes race harmlessly
        probe = _connect(root, tag, 1.0)
        if probe is not None:
            probe.close()
            return
        where = launcher_dir(root)
        where.mkdir(mode=0o700, parents=True, exist_ok=True)
        idle = os.environ.get(IDLE_ENV, "120")
        argv = [executable, "-m", "runner.launcher", "--root", str(root), "--tag", tag]
        ref = spawn_detached(
            [*argv, "--idle", idle],
            log_file=where / f"{tag}.log",
            status_file=where / f"{tag}.exit",
            cwd=where,
            env=env,
        )
        deadline = time.monotonic() + _START_TIMEOUT
        delay = 0.002
        while time.monotonic() < deadline:
            probe = _connect(root, tag, 1.0)
            if probe is not None:
                probe.close()
                return
            if not is_alive(ref) and not lock_held(where / f"{tag}.lock"):
                break  # ours died, and no other launcher is starting
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        log = where / f"{tag}.log"
        tail = log.read_text(errors="replace")[-500:] if log.exists() else ""
        raise BackendError(f"the launcher did not start: {tail.strip() or 'no output'}")


def launcher_pid(root: Path, executable: str, env: Mapping[str, str]) -> int | None:
    """The pid of the running launcher of ``root`` for this interpreter and environment,
    or None when none runs (for people and tests; liveness is the lock)."""
    tag = launcher_tag(executable, env)
    where = launcher_dir(root)
    if not lock_held(where / f"{tag}.lock"):
        return None
    try:
        record = json.loads((where / f"{tag}.json").read_text())
    except (OSError, ValueError):
        return None
    pid = record.get("pid") if isinstance(record, dict) else None
    return pid if isinstance(pid, int) else None
