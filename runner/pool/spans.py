"""Claims of spans of inputs: what a claim says, its bytes, its takeover; and the sets of
inputs (ranges) a book keeps. Pure, standard library only.

The protocol as a whole is told in ``docs/pool-protocol.md`` ("Spans, regions and
holes" tells what follows in short).

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

Span sizes adapt (:func:`runner.pool.options.span_size`): short while inputs are slow or few remain, long
while they are fast, so the tail does not wait on one worker.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace

from runner import protocol


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
