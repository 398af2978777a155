"""The launcher: one warm process per local root that forks local jobs.

Theory of operation. Starting ``python -m runner`` costs an interpreter start plus
the runner's imports (tens of milliseconds of CPU) per job. The launcher pays that
once: it imports the runner, then serves requests on an abstract Unix socket named
after its local root and its *tag* (the interpreter and the start-up environment it
was started with). Each request forks one job:

1. the launcher forks the job's *leader*, which makes its own process group (the
   job's, for cancel: the leader's pid) in the launcher's session, closes the
   launcher's socket and lock, and tells the launcher it is ready;
2. the leader forks the job itself, which points stdout/stderr at the job's log,
   enters the job's working directory and environment, and runs
   :func:`runner._main.main` with the job's arguments, exactly as ``python -m runner``
   would; the leader waits for it and writes its exit status (a shell's ``$?``:
   ``128 + signal`` for a signal) to the status file, unless the job left its final
   record (the request's ``final``: then the status would say less), then exits.

The reply names the leader (pid, start time, process group), as the spawn path of
:mod:`kinetic._backends._process` does for its shell subshell. The kernel reaps the
leaders (``SIGCHLD`` is ignored), and a job outlives the submitter, and the launcher
when it is killed.

*One session for all jobs.* The launcher runs in a session of its own, with no
terminal (it is started detached). Its jobs stay in that session rather than each
starting one: where the kernel groups CPU time by session (autogroup, on by default on
desktop and many server kernels), a hundred jobs in a hundred sessions each got the
share of the submitting application's whole session, and the application's event
loop waited behind them (tens of milliseconds a step on 2 cores). In one session, the
jobs together share like one program.

*Leaving only after the jobs.* A process group whose leader's parent leaves the
session becomes orphaned, and the kernel sends SIGHUP to such a group if one of its
processes is stopped (``kill -STOP``): it would end a paused job. So a launcher that
stops serving (idle, stale, or its lock file removed) first frees its socket and lock,
then waits, serving nothing, until the leaders it forked have exited (one ``pidfd``
each, no polling).

Liveness is an exclusive ``flock`` on ``{root}/launcher/{tag}.lock`` (the kernel drops
it when the launcher dies; a second launcher for the same tag exits at once). The
launcher checks, before every fork, that the files of the modules it has loaded
(``runner``, ``cloudpickle``, ...) are unchanged: after an upgrade it answers
``stale`` and exits, so the next job gets a fresh launcher. It exits as well after
``--idle`` seconds without a request, or when its lock file disappears.

Like the rest of ``runner`` this module never imports ``kinetic``.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import fcntl
import functools
import gc
import hashlib
import json
import os
import re
import select
import selectors
import signal
import socket
import sys
import sysconfig
import threading
import time
import traceback
import types
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import runner
from runner import peer, protocol
from runner._main import main as runner_main
from runner.fs import atomic_write, check_private_dir, make_private_dirs
from runner.job import parse_args
from runner.procstat import start_ticks
from runner.store import FileStore, open_store

PROTOCOL = 1
# Variables read once, when an interpreter starts: a job must find them as the
# launcher did, or it would not see what `python -m runner` would have seen.
_STARTUP_PREFIXES = ("PYTHON", "LD_")
_MAX_REQUEST = 8 << 20
_READ_TIMEOUT = 10.0  # seconds a connection has to send its whole request
_PRUNE_AT = 1024  # leaders noted before the ended ones are forgotten
_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")  # no separators, no dots
_RUNNER_MAIN = str(Path(runner.__file__).resolve().parent / "__main__.py")


def launcher_tag(executable: str, env: Mapping[str, str]) -> str:
    """What a launcher must share with a job it forks: the interpreter and the start-up
    variables of the environment (``PYTHON*``, ``LD_*``)."""
    startup = tuple(sorted((k, v) for k, v in env.items() if k.startswith(_STARTUP_PREFIXES)))
    return _tag(executable, startup)


@functools.lru_cache(maxsize=64)
def _tag(executable: str, startup: tuple[tuple[str, str], ...]) -> str:
    # Cached: resolving the interpreter's path costs a stat per component, per job.
    text = json.dumps([os.path.realpath(executable), startup])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def launcher_dir(root: Path) -> Path:
    """Where the launchers of a local root keep their lock, record and log."""
    return Path(root) / "launcher"


def socket_address(root: Path, tag: str) -> bytes:
    """The abstract Unix socket address of the launcher of ``root`` with ``tag``."""
    digest = hashlib.sha256(f"{Path(root).absolute()}|{tag}".encode()).hexdigest()[:32]
    return b"\0kinetic-launcher-" + digest.encode()


def loaded_code() -> list[tuple[str, int, int]]:
    """(file, mtime_ns, size) of every loaded module outside the standard library."""
    stdlib = {os.path.realpath(sysconfig.get_paths()[k]) + os.sep for k in ("stdlib", "platstdlib")}
    out = []
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if not isinstance(path, str) or any(path.startswith(s) for s in stdlib):
            continue
        try:
            st = os.stat(path)
        except OSError:
            out.append((path, -1, -1))
            continue
        out.append((path, st.st_mtime_ns, st.st_size))
    return sorted(set(out))


def _changed(before: list[tuple[str, int, int]]) -> str | None:
    """The first loaded file that changed since ``before`` was taken, or None."""
    for path, mtime, size in before:
        try:
            st = os.stat(path)
        except OSError:
            return path
        if (st.st_mtime_ns, st.st_size) != (mtime, size):
            return path
    return None


class _Launcher:
    def __init__(self, root: Path, tag: str, lock: Any, listener: socket.socket) -> None:
        self.root, self.tag, self.lock, self.listener = root, tag, lock, listener
        self.code = loaded_code()
        self.gate = peer.Gate("launcher")
        self.reading: dict[socket.socket, _Reading] = {}  # connections whose request is coming
        self.leaders: dict[int, int | None] = {}  # pid -> start ticks, of forked leaders
        self._prune_at = _PRUNE_AT

    def _note_leader(self, pid: int, ticks: int | None) -> None:
        self.leaders[pid] = ticks
        if len(self.leaders) >= self._prune_at:  # forget the ended ones, now and then
            self.leaders = {p: t for p, t in self.leaders.items() if start_ticks(p) == t}
            self._prune_at = max(_PRUNE_AT, 2 * len(self.leaders))

    def outlive_leaders(self) -> None:
        """Block until every leader this launcher forked has exited (module docstring)."""
        pidfd_open: Callable[[int], int] | None = getattr(os, "pidfd_open", None)  # Linux 5.3+
        if pidfd_open is None:  # nothing to wait with: leave at once, as before
            return
        pending = []
        for pid, ticks in self.leaders.items():
            try:
                fd = pidfd_open(pid)
            except OSError:  # gone already (or no pidfds on this kernel)
                continue
            if start_ticks(pid) != ticks:  # the pid is another process's now
                os.close(fd)
                continue
            pending.append(fd)
        self.leaders.clear()
        poller = select.poll()
        for fd in pending:
            poller.register(fd, select.POLLIN)
        try:
            while pending:
                for fd, _ in poller.poll():
                    poller.unregister(fd)
                    pending.remove(fd)
                    os.close(fd)
        finally:
            for fd in pending:
                os.close(fd)

    def serve(self, idle: float) -> None:
        """Answer requests until idle for ``idle`` seconds, the lock file is gone, or the
        code changed. Connections are read side by side (one that sends nothing holds
        up no other), each for at most :data:`_READ_TIMEOUT` seconds; a request is
        answered once its line is in."""
        lock_path = launcher_dir(self.root) / f"{self.tag}.lock"
        self.listener.setblocking(False)
        sel = selectors.DefaultSelector()
        sel.register(self.listener, selectors.EVENT_READ, None)
        last = time.monotonic()
        try:
            while True:
                deadlines = [c.deadline for c in self.reading.values()]
                wait = min([1.0, *(d - time.monotonic() for d in deadlines)])
                events = sel.select(max(0.0, wait))
                now = time.monotonic()
                for key, _ in events:
                    if key.data is None:
                        if self._accept(sel, now):
                            last = now
                    elif not self._read(sel, key.data):
                        return
                for conn in [c for c, r in self.reading.items() if r.deadline <= now]:
                    self._drop(sel, conn, "bad request: timed out")
                idle_now = not self.reading and now - last > idle
                if not events and (idle_now or not lock_path.exists()):
                    return
        finally:
            for conn in list(self.reading):
                self._drop(sel, conn, None)
            sel.close()

    def _accept(self, sel: selectors.BaseSelector, now: float) -> bool:
        """Take the waiting connections; whether one was our own user's."""
        admitted = False
        while True:
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return admitted
            if not self.gate.admit(conn):  # another user's: closed unread (and logged)
                conn.close()
                continue
            admitted = True
            conn.setblocking(False)
            self.reading[conn] = _Reading(now + _READ_TIMEOUT)
            sel.register(conn, selectors.EVENT_READ, conn)

    def _drop(self, sel: selectors.BaseSelector, conn: socket.socket, error: str | None) -> None:
        self.reading.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(conn)
        if error is not None:
            conn.setblocking(True)
            conn.settimeout(_READ_TIMEOUT)
            _reply(conn, {"error": error})
        conn.close()

    def _read(self, sel: selectors.BaseSelector, conn: socket.socket) -> bool:
        """Read what ``conn`` sent; answer it once its request is whole. False when the
        launcher must stop (its code changed)."""
        reading = self.reading[conn]
        try:
            chunk = conn.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(sel, conn, "bad request: the request ended early")
            return True
        reading.buf += chunk
        if not reading.buf.endswith(b"\n"):
            if len(reading.buf) > _MAX_REQUEST:
                self._drop(sel, conn, "bad request: the request is too large")
            return True
        self.reading.pop(conn)
        sel.unregister(conn)
        conn.setblocking(True)
        conn.settimeout(_READ_TIMEOUT)
        with conn:
            return self._answer(conn, bytes(reading.buf))

    def _answer(self, conn: socket.socket, line: bytes) -> bool:
        """Serve one request; False when the launcher must stop (its code changed)."""
        try:
            request = _parse_request(line)
        except (TypeError, ValueError) as exc:
            _reply(conn, {"error": f"bad request: {exc}"})
            return True
        changed = _changed(self.code)
        if changed is not None:
            # Free the name and the lock first: the client starts a fresh launcher at once.
            self.listener.close()
            self.lock.close()
            _reply(conn, {"stale": f"{changed} changed since the launcher started"})
            return False
        try:
            reply: dict[str, Any] = self._fork(request, conn)
        except (OSError, KeyError, TypeError, ValueError) as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        _reply(conn, reply)
        return True

    def _fork(self, request: dict[str, Any], conn: socket.socket) -> dict[str, Any]:
        job = _JobRequest(request, self.root)
        sys.stdout.flush()
        sys.stderr.flush()
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the job's leader: never returns
            try:
                os.close(ready_r)
                for held in (self.listener, self.lock, conn, *self.reading):
                    held.close()  # the other connections are not the job's either
                _lead(job, ready_w)
            finally:
                os._exit(127)
        os.close(ready_w)
        try:
            ready = os.read(ready_r, 1)
        finally:
            os.close(ready_r)
        if ready != b"1":
            raise OSError("the job's leader died before it started the job")
        ticks = start_ticks(pid)
        self._note_leader(pid, ticks)
        return {"pid": pid, "start_ticks": -1 if ticks is None else ticks, "pgid": pid}


