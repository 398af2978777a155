"""The decisions of a GKE batch run by a worker pool. Pure: no IO, no clock, no loop.

The protocol as a whole (objects, invariants, failure model, limits, cost) is told in
``docs/pool-protocol.md``; this docstring names the objects a follower reads.

Theory of operation
-------------------
A pool batch is one Kubernetes Job whose pods (the workers, :mod:`runner.pool`) take
inputs from the recorded chunks, a *span* of consecutive inputs at a time. What is
known of the batch lives in storage, as objects whose names say almost everything
(:mod:`runner.protocol`):

* ``claims/{start}.{n}``: claim ``n`` of the span that starts at input ``start`` (its
  end, its first input, and the wall-clock time its lease holds until are inside).
  A span is **running** while its latest claim holds; once that lease ran out (its
  worker died) claim ``n + 1`` takes it over from its first input without an outcome,
  unless that input already had ``max_claims`` claims — then it is **failed** (its
  runs keep killing their workers). A takeover of a long span runs only a part of it:
  the rest is claimed afresh, span by span, by the idle workers;
* ``holes/{start}.{n}.{end}.{reach}.{slot}.{ms}``: claim ``n`` of the span at ``start``
  cut it at ``end`` (its first lease ending at ``ms``): inputs ``[end, reach)`` are
  claimed in slots of ``slot`` inputs (an
  announcement idle workers list often, instead of every claim); ``holes/settled``:
  every input has an outcome (the first worker that saw it tells the idle ones);
* ``bursts/{a}-{b}.{start}.{n}``: the outcomes of inputs ``[a, b)``, written together
  by the worker that holds the span: those inputs are **done** (the states are in the
  burst's records, read by followers; workers only list the names);
* ``results/{index}.res``: one input's outcome of its own (a cancel of that input, or a
  large result); it stands over any burst's record of the input;
* ``stop.json``: the batch was stopped (cancel, fail_fast, an unusable function):
  nothing new starts, and once nothing runs every input without an outcome never ran.

A :class:`PoolBook` holds that knowledge (:mod:`runner.pool.book`, re-exported here with
the pure pieces the workers share; the workers import nothing of ``kinetic``, and the
protocol as a whole is told in ``docs/pool-protocol.md``). The follower's step is here:

* :func:`follow_step` — what a follower (any client process) reports and does: the
  running inputs, the stop once nothing runs, and the failure of a pool that cannot
  run (its pods cannot start for ``start_grace`` seconds, the Kubernetes Job failed or
  ended with inputs unfinished), or the re-creation of a Job that vanished while
  inputs remained (a pool is stateless: a new one carries on). Looks at the cluster
  are rationed by :func:`look_due` (Kubernetes requests are the scarce resource:
  storage shows the progress).

Two clocks: leases compare wall-clock times written by different machines (the only
clock they share); timers local to a follower (start grace, look intervals) use its
monotonic clock. Both are passed in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from kinetic._core import k8s_status
from kinetic._core.status import START_PHASE, JobStatus, could_not_start, start_grace_left
from runner import protocol
from runner.pool.book import PoolBook, stop_kills
from runner.pool.options import PoolOptions
from runner.pool.spans import Span, parse_claim

__all__ = [
    "ClusterView",
    "FollowDecision",
    "FollowState",
    "PoolBook",
    "PoolOptions",
    "Span",
    "cluster_view",
    "failure",
    "follow_step",
    "look_due",
    "parse_claim",
    "span_of",
    "stop_kills",
]

IDLE_LOOK = 2.0
"""Seconds before the first look at the cluster once storage shows no progress. While
nothing changes and no pod is stuck (pods starting), the interval doubles up to
:data:`BUSY_LOOK`; a stuck pod keeps it here, so the start grace is enforced in time."""
BUSY_LOOK = 30.0
"""Seconds between looks at the cluster while inputs keep finishing."""
STOPPED_LOOK = 1.0
"""Seconds between looks while a stopped batch still has pods."""
ENDING_SLACK = 2.0
"""Seconds past a deleted pod's ``deletionTimestamp`` (when it is killed, by the API
server's clock) that it still counts as ending: the clocks of the client and of the
cluster differ a little."""
MIN_POLL = 0.2
MAX_POLL = 2.0
"""Bounds of a follower's storage polling interval (it backs off while nothing changes)."""


