"""The pool worker's zygote: a lean process whose only work is to fork each input's process.

Why
---
A fork costs in proportion to the process forked: the kernel copies its page tables,
and while the child lives every page either side writes is copied (copy on write);
after the fork each page the parent writes faults once more even when the child is
gone. Each module imported adds pages, and some add work to every fork (``threading``
and ``random`` run handlers in each child). A pool worker is a heavy process to fork:
it holds the storage client (in a pod, Kinetic's GCS store: asyncio, aiohttp, their
threads and buffers), input chunks and the pool book, and it keeps writing all over its
heap while the input runs (upkeep). So the worker starts a zygote, a fresh interpreter
(``python -m runner.pool.zygote FD``) that imports this module alone and, once set up,
the function, and does nothing but fork and wait. Each input still runs in a fresh
process, forked from the zygote, in which no input ever runs: a crash, a leak or global
state of one input never reaches another. On the testbed this halved the CPU of a
trivial input in the pod (``benchmarks/results/gke_pool.json``).

Protocol
--------
A stream socket pair; each message a length-prefixed pickle (the arguments go as
cloudpickle bytes, loaded in the input's own process, never in the zygote)::

    worker -> zygote  ("setup", fn_bytes, sys_path, cwd, environ, limit_s)
    zygote -> worker  ("ready", "") | ("failed", "Type: message")   (unpickling fn)
    worker -> zygote  ("run", blob) + the input's output file (SCM_RIGHTS)
    worker -> zygote  ("kill",)    while it runs: the zygote, its parent, kills it, so
                                   its pid cannot have been reused by then
    zygote -> worker  ("ended", wait status, killed, message)

``message`` is what the input's process sent: its final record (a JSON line; a failure's
with ``error_types``, its exception's type names, which a ``kinetic.Retries``' ``on`` is
matched against) and the pickled result payload. ``limit_s``, the batch's run-time limit
(``timeout=``), is each input's: ``SIGALRM`` in its process raises
:class:`~runner.time_limit.TimeLimitExceeded` in the function, and an input not unwound
:data:`~runner.time_limit.HARD_GRACE_S` later is killed by the zygote, which then sends
the time limit's failure itself (a zygote of a batch without a limit never imports
:mod:`runner.time_limit`, nor ``threading`` with it). A ``kill`` that arrives after the input ended is stale and
ignored. When the worker's end closes (it exited or died), the zygote kills a running
input and exits.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import cloudpickle

from runner import protocol
from runner.code_files import load_function
from runner.job import build_failure, build_success

_HEAD = struct.Struct("!Q")
_HOME = str(Path(__file__).resolve().parents[2])
"""Where the ``runner`` package lies: the zygote imports it from there."""

Ended = tuple[int, bool, bytes]
"""An input's end: its wait status, whether it was killed, and its message."""


class ZygoteError(RuntimeError):
    """The zygote is gone: no input can run in this worker any more."""


def _send(sock: socket.socket, message: tuple[Any, ...], fds: tuple[int, ...] = ()) -> None:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    data = _HEAD.pack(len(body)) + body
    sent = socket.send_fds(sock, [data], list(fds)) if fds else 0
    sock.sendall(data[sent:])


def _recv(sock: socket.socket) -> tuple[tuple[Any, ...], list[int]] | None:
    """The next message and the descriptors that came with it; None at the end."""
    head, fds = b"", list[int]()
    while len(head) < _HEAD.size:
        chunk, got, _, _ = socket.recv_fds(sock, _HEAD.size - len(head), 1)
        if not chunk:
            return None
        head, fds = head + chunk, fds + got
    body = bytearray(_HEAD.unpack(head)[0])
    view, filled = memoryview(body), 0
    while filled < len(body):
        n = sock.recv_into(view[filled:])
        if not n:
            return None
        filled += n
    return pickle.loads(body), fds


class Zygote:
    """The worker's side: start it, set it up, run inputs through it."""

    def __init__(self, sock: socket.socket, process: subprocess.Popen[bytes]) -> None:
        self.sock, self.process = sock, process

    @classmethod
    def start(cls) -> Zygote:
        """Start the zygote: a fresh interpreter, not a fork of this one (it would keep
        every module and object this process has); its output goes where this one's does."""
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_HOME, env.get("PYTHONPATH")) if p)
        fd = theirs.fileno()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        with theirs:
            process = subprocess.Popen(
                [sys.executable, "-m", "runner.pool.zygote", str(fd)],
                pass_fds=(fd,),
                env=env,
                stdin=subprocess.DEVNULL,
            )
        return cls(ours, process)

    def setup(self, fn_bytes: bytes, limit_s: float | None = None) -> None:
        """Have the zygote enter this process's workspace (sys.path, cwd, environment)
        and unpickle the function; ``limit_s``: each input's run-time limit.

        :raises ValueError: the function cannot be unpickled (the message says why).
        """
        workspace = (list(sys.path), os.getcwd(), dict(os.environ))
        _send(self.sock, ("setup", fn_bytes, *workspace, limit_s))
        answer = self._answer()
        if answer[0] != "ready":
            raise ValueError(answer[1])

    def run(self, blob: bytes, output_fd: int) -> None:
        """Start an input: ``blob`` is cloudpickle's ``(args, kwargs, environ)``, its
        output goes to ``output_fd``. Wait for :meth:`ended` (readable :attr:`sock`)."""
        _send(self.sock, ("run", blob), (output_fd,))

    def kill(self) -> None:
        _send(self.sock, ("kill",))

    def ended(self) -> Ended:
        answer = self._answer()
        return answer[1], answer[2], answer[3]

    def _answer(self) -> tuple[Any, ...]:
        got = _recv(self.sock)
        if got is None:
            raise ZygoteError("the inputs' parent process (the zygote) is gone")
        return got[0]

    def close(self) -> None:
        """End the zygote (it exits at the end of its socket) and reap it."""
        self.sock.close()
        self.process.wait()


