"""A GKE job's status from its Kubernetes objects and its records. Pure.

Inputs are the raw JSON of the job's ``batch/v1`` Job and pods (as the API server
sends them, camelCase keys), the runner's final record from storage, and the
Job's events. The rules, first match wins:

1. The runner's final record (``status.json``) is the truth: SUCCEEDED or FAILED
   with the runner's error and phase.
2. A cancel record: FAILED, ``cancelled``.
   Then a Job that Kubernetes ended at its deadline (``DeadlineExceeded``: a job's
   run-time limit, ``kinetic.run(timeout=)``, whose runner could not enforce it
   itself): FAILED in phase ``execute``, naming the limit, whatever its pod says.
3. A single job's pod lost before it finished (deleted; or failed to a disruption:
   preempted, evicted, its node shut down or gone; a batch's Jobs leave a lost pod to
   their driver: FAILED as the pod says): Kubernetes replaces it while the Job's
   ``backoffLimit`` (the ``retries`` count) allows, and the replacement's runner counts the
   lost attempt (:mod:`runner.preemption`). So, ``preempted``: the replacement pod's
   status, or PENDING until it exists; FAILED in phase ``preempted`` once the Job gave up
   (no retry left). A deleted pod whose Job failed by its ``podFailurePolicy`` (a person
   deleted it: its runner exited non-zero) or whose Job is gone stays a plain FAILED.
4. The newest pod: its phase and container state. A terminated container gives
   the reason (OOMKilled, killed by signal N, exit status N); one whose command
   could not start (no ``python3`` in a custom image) fails in phase ``fetch``, and
   one whose runner left its failure in the termination message (it could not open
   the store) in the phase it names.
5. A Job with no pod: its conditions, or the reason the Job controller could not
   create the pod (``FailedCreate`` events: a missing service account, quota, ...).
6. Neither: FAILED when the job is recorded (its Job was deleted), else NOT_FOUND.

A PENDING report carries a ``reason`` only when the job *cannot start*
(unschedulable, image pull failure, a missing Secret, pod creation refused): :func:`cannot_start`
tells such a report apart; waiting callers fail it after a grace time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from kinetic._core.k8s_spec import REPLACES_LOST_PODS, TIMEOUT_ANNOTATION
from kinetic._core.secret_spec import missing_secret
from kinetic._core.status import JobStatus, StatusReport, describe_exit, status_from_records
from runner.protocol import PREEMPTED_PHASE, parse_unrecorded_failure, time_limit_message

IMAGE_PROBLEMS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "RegistryUnavailable",
        "CreateContainerConfigError",
        "CreateContainerError",
    }
)
"""Container waiting reasons that mean the container will not start by itself."""

START_PHASE = "start"
"""The phase named when a job failed before the runner started."""

COMMAND_FAILURES = frozenset({"ContainerCannotRun", "StartError"})
"""Terminated reasons of a container whose command never ran (Docker's, containerd's):
the image has no such program (a custom image without ``python3``)."""
FETCH_PHASE = "fetch"
"""The runner's first phase: a job whose image cannot run the runner fails in it."""


def _get(obj: Mapping[str, Any] | None, *path: str) -> Any:
    cur: Any = obj
    for key in path:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(key)
    return cur


def _first_line(text: Any) -> str:
    return str(text or "").strip().splitlines()[0] if str(text or "").strip() else ""


