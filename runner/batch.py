"""The local batch engine: one detached supervisor, a pool of forked workers.

Theory of operation
-------------------
``python -m runner.batch --storage file:///… --group grp-…`` is started detached
by the local backend once a batch's inputs are durably recorded. It

1. takes an exclusive ``flock`` on the group's ``supervisor.lock`` (a second
   supervisor for the same batch exits at once, so attaching processes may
   launch one without coordination);
2. reads the manifest, and the results already present: those inputs are done
   (this is how a batch resumes after its supervisor died — an input that was
   running then runs again: delivery is at-least-once, as the manifest says);
3. unpacks the context once, forks ``max_concurrent`` workers (each unpickles
   the function once) and feeds them input indices over socket pairs;
4. each worker runs its inputs one by one and appends each outcome, alone, to its
   results log (:mod:`runner._results_log`) before reporting it;
5. streams events (``d i state`` when an input is done, ``r i`` when dispatched)
   to clients connected to an abstract Unix socket named after the batch, and
   takes commands from them (``C``: cancel the batch, ``c i``: cancel one input).

A worker that dies mid-input fails that input (or retries it), its other queued
inputs go back to the queue, and a new worker takes its place: the batch never
hangs. Which input it died in is not guessed from what it was sent: a worker
reports in bursts, so the supervisor may not yet have heard of the inputs it
finished just before dying. Each worker marks the input it starts and ends in a
word of shared memory (no system call), and on its death the supervisor reads
that word and the worker's results log: inputs with a record keep it, inputs
that ended without one (a failed attempt to retry) are retried, the input it was
running is failed (or retried), and the rest, never started, are queued again.

``fail_fast`` stops dispatching after the first final failure (and with
``cancel_running_on_fail`` kills running workers); both record ``stop.json``,
so every input without a result is then known to be cancelled.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import mmap
import os
import selectors
import signal
import socket
import struct
import sys
import tempfile
import time
import traceback
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cloudpickle

from runner import _results_log as results_log
from runner import protocol
from runner._fs import atomic_write, make_private_dirs
from runner._main import PhaseError, build_failure, build_success, parse_args, prepare_workspace
from runner._store import FileStore, open_store


def socket_address(storage_url: str, group_id: str) -> bytes:
    """The abstract Unix socket address of a batch's supervisor."""
    digest = hashlib.sha256(f"{storage_url}|{group_id}".encode()).hexdigest()[:32]
    return b"\0kinetic-batch-" + digest.encode()


# Each worker's shared word: the input (index, attempt) it started last, and whether it
# is still running it. Written by the worker only, read by the supervisor once it died.
_SLOT = struct.Struct("=qqq")


def _mark(slot: mmap.mmap, index: int, attempt: int, running: bool) -> None:
    _SLOT.pack_into(slot, 0, index, attempt, int(running))


# ----------------------------------------------------------------------------- worker