def _serve(sock: socket.socket) -> None:
    """The zygote's life: set up, then fork a process per input until the worker goes."""
    got = _recv(sock)
    if got is None:
        return
    _, fn_bytes, path, cwd, environ, limit_s = got[0]
    # An input's process dies of SIGTERM, as before (an ignored one passes through exec).
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    sys.path[:] = path
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(environ)
    importlib.invalidate_caches()  # requirements the worker installed are importable
    try:
        fn = load_function(fn_bytes)
    except BaseException as exc:  # noqa: BLE001 - reported: it stops the batch
        _send(sock, ("failed", f"{type(exc).__name__}: {exc}"))
        return
    del fn_bytes, got
    # What is here now is shared by every input's process and never changes: keep the
    # collector off it, so no collection in a child walks (and copies) all its pages.
    # (Each page a child writes, even a reference count, is a fault and a copy: the
    # child's path below is kept short for that reason.)
    gc.freeze()
    succeeded = protocol.dump_json(build_success(None)[1])
    _send(sock, ("ready", ""))
    while (got := _recv(sock)) is not None:
        message, fds = got
        if message[0] == "run":
            ended = _run_one(sock, fn, message[1], fds[0], succeeded, limit_s)
            _send(sock, ("ended", *ended))
        # else: a kill that came after its input ended


def _run_one(
    sock: socket.socket,
    fn: Any,
    blob: bytes,
    output_fd: int,
    succeeded: bytes,
    limit_s: float | None,
) -> Ended:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the input's process: never returns
        os.close(read_fd)
        sock.close()  # the worker sees the zygote's end when the zygote ends, not later
        _child(fn, blob, output_fd, write_fd, succeeded, limit_s)
    os.close(write_fd)
    os.close(output_fd)
    parts: list[bytes] = []
    killed = False
    hard_at = None if limit_s is None else time.monotonic() + limit_s + _hard_grace()
    try:
        while True:
            wait = None if hard_at is None else max(0.0, hard_at - time.monotonic())
            ready, _, _ = select.select([read_fd, sock.fileno()], [], [], wait)
            if not ready:  # past its limit and not unwound: the time limit's failure
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                assert limit_s is not None
                parts = [_time_limit_message(limit_s)]
                break
            if read_fd in ready:
                chunk = os.read(read_fd, 1 << 20)
                if not chunk:
                    break
                parts.append(chunk)
            elif ready:  # a kill, or the worker is gone
                gone = _recv(sock) is None
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                killed = True
                if gone:
                    os.waitpid(pid, 0)
                    os._exit(0)
                break
    finally:
        os.close(read_fd)
    _, status = os.waitpid(pid, 0)
    return status, killed, b"".join(parts)


def _hard_grace() -> float:
    from runner.time_limit import HARD_GRACE_S

    return HARD_GRACE_S


def _time_limit_message(limit_s: float) -> bytes:
    """What the input's process would have sent had its limit unwound it."""
    from runner.time_limit import TimeLimitExceeded

    error = TimeLimitExceeded(protocol.time_limit_message(limit_s))
    data, record = build_failure("execute", error, user=False)
    return _failure_head(record, error) + b"\n" + data


def _failure_head(record: protocol.FinalRecord, error: BaseException) -> bytes:
    names = sorted(protocol.exception_type_names(type(error)))
    return protocol.dump_json({**record, "error_types": names})


def _arm(limit_s: float) -> None:
    """Raise the time limit's exception in this process's function after ``limit_s``."""
    from runner.time_limit import TimeLimitExceeded

    def alarm(signum: int, frame: Any) -> None:
        raise TimeLimitExceeded(protocol.time_limit_message(limit_s))

    signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, limit_s)


def _time_limit_exceeded(exc: BaseException) -> bool:
    from runner.time_limit import TimeLimitExceeded  # imported already: the limit is armed

    return isinstance(exc, TimeLimitExceeded)


def _child(
    fn: Any, blob: bytes, out_fd: int, result_fd: int, succeeded: bytes, limit_s: float | None
) -> None:
    """The input's process: run, send ``record JSON line + payload``, exit.
    ``succeeded`` is a success's record line, made once in the zygote."""
    code = 0
    error: BaseException | None = None  # the function's (its names go with the record)
    try:
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        try:
            args, kwargs, environ = cloudpickle.loads(blob)
        except BaseException as exc:  # noqa: BLE001 - recorded as the input's failure
            data, record = build_failure("resolve", exc, user=False)
        else:
            for key, value in environ.items():  # (update() checks types: more pages)
                os.environ[key] = value
            try:
                if limit_s is not None:
                    _arm(limit_s)
                value = fn(*args, **kwargs)
                if limit_s is not None:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            except BaseException as exc:  # noqa: BLE001 - SystemExit too: the input's outcome
                if limit_s is not None:
                    signal.setitimer(signal.ITIMER_REAL, 0)
                traceback.print_exc()
                error = exc
                limited = limit_s is not None and _time_limit_exceeded(exc)
                data, record = build_failure("execute", exc, user=not limited)
            else:
                data, record = build_success(value)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        if record["state"] == "succeeded":
            head = succeeded
        elif error is not None:
            head = _failure_head(record, error)
        else:
            head = protocol.dump_json(record)
        message = memoryview(head + b"\n" + data)
        while message:
            message = message[os.write(result_fd, message) :]
    except BaseException:  # noqa: BLE001 - never return into the zygote's code
        code = 1
    finally:
        os._exit(code)


if __name__ == "__main__":
    _serve(socket.socket(fileno=int(sys.argv[1])))
