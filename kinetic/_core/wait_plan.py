"""The decisions of a waiter that follows one cluster job through the namespace's
watch. Pure: no IO, no clock, no loop.

Theory of operation
-------------------
A waiter (:meth:`kinetic._backends.cluster.ClusterBackend.wait`, for GKE and
pathways jobs alike) wakes on every change the watch shows for its job, and on the
timeouts decided here. Each pass is two pure
steps around the backend's own reading of the job's status:

* :func:`look`, before reading: is the job's object **podless** (its Job or
  LeaderWorkerSet exists without a pod), for how long, and are its events due (GKE
  reads a podless Job's events for the reason, at most every ``events_every``
  seconds once it has been podless for ``podless_after``)?
* :func:`judge`, after reading: does the waiter **end** the job (delete its cluster
  objects and record the outcome for every process: a job whose pod vanished before
  it finished, and on backends whose ended objects hold resources until deleted,
  every outcome), has a job that **cannot start** used up its ``start_grace`` (then
  it fails in phase ``start``), and how long may the waiter sleep before the next
  pass when nothing changes?

And one question in between (:func:`ask_if_unseen`): the watch may not have seen a
just-created Job yet, so a job that looks gone is asked after once, directly.

Timers use the waiter's monotonic clock, passed in as ``now``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kinetic._core import k8s_status
from kinetic._core.status import JobStatus, StatusReport, start_failure, start_grace_left

MIN_WAKE = 0.05
"""The shortest sleep between two passes."""


@dataclass(frozen=True)
class WaitRules:
    """How one backend waits.

    :ivar start_grace: seconds a job that cannot start may wait before it fails.
    :ivar podless_after: seconds an object may be podless before the reason is sought.
    :ivar events_every: when set, the object's events give that reason: read at most
        this often (and the waiter wakes this often while podless); when None, the
        podless time itself is the reason (the backend says so once past
        ``podless_after``, and the waiter wakes to say it).
    :ivar ends_outcomes: the waiter ends every job it sees end (its cluster objects
        hold resources until deleted), not only one whose pod was lost.
    """

    start_grace: float
    podless_after: float
    events_every: float | None = None
    ends_outcomes: bool = False


@dataclass(frozen=True)
class WaitState:
    """What a waiter remembers between passes (monotonic times)."""

    stuck_since: float | None = None
    podless_since: float | None = None
    events_at: float | None = None


@dataclass(frozen=True)
class Look:
    """What to read in this pass.

    :ivar podless_for: seconds the object has been podless (None: it is not).
    :ivar events_due: read the object's events.
    """

    podless_for: float | None
    events_due: bool


@dataclass(frozen=True)
class Verdict:
    """What the waiter does with the status it read.

    :ivar report: the status to report (a start failure once the grace is used up).
    :ivar end: delete the job's cluster objects and record ``report`` for everyone.
    :ivar gave_up: the job could not start within the grace: ``report`` says so, in
        phase ``start`` (``end`` is set).
    :ivar timeout: the longest sleep before the next pass (None: until a change).
    """

    report: StatusReport
    end: bool = False
    gave_up: bool = False
    timeout: float | None = None


def look(
    state: WaitState, rules: WaitRules, *, now: float, podless: bool
) -> tuple[WaitState, Look]:
    """The first step of a pass: ``podless`` says whether the job's object exists
    without a pod (as the watch shows it now)."""
    if not podless:
        return replace(state, podless_since=None), Look(podless_for=None, events_due=False)
    since = now if state.podless_since is None else state.podless_since
    podless_for = now - since
    due = (
        rules.events_every is not None
        and podless_for >= rules.podless_after
        and (state.events_at is None or now - state.events_at >= rules.events_every)
    )
    state = replace(state, podless_since=since, events_at=now if due else state.events_at)
    return state, Look(podless_for=podless_for, events_due=due)


def ask_if_unseen(report: StatusReport, *, seen: bool) -> bool:
    """Whether to ask the API server once whether the job's object exists: the status
    says FAILED while the watch has ``seen`` neither it nor a pod (a Job created a
    moment ago may not have reached the watch). When it does exist, the job is
    PENDING."""
    return report.status is JobStatus.FAILED and not seen


def judge(
    state: WaitState,
    rules: WaitRules,
    report: StatusReport,
    *,
    now: float,
    podless_for: float | None,
    lost: bool,
) -> tuple[WaitState, Verdict]:
    """The second step of a pass: what to do with ``report``, the job's status as read
    (``lost``: the watch saw a pod of the job deleted before it finished)."""
    status = report.status
    end = not report.cancelled and (
        (status is JobStatus.FAILED and lost)
        or (rules.ends_outcomes and status.is_terminal and status is not JobStatus.NOT_FOUND)
    )
    wakes: list[float] = []
    if k8s_status.cannot_start(report):
        stuck_since = now if state.stuck_since is None else state.stuck_since
        state = replace(state, stuck_since=stuck_since)
        left = start_grace_left(stuck_since=stuck_since, now=now, grace=rules.start_grace)
        if left <= 0:
            failed = start_failure(report.reason, rules.start_grace)
            return state, Verdict(failed, end=True, gave_up=True)
        wakes.append(left)
    elif not status.is_terminal:
        state = replace(state, stuck_since=None)
    if podless_for is not None:
        if rules.events_every is not None:
            wakes.append(rules.events_every)
        elif podless_for < rules.podless_after:  # wake to say it is late
            wakes.append(max(MIN_WAKE, rules.podless_after - podless_for))
    return state, Verdict(report, end=end, timeout=min(wakes) if wakes else None)
