"""The coordinated pool's pure parts: the span queue, the ledger, the commits' names."""

from __future__ import annotations

import pytest

from runner import protocol, results_log
from runner.pool.coordinator import commits, core
from runner.pool.coordinator import messages as m
from runner.pool.coordinator.ledger import Ledger
from runner.pool.coordinator.queue import SpanQueue


def test_spans_shrink_as_the_batch_drains_and_follow_the_pace() -> None:
    queue = SpanQueue(1000, 10, cap_seconds=2.0)
    sizes: list[int] = []  # the most the next span may hold (a region's end may cut it)
    seen: list[int] = []
    while True:
        sizes.append(queue.size())
        span = queue.take(lambda i: True, f"w{len(sizes) % 10}")
        if not span:
            break
        assert len(span) <= sizes[-1]
        seen += span
    assert sizes[0] == 50  # ceil(1000 / (2 x 10))
    assert sizes == sorted(sizes, reverse=True)
    assert sizes[-2] == 1
    assert sorted(seen) == list(range(1000))  # each input once
    slow = SpanQueue(1000, 10, cap_seconds=2.0)
    slow.heard(0.5)
    assert len(slow.take(lambda i: True)) == 4  # two seconds of work at 0.5 s an input


def test_a_worker_keeps_to_its_region_then_takes_from_the_back_of_the_fullest() -> None:
    queue = SpanQueue(400, 4, cap_seconds=100.0)  # regions of 100 inputs
    assert queue.take(lambda i: True, "a") == list(range(50))
    assert queue.take(lambda i: True, "b")[0] == 100  # the next region nobody took
    spans = [queue.take(lambda i: True, "a")]
    while spans[-1][-1] < 100:
        spans.append(queue.take(lambda i: True, "a"))
    assert [i for span in spans[:-1] for i in span] == list(range(50, 100))  # contiguous
    stolen = spans[-1]  # region 0 done: from the back of the fullest (2, untouched)
    assert stolen == list(range(stolen[0], 300))
    assert len(stolen) <= 50  # at most half of what it had left
    assert queue.take(lambda i: True, "c")[0] == 200  # its owner starts at its front


def test_inputs_handed_back_go_out_first_and_skip_those_done_meanwhile() -> None:
    queue = SpanQueue(100, 2, cap_seconds=100.0)
    first = queue.take(lambda i: True)
    queue.give_back(first[:5])
    again = queue.take(lambda i: i != 2)
    assert again == [0, 1, 3, 4]
    assert queue.take(lambda i: True)[0] == first[-1] + 1


def test_a_restarted_queue_hands_out_only_what_is_undone() -> None:
    queue = SpanQueue(10, 1, cap_seconds=100.0)
    queue.restart([7, 3])
    assert queue.take(lambda i: True) + queue.take(lambda i: True) == [3, 7]
    assert queue.take(lambda i: True) == []


def test_bad_queue_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="0 workers"):
        SpanQueue(10, 0, cap_seconds=1.0)


def test_an_outcome_is_acknowledged_only_once_its_commit_landed() -> None:
    ledger = Ledger(4, epoch=2)
    assert ledger.heard(1, b"r1", "a") == (True, False)
    assert ledger.heard(1, b"r1'", "b") == (False, False)  # a second run: not committed
    commit = ledger.cut()
    assert commit is not None
    assert commit.records == {1: b"r1"}
    assert (commit.epoch, commit.seq) == (2, 0)
    assert ledger.cut() is None  # one in flight at a time
    assert ledger.heard(2, b"r2", "a") == (True, False)
    assert ledger.landed(commit) == {"a": [1], "b": [1]}
    assert ledger.heard(1, b"r1''", "c") == (False, True)  # durable: forget it at once
    assert ledger.heard(3, None, "c") == (True, True)  # its own object
    assert not ledger.complete()
    second = ledger.cut()
    assert second is not None
    assert second.seq == 1
    with pytest.raises(ValueError, match="not the one in flight"):
        ledger.landed(commit)  # not the one in flight
    ledger.landed(second)
    assert ledger.heard(0, b"r0", "a") == (True, False)
    last = ledger.cut()
    assert last is not None
    ledger.landed(last)
    assert ledger.complete()
    with pytest.raises(ValueError, match="not one of the batch's 4"):
        ledger.heard(4, b"", "a")


def test_commit_and_coordinator_names_parse_back() -> None:
    key = commits.commit_key("g1", 3, 42)
    assert key == "_groups/g1/commits/0003-000000042"
    assert commits.parse_commit_key("g1", key) == (3, 42)
    assert commits.parse_commit_key("g1", "_groups/g1/commits/3-42") is None
    assert commits.parse_commit_key("g2", key) is None
    record = commits.CoordinatorRecord(host="10.0.0.7", port=4711, started=1.5)
    assert commits.decode_coordinator(commits.encode_coordinator(record)) == record
    assert commits.parse_coordinator_key("g1", commits.coordinator_key("g1", 12)) == 12
    with pytest.raises(ValueError, match="port 0"):
        commits.decode_coordinator(b'{"host": "x", "port": 0, "started": 1}')
    with pytest.raises(ValueError, match="not a coordinator record"):
        commits.decode_coordinator(b"[]")


def test_a_commit_reads_back_as_a_burst() -> None:
    header = protocol.OutcomeHeader(state="succeeded")
    records = [results_log.encode(i, header, str(i).encode()) for i in (5, 9)]
    decoded = results_log.decode_burst(commits.encode_commit(records))
    assert [(i, p) for i, _, p in decoded] == [(5, b"5"), (9, b"9")]