# --- the follower's step -----------------------------------------------------------------


def span_of(book: PoolBook, index: int) -> Span | None:
    """The latest claim read of the span that holds input ``index``, or None."""
    best: Span | None = None
    for span in book.spans.values():
        if span.start <= index < span.end and (best is None or span.start > best.start):
            best = span
    return best


@dataclass(frozen=True)
class ClusterView:
    """The pool's Kubernetes side at one look.

    :ivar exists: the Job exists.
    :ivar active: pods that have not finished (and are not being deleted).
    :ivar ending: pods being deleted, not finished, whose grace has not run out: their
        workers may still write the outcomes they buffered (a cancelled batch's stop is
        reported once there is none).
    :ivar started: of those, pods whose container started.
    :ivar stuck: why a pod cannot start (image pull failure, unschedulable), if one cannot.
    :ivar verdict: the Job's own verdict: ``"complete"``, ``"failed"`` or None.
    :ivar reason: why the Job failed (with the last failed pod's reason when known).
    """

    exists: bool
    active: int = 0
    ending: int = 0
    started: int = 0
    stuck: str | None = None
    verdict: str | None = None
    reason: str | None = None


def cluster_view(
    job: Mapping[str, Any] | None,
    pods: Sequence[Mapping[str, Any]],
    *,
    job_known: bool,
    wall: float | None = None,
) -> ClusterView:
    """Summarize the pool's Job and pods.

    :param job: the Job, or None when it does not exist (or was not asked for).
    :param pods: the pool's pods that exist.
    :param job_known: whether ``job`` was asked for; if not, live pods imply the Job.
    :param wall: the wall-clock time, to tell the pods being deleted whose grace has not
        run out (``ending``); None counts none.
    """
    active = started = ending = 0
    stuck: str | None = None
    failed_reason: str | None = None
    for pod in pods:
        deleted = (pod.get("metadata") or {}).get("deletionTimestamp")
        if deleted:
            killed = _timestamp(deleted)
            alive = not k8s_status.pod_finished(pod)
            if alive and wall is not None and killed is not None:
                ending += wall < killed + ENDING_SLACK
            continue
        report = k8s_status.pod_report(pod)
        if report.status is JobStatus.FAILED:
            failed_reason = report.reason
        if k8s_status.pod_finished(pod) or report.status.is_terminal:
            continue
        active += 1
        if report.status is JobStatus.RUNNING:
            started += 1
        elif k8s_status.cannot_start(report) and stuck is None:
            stuck = report.reason
    if not job_known:
        return ClusterView(
            exists=active > 0, active=active, ending=ending, started=started, stuck=stuck
        )
    if job is None:
        return ClusterView(exists=False, ending=ending)
    verdict_report = k8s_status.job_conditions_report(job)
    verdict: str | None = None
    reason: str | None = None
    if verdict_report is not None:
        verdict = "complete" if verdict_report.status is JobStatus.SUCCEEDED else "failed"
        if verdict == "failed":
            reason = str(verdict_report.reason)
            if failed_reason:
                reason += f" (last worker: {failed_reason})"
    return ClusterView(
        exists=True,
        active=active,
        ending=ending,
        started=started,
        stuck=stuck,
        verdict=verdict,
        reason=reason,
    )


def _timestamp(value: object) -> float | None:
    """A Kubernetes timestamp (RFC 3339, UTC) as a POSIX time, or None."""
    try:
        return datetime.fromisoformat(str(value)).timestamp()  # "Z" since Python 3.11
    except ValueError:
        return None


@dataclass(frozen=True)
class FollowState:
    """A follower's memory between steps (monotonic times)."""

    last_look: float | None = None
    view: ClusterView | None = None
    looked_since_stop: bool = False
    last_progress: float = 0.0
    progress_mark: int = -1
    stuck_since: float | None = None
    poll: float = MIN_POLL
    idle_look: float = IDLE_LOOK