class _JobRequest:
    """A validated request: the runner's arguments, and where and how the job runs.

    A launcher runs jobs of its own root only: the runner's storage must be the root's
    store (``{root}/storage``, whose payloads the user wrote), and every path the
    request names (log, status, final record, working directory) must lie inside it.
    Its peer is the launcher's own user (:class:`runner.peer.Gate`); this keeps a
    confused or stale client from writing, or running, anything elsewhere.
    """

    def __init__(self, request: dict[str, Any], root: Path) -> None:
        if request.get("v") != PROTOCOL:
            raise ValueError(f"protocol {request.get('v')!r}, expected {PROTOCOL}")
        self.args = [str(a) for a in request["args"]]
        try:  # a malformed request fails here, not in a job
            options = parse_args(self.args, {"upload-logs"})
        except SystemExit as exc:
            raise ValueError(str(exc)) from None
        store = store_dir(root)
        url = options.get("storage")
        target = open_store(url) if isinstance(url, str) and url.startswith("file://") else None
        if not isinstance(target, FileStore) or os.path.normpath(target.root) != str(store):
            raise ValueError(f"the storage must be {store.as_uri()}, this launcher's own")
        job_id = options.get("job-id")
        if not isinstance(job_id, str) or not _JOB_ID.fullmatch(job_id):
            raise ValueError(f"not a job id: {job_id!r}")
        self.cwd = _inside(store, request["cwd"], "cwd")
        self.env = {str(k): str(v) for k, v in dict(request["env"]).items()}
        self.log = _inside(store, request["log"], "log")
        self.status = _inside(store, request["status"], "status")
        final = request.get("final")
        self.final = None if final is None else _inside(store, final, "final")


