"""Pool workers' machines (runner.pool.machine) driven together over one in-memory store
on a simulated clock (tests/unit/pool_driver.py): claims by span, bursts, takeovers of
part of a span, retries, max_claims, fail_fast, cancels. Pure: no loop, no IO."""

from __future__ import annotations

import itertools
import pickle
from typing import Any

import pytest

from runner import protocol, results_log
from runner.pool.machine import WorkerMachine
from runner.pool.ops import Create, Exit, Kill, List, Read, Replace, Run, Sleep, Write
from runner.pool.options import PoolOptions
from runner.pool.spans import Span, parse_claim
from runner.retry_rule import RetryRule
from tests.unit.pool_driver import GID, Pool, answer, generation, ok, running


def options(total: int, workers: int, **kw: Any) -> PoolOptions:
    return PoolOptions(total=total, chunk_size=64, workers=workers, **{"lease_s": 30.0, **kw})


def fast(index: int, attempt: int) -> tuple[float, protocol.FinalRecord, bytes]:
    return (0.01, *ok(index))


def claims(pool: Pool) -> list[tuple[int, int, int, int]]:
    """``(start, number, first, end)`` of every claim in the store."""
    prefix = protocol.group_claims_prefix(GID)
    out = []
    for key, data in pool.store.objects.items():
        if key.startswith(prefix):
            span = _span_of(key, data)
            out.append((span.start, span.number, span.first, span.end))
    return sorted(out)


def _span_of(key: str, data: bytes) -> Span:
    """The span of the claim ``key`` whose bytes are ``data``."""
    parsed = protocol.parse_claim_name(key.removeprefix(protocol.group_claims_prefix(GID)))
    assert parsed is not None
    span = parse_claim(*parsed, data)
    assert span is not None
    return span


def writes(pool: Pool) -> int:
    return pool.store.requests["Create"] + pool.store.requests["Write"]


def test_workers_share_the_inputs_once_each_in_few_writes() -> None:
    # Ordinals, as an Indexed Job gives its pods: without them, the regions' first
    # workers are drawn at random and the write count swings with the seed (56-172).
    pool = Pool(options(2000, 4), fast)
    for w in range(4):
        pool.start(f"w{w}", ordinal=w)
    pool.step_until()
    assert set(pool.exits.values()) == {"done"}
    found = pool.store.outcomes()
    assert sorted(found) == list(range(2000))
    assert all(len(v) == 1 for v in found.values())  # none written twice
    assert max(pool.runs.values()) == 1
    # Spans tile the inputs without overlap: each starts where another ends.
    spans = claims(pool)
    ends = {end for _, _, _, end in spans}
    assert all(start in ends or start in (0, 500, 1000, 1500) for start, *_ in spans)
    assert sum(end - start for start, _, _, end in spans) == 2000
    assert writes(pool) / 2000 <= 0.05
    # The work is shared: ideal 5 s (2000 x 10 ms / 4), plus the tail and the IO.
    assert pool.last_write - 1000 < 5.5


def test_spans_are_short_while_inputs_are_slow() -> None:
    pool = Pool(options(40, 4), lambda i, a: (5.0, *ok(i)))
    for w in range(4):
        pool.start(f"w{w}")
    pool.step_until()
    assert sorted(pool.store.outcomes()) == list(range(40))
    spans = claims(pool)
    assert max(end - start for start, _, _, end in spans) <= 4  # never more than the first
    # The tail: every worker busy to the end (10 inputs x 5 s each, ideal 50 s).
    assert pool.last_write - 1000 < 60


