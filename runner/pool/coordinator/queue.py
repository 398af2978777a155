"""Which inputs of a coordinated batch are left to hand out, and how many at a time. Pure.

Spans are sized by guided self-scheduling: ``ceil(left / (2 x workers))`` inputs, so
the first spans are long (few requests) and the last ones short (the tail does not
wait on one worker), and at most :attr:`SpanQueue.cap_seconds` of work at the pace
heard so far (a slow input makes spans short before the tail). Inputs handed back (their
worker died or went silent) are handed out again first, in index order.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable

PACE_WEIGHT = 0.1
"""The weight of the newest input's seconds in the pace (an exponential average)."""


class SpanQueue:
    """The inputs ``0 .. total - 1`` not handed out yet, and those handed back.

    :param total: inputs in the batch.
    :param workers: workers in the pool (the divisor of guided self-scheduling).
    :param cap_seconds: work a span holds at most, at the pace heard so far.
    """

    def __init__(self, total: int, workers: int, cap_seconds: float) -> None:
        if total < 0 or workers < 1 or cap_seconds <= 0:
            raise ValueError(f"a queue of {total} inputs for {workers} workers, cap {cap_seconds}")
        self.total = total
        self.workers = workers
        self.cap_seconds = cap_seconds
        self.fresh = 0
        """The first input never handed out."""
        self.returned: deque[int] = deque()
        """Inputs handed back, to hand out again before fresh ones."""
        self.pace: float | None = None
        """Seconds an input takes, averaged over those heard."""

    def left(self) -> int:
        """Inputs to hand out (some handed back may have an outcome meanwhile)."""
        return self.total - self.fresh + len(self.returned)

    def size(self) -> int:
        """How many inputs the next span holds at most."""
        size = max(1, math.ceil(self.left() / (2 * self.workers)))
        if self.pace is not None and self.pace > 0:
            size = min(size, max(1, int(self.cap_seconds / self.pace)))
        return size

    def take(self, wanted: Callable[[int], bool]) -> list[int]:
        """The next span: inputs handed back first, then the next fresh ones; ``[]``
        when none is left. ``wanted(i)`` says whether input ``i``, handed back, still
        needs running (one handed back may have an outcome or a holder meanwhile)."""
        size = self.size()
        span: list[int] = []
        while self.returned and len(span) < size:
            index = self.returned.popleft()
            if wanted(index):
                span.append(index)
        if not span and self.fresh < self.total:
            end = min(self.total, self.fresh + size)
            span = list(range(self.fresh, end))
            self.fresh = end
        return span

    def give_back(self, indices: Iterable[int]) -> None:
        """Hand ``indices`` out again (their worker is gone), before any fresh input."""
        merged = sorted(set(self.returned).union(indices))
        self.returned = deque(merged)

    def heard(self, seconds: float) -> None:
        """An input took ``seconds``: the pace follows."""
        if seconds < 0 or not math.isfinite(seconds):
            return
        if self.pace is None:
            self.pace = seconds
        else:
            self.pace = (1 - PACE_WEIGHT) * self.pace + PACE_WEIGHT * seconds

    def restart(self, undone: Iterable[int]) -> None:
        """A restarted coordinator's queue: every input in ``undone`` is to hand out
        again, nothing is fresh."""
        self.fresh = self.total
        self.returned = deque(sorted(set(undone)))