def test_a_finished_coordinator_tells_late_workers_to_exit() -> None:
    coord = core.Coordinator(1, 1)
    actions = coord.connected(0, m.Hello("a"), 0.0)
    assert actions == [core.Send(0, m.Assign((0,)))]
    coord.received(0, m.Outcome(0, b"r", False, 0.1), 0.1)
    (write,) = coord.tick(0.2)
    assert isinstance(write, core.WriteCommit)
    done = coord.landed(write.commit, 0.3)
    assert done == [core.Send(0, m.Ack((0,))), core.Send(0, m.Exit("done")), core.Finished("done")]
    assert coord.connected(1, m.Hello("late"), 0.4) == [core.Send(1, m.Exit("done"))]
    assert coord.next_tick() is None


def test_fail_fast_stops_every_worker_at_once() -> None:
    coord = core.Coordinator(100, 3, fail_fast=True)
    for conn in range(3):
        coord.connected(conn, m.Hello(f"w{conn}"), 0.0)
    actions = coord.received(1, m.Outcome(40, b"r", True, 0.1), 0.5)
    assert core.WriteStop("fail_fast", "input 40 failed") in actions
    stop = m.Exit("fail_fast", kill=False)  # the running inputs finish
    exits = [a.conn for a in actions if isinstance(a, core.Send) and a.message == stop]
    assert sorted(exits) == [0, 1, 2]
    assert coord.received(0, m.More(), 0.6) == []  # nothing handed out after the stop


def test_a_silent_worker_loses_its_span_and_is_told_when_back() -> None:
    coord = core.Coordinator(40, 2)
    (give_a,) = coord.connected(0, m.Hello("a"), 0.0)
    assert isinstance(give_a, core.Send)
    assert isinstance(give_a.message, m.Assign)
    span_a = give_a.message.indices
    coord.connected(1, m.Hello("b", wants=False), 0.0)
    assert coord.next_tick() == core.SILENCE_SECONDS
    coord.tick(core.SILENCE_SECONDS)  # a says nothing: presumed dead
    coord.received(1, m.Outcome(39, b"r", False, 0.5), 3.0)  # inputs take 0.5 s
    (give_b,) = coord.received(1, m.More(), 3.1)
    assert isinstance(give_b, core.Send)
    assert give_b.message == m.Assign(span_a[:4])
    (told,) = coord.received(0, m.Beat(), 3.2)
    assert told == core.Send(0, m.Drop(span_a[:4]))
    assert coord.holders[span_a[4]] == "a"  # still free: a keeps it


def test_a_restarted_coordinator_hands_out_once_every_worker_is_back() -> None:
    coord = core.Coordinator(10, 2, epoch=1, durable=[0, 1], now=0.0)
    # In its grace: what a worker not back yet holds must not go to another.
    assert coord.connected(0, m.Hello("a", (2, 3), wants=False), 0.1) == []
    (give_b,) = coord.connected(1, m.Hello("b", (4,), wants=True), 0.2)  # all back: at once
    assert isinstance(give_b, core.Send)
    assert isinstance(give_b.message, m.Assign)
    assert not {0, 1, 2, 3, 4} & set(give_b.message.indices)  # done, or held


def test_a_restarted_coordinator_waits_for_a_worker_that_is_not_back_at_most_its_grace() -> None:
    coord = core.Coordinator(10, 2, epoch=1, now=0.0)
    assert coord.connected(0, m.Hello("a"), 0.1) == []
    assert coord.next_tick() == core.RESTART_GRACE_SECONDS
    assert coord.tick(core.RESTART_GRACE_SECONDS - 0.01) == []
    (give_a,) = coord.tick(core.RESTART_GRACE_SECONDS)
    assert isinstance(give_a, core.Send)
    assert isinstance(give_a.message, m.Assign)


def test_the_coordinator_tells_the_first_input_each_live_worker_holds() -> None:
    coord = core.Coordinator(40, 2)
    (give_a,) = coord.connected(0, m.Hello("a"), 0.0)
    (give_b,) = coord.connected(1, m.Hello("b"), 0.0)
    spans = [g.message.indices for g in (give_a, give_b)]  # type: ignore[union-attr]
    assert coord.running() == sorted(s[0] for s in spans)
    coord.received(0, m.Outcome(spans[0][0], b"r", False, 0.1), 0.1)  # a goes on
    assert coord.running() == sorted([spans[0][1], spans[1][0]])
    coord.tick(0.05 + core.SILENCE_SECONDS)  # b says nothing: presumed dead
    assert coord.running() == [spans[0][1]]
    record = commits.encode_running(0, coord.running())
    assert commits.decode_running(record) == [spans[0][1]]
    for bad in (b"[]", b'{"inputs": [-1]}', b'{"inputs": "3"}'):
        with pytest.raises(ValueError, match="not a running record"):
            commits.decode_running(bad)


def test_an_input_with_an_outcome_of_its_own_is_dropped_by_its_holder_and_counts_done() -> None:
    coord = core.Coordinator(4, 1)
    (give,) = coord.connected(0, m.Hello("a"), 0.0)
    assert give == core.Send(0, m.Assign((0, 1)))
    # A reader cancelled inputs 1 and 2 (objects of their own): a drops the one it holds.
    assert coord.own_outcomes([1, 2, 99], 0.5) == [core.Send(0, m.Drop((1,)))]
    assert coord.own_outcomes([1], 0.6) == []  # seen already
    coord.received(0, m.Outcome(0, b"r", False, 0.1), 1.0)
    assert coord.received(0, m.More(), 1.0) == [core.Send(0, m.Assign((3,)))]  # not 2
    coord.received(0, m.Outcome(3, b"r", False, 0.1), 1.1)
    (write,) = coord.tick(1.1)
    assert isinstance(write, core.WriteCommit)
    assert sorted(write.commit.records) == [0, 3]
    assert core.Finished("done") in coord.landed(write.commit, 1.2)
