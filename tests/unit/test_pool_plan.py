"""The worker pool's decisions (kinetic._core.pool_plan, runner.pool_book): pure, no loop."""

from __future__ import annotations

from typing import Any

import pytest

from kinetic._core import k8s_spec, pool_plan
from kinetic._core.accelerators import parse_accelerator
from kinetic._core.pool_plan import (
    Claim,
    ClusterView,
    Exit,
    FollowState,
    GiveUp,
    PoolBook,
    PoolOptions,
    Run,
    Wait,
    follow_step,
    look_due,
    worker_step,
)
from runner import protocol

WALL = 1_000_000.0


def book(total: int = 10, chunk: int = 4, **kw: Any) -> PoolBook:
    return PoolBook(PoolOptions(total=total, chunk_size=chunk, lease_s=30.0, **kw))


def claim(index: int, number: int = 0, expires: float = WALL + 10) -> Claim:
    return Claim(index, number, "w", expires)


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


def test_book_classifies_done_running_expired_and_free() -> None:
    b = book()
    assert b.learn_outcome(0, "succeeded")
    assert not b.learn_outcome(0, "failed")  # the first outcome stands
    assert b.learn_claim(claim(1))
    assert b.learn_claim(claim(2, expires=WALL - 1))
    assert not b.learn_claim(claim(0))  # done: a late claim changes nothing
    assert not b.learn_outcome(99, "succeeded")  # out of range
    assert b.running(WALL) == [1]
    assert [c.index for c in b.expired(WALL)] == [2]
    assert b.free_in(0) == 3
    assert b.free_chunks() == [0, 1, 2]
    b.learn_outcome(1, "failed")
    assert b.running(WALL) == []  # an outcome ends the claim
    assert not b.settled


def test_a_newer_claim_or_a_renewal_replaces_the_known_one() -> None:
    b = book()
    b.learn_claim(claim(1, 0, WALL - 5))
    assert b.learn_claim(claim(1, 0, WALL + 20))  # renewed
    assert not b.learn_claim(claim(1, 0, WALL - 5))  # an older read
    assert b.learn_claim(claim(1, 1, WALL + 1))  # taken over
    assert b.claims[1].number == 1


def test_changes_count_every_new_fact() -> None:
    b = book()
    b.learn_claim(claim(1))
    b.learn_outcome(1, "succeeded")
    b.learn_outcome(1, "succeeded")
    assert b.changes == 2


# --- the worker's step ----------------------------------------------------------------


def test_worker_prefers_its_chunk_then_a_picked_free_chunk() -> None:
    b = book(total=12, chunk=4)
    assert worker_step(b, wall=WALL, chunk=1, pick=0.0) == Run(4, 0)
    b.learn_claim(claim(4))
    assert worker_step(b, wall=WALL, chunk=1, pick=0.0) == Run(5, 0)
    for i in (5, 6, 7):
        b.learn_outcome(i, "succeeded")
    # Chunk 1 has nothing free: the pick chooses among chunks 0 and 2.
    assert worker_step(b, wall=WALL, chunk=1, pick=0.0) == Run(0, 0)
    assert worker_step(b, wall=WALL, chunk=1, pick=0.99) == Run(8, 0)
    assert worker_step(b, wall=WALL, chunk=None, pick=0.6) == Run(8, 0)


def test_worker_takes_over_an_expired_claim_then_waits_for_live_ones() -> None:
    b = book(total=3, chunk=3)
    b.learn_outcome(0, "succeeded")
    b.learn_claim(claim(1, 0, WALL - 1))
    b.learn_claim(claim(2, 0, WALL + 3))
    assert worker_step(b, wall=WALL, chunk=0, pick=0.0) == Run(1, 1)
    b.learn_claim(claim(1, 1, WALL + 30))
    action = worker_step(b, wall=WALL, chunk=0, pick=0.0)
    assert action == Wait(3.0)  # until the first lease ends
    assert isinstance(worker_step(b, wall=WALL - 100, chunk=0, pick=0), Wait)
    assert worker_step(b, wall=WALL - 100, chunk=0, pick=0).seconds <= 5.0  # type: ignore[union-attr]


def test_an_input_that_keeps_losing_its_worker_is_given_up() -> None:
    b = book(total=1, chunk=1, retries=0, max_claims=3)
    b.learn_claim(claim(0, 2, WALL - 1))
    action = worker_step(b, wall=WALL, chunk=None, pick=0.0)
    assert isinstance(action, GiveUp)
    assert (action.index, action.number) == (0, 3)
    assert "lost its worker 3 times" in action.reason


def test_worker_exits_when_done_or_stopped() -> None:
    b = book(total=2, chunk=2)
    b.learn_outcome(0, "succeeded")
    b.learn_outcome(1, "failed")
    assert worker_step(b, wall=WALL, chunk=None, pick=0.0) == Exit("done")
    b2 = book()
    b2.learn_stop({"reason": "cancelled"})
    assert worker_step(b2, wall=WALL, chunk=None, pick=0.0) == Exit("stopped")


def test_which_stops_end_running_inputs() -> None:
    opts = PoolOptions(total=1, chunk_size=1)
    assert pool_plan.stop_kills({"reason": "cancelled"}, opts)
    assert pool_plan.stop_kills({"reason": "failed"}, opts)
    assert not pool_plan.stop_kills({"reason": "fail_fast"}, opts)
    kill = PoolOptions(total=1, chunk_size=1, fail_fast=True, cancel_running_on_fail=True)
    assert pool_plan.stop_kills({"reason": "fail_fast"}, kill)


def test_claim_objects_round_trip_and_unreadable_ones_count_as_expired() -> None:
    from runner.pool_book import claim_record, parse_claim

    assert parse_claim(3, 1, claim_record("pod-a", 12.5)) == Claim(3, 1, "pod-a", 12.5)
    assert parse_claim(3, 1, b"not json").expires == 0.0
    assert protocol.parse_claim_name("0000003.001") == (3, 1)
    assert protocol.parse_claim_name("junk") is None
    assert protocol.parse_outcome_name("0000012.res") == 12
    assert protocol.parse_outcome_name("worker-1.log") is None


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
    b.learn_claim(claim(2))
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
    b.learn_claim(claim(1))
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
def test_pool_job_manifest_is_a_work_queue_of_workers(workers: int) -> None:
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
    assert spec["parallelism"] == workers
    assert "completions" not in spec
    assert spec["backoffLimit"] >= 6
    container = spec["template"]["spec"]["containers"][0]
    assert container["command"][:3] == ["python", "-m", "runner.pool"]
    assert spec["template"]["metadata"]["labels"]["group-id"] == "grp-0123456789ab"
    worker = [e for e in container["env"] if e["name"] == "KINETIC_WORKER"]
    assert worker[0]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert spec["template"]["spec"]["restartPolicy"] == "Never"
