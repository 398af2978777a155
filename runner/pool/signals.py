"""SIGTERM in a pool worker: Kubernetes sends it to a pod it deletes (``cancel()``, a
drained or preempted node). The worker ends its input, writes its burst and exits
:data:`EXIT_TERMINATED` (:mod:`runner.pool.worker`); the protocol as a whole is told
in ``docs/pool-protocol.md`` ("The failure model").
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
from typing import Any

EXIT_TERMINATED = 128 + signal.SIGTERM
"""A worker's exit status after SIGTERM (as if the signal had ended it): not 0, so that
the Indexed Job replaces a worker of a node drained or preempted, not only deleted."""


class Terminated(BaseException):
    """SIGTERM while the worker sets up (raised by its handler)."""


class Termination:
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
