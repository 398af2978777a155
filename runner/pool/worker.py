"""A worker of a GKE batch pool: ``python -m runner.pool --storage gs://BUCKET --group GID``.

Theory of operation
-------------------
Every pod of a pool batch's Kubernetes Job runs one worker. This module is its IO
shell; every decision (which span of inputs to claim, when to write a burst of
outcomes, renew the lease, take over a dead worker's span, stop) is the pure
:class:`runner.pool.machine.WorkerMachine`'s (the protocol is told in
``docs/pool-protocol.md``). A worker

1. reads the manifest and the function (``fn.pkl``, its SHA-256 checked) and prepares
   the workspace (the context) once. A failure there is no input's fault and would
   repeat in every worker: it stops the batch (``stop.json``, reason ``failed``, the
   phase) and the worker exits 0;
2. loops: asks the machine for its next operation and performs it against storage
   (list, read, create-if-absent, write), sleeps, runs an input, or exits;
3. runs each input, by default, in a fresh process forked from its zygote
   (:mod:`runner.pool.zygote`: a lean interpreter the worker starts, which unpickles
   the function once and does nothing but fork; each input runs in its own copy: a
   crash, a leak or global state of one input never reaches another). Meanwhile it keeps asking the machine for upkeep (lease renewal, the stop
   record, a cancel of the input, a due burst) and ends the input when told to. With
   ``reuse_process`` (the user's opt-in)
   inputs run in the worker's own process, one after another: no fork per input, but
   an input that crashes the process ends the worker (its span is taken over), and
   what one input leaves in the process (globals, memory) the next one sees. Upkeep
   then runs in a helper thread while the input runs; an input cannot be ended alone
   (a stop that ends running inputs ends the worker, after its burst is written);
4. exits 0 once every input has an outcome or the batch stopped. The Job is an
   Indexed Job of one completion per worker: it completes once every worker exited 0,
   and worker ``k`` (``KINETIC_WORKER_INDEX``) starts on the ``k``-th region of the
   inputs. A worker that dies is replaced by the Job controller; the span it held is
   taken over from its first input without an outcome when its lease expires;
5. on SIGTERM (its pod deleted: ``cancel()``, which gives the pool's pods a grace, a
   drained or preempted node) ends the input it runs, writes the outcomes it buffered
   (and a ``fail_fast`` stop record not yet written) and exits
   :data:`EXIT_TERMINATED`, not 0: a drained worker is replaced (:class:`_Termination`).

Each input's output goes to the pod's log after an input marker, and its tail into
the outcome's header (``output``), so it outlives the pod at no extra write. The marker
is written with the input's first output (or as it starts, for a retry): an input that
prints nothing costs the pod's log (and the node's container runtime) no line.
Kubernetes is never called from here.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import resource
import select
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import cloudpickle

from runner import protocol
from runner.code_files import load_function
from runner.job import build_failure, build_success, parse_args, prepare_workspace
from runner.pool.machine import WorkerMachine
from runner.pool.ops import Create, Exit, Kill, List, Op, Read, Replace, Run, Sleep, Write
from runner.pool.options import PoolOptions
from runner.pool.patient_store import PatientStore
from runner.pool.zygote import Zygote
from runner.protocol import PhaseError
from runner.scratch import scratch_dir
from runner.store import RunnerStore, open_store

CHUNKS_KEPT = 4
SETUP_PATIENCE = 120.0
"""Seconds a worker setting up (reading the manifest, the function, the context) waits
out a storage failure before the batch fails in phase ``fetch``."""
EXIT_TERMINATED = 128 + signal.SIGTERM
"""A worker's exit status after SIGTERM (as if the signal had ended it): not 0, so that
the Indexed Job replaces a worker of a node drained or preempted, not only deleted."""
REQUESTS_MARKER = "kinetic pool: storage requests"
CPU_MARKER = "kinetic pool: cpu seconds"


class CountingStore:
    """A store that counts its requests by kind (``read``, ``write``, ...): a worker
    reports them when it exits, so a benchmark can tell the cost per input."""

    def __init__(self, store: RunnerStore) -> None:
        self.store = store
        self.counts: dict[str, int] = {}

    def _count(self, kind: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1

    def read(self, key: str) -> bytes:
        self._count("read")
        return self.store.read(key)

    def write(self, key: str, data: bytes) -> None:
        self._count("write")
        self.store.write(key, data)

    def create_if_absent(self, key: str, data: bytes) -> bool:
        self._count("create")
        return self.store.create_if_absent(key, data)

    def read_versioned(self, key: str) -> tuple[bytes, int]:
        self._count("read")
        return self.store.read_versioned(key)

    def create_versioned(self, key: str, data: bytes) -> int | None:
        self._count("create")
        return self.store.create_versioned(key, data)

    def replace_if(self, key: str, data: bytes, generation: int) -> int | None:
        self._count("write")
        return self.store.replace_if(key, data, generation)

    def download(self, key: str, path: Path) -> None:
        self._count("read")
        self.store.download(key, path)

    def list(self, prefix: str) -> list[str]:
        self._count("list")
        return self.store.list(prefix)

    def close(self) -> None:
        self.store.close()


class _Chunks:
    """Input chunks, read on first use; the last few kept (a worker stays in a span)."""

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


Attempt = tuple[bytes, protocol.FinalRecord, bytes]
"""An attempt's pickled result payload, final record and output."""


