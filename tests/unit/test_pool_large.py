"""A pool so large that the bucket's write and read rates bind (runner.pool.options,
runner.pool.search): its timers stretch with its size, its first span is its region,
its last spans are bounded by its claim rate, its bursts are spread, and its idle workers walk other regions' chains a few claims a look. Pure: the
machines over the in-memory store of tests/unit/pool_driver.py, no loop, no IO."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable

import pytest

from runner import protocol
from runner.pool.limits import (
    FIRST_LOOK_READS,
    HOLE_SLOTS,
    IDLE_READS_PER_S,
    PAGE,
    QUICK_SAMPLE,
    SAMPLE,
    WALK_READS,
)
from runner.pool.machine import WorkerMachine
from runner.pool.ops import Create, Exit, List, Read, Run, Sleep
from runner.pool.options import CLAIMS_PER_S, FIRST_SPAN, LEASE_WAIT_MAX, PoolOptions, span_size
from runner.pool.spans import parse_claim
from tests.unit.pool_driver import GID, answer, ok, running

WALL = 1_000_000.0


def opts(workers: int, total: int = 100_000) -> PoolOptions:
    return PoolOptions(total=total, chunk_size=1000, workers=workers, lease_s=30.0)


def test_a_pool_stretches_spans_and_bursts_only_when_its_writes_would_bind() -> None:
    small, large = opts(100), opts(1000)
    assert not small.large
    assert small.span_seconds == small.span_s
    assert small.burst_seconds == small.burst_s
    assert large.large
    # 1,000 workers: each claim and each burst every 2.5 s is 400 a second for the pool.
    assert large.span_seconds == large.burst_seconds == 1000 / CLAIMS_PER_S
    assert opts(10_000).span_seconds == 25.0


def test_a_pools_first_claims_are_spread_over_its_claim_rate() -> None:
    # Workers that start together would create their first claims in the same tenth of
    # a second: past 80 workers each waits its share of workers / (2 x CLAIMS_PER_S).
    def first_ops(workers: int, pick: float, ordinal: int | None = None) -> list[object]:
        machine = WorkerMachine(opts(workers), GID, "w", ordinal=ordinal)
        op = machine.next(wall=WALL, mono=0.0, pick=pick)
        assert isinstance(op, Read)  # the stop record
        machine.read(op.key, None, None)
        return [op, machine.next(wall=WALL, mono=0.0, pick=pick)]

    assert first_ops(1000, 0.5)[1] == Sleep(0.5 * 1000 / (2 * CLAIMS_PER_S))
    assert first_ops(300, 0.5)[1] == Sleep(0.5 * 300 / (2 * CLAIMS_PER_S))
    assert isinstance(first_ops(1000, 0.0, ordinal=0)[1], Create)
    assert isinstance(first_ops(80, 0.9, ordinal=79)[1], Create)  # a small pool: at once
    # An Indexed Job's worker k waits (k + pick) / workers of it: the pool's first
    # requests come evenly paced, not in the clumps of a random pick.
    assert first_ops(1000, 0.5, ordinal=400)[1] == Sleep(400.5 / (2 * CLAIMS_PER_S))
    waits = [first_ops(300, 0.5, ordinal=k)[1] for k in range(300)]
    assert all(isinstance(w, Sleep) for w in waits[1:])
    gaps = {round(b.seconds - a.seconds, 9) for a, b in itertools.pairwise(waits)}
    assert gaps == {round(1 / (2 * CLAIMS_PER_S), 9)}


def test_a_spread_pools_first_span_keeps_its_second_claims_out_of_the_first_wave() -> None:
    # Four quick inputs after its first claim a worker would claim again and write its
    # first burst, within the wave of the first claims: a pool whose start is spread
    # starts with spans four times as long.
    def first_span(workers: int) -> int:
        machine = WorkerMachine(opts(workers), GID, "w", ordinal=0, spread_start=False)
        op = machine.next(wall=WALL, mono=0.0, pick=0.5)
        machine.read(op.key, None, None)  # the stop record
        claim = machine.next(wall=WALL, mono=0.0, pick=0.5)
        assert isinstance(claim, Create)
        span = parse_claim(0, 0, claim.data)
        assert span is not None
        return span.end

    assert first_span(80) == FIRST_SPAN
    assert first_span(300) == 4 * FIRST_SPAN


def test_a_pod_that_knows_its_pools_size_spreads_its_start_before_reading_the_batch() -> None:
    # The Job tells its pods the pool's size, so a worker can wait its share of the
    # start spread before its first read: a thousand manifest reads at once met the
    # bucket's read limit. The wait is the machine's, from the size alone.
    sized = PoolOptions.of_pool_size(1000)
    assert sized.start_wait(999, 0.99) == opts(1000).start_wait(999, 0.99)
    assert sized.start_wait(999, 0.99) < 1000 / (2 * CLAIMS_PER_S)
    assert PoolOptions.of_pool_size(80).start_wait(79, 0.99) == 0.0


def test_a_worker_reads_its_pools_size_from_the_jobs_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from runner.pool.pod_env import POOL_WORKERS_ENV, pool_workers

    monkeypatch.setenv(POOL_WORKERS_ENV, "1000")
    assert pool_workers() == 1000
    for value in ("", "0", "x"):  # a Job written before it was set, or nonsense
        monkeypatch.setenv(POOL_WORKERS_ENV, value)
        assert pool_workers() is None


def test_a_large_pools_first_span_is_its_whole_region() -> None:
    # A thousand workers claiming again after a few inputs would meet the bucket's write
    # limit at once: each claims its region (an Indexed Job gives each one of its own).
    first = span_size(opts(1000), ramp=FIRST_SPAN, mean_s=None, free=100_000, region_left=100)
    assert first == 100
    # Once the speed is known, the span holds span_seconds of work (the ramp allowing).
    assert span_size(opts(1000), ramp=4096, mean_s=0.05, free=100_000, region_left=400) == 50
    # A small pool still starts with FIRST_SPAN inputs.
    small = span_size(opts(100), ramp=FIRST_SPAN, mean_s=None, free=100_000, region_left=1000)
    assert small == FIRST_SPAN


def test_a_large_pools_last_spans_stay_long_enough_for_its_claim_rate() -> None:
    # 7,500 inputs of 50 ms left to 1,000 workers: the guided share (4) would be 1,875
    # claims in 0.2 s; a span of sqrt(7,500 / (400 x 0.05)) = 20 keeps them near 400/s.
    size = span_size(opts(1000), ramp=4096, mean_s=0.05, free=7_500, region_left=100)
    assert size == 20
    assert (7_500 / size) / (size * 0.05) <= CLAIMS_PER_S
    # The last few inputs still go one by one, and a small pool keeps the guided share.
    assert span_size(opts(1000), ramp=4096, mean_s=0.05, free=10, region_left=10) == 1
    assert span_size(opts(100), ramp=4096, mean_s=0.05, free=7_500, region_left=100) == 38


def test_a_pools_bursts_are_due_at_spread_times() -> None:
    # A pool's workers start together: bursts due burst_seconds after each one's first
    # outcome would all be written in the same instant, past the bucket's write limit
    # (at 100 workers as at 1,000).
    def due_after(workers: int, pick: float) -> float:
        machine = WorkerMachine(opts(workers), GID, "w", spread_start=False)
        machine, op = running(machine, WALL, pick)
        machine.ran(op.index, *ok(op.index))
        machine.next(wall=WALL, mono=0.0, pick=pick)  # the buffer's clock starts here
        assert machine.buffer is not None
        return machine.buffer.wait

    for workers in (100, 1000):
        burst_s = opts(workers).burst_seconds
        assert due_after(workers, 0.0) == 0.75 * burst_s
        assert due_after(workers, 0.999) > 1.24 * burst_s


def test_idle_workers_of_a_large_pool_read_few_claims_a_look() -> None:
    """At the tail every region's chain ends in a span whose end only its claim tells: a
    worker reads WALK_READS / workers of them a look (at least SAMPLE), then sleeps."""
    workers = 2000
    machine = WorkerMachine(opts(workers, total=4000), GID, "w", spread_start=False)
    prefix = protocol.group_claims_prefix(GID)
    # Every region has one span listed, of unknown end (its claim was never read).
    names = [f"{prefix}{start:07d}.000" for start in range(0, 4000, 2)]
    reads: Counter[str] = Counter()
    lists = 0
    for _ in range(200):
        op = machine.next(wall=WALL, mono=0.0, pick=0.5)
        if isinstance(op, Sleep):
            break
        if isinstance(op, List):
            listed = names if op.prefix == prefix else []
            lists += 1 + len(listed) // PAGE
            machine.listed(op.prefix, listed)
        elif isinstance(op, Read):
            reads[op.key.split("/")[-2]] += 1
            machine.read(op.key, None, None)  # unread as far as the worker is concerned
        elif isinstance(op, Create):
            machine.created(op.key, None)
    else:
        raise AssertionError("the worker never slept")
    assert reads["claims"] <= max(SAMPLE, WALK_READS // workers) + SAMPLE  # walks + samples
    # ... and looks that way again only when the pool's share of reads allows: 2,000
    # idle workers looking like this one make at most half of IDLE_READS_PER_S reads a
    # second. In between, quick looks: the holes' names and a claim read, also rationed.
    looked = sum(reads.values()) + lists
    budget = IDLE_READS_PER_S / 2
    mono = op.seconds
    for _ in range(200):
        quick = sampled = 0
        while not isinstance(op := machine.next(wall=WALL, mono=mono, pick=0.5), Sleep):
            if isinstance(op, List):
                if op.prefix != protocol.group_holes_prefix(GID):
                    assert mono >= workers * looked / budget  # the next full look
                    return
                machine.listed(op.prefix, [])
            else:
                assert isinstance(op, Read)
                machine.read(op.key, None, None)
                sampled += op.key.startswith(protocol.group_claims_prefix(GID))
            quick += 1
        assert sampled <= QUICK_SAMPLE  # besides the holes' names and the stop record
        assert op.seconds >= min(workers * quick / budget, LEASE_WAIT_MAX) - 1e-9
        mono += op.seconds
    raise AssertionError("no full look again")


def test_a_large_pools_full_looks_come_at_spread_times() -> None:
    """Full looks come about once per the pool's share of reads, each period spread
    from a half to one and a half: the pool's first looks fall within a few seconds,
    and with a fixed period its full looks would stay in that phase, none of them for
    15 s or so after the last outcome (the one that sees it tells the idle workers)."""

    def next_full_look(pick: float) -> float:
        tail = Tail()
        _, sleep = tail.until_sleep(pick=pick)  # a full look
        tail.mono += sleep.seconds
        for _ in range(1_000):
            ops, sleep = tail.until_sleep(pick=0.5)
            if tail.bursts in [o.prefix for o in ops if isinstance(o, List)]:
                return tail.mono
            tail.mono += sleep.seconds
        raise AssertionError("no full look again")

    early, late = next_full_look(0.0), next_full_look(0.99)
    assert early >= LEASE_WAIT_MAX / 2
    assert late > 1.5 * early


class Tail:
    """A large pool's tail, as one idle worker sees it: worker a holds region 0 (inputs
    [0, 4)); every other region ran and is done."""

    def __init__(self, region: int = 4) -> None:
        from runner.pool.spans import Span, claim_record

        self.total = 1000 * region  # regions of ``region`` inputs
        self.claims = protocol.group_claims_prefix(GID)
        self.bursts = protocol.group_bursts_prefix(GID)
        self.store: dict[str, bytes] = {}
        held = Span(0, 0, "a", WALL + 30, region, 0)
        self.store[self.claims + "0000000.000"] = claim_record(held)
        for start in range(region, self.total, region):
            done = Span(start, 0, "o", WALL - 9, start + region, start)
            self.store[self.claims + f"{start:07d}.000"] = claim_record(done)
        self.store[self.bursts + protocol.burst_name(region, self.total, region, 0)] = b""
        self.machine = WorkerMachine(opts(1000, self.total), GID, "w", spread_start=False)
        self.wall, self.mono = WALL, 0.0

    def cut(self, start: int, at: float = WALL + 30) -> None:
        """The region's worker died; x took its span over, runs ``[start, start + 1)``
        and leaves the rest of the region a hole in slots of one, announced in
        ``holes/`` (its first lease ending ``at``)."""
        from runner.pool.spans import Span, claim_record

        taken = Span(start, 1, "x", at, start + 1, start, 2, start + 4, 1)
        self.store[self.claims + f"{start:07d}.001"] = claim_record(taken)
        name = protocol.hole_name(start, 1, start + 1, start + 4, 1, at)
        self.store[protocol.group_holes_prefix(GID) + name] = b""

    def two_dead(self) -> None:
        """Worker b holds region 1 too; a full look reads both claims; then a and b die
        (their leases run out), past the time of this worker's next full look."""
        from runner.pool.spans import Span, claim_record

        self.store.pop(self.bursts + protocol.burst_name(4, self.total, 4, 0))
        self.store[self.bursts + protocol.burst_name(8, self.total, 8, 0)] = b""
        held = Span(4, 0, "b", WALL + 30, 8, 4)
        self.store[self.claims + "0000004.000"] = claim_record(held)
        _, sleep = self.until_sleep()  # a full look: a's and b's spans hold
        self.mono += 10 * sleep.seconds + 1_000
        self.wall += 31

    def until_sleep(
        self, before: Callable[[object], None] | None = None, pick: float = 0.5
    ) -> tuple[list[object], Sleep]:
        """Step the worker until it sleeps (or wins a claim: Sleep(0)); ``before`` sees
        each storage operation before it is answered (another worker's doing)."""
        ops, last = self.until_rest(before, pick)
        assert isinstance(last, Sleep), last
        return ops, last

    def until_rest(
        self, before: Callable[[object], None] | None = None, pick: float = 0.5
    ) -> tuple[list[object], Sleep | Exit]:
        """:meth:`until_sleep`, or until the worker exits."""
        machine, store, ops = self.machine, self.store, []
        for _ in range(100):
            op = machine.next(wall=self.wall, mono=self.mono, pick=pick)
            if isinstance(op, (Sleep, Exit)):
                return ops, op
            ops.append(op)
            if before is not None:
                before(op)
            if not answer(machine, store, op):
                raise TypeError(op)
            if machine.span is not None:  # it won a claim
                return ops, Sleep(0.0)
        raise AssertionError("the worker never slept")