def test_a_dead_workers_span_is_taken_over_from_its_first_input_without_an_outcome() -> None:
    pool = Pool(options(400, 1, burst_s=0.05), fast)
    pool.start("doomed")
    pool.step_until(1000 + 0.6)
    machine = pool.machines["doomed"]
    assert machine.span is not None
    span = machine.span
    done = [i for i in pool.store.outcomes() if span.start <= i < span.end]
    assert done  # part of the span is written
    pool.kill("doomed")
    pool.start("heir", at=pool.now + 1)
    pool.step_until()
    found = pool.store.outcomes()
    assert sorted(found) == list(range(400))
    assert all(len(v) == 1 for v in found.values())
    taken = [c for c in claims(pool) if c[1] == 1]
    assert taken[0][:3] == (span.start, 1, max(done) + 1)
    # A span the doomed worker claimed ahead (none of its inputs begun) is taken over
    # too, from its start.
    assert all(c[0] == c[2] and c[0] >= span.end for c in taken[1:])
    assert found[max(done) + 1][0]["worker"] == "heir"
    assert found[max(done) + 1][0]["claim"] == 1
    # The heir ran a part of the dead span; the rest was claimed afresh, span by span.
    cut = taken[0][3]
    assert max(done) + 1 < cut < span.end
    pieces = [c for c in claims(pool) if cut <= c[0] < span.end]
    assert [c[1] for c in pieces] == [0] * len(pieces)
    starts = [c[0] for c in pieces]
    assert starts == [cut] + [c[3] for c in pieces[:-1]]  # each starts where the last ended
    assert pieces[-1][3] == span.end  # the hole ends where the dead span did
    # The cut was announced where idle workers of a large pool look often.
    prefix = protocol.group_holes_prefix(GID)
    holes = [protocol.parse_hole_name(k.removeprefix(prefix)) for k in pool.store.objects]
    first = max(done) + 1
    cuts = [h[:5] for h in holes if h and h[0] == span.start]
    assert cuts == [(span.start, 1, cut, span.end, cut - first)]


def test_a_stalled_worker_that_lost_its_span_writes_nothing_of_it() -> None:
    pool = Pool(options(300, 2), fast)
    pool.start("slow")
    pool.step_until(1000.2)
    span = pool.machines["slow"].span
    assert span is not None
    pool.pause("slow", pool.now + 40)  # past its lease: taken over meanwhile
    pool.start("other", at=pool.now + 35)
    pool.step_until()
    found = pool.store.outcomes()
    assert sorted(found) == list(range(300))
    assert all(len(v) == 1 for v in found.values()), {i: v for i, v in found.items() if len(v) > 1}
    assert any(c[:2] == (span.start, 1) for c in claims(pool))


def test_an_input_that_keeps_killing_its_worker_is_failed_after_max_claims() -> None:
    pool = Pool(options(10, 1, max_claims=3), fast)
    pool.doom = {4}
    pool.start("w")
    pool.step_until()
    found = pool.store.outcomes()
    assert sorted(found) == list(range(10))
    header = found[4][0]
    assert header["state"] == "failed"
    assert "input 4 lost its worker 3 times" in header["error"]
    assert pool.runs[4] == 3  # claim 0 and two takeovers ran it; the fourth gave up
    assert all(found[i][0]["state"] == "succeeded" for i in range(10) if i != 4)


def test_retries_run_again_in_place_and_the_last_attempt_stands() -> None:
    failing: dict[str, Any] = {
        "state": "failed",
        "phase": "execute",
        "error": "E",
        "error_type": None,
    }

    def flaky(index: int, attempt: int) -> tuple[float, protocol.FinalRecord, bytes]:
        if index == 3 or (index == 1 and attempt == 0):
            return 0.01, failing, pickle.dumps({"success": False})  # type: ignore[return-value]
        return fast(index, attempt)

    pool = Pool(options(6, 2, retries=1), flaky)
    pool.start("w")
    pool.step_until()
    found = pool.store.outcomes()
    assert found[1][0]["state"] == "succeeded"
    assert found[1][0]["attempt"] == 1
    assert found[3][0]["state"] == "failed"
    assert pool.runs[3] == 2


def test_a_retries_rule_waits_its_back_off_in_place_and_retries_only_what_on_names() -> None:
    def failing(kind: str) -> dict[str, Any]:
        return {"state": "failed", "phase": "execute", "error": kind, "error_type": kind}

    started: dict[tuple[int, int], float] = {}

    def flaky(index: int, attempt: int) -> tuple[float, protocol.FinalRecord, bytes]:
        started[(index, attempt)] = pool.now
        if index == 1 and attempt < 2:  # named in `on`: retried after 5 s, then 10 s
            return 0.01, failing("builtins.OSError"), pickle.dumps({"success": False})  # type: ignore[return-value]
        if index == 3:  # not named: its first failure stands
            return 0.01, failing("builtins.KeyError"), pickle.dumps({"success": False})  # type: ignore[return-value]
        return fast(index, attempt)

    rule = RetryRule(count=3, backoff=2.0, initial_delay=5.0, on=frozenset({"builtins.OSError"}))
    pool = Pool(options(6, 1, retries=3, retry_rule=rule), flaky)
    pool.start("w")
    pool.step_until()
    found = pool.store.outcomes()
    assert (found[1][0]["state"], found[1][0]["attempt"]) == ("succeeded", 2)
    assert started[(1, 1)] - started[(1, 0)] >= 5.0
    assert started[(1, 2)] - started[(1, 1)] >= 10.0
    # The worker held its span while it waited: input 2 ran after input 1's last attempt.
    assert started[(2, 0)] > started[(1, 2)]
    assert (found[3][0]["state"], pool.runs[3]) == ("failed", 1)
    # The span was renewed while it waited (15 s, past a third of the lease), never taken over.
    assert all(number == 0 for _, number, _, _ in claims(pool))
    assert pool.store.requests["Replace"] >= 1


