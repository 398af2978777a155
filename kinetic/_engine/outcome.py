"""A batch input's outcome, carried by the handle that the batch stream yielded.

The stream that learns an input finished reads its outcome in the same batched
pass (one read per chunk of inputs, not one per input), so ``result()`` on such a
handle decodes bytes already in memory: no backend lookup, no status or wait
round trip, no thread hop for a small payload. Handles obtained any other way
(``attach``, a handle rebuilt from its record) carry nothing and take the
backend's path.

Cleanup is batched too: a member's own objects live in its batch's shared
records, so ``result(cleanup=True)`` on a carried outcome deletes nothing by
itself; once every input of the batch was collected with cleanup, the batch is
cleaned up once (:class:`CleanupTally`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio.to_thread

from kinetic._engine.results import load_payload, unwrap

logger = logging.getLogger(__name__)

INLINE_DECODE_LIMIT = 16 * 1024
"""Payloads up to this size are unpickled on the caller's loop: tens of µs, less than a
thread hop. Larger ones go to a worker thread."""

CARRY_LIMIT = 1 << 20
"""Payloads above this size are not kept on the handle (a batch of large values would
otherwise hold them all); their handles read the outcome again when asked."""


class CleanupTally:
    """Counts a batch's inputs collected with cleanup; says when the batch may go.

    :param members: how many inputs can be collected (the submitted ones).
    :param cleanup: the batch's own cleanup, awaited once when every input was
        collected with cleanup and none was kept.
    """

    def __init__(self, members: int, cleanup: Callable[[], Awaitable[None]]) -> None:
        self._members = members
        self._cleanup: Callable[[], Awaitable[None]] | None = cleanup
        self._taken: set[int] = set()
        self._kept = False
        self._done = False

    def take(self, index: int, cleanup: bool) -> bool:
        """Record that input ``index`` was collected. True exactly once: when the
        batch's cleanup is now due (the caller then awaits :meth:`run_cleanup`)."""
        if not cleanup:
            self._kept = True
        self._taken.add(index)
        if self._done or self._kept or len(self._taken) < self._members:
            return False
        self._done = True
        return True

    async def run_cleanup(self) -> None:
        if self._cleanup is not None:
            await self._cleanup()

    def close(self) -> None:
        """The batch was cleaned up: no cleanup is due any more. Drops the reference to
        the batch's cleanup, the batch's own method: a cycle (batch -> tally -> batch)
        that would otherwise keep the batch, its handles and their outcomes alive until
        the collector's next full pass."""
        self._done = True
        self._cleanup = None


@dataclass(eq=False)
class KnownOutcome:
    """The terminal outcome of one batch input, read by the stream that found it.

    Exactly one of ``payload`` (the pickled result payload) and ``error`` (a factory
    of the error of an input that never ran) is set.
    """

    job_id: str
    index: int
    payload: bytes | None
    error: Callable[[], Exception] | None
    tally: CleanupTally | None = None

    def decode(self) -> Any:
        """The value, or raise what the input ended with. Blocking for large payloads."""
        if self.payload is None:
            assert self.error is not None
            raise self.error()
        return unwrap(load_payload(self.payload, self.job_id), self.job_id)

    @property
    def inline(self) -> bool:
        """Whether :meth:`decode` is cheap enough to run on an event loop."""
        return self.payload is None or len(self.payload) <= INLINE_DECODE_LIMIT

    def taken(self, cleanup: bool) -> bool:
        """Record the collection; True when the batch's cleanup is now due."""
        return self.tally is not None and self.tally.take(self.index, cleanup)

    async def cleanup_batch(self) -> None:
        """The batch's cleanup, once every input was collected with cleanup. Best effort:
        a failure is logged, the values are in hand."""
        assert self.tally is not None
        try:
            await self.tally.run_cleanup()
        except Exception:  # noqa: BLE001 - the value is in hand; cleanup is best effort
            logger.warning(
                "could not clean up the batch of job %s after collecting its results",
                self.job_id,
            )

    async def take(self, cleanup: bool) -> Any:
        """Decode (in a worker thread when large) and record the collection; runs the
        batch's cleanup when this was the last input collected with cleanup.

        :raises Exception: what the input ended with, as ``JobHandle.result`` does.
        Cancelled while decoding, the input is not counted as collected.
        """
        if self.inline:
            ok, value = capture(self.decode)
        else:
            ok, value = await anyio.to_thread.run_sync(capture, self.decode)
        if self.taken(cleanup):
            await self.cleanup_batch()
        if not ok:
            raise value
        return value


def capture(fn: Callable[[], Any]) -> tuple[bool, Any]:
    """``(True, value)`` or ``(False, exception)``: what ``fn`` returned or raised."""
    try:
        return True, fn()
    except Exception as exc:  # noqa: BLE001 - handed back to be re-raised by the caller
        return False, exc
