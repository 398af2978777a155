"""The local batch engine: one detached supervisor, a pool of forked workers.

Theory of operation
-------------------
``python -m runner.batch --storage file:///… --group grp-…`` is started detached
by the local backend once a batch's inputs are durably recorded. It

1. takes an exclusive ``flock`` on the group's ``supervisor.lock`` (a second
   supervisor for the same batch exits at once, so attaching processes may
   launch one without coordination), then reads the stop record: a client that
   finds no supervisor listening records a cancellation under the same lock, so
   a supervisor starting meanwhile reads it;
2. reads the manifest, and the results already present: those inputs are done
   (this is how a batch resumes after its supervisor died — an input that was
   running then runs again: delivery is at-least-once, as the manifest says);
3. unpacks the context once, forks ``max_concurrent`` workers (each unpickles
   the function once) and grants them input indices over socket pairs: each
   worker holds a small queue (its credit, about 20 ms of work, at most
   ``_MAX_CREDIT`` inputs; one at a time for slow inputs) and is granted more
   once it reported half of it, so it never waits on the supervisor;
4. each worker runs its inputs one by one and reports them in bursts (every
   ~2 ms, or once it ran more than it still holds): it appends the burst's
   outcomes to its results log (:mod:`runner.results_log`) with one ``write``,
   then reports them with one message — each outcome durable before it is
   reported;
5. streams events, coalesced per turn of its loop (``D <state> i,i,…`` for inputs
   done, ``R i,i,…`` when dispatched), to clients connected to an abstract Unix
   socket named after the batch, and takes commands from them (``C``: cancel the
   batch, ``c i``: cancel one input — a queued input is dropped by its worker
   unstarted, a running one ends with its worker; ``p``: answered ``P`` once the
   commands before it were acted on).

A failed input that the batch's retry rule runs again (:mod:`runner.retry_rule`) is
handed back by its worker (``r``); the supervisor queues it again at once, or, with a
delay (a ``kinetic.Retries``), keeps it aside until the delay has passed: a waiting
input holds no worker, so the others run meanwhile. The wait lives in the supervisor
only: a supervisor that dies forgets it, and the batch resumes the input from its
first attempt (at-least-once, as for any input that was running).

A worker that dies mid-input fails that input (or retries it, under a plain
``retries=N``: a death is no exception that ``on`` could name), its other queued
inputs go back to the queue, and a new worker takes its place: the batch never
hangs. Which input it died in is not guessed from what it was sent: a worker
reports in bursts, so the supervisor may not yet have heard of the inputs it
finished just before dying. Each worker marks the input it starts and ends in a
word of shared memory (no system call), and on its death the supervisor reads
that word and the worker's results log: inputs with a record keep it, the input
it was running is failed (or retried), and every other input it held runs again
at the same attempt (never started, or ended with an outcome not yet appended or
reported: the death is not theirs).

``fail_fast`` stops dispatching after the first final failure (and with
``cancel_running_on_fail`` kills running workers); both record ``stop.json``,
so every input without a result is then known to be cancelled.
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import mmap
import os
import pickle
import selectors
import signal
import socket
import struct
import sys
import tempfile
import time
import traceback
from array import array
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cloudpickle

from runner import gpu_lease, peer, protocol, results_log
from runner.code_files import load_function
from runner.fs import atomic_write, make_private_dirs, try_lock
from runner.job import build_failure, build_success, parse_args, prepare_workspace
from runner.protocol import PhaseError
from runner.retry_rule import RetryRule
from runner.store import FileStore, open_store
from runner.time_limit import InputTimeLimits, TimeLimitExceeded

SUPERVISOR_LOCK = "supervisor.lock"
"""In a batch's directory: ``flock``-ed by its supervisor for its life (and by a client
that records a stop while no supervisor runs)."""


SOCKET_SECRET = "supervisor.secret"
"""In a batch's directory: a random part of its supervisor's socket name. Abstract
socket names are visible to every local user (``/proc/net/unix``) and may be bound by
any: one derived from what ``ps`` shows (the storage URL, the group id) let another user
bind it first, and block a resumed batch for as long as they held it."""


def socket_address(group_dir: Path, storage_url: str, group_id: str) -> bytes:
    """The abstract Unix socket address of a batch's supervisor, whose directory is
    ``group_dir`` (``0700``, inside a private local root): no other user can know it."""
    secret = _socket_secret(group_dir / SOCKET_SECRET)
    digest = hashlib.sha256(f"{storage_url}|{group_id}|{secret}".encode()).hexdigest()[:32]
    return b"\0kinetic-batch-" + digest.encode()


def _socket_secret(path: Path) -> str:
    """The batch's socket secret, made by whichever of the supervisor and its clients
    asks first (all or nothing: a reader never sees it half written).

    :raises FileNotFoundError: when the batch's directory is gone (it is not made again).
    """
    try:
        return path.read_text()
    except FileNotFoundError:
        pass
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(os.urandom(16).hex())
    try:
        os.link(tmp, path)  # fails if another made it first: then theirs holds
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    return path.read_text()


_MAX_COMMAND = 1024
"""The longest command line a client may send (they are a few bytes): more, unended,
and it is dropped, rather than growing the supervisor's buffer without bound."""