def test_a_time_limit_is_never_retried() -> None:
    limit = "runner.time_limit.TimeLimitExceeded"

    def slow(index: int, attempt: int) -> tuple[float, protocol.FinalRecord, bytes]:
        record = {"state": "failed", "phase": "execute", "error": "limit", "error_type": limit}
        return 0.01, record, pickle.dumps({"success": False})  # type: ignore[return-value]

    pool = Pool(options(2, 1, retries=2), slow)
    pool.start("w")
    pool.step_until()
    assert pool.runs == {0: 1, 1: 1}


def test_fail_fast_writes_the_failure_then_the_stop_and_nothing_new_starts() -> None:
    failing: dict[str, Any] = {
        "state": "failed",
        "phase": "execute",
        "error": "E",
        "error_type": None,
    }

    def bad_two(index: int, attempt: int) -> tuple[float, protocol.FinalRecord, bytes]:
        if index == 2:
            return 0.01, failing, pickle.dumps({"success": False})  # type: ignore[return-value]
        return fast(index, attempt)

    pool = Pool(options(200, 2, fail_fast=True), bad_two)
    pool.start("a")
    pool.start("b")
    pool.step_until()
    assert set(pool.exits.values()) == {"stopped"}
    stop = protocol.load_stop(pool.store.objects[protocol.group_stop_key(GID)])
    assert stop["reason"] == "fail_fast"
    assert "input 2" in stop["detail"]
    found = pool.store.outcomes()
    assert found[2][0]["state"] == "failed"
    assert len(found) < 200


def test_a_cancelled_input_is_skipped_or_ended() -> None:
    cancelled = protocol.encode_outcome(protocol.cancelled_header(), b"")
    pool = Pool(options(30, 1, lease_s=3.0), lambda i, a: (2.0 if i == 2 else 0.01, *ok(i)))
    pool.store.objects[protocol.group_outcome_key(GID, 1)] = cancelled
    pool.start("w")
    pool.step_until(1000.5)  # input 2 runs (2 s); cancel it: ended at the next look
    pool.store.objects[protocol.group_outcome_key(GID, 2)] = cancelled
    pool.step_until()
    assert pool.runs[1] == 0
    found = pool.store.outcomes()
    assert sorted(found) == list(range(30))
    assert [h["state"] for h in found[2]] == ["cancelled"]
    assert pool.now - 1000 < 2.0  # input 2 was ended, not waited for


def test_a_stop_ends_the_running_input_and_the_buffer_is_written_first() -> None:
    pool = Pool(options(100, 1), lambda i, a: (60.0 if i == 3 else 0.01, *ok(i)))
    pool.start("w")
    pool.step_until(1000.5)
    record = protocol.stop_record("cancelled", "the batch was cancelled")
    pool.store.objects[protocol.group_stop_key(GID)] = protocol.dump_json(record)
    pool.step_until()
    assert pool.exits == {"w": "stopped"}
    assert sorted(pool.store.outcomes()) == [0, 1, 2]
    assert pool.now - 1000 < 5