class Worker:
    """One worker of a pool batch (see the module docstring)."""

    def __init__(
        self,
        store: RunnerStore,
        group_id: str,
        name: str,
        workdir: Path,
        ordinal: int | None = None,
    ) -> None:
        self.group_id, self.name, self.workdir = group_id, name, workdir
        self.ordinal = ordinal
        self.counted = store
        # A passing storage failure is waited out, not died of: during set-up as long
        # as SETUP_PATIENCE (no claim held yet), then a quarter of the claims' lease, so
        # that a worker still trying has not had its span taken over.
        self.store = PatientStore(store, patience=SETUP_PATIENCE)
        self.zygote: Zygote | None = None
        self._manifest: protocol.BatchManifest | None = None
        self.machine: WorkerMachine | None = None
        self.fn: Any = None
        self.termination = _Termination()

    @property
    def manifest(self) -> protocol.BatchManifest:
        assert self._manifest is not None
        return self._manifest

    # -- storage -------------------------------------------------------------------------

    def perform(self, machine: WorkerMachine, op: Op) -> None:
        """Do a storage operation or a sleep, and answer the machine."""
        store = self.store
        if isinstance(op, List):
            machine.listed(op.prefix, store.list(op.prefix))
        elif isinstance(op, Read):
            try:
                data, generation = store.read_versioned(op.key)
            except FileNotFoundError:
                machine.read(op.key, None, None)
            else:
                machine.read(op.key, data, generation)
        elif isinstance(op, Create):
            machine.created(op.key, store.create_versioned(op.key, op.data))
        elif isinstance(op, Write):
            store.write(op.key, op.data)
            machine.written(op.key)
        elif isinstance(op, Replace):
            machine.replaced(op.key, store.replace_if(op.key, op.data, op.generation))
        elif isinstance(op, Sleep):
            time.sleep(op.seconds)
        else:
            raise TypeError(f"not a storage operation: {op!r}")

    def write_stop(self, reason: protocol.StopReason, detail: str, phase: str | None) -> None:
        record = protocol.stop_record(reason, detail, phase)
        self.store.create_if_absent(
            protocol.group_stop_key(self.group_id), protocol.dump_json(record)
        )

    # -- the loop ------------------------------------------------------------------------

    def run(self) -> int:
        """Take and run inputs until none is left; the process exit status
        (:data:`EXIT_TERMINATED` after SIGTERM: :meth:`terminate`)."""
        self.termination.install(self._on_sigterm)
        try:
            return self._start()
        except _Terminated:  # while setting up: nothing ran, nothing to write
            print(f"kinetic pool: worker {self.name} got SIGTERM while setting up", flush=True)
            return EXIT_TERMINATED
        finally:
            self.termination.close()

    def _on_sigterm(self, signum: int, frame: object) -> None:
        """The SIGTERM handler: once inputs run, the worker's waits see the signal (its
        byte in :class:`_Termination`'s pipe) and :meth:`terminate` follows; before,
        setting up is abandoned at once."""
        self.termination.seen = True
        if self.machine is None:
            raise _Terminated

    def _start(self) -> int:
        self._manifest = protocol.load_manifest(
            self.store.read(protocol.group_manifest_key(self.group_id))
        )
        options = PoolOptions.from_manifest(self.manifest)
        with contextlib.suppress(FileNotFoundError):
            self.store.read(protocol.group_stop_key(self.group_id))
            return protocol.EXIT_OK  # stopped before this worker started
        try:
            return self._run(options)
        finally:
            if self.zygote is not None:
                self.zygote.close()  # and an input still running (after a failure) ends
            _report_cpu()

    def _run(self, options: PoolOptions) -> int:
        try:
            self.setup()
        except _Terminated:
            raise
        except BaseException as exc:  # noqa: BLE001 - every input would fail the same way
            phase = exc.phase if isinstance(exc, PhaseError) else "fetch"
            print(f"kinetic pool: cannot set up the batch ({phase}): {exc}", flush=True)
            self.write_stop("failed", f"{type(exc).__name__}: {exc}", phase)
            return protocol.EXIT_OK
        self.chunks = _Chunks(self.store, self.group_id, options.chunk_size)
        self.machine = machine = WorkerMachine(
            options, self.group_id, self.name, ordinal=self.ordinal
        )
        self.store.patience = options.lease_s / 4  # renewals are due every third
        while True:
            if self.termination.check():
                return self.terminate(machine)
            op = self.next_op()
            if isinstance(op, Exit):
                print(f"kinetic pool: worker {self.name} exits ({op.reason})", flush=True)
                self.report()
                return protocol.EXIT_OK
            if isinstance(op, Run):
                self.run_input(op)
            elif isinstance(op, Kill):
                machine.ended(op.index)  # nothing runs between inputs
            elif isinstance(op, Sleep):
                self.termination.wait(op.seconds)
            else:
                self.perform(machine, op)

    def terminate(self, machine: WorkerMachine) -> int:
        """After SIGTERM (the pod is being deleted: ``cancel()``, a drained node): the
        running input was ended (no outcome: it never finished); write the outcomes
        buffered, and the stop record a ``fail_fast`` failure left to write; exit."""
        print(f"kinetic pool: worker {self.name} got SIGTERM: writes its burst", flush=True)
        self.wind_up(machine)
        print(f"kinetic pool: worker {self.name} exits (terminated)", flush=True)
        self.report()
        return EXIT_TERMINATED

    def wind_up(self, machine: WorkerMachine) -> None:
        """Have the machine write what it holds and exit, as when the batch stops: it
        learns a stop of its own (not written: the pod is what ends, not the batch)."""
        detail = f"worker {self.name} got SIGTERM"
        machine.book.learn_stop(protocol.stop_record("cancelled", detail))
        if machine.running is not None:  # ended by now (or it never started)
            machine.ended(machine.running[0])
        while not isinstance(op := self.next_op(), Exit):
            if isinstance(op, (Run, Kill)):
                if machine.running is not None:
                    machine.ended(op.index)
            elif not isinstance(op, Sleep):
                self.perform(machine, op)
        if machine.stop_to_write is not None:  # its failure's burst is durable by now
            record = machine.stop_to_write
            self.store.create_if_absent(
                protocol.group_stop_key(self.group_id), protocol.dump_json(record)
            )

    def report(self) -> None:
        """One log line with this worker's storage requests by kind (benchmarks read it)."""
        counts = getattr(self.counted, "counts", None)
        if counts is not None:
            print(f"{REQUESTS_MARKER} {protocol.dump_json(dict(counts)).decode()}", flush=True)
        if self.store.retried:
            print(f"kinetic pool: {self.store.retried} storage operation(s) tried again")

    def next_op(self) -> Op:
        assert self.machine is not None
        return self.machine.next(wall=time.time(), mono=time.monotonic(), pick=random.random())

    def setup(self) -> None:
        """Fetch and verify the function, prepare the workspace, unpickle the function."""
        spec = self.manifest["spec"]
        fn_bytes = self.store.read(protocol.group_payload_key(self.group_id))
        if hashlib.sha256(fn_bytes).hexdigest() != spec["payload_sha256"]:
            raise PhaseError("verify", "fn.pkl is corrupted: its sha256 does not match")
        prepare_workspace(self.store, spec, self.workdir)
        options = PoolOptions.from_manifest(self.manifest)
        try:
            if options.reuse_process:
                self.fn = load_function(fn_bytes)
            else:  # inputs are forked from the zygote: only it needs the function
                self.zygote = Zygote.start()
                self.zygote.setup(fn_bytes)
        except BaseException as exc:
            raise PhaseError("deserialize", f"{type(exc).__name__}: {exc}") from exc

    # -- one input -----------------------------------------------------------------------

    def run_input(self, op: Run) -> None:
        """Run one attempt of an input and tell the machine how it ended."""
        machine = self.machine
        assert machine is not None
        started = time.monotonic()
        try:
            args, kwargs = self.chunks.get(op.index)
            if self.manifest["spec"].get("has_data"):
                from runner.data import resolve_arguments

                args, kwargs = resolve_arguments(self.store, args, kwargs, self.workdir)
        except BaseException as exc:  # noqa: BLE001 - recorded as the input's failure
            data, record = build_failure("resolve", exc, user=False)
            machine.ran(op.index, record, data)
            return
        job_id = protocol.member_job_id(self.group_id, op.index)
        out_dir = f"{self.manifest['spec']['output_dir'].rstrip('/')}/{job_id}"
        env = {"JOB_ID": job_id, "KINETIC_OUTPUT_DIR": out_dir, "KINETIC_ATTEMPT": str(op.attempt)}
        marker = f"{protocol.INPUT_MARKER} {op.index}\n".encode()
        if op.attempt:  # a retry: its section of the log must not read as the last try's
            sys.stdout.buffer.write(marker)
            marker = b""
        sys.stdout.flush()
        sys.stderr.flush()
        if machine.options.reuse_process:
            done = self.in_process(args, kwargs, env, marker)
        else:
            done = self.forked(args, kwargs, env, marker)
        if done is None:
            machine.ended(op.index)
        else:
            data, record, output = done
            machine.ran(op.index, record, data, output, time.monotonic() - started)

    def forked(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], env: dict[str, str], marker: bytes
    ) -> Attempt | None:
        """One attempt in a process forked from the zygote: its payload, record and
        output, or None when it was ended from outside."""
        zygote = self.zygote
        assert zygote is not None
        blob = cloudpickle.dumps((args, kwargs, env))
        with tempfile.TemporaryFile() as output:
            zygote.run(blob, output.fileno())
            echo = _Echo(output.fileno(), marker)
            status, ended, message = self._collect(zygote, echo)
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
            return _lost(f"the input's process {_describe(status)} before recording a result", text)
        return data, record, text

    def _collect(self, zygote: Zygote, echo: _Echo) -> tuple[int, bool, bytes]:
        """Wait for the input to end, copying its output to the pod's log as it comes,
        and doing the machine's upkeep meanwhile (it may end the input). Returns the
        input process's wait status, whether it was ended from outside, and its message."""
        machine = self.machine
        assert machine is not None
        timeout = 0.0
        sock = zygote.sock.fileno()
        watched = [sock, self.termination.read_fd]
        while sock not in select.select(watched, [], [], timeout)[0]:
            echo.pump()
            if self.termination.check():  # the pod is being deleted: end the input now
                zygote.kill()
                zygote.ended()
                return 0, True, b""
            op = self.next_op()
            if isinstance(op, Sleep):
                timeout = op.seconds
                continue
            timeout = 0.0
            if isinstance(op, Kill):
                zygote.kill()
                zygote.ended()
                return 0, True, b""
            self.perform(machine, op)
        return zygote.ended()

    def in_process(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], env: dict[str, str], marker: bytes
    ) -> Attempt | None:
        """One attempt in the worker's own process (``reuse_process``); its output is
        caught in a file for the outcome's header, then copied to the pod's log."""
        os.environ.update(env)
        output = self._output_file()
        output.seek(0)
        output.truncate()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(output.fileno(), 1)
        os.dup2(output.fileno(), 2)
        upkeep = _Upkeep(self)
        upkeep.start()
        try:
            try:
                value = self.fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - SystemExit too: the input's outcome
                traceback.print_exc()
                data, record = build_failure("execute", exc, user=True)
            else:
                data, record = build_success(value)
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(OSError, ValueError):
                    stream.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            upkeep.finish()
        output.seek(0)
        text = output.read()
        if text:
            sys.stdout.buffer.write(marker + text + (b"" if text.endswith(b"\n") else b"\n"))
            sys.stdout.flush()
        return data, record, text

    _output: IO[bytes] | None = None

    def _output_file(self) -> IO[bytes]:
        if self._output is None:
            self._output = tempfile.TemporaryFile()  # noqa: SIM115 - kept for every input
        return self._output


