"""What the dashboard knows of one batch, kept compactly and updated from what each look
at its records taught. Pure: no IO, no clock (callers pass ``now``, monotonic seconds).

Theory of operation
-------------------
Each refresh hands :meth:`BatchProgress.apply` the engine's snapshot: inputs newly
finished (with their state) and the inputs running now. Per input the dashboard keeps
one byte (its state), so a million inputs cost a megabyte; counts are kept as the
states change, never recounted. The chart's samples, the failure groups and the slowest
inputs are bounded whatever the batch's size:

* samples: one per refresh, thinned to at most :data:`MAX_SAMPLES` (every other old
  sample is dropped when full: the chart keeps its shape, the recent past its detail);
* failure groups: one per exception type, with its count, the first
  :data:`GROUP_INDICES` input indices and one example;
* slowest: durations are what the dashboard observed (first seen running to first seen
  finished): the records carry no timings. The :data:`SLOWEST` longest are kept.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

MAX_SAMPLES = 600
GROUP_INDICES = 50
SLOWEST = 10
RATE_WINDOW = 10.0
"""Seconds over which inputs per second are measured."""

STATE_CODES = {"succeeded": 1, "failed": 2, "cancelled": 3}
STATE_NAMES = {0: "pending", 1: "succeeded", 2: "failed", 3: "cancelled"}
RUNNING = 4  # only in :meth:`BatchProgress.state_of`'s answer, never stored


class Sample(NamedTuple):
    t: float
    done: int
    failed: int
    running: int
    pending: int


@dataclass
class FailureGroup:
    """The inputs that failed with one exception type."""

    key: str
    count: int = 0
    indices: list[int] = field(default_factory=list)
    example: int | None = None
    message: str = ""
    traceback: str | None = None

    def add(self, index: int) -> bool:
        """Count ``index``; True when it is the group's first (its example)."""
        self.count += 1
        if len(self.indices) < GROUP_INDICES:
            self.indices.append(index)
        if self.example is None:
            self.example = index
            return True
        return False


class _Known(Collection[int]):
    """The finished inputs, as the engine's ``snapshot`` wants them (``known``)."""

    def __init__(self, progress: BatchProgress) -> None:
        self._p = progress

    def __contains__(self, index: object) -> bool:
        codes = self._p.codes
        return isinstance(index, int) and 0 <= index < len(codes) and codes[index] != 0

    def __len__(self) -> int:
        return self._p.succeeded + self._p.failed

    def __iter__(self) -> Iterator[int]:
        return (i for i, c in enumerate(self._p.codes) if c)


class BatchProgress:
    """One batch's states, counts, samples, failure groups and slowest inputs."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.codes = bytearray(total)
        self.succeeded = 0
        self.failed = 0  # failed or cancelled
        self.running: set[int] = set()
        self.started: dict[int, float] = {}  # running inputs: when first seen running
        self.samples: list[Sample] = []
        self.groups: dict[str, FailureGroup] = {}
        self._slowest: list[tuple[float, int]] = []  # a min-heap of (seconds, index)
        self.known = _Known(self)

    @property
    def pending(self) -> int:
        return self.total - self.succeeded - self.failed - len(self.running)

    @property
    def finished(self) -> bool:
        return self.succeeded + self.failed >= self.total

    def state_of(self, index: int) -> int:
        """The code of input ``index``'s state (:data:`RUNNING` while it runs)."""
        code = self.codes[index]
        if code == 0 and index in self.running:
            return RUNNING
        return code

    def apply(
        self,
        done: list[tuple[int, str]],
        running: list[int],
        *,
        running_complete: bool,
        now: float,
    ) -> list[int]:
        """Take one look's news; return the inputs that newly failed or were cancelled
        (whose headers the caller reads to group them).

        :param running_complete: ``running`` is every running input (a full snapshot),
            not only the ones newly seen.
        """
        codes = self.codes
        failed: list[int] = []
        if running_complete:
            for index in self.running.difference(running):
                self.started.pop(index, None)
            self.running = set()
        for index in running:
            if 0 <= index < self.total and not codes[index]:
                self.running.add(index)
                self.started.setdefault(index, now)
        for index, state in done:
            if not 0 <= index < self.total or codes[index]:
                continue
            code = STATE_CODES.get(state, 2)
            codes[index] = code
            if code == 1:
                self.succeeded += 1
            else:
                self.failed += 1
                failed.append(index)
            self.running.discard(index)
            began = self.started.pop(index, None)
            if began is not None:
                self._observe(index, now - began)
        return failed

    def settle(self, state: str) -> list[int]:
        """The batch stopped: every input without a state gets ``state`` (they never ran).
        Returns them (capped at :data:`GROUP_INDICES` for the caller's grouping)."""
        code = STATE_CODES.get(state, 2)
        settled: list[int] = []
        for index, c in enumerate(self.codes):
            if not c:
                self.codes[index] = code
                self.failed += 1
                settled.append(index)
        self.running.clear()
        self.started.clear()
        return settled

    def _observe(self, index: int, seconds: float) -> None:
        item = (seconds, index)
        if len(self._slowest) < SLOWEST:
            heapq.heappush(self._slowest, item)
        elif item > self._slowest[0]:
            heapq.heapreplace(self._slowest, item)

    def slowest(self, now: float) -> list[tuple[int, float, bool]]:
        """(index, seconds, still running) of the slowest inputs seen, slowest first:
        finished ones and those running longer than they."""
        rows = [(i, s, False) for s, i in self._slowest]
        rows += [(i, now - t, True) for i, t in self.started.items()]
        rows.sort(key=lambda r: -r[1])
        return rows[:SLOWEST]

    def group(self, index: int, key: str, message: str) -> bool:
        """Put failed input ``index`` in the group ``key``; True when it is the group's
        example (the caller then fills its traceback)."""
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = FailureGroup(key)
        first = group.add(index)
        if first:
            group.message = message
        return first

    def sample(self, now: float) -> None:
        """Record the counts at ``now`` (thinning old samples when full)."""
        s = Sample(now, self.succeeded, self.failed, len(self.running), self.pending)
        if self.samples and self.samples[-1][1:] == s[1:] and len(self.samples) > 1:
            prev = self.samples[-2]
            if prev[1:] == s[1:]:
                self.samples[-1] = s  # a flat stretch: move its end, keep one point
                return
        self.samples.append(s)
        if len(self.samples) > MAX_SAMPLES:
            half = len(self.samples) // 2
            self.samples = self.samples[:half:2] + self.samples[half:]

    def rate(self) -> float:
        """Inputs finished per second over the last :data:`RATE_WINDOW` seconds seen."""
        if len(self.samples) < 2:
            return 0.0
        last = self.samples[-1]
        first = last
        for s in reversed(self.samples):
            first = s
            if last.t - s.t >= RATE_WINDOW:
                break
        span = last.t - first.t
        if span <= 0:
            return 0.0
        return ((last.done + last.failed) - (first.done + first.failed)) / span