def test_a_thief_reads_where_anothers_chain_ends_before_it_claims_there() -> None:
    # Region 0 is claimed to its end; region 1's holder claimed [100, 120). A worker with
    # nothing of its own walks there: at 120 it reads first (the holder claims its next
    # span while its span's last input runs, so a create there would mostly lose, a
    # write each), and creates only what the read found unclaimed.
    from runner.pool.spans import Span, claim_record

    def thief_at(objects: dict[str, bytes]) -> tuple[WorkerMachine, list[object]]:
        machine = WorkerMachine(options(200, 2), GID, "thief", spread_start=False)
        ops: list[object] = []
        while True:
            op = machine.next(wall=1000.0, mono=0.0, pick=0.5)
            ops.append(op)
            if isinstance(op, (Create, Run, Exit, Sleep)):
                return machine, ops
            assert answer(machine, objects, op)

    def claim(start: int, end: int, worker: str) -> tuple[str, bytes]:
        key = protocol.group_claim_key(GID, start, 0)
        return key, claim_record(Span(start, 0, worker, 1030.0, end, start))

    held = dict([claim(0, 100, "w0"), claim(100, 120, "w1")])
    _, ops = thief_at(dict(held))
    probe = Read(protocol.group_claim_key(GID, 120, 0))
    last = ops[-1]
    assert isinstance(last, Create)
    assert last.key == probe.key
    assert ops.index(probe) < len(ops) - 1  # read before the create
    # The holder's next claim is there when the thief reads: no create at 120; it walks
    # on to that claim's end and claims after it.
    _, ops = thief_at({**held, **dict([claim(120, 150, "w1")])})
    assert probe in ops
    creates = [op for op in ops if isinstance(op, Create)]
    assert [op.key for op in creates] == [protocol.group_claim_key(GID, 150, 0)]


def test_a_worker_that_read_the_stop_record_as_it_started_claims_first() -> None:
    # The pod reads the stop record before it sets up: its machine does not read it
    # again before the first claim, only a (spread) period later.
    stop = protocol.group_stop_key(GID)
    for stop_read in (False, True):
        machine = WorkerMachine(
            options(400, 1), GID, "w", ordinal=0, spread_start=False, stop_read=stop_read
        )
        objects: dict[str, bytes] = {}
        ops = []
        mono = 0.0
        while mono < 3 * machine.stop_every:
            op = machine.next(wall=1000.0 + mono, mono=mono, pick=0.5)
            ops.append(op)
            if isinstance(op, Run):
                machine.ran(op.index, *ok(op.index), seconds=0.01)
            elif not answer(machine, objects, op):
                assert isinstance(op, Sleep)
            mono += 0.01
        reads = [i for i, op in enumerate(ops) if op == Read(stop)]
        assert reads  # the stop record is still read, every period
        assert (reads[0] == 0) is not stop_read


def test_the_machine_refuses_a_step_before_its_answer() -> None:
    machine = WorkerMachine(options(4, 1), GID, "w")
    op = machine.next(wall=1000.0, mono=0.0, pick=0.0)
    assert isinstance(op, Read)
    with pytest.raises(RuntimeError, match="not answered"):
        machine.next(wall=1000.0, mono=0.0, pick=0.0)
    machine.read(op.key, None, None)
    claim = machine.next(wall=1000.0, mono=0.0, pick=0.0)
    while not isinstance(claim, Create):
        machine.listed(claim.prefix, [])  # type: ignore[union-attr]
        claim = machine.next(wall=1000.0, mono=0.0, pick=0.0)
    machine.created(claim.key, 1)
    assert machine.next(wall=1000.0, mono=0.0, pick=0.0) == Run(0, 0)


def test_the_books_free_counts_follow_what_it_learns() -> None:
    # free_estimate is kept per region (an idle worker asks for every region's): after
    # any sequence of listed names and read claims it equals the count from scratch.
    import random

    from runner.pool.book import PoolBook, pick_region
    from runner.pool.spans import Span

    opts = options(1000, 37)
    book = PoolBook(opts)
    rng = random.Random(5)

    def from_scratch(region: int) -> int:
        at, unknown, limit = book.frontier(region)
        return max(0, limit - at - (1 if unknown is not None else 0))

    for step in range(400):
        region = rng.randrange(opts.regions)
        hi = opts.region(region)[1]
        at, unknown, _ = book.frontier(region)
        if unknown is not None and rng.random() < 0.7:  # read the claim that ends the chain
            end = min(hi, unknown + rng.randint(1, 8))
            book.learn_span(Span(unknown, book.listed[unknown], "w", 1.0, end, unknown))
        elif at < hi:  # someone claimed the next span: seen listed, or read at once
            if rng.random() < 0.5:
                book.learn_listed(at, 0)
            else:
                book.learn_span(Span(at, 0, "w", 1.0, min(hi, at + rng.randint(1, 8)), at))
        if step % 7 == 0:
            want = [from_scratch(r) for r in range(opts.regions)]
            assert book.free_by_region() == want
            assert book.free_total() == sum(want)
            assert all(book.free_estimate(r) == want[r] for r in range(opts.regions))
            region = pick_region(book, rng.random())
            assert (region is None) == (sum(want) == 0)
            assert region is None or 2 * want[region] >= max(want) > 0


