"""A coordinated pool worker's decisions (runner/pool/coordinator/member.py), pure."""

from __future__ import annotations

from runner import protocol
from runner.pool.coordinator import messages as m
from runner.pool.coordinator.core import BEAT_SECONDS
from runner.pool.coordinator.member import Connect, Fetch, Member, Say
from runner.pool.ops import Create, Exit, Kill, Run, Sleep
from runner.pool.options import LARGE_RESULT, PoolOptions
from runner.retry_rule import RetryRule

OK: protocol.FinalRecord = {"state": "succeeded"}  # type: ignore[typeddict-item]
FAILED: protocol.FinalRecord = {"state": "failed", "error": "boom"}  # type: ignore[typeddict-item]


def _linked(options: PoolOptions | None = None) -> Member:
    member = Member(options or PoolOptions(total=10, chunk_size=10), "grp-1", "w0")
    op = member.next(0.0)
    assert op == Connect(m.Hello("w0", (), wants=True))
    member.linked_up(0.0)
    return member


def _said(member: Member, mono: float) -> list[object]:
    out = []
    while isinstance(op := member.next(mono), Say):
        out.append(op.message)
    return [*out, op]


def test_it_asks_for_a_span_as_it_starts_the_last_input() -> None:
    member = _linked()
    assert isinstance(member.next(0.0), Sleep)  # its hello asked for one
    member.heard(m.Assign((3, 4)), 0.1)
    assert member.next(0.1) == Run(3, 0)
    member.ran(3, OK, b"v3", b"printed", 0.05)
    ops = _said(member, 0.2)
    assert isinstance(ops[0], m.Outcome)
    assert ops[0].index == 3
    assert ops[1] == Run(4, 0)
    assert member.next(0.2) == Say(m.More())  # queued as input 4, its last, started


def test_what_was_not_acknowledged_is_said_again_on_the_next_connection() -> None:
    member = _linked()
    member.next(0.0)
    member.heard(m.Assign((0, 1, 2)), 0.0)
    member.next(0.0)
    member.ran(0, OK, b"v0")
    member.next(0.0)  # says outcome 0
    member.heard(m.Ack((0,)), 0.1)
    assert member.next(0.1) == Run(1, 0)
    member.ran(1, OK, b"v1")
    member.disconnected(0.2)
    assert member.next(0.2) == Connect(m.Hello("w0", (2,), wants=False))
    member.linked_up(0.3)
    said = _said(member, 0.3)
    assert [o.index for o in said if isinstance(o, m.Outcome)] == [1]


def test_a_worker_told_to_exit_waits_for_its_last_acknowledgements() -> None:
    member = _linked()
    member.heard(m.Assign((0, 1)), 0.0)
    _said(member, 0.0)
    member.ran(0, OK, b"v0")
    member.heard(m.Exit("cancelled", kill=True), 0.1)
    ops = _said(member, 0.1)
    assert ops[-1] == Sleep(ops[-1].seconds)  # type: ignore[attr-defined]  # outcome 0 unacked
    member.heard(m.Ack((0,)), 0.2)
    assert member.next(0.2) == Exit("cancelled")


def test_a_stop_that_kills_ends_the_running_input() -> None:
    member = _linked()
    member.heard(m.Assign((0, 1)), 0.0)
    assert Run(0, 0) in _said(member, 0.0)
    member.heard(m.Exit("cancelled", kill=True), 0.1)
    assert member.next(0.1) == Kill(0)
    member.ended(0)
    assert member.next(0.1) == Exit("cancelled")


def test_dropped_inputs_are_not_run() -> None:
    member = _linked()
    member.heard(m.Assign((0, 1, 2)), 0.0)
    member.heard(m.Drop((0, 1)), 0.0)
    assert Run(2, 0) in _said(member, 0.0)


