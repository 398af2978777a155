"""What is known of a batch run by a worker pool, and how its work is cut. Pure.

Shared by the workers (:mod:`runner.pool_machine`, driven by :mod:`runner.pool`) and
the processes that follow the batch (:mod:`kinetic._core.pool_plan`). The protocol as a
whole (objects, invariants, failure model, limits, cost) is told in
``docs/pool-protocol.md``. Standard library only, no IO, no clock: times are passed in.

Theory of operation
-------------------
Workers claim *spans* of consecutive inputs, one claim object per span
(``claims/{start}.{n}``, :class:`Span`), and write the outcomes of a span in *bursts*
(``bursts/{a}-{b}.{start}.{n}``: the outcomes of inputs ``[a, b)``). The input range is
cut into ``R = min(workers, total)`` fixed *regions*; a span lies inside one region and
starts at the region's start or exactly where the previous span of the region ends.
So a region is a chain of spans, and workers who want the next span of a region race
on the same name: create-if-absent lets exactly one win (spans never overlap).

An input is *done* once a burst's name covers it or it has an outcome object of its
own (``results/{index}.res``). A span is *running* while its latest claim holds; once
that lease ran out (its worker died) the span is taken over by claim ``n + 1`` from its
first input that is not done — unless that input already had ``max_claims`` claims:
then it is failed, not run again (each claim counts the claims that ran its first
input: ``tries``). A takeover writes its first outcome at once, so the input a worker
died on is known exactly.

A takeover of a long span runs only a part of it, ``[first, end')``, and its claim says
where the span's link of the chain ended (``reach``) and how long that part is
(``slot``): the rest, ``[end', reach)``, is a *hole* cut into slots of that size,
``[end' + i × slot, end' + (i + 1) × slot)``, each claimed as a span of its own. So the
work of a dead worker is spread over the idle ones instead of waiting on one of them,
and those that join pick slots at random rather than race for the hole's first one. A
slot's end is known from its start: no claim in a hole is read to learn it. Only a
claim that was never cut is cut (a cut claim's takeover keeps its end and slots), so a
hole is bounded by a reach that every claim of its span states.

Span sizes adapt (:func:`span_size`): short while inputs are slow or few remain, long
while they are fast, so the tail does not wait on one worker.

Which outcome of an input stands
--------------------------------
Delivery is at-least-once, so an input may have several durable outcomes: records in
bursts of different claims (a worker whose burst landed after its lease ran out, when a
takeover had run the input again) and an outcome object of its own. Every reader
(:mod:`kinetic._backends.gke.pool`: ``results()``, ``as_completed()``,
``attach_batch``, ``kinetic batch status``) reports the same one, whatever the order it
listed and read them in (:func:`outcome_rank`, :class:`OutcomeChoice`):

1. the outcome object of its own stands: there is at most one (create-if-absent). A
   worker writes it (a large result) before the burst that covers the input; a cancel
   only when its reader knew no record of the input;
2. else the record in the burst of the *earliest claim*: the lowest claim start, then
   claim number, then burst name. The claims that cover one input were created in that
   order (a takeover ``n + 1`` only once claim ``n``'s lease ran out; a hole's slot, a
   span further on, only once the takeover that cut the span), so this is the claim the
   input was given to first. A late burst is most often that claim's, too (a write
   delayed by storage about its lease's end, while the takeover still runs the input):
   it is also the one that landed first.

Listings give names, not the order objects were created in, and of two bursts written
concurrently either may land first under the same names: no rule on names can make "the
first durable" stand. So a reader reports a record only once no record it has not seen
can stand over it:

* an outcome object of its own: at once (nothing stands over it);
* a record of the input's *first claim* (claim 0 of a span in no hole:
  :meth:`PoolBook.first_claim`), as for nearly every input: at once. Only an object of
  its own could stand over it, and one is created after a record only in the races
  left open below;
* a record of a later claim (a takeover, a hole's slot): :attr:`OutcomeChoice.hold`
  seconds (the batch's lease) after the reader first listed its burst. Every earlier
  claim of the input lost its lease before that claim was created, and a worker writes
  a burst after its lease ran out only once it made sure that its claim was not taken
  over (:mod:`runner.pool_machine`), retrying a write for a quarter of a lease at most:
  such a late burst lands within the hold, and stands over the held record, which no
  reader has reported yet. Or sooner: once no worker may write anymore (a reader that
  saw no pod of the pool left, then listed the bursts), every record is in sight.

A reader never changes an outcome it reported: a record that comes later is ignored
(counted: :attr:`OutcomeChoice.late`). Left open, where readers that reported before
and after may disagree: a worker paused longer than the hold between its check and its
write; a cancel whose object is created in the instant between its look (no record of
the input) and its create, as the input's burst lands; a takeover's large result (an
object of its own) after a late burst of the input's first claim.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

from runner import protocol

LEASE_WAIT_MAX = 5.0
"""Longest a waiting worker sleeps before it looks at storage again."""
SPAN_SECONDS = 2.0
"""Work a span holds at most, by the worker's measure of its inputs: a longer span
would make the batch's tail wait on one worker."""
FIRST_SPAN = 4
"""The first span of a worker (it knows nothing of its inputs' speed yet); each span it
finishes doubles the next one's limit."""
MAX_SPAN = 4096
BURST_MAX = 512
"""Outcomes in one burst at most."""
BURST_SECONDS = 1.0
"""A burst is written this long after its first outcome at the latest."""
LARGE_RESULT = 1 << 20
"""Payloads above this many bytes get an object of their own instead of a burst record."""
CLAIMS_PER_S = 400
"""Claims a second that a whole pool should create at most, and likewise bursts: a
bucket takes about 1,000 writes a second at first, and a 429 costs its worker a second
or more of back-off. A pool so large that :data:`SPAN_SECONDS` and
:data:`BURST_SECONDS` would ask more stretches both (:attr:`PoolOptions.span_seconds`,
:attr:`PoolOptions.burst_seconds`): 2.5 s at 1,000 workers, 25 s at 10,000."""