def test_workers_with_ordinals_start_in_regions_of_their_own() -> None:
    """An Indexed Job's workers (worker k starts on region k) never race for a first
    claim: every first create wins and no claim is read to find a region's end."""
    pool = Pool(options(2000, 8), fast)
    for w in range(8):
        pool.start(f"w{w}", ordinal=w)
    pool.step_until(pool.now + 0.005)  # every worker's first claim, nothing else yet
    firsts = [(start, number) for start, number, _, _ in claims(pool)]
    assert firsts == [(r * 250, 0) for r in range(8)]
    assert pool.store.requests["Read"] == 8  # the stop record, once each
    pool.step_until()
    assert sorted(pool.store.outcomes()) == list(range(2000))


def test_a_pod_takes_its_ordinal_from_the_indexed_jobs_annotation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from runner.pool.pod_env import worker_ordinal

    monkeypatch.setenv("KINETIC_WORKER_INDEX", "17")
    assert worker_ordinal() == 17
    monkeypatch.setenv("KINETIC_WORKER_INDEX", "")  # a cluster without Indexed Jobs
    assert worker_ordinal() is None
    monkeypatch.delenv("KINETIC_WORKER_INDEX")
    assert worker_ordinal() is None


def test_a_renewal_is_a_replace_at_the_claims_generation_and_its_failure_drops_the_span() -> None:
    """A renewal held up (429s) until its lease had run out may land after another
    worker took the span over: it is a replace at the generation the worker wrote, so it
    fails then, and the worker drops the span it lost and ends its input. (Monotonic
    time stands still, short of the next read of the stop record: only the leases'
    wall clock moves.)"""
    machine, op = running(WorkerMachine(options(100, 1, lease_s=30.0), GID, "w"))
    assert machine.span is not None
    start, number, expires = machine.span.start, machine.span.number, machine.span.expires
    key = protocol.group_claim_key(GID, start, number)
    renew = machine.next(wall=expires - 15.0, mono=0.25, pick=0.0)  # half the lease gone
    assert isinstance(renew, Replace)
    assert renew.key == key
    machine.replaced(renew.key, None)  # ... the claim was replaced by a takeover first
    assert machine.span is None  # dropped with its buffer; its input is ended
    assert machine.next(wall=expires + 1.0, mono=0.25, pick=0.0) == Kill(op.index)


def test_a_renewal_that_landed_needs_no_look() -> None:
    machine, _ = running(WorkerMachine(options(100, 1, lease_s=30.0), GID, "w"))
    assert machine.span is not None
    expires = machine.span.expires
    renew = machine.next(wall=expires - 15.0, mono=0.25, pick=0.0)
    assert isinstance(renew, Replace)
    machine.replaced(renew.key, generation(renew.data))
    after = [machine.next(wall=expires - 14.0, mono=0.25, pick=0.0)]
    if isinstance(after[0], List):  # a look for a cancel of the input (results/)
        machine.listed(after[0].prefix, [])
        after.append(machine.next(wall=expires - 14.0, mono=0.25, pick=0.0))
    claims_prefix = protocol.group_claims_prefix(GID)
    assert not any(isinstance(o, List) and o.prefix.startswith(claims_prefix) for o in after)
    assert isinstance(after[-1], Sleep)
    # The next renewal is at the generation this one made.
    again = machine.next(wall=expires + 1.0, mono=0.25, pick=0.0)
    while isinstance(again, List):
        machine.listed(again.prefix, [])
        again = machine.next(wall=expires + 1.0, mono=0.25, pick=0.0)
    assert isinstance(again, Replace)
    assert again.generation == generation(renew.data)


