"""A worker of a GKE batch pool: ``python -m runner.pool --storage gs://BUCKET --group GID``.

Theory of operation
-------------------
Every pod of a pool batch's Kubernetes Job runs one worker. A worker

1. reads the manifest and the function (``fn.pkl``, its SHA-256 checked) and prepares
   the workspace (the context) once. A failure there is no input's fault and would
   repeat in every worker: it stops the batch (``stop.json``, reason ``failed``, the
   phase) and the worker exits 0;
2. steps through :func:`runner.pool_book.worker_step` over what it knows of the batch
   (a listing of claims and outcomes at start, again when it runs out of free inputs or
   loses a race): to run an input it creates the input's claim object with a
   create-if-absent precondition — of racing workers exactly one wins, the others
   learn the claim and move on (to another chunk: workers spread over the chunks);
3. runs each input in a fresh process forked from itself (the function is unpickled
   once per worker, each input runs in its own copy: a crash, a leak or global state
   of one input never reaches another). Meanwhile it renews the claim's lease every
   third of it, ends the input if the batch was stopped with running inputs to end
   (cancel, ``cancel_running_on_fail``) or if the input was cancelled alone (someone
   else wrote its outcome);
4. retries a failed attempt in a new process while ``retries`` allow, then writes the
   outcome (create-if-absent: the first outcome of an input stands); after a final
   failure with ``fail_fast`` it writes ``stop.json``;
5. exits 0 once every input has an outcome or the batch stopped. The Job has no
   ``completions`` (Kubernetes' work-queue semantics): it completes once a worker
   exited 0 and all have ended. A worker that dies is replaced by the Job controller;
   the input it held is taken over when its lease expires.

Storage writes per input: the claim and the outcome (plus one lease renewal per third
of the lease for long inputs). Each input's output goes to the pod's log between
input markers, and its tail into the outcome's header (``output``), so it outlives
the pod at no extra write. Kubernetes is never called from here.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import select
import signal
import socket
import sys
import tempfile
import time
import traceback
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cloudpickle

from runner import protocol
from runner.code_files import load_function
from runner.job import build_failure, build_success, parse_args, prepare_workspace
from runner.pool_book import (
    Claim,
    Exit,
    GiveUp,
    PoolBook,
    PoolOptions,
    Run,
    Wait,
    claim_record,
    parse_claim,
    stop_kills,
    worker_step,
)
from runner.protocol import PhaseError
from runner.scratch import scratch_dir
from runner.store import RunnerStore, open_store

STOP_EVERY = 1.0
"""Seconds between two reads of the stop record (between inputs, and during an input
whose end a stop would force)."""
REFRESH_AFTER_RACE = 0.5
"""A lost race re-lists the batch's claims if the last listing is older than this."""
OUTPUT_TAIL = 64 * 1024
"""Bytes of an input's output kept in its outcome's header."""
CHUNKS_KEPT = 4


