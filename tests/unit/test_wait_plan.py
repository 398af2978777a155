"""A cluster job's waiter (kinetic._core.wait_plan): pure, no loop, clock passed in."""

from __future__ import annotations

from kinetic._core.status import START_PHASE, JobStatus, StatusReport
from kinetic._core.wait_plan import WaitRules, WaitState, ask_if_unseen, judge, look

GKE = WaitRules(start_grace=60.0, podless_after=3.0, events_every=5.0)
LWS = WaitRules(start_grace=60.0, podless_after=3.0, ends_outcomes=True)
PENDING = StatusReport(JobStatus.PENDING)
STUCK = StatusReport(JobStatus.PENDING, reason="0/1 nodes are available: Insufficient cpu")
RUNNING = StatusReport(JobStatus.RUNNING)
FAILED = StatusReport(JobStatus.FAILED, reason="the runner failed")


def test_a_job_with_pods_is_not_podless() -> None:
    state, seen = look(WaitState(podless_since=1.0, events_at=2.0), GKE, now=10.0, podless=False)
    assert seen.podless_for is None
    assert not seen.events_due
    assert state.podless_since is None


def test_a_podless_jobs_events_are_read_after_a_while_and_then_at_most_every_few_seconds() -> None:
    state, seen = look(WaitState(), GKE, now=100.0, podless=True)
    assert (seen.podless_for, seen.events_due) == (0.0, False)
    state, seen = look(state, GKE, now=102.9, podless=True)
    assert not seen.events_due
    state, seen = look(state, GKE, now=103.0, podless=True)
    assert seen.events_due
    assert state.events_at == 103.0
    state, seen = look(state, GKE, now=107.9, podless=True)
    assert not seen.events_due
    state, seen = look(state, GKE, now=108.0, podless=True)
    assert seen.events_due
    assert seen.podless_for == 8.0


def test_a_backend_without_events_never_reads_them() -> None:
    state, seen = look(WaitState(), LWS, now=100.0, podless=True)
    state, seen = look(state, LWS, now=200.0, podless=True)
    assert seen.podless_for == 100.0
    assert not seen.events_due


def test_the_podless_waiter_wakes_to_read_events_or_to_say_the_job_is_late() -> None:
    _, verdict = judge(WaitState(), GKE, PENDING, now=0.0, podless_for=0.0, lost=False)
    assert verdict.timeout == 5.0
    _, verdict = judge(WaitState(), LWS, PENDING, now=0.0, podless_for=1.0, lost=False)
    assert verdict.timeout == 2.0
    _, verdict = judge(WaitState(), LWS, PENDING, now=0.0, podless_for=2.99, lost=False)
    assert verdict.timeout == 0.05  # never a busy loop
    _, verdict = judge(WaitState(), GKE, RUNNING, now=0.0, podless_for=None, lost=False)
    assert verdict.timeout is None
    assert not verdict.end


def test_a_job_that_cannot_start_fails_once_its_grace_is_used_up() -> None:
    state, verdict = judge(WaitState(), GKE, STUCK, now=100.0, podless_for=None, lost=False)
    assert state.stuck_since == 100.0
    assert (verdict.report, verdict.end, verdict.timeout) == (STUCK, False, 60.0)
    state, verdict = judge(state, GKE, STUCK, now=130.0, podless_for=10.0, lost=False)
    assert verdict.timeout == 5.0  # the events are due sooner than the grace ends
    state, verdict = judge(state, GKE, STUCK, now=160.0, podless_for=None, lost=False)
    assert verdict.end
    assert verdict.gave_up
    assert verdict.report.status is JobStatus.FAILED
    assert verdict.report.phase == START_PHASE
    assert "could not start within 60s" in (verdict.report.reason or "")
    assert "Insufficient cpu" in (verdict.report.reason or "")


def test_a_job_that_starts_in_time_forgets_its_wait() -> None:
    state, _ = judge(WaitState(), GKE, STUCK, now=100.0, podless_for=None, lost=False)
    state, verdict = judge(state, GKE, RUNNING, now=150.0, podless_for=None, lost=False)
    assert state.stuck_since is None
    assert not verdict.end
    state, verdict = judge(state, GKE, STUCK, now=200.0, podless_for=None, lost=False)
    assert verdict.timeout == 60.0  # a new wait, a whole grace


def test_a_lost_pods_job_is_ended_on_every_backend() -> None:
    _, verdict = judge(WaitState(), GKE, FAILED, now=0.0, podless_for=None, lost=True)
    assert verdict.end
    assert not verdict.gave_up
    assert verdict.report == FAILED
    _, verdict = judge(WaitState(), GKE, FAILED, now=0.0, podless_for=None, lost=False)
    assert not verdict.end  # its Job ends itself (TTL)


def test_a_backend_whose_ended_objects_hold_resources_ends_every_outcome() -> None:
    for report in (FAILED, StatusReport(JobStatus.SUCCEEDED)):
        _, verdict = judge(WaitState(), LWS, report, now=0.0, podless_for=None, lost=False)
        assert verdict.end
    for report in (
        StatusReport(JobStatus.FAILED, reason="cancelled", cancelled=True),
        StatusReport(JobStatus.NOT_FOUND),
        RUNNING,
    ):
        _, verdict = judge(WaitState(), LWS, report, now=0.0, podless_for=None, lost=True)
        assert not verdict.end, report


def test_a_job_that_looks_gone_is_asked_after_once_when_the_watch_has_not_seen_it() -> None:
    assert ask_if_unseen(FAILED, seen=False)
    assert not ask_if_unseen(FAILED, seen=True)
    assert not ask_if_unseen(PENDING, seen=False)
    assert not ask_if_unseen(StatusReport(JobStatus.NOT_FOUND), seen=False)