class _Inputs:
    """Input chunks, loaded on first use and kept (a worker runs many of the same chunk)."""

    def __init__(self, store: FileStore, group_id: str, chunk_size: int) -> None:
        self.store, self.group_id, self.chunk_size = store, group_id, chunk_size
        self.chunks: dict[int, list[tuple[tuple[Any, ...], dict[str, Any]]]] = {}

    def get(self, index: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        chunk, offset = divmod(index, self.chunk_size)
        items = self.chunks.get(chunk)
        if items is None:
            data = self.store.read(protocol.group_inputs_key(self.group_id, chunk))
            items = self.chunks[chunk] = cloudpickle.loads(data)
        return items[offset]


def _worker_main(
    sock: socket.socket,
    slot: mmap.mmap,
    store: FileStore,
    manifest: dict[str, Any],
    fn_bytes: bytes,
    log: Path,
) -> None:
    group_id = manifest["group_id"]
    results_fd = results_log.open_log(log)
    replies: list[str] = []
    last_reply = time.monotonic()
    out_base = manifest["spec"]["output_dir"]
    inputs = _Inputs(store, group_id, manifest["chunk_size"])
    has_data = bool(manifest["spec"].get("has_data"))
    data_workdir = Path(os.getcwd()).parent  # the supervisor's workdir (cwd is its workspace)
    if has_data:
        from runner.data import resolve_arguments
    try:
        fn = cloudpickle.loads(fn_bytes)
    except BaseException as exc:  # noqa: BLE001 - reported to the supervisor, then we end
        sock.sendall(
            f"F deserialize {type(exc).__name__}: {exc}".replace("\n", " ").encode() + b"\n"
        )
        return
    queue: deque[tuple[int, int, bool]] = deque()
    buf = b""
    out = sys.stdout
    while True:
        # Reply in bursts (one send per ~2 ms of work), always before waiting for more.
        if replies and (not queue or time.monotonic() - last_reply > 0.002):
            sock.sendall("".join(replies).encode())
            replies.clear()
            last_reply = time.monotonic()
        # Take whatever the supervisor sent; block only when there is nothing to do.
        sock.setblocking(not queue)
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            data = None
        if data == b"":
            return  # the supervisor is gone
        if data:
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if line == b"X":  # stop: hand back what has not started
                    if queue:
                        sock.sendall("".join(f"u {i}\n" for i, _, _ in queue).encode())
                        queue.clear()
                    continue
                for item in line.decode().split(","):
                    i_s, attempt_s, final_s = item.split(":")
                    queue.append((int(i_s), int(attempt_s), final_s == "1"))
        if not queue:
            continue
        index, attempt, final = queue.popleft()
        job_id = protocol.member_job_id(group_id, index)
        out_dir = f"{out_base}/{job_id}"
        os.environ["KINETIC_OUTPUT_DIR"] = out_dir
        os.environ["JOB_ID"] = job_id
        _mark(slot, index, attempt, True)
        out.write(f"{protocol.INPUT_MARKER} {index}\n")
        started = time.perf_counter()
        outcome: tuple[bytes, protocol.FinalRecord] | None = None
        try:
            args, kwargs = inputs.get(index)
            if has_data:
                args, kwargs = resolve_arguments(store, args, kwargs, data_workdir)
            # KINETIC_OUTPUT_DIR is not created per input: a mkdir costs more than a
            # trivial input (~80 us here). Inputs that write outputs create it.
            value = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - SystemExit included: record, go on
            traceback.print_exc()
            if final:
                outcome = build_failure("execute", exc, user=True)
        else:
            outcome = build_success(value)
        with contextlib.suppress(OSError, ValueError):
            out.flush()
        elapsed_us = int((time.perf_counter() - started) * 1e6)
        if outcome is None:  # failed, and a retry will follow
            _mark(slot, index, attempt, False)
            replies.append(f"r {index} {elapsed_us}\n")
            continue
        data_, record = outcome
        header: dict[str, Any] = {"attempt": attempt}
        header.update({k: v for k, v in record.items() if v is not None})
        results_log.append(results_fd, index, header, data_)  # durable before reported
        _mark(slot, index, attempt, False)
        kind = "s" if record["state"] == "succeeded" else "f"
        replies.append(f"{kind} {index} {elapsed_us}\n")


# ------------------------------------------------------------------------- supervisor


class _Worker:
    def __init__(
        self, n: int, pid: int, sock: socket.socket, slot: mmap.mmap, results: Path
    ) -> None:
        self.n, self.pid, self.sock, self.slot, self.results = n, pid, sock, slot, results
        # (index, attempt) sent to the worker and not yet reported back, in run order.
        self.assigned: deque[tuple[int, int]] = deque()
        self.rbuf = b""
        self.gone = False  # its socket broke: it died, and its EOF is yet to be read
        self.cancelled: set[int] = set()  # inputs it held when it was killed to cancel them


class _Client:
    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.wbuf, self.rbuf = sock, bytearray(), b""


class Supervisor:
    """Runs the inputs of one batch on a pool of forked workers."""

    def __init__(self, storage_url: str, store: FileStore, manifest: dict[str, Any]) -> None:
        self.url, self.store, self.manifest = storage_url, store, manifest
        self.group_id: str = manifest["group_id"]
        self.total: int = manifest["total"]
        opts = manifest["options"]
        self.retries: int = opts["retries"]
        self.fail_fast: bool = opts["fail_fast"]
        self.cancel_running_on_fail: bool = opts["cancel_running_on_fail"]
        self.pool_size: int = max(1, opts["max_concurrent"])
        self.results_dir = store.root / protocol.group_results_prefix(self.group_id)
        self.done: dict[int, str] = {}
        self.order: list[int] = []
        self.pending: deque[tuple[int, int]] = deque()
        self.workers: dict[int, _Worker] = {}
        self.clients: dict[int, _Client] = {}
        self.stopping = False
        self.sel = selectors.DefaultSelector()
        self.events: list[str] = []
        self.mean_s = 0.0
        self.next_worker = 0
        self.fn_bytes = b""

    # -- state ---------------------------------------------------------------------

    def load_done(self) -> None:
        make_private_dirs(self.results_dir)
        for path in results_log.iter_logs(self.results_dir):
            records, _ = results_log.read_new(path, 0)
            for record in records:
                if record.index not in self.done:
                    self.done[record.index] = record.header["state"]
                    self.order.append(record.index)
        self.pending = deque((i, 0) for i in range(self.total) if i not in self.done)
        self.own_log = results_log.open_log(self.results_dir / f"supervisor-{os.getpid()}.log")

    def mark_done(self, index: int, state: str) -> None:
        if index in self.done:
            return
        self.done[index] = state
        self.order.append(index)
        self.events.append(f"d {index} {state[0]}\n")
        if state == "failed" and self.fail_fast and not self.stopping:
            self.stop("fail_fast", f"input {index} failed", kill=self.cancel_running_on_fail)

    def write_member(self, index: int, state: str, error: str, phase: str | None) -> None:
        header = {"state": state, "attempt": 0, "error": error}
        if phase:
            header["phase"] = phase
        payload = cloudpickle.dumps(
            protocol.result_payload(success=False, phase=phase, error=error, error_type="")
        )
        results_log.append(self.own_log, index, header, payload)
        self.mark_done(index, state)

    def stop(self, reason: str, detail: str, *, kill: bool, phase: str | None = None) -> None:
        """Stop launching inputs; record why. With ``kill``, end running workers too."""
        self.stopping = True
        record = {"reason": reason, "detail": detail, "phase": phase}
        atomic_write(
            self.store.root / protocol.group_stop_key(self.group_id), protocol.dump_json(record)
        )
        self.pending.clear()
        for w in list(self.workers.values()):
            if kill:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(w.pid, signal.SIGKILL)
            else:
                with contextlib.suppress(OSError):
                    w.sock.sendall(b"X\n")

    # -- workers -------------------------------------------------------------------

    def spawn(self) -> None:
        parent, child = socket.socketpair()
        n = self.next_worker
        self.next_worker += 1
        log = self.store.root / protocol.group_logs_prefix(self.group_id) / f"worker-{n}.txt"
        make_private_dirs(log.parent)
        results = self.results_dir / f"w{os.getpid()}-{n}.log"
        slot = mmap.mmap(-1, _SLOT.size)  # shared (MAP_SHARED) with the child
        _mark(slot, -1, -1, False)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the worker
            code = 0
            try:
                parent.close()
                self.sel.close()
                for other in self.workers.values():
                    other.sock.close()
                    other.slot.close()
                for c in self.clients.values():
                    c.sock.close()
                self.listener.close()
                fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                os.close(fd)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                _worker_main(child, slot, self.store, self.manifest, self.fn_bytes, results)
            except BaseException:  # noqa: BLE001 - never return into the supervisor's code
                traceback.print_exc()
                code = 1
            finally:
                with contextlib.suppress(Exception):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(code)
        child.close()
        parent.setblocking(False)
        worker = _Worker(n, pid, parent, slot, results)
        self.workers[parent.fileno()] = worker
        self.sel.register(parent, selectors.EVENT_READ, ("worker", worker))

    def limit(self) -> int:
        """How many inputs a worker may hold: ~10 ms of work, at least 1."""
        if self.mean_s <= 0:
            return 1
        return max(1, min(128, int(0.01 / self.mean_s)))

    def dispatch(self) -> None:
        if self.stopping:
            return
        limit = self.limit()
        for w in self.workers.values():
            if not self.pending:
                return
            room = limit - len(w.assigned)
            if w.gone or room <= 0 or (limit > 1 and len(w.assigned) > limit // 2):
                continue
            batch: list[tuple[int, int]] = []
            while self.pending and len(batch) < room:
                index, attempt = self.pending.popleft()
                if index in self.done:
                    continue
                batch.append((index, attempt))
            if not batch:
                continue
            w.assigned.extend(batch)
            msg = ",".join(f"{i}:{a}:{int(a >= self.retries)}" for i, a in batch)
            w.sock.setblocking(True)
            try:
                w.sock.sendall(msg.encode() + b"\n")
            except OSError:
                # It died since its last report: its exit (the EOF, read next) queues
                # this batch again, as never started.
                w.gone = True
                continue
            finally:
                w.sock.setblocking(False)
            self.events.extend(f"r {i}\n" for i, _ in batch)

    def on_worker_data(self, w: _Worker) -> None:
        try:
            data = w.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.on_worker_exit(w)
            return
        w.rbuf += data
        *lines, w.rbuf = w.rbuf.split(b"\n")
        for raw in lines:
            parts = raw.decode().split(" ", 2)
            kind = parts[0]
            if kind == "F":  # the function cannot be loaded: nothing can run
                self.stop("failed", parts[2] if len(parts) > 2 else "", kill=True, phase=parts[1])
                continue
            index = int(parts[1])
            if kind == "u":  # handed back unstarted (after a stop)
                self._unassign(w, index)
                continue
            attempt = self._unassign(w, index)
            elapsed = int(parts[2]) / 1e6 if len(parts) > 2 else 0.0
            self.mean_s = elapsed if self.mean_s == 0 else 0.8 * self.mean_s + 0.2 * elapsed
            if kind == "r":
                self.pending.appendleft((index, attempt + 1))
            else:
                self.mark_done(index, "succeeded" if kind == "s" else "failed")

    def _unassign(self, w: _Worker, index: int) -> int:
        for pos, (i, attempt) in enumerate(w.assigned):
            if i == index:
                del w.assigned[pos]
                return attempt
        return 0

    def on_worker_exit(self, w: _Worker) -> None:
        """Settle what a dead worker held, from what it left behind, not from guesses.

        Its socket is drained (EOF comes after every reply it sent), but replies it had
        not sent yet are lost: the inputs it held are judged by its results log (an
        input with a record is done, whatever killed the worker after) and by its
        shared word (the input it last started, and whether that one had ended).
        """
        self.sel.unregister(w.sock)
        del self.workers[w.sock.fileno()]
        w.sock.close()
        _, status = os.waitpid(w.pid, 0)
        last_index, last_attempt, last_running = _SLOT.unpack_from(w.slot)
        w.slot.close()
        how = (
            f"killed by signal {os.WTERMSIG(status)}"
            if os.WIFSIGNALED(status)
            else f"exited with status {os.WEXITSTATUS(status)}"
        )
        held = list(w.assigned)
        w.assigned.clear()
        if not held:
            return
        recorded: dict[int, str] = {}
        held_indices = {i for i, _ in held}
        for record in results_log.read_new(w.results, 0)[0]:
            if record.index in held_indices:
                recorded.setdefault(record.index, record.header["state"])
        # Inputs up to the last one started ran (in order); those after it never started.
        started = next(
            (pos + 1 for pos, item in enumerate(held) if item == (last_index, last_attempt)), 0
        )
        requeue: list[tuple[int, int]] = []
        for pos, (index, attempt) in enumerate(held):
            if index in recorded:
                self.mark_done(index, recorded[index])
            elif self.stopping:
                continue  # it will never run: the stop record says so
            elif index in w.cancelled:
                self.write_member(index, "cancelled", "cancelled", None)
            elif pos >= started:
                requeue.append((index, attempt))  # never started
            elif pos < started - 1 or not last_running:
                requeue.append((index, attempt + 1))  # failed, its retry report was lost
            elif w.cancelled:
                requeue.append((index, attempt))  # killed to cancel another: run it again
            elif attempt < self.retries:
                requeue.append((index, attempt + 1))
            else:
                self.write_member(
                    index,
                    "failed",
                    f"the worker process {how} while running input {index}",
                    "execute",
                )
        if not self.stopping:  # (a failure settled above may have stopped the batch)
            self.pending.extendleft(reversed(requeue))

    # -- clients -------------------------------------------------------------------

    def on_accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except BlockingIOError:
            return
        sock.setblocking(False)
        client = _Client(sock)
        self.clients[sock.fileno()] = client
        snapshot = [f"d {i} {self.done[i][0]}\n" for i in self.order]
        snapshot += [f"r {i}\n" for w in self.workers.values() for i, _ in w.assigned]
        snapshot.append("e\n")  # end of snapshot: what follows is live
        client.wbuf += "".join(snapshot).encode()
        # Read before writing: a client that sends a command and hangs up at once must
        # still be heard (writing to it first would fail and drop it unread).
        self.sel.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, ("client", client))

    def on_client(self, client: _Client, mask: int) -> None:
        if mask & selectors.EVENT_READ:
            try:
                data = client.sock.recv(4096)
            except BlockingIOError:
                data = None
            except OSError:
                data = b""
            if data == b"":
                self.drop_client(client)
                return
            if data:
                client.rbuf += data
                *lines, client.rbuf = client.rbuf.split(b"\n")
                for line in lines:
                    self.on_command(line.decode().split())
        if mask & selectors.EVENT_WRITE and client.wbuf:
            self.flush_client(client)

    def on_command(self, words: list[str]) -> None:
        if words == ["C"]:
            self.stop("cancelled", "the batch was cancelled", kill=True)
        elif len(words) == 2 and words[0] == "c":
            index = int(words[1])
            if index in self.done:
                return
            for w in self.workers.values():
                if any(i == index for i, _ in w.assigned):
                    # Running, or queued in the worker (which cannot skip it): end the
                    # worker. Its exit settles the input, which may have just finished.
                    w.cancelled.add(index)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(w.pid, signal.SIGKILL)
                    return
            self.pending = deque((i, a) for i, a in self.pending if i != index)
            self.write_member(index, "cancelled", "cancelled", None)

    def flush_client(self, client: _Client) -> None:
        """Send what the socket takes now; watch for writability only while data waits."""
        if client.wbuf:
            try:
                sent = client.sock.send(client.wbuf)
            except BlockingIOError:
                sent = 0
            except OSError:
                self.drop_client(client)
                return
            del client.wbuf[:sent]
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if client.wbuf else 0)
        with contextlib.suppress(KeyError, ValueError):
            if self.sel.get_key(client.sock).events != events:
                self.sel.modify(client.sock, events, ("client", client))

    def drop_client(self, client: _Client) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(client.sock)
        self.clients.pop(client.sock.fileno(), None)
        client.sock.close()

    def broadcast(self) -> None:
        if not self.events:
            return
        data = "".join(self.events).encode()
        self.events.clear()
        for client in list(self.clients.values()):
            client.wbuf += data
            self.flush_client(client)

    # -- main loop -----------------------------------------------------------------

    def run(self) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(socket_address(self.url, self.group_id))
        self.listener.listen(128)
        self.listener.setblocking(False)
        self.sel.register(self.listener, selectors.EVENT_READ, ("listen", None))
        for _ in range(min(self.pool_size, len(self.pending))):
            self.spawn()
        while True:
            self.dispatch()
            self.broadcast()
            busy = any(w.assigned for w in self.workers.values())
            if not busy and (not self.pending or self.stopping):
                break
            if (
                self.pending
                and not self.stopping
                and len(self.workers) < min(self.pool_size, len(self.pending))
            ):
                self.spawn()
                continue
            for key, mask in self.sel.select():
                kind, obj = key.data
                if kind == "worker":
                    self.on_worker_data(obj)
                elif kind == "client":
                    self.on_client(obj, mask)
                else:
                    self.on_accept()
        self.broadcast()
        self.shutdown()

    def shutdown(self) -> None:
        for w in list(self.workers.values()):
            with contextlib.suppress(OSError):
                w.sock.close()
            with contextlib.suppress(ProcessLookupError):
                os.kill(w.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(w.pid, 0)
        # Give connected clients their last events before the socket closes.
        deadline = time.monotonic() + 2
        for client in list(self.clients.values()):
            client.sock.setblocking(True)
            client.sock.settimeout(max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(OSError):
                client.sock.sendall(client.wbuf)
            client.sock.close()
        self.listener.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: ``python -m runner.batch --storage file:///dir --group grp-…``."""
    args = parse_args(sys.argv[1:] if argv is None else argv, set())
    if not isinstance(args.get("storage"), str) or not isinstance(args.get("group"), str):
        raise SystemExit("usage: python -m runner.batch --storage file:///DIR --group GROUP_ID")
    storage_url, group = str(args["storage"]), str(args["group"])
    store = open_store(storage_url)
    if not isinstance(store, FileStore):
        print("kinetic batch: the local batch engine needs file:// storage", file=sys.stderr)
        return 2
    group_dir = store.root / protocol.group_prefix(group)
    lock = open(group_dir / "supervisor.lock", "a")  # noqa: SIM115 - held for our lifetime
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0  # another supervisor drives this batch
    if (store.root / protocol.group_stop_key(group)).exists():
        return 0
    # Who drives the batch now (for people and tests; liveness is the lock, not this).
    atomic_write(group_dir / "supervisor.json", protocol.dump_json({"pid": os.getpid()}))
    manifest = protocol.load_json(store.read(protocol.group_manifest_key(group)))
    sup = Supervisor(storage_url, store, manifest)
    sup.load_done()
    if not sup.pending:
        return 0
    workdir = Path(tempfile.mkdtemp(prefix="kinetic-batch-"))
    try:
        spec = manifest["spec"]
        fn_bytes = store.read(protocol.group_payload_key(group))
        if hashlib.sha256(fn_bytes).hexdigest() != spec["payload_sha256"]:
            raise PhaseError("verify", "fn.pkl is corrupted: its sha256 does not match")
        prepare_workspace(store, spec, workdir)
        sup.fn_bytes = fn_bytes
    except Exception as exc:  # noqa: BLE001 - recorded for every input, then we end
        phase = exc.phase if isinstance(exc, PhaseError) else "fetch"
        sup.stop("failed", f"{type(exc).__name__}: {exc}", kill=False, phase=phase)
        return 2
    try:
        sup.run()
    finally:
        os.chdir("/")
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