class _Chunks:
    """Input chunks, read on first use; the last few kept (a worker stays in a chunk)."""

    def __init__(self, store: RunnerStore, group_id: str, chunk_size: int) -> None:
        self.store, self.group_id, self.chunk_size = store, group_id, chunk_size
        self.cache: OrderedDict[int, list[tuple[tuple[Any, ...], dict[str, Any]]]] = OrderedDict()

    def get(self, index: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        chunk, offset = divmod(index, self.chunk_size)
        items = self.cache.get(chunk)
        if items is None:
            data = self.store.read(protocol.group_inputs_key(self.group_id, chunk))
            items = self.cache[chunk] = cloudpickle.loads(data)
            while len(self.cache) > CHUNKS_KEPT:
                self.cache.popitem(last=False)
        self.cache.move_to_end(chunk)
        return items[offset]


class Worker:
    """One worker of a pool batch (see the module docstring)."""

    def __init__(self, store: RunnerStore, group_id: str, name: str, workdir: Path) -> None:
        self.store, self.group_id, self.name, self.workdir = store, group_id, name, workdir
        self._manifest: protocol.BatchManifest | None = None
        self.book: PoolBook | None = None
        self.fn: Any = None
        self.stop_checked = 0.0
        self.listed = 0.0

    # -- storage views -------------------------------------------------------------------

    @property
    def manifest(self) -> protocol.BatchManifest:
        assert self._manifest is not None
        return self._manifest

    @property
    def options(self) -> PoolOptions:
        assert self.book is not None
        return self.book.options

    def refresh(self) -> None:
        """List outcomes and claims; read the claims the book does not know yet."""
        book = self.book
        assert book is not None
        results = protocol.group_results_prefix(self.group_id)
        for key in self.store.list(results):
            index = protocol.parse_outcome_name(key.removeprefix(results))
            if index is not None:
                book.learn_outcome(index, "?")  # done is all a worker needs to know
        prefix = protocol.group_claims_prefix(self.group_id)
        latest: dict[int, int] = {}
        for key in self.store.list(prefix):
            parsed = protocol.parse_claim_name(key.removeprefix(prefix))
            if parsed is not None and parsed[0] not in book.outcomes:
                latest[parsed[0]] = max(parsed[1], latest.get(parsed[0], -1))
        for index, number in latest.items():
            known = book.claims.get(index)
            if known is None or known.number < number:
                book.learn_claim(self.read_claim(index, number))
        self.listed = time.monotonic()

    def read_claim(self, index: int, number: int) -> Claim:
        try:
            data = self.store.read(protocol.group_claim_key(self.group_id, index, number))
        except FileNotFoundError:
            return Claim(index, number, "?", 0.0)
        return parse_claim(index, number, data)

    def check_stop(self, *, force: bool = False) -> protocol.StopRecord | None:
        """The stop record (read at most every :data:`STOP_EVERY` seconds)."""
        book = self.book
        assert book is not None
        if book.stop is None and (force or time.monotonic() - self.stop_checked >= STOP_EVERY):
            self.stop_checked = time.monotonic()
            with contextlib.suppress(FileNotFoundError, ValueError):
                book.learn_stop(protocol.load_stop(self.store.read(self.stop_key)))
        return book.stop

    @property
    def stop_key(self) -> str:
        return protocol.group_stop_key(self.group_id)

    def write_stop(self, reason: protocol.StopReason, detail: str, phase: str | None) -> None:
        record = protocol.stop_record(reason, detail, phase)
        self.store.create_if_absent(self.stop_key, protocol.dump_json(record))
        self.check_stop(force=True)

    # -- the loop ------------------------------------------------------------------------

    def run(self) -> int:
        """Take and run inputs until none is left; the process exit status."""
        self._manifest = protocol.load_manifest(
            self.store.read(protocol.group_manifest_key(self.group_id))
        )
        options = PoolOptions.from_manifest(self.manifest)
        self.book = book = PoolBook(options)
        if self.check_stop(force=True) is not None:
            return protocol.EXIT_OK
        try:
            self.setup()
        except BaseException as exc:  # noqa: BLE001 - every input would fail the same way
            phase = exc.phase if isinstance(exc, PhaseError) else "fetch"
            print(f"kinetic pool: cannot set up the batch ({phase}): {exc}", flush=True)
            self.write_stop("failed", f"{type(exc).__name__}: {exc}", phase)
            return protocol.EXIT_OK
        self.chunks = _Chunks(self.store, self.group_id, options.chunk_size)
        self.refresh()
        chunk: int | None = None
        fresh = True
        while True:
            self.check_stop()
            action = worker_step(book, wall=time.time(), chunk=chunk, pick=random.random())
            if isinstance(action, Exit):
                print(f"kinetic pool: worker {self.name} exits ({action.reason})", flush=True)
                return protocol.EXIT_OK
            if isinstance(action, Wait):
                if not fresh:
                    fresh = True
                else:
                    time.sleep(max(0.05, action.seconds))
                self.refresh()
                continue
            fresh = False
            if action.number > 0:
                # Before taking over: the holder may have renewed since we read its claim.
                current = self.read_claim(action.index, action.number - 1)
                if current.expires > time.time():
                    book.learn_claim(current)
                    continue
            expires = time.time() + options.lease_s
            key = protocol.group_claim_key(self.group_id, action.index, action.number)
            if not self.store.create_if_absent(key, claim_record(self.name, expires)):
                book.learn_claim(Claim(action.index, action.number, "?", expires))
                chunk = None  # another worker is in this chunk: move elsewhere
                if time.monotonic() - self.listed >= REFRESH_AFTER_RACE:
                    self.refresh()
                continue
            book.learn_claim(Claim(action.index, action.number, self.name, expires))
            chunk = action.index // options.chunk_size
            if isinstance(action, GiveUp):
                self.record_failure(action.index, action.number, action.reason, "execute")
            else:
                assert isinstance(action, Run)
                self.run_input(action.index, action.number, expires)

    def setup(self) -> None:
        """Fetch and verify the function, prepare the workspace, unpickle the function."""
        spec = self.manifest["spec"]
        fn_bytes = self.store.read(protocol.group_payload_key(self.group_id))
        if hashlib.sha256(fn_bytes).hexdigest() != spec["payload_sha256"]:
            raise PhaseError("verify", "fn.pkl is corrupted: its sha256 does not match")
        prepare_workspace(self.store, spec, self.workdir)
        try:
            self.fn = load_function(fn_bytes)
        except BaseException as exc:
            raise PhaseError("deserialize", f"{type(exc).__name__}: {exc}") from exc

    # -- one input -----------------------------------------------------------------------

    def run_input(self, index: int, number: int, expires: float) -> None:
        """Run input ``index`` (attempts and retries) and record its outcome."""
        options = self.options
        try:
            args, kwargs = self.chunks.get(index)
            if self.manifest["spec"].get("has_data"):
                from runner.data import resolve_arguments

                args, kwargs = resolve_arguments(self.store, args, kwargs, self.workdir)
        except BaseException as exc:  # noqa: BLE001 - recorded as the input's failure
            data, record = build_failure("resolve", exc, user=False)
            self.record(index, number, 0, data, record, b"")
            return
        lease = _Lease(self, index, number, expires)
        for attempt in range(options.retries + 1):
            done = self.attempt(index, attempt, args, kwargs, lease)
            if done is None:
                return  # ended from outside (stop or cancel): no outcome from us
            data, record, output = done
            if record["state"] == "succeeded" or attempt >= options.retries:
                self.record(index, number, attempt, data, record, output)
                return

    def attempt(
        self,
        index: int,
        attempt: int,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        lease: _Lease,
    ) -> tuple[bytes, protocol.FinalRecord, bytes] | None:
        """One attempt in a forked process: its payload, record and output, or None
        when it was ended from outside."""
        job_id = protocol.member_job_id(self.group_id, index)
        out_dir = f"{self.manifest['spec']['output_dir'].rstrip('/')}/{job_id}"
        print(f"{protocol.INPUT_MARKER} {index}", flush=True)
        sys.stderr.flush()
        read_fd, write_fd = os.pipe()
        with tempfile.TemporaryFile() as output:
            pid = os.fork()
            if pid == 0:  # the input's process: never returns
                os.close(read_fd)
                _child(self.fn, args, kwargs, output.fileno(), write_fd, job_id, out_dir, attempt)
            os.close(write_fd)
            echo = _Echo(output.fileno())
            try:
                message, ended, status = self._collect(pid, read_fd, lease, echo)
            finally:
                os.close(read_fd)
            echo.pump(last=True)
            output.seek(0)
            text = output.read()
        if ended:
            return None
        head, sep, data = message.partition(b"\n")
        try:
            record: protocol.FinalRecord = protocol.load_json(head)
        except ValueError:
            sep = b""
        if not sep:
            error = f"the input's process {_describe(status)} before recording a result"
            failed: protocol.FinalRecord = {
                "state": "failed",
                "phase": "execute",
                "error": error,
                "error_type": None,
            }
            payload = protocol.result_payload(
                success=False, phase="execute", error=error, error_type=""
            )
            return bytes(cloudpickle.dumps(payload)), failed, text
        return data, record, text

    def _collect(self, pid: int, fd: int, lease: _Lease, echo: _Echo) -> tuple[bytes, bool, int]:
        """Read the child's message until it exits; keep the lease, copy its output to the
        pod's log as it comes, and watch for an end from outside. Returns the message,
        whether the input was ended from outside, and the child's wait status."""
        parts: list[bytes] = []
        ended = False
        while True:
            ready, _, _ = select.select([fd], [], [], lease.next_check())
            if ready:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    break
                parts.append(chunk)
                continue
            echo.pump()
            if lease.tick():
                ended = True
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                break
        _, status = os.waitpid(pid, 0)
        return b"".join(parts), ended, status

    def record(
        self,
        index: int,
        number: int,
        attempt: int,
        data: bytes,
        record: protocol.FinalRecord,
        output: bytes,
    ) -> None:
        """Write the input's outcome (first one stands); stop the batch on a final
        failure with ``fail_fast``."""
        header = protocol.outcome_header(attempt, record, claim=number, worker=self.name)
        if output:
            header["output"] = output[-OUTPUT_TAIL:].decode(errors="replace")
        key = protocol.group_outcome_key(self.group_id, index)
        self.store.create_if_absent(key, protocol.encode_outcome(header, data))
        assert self.book is not None
        self.book.learn_outcome(index, record["state"])
        if record["state"] != "succeeded" and self.options.fail_fast:
            self.write_stop("fail_fast", f"input {index} failed", None)

    def record_failure(self, index: int, number: int, error: str, phase: str) -> None:
        payload = protocol.result_payload(success=False, phase=phase, error=error, error_type="")
        record: protocol.FinalRecord = {
            "state": "failed",
            "phase": phase,
            "error": error,
            "error_type": None,
        }
        self.record(index, number, 0, bytes(cloudpickle.dumps(payload)), record, b"")


class _Echo:
    """Copies what an input's process wrote to its output file on to the worker's stdout
    (the pod's log), so a running input's output can be read there."""

    def __init__(self, fd: int) -> None:
        self.fd, self.sent, self.newline = fd, 0, True

    def pump(self, *, last: bool = False) -> None:
        while chunk := os.pread(self.fd, 1 << 20, self.sent):
            self.sent += len(chunk)
            sys.stdout.buffer.write(chunk)
            self.newline = chunk.endswith(b"\n")
        if last and not self.newline:
            sys.stdout.buffer.write(b"\n")  # the next input marker starts a line
        sys.stdout.flush()


class _Lease:
    """The claim of the running input: renewed in time; watched for an end from outside."""

    def __init__(self, worker: Worker, index: int, number: int, expires: float) -> None:
        self.worker, self.index, self.number, self.expires = worker, index, number, expires
        self.checked = time.monotonic()

    def next_check(self) -> float:
        """Seconds until :meth:`tick` has something to do."""
        renew_in = self.expires - self.worker.options.lease_s * 2 / 3 - time.time()
        return max(0.05, min(STOP_EVERY, renew_in))

    def tick(self) -> bool:
        """Renew the lease when due; True when the input must end (stopped or cancelled)."""
        worker = self.worker
        options = worker.options
        stop = worker.check_stop()
        if stop is not None and stop_kills(stop, options):
            return True
        if time.time() >= self.expires - options.lease_s * 2 / 3:
            key = protocol.group_outcome_key(worker.group_id, self.index)
            if worker.store.list(key):
                return True  # cancelled alone: its outcome is written already
            self.expires = time.time() + options.lease_s
            worker.store.write(
                protocol.group_claim_key(worker.group_id, self.index, self.number),
                claim_record(worker.name, self.expires),
            )
        return False


def _child(
    fn: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    out_fd: int,
    result_fd: int,
    job_id: str,
    out_dir: str,
    attempt: int,
) -> None:
    """The input's process: run, send ``record JSON line + payload`` to the worker, exit."""
    code = 0
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        os.environ["JOB_ID"] = job_id
        os.environ["KINETIC_OUTPUT_DIR"] = out_dir
        os.environ["KINETIC_ATTEMPT"] = str(attempt)
        try:
            value = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - SystemExit too: it is the input's outcome
            traceback.print_exc()
            data, record = build_failure("execute", exc, user=True)
        else:
            data, record = build_success(value)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        message = memoryview(protocol.dump_json(record) + b"\n" + data)
        while message:
            message = message[os.write(result_fd, message) :]
    except BaseException:  # noqa: BLE001 - never return into the worker's code
        code = 1
    finally:
        os._exit(code)


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"was killed by signal {os.WTERMSIG(status)}"
    return f"exited with status {os.waitstatus_to_exitcode(status)}"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: ``python -m runner.pool --storage gs://BUCKET --group GID``."""
    args = parse_args(sys.argv[1:] if argv is None else argv, set())
    if not isinstance(args.get("storage"), str) or not isinstance(args.get("group"), str):
        raise SystemExit("usage: python -m runner.pool --storage URL --group GROUP_ID")
    name = os.environ.get("KINETIC_WORKER") or f"{socket.gethostname()}-{os.getpid()}"
    store = open_store(str(args["storage"]))
    try:
        with scratch_dir("worker") as workdir:
            return Worker(store, str(args["group"]), name, workdir).run()
    finally:
        store.close()


if __name__ == "__main__":
    sys.exit(main())
