"""The worker pool's decisions (kinetic._core.pool_plan, runner.pool.book): pure, no loop."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest

from kinetic._core import k8s_spec, pool_plan
from kinetic._core.accelerators import parse_accelerator
from kinetic._core.pool_plan import (
    ClusterView,
    FollowState,
    PoolBook,
    PoolOptions,
    Span,
    follow_step,
    look_due,
)
from runner import protocol
from runner.pool.book import pick_region
from runner.pool.options import span_size
from runner.pool.spans import Intervals, claim_record, parse_claim, take_over

WALL = 1_000_000.0


def book(total: int = 10, chunk: int = 4, **kw: Any) -> PoolBook:
    return PoolBook(PoolOptions(total=total, chunk_size=chunk, lease_s=30.0, **kw))


# --- the book -------------------------------------------------------------------------


def test_options_from_manifest_and_defaults_for_old_records() -> None:
    manifest = {
        "total": 7,
        "chunk_size": 3,
        "options": {
            "max_concurrent": 4,
            "retries": 2,
            "fail_fast": True,
            "cancel_running_on_fail": False,
        },
        "gke": {"lease_s": 12},
    }
    opts = PoolOptions.from_manifest(manifest)
    assert (opts.total, opts.chunk_size, opts.workers, opts.retries) == (7, 3, 4, 2)
    assert opts.fail_fast
    assert not opts.cancel_running_on_fail
    assert opts.lease_s == 12.0
    assert opts.max_claims == 2 + 1 + protocol.POOL_MAX_CLAIMS_EXTRA
    del manifest["gke"]
    assert PoolOptions.from_manifest(manifest).lease_s == protocol.POOL_LEASE_SECONDS


def span(
    start: int, end: int, number: int = 0, expires: float = WALL + 10, first: int | None = None
) -> Span:
    return Span(start, number, "w", expires, end, start if first is None else first)


def test_intervals_merge_and_answer_what_is_missing() -> None:
    done = Intervals()
    assert done.add(2, 5) == 3
    assert done.add(7, 9) == 2
    assert done.add(4, 8) == 2  # joins both
    assert done.count == 7
    assert 2 in done
    assert 8 in done
    assert 9 not in done
    assert done.first_missing(0, 10) == 0
    assert done.first_missing(3, 10) == 9
    assert done.first_missing(3, 6) == 6
    assert done.missing(0, 10) == 3
    assert done.add(9, 10) == 1
    assert done.add(0, 2) == 2
    assert done.first_missing(0, 10) == 10


def test_regions_tile_the_inputs() -> None:
    opts = PoolOptions(total=10, chunk_size=4, workers=3)
    assert [opts.region(r) for r in range(opts.regions)] == [(0, 3), (3, 6), (6, 10)]
    assert [opts.region_of(i) for i in range(10)] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 2]
    assert PoolOptions(total=2, chunk_size=1, workers=8).regions == 2


def test_book_classifies_done_running_expired_and_free() -> None:
    b = book(total=10, workers=2)  # regions [0, 5) and [5, 10)
    assert b.learn_outcome(0, "succeeded")
    assert not b.learn_outcome(0, "failed")  # the first outcome stands
    assert b.learn_span(span(0, 3))
    assert b.learn_span(span(5, 7, expires=WALL - 1))
    assert not b.learn_outcome(99, "succeeded")  # out of range
    assert b.running(WALL) == [1]  # span [0, 3): input 0 is done, its worker runs 1
    assert [s.start for s in b.expired(WALL)] == [5]
    assert b.frontier(0) == (3, None, 5)
    assert b.free_estimate(0) == 2
    assert b.free_estimate(1) == 3
    b.learn_burst(1, 3)
    assert b.running(WALL) == []  # the span's inputs all have outcomes
    assert not b.settled


def test_a_newer_claim_or_a_renewal_replaces_the_known_one() -> None:
    b = book()
    b.learn_span(span(1, 4, 0, WALL - 5))
    assert b.learn_span(span(1, 4, 0, WALL + 20))  # renewed
    assert not b.learn_span(span(1, 4, 0, WALL - 5))  # an older read
    assert b.learn_span(span(1, 4, 1, WALL + 1, first=2))  # taken over
    assert b.spans[1].number == 1


def test_a_takeover_counts_the_claims_that_ran_its_first_input() -> None:
    dead = Span(0, 0, "a", WALL - 1, 10, 0)
    assert take_over(dead, 4, "b", WALL + 30) == Span(0, 1, "b", WALL + 30, 10, 4, 2)
    again = take_over(take_over(dead, 4, "b", WALL), 4, "c", WALL)  # b died on input 4
    assert (again.number, again.first, again.tries) == (2, 4, 3)
    moved = take_over(again, 6, "d", WALL)  # c got past 4 and died on 6
    assert (moved.number, moved.first, moved.tries) == (3, 6, 2)


def test_a_takeover_of_part_of_a_span_leaves_the_rest_a_hole_for_others() -> None:
    dead = Span(0, 0, "a", WALL - 1, 10, 0)
    cut = take_over(dead, 3, "b", WALL + 30, end=5)
    assert (cut.first, cut.end, cut.reach, cut.link_end) == (3, 5, 10, 10)
    assert parse_claim(0, 1, claim_record(cut)) == cut  # the reach is stored
    # A cut claim's own takeover keeps its end: a hole is bounded by one reach.
    again = take_over(cut, 4, "c", WALL + 30, end=4)
    assert (again.end, again.reach) == (5, 10)
    # An end past the span's, or at its first input, cuts nothing.
    assert take_over(dead, 3, "b", WALL, end=12).reach is None
    assert take_over(dead, 3, "b", WALL, end=3).reach is None

    assert cut.slot == 2  # the rest is claimed in spans of the takeover's size

    b = book(total=20, workers=2)  # regions [0, 10) and [10, 20)
    b.learn_span(span(0, 10, expires=WALL - 1))
    assert b.frontier(0) == (10, None, 10)  # all claimed
    b.learn_listed(0, 1)  # a takeover not read yet: it may have cut the span
    assert b.frontier(0) == (0, 0, 10)  # ... so its claim is read before walking past
    b.learn_span(cut)
    assert b.frontier(0) == (5, None, 10)  # the hole [5, 10), bounded by the reach
    assert b.free_estimate(0) == 5
    # Its slots: [5, 7), [7, 9), [9, 10). A slot's end is known from its start, and a
    # slot claimed out of order leaves the ones before it free (not "up to the next").
    assert b.free_slots(5, 10) == [(5, 7), (7, 9), (9, 10)]
    b.learn_listed(9, 0)
    assert b.span_end(9) == 10
    assert b.free_slots(5, 10) == [(5, 7), (7, 9)]
    b.learn_span(span(5, 7))  # a worker claimed the hole's first part
    assert b.frontier(0) == (7, None, 10)
    b.learn_span(take_over(span(5, 7, expires=WALL - 1), 5, "d", WALL + 30, end=6))
    assert b.frontier(0) == (6, None, 7)  # a hole in the hole, bounded by its own reach
    b.learn_span(span(6, 7))
    assert b.frontier(0) == (7, None, 10)  # past it, the outer hole goes on
    b.learn_span(span(7, 10))
    assert b.frontier(0) == (10, None, 10)
    assert b.free_estimate(0) == 0
    assert pool_plan.span_of(b, 5) == b.spans[5]  # the piece holds its inputs, not the cut span


def test_a_holes_name_tells_its_slots_before_its_claim_is_read() -> None:
    # An idle worker of a large pool lists only the holes' names between full looks:
    # the name of a cut takeover's announcement carries the hole's shape.
    name = protocol.hole_name(0, 1, 5, 10, 2, WALL + 30.25)
    assert protocol.parse_hole_name(name) == (0, 1, 5, 10, 2, WALL + 30.25)
    for bad in ("0000000.001", "x.1.5.10.2.9", "0.1.5.5.2.9", "0.1.5.10.0.9", "0.1.6.5.2.9"):
        assert protocol.parse_hole_name(bad) is None
    assert protocol.parse_hole_name("0.1.5.10.2") is None  # no time: not ours
    b = book(total=20, workers=2)  # regions [0, 10) and [10, 20)
    assert b.open_holes() == []
    assert b.learn_cut(0, 1, 5, 10, 2)
    assert not b.learn_cut(0, 1, 5, 10, 2)  # no news
    assert not b.learn_cut(0, 2, 9, 30, 2)  # past the batch: not ours
    assert b.listed[0] == 1  # the takeover is known listed; its claim still to be read
    assert b.free_slots(5, 10) == [(5, 7), (7, 9), (9, 10)]
    assert [c.start for c in b.open_holes()] == [0]
    b.learn_listed(5, 0)
    b.learn_listed(7, 0)
    b.learn_burst(9, 10)  # a slot whose inputs have outcomes is not free either
    assert b.open_holes() == []  # every slot is claimed or done: not worth a visit
    # The claim, read later, agrees with its name.
    b.learn_span(take_over(span(0, 10, expires=WALL - 1), 3, "b", WALL + 30, end=5))
    assert b.hole_slot(6) == (5, 7)


def test_a_region_where_a_takeover_left_work_is_picked_first() -> None:
    # At a large batch's tail every region whose claim was never read looks free; the
    # one with a takeover listed is where a dead worker's rest waits.
    b = book(total=40, workers=4)  # regions of 10
    for start in (0, 10, 20, 30):
        b.learn_listed(start, 0)
    assert {pick_region(b, p / 10) for p in range(10)} == {0, 1, 2, 3}
    b.learn_listed(20, 1)
    assert {pick_region(b, p / 10) for p in range(10)} == {2}
    assert pick_region(b, 0.5, avoid=2) != 2
    b.learn_span(span(20, 30, number=1))  # read: it ran the whole rest, nothing is free
    assert {pick_region(b, p / 10) for p in range(10)} == {0, 1, 3}


def test_a_listed_span_ends_where_the_next_of_its_region_starts() -> None:
    b = book(total=20, workers=2)  # regions [0, 10) and [10, 20)
    b.learn_listed(0, 0)
    b.learn_listed(4, 0)
    b.learn_listed(10, 0)
    assert b.span_end(0) == 4  # spans of a region are contiguous
    assert b.span_end(4) is None  # the last one: its claim must be read
    assert b.frontier(0) == (4, 4, 10)
    assert b.unread() == [(0, 0), (4, 0), (10, 0)]
    b.learn_span(span(4, 7))
    assert b.frontier(0) == (7, None, 10)
    assert b.free_estimate(0) == 3
    assert b.free_estimate(1) == 9  # the span at 10 counts as one input until read
    assert b.suspects(WALL) == [0, 10]  # never read; 4 holds
    # Once every input of its region has an outcome, a span never read is done: not a
    # suspect (at a tail, the few that are left are), and nothing there is free.
    b.learn_burst(10, 20)
    assert b.suspects(WALL) == [0]
    assert b.free_estimate(1) == 0


def test_changes_count_every_new_fact() -> None:
    b = book()
    b.learn_span(span(1, 3))
    b.learn_outcome(1, "succeeded")
    b.learn_outcome(1, "succeeded")
    b.learn_burst(2, 3)
    assert b.changes == 3


def test_span_sizes_adapt_to_speed_and_to_what_is_left() -> None:
    opts = PoolOptions(total=100_000, chunk_size=64, workers=4, span_s=2.0)
    size = partial(span_size, opts, free=100_000, region_left=25_000)
    assert size(ramp=4, mean_s=None) == 4  # speed unknown: a short first span
    assert size(ramp=4096, mean_s=0.001) == 2000  # fast inputs: 2 s of them
    assert size(ramp=4096, mean_s=10.0) == 1  # slow ones: one at a time
    assert size(ramp=4096, mean_s=0.001, free=400) == 50  # few left: a share of them
    # 1 ms inputs: spans of one would be 4,000 claims a second, past the claim rate.
    assert size(ramp=4096, mean_s=0.001, free=3) == 3
    assert size(ramp=4096, mean_s=0.1, free=3) == 1  # slower: the last go one by one
    assert size(ramp=4096, mean_s=0.001, region_left=7) == 7


def test_work_is_stolen_from_the_fullest_regions() -> None:
    b = book(total=40, workers=4)  # regions of 10
    b.learn_span(span(0, 10))
    b.learn_span(span(10, 18))
    b.learn_span(span(20, 22))
    assert pick_region(b, 0.0) == 2  # 8 left; region 3 has 10: both within a factor 2
    assert pick_region(b, 0.99) == 3
    b.learn_span(span(30, 40))
    b.learn_span(span(22, 30))
    assert pick_region(b, 0.5) == 1
    b.learn_span(span(18, 20))
    assert pick_region(b, 0.5) is None


def test_which_stops_end_running_inputs() -> None:
    opts = PoolOptions(total=1, chunk_size=1)
    assert pool_plan.stop_kills({"reason": "cancelled"}, opts)
    assert pool_plan.stop_kills({"reason": "failed"}, opts)
    assert not pool_plan.stop_kills({"reason": "fail_fast"}, opts)
    kill = PoolOptions(total=1, chunk_size=1, fail_fast=True, cancel_running_on_fail=True)
    assert pool_plan.stop_kills({"reason": "fail_fast"}, kill)


def test_claim_and_burst_names_and_records_round_trip() -> None:
    record = claim_record(Span(3, 1, "pod-a", 12.5, 9, 4, 2))
    assert parse_claim(3, 1, record) == Span(3, 1, "pod-a", 12.5, 9, 4, 2)
    assert parse_claim(3, 1, b"not json") is None
    # A claim of a batch recorded before spans: one input.
    assert parse_claim(3, 2, b'{"worker": "p", "expires": 1.0}') == Span(3, 2, "p", 1.0, 4, 3, 3)
    assert protocol.parse_claim_name("0000003.001") == (3, 1)
    assert protocol.parse_claim_name("junk") is None
    assert protocol.parse_outcome_name("0000012.res") == 12
    assert protocol.parse_outcome_name("worker-1.log") is None
    name = protocol.burst_name(4, 9, 3, 1)
    assert protocol.parse_burst_name(name) == (4, 9, 3, 1)
    assert protocol.parse_burst_name("0000009-0000004.0000003.001") is None
    assert protocol.parse_burst_name("junk") is None


def test_span_of_finds_the_claim_holding_an_input() -> None:
    b = book(total=20, workers=1)
    b.learn_span(span(0, 5))
    b.learn_span(span(5, 12, number=1, first=8))
    assert pool_plan.span_of(b, 7) == b.spans[5]
    assert pool_plan.span_of(b, 3) == b.spans[0]
    assert pool_plan.span_of(b, 15) is None


# --- the cluster view -----------------------------------------------------------------


def pod(
    phase: str = "Pending",
    state: dict[str, Any] | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "labels": {"job-id": "grp-1"}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status: dict[str, Any] = {"phase": phase}
    if state is not None:
        status["containerStatuses"] = [{"state": state, "image": "img"}]
    return {"metadata": meta, "status": status}


PULL = {"waiting": {"reason": "ImagePullBackOff", "message": "no such tag"}}


def test_cluster_view_counts_active_started_and_stuck_pods() -> None:
    pods = [
        pod("Running", {"running": {}}),
        pod("Pending", PULL),
        pod("Succeeded", {"terminated": {"exitCode": 0}}),
        pod("Running", {"running": {}}, deleting=True),
    ]
    view = pool_plan.cluster_view(None, pods, job_known=False)
    assert (view.exists, view.active, view.started) == (True, 2, 1)
    assert view.stuck is not None
    assert "ImagePullBackOff" in view.stuck
    assert pool_plan.cluster_view(None, [], job_known=True) == ClusterView(exists=False)


def test_pods_being_deleted_count_as_ending_until_their_grace_runs_out() -> None:
    """cancel() deletes the pool's pods with a grace: on SIGTERM each worker writes the
    outcomes it buffered. A pod being deleted is not active (nothing new starts), but
    its worker may still write until it ended or its grace ran out (its
    ``deletionTimestamp``, when it is killed)."""
    writing = pod("Running", {"running": {}}, deleting=True)  # killed at 2026-01-01 00:00
    done = pod("Failed", {"terminated": {"exitCode": 143}}, deleting=True)
    killed_at = 1767225600.0
    view = pool_plan.cluster_view(None, [writing, done], job_known=False, wall=killed_at - 5)
    assert (view.active, view.ending) == (0, 1)
    later = killed_at + pool_plan.ENDING_SLACK
    assert pool_plan.cluster_view(None, [writing], job_known=False, wall=later).ending == 0
    # A stopped batch is reported stopped only once no worker may still write.
    b = book()
    b.learn_stop({"reason": "cancelled", "detail": "the batch was cancelled", "phase": None})
    d = step(b, FollowState(), ClusterView(exists=False, ending=1), 0.0)
    assert d.stopped is None
    d = step(b, d.state, ClusterView(exists=False), 1.0)
    assert d.stopped is not None


def test_cluster_view_reads_the_jobs_verdict() -> None:
    failed = {"status": {"conditions": [{"type": "Failed", "status": "True", "message": "x"}]}}
    crashed = pod("Failed", {"terminated": {"exitCode": 137}})
    view = pool_plan.cluster_view(failed, [crashed], job_known=True)
    assert view.verdict == "failed"
    assert view.reason is not None
    assert "signal 9" in view.reason
    done = {"status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    assert pool_plan.cluster_view(done, [], job_known=True).verdict == "complete"


# --- the follower's step --------------------------------------------------------------


def step(b: PoolBook, state: FollowState, view: ClusterView | None, now: float) -> Any:
    return follow_step(b, state, view=view, now=now, wall=WALL, start_grace=4.0)


def test_looks_are_rationed() -> None:
    assert look_due(FollowState(), now=0.0, stopped=False)
    busy = FollowState(last_look=10.0, last_progress=11.0)
    assert not look_due(busy, now=12.0, stopped=False)
    assert look_due(busy, now=40.5, stopped=False)  # BUSY_LOOK
    idle = FollowState(last_look=10.0, last_progress=5.0)
    assert look_due(idle, now=12.5, stopped=False)  # IDLE_LOOK, no progress
    assert look_due(FollowState(last_look=10.0, last_progress=11.0), now=10.1, stopped=True)
    backed_off = FollowState(last_look=10.0, last_progress=5.0, idle_look=8.0)
    assert not look_due(backed_off, now=17.0, stopped=False)
    assert look_due(backed_off, now=18.0, stopped=False)
    seen = FollowState(last_look=10.0, last_progress=11.0, looked_since_stop=True)
    assert not look_due(seen, now=10.5, stopped=True)
    assert look_due(seen, now=11.5, stopped=True)


def test_follower_reports_running_inputs_and_backs_off_while_nothing_changes() -> None:
    b = book()
    b.learn_span(span(2, 3))
    first = step(b, FollowState(), ClusterView(exists=True, active=1, started=1), 0.0)
    assert first.running == [2]
    assert first.fail is None
    assert not first.create_job
    assert first.stopped is None
    second = step(b, first.state, None, 0.5)
    assert second.wait > first.wait  # no progress: poll less often
    b.learn_outcome(2, "succeeded")
    third = step(b, second.state, None, 1.0)
    assert third.wait == pool_plan.MIN_POLL
    assert third.state.last_progress == 1.0


def test_quiet_looks_back_off_but_not_while_a_pod_is_stuck() -> None:
    b = book()
    starting = ClusterView(exists=True, active=2)
    d = step(b, FollowState(), starting, 0.0)
    d = step(b, d.state, starting, 3.0)
    d = step(b, d.state, starting, 7.0)
    assert d.state.idle_look == 4 * pool_plan.IDLE_LOOK
    stuck = ClusterView(exists=True, active=2, stuck="ErrImagePull")
    assert step(b, d.state, stuck, 20.0).state.idle_look == pool_plan.IDLE_LOOK


def test_a_pool_that_cannot_start_fails_after_the_grace() -> None:
    b = book()
    stuck = ClusterView(exists=True, active=2, started=0, stuck="cannot start (ErrImagePull)")
    d = step(b, FollowState(), stuck, 10.0)
    assert d.fail is None
    assert d.state.stuck_since == 10.0
    d = step(b, d.state, stuck, 12.0)
    assert d.fail is None
    d = step(b, d.state, stuck, 14.5)
    assert d.fail is not None
    assert d.fail["reason"] == "failed"
    assert d.fail["phase"] == "start"
    assert "ErrImagePull" in d.fail["detail"]
    assert "4s" in d.fail["detail"]


def test_a_stuck_pod_beside_a_running_worker_is_not_a_failure() -> None:
    b = book()
    mixed = ClusterView(exists=True, active=2, started=1, stuck="unschedulable")
    d = step(b, FollowState(), mixed, 0.0)
    d = step(b, d.state, mixed, 100.0)
    assert d.fail is None
    assert d.state.stuck_since is None


def test_a_failed_or_finished_job_with_inputs_left_fails_the_batch() -> None:
    b = book(total=3)
    b.learn_outcome(0, "succeeded")
    failed = ClusterView(exists=True, verdict="failed", reason="BackoffLimitExceeded")
    d = step(b, FollowState(), failed, 0.0)
    assert d.fail is not None
    assert "BackoffLimitExceeded" in d.fail["detail"]
    complete = ClusterView(exists=True, verdict="complete")
    d = step(b, FollowState(), complete, 0.0)
    assert d.fail is not None
    assert "2 input(s) left" in d.fail["detail"]


def test_a_vanished_job_is_created_again_unless_the_batch_stopped_or_finished() -> None:
    b = book(total=2)
    assert step(b, FollowState(), ClusterView(exists=False), 0.0).create_job
    assert not step(b, FollowState(), None, 0.0).create_job  # no look, no decision
    b.learn_stop({"reason": "cancelled", "detail": "", "phase": None})
    assert not step(b, FollowState(), ClusterView(exists=False), 0.0).create_job
    done = book(total=1)
    done.learn_outcome(0, "succeeded")
    assert not step(done, FollowState(), ClusterView(exists=False), 0.0).create_job


def test_a_stop_is_reported_once_no_pod_runs() -> None:
    b = book()
    b.learn_span(span(1, 2))
    record = {"reason": "fail_fast", "detail": "input 0 failed", "phase": None}
    b.learn_stop(record)
    # Seen before the stop was known: not enough.
    earlier = FollowState(last_look=0.0, view=ClusterView(exists=True, active=0))
    d = step(b, earlier, None, 0.1)
    assert d.stopped is None
    d = step(b, d.state, ClusterView(exists=True, active=1, started=1), 0.2)
    assert d.stopped is None
    assert d.running == [1]
    d = step(b, d.state, ClusterView(exists=True, active=0, verdict="complete"), 1.5)
    assert d.stopped == record
    assert d.running == []


@pytest.mark.parametrize("workers", [1, 4])
def test_pool_job_manifest_is_an_indexed_job_of_workers(workers: int) -> None:
    template = k8s_spec.JobTemplate(
        namespace="ns",
        image="img:1",
        bucket="b",
        accelerator=parse_accelerator("cpu"),
        output_dir="gs://b/outputs",
    )
    job = k8s_spec.pool_job_manifest(template, group_id="grp-0123456789ab", workers=workers)
    spec = job["spec"]
    assert job["metadata"]["name"] == "kinetic-grp-0123456789ab"
    assert job["metadata"]["labels"]["group-id"] == "grp-0123456789ab"
    # An Indexed Job: worker k (its completion index) starts on the k-th region.
    assert spec["parallelism"] == spec["completions"] == workers
    assert spec["completionMode"] == "Indexed"
    assert spec["backoffLimit"] >= 6
    container = spec["template"]["spec"]["containers"][0]
    assert container["command"][:3] == ["python", "-m", "runner.pool"]
    assert spec["template"]["metadata"]["labels"]["group-id"] == "grp-0123456789ab"
    worker = [e for e in container["env"] if e["name"] == "KINETIC_WORKER"]
    assert worker[0]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    index = [e for e in container["env"] if e["name"] == "KINETIC_WORKER_INDEX"]
    path = index[0]["valueFrom"]["fieldRef"]["fieldPath"]
    assert path == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    # The pool's size, so that each worker spreads its start before reading the batch.
    size = [e for e in container["env"] if e["name"] == "KINETIC_POOL_WORKERS"]
    assert size == [{"name": "KINETIC_POOL_WORKERS", "value": str(workers)}]
    assert spec["template"]["spec"]["restartPolicy"] == "Never"
    # A deleted worker (cancel()) has a grace to write the outcomes it buffered.
    assert spec["template"]["spec"]["terminationGracePeriodSeconds"] == k8s_spec.POOL_GRACE_S