def test_idle_workers_of_a_large_pool_join_a_hole_from_a_quick_look() -> None:
    """Between two full looks (every claim, burst and outcome listed) an idle worker of
    a large pool lists only the holes' names, then the claims of one hole, and claims
    one of its free slots: two reads, not a full look's pages."""
    tail = Tail()
    claims = tail.claims
    ops, sleep = tail.until_sleep()  # a full look: nothing to do, worker a's span holds
    assert {o.prefix for o in ops if isinstance(o, List)} >= {claims, tail.bursts}
    tail.cut(0)  # a dies; x takes its span over, runs [0, 1), leaves [1, 4) in slots of one
    tail.mono += sleep.seconds
    ops, _ = tail.until_sleep()
    lists = [o.prefix for o in ops if isinstance(o, List)]
    assert lists == [protocol.group_holes_prefix(GID), claims + "000000"]
    assert not [o for o in ops if isinstance(o, Read) and o.key.startswith(claims)]
    created = [o.key.removeprefix(claims) for o in ops if isinstance(o, Create)]
    assert created
    assert created[-1] in {"0000001.000", "0000002.000", "0000003.000"}
    machine = tail.machine
    assert machine.span is not None
    assert machine.span.end == machine.span.start + 1


def test_a_worker_done_with_a_holes_slot_looks_quickly_again() -> None:
    """At a large batch's tail hundreds of workers finish a slot of a dead worker's rest
    each second: the next look of each is a quick one (the holes' names), as after an
    idle sleep, while its last full look is recent, not every name listed again."""
    tail = Tail()
    _, sleep = tail.until_sleep()  # a full look: worker a's span holds
    tail.cut(0)  # a dies; x takes its span over and leaves [1, 4) in slots of one
    tail.mono += sleep.seconds
    tail.until_sleep()  # a quick look: this worker claims a slot
    machine = tail.machine
    assert machine.span is not None
    for start in (1, 2, 3):  # others joined the hole too: it is full
        tail.store.setdefault(tail.claims + f"{start:07d}.000", b"{}")
    ops: list[object] = []
    for _ in range(100):
        op = machine.next(wall=tail.wall, mono=tail.mono, pick=0.5)
        if isinstance(op, Sleep) and machine.span is None:
            break
        ops.append(op)
        if isinstance(op, Run):
            machine.ran(op.index, *ok(op.index), seconds=0.05)
        elif not isinstance(op, Sleep):
            assert answer(machine, tail.store, op), op
    else:
        raise AssertionError("the worker never slept")
    lists = [o.prefix for o in ops if isinstance(o, List)]
    assert protocol.group_holes_prefix(GID) in lists
    assert tail.claims not in lists
    assert tail.bursts not in lists