@dataclass(frozen=True)
class PoolOptions:
    """What the manifest says about running the batch.

    :ivar total: number of inputs.
    :ivar chunk_size: inputs per stored chunk.
    :ivar workers: pods in the pool (``max_concurrent``).
    :ivar retries: extra attempts of an input that failed (run by the same worker).
    :ivar fail_fast: stop the batch after the first final failure.
    :ivar cancel_running_on_fail: with ``fail_fast``, end the running inputs too.
    :ivar lease_s: seconds a claim holds without renewal.
    :ivar max_claims: claims of one input after which it is failed, not run again.
    :ivar reuse_process: run inputs in the worker's own process instead of a fork each.
    :ivar burst_max: outcomes per burst at most; :ivar burst_s: seconds a burst waits.
    :ivar span_s: seconds of work per span at most.
    :ivar claims_per_s: claims (and bursts) a second the whole pool aims to stay under
        (:data:`CLAIMS_PER_S`; a simulation that dilates time lowers it).
    """

    total: int
    chunk_size: int
    workers: int = 1
    retries: int = 0
    fail_fast: bool = False
    cancel_running_on_fail: bool = False
    lease_s: float = protocol.POOL_LEASE_SECONDS
    max_claims: int = 3
    reuse_process: bool = False
    burst_max: int = BURST_MAX
    burst_s: float = BURST_SECONDS
    span_s: float = SPAN_SECONDS
    claims_per_s: float = CLAIMS_PER_S

    @classmethod
    def from_manifest(cls, manifest: protocol.BatchManifest) -> PoolOptions:
        options = manifest["options"]
        retries = int(options["retries"])
        gke = manifest.get("gke")
        lease_s = gke.get("lease_s") if gke is not None else None
        max_claims = gke.get("max_claims") if gke is not None else None
        reuse = gke.get("reuse_process") if gke is not None else None
        return cls(
            total=int(manifest["total"]),
            chunk_size=max(1, int(manifest["chunk_size"])),
            workers=max(1, int(options["max_concurrent"])),
            retries=retries,
            fail_fast=bool(options["fail_fast"]),
            cancel_running_on_fail=bool(options["cancel_running_on_fail"]),
            lease_s=float(lease_s or protocol.POOL_LEASE_SECONDS),
            max_claims=int(max_claims or retries + 1 + protocol.POOL_MAX_CLAIMS_EXTRA),
            reuse_process=bool(reuse),
        )

    @property
    def span_seconds(self) -> float:
        """Work a span holds at most: :attr:`span_s`, longer in a pool so large that its
        spans would ask more than :attr:`claims_per_s` claims a second."""
        return max(self.span_s, self.workers / self.claims_per_s)

    @property
    def burst_seconds(self) -> float:
        """How long a burst waits at most: :attr:`burst_s`, longer in a pool so large
        that its bursts would be more than :attr:`claims_per_s` writes a second."""
        return max(self.burst_s, self.workers / self.claims_per_s)

    @property
    def large(self) -> bool:
        """A pool whose write rate binds: first spans are a share of their region, not
        :data:`FIRST_SPAN` (a thousand workers claiming again after 4 quick inputs would
        all meet the bucket's limit at once)."""
        return self.workers / self.claims_per_s > self.span_s

    @property
    def regions(self) -> int:
        return max(1, min(self.workers, self.total))

    def region(self, r: int) -> tuple[int, int]:
        """Inputs ``[lo, hi)`` of region ``r``."""
        n, total = self.regions, self.total
        return r * total // n, (r + 1) * total // n

    def region_of(self, index: int) -> int:
        """The region input ``index`` lies in."""
        # Inline arithmetic: an idle worker's look asks this a few thousand times.
        n, total = self.regions, self.total
        r = min(n - 1, index * n // max(1, total))
        while r * total // n > index:  # integer rounding: at most one step either way
            r -= 1
        while (r + 1) * total // n <= index:
            r += 1
        return r


@dataclass(frozen=True)
class Span:
    """Claim ``number`` (0 first) of the span ``[start, end)``: ``worker`` runs its
    inputs from ``first`` on, and holds it until ``expires`` (wall clock); ``tries``
    claims, this one included, ran input ``first`` (a takeover counts the claims
    whose workers died on it). ``reach``: where the span's link of its region's chain
    ends, when a takeover cut it (``end < reach``: the rest is a hole, claimed in
    ``slot`` s of that many inputs), else None."""

    start: int
    number: int
    worker: str
    expires: float
    end: int
    first: int
    tries: int = 1
    reach: int | None = None
    slot: int = 0

    @property
    def link_end(self) -> int:
        """Where the next span of the region's chain starts."""
        return self.end if self.reach is None else self.reach


class Intervals:
    """A set of inputs kept as sorted, disjoint half-open ranges (spans and bursts are
    ranges: a batch of 100k inputs is a few thousand of them, not 100k numbers)."""

    def __init__(self) -> None:
        self._lo: list[int] = []
        self._hi: list[int] = []
        self.count = 0

    def add(self, lo: int, hi: int) -> int:
        """Add ``[lo, hi)``; how many inputs were new."""
        if lo >= hi:
            return 0
        i = bisect.bisect_left(self._hi, lo)  # first range that ends at or after lo
        j = bisect.bisect_right(self._lo, hi)  # ranges from i to j-1 touch [lo, hi)
        if i < j:
            merged = sum(self._hi[k] - self._lo[k] for k in range(i, j))
            lo, hi = min(lo, self._lo[i]), max(hi, self._hi[j - 1])
        else:
            merged = 0
        self._lo[i:j] = [lo]
        self._hi[i:j] = [hi]
        added = hi - lo - merged
        self.count += added
        return added

    def __contains__(self, index: object) -> bool:
        if not isinstance(index, int):
            return False
        i = bisect.bisect_right(self._lo, index) - 1
        return i >= 0 and index < self._hi[i]

    def first_missing(self, lo: int, hi: int) -> int:
        """The lowest input of ``[lo, hi)`` not in the set, or ``hi``."""
        i = bisect.bisect_right(self._lo, lo) - 1
        if i >= 0 and lo < self._hi[i]:
            lo = self._hi[i]
        return min(lo, hi)

    def missing(self, lo: int, hi: int) -> int:
        """How many inputs of ``[lo, hi)`` are not in the set."""
        i = bisect.bisect_right(self._lo, lo) - 1
        i = max(i, 0)
        inside = 0
        while i < len(self._lo) and self._lo[i] < hi:
            inside += max(0, min(hi, self._hi[i]) - max(lo, self._lo[i]))
            i += 1
        return hi - lo - inside


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
        its claim 0 counts as a later claim (module docstring: "Which outcome stands").
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


# --- decisions --------------------------------------------------------------------


def span_size(
    options: PoolOptions,
    *,
    ramp: int,
    mean_s: float | None,
    free: int,
    region_left: int,
) -> int:
    """How many inputs a worker claims next (at least one).

    :param ramp: the worker's current limit (:data:`FIRST_SPAN`, doubled per span).
    :param mean_s: seconds the worker's inputs took on average, or None (none yet).
    :param free: inputs no claim covers, as far as the worker knows (whole batch).
    :param region_left: inputs left in the region the span would start in.

    In a :attr:`~PoolOptions.large` pool a worker's first span is its whole region: a
    thousand workers claiming again after a few quick inputs would all meet the
    bucket's write limit at once (and a 429 costs a worker a second or more).
    """
    if mean_s is None and options.large:
        return max(1, region_left)
    size = min(ramp, MAX_SPAN, region_left)
    if mean_s is not None and mean_s > 0:
        size = min(size, int(options.span_seconds / mean_s))
    # Guided self-scheduling: never more than a share of what is left, so the last
    # spans are short and every worker finishes near the same time.
    share = -(-free // (2 * options.workers))
    if options.large and mean_s is not None and mean_s > 0:
        # ... but in a large pool not so short that the spans left would be claimed
        # faster than its claim rate: ``free / size`` claims in ``size * mean_s`` s.
        share = max(share, math.ceil(math.sqrt(free / (options.claims_per_s * mean_s))))
    size = min(size, share)
    return max(1, min(size, region_left))


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


def take_over(span: Span, first: int, worker: str, expires: float, end: int | None = None) -> Span:
    """Claim ``number + 1`` of an expired claim's span, from ``first`` (its first input
    without an outcome). Its ``tries``: when the dead worker died on its own first
    input, one more than its; else two (that worker ran ``first`` too: a takeover
    writes its first outcome at once, so it died on a later one — claim 0 maybe on an
    earlier one, counted all the same).

    :param end: run only ``[first, end)``, leaving the rest of the span a hole that
        others claim (module docstring); ignored unless the claim was never cut.
    """
    tries = span.tries + 1 if first == span.first else 2
    if end is None or span.reach is not None or not first < end < span.end:
        return replace(
            span, number=span.number + 1, worker=worker, expires=expires, first=first, tries=tries
        )
    return Span(
        span.start, span.number + 1, worker, expires, end, first, tries, span.end, end - first
    )


def claim_record(span: Span, *, taken_by: str | None = None) -> bytes:
    """The bytes of a claim object (``taken_by``: ended by that worker's takeover)."""
    record: protocol.ClaimRecord = {
        "worker": span.worker,
        "expires": span.expires,
        "end": span.end,
        "first": span.first,
        "tries": span.tries,
    }
    if span.reach is not None:
        record["reach"] = span.reach
        record["slot"] = span.slot
    if taken_by is not None:
        record["taken_by"] = taken_by
    return protocol.dump_json(record)


def parse_claim(start: int, number: int, data: bytes) -> Span | None:
    """A claim from its object's bytes, or None when they are not a claim (writes are
    atomic: such an object is not ours, and is never trusted). A per-input claim
    (batches recorded before spans) is a span of one input."""
    try:
        record = protocol.load_json(data)
        end = int(record.get("end", start + 1))
        first = int(record.get("first", start))
        tries = int(record.get("tries", number + 1))
        reach = record.get("reach")
        reach = None if reach is None or int(reach) <= end else int(reach)
        slot = max(1, int(record.get("slot", 1))) if reach is not None else 0
        worker, expires = str(record["worker"]), float(record["expires"])
        if not start <= first < end:  # no span of ours: walking it would go nowhere
            return None
        return Span(start, number, worker, expires, end, first, tries, reach, slot)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


# --- which outcome of an input stands (module docstring) -----------------------------

Rank = tuple[int, int, int, str]
"""Of two durable records of one input, the one of the lower rank stands."""
OWN_OUTCOME: Rank = (0, 0, 0, "")
"""The rank of an input's outcome object of its own: it stands over every burst."""

V = TypeVar("V")


def outcome_rank(burst: str) -> Rank:
    """The rank of a record in the burst named ``burst`` (relative to the bursts prefix):
    the earliest claim's stands — the lowest claim start, then claim number, then name.

    :raises ValueError: ``burst`` is not a burst's name.
    """
    parsed = protocol.parse_burst_name(burst)
    if parsed is None:
        raise ValueError(f"not a burst's name: {burst!r}")
    return (1, parsed[2], parsed[3], burst)


class OutcomeChoice(Generic[V]):
    """Which durable record of each input a reader reports, and when (module docstring:
    "Which outcome of an input stands"). Pure: times are a monotonic clock's, passed in.

    :param hold: seconds a record of a later claim waits after its burst was first listed.
    """

    def __init__(self, hold: float) -> None:
        self.hold = hold
        self.reported: dict[int, Rank] = {}
        """The rank of the record reported of each input (never changed)."""
        self.late = 0
        """Records that would have stood over one reported before (see the docstring)."""
        self._held: dict[int, tuple[Rank, float, V]] = {}  # index -> rank, seen, value

    def offer(self, index: int, rank: Rank, value: V, *, first: bool, seen: float) -> None:
        """A durable record of input ``index``, of ``rank`` (:data:`OWN_OUTCOME` or
        :func:`outcome_rank`). ``first``: it is of the input's first claim
        (:meth:`PoolBook.first_claim`); ``seen``: when its burst was first listed."""
        reported = self.reported.get(index)
        if reported is not None:
            if rank < reported:
                self.late += 1
            return
        held = self._held.get(index)
        if held is not None and held[0] <= rank:
            return
        self._held[index] = (rank, float("-inf") if first or rank == OWN_OUTCOME else seen, value)

    def known(self, index: int) -> bool:
        """Whether a record of the input is known (reported, or held)."""
        return index in self.reported or index in self._held

    def release(self, now: float) -> list[tuple[int, V]]:
        """The records to report now (each input once, ever), by input."""
        due = sorted(i for i, (_, seen, _) in self._held.items() if seen + self.hold <= now)
        out = []
        for index in due:
            rank, _, value = self._held.pop(index)
            self.reported[index] = rank
            out.append((index, value))
        return out

    @property
    def held(self) -> int:
        """Records known but not reported yet."""
        return len(self._held)

    def next_due(self) -> float | None:
        """When the next held record is reported, or None when none is held."""
        return min((seen + self.hold for _, seen, _ in self._held.values()), default=None)

    def forget_held(self, index: int) -> None:
        """Drop the held record of ``index`` (one that stands over it is on its way)."""
        self._held.pop(index, None)