def store_dir(root: Path) -> Path:
    """The store a launcher's jobs use: ``{root}/storage`` (the local backend's)."""
    return Path(os.path.abspath(root)) / "storage"


def _inside(store: Path, value: object, name: str) -> str:
    """``value`` as a normalised absolute path, if it lies under ``store``."""
    if not isinstance(value, str) or not os.path.isabs(value):
        raise ValueError(f"{name} must be an absolute path, not {value!r}")
    path = os.path.normpath(value)
    if not Path(path).is_relative_to(store):
        raise ValueError(f"{name} {path!r} lies outside this launcher's store {store}")
    return path


def _lead(job: _JobRequest, ready_w: int) -> None:
    """The job's leader: own process group, fork the job, record its exit status, exit."""
    os.setpgid(0, 0)  # the job's own group, in the launcher's session (module docstring)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # we wait for the job ourselves
    os.write(ready_w, b"1")
    os.close(ready_w)
    log = os.open(job.log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    child = os.fork()
    if child == 0:
        try:
            _run_job(job, log)
        finally:
            os._exit(1)
    os.close(log)
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
    # The runner's final record, when it left one, says more than its exit status.
    if job.final is None or not os.path.exists(job.final):
        code = os.waitstatus_to_exitcode(status)
        with open(job.status, "w") as f:  # what `echo $? > status` writes
            f.write(f"{128 - code if code < 0 else code}\n")
    os._exit(0)


def _run_job(job: _JobRequest, log: int) -> None:
    """The job: ``python -m runner ARGS`` with the job's output, cwd and environment."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)
    os.chdir(job.cwd)
    os.environ.clear()
    os.environ.update(job.env)
    # As `python -m runner` started in cwd: argv[0] is the module's file, path[0] the cwd.
    sys.argv = [_RUNNER_MAIN, *job.args]
    if not sys.flags.safe_path:  # with -P (PYTHONSAFEPATH) neither has a cwd entry
        sys.path[0] = job.cwd
    main = types.ModuleType("__main__")
    main.__file__ = _RUNNER_MAIN
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    sys.modules["__main__"] = main
    code: object = 1
    try:
        code = runner_main(job.args)
    except SystemExit as exc:
        code = exc.code
    except BaseException:  # noqa: BLE001 - as the interpreter would: print it, exit 1
        traceback.print_exc()
        code = 1
    finally:
        # What interpreter shutdown does before it exits: join threads, run atexit.
        with contextlib.suppress(BaseException):
            shutdown = getattr(threading, "_shutdown", None)
            if shutdown is not None:
                shutdown()
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                stream.flush()
    os._exit(_exit_status(code))


def _exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    with contextlib.suppress(BaseException):
        print(code, file=sys.stderr)
    return 1


class _Reading:
    """A connection's request as it comes in, and when it must be whole."""

    __slots__ = ("buf", "deadline")

    def __init__(self, deadline: float) -> None:
        self.buf = bytearray()
        self.deadline = deadline


def _parse_request(line: bytes) -> dict[str, Any]:
    request = json.loads(line)
    if not isinstance(request, dict):
        raise TypeError("the request is not an object")
    return request


def _reply(conn: socket.socket, reply: Mapping[str, Any]) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(json.dumps(reply).encode() + b"\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: ``python -m runner.launcher --root DIR --tag TAG [--idle SECONDS]``."""
    args = parse_args(sys.argv[1:] if argv is None else argv, set())
    if not isinstance(args.get("root"), str) or not isinstance(args.get("tag"), str):
        raise SystemExit("usage: python -m runner.launcher --root DIR --tag TAG [--idle S]")
    root, tag = Path(str(args["root"])), str(args["tag"])
    idle = float(str(args.get("idle", "300")))
    where = launcher_dir(root)
    make_private_dirs(where)
    try:  # jobs of a root another user may write could be theirs (runner.fs)
        check_private_dir(root)
    except PermissionError as exc:
        raise SystemExit(f"kinetic launcher: {exc}") from None
    lock = open(where / f"{tag}.lock", "a")  # noqa: SIM115 - held for our lifetime
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0  # another launcher serves this root and tag
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_address(root, tag))
    listener.listen(512)
    # What every local job imports after the fork (to claim its shared context): once
    # here, not again in each job; before the launcher notes its loaded code, so an
    # upgrade of it makes the launcher stale too.
    import runner.contexts  # noqa: F401

    launcher = _Launcher(root, tag, lock, listener)
    record = {"pid": os.getpid(), "executable": sys.executable, "protocol": PROTOCOL}
    atomic_write(where / f"{tag}.json", protocol.dump_json(record))
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the jobs' leaders
    gc.collect()
    gc.freeze()  # forked jobs then share the launcher's pages instead of copying them
    try:
        launcher.serve(idle)
    finally:
        listener.close()
        lock.close()
    launcher.outlive_leaders()
    return 0


if __name__ == "__main__":
    sys.exit(main())