def test_a_quick_look_takes_over_the_expired_claim_it_reads() -> None:
    tail = Tail()
    _, sleep = tail.until_sleep()  # a full look: worker a's span holds
    tail.mono += sleep.seconds
    tail.wall += 31  # a died: its lease ran out
    ops, _ = tail.until_sleep()
    assert [o.prefix for o in ops if isinstance(o, List)] == [
        protocol.group_holes_prefix(GID),  # the quick look
        tail.claims + "0000000.",  # its claims, since the read: not taken over meanwhile
        tail.bursts + "000000",  # the span's own bursts, after the lease ended
    ]
    assert [o.key for o in ops if isinstance(o, Read)][-1] == tail.claims + "0000000.000"
    taken = [o.key for o in ops if isinstance(o, Create)]
    assert taken[0] == tail.claims + "0000000.001"  # the quick look's read found it dead


def test_a_look_rereads_a_claim_whose_lease_ended_before_claims_never_read() -> None:
    """At a large batch's tail a worker knows outcomes as of its last full look, so
    hundreds of spans may still have inputs left as far as it knows, their claims never
    read. A dead worker's claim, read before and expired since, is read first: a
    sample at random would rarely meet it."""
    from runner.pool.spans import Span, claim_record

    tail = Tail()
    tail.store.pop(tail.bursts + protocol.burst_name(4, tail.total, 4, 0))
    tail.store[tail.bursts + protocol.burst_name(4, 400, 4, 0)] = b""
    for start in range(400, tail.total, 4):  # running still, as far as this worker knows
        live = Span(start, 0, "o", WALL + 1_000, start + 4, start)
        tail.store[tail.claims + f"{start:07d}.000"] = claim_record(live)
    ops, sleep = tail.until_sleep(pick=0.0)  # a full look: it reads a's claim, among others
    assert tail.claims + "0000000.000" in [o.key for o in ops if isinstance(o, Read)]
    tail.mono += sleep.seconds
    tail.wall += 31  # a died: its lease ran out
    ops, _ = tail.until_sleep(pick=0.5)  # a quick look: one claim read
    reads = [o.key for o in ops if isinstance(o, Read) and o.key.startswith(tail.claims)]
    assert reads == [tail.claims + "0000000.000"]
    assert [o.key for o in ops if isinstance(o, Create)][:1] == [tail.claims + "0000000.001"]