# Each worker's shared word: the input (index, attempt) it started last, and whether it
# is still running it. Written by the worker only, read by the supervisor once it died.
_SLOT = struct.Struct("=qqq")
# How often a GPU batch short of GPUs looks whether other jobs freed some (seconds).
_GPU_RETRY = 0.2


def _mark(slot: mmap.mmap, index: int, attempt: int, running: bool) -> None:
    _SLOT.pack_into(slot, 0, index, attempt, int(running))


# ----------------------------------------------------------------------------- worker

# Exact types whose values the plain pickler writes as cloudpickle would (no code, no
# classes by value): their results skip cloudpickle's slower pickler.
_PLAIN = frozenset({int, float, complex, str, bytes, bool, type(None)})
_PLAIN_ITEMS = 64
_BURST = 0.002  # a worker reports at least this often (seconds of work)
_POLL = 0.0005  # and looks for the supervisor's messages at least this often


def _plain(value: Any) -> bool:
    kind = type(value)
    if kind in _PLAIN:
        return True
    if (kind is tuple or kind is list) and len(value) <= _PLAIN_ITEMS:
        return all(type(v) in _PLAIN for v in value)
    return False


def _success(value: Any) -> tuple[bytes, protocol.FinalRecord]:
    """As :func:`build_success`, faster for plain values: the plain pickler, and only
    the keys a success has (readers take the others, all None, as absent) — half the
    bytes, a third of the time to load."""
    if _plain(value):
        payload = {"format": protocol.FORMAT, "success": True, "result": value}
        return pickle.dumps(payload, protocol=cloudpickle.DEFAULT_PROTOCOL), _SUCCEEDED
    return build_success(value)


_SUCCEEDED: protocol.FinalRecord = {
    "state": "succeeded",
    "phase": None,
    "error": None,
    "error_type": None,
}


