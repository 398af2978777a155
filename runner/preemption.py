"""A GKE job's pod lost mid-attempt (preempted, evicted, its node gone), seen by the
pod that replaces it.

Kubernetes, not the runner, starts the replacement: the Job's ``podFailurePolicy``
counts a pod with a ``DisruptionTarget`` condition against ``backoffLimit`` (the job's
``retries`` count, :func:`kinetic._core.k8s_spec.job_manifest`), and a Kubernetes without
that policy replaces a deleted pod by itself. The lost pod could record nothing, so each
attempt leaves a small record as it starts (``running.json``: the pod, the attempt and
when it started; one write per attempt, on GKE only, where the pod's name is in
:data:`runner.protocol.POD_ENV`). A runner that finds one, with no final record (else it would not run:
the job is over), knows the attempt it names was lost:

* it records that attempt as failed in phase ``preempted`` (``attempts.json``, and the
  final record's ``attempts``), so ``status_report()`` and ``kinetic jobs status`` show it;
* it runs the next attempt when the job's ``retries`` count allows one more. A lost pod
  is retried whatever the retries' ``on``: it is no exception of the function. No delay:
  the replacement pod's start is one;
* else it records the job as failed in phase ``preempted``
  (:class:`kinetic.JobPreemptedError` for the caller), without running it again.

A pod lost before its function started (fetching, installing) left no record: its
replacement just starts over, and no attempt is counted. A pod lost after it recorded
the job's outcome (uploading its logs, exiting) leaves a replacement that finds the job
over (:func:`settled`) and exits: the outcome stands, nothing runs twice.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import Any

from runner import protocol
from runner.retry_rule import RetryRule
from runner.store import RunnerStore


class Preempted(Exception):
    """The failure of a job whose pod was lost mid-attempt, with no retry left."""


def pod_name(environ: Mapping[str, str]) -> str | None:
    """This pod's name, or None when the job does not run in a replaceable pod."""
    return environ.get(protocol.POD_ENV) or None


def settled(store: RunnerStore, job_id: str, pod: str | None) -> bool:
    """Whether a replacement pod finds the job over already: the pod before it recorded
    the job's outcome, then was lost (its logs' upload, its exit). The outcome stands:
    nothing runs again. Always False outside a replaceable pod (no read).

    :raises StoreUnavailable, OSError: reading the record failed (the caller's phase).
    """
    if pod is None:
        return False
    try:
        store.read(protocol.final_key(job_id))
    except FileNotFoundError:
        return False
    return True


def resume(
    store: RunnerStore, job_id: str, pod: str | None
) -> tuple[int, list[protocol.AttemptRecord]]:
    """The attempt to run now and the failed attempts before it: ``(1, [])`` unless a pod
    before this one was lost while it ran an attempt, which is then the last of them
    (and recorded in ``attempts.json``).

    :raises StoreUnavailable, OSError: reading the records failed (the caller's phase).
    """
    if pod is None:
        return 1, []
    try:
        running = _running(protocol.load_json(store.read(protocol.running_key(job_id))))
    except FileNotFoundError:
        return 1, []
    if running is None:
        return 1, []
    try:
        earlier = protocol.load_json(store.read(protocol.attempts_key(job_id)))
    except FileNotFoundError:
        earlier = []
    attempts = [a for a in _attempts(earlier) if a["attempt"] < running["attempt"]]
    attempts.append(lost_attempt(running, ended=time.time()))
    # Said at once: this pod may be lost too before any attempt of its own fails.
    store.write(protocol.attempts_key(job_id), protocol.dump_json(attempts))
    return running["attempt"] + 1, attempts


def lost_attempt(running: protocol.RunningRecord, *, ended: float) -> protocol.AttemptRecord:
    """The record of the attempt a lost pod was running."""
    return {
        "attempt": running["attempt"],
        "started": running["started"],
        "ended": ended,
        "phase": protocol.PREEMPTED_PHASE,
        "error": f"attempt {running['attempt']}'s pod {running['pod']} was lost before it "
        "finished (preempted, evicted, or its node went away)",
        "error_type": protocol.PREEMPTED_ERROR_TYPE,
    }


def allowed(retries: protocol.RetriesRecord | None, attempt: int) -> bool:
    """Whether attempt ``attempt`` may run after a lost one: the ``retries`` count allows
    ``count + 1`` attempts in all (none after a loss without ``retries=``)."""
    return attempt <= RetryRule.of_record(retries).count + 1


def mark(store: RunnerStore, job_id: str, pod: str | None, attempt: int) -> None:
    """Record that this pod starts ``attempt`` (nothing outside a replaceable pod).

    Best effort: a job whose record cannot be written still runs; a replacement of its
    pod then starts over without counting the lost attempt.
    """
    if pod is None:
        return
    record: protocol.RunningRecord = {"pod": pod, "attempt": attempt, "started": time.time()}
    try:
        store.write(protocol.running_key(job_id), protocol.dump_json(record))
    except Exception as exc:  # noqa: BLE001 - bookkeeping must not fail the job
        print(f"kinetic runner: could not record the running attempt ({exc})", file=sys.stderr)


def _running(obj: Any) -> protocol.RunningRecord | None:
    try:
        pod, attempt, started = str(obj["pod"]), int(obj["attempt"]), float(obj["started"])
    except (KeyError, TypeError, ValueError):
        return None
    return {"pod": pod, "attempt": attempt, "started": started} if attempt >= 1 else None


def _attempts(obj: Any) -> list[protocol.AttemptRecord]:
    if not isinstance(obj, list):
        return []
    out: list[protocol.AttemptRecord] = []
    for rec in obj:
        try:
            out.append(
                {
                    "attempt": int(rec["attempt"]),
                    "started": float(rec["started"]),
                    "ended": float(rec["ended"]),
                    "phase": str(rec["phase"]),
                    "error": str(rec["error"]),
                    "error_type": str(rec["error_type"]),
                }
            )
        except (KeyError, TypeError, ValueError):
            continue
    return out
