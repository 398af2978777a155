"""The dashboard's pure parts: a batch's progress, the request parser, the pages."""

from __future__ import annotations

import pytest

from kinetic._dashboard import pages
from kinetic._dashboard.http import BadRequest, Response, encode_event, parse_form, parse_head
from kinetic._dashboard.progress import (
    GROUP_INDICES,
    MAX_SAMPLES,
    RUNNING,
    SLOWEST,
    BatchProgress,
)


def test_counts_follow_the_snapshots() -> None:
    p = BatchProgress(10)
    assert p.apply([], [0, 1, 2], running_complete=True, now=0.0) == []
    assert (p.succeeded, p.failed, len(p.running), p.pending) == (0, 0, 3, 7)
    failed = p.apply([(0, "succeeded"), (1, "failed")], [2, 3], running_complete=True, now=2.0)
    assert failed == [1]
    assert (p.succeeded, p.failed, len(p.running), p.pending) == (1, 1, 2, 6)
    assert p.state_of(2) == RUNNING
    assert p.state_of(1) == 2
    assert p.state_of(9) == 0
    # A finished input is never counted twice, whatever a later look repeats.
    assert p.apply([(0, "failed"), (1, "failed")], [], running_complete=True, now=3.0) == []
    assert (p.succeeded, p.failed) == (1, 1)
    assert 0 in p.known
    assert 5 not in p.known
    assert len(p.known) == 2


def test_a_stopped_batch_settles_what_never_ran() -> None:
    p = BatchProgress(4)
    p.apply([(0, "succeeded")], [1], running_complete=True, now=0.0)
    assert p.settle("cancelled") == [1, 2, 3]
    assert p.finished
    assert p.failed == 3
    assert not p.running


def test_failures_are_grouped_with_one_example_and_bounded_indices() -> None:
    p = BatchProgress(1000)
    for i in range(200):
        first = p.group(i, "ValueError" if i % 2 else "KeyError", f"error {i}")
        assert first == (i < 2)
    group = p.groups["ValueError"]
    assert group.count == 100
    assert group.example == 1
    assert group.message == "error 1"
    assert len(group.indices) == GROUP_INDICES


def test_slowest_are_what_was_seen_running_longest() -> None:
    p = BatchProgress(100)
    p.apply([], list(range(20)), running_complete=True, now=0.0)
    p.apply([(i, "succeeded") for i in range(15)], [], running_complete=False, now=1.0)
    p.apply([(i, "succeeded") for i in range(15, 18)], [], running_complete=False, now=5.0)
    rows = p.slowest(now=9.0)
    assert len(rows) == SLOWEST
    assert rows[0][0] in (18, 19)
    assert rows[0][2]
    assert [r[0] for r in rows[2:5]] == [17, 16, 15] or {r[0] for r in rows[2:5]} == {15, 16, 17}


def test_samples_stay_bounded_and_give_a_rate() -> None:
    p = BatchProgress(10_000_000)
    for step in range(3 * MAX_SAMPLES):
        p.apply([(step, "succeeded")], [], running_complete=False, now=float(step))
        p.sample(float(step))
    assert len(p.samples) <= MAX_SAMPLES + 1
    assert p.rate() == pytest.approx(1.0)
    assert p.samples[-1].t == 3 * MAX_SAMPLES - 1


def test_a_flat_stretch_keeps_one_point() -> None:
    p = BatchProgress(5)
    for t in range(10):
        p.sample(float(t))
    assert len(p.samples) == 2
    assert p.samples[-1].t == 9.0


def test_parse_head() -> None:
    head = b"GET /batches/grp-1?t=abc&offset=500 HTTP/1.1\r\nHost: 127.0.0.1:9\r\nX-A:  b "
    method, path, query, headers = parse_head(head)
    assert (method, path) == ("GET", "/batches/grp-1")
    assert query == {"t": "abc", "offset": "500"}
    assert headers == {"host": "127.0.0.1:9", "x-a": "b"}
    for bad in (b"GET /\r\n", b"GET http://x/ HTTP/1.1", b"GET / HTTP/1.1\r\nnocolon"):
        with pytest.raises(BadRequest):
            parse_head(bad)
    assert parse_form(b"t=a%20b&t=c&x=") == {"t": "a b", "x": ""}


def test_responses_and_events_are_framed() -> None:
    data = Response(403, b"no").encode()
    assert data.startswith(b"HTTP/1.1 403 Forbidden\r\n")
    assert b"Content-Length: 2\r\n" in data
    assert data.endswith(b"\r\n\r\nno")
    assert encode_event("log", "a\nb") == b'event: log\ndata: "a\\nb"\n\n'


def test_pages_escape_and_carry_the_token() -> None:
    assert pages.link("/jobs/a b", "t&k", state="X") == "/jobs/a%20b?t=t%26k&amp;state=X"
    p = BatchProgress(3)
    p.group(1, "<script>", "<b>")
    html = pages.failures(p, "grp-1", "tok")
    assert "<script>" not in html
    assert "&lt;script&gt;" in html
    assert "t=tok" in html
    p.apply([(0, "succeeded")], [1], running_complete=True, now=0.0)
    p.sample(0.0)
    p.sample(1.0)
    svg = pages.chart(p.samples, p.total)
    assert svg.count("<polygon") == 4
    assert pages.human_seconds(3725) == "1h02m"
    assert pages.human_bytes(2048) == "2.0 KiB"
