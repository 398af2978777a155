"""The decisions of a GKE batch run with one Kubernetes Job per input. Pure: no IO, no
clock, no loop.

Theory of operation
-------------------
With ``pod_per_input=True`` each input of a batch runs as its own Kubernetes Job, one
per attempt (``kinetic-{member job id}``, then ``…-a{n}`` for retries), labelled with
the batch, the input's index and the attempt. A driver
(:mod:`kinetic._backends.gke.batch`) advances the batch while someone awaits it. At
each change it takes a :class:`BatchSnapshot` — what the cluster shows (the latest
attempt of each input and its pods, from the namespace's watch) and what storage shows
(the outcomes known, the stop record) — and asks :func:`step` what to do, given its
:class:`EngineState` (its memory between looks), the :class:`BatchOptions` and its
monotonic clock. :func:`step` answers a :class:`BatchStep`:

1. each input whose latest attempt ended (its pod finished or failed, it cannot start
   for ``start_grace`` seconds, or its Jobs vanished after it was seen running) needs
   its outcome object read first (written by the pod's runner): the step asks for it
   (:class:`Need`) and is taken again with the answer — likewise the stop record,
   read only when an ended input left no outcome;
2. an ended attempt without an outcome is retried (:class:`Launch` of the next attempt)
   while ``retries`` allow and it could start, else the input fails with the reason
   (:class:`GiveUp`); an attempt whose pod was deleted, or which cannot start, has its
   Job deleted (:class:`DeleteAttempt`: no replacement pod, no Job left waiting);
3. with ``fail_fast``, a final failure stops the batch (:class:`StopBatch`, which ends
   the running inputs too with ``cancel_running_on_fail``);
4. unless the batch stopped, queued inputs (retries first) are launched until
   ``max_concurrent`` are alive;
5. :attr:`BatchStep.wait` says when to look again if the cluster reports nothing (an
   attempt waiting out its start grace, a Job created but not seen yet).

A Job created but not seen by the watch within :data:`UNSEEN_GRACE` seconds is
created again (its name is deterministic: ``409`` if it exists). A stopped batch
launches nothing; its inputs without an outcome are settled as cancelled by the
consumer once nothing of it runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeAlias

from kinetic._core import k8s_spec, k8s_status
from kinetic._core.status import (
    START_PHASE,
    JobStatus,
    StatusReport,
    start_failure,
    start_grace_left,
)
from runner import protocol

__all__ = [
    "RECHECK_EVERY",
    "UNSEEN_GRACE",
    "Action",
    "AttemptSeen",
    "BatchOptions",
    "BatchSnapshot",
    "BatchStep",
    "DeleteAttempt",
    "EngineState",
    "GiveUp",
    "Launch",
    "Need",
    "StopBatch",
    "cluster_attempts",
    "seen_in_listing",
    "step",
]

UNSEEN_GRACE = 30.0
"""Seconds a Job we created may stay unseen by the watch before it is created again."""
RECHECK_EVERY = 30.0
"""Seconds between two looks at the batch when the watch reports nothing."""
GONE_REASON = "its Kubernetes Job was deleted"
SILENT_REASON = "the pod ended without recording an outcome"


@dataclass(frozen=True)
class BatchOptions:
    """What the manifest says about running the batch, and the backend's start grace.

    :ivar group_id: the batch.
    :ivar total: number of inputs.
    :ivar max_concurrent: inputs alive at once (at least 1).
    :ivar retries: extra attempts of an input whose attempt ended without an outcome.
    :ivar fail_fast: stop the batch after the first final failure.
    :ivar cancel_running_on_fail: with ``fail_fast``, end the running inputs too.
    :ivar start_grace: seconds an attempt may be unable to start before the input fails.
    """

    group_id: str
    total: int
    max_concurrent: int = 1
    retries: int = 0
    fail_fast: bool = False
    cancel_running_on_fail: bool = False
    start_grace: float = 300.0

    @classmethod
    def from_manifest(cls, manifest: protocol.BatchManifest, *, start_grace: float) -> BatchOptions:
        options = manifest["options"]
        return cls(
            group_id=manifest["group_id"],
            total=int(manifest["total"]),
            max_concurrent=max(1, int(options["max_concurrent"])),
            retries=int(options["retries"]),
            fail_fast=bool(options["fail_fast"]),
            cancel_running_on_fail=bool(options["cancel_running_on_fail"]),
            start_grace=start_grace,
        )


# --- what the driver shows the step ----------------------------------------------------


@dataclass(frozen=True)
class AttemptSeen:
    """The latest attempt of one input that the cluster shows.

    :ivar attempt: its number (0 first).
    :ivar job: its Kubernetes Job.
    :ivar pods: its pods that exist.
    :ivar lost_pod: the name of a pod of it deleted before it finished, if any.
    """

    attempt: int
    job: Mapping[str, Any]
    pods: Sequence[Mapping[str, Any]] = ()
    lost_pod: str | None = None

    def report(self) -> StatusReport:
        """The attempt's status as the cluster shows it (its outcome aside)."""
        return k8s_status.status_from_k8s(
            final=None, cancelled=False, job=self.job, pods=self.pods, lost_pod=self.lost_pod
        )