class _Inputs:
    """Input chunks, loaded on first use and kept while in use (a worker runs many of
    the same chunk; inputs are granted in order, so a chunk two behind is dropped)."""

    def __init__(self, store: FileStore, group_id: str, chunk_size: int) -> None:
        self.store, self.group_id, self.chunk_size = store, group_id, chunk_size
        self.chunks: dict[int, list[tuple[tuple[Any, ...], dict[str, Any]]]] = {}

    def get(self, index: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        chunk, offset = divmod(index, self.chunk_size)
        items = self.chunks.get(chunk)
        if items is None:
            data = self.store.read(protocol.group_inputs_key(self.group_id, chunk))
            items = self.chunks[chunk] = cloudpickle.loads(data)
            self.chunks.pop(chunk - 2, None)  # inputs run in order: old chunks are done
        return items[offset]


class _Reports:
    """A worker's outcomes not yet reported: records to append, then tokens to send.

    :meth:`flush` appends every record with one ``write`` before it sends the tokens:
    an outcome is durable before the supervisor hears of it.
    """

    def __init__(self, sock: socket.socket, results_fd: int) -> None:
        self.sock, self.results_fd = sock, results_fd
        self.records: list[bytes] = []
        self.tokens: list[str] = []
        self.timed = 0  # inputs run since ``at`` (the last flush, or the end of a wait)
        self.at = time.monotonic()

    def flush(self) -> None:
        if self.records:
            results_log.append_encoded(self.results_fd, b"".join(self.records))
            self.records.clear()
        now = time.monotonic()
        if self.tokens:
            # The burst's time, loop overhead included: what the supervisor sizes credit by.
            elapsed_us = int((now - self.at) * 1e6) if self.timed else 0
            line = f"b {self.timed} {elapsed_us} {' '.join(self.tokens)}\n"
            self.sock.sendall(line.encode())
            self.tokens.clear()
        self.timed = 0
        self.at = now


def _worker_main(
    sock: socket.socket,
    slot: mmap.mmap,
    store: FileStore,
    manifest: protocol.BatchManifest,
    fn_bytes: bytes,
    log: Path,
) -> None:
    group_id = manifest["group_id"]
    rule = RetryRule.of_batch(manifest["options"])
    retrying = rule.count > 0  # (then the input sees its attempt in KINETIC_ATTEMPT)
    reports = _Reports(sock, results_log.open_log(log))
    out_base = manifest["spec"]["output_dir"]
    inputs = _Inputs(store, group_id, manifest["chunk_size"])
    has_data = bool(manifest["spec"].get("has_data"))
    limit_s = manifest["spec"].get("timeout")
    limits = None if limit_s is None else InputTimeLimits(float(limit_s))
    data_workdir = Path(os.getcwd()).parent  # the supervisor's workdir (cwd is its workspace)
    if has_data:
        from runner.data import resolve_arguments
    try:
        fn = load_function(fn_bytes)
    except BaseException as exc:  # noqa: BLE001 - reported to the supervisor, then we end
        sock.sendall(
            f"F deserialize {type(exc).__name__}: {exc}".replace("\n", " ").encode() + b"\n"
        )
        return
    heads: dict[int, bytes] = {}  # attempt -> the header of a success (the common record)
    queue: deque[tuple[int, int]] = deque()  # (index, attempt) granted, in run order
    buf = b""
    out = sys.stdout
    sock.setblocking(True)
    polled = 0.0
    # (Names bound once: the loop below runs per input, a few µs each for trivial ones.)
    environ, mark, encode, marker = (
        os.environ,
        _SLOT.pack_into,
        results_log.encode_raw,
        protocol.INPUT_MARKER,
    )
    records, tokens = reports.records, reports.tokens
    while True:
        now = time.monotonic()
        # Report in bursts: every ~2 ms of work, once more inputs were run than are left
        # (so the supervisor grants more before this queue runs dry), and always before
        # waiting for more.
        if reports.tokens and (
            not queue or len(reports.tokens) > len(queue) or now - reports.at > _BURST
        ):
            reports.flush()
        # Take what the supervisor sent: waiting only when there is nothing to do, and
        # otherwise looking at most every _POLL seconds (not a system call per input).
        if queue and now - polled < _POLL:
            data = None
        else:
            polled = now
            try:
                data = sock.recv(65536, 0 if not queue else socket.MSG_DONTWAIT)
            except BlockingIOError:
                data = None
            if not queue:
                reports.at = time.monotonic()  # the wait is not work
        if data == b"":
            return  # the supervisor is gone
        if data:
            buf += data
            *lines, buf = buf.split(b"\n")
            for line in lines:
                if line == b"X":  # stop: hand back what has not started
                    reports.tokens.extend(f"u{i}" for i, _ in queue)
                    queue.clear()
                    reports.flush()
                elif line.startswith(b"k "):  # cancel one input, if it has not started
                    index = int(line[2:])
                    kept = [item for item in queue if item[0] != index]
                    if len(kept) != len(queue):
                        queue = deque(kept)
                        reports.tokens.append(f"x{index}")
                elif line.startswith(b"q "):  # more inputs: "i" (first attempt) or "i:a"
                    for token in line[2:].split():
                        i_s, _, a_s = token.partition(b":")
                        queue.append((int(i_s), int(a_s) if a_s else 0))
        if not queue:
            continue
        index, attempt = queue.popleft()
        job_id = protocol.member_job_id(group_id, index)
        environ["KINETIC_OUTPUT_DIR"] = f"{out_base}/{job_id}"
        environ["JOB_ID"] = job_id
        if retrying:
            environ["KINETIC_ATTEMPT"] = str(attempt)
        mark(slot, 0, index, attempt, 1)
        out.write(f"{marker} {index}\n")
        outcome: tuple[bytes, protocol.FinalRecord] | None = None
        try:
            args, kwargs = inputs.get(index)
            if has_data:
                args, kwargs = resolve_arguments(store, args, kwargs, data_workdir)
            # KINETIC_OUTPUT_DIR is not created per input: a mkdir costs more than a
            # trivial input (~80 us here). Inputs that write outputs create it.
            if limits is None:
                value = fn(*args, **kwargs)
            else:
                limits.start()
                try:
                    value = fn(*args, **kwargs)
                finally:
                    limits.stop()
                if limits.reached:  # it caught the limit's exception and returned
                    raise limits.error()
        except BaseException as exc:  # noqa: BLE001 - SystemExit included: record, go on
            traceback.print_exc()
            if limits is not None and limits.reached:  # a run-time limit: never retried
                limits.stop()  # (when it was reached inside the first stop)
                timed_out = exc if isinstance(exc, TimeLimitExceeded) else limits.error()
                outcome = build_failure("execute", timed_out, user=False)
            elif not retrying or rule.delay_after(attempt, exc) is None:
                outcome = build_failure("execute", exc, user=True)
        else:
            outcome = _success(value)
        try:  # noqa: SIM105 - per input: a context manager costs more than this flush
            out.flush()
        except (OSError, ValueError):
            pass
        reports.timed += 1
        if outcome is None:  # failed, and a retry will follow
            mark(slot, 0, index, attempt, 0)
            tokens.append(f"r{index}")
            continue
        payload, record = outcome
        if record["state"] == "succeeded":
            head = heads.get(attempt)
            if head is None:
                head = heads[attempt] = protocol.dump_json(protocol.outcome_header(attempt, record))
        else:
            head = protocol.dump_json(protocol.outcome_header(attempt, record))
        # Appended with the burst, before the burst is reported (durable before reported).
        records.append(encode(index, head, payload))
        mark(slot, 0, index, attempt, 0)
        tokens.append(("s" if record["state"] == "succeeded" else "f") + str(index))


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


_MAX_CREDIT = 1024  # inputs a worker may hold at most
_START_FAILURES = 3  # workers in a row dying before their first input stop the batch
_S, _F, _R, _X = b"s"[0], b"f"[0], b"r"[0], b"x"[0]


def _events(done: list[tuple[int, int]], running: Sequence[int] = ()) -> bytes:
    """Client events, coalesced: ``D <s|f|c> i,i,...`` per run of inputs done in one
    state (completion order kept), then ``R i,i,...`` for the inputs dispatched."""
    out: list[str] = []
    start = 0
    while start < len(done):
        letter = done[start][1]
        end = start + 1
        while end < len(done) and done[end][1] == letter:
            end += 1
        out.append(f"D {chr(letter)} {','.join([str(i) for i, _ in done[start:end]])}\n")
        start = end
    if running:
        out.append(f"R {','.join(map(str, running))}\n")
    return "".join(out).encode()


class Supervisor:
    """Runs the inputs of one batch on a pool of forked workers."""

    def __init__(
        self, storage_url: str, store: FileStore, manifest: protocol.BatchManifest
    ) -> None:
        self.url, self.store, self.manifest = storage_url, store, manifest
        self.group_id: str = manifest["group_id"]
        self.total: int = manifest["total"]
        opts = manifest["options"]
        self.rule = RetryRule.of_batch(opts)
        self.fail_fast: bool = opts["fail_fast"]
        self.cancel_running_on_fail: bool = opts["cancel_running_on_fail"]
        self.pool_size: int = max(1, opts["max_concurrent"])
        self.results_dir = store.root / protocol.group_results_prefix(self.group_id)
        # Per input, compactly (a million inputs fit in a few MB): its final state's
        # letter (s/f/c, 0 while it has none), and the inputs done in completion order.
        self.done = bytearray(self.total)
        self.order = array("q")
        # Inputs to run, in order; the attempt of those queued again after a failure.
        self.pending: deque[int] = deque()
        self.attempts: dict[int, int] = {}
        # Inputs waiting out their retry's delay: (when, on the monotonic clock, index,
        # attempt), soonest first. They hold no worker: the others run meanwhile.
        self.delayed: list[tuple[float, int, int]] = []
        self.cancelling: set[int] = set()  # inputs a worker was asked to drop unstarted
        self.workers: dict[int, _Worker] = {}
        self.clients: dict[int, _Client] = {}
        self.gate = peer.Gate(f"batch supervisor of {self.group_id}")
        self.stopping = False
        self.sel = selectors.DefaultSelector()
        # Events not yet sent to clients: inputs done (index, state letter), dispatched.
        self.ev_done: list[tuple[int, int]] = []
        self.ev_running: list[int] = []
        self.mean_s = 0.0
        self.start_failures = 0  # workers in a row that died before starting an input
        self.next_worker = 0
        self.fn_bytes = b""
        # A GPU batch of the local backend: each worker holds its own GPUs for its whole
        # life (a lease taken before its fork), so at most machine's GPUs / GPUs per input
        # inputs run at once, and fewer while other jobs hold some.
        self.gpus = gpu_lease.GpuRequest.from_env(os.environ)
        os.environ.pop(gpu_lease.REQUEST_ENV, None)
        if self.gpus is not None:
            self.pool_size = min(self.pool_size, self.gpus.max_holders)
        self.gpu_retry_at = 0.0
        self.gpu_waiting = False

    # -- state ---------------------------------------------------------------------

    def load_done(self) -> None:
        """Learn the inputs already done from the results logs. Writes nothing: a
        supervisor with nothing left to run leaves the batch's files as they are."""
        for path in results_log.iter_logs(self.results_dir):
            with open(path, "rb") as f:
                found, _ = results_log.scan(f.read())
            for index, head, _, _ in found:
                if index < self.total and not self.done[index]:
                    self.done[index] = ord(results_log.header(head)["state"][0])
                    self.order.append(index)
        done = self.done
        self.pending = deque(i for i in range(self.total) if not done[i])

    def open_own_log(self) -> None:
        """The results directory, and this supervisor's log of the outcomes it records
        itself (inputs whose worker died on them), before any worker starts."""
        make_private_dirs(self.results_dir)
        self.own_log = results_log.open_log(self.results_dir / f"supervisor-{os.getpid()}.log")

    def mark_done(self, index: int, state: protocol.InputState) -> None:
        if self.done[index]:
            return
        letter = ord(state[0])
        self.done[index] = letter
        self.order.append(index)
        self.cancelling.discard(index)
        self.ev_done.append((index, letter))
        if state == "failed" and self.fail_fast and not self.stopping:
            self.stop("fail_fast", f"input {index} failed", kill=self.cancel_running_on_fail)

    def write_member(
        self, index: int, state: protocol.InputState, error: str, phase: str | None
    ) -> None:
        header = protocol.ended_header(state, 0, error, phase)
        payload = cloudpickle.dumps(
            protocol.result_payload(success=False, phase=phase, error=error, error_type="")
        )
        results_log.append(self.own_log, index, header, payload)
        self.mark_done(index, state)

    def stop(
        self, reason: protocol.StopReason, detail: str, *, kill: bool, phase: str | None = None
    ) -> None:
        """Stop launching inputs; record why. With ``kill``, end running workers too."""
        self.stopping = True
        record = protocol.stop_record(reason, detail, phase)
        atomic_write(
            self.store.root / protocol.group_stop_key(self.group_id), protocol.dump_json(record)
        )
        self.pending.clear()
        self.attempts.clear()
        self.delayed.clear()
        for w in list(self.workers.values()):
            if kill:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(w.pid, signal.SIGKILL)
            else:
                with contextlib.suppress(OSError):
                    w.sock.sendall(b"X\n")

    def requeue(self, items: list[tuple[int, int]]) -> None:
        """Put inputs back at the front of the queue, in order, with their attempts."""
        for index, attempt in items:
            if attempt:
                self.attempts[index] = attempt
        self.pending.extendleft(reversed([i for i, _ in items]))

    def retry(self, index: int, attempt: int) -> None:
        """Run ``index`` again as attempt ``attempt`` once its rule's delay has passed:
        at once without one, else after it (:meth:`release_delayed`)."""
        delay = self.rule.delay(attempt)
        if delay <= 0:
            self.requeue([(index, attempt)])
        else:
            heapq.heappush(self.delayed, (time.monotonic() + delay, index, attempt))

    def release_delayed(self) -> float | None:
        """Queue the inputs whose retry delay has passed (first in line); the seconds
        until the next one's does, or None when none waits."""
        now = time.monotonic()
        due: list[tuple[int, int]] = []
        while self.delayed and self.delayed[0][0] <= now:
            _, index, attempt = heapq.heappop(self.delayed)
            if not self.done[index]:
                due.append((index, attempt))
        if due and not self.stopping:
            self.requeue(due)
        return self.delayed[0][0] - now if self.delayed else None

    # -- workers -------------------------------------------------------------------

    def lease_gpus(self) -> gpu_lease.GpuLease | bool:
        """The GPUs of a new worker; True when it needs none, False when none are free now."""
        if self.gpus is None:
            return True
        now = time.monotonic()
        lease = None if now < self.gpu_retry_at else gpu_lease.try_acquire(self.gpus)
        if lease is None:
            self.gpu_retry_at = max(self.gpu_retry_at, now + _GPU_RETRY)
        # Status reports say "waiting for GPUs" while nothing of the batch can run.
        waiting = lease is None and not self.workers
        if waiting != self.gpu_waiting:
            self.gpu_waiting = waiting
            marker = self.store.root / gpu_lease.group_wait_key(self.group_id)
            if waiting:
                atomic_write(marker, b"{}")
            else:
                with contextlib.suppress(FileNotFoundError):
                    marker.unlink()
        return False if lease is None else lease

    def spawn(self) -> bool:
        """Start a worker; False (nothing started) when the GPUs it needs are taken."""
        lease = self.lease_gpus()
        if lease is False:
            return False
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
                if isinstance(lease, gpu_lease.GpuLease):
                    os.environ.update(gpu_lease.visible_devices(lease.ids))
                _worker_main(child, slot, self.store, self.manifest, self.fn_bytes, results)
            except BaseException:  # noqa: BLE001 - never return into the supervisor's code
                traceback.print_exc()
                code = 1
            finally:
                with contextlib.suppress(Exception):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(code)
        if isinstance(lease, gpu_lease.GpuLease):
            lease.close()  # the worker alone holds its GPUs now: freed when it dies
        child.close()
        parent.setblocking(False)
        worker = _Worker(n, pid, parent, slot, results)
        self.workers[parent.fileno()] = worker
        self.sel.register(parent, selectors.EVENT_READ, ("worker", worker))
        return True

    def limit(self) -> int:
        """How many inputs a worker may hold (its credit): ~20 ms of work, at least 1.

        A worker reports once it ran half of what it holds, so more arrives before it
        runs dry; inputs longer than 20 ms are granted one at a time (nothing waits
        behind a slow input while another worker idles).
        """
        if self.mean_s <= 0:
            return 1
        return max(1, min(_MAX_CREDIT, int(0.02 / self.mean_s)))

    def dispatch(self) -> None:
        if self.stopping:
            return
        limit = self.limit()
        done, attempts, pending = self.done, self.attempts, self.pending
        for w in self.workers.values():
            if not pending:
                return
            room = limit - len(w.assigned)
            if w.gone or room <= 0 or (limit > 1 and len(w.assigned) > limit // 2):
                continue
            batch: list[tuple[int, int]] = []
            while pending and len(batch) < room:
                index = pending.popleft()
                if not done[index]:
                    batch.append((index, attempts.pop(index, 0)))
            if not batch:
                continue
            w.assigned.extend(batch)
            msg = "q " + " ".join(f"{i}:{a}" if a else str(i) for i, a in batch) + "\n"
            w.sock.setblocking(True)
            try:
                w.sock.sendall(msg.encode())
            except OSError:
                # It died since its last report: its exit (the EOF, read next) queues
                # this batch again, as never started.
                w.gone = True
                continue
            finally:
                w.sock.setblocking(False)
            self.ev_running.extend(i for i, _ in batch)

    def on_worker_data(self, w: _Worker) -> None:
        try:
            data = w.sock.recv(1 << 18)
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
            if raw.startswith(b"F "):  # the function cannot be loaded: nothing can run
                parts = raw.decode().split(" ", 2)
                self.stop("failed", parts[2] if len(parts) > 2 else "", kill=True, phase=parts[1])
                continue
            # A burst: "b <inputs run> <their µs> <token>..." with a token per input
            # that left the worker: s/f (recorded), r (to retry), u/x (handed back
            # unstarted after a stop / a cancel).
            words = raw.split()
            timed, elapsed_us = int(words[1]), int(words[2])
            if timed:
                elapsed = elapsed_us / timed / 1e6
                self.mean_s = elapsed if self.mean_s == 0 else 0.7 * self.mean_s + 0.3 * elapsed
            for token in words[3:]:
                kind, index = token[0], int(token[1:])
                attempt = self._unassign(w, index)
                if kind == _S:
                    self.mark_done(index, "succeeded")
                elif kind == _F:
                    self.mark_done(index, "failed")
                elif kind == _R:
                    if index in self.cancelling:
                        self.write_member(index, "cancelled", "cancelled", None)
                    elif not self.stopping:
                        self.retry(index, attempt + 1)
                elif kind == _X:
                    self.write_member(index, "cancelled", "cancelled", None)
                # _U: handed back after a stop, which already accounts for it

    def _unassign(self, w: _Worker, index: int) -> int:
        assigned = w.assigned
        if assigned and assigned[0][0] == index:  # the common case: reports come in order
            return assigned.popleft()[1]
        for pos, (i, attempt) in enumerate(assigned):
            if i == index:
                del assigned[pos]
                return attempt
        return 0

    def on_worker_exit(self, w: _Worker) -> None:
        """Settle what a dead worker held, from what it left behind, not from guesses.

        Its socket is drained (EOF comes after every report it sent), but reports it
        had not sent yet are lost: the inputs it held are judged by its results log (an
        input with a record is done, whatever killed the worker after) and by its
        shared word (the input it last started, and whether that one had ended). Only
        the input it was running is charged with its death; the others run again as
        they were (never started, or ended with an outcome the worker had not yet
        appended or reported).
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
        if last_index < 0 and held and not (self.stopping or w.cancelled):
            # It died before it started anything (its log cannot be opened: the batch's
            # records were deleted, say): workers replacing it would die the same way.
            self.start_failures += 1
            if self.start_failures >= _START_FAILURES:
                detail = f"the worker processes {how} before running any input"
                self.stop("failed", detail, kill=False, phase="execute")
                return
        elif last_index >= 0:
            self.start_failures = 0
        if not held:
            return
        recorded: dict[int, protocol.InputState] = {}
        held_indices = {i for i, _ in held}
        with contextlib.suppress(FileNotFoundError), open(w.results, "rb") as f:
            for index, head, _, _ in results_log.scan(f.read())[0]:
                if index in held_indices and index not in recorded:
                    recorded[index] = results_log.header(head)["state"]
        # Inputs up to the last one started ran (in order); those after it never started.
        started = next(
            (pos + 1 for pos, item in enumerate(held) if item == (last_index, last_attempt)), 0
        )
        requeue: list[tuple[int, int]] = []
        retried: list[tuple[int, int]] = []
        for pos, (index, attempt) in enumerate(held):
            if index in recorded:
                self.mark_done(index, recorded[index])
            elif self.stopping:
                continue  # it will never run: the stop record says so
            elif index in w.cancelled or index in self.cancelling:
                self.write_member(index, "cancelled", "cancelled", None)
            elif pos < started - 1 or not last_running or pos >= started:
                requeue.append((index, attempt))  # not what it died in: run it again
            elif w.cancelled:
                requeue.append((index, attempt))  # killed to cancel another: run it again
            elif self.rule.delay_after(attempt, None) is not None:  # a plain count only
                retried.append((index, attempt + 1))
            else:
                self.write_member(
                    index,
                    "failed",
                    f"the worker process {how} while running input {index}",
                    "execute",
                )
        if not self.stopping:  # (a failure settled above may have stopped the batch)
            self.requeue(requeue)
            for index, attempt in retried:
                self.retry(index, attempt)

    # -- clients -------------------------------------------------------------------

    def on_accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except BlockingIOError:
            return
        if not self.gate.admit(sock):  # another user's: closed unread (and logged)
            sock.close()
            return
        sock.setblocking(False)
        client = _Client(sock)
        self.clients[sock.fileno()] = client
        done = self.done
        snapshot = _events([(i, done[i]) for i in self.order])
        snapshot += _events([], [i for w in self.workers.values() for i, _ in w.assigned])
        snapshot += b"e\n"  # end of snapshot: what follows is live
        client.wbuf += snapshot
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
                if len(client.rbuf) > _MAX_COMMAND:  # a line that never ends: not a client
                    self.drop_client(client)
                    return
                for line in lines:
                    try:
                        self.on_command(line.decode().split(), client)
                    except ValueError:  # not UTF-8, or not a number: ignored, logged
                        print(
                            f"kinetic batch: ignored a malformed command {line[:80]!r}",
                            file=sys.stderr,
                            flush=True,
                        )
        if mask & selectors.EVENT_WRITE and client.wbuf:
            self.flush_client(client)

    def on_command(self, words: list[str], client: _Client) -> None:
        if words == ["p"]:  # "the commands before this one were acted on?": yes
            client.wbuf += b"P\n"
        elif words == ["C"]:
            self.stop("cancelled", "the batch was cancelled", kill=True)
        elif len(words) == 2 and words[0] == "c":
            index = int(words[1])
            if not 0 <= index < self.total or self.done[index]:
                return
            for w in self.workers.values():
                if any(i == index for i, _ in w.assigned):
                    running_index, _, running = _SLOT.unpack_from(w.slot)
                    if running and running_index == index:
                        # Running: end the worker. Its exit settles the input, which may
                        # have just finished (then its outcome stands).
                        w.cancelled.add(index)
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(w.pid, signal.SIGKILL)
                        return
                    # Queued in the worker (or just ended): it drops the input if it has
                    # not started it ("x"), else its outcome, already on its way, stands.
                    self.cancelling.add(index)
                    with contextlib.suppress(OSError):
                        w.sock.setblocking(True)
                        w.sock.sendall(f"k {index}\n".encode())
                    with contextlib.suppress(OSError):
                        w.sock.setblocking(False)
                    return
            self.pending = deque(i for i in self.pending if i != index)
            self.attempts.pop(index, None)
            if any(i == index for _, i, _ in self.delayed):
                self.delayed = [item for item in self.delayed if item[1] != index]
                heapq.heapify(self.delayed)
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
        """Send the events gathered since the last call to every client, coalesced."""
        if not self.ev_done and not self.ev_running:
            return
        data = _events(self.ev_done, self.ev_running)
        self.ev_done.clear()
        self.ev_running.clear()
        for client in list(self.clients.values()):
            client.wbuf += data
            self.flush_client(client)

    # -- main loop -----------------------------------------------------------------

    def run(self) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        group_dir = self.store.root / protocol.group_prefix(self.group_id).rstrip("/")
        self.listener.bind(socket_address(group_dir, self.url, self.group_id))
        self.listener.listen(128)
        self.listener.setblocking(False)
        self.sel.register(self.listener, selectors.EVENT_READ, ("listen", None))
        with contextlib.suppress(FileNotFoundError):  # left by a supervisor that died waiting
            (self.store.root / gpu_lease.group_wait_key(self.group_id)).unlink()
        for _ in range(min(self.pool_size, len(self.pending))):
            if not self.spawn():
                break
        while True:
            timeout = self.release_delayed()
            self.dispatch()
            self.broadcast()
            busy = any(w.assigned for w in self.workers.values())
            if not busy and timeout is None and (not self.pending or self.stopping):
                break
            if (
                self.pending
                and not self.stopping
                and len(self.workers) < min(self.pool_size, len(self.pending))
            ):
                if self.spawn():
                    continue
                # Its GPUs are taken (by other jobs): look again soon.
                gpus_in = max(0.0, self.gpu_retry_at - time.monotonic())
                timeout = gpus_in if timeout is None else min(timeout, gpus_in)
            for key, mask in self.sel.select(timeout):
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
    # Held for the process's life. A client that finds no supervisor listening records
    # a stop under this lock: the stop record is read after taking it, never before.
    if try_lock(group_dir / SUPERVISOR_LOCK) is None:
        return 0  # another supervisor drives this batch, or a client records a stop
    if (store.root / protocol.group_stop_key(group)).exists():
        return 0
    if (store.root / protocol.group_summary_key(group)).exists():
        return 0  # cleaned up: its inputs and results are gone, there is nothing to resume
    # Who drives the batch now (for people and tests; liveness is the lock, not this).
    atomic_write(group_dir / "supervisor.json", protocol.dump_json({"pid": os.getpid()}))
    manifest = protocol.load_manifest(store.read(protocol.group_manifest_key(group)))
    sup = Supervisor(storage_url, store, manifest)
    sup.load_done()
    if not sup.pending:
        return 0
    sup.open_own_log()
    # Under the batch's own directory, not the system's temp dir: a supervisor killed
    # before its `finally` leaves nothing behind that the batch's cleanup does not remove.
    workdir = Path(tempfile.mkdtemp(prefix="work-", dir=group_dir))
    try:
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
        sup.run()
    finally:
        os.chdir("/")
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
