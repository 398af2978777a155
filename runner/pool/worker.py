"""A worker of a GKE batch pool: ``python -m runner.pool --storage gs://BUCKET --group GID``.

Theory of operation
-------------------
Every pod of a pool batch's Kubernetes Job runs one worker. This module is its IO
shell; every decision (which span of inputs to claim, when to write a burst of
outcomes, renew the lease, take over a dead worker's span, stop) is the pure
:class:`runner.pool.machine.WorkerMachine`'s (the protocol is told in
``docs/pool-protocol.md``). A worker

1. waits its share of the pool's start spread (:meth:`PoolOptions.start_wait`: a
   thousand pods reading the batch in the same tenth of a second would meet the
   bucket's read limit), then reads the manifest and the function (``fn.pkl``, its
   SHA-256 checked) and prepares the workspace (the context) once. A failure there is
   no input's fault and would repeat in every worker: it stops the batch
   (``stop.json``, reason ``failed``, the phase) and the worker exits 0;
2. loops: asks the machine for its next operation and performs it against storage
   (list, read, create-if-absent, write), sleeps, runs an input, or exits;
3. runs each input, by default, in a fresh process forked from its zygote
   (:mod:`runner.pool.zygote`: a lean interpreter the worker starts, which unpickles
   the function once and does nothing but fork; each input runs in its own copy: a
   crash, a leak or global state of one input never reaches another). Meanwhile it
   keeps asking the machine for upkeep (lease renewal, the stop record, a cancel of the
   input, a due burst), sends it by its :class:`~runner.pool.courier.Courier` (a
   helper thread: the input's end does not wait for the request under way, and the
   next input of the span starts meanwhile) and ends the input when told to. With
   ``reuse_process`` (the user's opt-in) inputs run in the worker's own process, one
   after another: no fork per input, but an input that crashes the process ends the
   worker (its span is taken over), and what one input leaves in the process (globals,
   memory) the next one sees. Upkeep then runs in a helper thread while the input
   runs; an input cannot be ended alone (a stop that ends running inputs ends the
   worker, after its burst is written);
4. exits 0 once every input has an outcome or the batch stopped. The Job is an
   Indexed Job of one completion per worker: it completes once every worker exited 0,
   and worker ``k`` (``KINETIC_WORKER_INDEX``) starts on the ``k``-th region of the
   inputs. A worker that dies is replaced by the Job controller; the span it held is
   taken over from its first input without an outcome when its lease expires;
5. on SIGTERM (its pod deleted: ``cancel()``, which gives the pool's pods a grace, a
   drained or preempted node) ends the input it runs, writes the outcomes it buffered
   (and a ``fail_fast`` stop record not yet written) and exits :data:`EXIT_TERMINATED`,
   not 0: a drained worker is replaced (:class:`~runner.pool.signals.Termination`).

Each input's output goes to the pod's log after an input marker, and its tail into the
outcome's header (``output``), so it outlives the pod at no extra write. The marker is
written with the input's first output (or as it starts, for a retry): an input that
prints nothing costs the pod's log no line. Kubernetes is never called from here. A
coordinated pool's worker (:mod:`runner.pool.coordinator.worker`) shares this shell.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import select
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import IO, Any

import cloudpickle

from runner import protocol
from runner.code_files import load_function
from runner.job import build_failure, build_success, prepare_workspace
from runner.pool.attempts import Attempt, Echo, Upkeep, describe, lost
from runner.pool.chunks import Chunks
from runner.pool.counting import REQUESTS_MARKER, report_cpu
from runner.pool.courier import Answer, Courier
from runner.pool.machine import WorkerMachine
from runner.pool.ops import Create, Exit, Kill, List, Op, Read, Replace, Run, Sleep, Write
from runner.pool.options import PoolOptions
from runner.pool.patient_store import PatientStore
from runner.pool.pod_env import pool_workers
from runner.pool.signals import EXIT_TERMINATED, Terminated, Termination
from runner.pool.zygote import Zygote
from runner.protocol import PhaseError
from runner.store import RunnerStore
from runner.time_limit import InputTimeLimits, TimeLimitExceeded

SETUP_PATIENCE = 120.0
"""Seconds a worker setting up (reading the manifest, the function, the context) waits
out a storage failure before the batch fails in phase ``fetch``."""


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
        self.courier = Courier(lambda op: self.request(self._machine(), op))
        self.fn: Any = None
        self.termination = Termination()

    def _machine(self) -> WorkerMachine:
        assert self.machine is not None
        return self.machine

    @property
    def manifest(self) -> protocol.BatchManifest:
        assert self._manifest is not None
        return self._manifest

    # -- storage -------------------------------------------------------------------------

    def perform(self, machine: WorkerMachine, op: Op) -> None:
        """Do a storage operation or a sleep, and answer the machine."""
        if isinstance(op, Sleep):
            time.sleep(op.seconds)
        else:
            self.request(machine, op)()

    def request(self, machine: WorkerMachine, op: Op) -> Answer:
        """Do a storage operation; return how to answer the machine (the courier's
        thread does the first, the main thread the second)."""
        store = self.store
        if isinstance(op, List):
            keys = store.list(op.prefix)
            return lambda: machine.listed(op.prefix, keys)
        if isinstance(op, Read):
            try:
                data, generation = store.read_versioned(op.key)
            except FileNotFoundError:
                return lambda: machine.read(op.key, None, None)
            return lambda: machine.read(op.key, data, generation)
        if isinstance(op, Create):
            created = store.create_versioned(op.key, op.data)
            return lambda: machine.created(op.key, created)
        if isinstance(op, Write):
            store.write(op.key, op.data, fresh=True)  # a burst: a name of its own
            return lambda: machine.written(op.key)
        if isinstance(op, Replace):
            replaced = store.replace_if(op.key, op.data, op.generation)
            return lambda: machine.replaced(op.key, replaced)
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
        except Terminated:  # while setting up: nothing ran, nothing to write
            print(f"kinetic pool: worker {self.name} got SIGTERM while setting up", flush=True)
            return EXIT_TERMINATED
        finally:
            self.termination.close()

    def _on_sigterm(self, signum: int, frame: object) -> None:
        """The SIGTERM handler: once inputs run, the worker's waits see the signal (its
        byte in :class:`~runner.pool.signals.Termination`'s pipe) and :meth:`terminate`
        follows; before, setting up is abandoned at once."""
        self.termination.seen = True
        if self.machine is None:
            raise Terminated

    def _start(self) -> int:
        workers = pool_workers()
        if workers is not None:  # the start spread, before the batch's reads
            time.sleep(self.start_wait(PoolOptions.of_pool_size(workers)))
        self.before_reads()
        self._manifest = protocol.load_manifest(
            self.store.read(protocol.group_manifest_key(self.group_id))
        )
        options = PoolOptions.from_manifest(self.manifest)
        if self.stopped_before_start():
            return protocol.EXIT_OK
        try:
            return self._run(options, spread_start=workers is None)
        finally:
            self.courier.close()
            if self.zygote is not None:
                self.zygote.close()  # and an input still running (after a failure) ends
            report_cpu()

    def start_wait(self, sized: PoolOptions) -> float:
        """Seconds to wait before the batch's reads (:meth:`PoolOptions.start_wait`)."""
        return sized.start_wait(self.ordinal, random.random())

    def before_reads(self) -> None:
        """Called before the batch's reads (a coordinated worker connects first)."""

    def stopped_before_start(self) -> bool:
        """Whether the batch stopped before this worker started (its stop record)."""
        with contextlib.suppress(FileNotFoundError):
            self.store.read(protocol.group_stop_key(self.group_id))
            return True
        return False

    def set_up_or_stop(self, options: PoolOptions) -> bool:
        """Set up (:meth:`setup`, the chunks); a failure is no input's fault and would
        repeat in every worker: it stops the batch, and False is returned."""
        try:
            self.setup()
        except Terminated:
            raise
        except BaseException as exc:  # noqa: BLE001 - every input would fail the same way
            phase = exc.phase if isinstance(exc, PhaseError) else "fetch"
            print(f"kinetic pool: cannot set up the batch ({phase}): {exc}", flush=True)
            self.write_stop("failed", f"{type(exc).__name__}: {exc}", phase)
            return False
        self.chunks = Chunks(self.store, self.group_id, options.chunk_size, self.courier)
        return True

    def _run(self, options: PoolOptions, *, spread_start: bool) -> int:
        if not self.set_up_or_stop(options):
            return protocol.EXIT_OK
        # Inputs forked from the zygote end while the courier's request is under way:
        # the machine hands out the next one meanwhile (``overlap``). Inputs run in this
        # process are waited out by their upkeep thread, which sends its own requests.
        self.machine = machine = WorkerMachine(
            options,
            self.group_id,
            self.name,
            ordinal=self.ordinal,
            overlap=not options.reuse_process,
            spread_start=spread_start,
            stop_read=True,  # by _start
        )
        self.store.patience = options.lease_s / 4  # renewals are due every third
        return self.loop(machine)

    def loop(self, machine: WorkerMachine) -> int:
        """Ask ``machine`` for operations and perform them until it says exit (or
        SIGTERM: :meth:`terminate`); the exit status."""
        courier = self.courier
        while True:
            if self.termination.check():
                return self.terminate(machine)
            courier.collect()
            op = self.next_op()
            if isinstance(op, Exit):
                print(f"kinetic pool: worker {self.name} exits ({op.reason})", flush=True)
                self.report()
                return protocol.EXIT_OK
            if isinstance(op, Run):
                self.run_input(op)
            elif isinstance(op, Kill):
                machine.ended(op.index)  # nothing runs between inputs
            elif isinstance(op, Sleep):  # woken by the courier's answer, or SIGTERM
                select.select(self.wake_fds(), [], [], op.seconds)
            else:
                courier.settle()  # (the machine asks for none while one is under way)
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
        self.courier.settle()
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
                self.zygote.setup(fn_bytes, spec.get("timeout"))
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

                self.courier.settle()  # the store is used by one thread at a time
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
            data, record, output, types = done
            seconds = time.monotonic() - started
            machine.ran(op.index, record, data, output, seconds, error_types=types)

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
            echo = Echo(output.fileno(), marker)
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
            return lost(f"the input's process {describe(status)} before recording a result", text)
        names = record.pop("error_types", None)  # type: ignore[typeddict-item]
        return data, record, text, None if names is None else frozenset(names)

    def wake_fds(self) -> list[int]:
        """What a wait for an input's end watches besides it: SIGTERM, the courier."""
        return [self.termination.read_fd, self.courier.fd]

    def _collect(self, zygote: Zygote, echo: Echo) -> tuple[int, bool, bytes]:
        """Wait for the input to end, copying its output to the pod's log as it comes,
        and doing the machine's upkeep meanwhile (it may end the input). Returns the
        input process's wait status, whether it was ended from outside, and its message."""
        machine = self.machine
        assert machine is not None
        timeout = 0.0
        sock, courier = zygote.sock.fileno(), self.courier
        # Upkeep goes out by the courier: the input's end does not wait for its answer.
        while sock not in select.select([sock, *self.wake_fds()], [], [], timeout)[0]:
            echo.pump()
            if self.termination.check():  # the pod is being deleted: end the input now
                zygote.kill()
                zygote.ended()
                return 0, True, b""
            courier.collect()
            op = self.next_op()
            if isinstance(op, Sleep):
                timeout = op.seconds
                continue
            timeout = 0.0
            if isinstance(op, Kill):
                zygote.kill()
                zygote.ended()
                return 0, True, b""
            courier.send(op)
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
        upkeep = self.upkeep()
        upkeep.start()
        limits = self._time_limits()
        types: frozenset[str] | None = None
        try:
            try:
                if limits is not None:
                    limits.start()
                try:
                    value = self.fn(*args, **kwargs)
                finally:
                    if limits is not None:
                        limits.stop()
            except BaseException as exc:  # noqa: BLE001 - SystemExit too: the input's outcome
                traceback.print_exc()
                types = protocol.exception_type_names(type(exc))
                user = not isinstance(exc, TimeLimitExceeded)
                data, record = build_failure("execute", exc, user=user)
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
        return data, record, text, types

    def upkeep(self) -> Upkeep:
        """The thread that keeps the machine going while an input runs in this process."""
        return Upkeep(self)

    _output: IO[bytes] | None = None
    _limits: InputTimeLimits | None = None

    def _time_limits(self) -> InputTimeLimits | None:
        """The inputs' run-time limit in this process (``reuse_process``), set up once;
        None without ``timeout=``. One not unwound in time ends the worker (its input is
        then taken over, and failed once it has ended ``max_claims`` workers)."""
        seconds = self.manifest["spec"].get("timeout")
        if seconds is None:
            return None
        if self._limits is None:
            self._limits = InputTimeLimits(float(seconds))
        return self._limits

    def _output_file(self) -> IO[bytes]:
        if self._output is None:
            self._output = tempfile.TemporaryFile()  # noqa: SIM115 - kept for every input
        return self._output