def _labels(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return (obj.get("metadata") or {}).get("labels") or {}


def cluster_attempts(
    group_id: str,
    jobs: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    lost: Mapping[str, str],
) -> dict[int, AttemptSeen]:
    """The latest attempt of each input of ``group_id`` among ``jobs`` (a namespace's
    Jobs), with its pods (among ``pods``) and its lost pod (``lost``: job id -> the name
    of its pod deleted before it finished)."""
    latest: dict[int, tuple[int, Mapping[str, Any]]] = {}
    for obj in jobs:
        labels = _labels(obj)
        if labels.get(k8s_spec.GROUP_ID_LABEL) != group_id:
            continue
        index = int(labels.get(k8s_spec.GROUP_INDEX_LABEL, -1))
        attempt = int(labels.get(k8s_spec.ATTEMPT_LABEL, 0))
        if index >= 0 and (index not in latest or attempt > latest[index][0]):
            latest[index] = (attempt, obj)
    if not latest:
        return {}
    by_job: dict[str, list[Mapping[str, Any]]] = {}
    for pod in pods:
        job_id = k8s_status.job_id_of(pod)
        if job_id is not None:
            by_job.setdefault(job_id, []).append(pod)
    out: dict[int, AttemptSeen] = {}
    for index, (attempt, obj) in latest.items():
        attempt_id = protocol.member_attempt_id(group_id, index, attempt)
        out[index] = AttemptSeen(attempt, obj, by_job.get(attempt_id, []), lost.get(attempt_id))
    return out


@dataclass(frozen=True)
class BatchSnapshot:
    """What the cluster and storage show of the batch at one look.

    :ivar attempts: the cluster: the latest attempt of each input that has a Job.
    :ivar lost: the cluster: attempt ids of the batch whose pod was deleted before it
        finished.
    :ivar done: storage: the final state of each input whose outcome is known, those
        read during this look included.
    :ivar stop: storage: the stop record, if known.
    :ivar read: inputs whose outcome was looked for during this look, as a :class:`Need`
        asked (absent unless in ``done``). The cluster part stays as it was: the inputs
        known done *before* the look are ``done`` less ``read``.
    :ivar stop_read: the stop record was looked for during this look.
    """

    attempts: Mapping[int, AttemptSeen] = field(default_factory=dict)
    lost: frozenset[str] = frozenset()
    done: Mapping[int, protocol.InputState] = field(default_factory=dict)
    stop: protocol.StopRecord | None = None
    read: frozenset[int] = frozenset()
    stop_read: bool = False


@dataclass(frozen=True)
class EngineState:
    """The driver's memory between looks (monotonic times).

    :ivar created: attempt id -> (input, when) of Jobs created and not seen yet.
    :ivar handled: attempts whose end was dealt with (retried, failed or dropped).
    :ivar attempts: input -> its latest attempt known.
    :ivar alive: inputs running (or starting) at the last look.
    :ivar stuck: attempt id -> since when it cannot start.
    """

    created: Mapping[str, tuple[int, float]] = field(default_factory=dict)
    handled: frozenset[str] = frozenset()
    attempts: Mapping[int, int] = field(default_factory=dict)
    alive: frozenset[int] = frozenset()
    stuck: Mapping[str, float] = field(default_factory=dict)

    def killed(self) -> EngineState:
        """The state once the batch's Jobs were deleted: nothing created is awaited."""
        return replace(self, created={})

    def launch_failed(self, launches: Iterable[Launch], failed: Iterable[str]) -> EngineState:
        """The state once creating ``launches`` raised: the Jobs whose creation failed
        (attempt ids ``failed``) are not awaited, and none of the inputs counts as alive
        (the next look sees the Jobs that were created)."""
        created = dict(self.created)
        for attempt_id in failed:
            created.pop(attempt_id, None)
        return replace(self, created=created, alive=self.alive - {a.index for a in launches})


# --- what the step asks for --------------------------------------------------------------


@dataclass(frozen=True)
class Launch:
    """Create the Job of attempt ``attempt`` of input ``index`` (a retry when > 0)."""

    index: int
    attempt: int

    @property
    def retry(self) -> bool:
        return self.attempt > 0


@dataclass(frozen=True)
class GiveUp:
    """Record input ``index`` failed (its ``attempt`` ended without an outcome)."""

    index: int
    attempt: int
    error: str
    phase: str

    def header(self) -> protocol.OutcomeHeader:
        return protocol.ended_header("failed", self.attempt, self.error, self.phase)

    def payload(self) -> dict[str, Any]:
        """The result payload to pickle (the input's exception is its reason)."""
        return protocol.result_payload(
            success=False, phase=self.phase, error=self.error, error_type=""
        )


@dataclass(frozen=True)
class DeleteAttempt:
    """Delete the Job of attempt ``attempt_id`` and its pods (none replaces them)."""

    attempt_id: str


@dataclass(frozen=True)
class StopBatch:
    """Record the stop (unless one stands); with ``kill``, delete the batch's Jobs."""

    reason: protocol.StopReason
    detail: str
    kill: bool


Action: TypeAlias = Launch | GiveUp | DeleteAttempt | StopBatch


@dataclass(frozen=True)
class Need:
    """Storage to read before the step can decide: the outcomes of ``outcomes``, the
    stop record (``stop``). The driver reads them and takes the step again."""

    outcomes: tuple[int, ...] = ()
    stop: bool = False


@dataclass(frozen=True)
class BatchStep:
    """What :func:`step` decided.

    :ivar state: the driver's memory once ``actions`` are done.
    :ivar actions: to perform in order (the launches may go together).
    :ivar need: storage to read first; then nothing else is decided.
    :ivar wait: seconds until the next look when the cluster reports nothing.
    """

    state: EngineState
    actions: tuple[Action, ...] = ()
    need: Need | None = None
    wait: float = RECHECK_EVERY

    @property
    def launches(self) -> list[Launch]:
        return [a for a in self.actions if isinstance(a, Launch)]


# --- the step ------------------------------------------------------------------------------


Ended: TypeAlias = dict[int, tuple[int, StatusReport]]
"""Inputs whose latest attempt ended: input -> (attempt, how it ended)."""


@dataclass
class _Look:
    """What one look at the cluster taught (built by :func:`_observe`)."""

    attempts: dict[int, int]
    created: dict[str, tuple[int, float]]
    stuck: dict[str, float]
    alive: set[int] = field(default_factory=set)
    ended: Ended = field(default_factory=dict)
    wait: float = RECHECK_EVERY


def _observe(snap: BatchSnapshot, state: EngineState, options: BatchOptions, now: float) -> _Look:
    """Which inputs are alive and which attempts ended, as the cluster shows them."""
    look = _Look(dict(state.attempts), dict(state.created), dict(state.stuck))
    for index, seen in snap.attempts.items():
        look.attempts[index] = max(seen.attempt, look.attempts.get(index, 0))
        attempt_id = protocol.member_attempt_id(options.group_id, index, seen.attempt)
        look.created.pop(attempt_id, None)
        if not _done_before(snap, index) and attempt_id not in state.handled:
            _observe_attempt(look, index, seen, attempt_id, options.start_grace, now)
    for attempt_id, (index, when) in list(look.created.items()):
        if now - when > UNSEEN_GRACE:
            look.created.pop(attempt_id)  # never seen: create it again (409 if it exists)
        else:
            look.alive.add(index)
            look.wait = min(look.wait, UNSEEN_GRACE)
    # An input seen running before whose Jobs are all gone (deleted): it ended too.
    for index in state.alive - look.alive - set(snap.attempts):
        if not _done_before(snap, index):
            gone = StatusReport(JobStatus.FAILED, reason=GONE_REASON)
            look.ended.setdefault(index, (look.attempts.get(index, 0), gone))
    return look


def _observe_attempt(
    look: _Look, index: int, seen: AttemptSeen, attempt_id: str, grace: float, now: float
) -> None:
    """Count the unsettled latest attempt of ``index`` alive or ended (a start grace
    spent included)."""
    report = seen.report()
    if report.status.is_terminal:
        look.ended[index] = (seen.attempt, report)
    elif k8s_status.cannot_start(report):
        since = look.stuck.setdefault(attempt_id, now)
        left = start_grace_left(stuck_since=since, now=now, grace=grace)
        if left <= 0:  # not retried: it would not start either
            look.ended[index] = (seen.attempt, start_failure(report.reason, grace))
        else:
            look.alive.add(index)
            look.wait = min(look.wait, left)
    else:
        look.stuck.pop(attempt_id, None)
        look.alive.add(index)


def _done_before(snap: BatchSnapshot, index: int) -> bool:
    """Whether ``index`` was known done before this look read anything."""
    return index in snap.done and index not in snap.read


def _need(snap: BatchSnapshot, ended: Ended) -> Need | None:
    """What to read before deciding about ``ended``: their outcomes, then (when one has
    none) the stop record."""
    unread = tuple(i for i in ended if i not in snap.done and i not in snap.read)
    if unread:
        return Need(outcomes=unread)
    silent = any(i not in snap.done for i in ended)
    if silent and snap.stop is None and not snap.stop_read:
        return Need(stop=True)
    return None


def _settle(
    snap: BatchSnapshot, state: EngineState, options: BatchOptions, ended: Ended
) -> tuple[list[Action], frozenset[str]]:
    """Retry, fail or drop the ended attempts that left no outcome; stop on fail_fast.

    :returns: the actions, and the attempts handled from now on.
    """
    handled = set(state.handled)
    gave_up: list[Action] = []
    deletes: list[Action] = []
    for index, (attempt, report) in ended.items():
        if index in snap.done:
            continue
        attempt_id = protocol.member_attempt_id(options.group_id, index, attempt)
        handled.add(attempt_id)
        if snap.stop is not None:
            continue  # never retried: settled as cancelled once nothing runs
        cannot_start = report.phase == START_PHASE
        if attempt_id in snap.lost or cannot_start:
            deletes.append(DeleteAttempt(attempt_id))  # no replacement pod; no Job waiting
        if attempt < options.retries and not cannot_start:
            continue  # the launch below starts the next attempt
        error = report.reason or SILENT_REASON
        # A pod lost before it finished (preempted, evicted, deleted): no retry left.
        phase = protocol.PREEMPTED_PHASE if attempt_id in snap.lost else report.phase
        gave_up.append(GiveUp(index, attempt, error, phase or "execute"))
    actions = gave_up + deletes
    stop = _fail_fast(snap, options, ended, gave_up)
    if stop is not None:
        actions.append(stop)
    return actions, frozenset(handled)


def _fail_fast(
    snap: BatchSnapshot, options: BatchOptions, ended: Ended, gave_up: list[Action]
) -> StopBatch | None:
    """The stop of a ``fail_fast`` batch one of whose ended inputs failed for good."""
    if not options.fail_fast or snap.stop is not None:
        return None
    failed = {a.index for a in gave_up if isinstance(a, GiveUp)}
    for index in ended:
        if snap.done.get(index) == "failed" or index in failed:
            kill = options.cancel_running_on_fail
            return StopBatch("fail_fast", f"input {index} failed", kill=kill)
    return None


def _launches(
    options: BatchOptions,
    done: Mapping[int, protocol.InputState],
    gave_up: set[int],
    alive: set[int],
    attempts: Mapping[int, int],
) -> list[Launch]:
    """Queued inputs to start (retries first) up to ``max_concurrent`` alive."""
    room = options.max_concurrent - len(alive)
    if room <= 0:
        return []
    retry: list[Launch] = []
    fresh: list[Launch] = []
    for index in range(options.total):
        if index in done or index in gave_up or index in alive:
            continue
        if index in attempts:  # it ran and ended without an outcome: retry
            retry.append(Launch(index, attempts[index] + 1))
        else:
            fresh.append(Launch(index, 0))
        if len(fresh) >= room:
            break
    return (retry + fresh)[:room]


def step(snap: BatchSnapshot, state: EngineState, options: BatchOptions, now: float) -> BatchStep:
    """One decision of the driver (the module docstring's steps 1-5).

    :param now: the driver's monotonic time; pass the same value again when taking the
        step once more with what a :class:`Need` asked for.
    """
    look = _observe(snap, state, options, now)
    need = _need(snap, look.ended)
    if need is not None:
        return BatchStep(state=state, need=need, wait=look.wait)
    actions, handled = _settle(snap, state, options, look.ended)
    new = EngineState(
        created=look.created,
        handled=handled,
        attempts=look.attempts,
        alive=frozenset(look.alive),
        stuck=look.stuck,
    )
    stop = next((a for a in actions if isinstance(a, StopBatch)), None)
    if stop is not None and stop.kill:
        new = new.killed()
    if snap.stop is None and stop is None:
        gave_up = {a.index for a in actions if isinstance(a, GiveUp)}
        launches = _launches(options, snap.done, gave_up, look.alive, look.attempts)
        if launches:
            actions = [*actions, *launches]
            new = _launched(new, options, launches, now)
    return BatchStep(state=new, actions=tuple(actions), wait=look.wait)


def _launched(
    state: EngineState, options: BatchOptions, launches: list[Launch], now: float
) -> EngineState:
    created = dict(state.created)
    attempts = dict(state.attempts)
    for launch in launches:
        attempt_id = protocol.member_attempt_id(options.group_id, launch.index, launch.attempt)
        created[attempt_id] = (launch.index, now)
        attempts[launch.index] = max(launch.attempt, attempts.get(launch.index, 0))
    alive = state.alive | {launch.index for launch in launches}
    return replace(state, created=created, attempts=attempts, alive=alive)


def seen_in_listing(
    state: EngineState,
    group_id: str,
    jobs: Iterable[Mapping[str, Any]],
    done: Mapping[int, protocol.InputState],
) -> EngineState:
    """The state after one listing of the batch's Jobs (a look without driving): the
    Jobs listed are no longer awaited; alive are the inputs without an outcome whose Job
    has no verdict yet, or was created and not seen yet."""
    created = dict(state.created)
    alive: set[int] = set()
    for obj in jobs:
        labels = _labels(obj)
        index = int(labels.get(k8s_spec.GROUP_INDEX_LABEL, -1))
        created.pop(str(labels.get(k8s_spec.JOB_ID_LABEL)), None)
        over = k8s_status.job_conditions_report(obj) is not None
        if index >= 0 and index not in done and not over:
            alive.add(index)
    alive.update(i for i, _ in created.values() if i not in done)
    return replace(state, created=created, alive=frozenset(alive))
