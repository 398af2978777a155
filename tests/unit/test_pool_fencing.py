"""Fenced claims: of a late renewal and a takeover of the same span, exactly one wins.

Two pool workers' real machines (runner.pool.machine) over one in-memory store whose
objects have generations (tests/unit/pool_driver.py), stepped by hand so that the
storage operations interleave as the issue's replay had them: A's renewal of its claim
is in flight past its lease while B reads the claim, finds it expired and takes the
span over. Whichever lands first, one worker holds the span afterwards, not both.
"""

from __future__ import annotations

from typing import Any

import pytest

from runner import protocol
from runner.pool.machine import WorkerMachine
from runner.pool.ops import Create, Exit, Kill, Op, Replace, Run, Sleep, Write
from runner.pool.options import PoolOptions
from tests.unit.pool_driver import GID, answer, ok

LEASE = 30.0
A_CLAIM = protocol.group_claim_key(GID, 0, 0)
SPAN_CLAIMS = protocol.group_claims_prefix(GID) + "0000000."


def machine(name: str) -> WorkerMachine:
    # One input: A's first span holds it, so B's only work is a takeover of that span.
    options = PoolOptions(total=1, chunk_size=64, workers=1, lease_s=LEASE)
    return WorkerMachine(options, GID, name)


def step(m: WorkerMachine, store: dict[str, bytes], wall: float, stop_at: Any) -> Op:
    """Answer ``m``'s storage operations over ``store`` until it asks for one that
    ``stop_at`` picks (returned unanswered), runs or ends an input, or sleeps."""
    for _ in range(500):
        op = m.next(wall=wall, mono=wall - 1_000.0, pick=0.0)
        if stop_at(op) or isinstance(op, (Run, Kill, Sleep, Exit)):
            return op
        assert answer(m, store, op), op
    raise AssertionError("the worker never settled")


def is_renewal(op: Op) -> bool:
    return isinstance(op, (Write, Replace)) and op.key == A_CLAIM


def is_takeover(op: Op) -> bool:
    """B's write that takes the span over: today's code creates claim 1 at once; a
    fenced takeover first replaces claim 0."""
    return isinstance(op, (Create, Replace)) and op.key.startswith(SPAN_CLAIMS)


def holders(*machines: WorkerMachine) -> list[str]:
    return [m.worker for m in machines if m.span is not None and m.span.start == 0]


def a_running_with_its_renewal_in_flight(store: dict[str, bytes]) -> tuple[WorkerMachine, Op]:
    a = machine("a")
    first = step(a, store, 1_000.0, lambda op: False)
    assert isinstance(first, Run)
    assert a.span is not None
    renewal = step(a, store, a.span.expires - LEASE / 2, is_renewal)  # half the lease gone
    assert is_renewal(renewal)
    return a, renewal


def test_a_renewal_landing_after_the_takeover_read_the_claim_does_not_also_win() -> None:
    """The issue's replay: B reads A's claim after the lease ended and lists no takeover;
    A's late renewal lands, and A's look after it lists only claim 0; B's takeover then
    lands. Unfenced, both ran the span's inputs."""
    store: dict[str, bytes] = {}
    a, renewal = a_running_with_its_renewal_in_flight(store)
    b = machine("b")
    late = 1_000.0 + LEASE + 1.0
    takeover = step(b, store, late, is_takeover)
    assert is_takeover(takeover)  # B read the expired claim: it is about to take over
    assert answer(a, store, renewal)  # A's renewal lands...
    step(a, store, late, lambda op: False)  # ... and A looks, as it does after one
    assert answer(b, store, takeover)  # B's takeover lands last
    step(b, store, late, lambda op: False)
    step(a, store, late + 1.0, lambda op: False)
    assert len(holders(a, b)) == 1, holders(a, b)
    assert a.span is not None  # the renewal came first: the span stays A's
    assert protocol.group_claim_key(GID, 0, 1) not in store


def test_a_renewal_landing_after_the_takeover_fails_and_its_worker_lets_go() -> None:
    store: dict[str, bytes] = {}
    a, renewal = a_running_with_its_renewal_in_flight(store)
    b = machine("b")
    late = 1_000.0 + LEASE + 1.0
    assert isinstance(step(b, store, late, lambda op: False), Run)  # B took the span over
    assert protocol.group_claim_key(GID, 0, 1) in store
    assert answer(a, store, renewal)  # A's renewal lands after the takeover
    op = step(a, store, late, lambda op: False)
    assert holders(a, b) == ["b"]
    assert op == Kill(0)  # A ends the input it was running: B runs it


@pytest.mark.parametrize("renewal_first", [True, False])
def test_only_the_winner_writes_outcomes_of_the_span(renewal_first: bool) -> None:
    store: dict[str, bytes] = {}
    a, renewal = a_running_with_its_renewal_in_flight(store)
    b = machine("b")
    late = 1_000.0 + LEASE + 1.0
    takeover = step(b, store, late, is_takeover)
    first, second = (
        ((a, renewal), (b, takeover)) if renewal_first else ((b, takeover), (a, renewal))
    )
    for m, op in (first, second):
        assert answer(m, store, op)
    for m in (a, b):
        wall = late
        for _ in range(50):  # run to the end: every input, every burst
            op = step(m, store, wall, lambda op: False)
            if isinstance(op, Run):
                m.ran(op.index, *ok(op.index))
            elif isinstance(op, Kill):
                m.ended(op.index)
            elif isinstance(op, Exit):
                break
            else:
                wall += op.seconds
    bursts = [k for k in store if k.startswith(protocol.group_bursts_prefix(GID))]
    writers = {protocol.parse_burst_name(k.rsplit("/", 1)[1])[3] for k in bursts}  # type: ignore[index]
    assert len(writers) == 1, bursts  # one claim's worker wrote the span's outcomes


def test_an_input_that_ended_before_its_lost_spans_kill_is_not_killed() -> None:
    """Found by the explorer: the renewal fails while the input runs (the span is lost,
    a Kill of the input queued), and the input ends before the worker's next step. The
    worker's next operation is not that Kill (ending an input that already ended
    crashed the worker)."""
    store: dict[str, bytes] = {}
    a, renewal = a_running_with_its_renewal_in_flight(store)
    b = machine("b")
    late = 1_000.0 + LEASE + 1.0
    assert isinstance(step(b, store, late, lambda op: False), Run)  # B took the span over
    assert answer(a, store, renewal)  # refused: A lost the span, its Kill is queued
    a.ran(0, *ok(0))  # ... but the input had ended meanwhile
    op = step(a, store, late, lambda op: False)
    assert not isinstance(op, Kill)
    assert a.running is None
    assert a.span is None
