"""How a worker with no span left finds work. Pure: the part of
:class:`runner.pool.machine.WorkerMachine` that claims spans and takes them over.

A worker claims the next span of the region it works in (create-if-absent; a lost race
reads the winner's claim and tries after it); once the region is exhausted, it lists
the claims and moves to the region with the most left (work stealing), walking that
region's chain of spans to its end, and reads the claim where the chain ends before it
creates one there (the chain's holder has mostly claimed it already). With none left
it looks (lists bursts, outcomes and claims), reads a few claims that may have expired
and takes one over from its first input without an outcome (or fails that input once
it had ``max_claims`` claims; a takeover that cuts a long span announces its hole in
``holes/``; a takeover first replaces the expired claim, at the generation read after
its lease ended, so that of it and a late renewal exactly one wins), else sleeps until
a lease may end, rationed. In a large pool it looks first after a spread wait
(:data:`~runner.pool.limits.FIRST_LOOK_READS`), and between two such full looks only at
the holes, and joins one (:data:`~runner.pool.limits.QUICK_VISITS`). Where the worker
stands is its :class:`Phase`; see ``docs/pool-protocol.md`` ("Looking for work").
"""

from __future__ import annotations

from dataclasses import replace

from runner.pool.book import PoolBook, pick_region
from runner.pool.holding import Holding
from runner.pool.limits import (
    FIRST_LOOK_READS,
    HOLE_SLOTS,
    PAGE,
    QUICK_SAMPLE,
    QUICK_VISITS,
    SAMPLE,
    WALK_READS,
)
from runner.pool.names import PoolNames
from runner.pool.ops import Create, Exit, List, Op, Read, Replace, Sleep
from runner.pool.options import MAX_SPAN, PoolOptions, span_size
from runner.pool.phases import Phase
from runner.pool.spans import Span, claim_record, parse_claim, take_over