def newest(objs: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The object created last (ISO timestamps sort as strings), or None."""
    if not objs:
        return None
    return max(objs, key=lambda o: str(_get(o, "metadata", "creationTimestamp") or ""))


def describe_terminated(state: Mapping[str, Any]) -> str:
    """Why a container ended, from its ``state.terminated``."""
    reason = state.get("reason") or ""
    code = state.get("exitCode")
    signal = state.get("signal")
    if reason == "OOMKilled":
        return "the container was killed: out of memory (OOMKilled)"
    if signal:
        return f"the container was killed by signal {signal}"
    if isinstance(code, int) and code > 128:
        return f"the container was killed by signal {code - 128} (exit status {code})"
    detail = f" ({reason})" if reason and reason not in ("Error", "Completed") else ""
    message = _first_line(state.get("message"))
    return (
        describe_exit(code if isinstance(code, int) else None)
        + detail
        + (f": {message}" if message else "")
    )


def _image_problem(status: Mapping[str, Any], namespace: str = "") -> StatusReport | None:
    """PENDING with the reason, when the container's image cannot be had, or a Secret
    it reads is missing (named, with its namespace)."""
    waiting = _get(status, "state", "waiting")
    if not isinstance(waiting, Mapping) or waiting.get("reason") not in IMAGE_PROBLEMS:
        return None
    image = status.get("image") or ""
    message = _first_line(waiting.get("message"))
    secret = missing_secret(message, namespace)
    if secret is not None:
        return StatusReport(JobStatus.PENDING, reason=f"cannot start the container: {secret}")
    return StatusReport(
        JobStatus.PENDING,
        reason=f"cannot start the container ({waiting['reason']}) for image {image!r}"
        + (f": {message}" if message else ""),
    )


def _init_report(status: Mapping[str, Any]) -> StatusReport | None:
    """What an init container (the runner's delivery into a custom image) says of the
    pod: FAILED in phase ``fetch`` when it failed, stuck when its image cannot be had."""
    terminated = _get(status, "state", "terminated")
    if isinstance(terminated, Mapping) and terminated.get("exitCode") not in (0, None):
        return StatusReport(
            JobStatus.FAILED,
            reason=f"Kinetic's runner could not be delivered into the pod from "
            f"{status.get('image') or ''!r}: {describe_terminated(terminated)}",
            phase=FETCH_PHASE,
        )
    return _image_problem(status)


DISRUPTION_REASONS = frozenset(
    {"Evicted", "Preempting", "Shutdown", "NodeShutdown", "Terminated", "NodeLost"}
)
"""Reasons of a failed pod that a disruption ended (kubelet eviction, a node's graceful
shutdown, as on a spot VM's preemption, a node gone), for a Kubernetes that does not
set the ``DisruptionTarget`` condition (before 1.26)."""

POLICY_FAILURE = "PodFailurePolicy"
"""The reason of a Job's ``Failed`` condition when a ``FailJob`` rule of its
``podFailurePolicy`` matched (:func:`kinetic._core.k8s_spec.pod_failure_policy`)."""


def disruption(pod: Mapping[str, Any]) -> str | None:
    """Why a failed pod was lost to a disruption (preempted, evicted, its node shut down
    or gone), or None when it was not (or has not failed)."""
    if _get(pod, "status", "phase") != "Failed":
        return None
    for cond in _get(pod, "status", "conditions") or []:
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
            why = str(cond.get("reason") or "DisruptionTarget")
            message = _first_line(cond.get("message"))
            return f"{why}: {message}" if message else why
    reason = _get(pod, "status", "reason")
    if reason in DISRUPTION_REASONS:
        message = _first_line(_get(pod, "status", "message"))
        return f"{reason}: {message}" if message else str(reason)
    return None


def lost_report(job: Mapping[str, Any], why: str) -> StatusReport:
    """A job whose pod was lost (``why``): PENDING while Kubernetes replaces the pod;
    FAILED in phase ``preempted`` once the Job gave up on it."""
    verdict = job_conditions_report(job)
    if verdict is None or verdict.status is not JobStatus.FAILED:
        return StatusReport(JobStatus.PENDING, preempted=True)
    return StatusReport(
        JobStatus.FAILED,
        reason=f"its pod was lost before the job finished ({why}) and no retry was left "
        "(run(retries=N) runs such a job again)",
        phase=PREEMPTED_PHASE,
        preempted=True,
    )


def pod_report(pod: Mapping[str, Any]) -> StatusReport:
    """The status one pod stands for (no records considered)."""
    phase = _get(pod, "status", "phase")
    statuses = _get(pod, "status", "containerStatuses") or []
    state: Mapping[str, Any] = statuses[0].get("state") or {} if statuses else {}
    terminated = state.get("terminated")
    if phase == "Succeeded":
        return StatusReport(JobStatus.SUCCEEDED)
    for init in _get(pod, "status", "initContainerStatuses") or []:
        report = _init_report(init)
        if report is not None:
            return report
    said = (
        parse_unrecorded_failure(str(terminated.get("message") or ""))
        if isinstance(terminated, Mapping)
        else None
    )
    if said is not None:  # the runner's last words, when no record could take them
        return StatusReport(JobStatus.FAILED, reason=said[1], phase=said[0])
    if isinstance(terminated, Mapping) and terminated.get("reason") in COMMAND_FAILURES:
        image = statuses[0].get("image") or ""
        return StatusReport(
            JobStatus.FAILED,
            reason=f"the image {image!r} cannot run Kinetic's runner, "
            f"{describe_terminated(terminated)}. A custom image needs `python3` of the "
            "submitting Python's version on its PATH (Kinetic brings the rest)",
            phase=FETCH_PHASE,
        )
    if phase == "Failed":
        if isinstance(terminated, Mapping):
            return StatusReport(JobStatus.FAILED, reason=describe_terminated(terminated))
        reason = _get(pod, "status", "reason") or "the pod failed"
        message = _first_line(_get(pod, "status", "message"))
        return StatusReport(JobStatus.FAILED, reason=f"{reason}: {message}" if message else reason)
    if isinstance(terminated, Mapping):
        code = terminated.get("exitCode")
        if code == 0:
            return StatusReport(JobStatus.SUCCEEDED)
        return StatusReport(JobStatus.FAILED, reason=describe_terminated(terminated))
    if isinstance(state.get("running"), Mapping):
        return StatusReport(JobStatus.RUNNING)
    namespace = str(_get(pod, "metadata", "namespace") or "")
    stuck = _image_problem(statuses[0], namespace) if statuses else None
    if stuck is not None:
        return stuck
    for cond in _get(pod, "status", "conditions") or []:
        if (
            cond.get("type") == "PodScheduled"
            and cond.get("status") == "False"
            and cond.get("reason") == "Unschedulable"
        ):
            message = _first_line(cond.get("message"))
            return StatusReport(
                JobStatus.PENDING,
                reason="unschedulable: no node can run it" + (f" ({message})" if message else ""),
            )
    return StatusReport(JobStatus.PENDING)


def job_conditions_report(job: Mapping[str, Any]) -> StatusReport | None:
    """The Job's own verdict (conditions ``Complete``/``Failed``), if it has one."""
    for cond in _get(job, "status", "conditions") or []:
        if cond.get("status") != "True":
            continue
        if cond.get("type") == "Complete":
            return StatusReport(JobStatus.SUCCEEDED)
        if cond.get("type") == "Failed":
            message = _first_line(cond.get("message")) or str(cond.get("reason") or "")
            return StatusReport(JobStatus.FAILED, reason=f"the Kubernetes Job failed: {message}")
    return None


DEADLINE_EXCEEDED = "DeadlineExceeded"
"""The reason of a Job's ``Failed`` condition once it ran past ``activeDeadlineSeconds``
(and of its ``FailureTarget`` condition, set first while its pod is being ended)."""


def deadline_report(job: Mapping[str, Any] | None) -> StatusReport | None:
    """FAILED in phase ``execute``, naming the run-time limit, when Kubernetes ended the
    Job at its deadline; else None."""
    for cond in _get(job, "status", "conditions") or []:
        if (
            cond.get("type") in ("Failed", "FailureTarget")
            and cond.get("status") == "True"
            and cond.get("reason") == DEADLINE_EXCEEDED
        ):
            break
    else:
        return None
    deadline = _get(job, "spec", "activeDeadlineSeconds")
    timeout = _get(job, "metadata", "annotations", TIMEOUT_ANNOTATION)
    try:
        limit = time_limit_message(float(timeout)) + " and "
    except (TypeError, ValueError):  # a deadline Kinetic did not set
        limit = ""
    return StatusReport(
        JobStatus.FAILED,
        reason=f"{limit}Kubernetes ended its Job at the Job's deadline "
        f"(activeDeadlineSeconds={deadline})",
        phase="execute",
    )


def failed_create_reason(events: Sequence[Mapping[str, Any]]) -> str | None:
    """Why the Job controller could not create the pod, from the Job's events."""
    relevant = [e for e in events if e.get("reason") == "FailedCreate"]
    if not relevant:
        return None
    last = max(relevant, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
    return f"cannot create the pod: {_first_line(last.get('message'))}"


def status_from_k8s(
    *,
    final: Mapping[str, Any] | None,
    cancelled: bool,
    job: Mapping[str, Any] | None,
    pods: Sequence[Mapping[str, Any]],
    lost_pod: str | None = None,
    events: Sequence[Mapping[str, Any]] = (),
    recorded: bool = True,
) -> StatusReport:
    """Derive a GKE job's status (rules in the module docstring).

    :param final: the runner's final record, if written.
    :param cancelled: a cancel record exists.
    :param job: the job's Job, or None when it does not exist.
    :param pods: the job's pods that exist now.
    :param lost_pod: the name of a pod of the job that was deleted before it finished.
    :param events: the Job's events (only ``FailedCreate`` ones matter).
    :param recorded: the job's handle is in storage.
    """
    settled = status_from_records(final=final, cancelled=cancelled)
    if settled is not None:
        return settled
    deadline = deadline_report(job)
    if deadline is not None:
        return deadline
    pod = newest(pods)
    replaced = job is not None and _replaces_lost_pods(job)
    if lost_pod is not None:
        deleted = f"pod {lost_pod} was deleted before the job finished (no result recorded)"
        if not replaced or job is None or _failed_by_policy(job):
            return StatusReport(JobStatus.FAILED, reason=deleted)
        if pod is not None:  # its replacement
            return replace(pod_report(pod), preempted=True)
        return lost_report(job, deleted)
    if pod is not None:
        why = disruption(pod) if replaced else None
        if why is not None and job is not None:
            return lost_report(job, why)
        return pod_report(pod)
    if job is not None:
        verdict = job_conditions_report(job)
        if verdict is not None:
            return verdict
        reason = failed_create_reason(events)
        return StatusReport(JobStatus.PENDING, reason=reason)
    if recorded:
        return StatusReport(
            JobStatus.FAILED,
            reason="its Kubernetes Job does not exist and it recorded no result "
            "(deleted, or never launched)",
        )
    return StatusReport(JobStatus.NOT_FOUND, reason="no records for this job")


def _replaces_lost_pods(job: Mapping[str, Any]) -> bool:
    return bool(_get(job, "metadata", "annotations", REPLACES_LOST_PODS) == "true")


def _failed_by_policy(job: Mapping[str, Any]) -> bool:
    return any(
        cond.get("type") == "Failed"
        and cond.get("status") == "True"
        and cond.get("reason") == POLICY_FAILURE
        for cond in _get(job, "status", "conditions") or []
    )


def cannot_start(report: StatusReport) -> bool:
    """Whether ``report`` says the job is stuck before starting (PENDING with a reason)."""
    return report.status is JobStatus.PENDING and report.reason is not None


def pod_finished(pod: Mapping[str, Any]) -> bool:
    """Whether a pod reached a terminal phase (its deletion then loses nothing)."""
    return _get(pod, "status", "phase") in ("Succeeded", "Failed")


def job_id_of(obj: Mapping[str, Any]) -> str | None:
    """The ``job-id`` label of a Job or pod."""
    value = _get(obj, "metadata", "labels", "job-id")
    return value if isinstance(value, str) else None