def test_a_claim_read_before_its_lease_ended_is_not_taken_over_on_that_read() -> None:
    """Worker b reads a's claim, then runs a span of its own without sleeping; a renews
    meanwhile. Once b is idle past the lease b read, it reads the claim again rather than
    take the span over on its old read (which predates the renewal): two workers would
    then run the same inputs. Seen in the 1,000-worker model as inputs with two bursts."""
    from runner.pool.spans import Span, claim_record

    store: dict[str, bytes] = {}
    a_claim = protocol.group_claim_key(GID, 0, 0)
    store[a_claim] = claim_record(Span(0, 0, "a", 1_010.0, 4, 0))
    machine = WorkerMachine(options(8, 2, lease_s=30.0), GID, "b")  # regions [0, 4), [4, 8)
    wall, ops = 1_000.0, []
    for _ in range(200):
        if wall >= 1_008.0:  # a renews its claim while b runs
            store[a_claim] = claim_record(Span(0, 0, "a", 1_038.0, 4, 0))
        op = machine.next(wall=wall, mono=wall, pick=0.0)
        ops.append(op)
        if answer(machine, store, op):
            continue
        if isinstance(op, Run):
            wall += 3.0
            machine.ran(op.index, *ok(op.index))
        else:
            break
    assert isinstance(op, Sleep)
    assert sum(isinstance(o, Run) for o in ops) == 4  # its own span, [4, 8)
    assert protocol.group_claim_key(GID, 0, 1) not in store  # no takeover of a's span
    reads = [o for o in ops if isinstance(o, Read) and o.key == a_claim]
    assert len(reads) == 2  # once to walk the chain, once again after the lease it read


def test_a_span_is_not_taken_over_on_a_bursts_listing_older_than_its_lease() -> None:
    """Worker b lists the bursts, then (its listing of claims held up by 429s) reads a's
    claim after a's lease ended. a had finished the span meanwhile and written its last
    burst after b's listing: b lists that span's bursts again before taking it over, and
    finds them. Seen in the 1,000-worker model as inputs with two bursts."""
    from runner.pool.spans import Span, claim_record

    store: dict[str, bytes] = {}
    a_claim = protocol.group_claim_key(GID, 0, 0)
    store[a_claim] = claim_record(Span(0, 0, "a", 1_010.0, 4, 0))
    a_burst = protocol.group_bursts_prefix(GID) + protocol.burst_name(0, 4, 0, 0)
    machine = WorkerMachine(options(8, 2, lease_s=30.0), GID, "b")  # regions [0, 4), [4, 8)
    wall, ops = 1_000.0, []
    for _ in range(200):
        op = machine.next(wall=wall, mono=wall, pick=0.0)
        ops.append(op)
        if answer(machine, store, op):
            bursts = isinstance(op, List) and op.prefix == protocol.group_bursts_prefix(GID)
            if bursts and a_burst not in store:
                store[a_burst] = protocol.encode_burst(b"")  # a's last burst, just after
                wall = 1_011.0  # ... and b's next steps come after a's lease ended
        elif isinstance(op, Run):
            machine.ran(op.index, *ok(op.index))
        else:
            break
    assert isinstance(op, (Sleep, Exit))
    assert protocol.group_claim_key(GID, 0, 1) not in store  # no takeover of a's span
    narrow = [o for o in ops if isinstance(o, List) and o.prefix.endswith("bursts/000000")]
    assert narrow  # the span's own bursts, listed after its lease ended


def test_workers_that_start_together_read_the_stop_record_at_spread_times() -> None:
    """A thousand workers that read the stop record in the same instant, and again a
    second later each time, would meet the bucket's read limit every second; a 429
    stalls a running worker a second or more. Each reads it a second time after half
    to one and a half times its period, as its random pick says, then once a period:
    every worker reads it as often (its reads hold up its inputs)."""
    dues = []
    for pick in (0.0, 0.5, 0.9):
        machine, _ = running(WorkerMachine(options(100, 1), GID, "w"), pick=pick)
        op = machine.next(wall=1000.0, mono=0.0, pick=pick)
        while isinstance(op, List):  # a look for a cancel of the input (results/)
            machine.listed(op.prefix, [])
            op = machine.next(wall=1000.0, mono=0.0, pick=pick)
        assert isinstance(op, Sleep)
        dues.append(op.seconds)
        stop = Read(protocol.group_stop_key(GID))
        assert machine.next(wall=1000.0, mono=op.seconds, pick=pick) == stop
        machine.read(stop.key, None, None)
        after = machine.next(wall=1000.0, mono=op.seconds, pick=pick)
        assert after == Sleep(pytest.approx(1.0))  # then once a period: the phase is kept
    assert dues == pytest.approx([0.5, 1.0, 1.4])  # stop_every is 1 s in a small pool