def test_a_large_pools_takeover_shares_a_dead_workers_rest_among_idle_workers() -> None:
    """A dead worker's rest of 100 inputs: the takeover runs 13 of them and leaves the
    rest in slots of 13 (HOLE_SLOTS parts at least), not one part of a fresh span's size
    run by one worker while the others idle."""
    tail = Tail(region=100)
    _, sleep = tail.until_sleep()  # a full look: worker a's span holds
    tail.mono += sleep.seconds
    tail.wall += 31  # a died: its lease ran out
    tail.until_sleep()
    taken = tail.machine.span
    assert taken is not None
    assert taken.number == 1
    part = -(-100 // HOLE_SLOTS)
    assert (taken.first, taken.end, taken.reach, taken.slot) == (0, part, 100, part)
    hole = protocol.hole_name(0, 1, part, 100, part, taken.expires)
    announce = tail.machine.next(wall=tail.wall, mono=tail.mono, pick=0.5)
    assert announce == Create(protocol.group_holes_prefix(GID) + hole, b"")


def test_a_takeover_made_since_the_claim_was_read_is_seen_before_a_create() -> None:
    """Dozens of idle workers read a dead worker's claim about when its lease ends. One
    takes the span over after another read it: that one lists the span's claims before
    its create, sees the takeover, and creates nothing (a create that loses its race is
    a write; at the tail, dozens of them met the bucket's limit), nor lists the span's
    bursts (one read, not two, for a span taken over already)."""
    from runner.pool.spans import Span, claim_record

    tail = Tail()
    _, sleep = tail.until_sleep()  # a full look: worker a's span holds
    tail.mono += sleep.seconds
    tail.wall += 31  # a died: its lease ran out
    taken = tail.claims + "0000000.001"

    def rival(op: object) -> None:
        if isinstance(op, List) and op.prefix == tail.claims + "0000000.":
            tail.store[taken] = claim_record(Span(0, 1, "b", tail.wall + 30, 4, 0, 2))

    ops, _ = tail.until_sleep(rival)
    lists = [o.prefix for o in ops if isinstance(o, List)]
    assert tail.claims + "0000000." in lists
    assert tail.bursts + "000000" not in lists
    assert not [o for o in ops if isinstance(o, Create)]
    assert tail.machine.span is None
    assert parse_claim(0, 1, tail.store[taken]) == Span(0, 1, "b", tail.wall + 30, 4, 0, 2)


def test_a_worker_that_loses_a_slots_race_lists_the_hole_again_before_another() -> None:
    """Idle workers join a hole at once, and two may pick the same slot. The loser does
    not read the winner's claim (a slot's end is known, its lease fresh), and does not
    claim another slot on its listing of the hole's claims, which the race showed to be
    out of date: it lists them again first."""
    tail = Tail()
    claims = tail.claims
    _, sleep = tail.until_sleep()
    tail.cut(0)
    tail.mono += sleep.seconds
    lost: list[str] = []

    def rival(op: object) -> None:  # c claims the slot this worker tries, just before
        if isinstance(op, Create) and op.key.startswith(claims) and not lost:
            lost.append(op.key)
            tail.store[op.key] = op.data.replace(b'"w"', b'"c"')

    ops, sleep = tail.until_sleep(rival, pick=0.0)  # the first free slot, the first suspect
    assert lost == [claims + "0000001.000"]
    assert lost[0] not in [o.key for o in ops if isinstance(o, Read)]  # not read
    after = ops[[getattr(o, "key", None) for o in ops].index(lost[0]) + 1 :]
    assert not [o for o in after if isinstance(o, Create)]  # the quick look's one visit
    tail.mono += sleep.seconds
    ops, _ = tail.until_sleep(pick=0.0)
    kinds = [(type(o).__name__, getattr(o, "prefix", None)) for o in ops]
    listing = kinds.index(("List", claims + "000000"))
    created = [i for i, o in enumerate(ops) if isinstance(o, Create)]
    assert created
    assert listing < created[0]  # the hole's claims listed again, then a slot
    assert ops[created[0]].key != lost[0]  # type: ignore[attr-defined]
    assert tail.machine.span is not None


def test_a_worker_that_found_two_expired_claims_takes_over_one_without_hopping() -> None:
    """Each step's pick differs: a worker that picked anew among the expired claims it
    read would list each one's bursts and claims before it created any takeover."""
    tail = Tail()
    tail.two_dead()
    machine, ops = tail.machine, []
    for step in range(100):
        op = machine.next(wall=tail.wall, mono=tail.mono, pick=(0.0, 0.99)[step % 2])
        assert not isinstance(op, Sleep)
        ops.append(op)
        answer(machine, tail.store, op)
        if isinstance(op, Create):
            break
    spans = [o.prefix for o in ops if isinstance(o, List) and o.prefix.endswith(".")]
    taken = ops[-1].key.removeprefix(tail.claims)  # type: ignore[attr-defined]
    assert taken in {"0000000.001", "0000004.001"}
    assert spans == [tail.claims + taken[:8]]  # the one span's claims, listed once


def test_a_worker_beaten_to_an_expired_span_tries_no_other_in_that_look() -> None:
    """At a large pool's tail the idle workers that read one dead claim when its lease
    ended read the others too: one beaten to the span it picked would be beaten to the
    next, two listings each. It tries none more until its next look."""
    from runner.pool.spans import Span, claim_record

    tail = Tail()
    tail.two_dead()
    beaten: list[str] = []

    def rival(op: object) -> None:  # another worker takes over the span this one picked
        if isinstance(op, List) and op.prefix.endswith(".") and not beaten:
            beaten.append(op.prefix)
            start = int(op.prefix.removeprefix(tail.claims)[:-1])
            rest = Span(start, 1, "c", tail.wall + 30, start + 4, start, 2)
            tail.store[op.prefix + "001"] = claim_record(rest)

    ops, _ = tail.until_sleep(rival)
    assert len(beaten) == 1
    spans = [o.prefix for o in ops if isinstance(o, List) and o.prefix.endswith(".")]
    assert spans == beaten  # the other span's claims: not listed
    assert not [o for o in ops if isinstance(o, List) and o.prefix.startswith(tail.bursts + "0")]
    assert not [o for o in ops if isinstance(o, Create)]


def test_a_large_pool_spreads_its_first_looks_for_work() -> None:
    """A large pool's workers run out of work about together, and a first look costs a
    dozen reads or more: each waits a share of FIRST_LOOK_READS x workers /
    IDLE_READS_PER_S seconds first (its pick), then lists everything once."""
    from runner.pool.spans import Span, claim_record

    def out_of_work(pick: float) -> tuple[Sleep, list[object]]:
        """A lone worker runs its region, runs out of work: its first sleep, then what
        it does after it."""
        machine = WorkerMachine(opts(1000, total=4000), GID, "w", ordinal=3, spread_start=False)
        tail = Tail()  # a holds region 0; every region but region 3 ran
        store = tail.store
        del store[tail.claims + "0000012.000"]
        del store[tail.bursts + protocol.burst_name(4, tail.total, 4, 0)]
        store[tail.bursts + protocol.burst_name(4, 12, 4, 0)] = b""
        store[tail.bursts + protocol.burst_name(16, tail.total, 16, 0)] = b""
        mono, sleeps, after = 0.0, [], []
        for _ in range(200):
            op = machine.next(wall=WALL + mono, mono=mono, pick=pick)
            if sleeps:
                after.append(op)
            if isinstance(op, (Sleep, Exit)) and sleeps:
                return sleeps[0], after
            if isinstance(op, Sleep):
                sleeps.append(op)
                mono += op.seconds
            elif isinstance(op, Run):
                machine.ran(op.index, *ok(op.index), seconds=0.05)
            else:
                assert answer(machine, store, op), op
        raise AssertionError("the worker never slept twice")

    spread = min(LEASE_WAIT_MAX, 1000 * FIRST_LOOK_READS / IDLE_READS_PER_S)
    for pick in (0.0, 0.5, 0.999):
        first, after = out_of_work(pick)
        assert first.seconds == pick * spread
        # ... then a full look at once, not a claims listing and a walk before it.
        lists = [o.prefix for o in after if isinstance(o, List)]
        assert lists[:3] == [
            protocol.group_bursts_prefix(GID),
            protocol.group_results_prefix(GID),
            protocol.group_claims_prefix(GID),
        ]
    # A worker that has run nothing (its region claimed by another) looks at once.
    store: dict[str, bytes] = {}
    for start in range(0, 4000, 4):
        held = Span(start, 0, "o", WALL + 30, start + 4, start)
        store[protocol.group_claim_key(GID, start, 0)] = claim_record(held)
    machine = WorkerMachine(opts(1000, total=4000), GID, "w", ordinal=3, spread_start=False)
    op = machine.next(wall=WALL, mono=0.0, pick=0.9)
    while not isinstance(op, Sleep):
        answer(machine, store, op)
        op = machine.next(wall=WALL, mono=0.0, pick=0.9)
        assert not isinstance(op, Run)
    assert machine.counts["List"] >= 3  # it looked before it slept


def test_the_first_worker_to_see_every_outcome_tells_the_idle_ones_in_holes() -> None:
    """Idle workers of a large pool list every burst only every 15 s or so: they would
    idle that long after the batch's last outcome. The first worker to see every input
    with an outcome creates ``holes/settled``; the others' next quick look lists it,
    and they exit at once."""
    settled = protocol.group_holes_prefix(GID) + protocol.POOL_SETTLED_NAME
    tail = Tail()
    _, sleep = tail.until_sleep()  # a full look: worker a's span holds
    tail.mono += sleep.seconds
    tail.store[settled] = b""  # a finished, and another worker saw it
    ops, last = tail.until_rest()
    assert last == Exit("done")
    assert [o.prefix for o in ops if isinstance(o, List)] == [protocol.group_holes_prefix(GID)]

    tail = Tail()  # a's span is done: a full look sees every outcome
    tail.store[tail.bursts + protocol.burst_name(0, 4, 0, 0)] = b""
    ops, last = tail.until_rest()
    assert last == Exit("done")
    assert ops[-2:] == [List(protocol.group_holes_prefix(GID)), Create(settled, b"")]
    assert settled in tail.store
    # The whole pool may run out of work together: one that finds it announced already
    # (a read) does not announce it again (a write).
    tail = Tail()
    tail.store[tail.bursts + protocol.burst_name(0, 4, 0, 0)] = b""
    tail.store[settled] = b""
    ops, last = tail.until_rest()
    assert last == Exit("done")
    assert ops[-1] == List(protocol.group_holes_prefix(GID))
    assert not [o for o in ops if isinstance(o, Create)]


def test_a_quick_look_joins_a_new_hole_rather_than_one_likely_full() -> None:
    """At a large pool's tail a hundred holes may be known, most of them full by now
    (their slots claimed by others, which a worker learns only by listing each one's
    claims). A quick look lists the claims of one hole, the newest mostly (a hole's
    name tells when it was cut), where free slots are likely."""
    from runner.pool.spans import Span, claim_record

    tail = Tail()
    claims = tail.claims
    tail.store.pop(tail.bursts + protocol.burst_name(4, tail.total, 4, 0))
    for first, end in ((4, 400), (404, 800), (804, tail.total)):  # regions 0, 100, 200 run
        tail.store[tail.bursts + protocol.burst_name(first, end, first, 0)] = b""
    for start in (400, 800):
        span = Span(start, 0, "b", WALL + 30, start + 4, start)
        tail.store[claims + f"{start:07d}.000"] = claim_record(span)
    _, sleep = tail.until_sleep()  # a full look: the three regions are held

    def cut(start: int) -> None:  # the later the start, the newer the hole
        tail.cut(start, at=WALL + 30 + start / 100)

    cut(0)
    cut(400)
    for slot in (401, 402, 403):  # the hole at 400 is full already
        span = Span(slot, 0, "y", WALL + 30, slot + 1, slot)
        tail.store[claims + f"{slot:07d}.000"] = claim_record(span)
    tail.mono += sleep.seconds
    ops, sleep = tail.until_sleep(pick=0.5)  # lists the hole at 400's claims: full
    assert not [o for o in ops if isinstance(o, Create)]
    cut(800)  # a new hole
    tail.mono += sleep.seconds
    ops, _ = tail.until_sleep(pick=0.0)  # by pick alone: the hole at 0, seen before
    created = [o.key.removeprefix(claims) for o in ops if isinstance(o, Create)]
    assert created == ["0000801.000"]
