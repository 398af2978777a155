"""One attempt of an input in a pool worker: its outcome, its output echoed to the pod's
log, and the machine's upkeep while it runs in the worker's own process
(``reuse_process``). The worker (:mod:`runner.pool.worker`) runs it; the protocol as a
whole is told in ``docs/pool-protocol.md``.
"""

from __future__ import annotations

import os
import select
import sys
import threading
from typing import TYPE_CHECKING

import cloudpickle

from runner import protocol
from runner.pool.ops import Exit, Kill, Run, Sleep
from runner.pool.signals import EXIT_TERMINATED

if TYPE_CHECKING:
    from runner.pool.machine import WorkerMachine
    from runner.pool.worker import Worker

Attempt = tuple[bytes, protocol.FinalRecord, bytes, frozenset[str] | None]
"""An attempt's pickled result payload, final record, output, and the type names of the
function's exception (:func:`runner.protocol.exception_type_names`; None: none raised)."""


class Upkeep(threading.Thread):
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


def lost(error: str, output: bytes) -> Attempt:
    """The attempt of an input whose process ended without recording a result."""
    failed: protocol.FinalRecord = {
        "state": "failed",
        "phase": "execute",
        "error": error,
        "error_type": None,
    }
    payload = protocol.result_payload(success=False, phase="execute", error=error, error_type="")
    return bytes(cloudpickle.dumps(payload)), failed, output, None


class Echo:
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


def describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"was killed by signal {os.WTERMSIG(status)}"
    return f"exited with status {os.waitstatus_to_exitcode(status)}"
