"""The per-input GKE batch engine's decisions (kinetic._core.batch_plan): pure, no loop."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from kinetic._core import batch_plan, k8s_spec
from kinetic._core.batch_plan import (
    AttemptSeen,
    BatchOptions,
    BatchSnapshot,
    DeleteAttempt,
    EngineState,
    GiveUp,
    Launch,
    Need,
    StopBatch,
    cluster_attempts,
    seen_in_listing,
    step,
)
from kinetic._core.status import START_PHASE
from runner import protocol

GID = "grp-0123456789abcdef"
NOW = 1000.0


def opts(**kw: Any) -> BatchOptions:
    base: dict[str, Any] = {"group_id": GID, "total": 5, "max_concurrent": 2, "start_grace": 60.0}
    base.update(kw)
    return BatchOptions(**base)


def aid(index: int, attempt: int = 0) -> str:
    return protocol.member_attempt_id(GID, index, attempt)


def job(index: int, attempt: int = 0, *, group: str = GID, verdict: str | None = None) -> Any:
    status: dict[str, Any] = {}
    if verdict is not None:
        status["conditions"] = [{"type": verdict, "status": "True", "reason": "BackoffLimit"}]
    labels = {
        k8s_spec.GROUP_ID_LABEL: group,
        k8s_spec.GROUP_INDEX_LABEL: str(index),
        k8s_spec.ATTEMPT_LABEL: str(attempt),
        k8s_spec.JOB_ID_LABEL: protocol.member_attempt_id(group, index, attempt),
    }
    return {"metadata": {"name": f"kinetic-{labels['job-id']}", "labels": labels}, "status": status}


def pod(index: int, attempt: int = 0, *, state: str) -> Any:
    """A pod of attempt ``attempt`` of input ``index``: running, succeeded, failed
    (exit code 1), or unschedulable."""
    status: dict[str, Any] = {"phase": "Pending"}
    if state == "running":
        status = {"phase": "Running", "containerStatuses": [{"state": {"running": {}}}]}
    elif state == "succeeded":
        status = {"phase": "Succeeded"}
    elif state == "failed":
        terminated = {"exitCode": 1, "reason": "Error"}
        status = {"phase": "Failed", "containerStatuses": [{"state": {"terminated": terminated}}]}
    elif state == "unschedulable":
        cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
        status = {"phase": "Pending", "conditions": [cond]}
    labels = {k8s_spec.JOB_ID_LABEL: aid(index, attempt)}
    return {"metadata": {"name": f"p-{index}-{attempt}", "labels": labels}, "status": status}


def seen(index: int, attempt: int = 0, *, state: str, lost: str | None = None) -> AttemptSeen:
    return AttemptSeen(attempt, job(index, attempt), [pod(index, attempt, state=state)], lost)


def resolve(
    snap: BatchSnapshot,
    state: EngineState,
    options: BatchOptions,
    outcomes: dict[int, protocol.InputState],
    stop: protocol.StopRecord | None = None,
    now: float = NOW,
) -> batch_plan.BatchStep:
    """Take the step, answering its needs from ``outcomes``/``stop`` as a driver would."""
    plan = step(snap, state, options, now)
    rounds = 0
    while plan.need is not None:
        rounds += 1
        assert rounds <= 2, "a look needs at most outcomes, then the stop record"
        done = dict(snap.done)
        done.update({i: outcomes[i] for i in plan.need.outcomes if i in outcomes})
        snap = replace(
            snap,
            done=done,
            stop=stop if plan.need.stop else snap.stop,
            read=snap.read | set(plan.need.outcomes),
            stop_read=snap.stop_read or plan.need.stop,
        )
        plan = step(snap, state, options, now)
    return plan


# --- options and what the cluster shows -------------------------------------------------


def test_options_from_manifest() -> None:
    manifest: Any = {
        "group_id": GID,
        "total": 9,
        "options": {
            "max_concurrent": 0,
            "retries": 2,
            "fail_fast": True,
            "cancel_running_on_fail": False,
        },
    }
    o = BatchOptions.from_manifest(manifest, start_grace=12.0)
    assert (o.group_id, o.total, o.max_concurrent, o.retries) == (GID, 9, 1, 2)
    assert o.fail_fast
    assert not o.cancel_running_on_fail
    assert o.start_grace == 12.0


def test_cluster_attempts_keeps_the_latest_attempt_of_the_batch_with_its_pods() -> None:
    other = "grp-0123456789abcdee"
    jobs = [job(0), job(0, 2), job(0, 1), job(1), job(3, group=other)]
    pods = [pod(0, 2, state="running"), pod(0, 1, state="failed"), pod(1, state="succeeded")]
    out = cluster_attempts(GID, jobs, pods, {aid(1): "p-1-0"})
    assert sorted(out) == [0, 1]
    assert out[0].attempt == 2
    assert [p["metadata"]["name"] for p in out[0].pods] == ["p-0-2"]
    assert out[0].lost_pod is None
    assert out[1].lost_pod == "p-1-0"
    assert cluster_attempts(GID, [job(3, group=other)], pods, {}) == {}


# --- launching ------------------------------------------------------------------------------


def test_a_fresh_batch_launches_up_to_max_concurrent() -> None:
    plan = step(BatchSnapshot(), EngineState(), opts(max_concurrent=3), NOW)
    assert plan.need is None
    assert plan.actions == (Launch(0, 0), Launch(1, 0), Launch(2, 0))
    assert plan.state.alive == {0, 1, 2}
    assert plan.state.created[aid(1)] == (1, NOW)
    assert plan.wait == batch_plan.RECHECK_EVERY
    small = step(BatchSnapshot(), EngineState(), opts(total=1, max_concurrent=4), NOW)
    assert small.actions == (Launch(0, 0),)


def test_running_inputs_fill_the_slots_and_a_success_frees_one() -> None:
    o = opts(max_concurrent=2)
    first = step(BatchSnapshot(), EngineState(), o, NOW)
    snap = BatchSnapshot(attempts={0: seen(0, state="running"), 1: seen(1, state="running")})
    busy = step(snap, first.state, o, NOW + 1)
    assert busy.actions == ()
    assert busy.state.alive == {0, 1}
    assert busy.state.created == {}  # both seen: nothing awaited
    snap = replace(snap, attempts={**snap.attempts, 0: seen(0, state="succeeded")})
    plan = step(snap, busy.state, o, NOW + 2)
    assert plan.need == Need(outcomes=(0,))  # the outcome first
    plan = resolve(snap, busy.state, o, {0: "succeeded"})
    assert plan.actions == (Launch(2, 0),)
    assert plan.state.alive == {1, 2}


def test_a_created_job_not_seen_in_time_counts_as_gone() -> None:
    o = opts(total=1, max_concurrent=1, retries=1)
    first = step(BatchSnapshot(), EngineState(), o, NOW)
    waiting = step(BatchSnapshot(), first.state, o, NOW + 5)
    assert waiting.actions == ()
    assert waiting.state.alive == {0}
    assert waiting.wait == batch_plan.UNSEEN_GRACE
    late_at = NOW + batch_plan.UNSEEN_GRACE + 1
    late = step(BatchSnapshot(), waiting.state, o, late_at)
    assert late.need == Need(outcomes=(0,))  # it was alive, and no Job of it shows
    retried = resolve(BatchSnapshot(), waiting.state, o, {}, now=late_at)
    assert retried.actions == (Launch(0, 1),)
    assert aid(0) not in retried.state.created
    spent = resolve(BatchSnapshot(), waiting.state, replace(o, retries=0), {}, now=late_at)
    (give_up,) = spent.actions
    assert isinstance(give_up, GiveUp)
    assert give_up.error == batch_plan.GONE_REASON


# --- attempts that end without an outcome ----------------------------------------------------


def test_a_failed_attempt_is_retried_then_given_up() -> None:
    o = opts(total=1, max_concurrent=1, retries=1)
    state = step(BatchSnapshot(), EngineState(), o, NOW).state
    snap = BatchSnapshot(attempts={0: seen(0, state="failed")})
    plan = resolve(snap, state, o, {})
    assert plan.actions == (Launch(0, 1),)
    assert plan.launches[0].retry
    assert aid(0) in plan.state.handled
    snap = BatchSnapshot(attempts={0: seen(0, 1, state="failed")})
    last = resolve(snap, plan.state, o, {})
    (give_up,) = last.actions
    assert isinstance(give_up, GiveUp)
    assert (give_up.index, give_up.attempt, give_up.phase) == (0, 1, "execute")
    assert give_up.error  # the pod's own reason
    assert give_up.header()["state"] == "failed"
    assert give_up.header()["attempt"] == 1
    assert give_up.payload()["success"] is False
    # Once recorded, the same look decides nothing again.
    again = step(replace(snap, done={0: "failed"}), last.state, o, NOW)
    assert again.actions == ()


def test_an_outcome_written_by_the_pod_wins_over_retries() -> None:
    o = opts(total=1, max_concurrent=1, retries=3)
    state = step(BatchSnapshot(), EngineState(), o, NOW).state
    snap = BatchSnapshot(attempts={0: seen(0, state="failed")})
    plan = resolve(snap, state, o, {0: "failed"})  # the user's exception, recorded
    assert plan.actions == ()
    assert plan.state.alive == frozenset()


def test_the_stop_record_is_read_only_when_an_attempt_left_no_outcome() -> None:
    o = opts(total=2, max_concurrent=2)
    state = step(BatchSnapshot(), EngineState(), o, NOW).state
    ok = BatchSnapshot(attempts={0: seen(0, state="succeeded"), 1: seen(1, state="running")})
    first = step(ok, state, o, NOW)
    assert first.need == Need(outcomes=(0,))
    settled = replace(ok, done={0: "succeeded"}, read=frozenset({0}))
    assert step(settled, state, o, NOW).need is None
    silent = replace(ok, read=frozenset({0}))
    assert step(silent, state, o, NOW).need == Need(stop=True)


def test_a_lost_pod_with_no_retry_left_fails_its_input_as_preempted() -> None:
    o = opts(total=1, max_concurrent=1, retries=0)
    state = step(BatchSnapshot(), EngineState(), o, NOW).state
    lost = AttemptSeen(0, job(0), [], "p-0-0")
    snap = BatchSnapshot(attempts={0: lost}, lost=frozenset({aid(0)}))
    (give_up, delete) = resolve(snap, state, o, {}).actions
    assert isinstance(give_up, GiveUp)
    assert give_up.phase == "preempted"
    assert "deleted before the job finished" in give_up.error
    assert delete == DeleteAttempt(aid(0))


def test_a_lost_pod_gets_its_job_deleted_and_the_input_retried() -> None:
    o = opts(total=1, max_concurrent=1, retries=1)
    state = step(BatchSnapshot(), EngineState(), o, NOW).state
    lost = AttemptSeen(0, job(0), [], "p-0-0")
    snap = BatchSnapshot(attempts={0: lost}, lost=frozenset({aid(0)}))
    plan = resolve(snap, state, o, {})
    assert plan.actions == (DeleteAttempt(aid(0)), Launch(0, 1))


def test_jobs_deleted_under_a_running_input_end_it() -> None:
    o = opts(total=2, max_concurrent=2)
    state = step(BatchSnapshot(), EngineState(), o, NOW).state
    snap = BatchSnapshot(attempts={0: seen(0, state="running"), 1: seen(1, state="running")})
    state = step(snap, state, o, NOW).state
    gone = BatchSnapshot(attempts={1: seen(1, state="running")})  # input 0's Jobs vanished
    assert step(gone, state, o, NOW).need == Need(outcomes=(0,))
    plan = resolve(gone, state, o, {})
    (give_up,) = plan.actions
    assert isinstance(give_up, GiveUp)
    assert give_up.error == batch_plan.GONE_REASON
    # Its outcome was written meanwhile (it finished as it was deleted): nothing to do.
    assert resolve(gone, state, o, {0: "succeeded"}).actions == ()


# --- start grace ------------------------------------------------------------------------------


def test_an_attempt_that_cannot_start_fails_after_the_start_grace_without_retry() -> None:
    o = opts(total=2, max_concurrent=1, retries=2, start_grace=20.0)
    state = step(BatchSnapshot(), EngineState(), o, NOW).state
    snap = BatchSnapshot(attempts={0: seen(0, state="unschedulable")})
    stuck = step(snap, state, o, NOW)
    assert stuck.actions == ()
    assert stuck.state.alive == {0}
    assert stuck.state.stuck == {aid(0): NOW}
    assert stuck.wait == 20.0  # look again when the grace runs out
    later = step(snap, stuck.state, o, NOW + 15)
    assert later.wait == pytest.approx(5.0)
    assert later.state.stuck == {aid(0): NOW}  # since when, kept
    patient = step(snap, state, replace(o, start_grace=600.0), NOW)
    assert patient.wait == batch_plan.RECHECK_EVERY
    over = resolve(snap, stuck.state, o, {}, now=NOW + 21)
    give_up, delete, launch = over.actions
    assert isinstance(give_up, GiveUp)
    assert give_up.phase == START_PHASE
    assert give_up.attempt == 0  # not retried: it would not start either
    assert "could not start within 20s" in give_up.error
    assert "unschedulable" in give_up.error
    assert delete == DeleteAttempt(aid(0))
    assert launch == Launch(1, 0)


def test_a_started_attempt_is_no_longer_stuck() -> None:
    o = opts(total=1, max_concurrent=1)
    state = step(BatchSnapshot(), EngineState(), o, NOW).state
    stuck = step(BatchSnapshot(attempts={0: seen(0, state="unschedulable")}), state, o, NOW)
    running = step(BatchSnapshot(attempts={0: seen(0, state="running")}), stuck.state, o, NOW + 1)
    assert running.state.stuck == {}


# --- stopping -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kill", [False, True])
def test_fail_fast_stops_the_batch_after_a_final_failure(kill: bool) -> None:
    o = opts(total=4, max_concurrent=2, fail_fast=True, cancel_running_on_fail=kill)
    state = step(BatchSnapshot(), EngineState(), o, NOW).state
    snap = BatchSnapshot(attempts={0: seen(0, state="failed"), 1: seen(1, state="running")})
    plan = resolve(snap, state, o, {})
    give_up, stop = plan.actions
    assert isinstance(give_up, GiveUp)
    assert stop == StopBatch("fail_fast", "input 0 failed", kill=kill)
    assert not plan.launches  # nothing new starts
    if kill:
        assert plan.state.created == {}


def test_fail_fast_on_a_failure_the_pod_recorded() -> None:
    o = opts(total=4, max_concurrent=1, fail_fast=True)
    state = step(BatchSnapshot(), EngineState(), o, NOW).state
    snap = BatchSnapshot(attempts={0: seen(0, state="failed")})
    plan = resolve(snap, state, o, {0: "failed"})
    assert plan.actions == (StopBatch("fail_fast", "input 0 failed", kill=False),)
    ok = resolve(snap, state, o, {0: "succeeded"})
    assert ok.actions == (Launch(1, 0),)


def test_a_stopped_batch_launches_nothing_and_retries_nothing() -> None:
    o = opts(total=3, max_concurrent=1, retries=2)
    state = step(BatchSnapshot(), EngineState(), o, NOW).state
    cancel = protocol.stop_record("cancelled", "the batch was cancelled")
    snap = BatchSnapshot(attempts={0: seen(0, state="failed")}, stop=cancel)
    plan = resolve(snap, state, o, {})
    assert plan.actions == ()
    assert aid(0) in plan.state.handled  # settled as cancelled by the consumer
    # The stop is read when an input left no outcome: then too, nothing starts.
    unknown = replace(snap, stop=None)
    assert resolve(unknown, state, o, {}, stop=cancel).actions == ()


def test_after_a_kill_nothing_created_is_awaited() -> None:
    o = opts(total=3, max_concurrent=2)
    state = step(BatchSnapshot(), EngineState(), o, NOW).state
    assert state.created
    assert state.killed().created == {}
    assert state.killed().alive == state.alive


def test_a_failed_launch_is_forgotten() -> None:
    o = opts(total=3, max_concurrent=2)
    plan = step(BatchSnapshot(), EngineState(), o, NOW)
    state = plan.state.launch_failed(plan.launches, [aid(1)])
    assert set(state.created) == {aid(0)}
    assert state.alive == frozenset()
    retry = step(BatchSnapshot(), state, o, NOW + 1)
    # 0 is awaited (created): it counts as alive. 1 had an attempt (whose creation may
    # have reached the API server): the next one is a new Job.
    assert retry.actions == (Launch(1, 1),)


# --- a settled batch, and a look without driving ----------------------------------------------


def test_a_batch_whose_every_input_settled_does_nothing() -> None:
    o = opts(total=3, max_concurrent=2)
    done: dict[int, protocol.InputState] = {0: "succeeded", 1: "failed", 2: "cancelled"}
    snap = BatchSnapshot(
        attempts={i: seen(i, state="succeeded") for i in range(3)},
        done=done,
    )
    plan = step(snap, EngineState(alive=frozenset({2})), o, NOW)
    assert plan.need is None
    assert plan.actions == ()
    assert plan.state.alive == frozenset()


def test_seen_in_listing() -> None:
    o = opts(total=4, max_concurrent=3)
    state = step(BatchSnapshot(), EngineState(), o, NOW).state  # created 0, 1, 2
    jobs = [job(0), job(1, verdict="Complete")]
    after = seen_in_listing(state, GID, jobs, {3: "succeeded"})
    assert set(after.created) == {aid(2)}  # listed: no longer awaited
    assert after.alive == {0, 2}  # 1 has a verdict; 2 is awaited
    assert seen_in_listing(state, GID, jobs, {0: "succeeded", 2: "failed"}).alive == set()