def _drive_alone(
    machine: WorkerMachine, store: dict[str, bytes], input_s: float
) -> list[tuple[float, object, bool]]:
    """Run a lone worker to its exit as the pod's shell does: after ``Run``, its upkeep
    is performed until it sleeps, then the input ends ``input_s`` later. Each operation
    with its time and whether an input ran meanwhile."""
    log: list[tuple[float, object, bool]] = []
    now, running = 0.0, None
    for _ in range(100_000):
        op = machine.next(wall=1_000.0 + now, mono=now, pick=0.5)
        log.append((now, op, running is not None))
        if isinstance(op, Exit):
            return log
        if isinstance(op, Run):
            running = op
        elif isinstance(op, Sleep):
            now += op.seconds if running is None else min(op.seconds, input_s)
            if running is not None:  # the input ended (its time ran with the sleep)
                machine.ran(running.index, *ok(running.index), seconds=input_s)
                running = None
        else:
            assert answer(machine, store, op), op
    raise AssertionError("the worker did not exit")


def _records_in_bursts(store: dict[str, bytes]) -> dict[int, int]:
    """How many records of each input the bursts in ``store`` hold."""
    found: dict[int, int] = {}
    for key, data in store.items():
        if "/bursts/" in key:
            records, _ = results_log.scan(data, len(protocol.BURST_MAGIC))
            for index, *_ in records:
                found[index] = found.get(index, 0) + 1
    return found


def _drive_slow_requests(
    machine: WorkerMachine, store: dict[str, bytes], input_s: float, request_s: float
) -> tuple[float, dict[int, int]]:
    """Run a lone worker to its exit, each storage request answered ``request_s`` after
    it was sent (a 429's back-off), the machine asked again meanwhile only if it was made
    with ``overlap`` (the pod's courier). The seconds it ran no input before its last
    input ended, and the outcomes of each input found in its bursts."""
    now, idle, last_idle = 0.0, 0.0, 0.0
    running: tuple[int, float] | None = None
    out: tuple[object, float] | None = None
    overlap = machine._overlap
    for _ in range(100_000):
        if out is not None and now >= out[1]:
            assert answer(machine, store, out[0]), out[0]
            out = None
        if running is not None and now >= running[1]:
            machine.ran(running[0], *ok(running[0]), seconds=input_s)
            running, last_idle = None, idle
        if out is not None and not overlap:  # one thread: nothing until the answer
            until = out[1] if running is None else min(out[1], running[1])
        else:
            op = machine.next(wall=1_000.0 + now, mono=now, pick=0.5)
            if out is not None:
                assert isinstance(op, (Run, Sleep)), f"{op!r} while {out[0]!r} is out"
            if isinstance(op, Exit):
                break
            if isinstance(op, Run):
                running = (op.index, now + input_s)
                continue
            if not isinstance(op, Sleep):
                out = (op, now + request_s)
                continue
            until = now + op.seconds
            for t in (running[1] if running else None, out[1] if out else None):
                until = until if t is None else min(until, t)
        idle += (until - now) if running is None else 0.0
        now = until
    else:
        raise AssertionError("the worker did not exit")
    return last_idle, _records_in_bursts(store)


def test_an_inputs_end_does_not_wait_for_the_request_under_way() -> None:
    # A request is 30-80 ms on GCS, a 429's back-off a second or more: a shell of one
    # thread starts the next input only once it is answered. The pod's courier sends
    # upkeep from a helper thread, and the machine (``overlap``) hands out the held
    # span's next inputs meanwhile, and nothing else until the answer.
    idle = {}
    for overlap in (False, True):
        store: dict[str, bytes] = {}
        machine = WorkerMachine(options(400, 1, lease_s=30.0), GID, "w", ordinal=0, overlap=overlap)
        idle[overlap], found = _drive_slow_requests(machine, store, 0.05, request_s=0.3)
        assert sorted(found) == list(range(400))
        assert set(found.values()) == {1}
    # 20 s of inputs: without the courier, every request made the next input wait.
    assert idle[False] > 5.0, idle
    assert idle[True] < idle[False] / 3, idle


