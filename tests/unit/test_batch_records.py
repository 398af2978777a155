"""The local batch engine's pure parts: records, coalesced events, compact indexes."""

from __future__ import annotations

import pickle
from pathlib import Path

from kinetic._backends.local_batch import BatchEvents, _LogIndex, parse_events
from kinetic._engine.batch import _States
from kinetic._engine.results import load_payload, unwrap
from runner import protocol, results_log
from runner.batch import _events, _success
from runner.job import build_success

HEAD = protocol.dump_json({"attempt": 0, "state": "succeeded"})


def _record(index: int, value: object, head: bytes = HEAD) -> bytes:
    return results_log.encode_raw(index, head, _success(value)[0])


def test_coalesced_events_keep_completion_order_and_states() -> None:
    done = [(3, ord("s")), (1, ord("s")), (7, ord("f")), (2, ord("s")), (9, ord("c"))]
    data = _events(done, [4, 5, 6]) + b"e\n"
    assert data.count(b"\n") == 6  # a line per run of one state, one for the dispatched
    events = BatchEvents()
    parse_events(data.split(b"\n"), events)
    assert events.done == [
        (3, "succeeded"),
        (1, "succeeded"),
        (7, "failed"),
        (2, "succeeded"),
        (9, "cancelled"),
    ]
    assert events.running == [4, 5, 6]
    assert events.snapshot_complete


def test_scan_stops_at_a_torn_or_corrupted_record() -> None:
    whole = _record(1, 10) + _record(2, 20)
    found, end = results_log.scan(whole + _record(3, 30)[:-4])
    assert [f[0] for f in found] == [1, 2]
    assert end == len(whole)
    corrupted = bytearray(whole)
    corrupted[-1] ^= 0xFF
    found, end = results_log.scan(bytes(corrupted))
    assert [f[0] for f in found] == [1]


def test_plain_results_skip_cloudpickle_with_the_same_meaning() -> None:
    for value in (7, 2.5, "x", b"y", None, True, (1, "a"), [1, 2], {"k": 1}, object):
        data, record = _success(value)
        expected, expected_record = build_success(value)
        assert record == expected_record
        assert unwrap(load_payload(data, "job-1"), "job-1") == value
        assert unwrap(load_payload(expected, "job-1"), "job-1") == value
        assert len(data) <= len(expected)


def test_log_index_reads_appended_records_once_and_keeps_the_first(tmp_path: Path) -> None:
    log = tmp_path / "w1.log"
    fd = results_log.open_log(log)
    failed = protocol.dump_json({"attempt": 0, "error": "boom", "state": "failed"})
    results_log.append_encoded(fd, _record(0, 0) + _record(5, 50, failed))
    index = _LogIndex()
    index.scan(tmp_path)
    assert index.has(0)
    assert index.has(5)
    assert not index.has(1)
    assert not index.has(10_000)
    results_log.append_encoded(fd, _record(1, 10) + _record(5, 55))  # 5 again: ignored
    index.scan(tmp_path)
    assert list(index.order) == [0, 5, 1]
    loaded = index.load([0, 1, 5, 9])
    assert set(loaded) == {0, 1, 5}
    assert pickle.loads(loaded[1][1])["result"] == 10
    assert loaded[5][0]["state"] == "failed"
    assert pickle.loads(loaded[5][1])["result"] == 50


def test_states_count_and_answer_membership() -> None:
    states = _States(5)
    assert states.set(3, "succeeded")
    assert states.set(0, "failed")
    assert not states.set(3, "failed")
    assert not states.set(9, "succeeded")
    assert 3 in states
    assert 1 not in states
    assert -1 not in states
    assert "3" not in states
    assert (len(states), states.succeeded) == (2, 1)
    assert list(states) == [0, 3]
    assert dict(states.items()) == {0: "failed", 3: "succeeded"}
    assert states.get(3) == "succeeded"
    assert states.get(1) is None
