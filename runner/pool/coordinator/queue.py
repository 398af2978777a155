"""Which inputs of a coordinated batch are left to hand out, and how many at a time. Pure.

Spans are sized by guided self-scheduling: ``ceil(left / (2 x workers))`` inputs, so
the first spans are long (few requests) and the last ones short (the tail does not
wait on one worker), and at most :attr:`SpanQueue.cap_seconds` of work at the pace
heard so far (a slow input makes spans short before the tail). Inputs handed back (their
worker died or went silent) are handed out again first, in index order.

Where a span's inputs come from keeps a worker in few input chunks (each chunk a
worker touches is one more storage read): the batch is cut into one region per
worker, a worker takes its spans from the front of its own region (the first region
nobody took, as it first asks), and once that is done, from the back of the region
with the most inputs left, at most half of them (its owner goes on from the front).
Handed out from one front instead, the spans of a 1,000-worker pool each fell in
another chunk: 7 chunk reads a worker, a storm of them at the read limit near the end.
"""

from __future__ import annotations

import heapq
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
        bounds = [total * k // workers for k in range(workers + 1)]
        self.regions = [[bounds[k], bounds[k + 1]] for k in range(workers)]
        """Each region's inputs never handed out: ``[first, end)``."""
        self.owners: dict[str, int] = {}
        """Which region is whose (by the order of their first asks)."""
        self.fresh_left = total
        """Inputs never handed out (in every region together)."""
        self._biggest = [(lo - hi, k) for k, (lo, hi) in enumerate(self.regions)]
        heapq.heapify(self._biggest)  # (-inputs left, region); stale entries skipped
        self.returned: deque[int] = deque()
        """Inputs handed back, to hand out again before fresh ones."""
        self.pace: float | None = None
        """Seconds an input takes, averaged over those heard."""

    def left(self) -> int:
        """Inputs to hand out (some handed back may have an outcome meanwhile)."""
        return self.fresh_left + len(self.returned)

    def size(self) -> int:
        """How many inputs the next span holds at most."""
        size = max(1, math.ceil(self.left() / (2 * self.workers)))
        if self.pace is not None and self.pace > 0:
            size = min(size, max(1, int(self.cap_seconds / self.pace)))
        return size

    def take(self, wanted: Callable[[int], bool], worker: str = "") -> list[int]:
        """The next span for ``worker``: inputs handed back first, then fresh ones (see
        the module docstring); ``[]`` when none is left. ``wanted(i)`` says whether
        input ``i``, handed back, still needs running (one handed back may have an
        outcome or a holder meanwhile)."""
        size = self.size()
        span: list[int] = []
        while self.returned and len(span) < size:
            index = self.returned.popleft()
            if wanted(index):
                span.append(index)
        if not span and self.fresh_left:
            span = self._fresh(worker, size)
        return span

    def _fresh(self, worker: str, size: int) -> list[int]:
        region = self.owners.get(worker)
        if region is None and len(self.owners) < len(self.regions):
            region = self.owners[worker] = len(self.owners)
        if region is not None and self._count(region):
            first, end = self.regions[region]
            end = min(end, first + size)
            self.regions[region][0] = end
        else:
            region = self._most_left()
            first, end = self.regions[region]
            first = max(first, end - min(size, math.ceil((end - first) / 2)))
            self.regions[region][1] = first
        self.fresh_left -= end - first
        heapq.heappush(self._biggest, (-self._count(region), region))
        return list(range(first, end))

    def _count(self, region: int) -> int:
        first, end = self.regions[region]
        return end - first

    def _most_left(self) -> int:
        while True:
            negative, region = self._biggest[0]
            if -negative == self._count(region):
                return region
            heapq.heappop(self._biggest)  # stale: the region was taken from since

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
        self.regions = [[end, end] for _, end in self.regions]
        self.fresh_left = 0
        self._biggest = []
        self.returned = deque(sorted(set(undone)))