def test_no_input_starts_while_the_fence_of_a_lapsed_claim_is_out() -> None:
    # A worker that stalled past its lease renews its claim first (the fence): a refusal
    # tells it the span was taken over meanwhile. While that renewal is out, the courier
    # would let the span's next inputs start: they must wait for its answer.
    store: dict[str, bytes] = {}
    machine = WorkerMachine(
        options(20, 1, lease_s=3.0), GID, "w", ordinal=0, overlap=True, spread_start=False
    )
    wall, mono = 1_000.0, 0.0
    op = machine.next(wall=wall, mono=mono, pick=0.5)
    while not isinstance(op, Run):
        assert answer(machine, store, op), op
        op = machine.next(wall=wall, mono=mono, pick=0.5)
    machine.ran(op.index, *ok(op.index), seconds=0.05)
    wall, mono = wall + 10.0, mono + 10.0  # stalled past the 3 s lease
    op = machine.next(wall=wall, mono=mono, pick=0.5)
    while not isinstance(op, Replace):  # (the stop record first)
        assert not isinstance(op, Run), op
        assert answer(machine, store, op), op
        op = machine.next(wall=wall, mono=mono, pick=0.5)
    fence = op
    assert machine.next(wall=wall, mono=mono, pick=0.5) == Sleep(machine.wait_max)
    assert answer(machine, store, fence)  # not taken over: the span is still its own
    op = machine.next(wall=wall, mono=mono, pick=0.5)
    while not isinstance(op, Run):
        assert answer(machine, store, op), op
        op = machine.next(wall=wall, mono=mono, pick=0.5)
    assert op.index == 1


def test_a_machine_without_overlap_refuses_to_be_asked_before_the_answer() -> None:
    machine = WorkerMachine(options(10, 1), GID, "w", ordinal=0)
    op = machine.next(wall=1_000.0, mono=0.0, pick=0.5)
    assert isinstance(op, Read)  # the stop record
    with pytest.raises(RuntimeError, match="not answered"):
        machine.next(wall=1_000.0, mono=0.0, pick=0.5)


def test_between_two_inputs_of_a_span_a_worker_does_no_storage_operation() -> None:
    # An operation between two inputs is time the worker runs none (30-80 ms a request
    # on GCS): the next claim is created while the held span's last input runs, and due
    # bursts, renewals and stop reads wait for the next input, performed while it runs.
    store: dict[str, bytes] = {}
    machine = WorkerMachine(options(400, 1, lease_s=3.0), GID, "w", ordinal=0)
    log = _drive_alone(machine, store, 0.05)
    runs = [i for i, (_, op, _) in enumerate(log) if isinstance(op, Run)]
    between = [
        op
        for a, b in itertools.pairwise(runs)
        for _, op, during in log[a + 1 : b]
        if not during and not isinstance(op, Sleep)
    ]
    assert between == [], between
    claims_made = [op for _, op, _ in log if isinstance(op, Create) and "/claims/" in op.key]
    assert len(claims_made) > 3  # spans of a few inputs each: claimed ahead, every one
    assert all(during for _, op, during in log if op in claims_made[1:])
    renewals = [op for _, op, _ in log if isinstance(op, Replace)]
    assert renewals  # 20 s of work under a 3 s lease
    found = _records_in_bursts(store)
    assert sorted(found) == list(range(400))
    assert set(found.values()) == {1}


def test_a_burst_due_just_before_its_spans_end_is_written_with_the_end() -> None:
    # Spans of 13 inputs of 0.1 s, bursts due 1 s after their first outcome (pick 0.5):
    # each span's first burst would fall due with one input left. The span's last
    # burst, written as it ends, holds those outcomes as soon as the latest a burst is
    # due (1.25 s): one burst a span, and no outcome waits longer.
    store: dict[str, bytes] = {}
    opts = options(120, 1, burst_s=1.0, span_s=1.35)
    machine = WorkerMachine(opts, GID, "w", ordinal=0)
    log = _drive_alone(machine, store, 0.1)
    assert sorted(_records_in_bursts(store)) == list(range(120))
    spans = [op for _, op, _ in log if isinstance(op, Create) and "/claims/" in op.key]
    bursts = [(t, op) for t, op, _ in log if isinstance(op, Write) and "/bursts/" in op.key]
    assert any((span := _span_of(op.key, op.data)).end - span.first == 13 for op in spans)
    assert len(bursts) == len(spans)
    # Each outcome is durable within the latest a burst is due after it ran.
    ended = {run.index: t + 0.1 for t, run, _ in log if isinstance(run, Run)}
    for t, op in bursts:
        records, _ = results_log.scan(op.data, len(protocol.BURST_MAGIC))
        assert all(t - ended[index] <= 1.25 * 1.0 + 0.1 + 1e-9 for index, *_ in records)
