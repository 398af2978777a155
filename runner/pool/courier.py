"""A pool worker's upkeep requests, sent from a helper thread one at a time, so that an
input's end never waits for the request under way.

An input of 50 ms ends while a request of 30-80 ms (a 429's back-off: a second or more)
is still out; a shell of one thread would start the next input only once it is
answered (the *upkeep overhang* of ``benchmarks/README.md``). The worker
(:mod:`runner.pool.worker`) hands an upkeep request to its :class:`Courier` while an
input runs and goes on: the machine (made with ``overlap``) then hands out only the
held span's next inputs, or a wait, until the answer is in. The answer is applied to
the machine in the worker's main thread (:meth:`Courier.collect`), never in the helper:
the machine is not shared between threads. The store is not shared either: the main
thread uses it only once the courier is idle (:meth:`Courier.settle`).
"""

from __future__ import annotations

import os
import queue
import select
import threading
from collections.abc import Callable

from runner.pool.ops import Op

Answer = Callable[[], None]
"""Applies a request's answer to the machine (in the main thread)."""
Request = Callable[[Op], Answer]
"""Performs a storage request; returns how to apply its answer."""


class Courier:
    """Sends one storage request at a time from a helper thread (see the module
    docstring). :attr:`fd` is readable once the request's answer is in.

    A failure of the request (the store's, after its own retries and patience) is
    raised in the main thread by :meth:`collect` or :meth:`settle`.
    """

    def __init__(self, request: Request) -> None:
        self._request = request
        self._ops: queue.SimpleQueue[Op | None] = queue.SimpleQueue()
        self._answer: Answer | None = None
        self._error: BaseException | None = None
        self._done_read, self._done_write = os.pipe()
        self._thread: threading.Thread | None = None
        self.busy = False
        """A request was sent and its answer not yet applied."""

    @property
    def fd(self) -> int:
        return self._done_read

    def send(self, op: Op) -> None:
        """Send ``op``; the caller goes on.

        :raises RuntimeError: a request is still under way.
        """
        if self.busy:
            raise RuntimeError(f"{op!r} sent while a request is under way")
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="kinetic-courier")
            self._thread.daemon = True  # a worker that exits does not wait for it
            self._thread.start()
        self.busy = True
        self._ops.put(op)

    def collect(self) -> bool:
        """Apply the answer if it is in (without waiting); whether one was applied."""
        if not self.busy or not select.select([self._done_read], [], [], 0)[0]:
            return False
        self._apply()
        return True

    def settle(self) -> None:
        """Wait for the request under way, if any, and apply its answer."""
        if self.busy:
            select.select([self._done_read], [], [])
            self._apply()

    def close(self) -> None:
        """Stop the helper thread once its request (if any) is done; its answer is
        dropped (the worker is exiting)."""
        if self._thread is not None:
            self._ops.put(None)
            self._thread.join()
            self._thread = None
        os.close(self._done_read)
        os.close(self._done_write)

    def _apply(self) -> None:
        os.read(self._done_read, 1)
        self.busy = False
        answer, error, self._answer, self._error = self._answer, self._error, None, None
        if error is not None:
            raise error
        assert answer is not None
        answer()

    def _serve(self) -> None:
        while (op := self._ops.get()) is not None:
            try:
                self._answer = self._request(op)
            except BaseException as exc:  # noqa: BLE001 - raised in the main thread
                self._error = exc
            os.write(self._done_write, b"x")