class _Upkeep(threading.Thread):
    """The machine's upkeep while an input runs in the worker's own process: the main
    thread hands the machine over until :meth:`finish` (never both at once). A stop
    that ends running inputs ends the worker, once its burst is written, and so does
    SIGTERM; an input cancelled alone finishes (its own outcome object stands over the
    worker's)."""

    def __init__(self, worker: Worker) -> None:
        super().__init__(name="kinetic-upkeep", daemon=True)
        self.worker = worker
        self.done = threading.Event()
        self.error: BaseException | None = None
        self._wake_read, self._wake_write = os.pipe()  # finish() wakes a sleep at once

    def run(self) -> None:
        worker, machine = self.worker, self.worker.machine
        assert machine is not None
        termination = worker.termination
        try:
            while not self.done.is_set():
                if termination.check():
                    worker.wind_up(machine)  # the running input is cut: no outcome
                    print(f"kinetic pool: worker {worker.name} exits (terminated)", flush=True)
                    os._exit(EXIT_TERMINATED)
                op = worker.next_op()
                if isinstance(op, Sleep):
                    watched = [self._wake_read, termination.read_fd]
                    select.select(watched, [], [], op.seconds)
                elif isinstance(op, Kill):
                    if machine.book.stop is None:
                        continue  # cancelled alone: it cannot be ended here
                    machine.ended(op.index)
                    self._write_and_exit(machine)
                else:
                    worker.perform(machine, op)
        except BaseException as exc:  # noqa: BLE001 - raised in the main thread
            self.error = exc

    def _write_and_exit(self, machine: WorkerMachine) -> None:
        while True:
            op = self.worker.next_op()
            if isinstance(op, Exit):
                print(f"kinetic pool: worker {self.worker.name} exits (stopped)", flush=True)
                os._exit(protocol.EXIT_OK)
            if not isinstance(op, Run):
                self.worker.perform(machine, op)

    def finish(self) -> None:
        self.done.set()
        os.write(self._wake_write, b"x")
        self.join()
        os.close(self._wake_read)
        os.close(self._wake_write)
        if self.error is not None:
            raise self.error