@dataclass(frozen=True)
class FollowDecision:
    """What a follower does after one look at storage (and maybe the cluster).

    :ivar state: the follower's memory for the next step.
    :ivar running: inputs running now, as far as can be told.
    :ivar stopped: the stop record, once the batch stopped and nothing of it runs.
    :ivar fail: a stop record to write (the pool cannot run); its Job is then deleted.
    :ivar create_job: nobody runs the unfinished batch: create its Job (again).
    :ivar wait: seconds until the next step.
    """

    state: FollowState
    running: list[int] = field(default_factory=list)
    stopped: protocol.StopRecord | None = None
    fail: protocol.StopRecord | None = None
    create_job: bool = False
    wait: float = MIN_POLL


def look_due(state: FollowState, *, now: float, stopped: bool) -> bool:
    """Whether the follower should look at the cluster before its next decision."""
    if state.last_look is None:
        return True
    since = now - state.last_look
    if stopped:
        return not state.looked_since_stop or since >= STOPPED_LOOK
    if now - state.last_progress >= IDLE_LOOK:
        return since >= state.idle_look
    return since >= BUSY_LOOK


def failure(detail: str, phase: str) -> protocol.StopRecord:
    """The stop record of a pool that cannot run its inputs: each fails with ``detail``."""
    return protocol.stop_record("failed", detail, phase)


def follow_step(
    book: PoolBook,
    state: FollowState,
    *,
    view: ClusterView | None,
    now: float,
    wall: float,
    start_grace: float,
) -> FollowDecision:
    """One decision of a follower.

    :param view: what a look at the cluster just showed, or None when it did not look.
    :param now: the follower's monotonic time; :param wall: the wall-clock time.
    :param start_grace: seconds the pool may be unable to start before it fails.
    """
    mark = book.changes
    progressed = mark != state.progress_mark
    poll = MIN_POLL if progressed else min(MAX_POLL, state.poll * 1.5)
    new = replace(
        state,
        progress_mark=mark,
        last_progress=now if progressed else state.last_progress,
        poll=poll,
    )
    if view is not None:
        quiet = view.stuck is None and now - new.last_progress >= IDLE_LOOK
        idle_look = min(BUSY_LOOK, state.idle_look * 2) if quiet else IDLE_LOOK
        new = replace(
            new,
            last_look=now,
            view=view,
            looked_since_stop=book.stop is not None,
            idle_look=idle_look,
        )
    seen = new.view
    running = book.running(wall) if seen is None or seen.active > 0 else []
    if book.settled:
        return FollowDecision(state=new, running=[], wait=poll)
    if book.stop is not None:
        # Deleted workers may still write their bursts (SIGTERM): not before they ended.
        idle = new.looked_since_stop and seen is not None and seen.active == seen.ending == 0
        if idle:
            return FollowDecision(state=new, stopped=book.stop.copy(), wait=poll)
        return FollowDecision(state=new, running=running, wait=min(poll, STOPPED_LOOK))
    if seen is None or view is None:
        return FollowDecision(state=new, running=running, wait=poll)
    # A fresh look at an unfinished, unstopped batch.
    left = book.options.total - len(book.outcomes)
    if not seen.exists:
        return FollowDecision(state=new, running=[], create_job=True, wait=MIN_POLL)
    if seen.verdict == "failed":
        return FollowDecision(
            state=new, fail=failure(str(seen.reason or "the Kubernetes Job failed"), "execute")
        )
    if seen.verdict == "complete" and seen.active == 0:
        detail = f"the worker pool ended with {left} input(s) left without an outcome"
        return FollowDecision(state=new, fail=failure(detail, "execute"))
    if seen.stuck is not None and seen.started == 0:
        since = new.stuck_since if new.stuck_since is not None else now
        new = replace(new, stuck_since=since)
        left_s = start_grace_left(stuck_since=since, now=now, grace=start_grace)
        if left_s <= 0:
            detail = could_not_start(seen.stuck, start_grace, subject="the worker pool")
            return FollowDecision(state=new, fail=failure(detail, START_PHASE))
        return FollowDecision(state=new, running=running, wait=min(poll, max(MIN_POLL, left_s)))
    return FollowDecision(state=replace(new, stuck_since=None), running=running, wait=poll)
