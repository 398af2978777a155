"""What is known of a batch run by a worker pool, and where a worker finds work. Pure.

Shared by the workers (:mod:`runner.pool.machine`) and the processes that follow the
batch (:mod:`kinetic._core.pool_plan`). Standard library only, no IO, no clock: times
are passed in. The protocol as a whole (objects, spans and holes, invariants, failure
model, limits, cost) is told in ``docs/pool-protocol.md``.
"""

from __future__ import annotations

import bisect
from dataclasses import replace

from runner import protocol
from runner.pool.options import PoolOptions
from runner.pool.spans import Intervals, Span


def stop_kills(stop: protocol.StopRecord, options: PoolOptions) -> bool:
    """Whether a stop record ends running inputs too (else they finish first)."""
    reason = stop.get("reason")
    return reason != "fail_fast" or options.cancel_running_on_fail


class PoolBook:
    """What is known of one pool batch (see the module docstring).

    Only grows: a claim, a burst, an outcome or the stop record, once learned, is never
    forgotten (storage never takes them back while the batch lives).
    """

    def __init__(self, options: PoolOptions) -> None:
        self.options = options
        self.spans: dict[int, Span] = {}
        """The latest claim read of each span, by its start."""
        self.listed: dict[int, int] = {}
        """The highest claim number seen (listed or read) of each span, by its start."""
        self.done = Intervals()
        """Inputs with a durable outcome (a burst's range or an object of their own)."""
        self.singles: set[int] = set()
        """Inputs with an outcome object of their own (a cancel, a large result)."""
        self.outcomes: dict[int, str] = {}
        """Followers: the state of each input whose outcome was read."""
        self.stop: protocol.StopRecord | None = None
        self.changes = 0
        """How many facts were learned: a follower's measure of progress."""
        self._cuts: dict[int, dict[int, Span]] = {}  # region -> cut spans, by start
        self._taken: set[int] = set()  # starts of spans with a takeover listed
        # region -> where its known chain of spans ends, and the reaches open there
        self._frontier: dict[int, tuple[int, tuple[int, ...]]] = {}
        self._starts: dict[int, list[int]] = {}  # region -> listed span starts, sorted
        # free_estimate of each region, kept up to date: a region's changes only when a
        # claim of it is listed or read (regions marked stale then), and an idle worker
        # asks for every region's (pick_region) — a thousand regions, each worker.
        self._free = [hi - lo for lo, hi in map(options.region, range(options.regions))]
        self._free_total = options.total
        self._stale: set[int] = set()

    # -- learning ----------------------------------------------------------------------

    def learn_listed(self, start: int, number: int) -> bool:
        """A claim name seen in a listing; True when that is news (its content, needed
        for its end and lease, is then read: :meth:`unread`)."""
        if not 0 <= start < self.options.total or self.listed.get(start, -1) >= number:
            return False
        self._list(start, number)
        self.changes += 1
        return True

    def _list(self, start: int, number: int) -> None:
        region = self.options.region_of(start)
        if start not in self.listed:
            bisect.insort(self._starts.setdefault(region, []), start)
            self._stale.add(region)
        elif number > 0:
            self._frontier.pop(region, None)  # a takeover: it may have cut the span
            self._stale.add(region)
        if number > 0:
            self._taken.add(start)
        self.listed[start] = number

    def learn_span(self, span: Span) -> bool:
        """Record a claim's content (kept if it is its span's latest); True when news."""
        if not 0 <= span.start < self.options.total:
            return False
        if self.listed.get(span.start, -1) < span.number:
            self._list(span.start, span.number)
        known = self.spans.get(span.start)
        if known is not None and (known.number, known.expires) >= (span.number, span.expires):
            return False
        if known is not None and known.number == span.number:  # a renewal: the same claim
            span = replace(span, end=known.end, reach=known.reach, slot=known.slot)
        if known is None or known.end != span.end:
            region = self.options.region_of(span.start)
            self._stale.add(region)  # its end is known now, or a takeover cut it
            if span.end < span.link_end:
                self._frontier.pop(region, None)  # a hole behind the known chain's end
                self._cuts.setdefault(region, {})[span.start] = span
        self.spans[span.start] = span
        self.changes += 1
        return True

    def learn_cut(
        self,
        start: int,
        number: int,
        end: int,
        reach: int,
        slot: int,
        expires: float = float("-inf"),
    ) -> bool:
        """Claim ``number`` of the span at ``start`` cut it at ``end`` (its hole's name,
        :func:`runner.protocol.hole_name`): the hole's slots are known before that claim
        is read, and when its first lease ended (``expires``: how recent the hole is,
        :meth:`open_holes`). True when news."""
        if not 0 <= start <= end < reach <= self.options.total or slot <= 0:
            return False
        region = self.options.region_of(start)
        cuts = self._cuts.setdefault(region, {})
        if start in cuts:
            return False
        self.learn_listed(start, number)
        # Its hole's shape (what hole_slot reads) and its first lease's end: not a lease
        # (cuts are not what expired() reads), the hole's age.
        cuts[start] = Span(start, number, "", expires, end, end, 1, reach, slot)
        self._frontier.pop(region, None)
        self._stale.add(region)
        self.changes += 1
        return True

    def first_claim(self, start: int, number: int) -> bool:
        """Whether claim ``number`` of the span at ``start`` is the first claim of every
        input it covers: claim 0 of a span in no hole. A span after a taken-over one of
        its region may lie in that one's hole (its claim, which tells, may not be read):
        its claim 0 counts as a later claim (``docs/pool-protocol.md``, "Which outcome
        of an input stands").
        Bursts are listed before claims: the takeover that cut a hole is listed by then."""
        if number > 0:
            return False
        region = self.options.region_of(start)
        region_of = self.options.region_of
        return not any(s < start and region_of(s) == region for s in self._taken)

    def learn_burst(self, first: int, end: int) -> bool:
        """Inputs ``[first, end)`` have outcomes (a burst's name); True when news."""
        end = min(end, self.options.total)
        if self.done.add(max(0, first), end):
            self._stale.add(self.options.region_of(max(0, first)))  # its free inputs are fewer
            self.changes += 1
            return True
        return False

    def learn_single(self, index: int) -> bool:
        """Input ``index`` has an outcome object of its own; True when news."""
        if not 0 <= index < self.options.total or index in self.singles:
            return False
        self.singles.add(index)
        self.done.add(index, index + 1)
        self.changes += 1
        return True

    def learn_outcome(self, index: int, state: str) -> bool:
        """Followers: input ``index`` ended in ``state``; True when that is news."""
        if index in self.outcomes or not 0 <= index < self.options.total:
            return False
        self.outcomes[index] = state
        self.done.add(index, index + 1)
        self.changes += 1
        return True

    def learn_stop(self, record: protocol.StopRecord) -> None:
        if self.stop is None:
            self.stop = record.copy()  # a copy: the caller's may change
            self.changes += 1

    # -- reading -----------------------------------------------------------------------

    @property
    def settled(self) -> bool:
        """Every input has an outcome."""
        return self.done.count >= self.options.total

    def unread(self) -> list[tuple[int, int]]:
        """``(start, number)`` of listed claims whose content is not known yet."""
        return sorted(
            (start, number)
            for start, number in self.listed.items()
            if (known := self.spans.get(start)) is None or known.number < number
        )

    def next_undone(self, span: Span) -> int:
        """The first input of the claim's part of the span without an outcome (its end
        when every one has one)."""
        return self.done.first_missing(span.first, span.end)

    def running(self, wall: float) -> list[int]:
        """The input each live claim runs now, as far as storage tells (its first input
        without an outcome)."""
        out = []
        for span in self.spans.values():
            if span.expires > wall:
                index = self.next_undone(span)
                if index < span.end:
                    out.append(index)
        return sorted(out)

    def held(self, wall: float) -> list[Span]:
        """Live claims whose spans have inputs without outcomes."""
        return [s for s in self.spans.values() if s.expires > wall and self.next_undone(s) < s.end]

    def expired(self, wall: float) -> list[Span]:
        """Latest claims whose lease ran out at ``wall``, with inputs left to run."""
        return sorted(
            (
                s
                for s in self.spans.values()
                if s.expires <= wall
                and self.listed.get(s.start, -1) <= s.number
                and self.next_undone(s) < s.end
            ),
            key=lambda s: s.start,
        )

    def span_end(self, start: int) -> int | None:
        """The end of the span starting at ``start``: its claim's, else its slot's in a
        hole, else the next listed start of its region (spans of a region are
        contiguous), else None."""
        span = self.spans.get(start)
        if span is not None:
            return span.end
        slot = self.hole_slot(start)
        if slot is not None:
            return slot[1]
        starts = self._starts.get(self.options.region_of(start), [])
        i = bisect.bisect_right(starts, start)
        return starts[i] if i < len(starts) else None

    def hole_slot(self, index: int) -> tuple[int, int] | None:
        """The slot ``[lo, hi)`` of the innermost known hole that holds ``index``."""
        best: Span | None = None
        for cut in self._cuts.get(self.options.region_of(index), {}).values():
            if cut.end <= index < cut.link_end and (best is None or cut.end > best.end):
                best = cut
        if best is None:
            return None
        size = max(1, best.slot)
        lo = best.end + (index - best.end) // size * size
        return lo, min(best.link_end, lo + size)

    def free_slots(self, at: int, limit: int) -> list[tuple[int, int]]:
        """The slots of the hole that holds ``at``, from ``at`` to ``limit``, that no known
        claim covers."""
        out = []
        while at < limit:
            slot = self.hole_slot(at)
            if slot is None:
                break
            if slot[0] not in self.listed and self.done.missing(*slot):
                out.append(slot)
            at = slot[1]
        return out

    def open_holes(self) -> list[Span]:
        """Cut claims whose holes have slots that no known claim covers, the newest cut
        first (its lease ended last: a hole cut long ago is likely full by now, though
        the claims of its slots are not known here)."""
        cuts = [cut for by_start in self._cuts.values() for cut in by_start.values()]
        return sorted(
            (cut for cut in cuts if self.free_slots(cut.end, cut.link_end)),
            key=lambda cut: (-cut.expires, cut.start),
        )

    def frontier(self, region: int) -> tuple[int, int | None, int]:
        """Where the region's chain of spans first has inputs no claim covers, as far as
        known: ``(at, None, limit)`` — inputs ``[at, limit)`` are free (``at == hi``:
        none) — or ``(at, start, limit)`` when the span starting at ``start`` must be
        read first (its end is not known)."""
        lo, hi = self.options.region(region)
        at, limits = self._frontier.get(region, (lo, ()))
        reaches = list(limits)  # the reaches of the cut spans being walked, innermost last
        while True:
            limit = reaches[-1] if reaches else hi
            if at >= limit:
                if not reaches:
                    break
                reaches.pop()  # the end of a hole: the chain goes on
                continue
            if at not in self.listed:
                break
            span = self.spans.get(at)
            number = self.listed[at]
            if number > 0 and (span is None or span.number < number):
                # A takeover not read yet may have cut the span: the spans in its hole
                # are slots, not a chain, and only its claim tells where they lie.
                bound = span.link_end if span is not None else limit
                if self.done.first_missing(at, bound) < bound:
                    return at, at, limit
                at = bound
                continue
            if span is None:
                end = self.span_end(at)
                if end is None:
                    return at, at, limit
                at = end  # a listed start follows: every input between is claimed
                continue
            if span.end < span.link_end:
                reaches.append(span.link_end)
            at = span.end
        if not reaches:
            self._frontier[region] = (at, ())
        return at, None, reaches[-1] if reaches else hi

    def suspects(self, wall: float) -> list[int]:
        """Starts of listed spans with inputs left whose lease may have run out: their
        claim was never read, or the one read has expired (it may have been renewed)."""
        out = []
        for start, number in self.listed.items():
            span = self.spans.get(start)
            if span is not None and span.number >= number and span.expires > wall:
                continue  # a live claim, as last read
            end = self.span_end(start)
            if end is None:  # it ends in its region: done with the region, it is done
                end = self.options.region(self.options.region_of(start))[1]
            first = span.first if span is not None else start
            if self.done.first_missing(first, end) < end:
                out.append(start)
        return sorted(out)

    def free_estimate(self, region: int) -> int:
        """Inputs of the region that no known claim covers and have no outcome (an upper
        bound while a span's end is unknown: that span counts as one input)."""
        if region in self._stale:
            self._stale.discard(region)
            self._update_free(region)
        return self._free[region]

    def _update_free(self, region: int) -> None:
        at, unknown, limit = self.frontier(region)
        free = max(0, self.done.missing(at, limit) - (1 if unknown is not None else 0))
        self._free_total += free - self._free[region]
        self._free[region] = free

    def taken_regions(self) -> list[int]:
        """Regions where a takeover was listed and inputs are free, in order: a dead
        worker's rest, which the takeover's hole (or its claim, not read yet) offers."""
        regions = {self.options.region_of(start) for start in self._taken}
        return sorted(r for r in regions if self.free_estimate(r) > 0)

    def free_by_region(self) -> list[int]:
        """:meth:`free_estimate` of every region, in order (do not mutate the list)."""
        while self._stale:
            self._update_free(self._stale.pop())
        return self._free

    def free_total(self) -> int:
        self.free_by_region()
        return self._free_total


def pick_region(book: PoolBook, pick: float, avoid: int | None = None) -> int | None:
    """A region with inputs no claim covers: among the fullest (within a factor two of
    the fullest), the one ``pick`` (in [0, 1)) points at; None when none is left.

    Taking from the fullest region is work stealing: a worker that ran out of its own
    work joins the region with the most left, where its span is a small share.

    A region where a takeover left work comes first (:meth:`PoolBook.taken_regions`):
    that is a dead worker's rest, which waits for idle workers to claim its slots. At a
    large batch's tail every region whose claim was never read looks as full as it
    would be free, and a worker that walked those would rarely meet the hole.
    """
    taken = [r for r in book.taken_regions() if r != avoid]
    if taken:
        return taken[min(len(taken) - 1, int(pick * len(taken)))]
    free = book.free_by_region()
    best = max((f for r, f in enumerate(free) if r != avoid), default=0)
    if best <= 0:
        best = max(free, default=0)
        if best <= 0:
            return None
        avoid = None
    choices = [r for r, f in enumerate(free) if f > 0 and 2 * f >= best and r != avoid]
    return choices[min(len(choices) - 1, int(pick * len(choices)))]