class _Terminated(BaseException):
    """SIGTERM while the worker sets up (raised by its handler)."""


class _Termination:
    """SIGTERM, which Kubernetes sends a pod it deletes — ``cancel()``, whose deletion
    gives the pool's pods a grace before they are killed, or a drained or preempted
    node. The signal's number is written to a pipe (``signal.set_wakeup_fd``) at once,
    even while the main thread runs an input in the worker's process: the worker's waits
    (for an input's end, a sleep, the upkeep thread's) watch it, and the worker then
    ends its input and writes its burst (:meth:`Worker.terminate`)."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        for fd in (self.read_fd, self.write_fd):
            os.set_blocking(fd, False)
        self.seen = False
        self._saved: tuple[Any, int] | None = None

    def install(self, handler: Any) -> None:
        """Handle SIGTERM with ``handler`` (from the main thread only: elsewhere, as a
        worker run by a test in a thread, the signal is left as it is)."""
        if threading.current_thread() is not threading.main_thread():
            return
        previous = signal.signal(signal.SIGTERM, handler)
        self._saved = previous, signal.set_wakeup_fd(self.write_fd, warn_on_full_buffer=False)

    def check(self) -> bool:
        """Whether SIGTERM came (what the signal wrote to the pipe is read here)."""
        with contextlib.suppress(BlockingIOError):
            while data := os.read(self.read_fd, 64):
                self.seen = self.seen or signal.SIGTERM in data
        return self.seen

    def wait(self, seconds: float) -> None:
        """Sleep ``seconds``, or until SIGTERM comes."""
        select.select([self.read_fd], [], [], seconds)

    def close(self) -> None:
        if self._saved is not None:
            signal.set_wakeup_fd(self._saved[1])
            signal.signal(signal.SIGTERM, self._saved[0])
            self._saved = None
        for fd in (self.read_fd, self.write_fd):
            os.close(fd)


def _lost(error: str, output: bytes) -> Attempt:
    """The attempt of an input whose process ended without recording a result."""
    failed: protocol.FinalRecord = {
        "state": "failed",
        "phase": "execute",
        "error": error,
        "error_type": None,
    }
    payload = protocol.result_payload(success=False, phase="execute", error=error, error_type="")
    return bytes(cloudpickle.dumps(payload)), failed, output


class _Echo:
    """Copies what an input's process wrote to its output file on to the worker's stdout
    (the pod's log), so a running input's output can be read there; the input's marker
    goes first, with its first output (none for an input that prints nothing)."""

    def __init__(self, fd: int, marker: bytes) -> None:
        self.fd, self.sent, self.newline, self.marker = fd, 0, True, marker

    def pump(self, *, last: bool = False) -> None:
        while chunk := os.pread(self.fd, 1 << 20, self.sent):
            self.sent += len(chunk)
            sys.stdout.buffer.write(self.marker + chunk)
            self.marker = b""
            self.newline = chunk.endswith(b"\n")
        if last and not self.newline:
            sys.stdout.buffer.write(b"\n")  # the next input marker starts a line
        if self.sent:
            sys.stdout.flush()


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
    store = CountingStore(open_store(str(args["storage"])))
    try:
        with scratch_dir("worker") as workdir:
            return Worker(store, str(args["group"]), name, workdir, worker_ordinal()).run()
    finally:
        store.close()


def worker_ordinal() -> int | None:
    """This pod's completion index in an Indexed Job (``KINETIC_WORKER_INDEX``, from the
    pod's ``batch.kubernetes.io/job-completion-index`` annotation), or None: a cluster
    without Indexed Jobs (before Kubernetes 1.21) leaves the annotation out, and the
    worker then starts in a region of its own choosing."""
    value = os.environ.get("KINETIC_WORKER_INDEX", "")
    return int(value) if value.isdigit() else None


def _report_cpu() -> None:
    """One log line with the CPU this worker spent, its own and its children's (the
    zygote and the inputs' processes, all reaped by now): benchmarks read it."""
    own, children = (
        resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    spent = {
        "worker": round(own.ru_utime + own.ru_stime, 3),
        "inputs": round(children.ru_utime + children.ru_stime, 3),
    }
    print(f"{CPU_MARKER} {protocol.dump_json(spent).decode()}", flush=True)