class Search:
    """One worker's search for work (see the module docstring).

    :param holding: the worker's span and pace (its ramp and mean input time size the
        spans it claims); :param queue: the machine's operations to hand out first;
        :param generations: the claims' generations as last read or written (shared:
        :class:`~runner.pool.holding.Holding`); the rest as
        :class:`~runner.pool.machine.WorkerMachine`'s.
    """

    def __init__(
        self,
        options: PoolOptions,
        book: PoolBook,
        names: PoolNames,
        holding: Holding,
        queue: list[Op],
        generations: dict[tuple[int, int], int],
        *,
        idle_first: float,
        wait_max: float,
        idle_reads_per_s: float,
        ordinal: int | None,
    ) -> None:
        self.options, self.book, self.names, self.holding = options, book, names, holding
        self.worker = holding.worker
        self.queue, self.generations = queue, generations
        self.idle_first, self.wait_max = idle_first, wait_max
        self.idle_reads_per_s = idle_reads_per_s
        self.ordinal = ordinal
        self.phase = Phase.UNLISTED
        self.region: int | None = None
        self.claiming: dict[str, Span] = {}  # claim keys being created -> their spans
        self.marking: dict[str, Span] = {}  # claims being marked taken -> the new claim
        self.took_from: dict[int, str] = {}  # span start -> the worker of its last claim
        self.settled = False  # every input has an outcome: seen, or announced in holes/
        self.settled_checked = False  # holes/ listed for that announcement, once seen
        self.seen: set[str] = set()  # names listed and learned from (listed())
        self.idle = idle_first  # the next sleep with nothing to do (doubles to wait_max)
        # -- the looks: their pace ---------------------------------------------------------
        self.looked = float("-inf")  # when this worker last listed everything (mono)
        self.look_reads = 0  # reads (listing pages included) since the last idle sleep
        self.full = False  # the look before the next idle sleep listed everything
        self.full_every = 0.0  # seconds from a full look to the next (a large pool's)
        # -- since the last sleep ----------------------------------------------------------
        self.sampled = True  # claims that may have expired read in this look
        self.hole: Span | None = None  # the hole a quick look joins
        self.visits = 0  # holes whose claims were listed
        # Claims listings by prefix -> the wall time each was sent (a hole's slots are
        # claimed after a listing of its claims: a quick look does not list them all).
        self.claims_walls: dict[str, float] = {}
        # Claims read -> the wall time their read was sent: the content is at least that
        # recent, and only a read sent after a lease ended can show that it ended (a read
        # from before a renewal cannot).
        self.fresh_reads: dict[tuple[int, int], float] = {}
        # Bursts listings by prefix -> the wall time each was sent: a span is taken over
        # only once a listing of its bursts sent after its lease ended shows inputs left
        # (its holder's last burst may postdate an older one).
        self.bursts_walls: dict[str, float] = {}
        self.taking: int | None = None  # the start of the expired span being taken over
        self.walk_reads = 0  # claims read to walk other regions
        self.walking: int | None = None  # the region whose chain is being walked
        # -- stealing: a claim of another's chain is read before it is created -----------
        self.won_end: int | None = None  # where this worker's own chain goes on
        self.absent: int | None = None  # the start whose claim a read just found missing

    # -- the step ------------------------------------------------------------------------

    def next(self, wall: float, mono: float, pick: float) -> Op:
        """The next operation of a worker with no span left."""
        book = self.book
        if self.settled:
            return Exit("done")
        if self.region is None and self.ordinal is not None:
            self.region = self.ordinal % self.options.regions
        if self.region is not None:
            op = self._next_in(self.region, wall, pick)
            if op is not None:
                return op
        if self.phase is Phase.RESTED:  # nothing was left to claim: the whole look at once
            return self._look(mono)
        if self.phase is Phase.UNLISTED:  # moving to another region: look where others are
            never_looked = self.looked == float("-inf")  # a quick look follows a full one
            if self.options.large and self.holding.mean_s is not None and never_looked:
                # A large pool runs out of work about together, and a first look costs a
                # dozen reads: spread over the seconds the pool's share of reads allows
                # (FIRST_LOOK_READS), or each would meet the bucket's read limit at once.
                self.phase = Phase.RESTED  # then the look, as after an idle sleep
                spread = self.options.workers * FIRST_LOOK_READS / self.idle_reads_per_s
                return Sleep(pick * min(self.wait_max, spread))
            self.phase = Phase.WALKING
            return List(self.names.claims)
        if self.phase is Phase.QUICK:
            op = (
                self._join_hole(wall, pick)
                or self._take_over_expired(wall, pick)
                or self._sample(wall, pick, QUICK_SAMPLE)
            )
            return op if op is not None else self._idle_sleep(wall, pick)
        # Walk one region's chain to its end before picking another (each step's pick
        # differs: a walk spread over many regions would end none).
        region = self.walking
        if region is None or book.free_estimate(region) <= 0:
            region = pick_region(book, pick, avoid=self.region)
        self.walking = None
        if region is not None:
            op = self._next_in(region, wall, pick)
            if op is not None:
                if isinstance(op, Read):
                    self.walking = region
                return op
        if self.phase is Phase.WALKING:
            return self._look(mono)
        if book.settled:  # Phase.LOOKED
            if not self.settled and self.options.large:
                # Tell the idle workers: their quick looks list only holes/ (a full look
                # comes every 15 s or so at 1,000 workers) — unless one did already: the
                # whole pool may run out of work together, and a listing is a read.
                if not self.settled_checked:
                    self.settled_checked = True
                    return List(self.names.holes)
                self.settled = True
                return Create(self.names.settled, b"")
            return Exit("done")
        op = self._take_over_expired(wall, pick) or self._sample(wall, pick, SAMPLE)
        return op if op is not None else self._idle_sleep(wall, pick)

    def _take_over_expired(self, wall: float, pick: float) -> Op | None:
        """Take over a claim whose lease ran out, if one is known (None: none is)."""
        # Take over only a claim whose read was sent after its lease ended (a read from
        # before may predate a renewal), and only once a listing of its bursts sent after
        # then shows inputs left (its holder's last burst may postdate an older one).
        fresh = self.fresh_reads
        expired = [
            s for s in self.book.expired(wall) if fresh.get((s.start, s.number), -1.0) >= s.expires
        ]
        taking = next((s for s in expired if s.start == self.taking), None)
        if taking is None and self.taking is not None and self.options.large:
            # Beaten to the span it picked: at a large pool's tail so are those who read
            # the other expired claims when it did, and each try is two listings.
            return None
        if expired:
            # The one picked first, until it is taken over (each step's pick differs: a
            # worker hopping between spans would list each one's bursts and claims).
            span = taking or expired[min(len(expired) - 1, int(pick * len(expired)))]
            self.taking = span.start
            # Idle workers that read the claim about when its lease ended all find it
            # expired, and at a large pool's tail that is dozens: a listing of the span's
            # claims sent since the read shows the takeover of those before (a read, where
            # a create that loses its race costs a write; the bucket takes five times
            # fewer writes, and a 429 stalls its worker a second or more). It comes
            # before the bursts listing: a span taken over already costs one read.
            claims = self.names.span_claims(span.start)
            if self.claims_walls.get(claims, -1.0) < fresh[(span.start, span.number)]:
                return List(claims)
            prefix = self.names.bursts_between(self.book.next_undone(span), span.end - 1)
            walls = self.bursts_walls
            if max(walls.get(prefix, -1.0), walls.get(self.names.bursts, -1.0)) < span.expires:
                return List(prefix)
            return self._take_over(span, wall)
        return None

    def _sample(self, wall: float, pick: float, count: int) -> Op | None:
        """Read ``count`` claims that may have expired, once a look (None: done)."""
        if self.sampled:
            return None
        self.sampled = True
        # Claims read before, whose lease has ended since, first: at a large batch's tail
        # a dead worker's is one among hundreds of suspects, most of them never read (a
        # worker's outcomes are known as of its last full look), and a sample at random
        # rarely meets it; those who read it before wake when its lease ends.
        fresh = self.fresh_reads
        lapsed = [
            s.start
            for s in self.book.expired(wall)
            if fresh.get((s.start, s.number), -1.0) < s.expires
        ]
        picked = _rotated(lapsed, pick)[:count]
        if len(picked) < count:
            chosen = set(picked)
            rest = [start for start in self.book.suspects(wall) if start not in chosen]
            picked += _rotated(rest, pick)[: count - len(picked)]
        if not picked:
            return None
        self.queue.extend(self._read_claim(start, self.book.listed[start]) for start in picked)
        return self.queue.pop(0)

    def _idle_sleep(self, wall: float, pick: float) -> Sleep:
        held = self.book.held(wall)
        soonest = min((s.expires for s in held), default=wall + self.wait_max)
        self.phase = Phase.RESTED  # after the sleep: look again
        self.hole, self.visits = None, 0
        self.fresh_reads.clear()
        self.bursts_walls.clear()
        self.claims_walls.clear()
        self.taking = None
        self.walk_reads = 0
        # Held spans end soon or never (their worker died: their lease tells when):
        # look again soon at first, then less and less often — but no more often than
        # the pool's share of reads allows (IDLE_READS_PER_S), spread by ``pick``.
        idle, self.idle = self.idle, min(self.wait_max, self.idle * 2)
        workers, reads = self.options.workers, self.look_reads
        if self.options.large:  # full looks and quick ones, half of the reads each
            rationed = workers * reads / (self.idle_reads_per_s / 2)
            if self.full:  # the next full look waits for the whole of this one's reads
                # ... spread, or the pool's full looks would keep the phase of its first
                # looks (a few seconds wide, every 20 s or so), and none might come for
                # 15 s after the last outcome to tell the idle workers (holes/settled).
                every = max(self.wait_max, rationed) * (0.5 + pick)
                self.full_every, rationed = every, 0.0
        else:
            rationed = workers * reads / self.idle_reads_per_s
        self.look_reads, self.full = 0, False
        rationed = min(rationed, self.wait_max) * (0.5 + pick)  # after the cap: spread
        return Sleep(max(0.05, rationed, min(idle, soonest - wall)))

    def _look(self, mono: float) -> Op:
        """List bursts and outcomes (which spans have inputs left; is everything done),
        then the claims (a burst written after the claims were listed is seen: it lies
        in a claimed span) — or, in a large pool after an idle sleep while the last such
        look is recent, only the cut takeovers (:data:`~runner.pool.limits.QUICK_VISITS`)."""
        self.sampled = False
        rested, self.phase = self.phase is Phase.RESTED, Phase.LOOKED
        if rested and mono - self.looked < self.full_every:
            self.phase = Phase.QUICK
            return List(self.names.holes)
        self.looked, self.full = mono, True
        self.queue.extend([List(self.names.results), List(self.names.claims)])
        return List(self.names.bursts)

    def _next_in(self, region: int, wall: float, pick: float) -> Op | None:
        """Claim the next span of ``region`` (reading the claim that ends its known
        chain first, when its end is unknown); None when the region is all claimed, or
        when another region's chain would need more reads than a look may spend
        (:data:`~runner.pool.limits.WALK_READS`)."""
        at, unknown, limit = self.book.frontier(region)
        if unknown is not None:
            # A hole (a dead worker's rest, limit < the region's end) is where the work
            # left is: walking its chain is not rationed.
            if region != self.region and limit == self.options.region(region)[1]:
                self.walk_reads += 1
                if self.walk_reads > max(SAMPLE, WALK_READS // self.options.workers):
                    return None
            return self._read_claim(unknown, self.book.listed[unknown])
        if at >= limit:
            return None
        if self.book.hole_slot(at) is not None:
            op = self._claim_slot(at, limit, wall, pick, rationed=False)
            if isinstance(op, Create):
                self.region = region
            return op
        self.region = region
        if self._steals(region, at):
            # Another worker's chain: its holder claims its next span while the span's
            # last inputs run, and a listing is soon stale, so a thief's create at the
            # chain's end mostly loses (at 300 workers, 1,789 of 1,846 did), each loss a
            # write at the tail's peak. A read (five times cheaper to the bucket) tells
            # first: the claim, then the walk goes on; none, then the create.
            return self._read_claim(at, 0)
        return self._fresh_claim(at, limit, wall, self.holding.ramp)

    def _steals(self, region: int, at: int) -> bool:
        """Whether claiming at ``at`` would extend a chain of others (not this worker's
        own, nor a region's start) that a read has not just found unclaimed there."""
        return at not in (self.won_end, self.absent, self.options.region(region)[0])

    def _claim_slot(
        self, at: int, limit: int, wall: float, pick: float, *, rationed: bool
    ) -> Op | None:
        """Claim a free slot of the hole ``[at, limit)``, picked at random so that the
        workers who join it do not all race for its first one — after a listing of the
        hole's claims, unless every claim was listed since the last sleep (a quick look
        lists none; ``rationed``: at most :data:`~runner.pool.limits.QUICK_VISITS` such listings a look).
        None when no slot is free, or the listing is past the ration."""
        walls = self.claims_walls
        prefix = self.names.claims_between(at, limit - 1)
        if self.names.claims not in walls and prefix not in walls:
            if rationed:
                if self.visits >= QUICK_VISITS:
                    return None
                self.visits += 1
            return List(prefix)
        slots = self.book.free_slots(at, limit)
        if not slots:
            return None
        lo, hi = slots[min(len(slots) - 1, int(pick * len(slots)))]
        return self._create_claim(Span(lo, 0, self.worker, wall + self.options.lease_s, hi, lo))

    def _join_hole(self, wall: float, pick: float) -> Op | None:
        """A quick look's step: claim a free slot of a hole not known to be full (its
        claims listed first, :meth:`_claim_slot`); None when there is none."""
        cut = self.hole
        if cut is None or not self.book.free_slots(cut.end, cut.link_end):
            holes = self.book.open_holes()
            if not holes:
                return None
            # The newest mostly (pick cubed: half the picks among the eighth newest): an
            # old hole is likely full by now (its slots claimed by others, unknown to
            # this worker until it lists them), and a quick look that lists a full hole's
            # claims joins none. Not the newest alone: its slots would be fought over.
            self.hole = cut = holes[min(len(holes) - 1, int(pick**3 * len(holes)))]
        return self._claim_slot(cut.end, cut.link_end, wall, pick, rationed=True)

    def _take_over(self, span: Span, wall: float) -> Op:
        """Take over ``span`` from its first input without an outcome — only a part of
        it, sized as a fresh span would be, when the rest is long: others claim that."""
        first = self.book.next_undone(span)
        self.took_from[span.start] = span.worker
        size = span_size(
            self.options,
            ramp=MAX_SPAN,  # the hole's slots are this size: not this worker's ramp
            mean_s=self.holding.mean_s,
            free=self.book.free_total() + span.end - first,
            region_left=span.end - first,
        )
        if self.options.large:  # the rest shared by HOLE_SLOTS idle workers at least
            size = min(size, -(-(span.end - first) // HOLE_SLOTS))
        claim = take_over(span, first, self.worker, wall + self.options.lease_s, first + size)
        # The fence: the claim taken over is first replaced, at the generation read after
        # its lease ended, by itself ended now. Its holder's renewal, if late, then fails
        # (it drops the span); if the renewal landed first, this replace fails instead and
        # the span is left to its holder. Only then is the takeover's claim created.
        key = self.names.claim(span.start, span.number)
        self.marking[key] = claim
        ended = claim_record(replace(span, expires=wall), taken_by=self.worker)
        return Replace(key, ended, self.generations[(span.start, span.number)])

    def claim_ahead(self, wall: float) -> Create | None:
        """The claim of the next span of this worker's region, when the region's chain
        is known to its end and has inputs left (no read needed); None otherwise. Asked
        while the held span's last inputs run (:meth:`Holding.ahead_due`)."""
        region = self.region
        if region is None:
            return None
        at, unknown, limit = self.book.frontier(region)
        if unknown is not None or at >= limit or self.book.hole_slot(at) is not None:
            return None
        return self._fresh_claim(at, limit, wall, self.holding.next_ramp)

    def _fresh_claim(self, at: int, limit: int, wall: float, ramp: int) -> Create:
        """The claim of a fresh span at ``at`` (inputs up to ``limit`` free), sized by
        :func:`~runner.pool.options.span_size` for ``ramp`` and this worker's pace."""
        size = span_size(
            self.options,
            ramp=ramp,
            mean_s=self.holding.mean_s,
            free=self.book.free_total(),
            region_left=limit - at,
        )
        return self._create_claim(
            Span(at, 0, self.worker, wall + self.options.lease_s, at + size, at)
        )

    def _create_claim(self, span: Span) -> Create:
        key = self.names.claim(span.start, span.number)
        self.claiming[key] = span
        return Create(key, claim_record(span))

    def _read_claim(self, start: int, number: int) -> Read:
        return Read(self.names.claim(start, number))

    # -- answers --------------------------------------------------------------------------

    def listed(self, prefix: str, keys: list[str], sent: float) -> None:
        """Learn what a listing of ``prefix`` sent at wall time ``sent`` returned."""
        self.look_reads += 1 + len(keys) // PAGE
        book, names = self.book, self.names
        # A full look lists thousands of names, nearly all known from the last one: only
        # the new ones are parsed (a simulation steps a thousand workers in one process).
        keys = [key for key in keys if key not in self.seen]
        if prefix.startswith(names.claims):
            self.claims_walls[prefix] = sent
            for start, number in names.claims_in(keys):
                book.learn_listed(start, number)
        elif prefix.startswith(names.bursts):
            self.bursts_walls[prefix] = sent
            for first, end in names.bursts_in(keys):
                book.learn_burst(first, end)
        elif prefix == names.holes:
            if names.settled in keys:
                self.settled = True  # every input has an outcome
            for hole in names.holes_in(keys):
                book.learn_cut(*hole)
        elif prefix == names.results:
            for index in names.outcomes_in(keys):
                book.learn_single(index)
        self.seen.update(keys)  # the book only grows: a name once learned teaches nothing new

    def read(self, key: str, data: bytes | None, generation: int | None, sent: float) -> None:
        """Learn the claim at ``key``, read at wall time ``sent``: its bytes and
        generation, or None (both) when it is missing (a steal's read found the place
        unclaimed, or the batch is gone)."""
        parsed = self.names.parse_claim(key)
        if parsed is not None and data is None and parsed[1] == 0:
            self.absent = parsed[0]  # unclaimed when read: the create follows
        if parsed is not None and data is not None:
            span = parse_claim(*parsed, data)
            if span is not None:
                self.book.learn_span(span)
                self.fresh_reads[parsed] = sent
                if generation is not None:
                    self.generations[parsed] = generation

    def created(self, key: str, generation: int | None) -> Span | None:
        """The answer to a create: the span this worker won, if ``key`` was a claim it
        won (None otherwise)."""
        span = self.claiming.pop(key, None)
        if span is None:
            return None
        self.absent = None
        if generation is None:
            self.book.learn_listed(span.start, span.number)
            if span.number == 0 and self.book.hole_slot(span.start) is not None:
                # A hole's slot: its extent is known, and its holder's lease is fresh, so
                # its claim is not read. Others are joining the hole: its claims are
                # listed again before this worker claims another slot (a listing is a
                # read; a create that loses is a write, five times as dear).
                self.claims_walls.clear()
            else:
                self.queue.append(self._read_claim(span.start, span.number))
            return None
        self.generations[(span.start, span.number)] = generation
        self.won_end = span.end
        if span.number > 0 and span.reach is not None:  # a cut: announce the hole
            self.queue.append(Create(self.names.hole(span), b""))
        self.taking = None
        self.idle = self.idle_first
        self.book.learn_span(span)
        self.region = self.options.region_of(span.start)
        # A dead worker's rest (a takeover, a hole's slot) is a large batch's tail: once
        # it is done, the next look is as after an idle sleep (a quick one while the last
        # full look is recent), not every name listed again and a walk — hundreds of
        # workers finish such a slot each second.
        rest = span.number > 0 or self.book.hole_slot(span.start) is not None
        self.phase = Phase.RESTED if self.options.large and rest else Phase.UNLISTED
        self.claims_walls.clear()  # its next slot in a hole: list the hole again
        return span

    def replaced(self, key: str, generation: int | None) -> bool:
        """The answer to a replace: whether it was a takeover's fence (else a renewal)."""
        claim = self.marking.pop(key, None)
        if claim is None:
            return False
        if generation is None:  # renewed (or taken) since it was read: read it again
            self.taking = None
            parsed = self.names.parse_claim(key)
            assert parsed is not None
            self.fresh_reads.pop(parsed, None)
            self.queue.append(self._read_claim(*parsed))
        else:
            self.generations[(claim.start, claim.number - 1)] = generation
            self.queue.append(self._create_claim(claim))
        return True


def _rotated(items: list[int], pick: float) -> list[int]:
    """``items`` from the one ``pick`` (in [0, 1)) points at, wrapping around."""
    at = int(pick * len(items))
    return items[at:] + items[:at]