def test_a_dropped_running_input_is_ended_and_the_span_goes_on() -> None:
    member = _linked()
    member.heard(m.Assign((0, 1)), 0.0)
    assert Run(0, 0) in _said(member, 0.0)
    member.heard(m.Drop((0,)), 0.1)  # cancelled alone (or another worker ran it)
    assert member.next(0.1) == Kill(0)
    member.ended(0)
    assert Run(1, 0) in _said(member, 0.2)  # the batch goes on


def test_a_worker_that_set_up_after_connecting_asks_for_its_first_span() -> None:
    member = Member(PoolOptions(total=10, chunk_size=10), "grp-1", "w0")
    member.linked_up(0.0, asked=False)  # its hello asked for nothing (it had not set up)
    assert member.next(0.0) == Say(m.More())


def test_a_failure_is_retried_by_its_rule_then_reported() -> None:
    rule = RetryRule(count=1, initial_delay=5.0)
    options = PoolOptions(total=3, chunk_size=3, retries=1, retry_rule=rule)
    member = _linked(options)
    member.heard(m.Assign((0,)), 0.0)
    assert Run(0, 0) in _said(member, 0.0)
    member.ran(0, FAILED, b"x")
    ops = _said(member, 0.0)
    assert isinstance(ops[-1], Sleep)  # the retry's delay
    assert not member.unacked
    later = 100.0
    assert Run(0, 1) in _said(member, later)
    member.ran(0, FAILED, b"x")
    said = _said(member, later)
    outcome = next(o for o in said if isinstance(o, m.Outcome))
    assert outcome.failed
    assert outcome.record is not None


def test_a_large_result_is_written_as_its_own_object_before_it_is_reported() -> None:
    member = _linked()
    member.heard(m.Assign((5,)), 0.0)
    _said(member, 0.0)
    member.ran(5, OK, bytes(LARGE_RESULT + 1))
    op = member.next(0.1)
    assert isinstance(op, Create)
    assert op.key == protocol.group_outcome_key("grp-1", 5)
    assert not member.unacked  # not reported before its object exists
    member.created(op.key)
    said = _said(member, 0.2)
    assert m.Outcome(5, None, False, 0.0) in said


def test_it_beats_while_it_holds_work() -> None:
    member = _linked()
    member.heard(m.Assign((0,)), 0.0)
    _said(member, 0.0)  # runs input 0
    assert member.next(0.0) == Say(m.More())  # its last input
    assert isinstance(member.next(0.5), Sleep)
    assert member.next(BEAT_SECONDS) == Say(m.Beat())
    assert isinstance(member.next(BEAT_SECONDS), Sleep)


def test_a_coordinator_out_of_reach_is_tried_again_with_back_off() -> None:
    member = Member(PoolOptions(total=1, chunk_size=1), "grp-1", "w0")
    assert isinstance(member.next(0.0), Connect)
    member.unreachable(0.0)
    assert isinstance(member.next(0.1), Sleep)
    assert isinstance(member.next(0.3), Connect)
    member.gone_away("done")
    assert member.next(0.3) == Exit("done")


def test_it_reads_ahead_the_chunk_its_span_needs_next_while_an_input_runs() -> None:
    member = _linked(PoolOptions(total=30, chunk_size=10))
    member.heard(m.Assign((8, 9, 10, 11)), 0.0)
    assert member.next(0.0) == Run(8, 0)  # the run reads chunk 0 itself
    assert member.next(0.0) == Fetch(1)  # while 8 runs: the chunk of 10 and 11
    assert isinstance(member.next(0.0), Sleep)  # one slow operation at a time
    member.fetched_chunk(1)
    assert isinstance(member.next(0.0), Sleep)  # and each chunk once
    member.ran(8, OK, b"v8")
    assert _said(member, 0.1)[-1] == Run(9, 0)
    member.heard(m.Exit("cancelled", kill=False), 0.2)
    member.heard(m.Assign((25,)), 0.2)  # (after a stop: never handed out, never read)
    assert not isinstance(member.next(0.2), Fetch)
