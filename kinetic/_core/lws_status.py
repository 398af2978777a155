"""A multi-host job's status from its LeaderWorkerSet, its pods and its hosts' records. Pure.

Inputs: the job-level final record (written by the submitting side once it decided
the job's outcome, or when a job could not start), the cancel record, each host's
final record (``{job_id}/hosts/{i}/status.json``, written by that host's runner),
whether the LWS exists, the group's pods (raw JSON, with the LWS controller's
``worker-index`` label), and pods deleted before their host finished. Rules, first
match wins:

1. The job-level final record, then a cancel record (as for every backend).
2. Any failing host fails the job at once, even while other hosts still run: a host
   that recorded a failure, a container that failed (even after recording success:
   a "success" whose pod failed never returns a value), a runner that ended without
   a record, a pod deleted before its host finished. The deciding host is the lowest
   one that recorded a failure (its exception is the job's), else the lowest failing
   host; the reason names every other failing host.
3. Every host recorded success: SUCCEEDED, and host 0's value is the job's.
4. Pods: a pod that cannot start makes the job PENDING with that reason; a running
   host makes it RUNNING.
5. An LWS without pods: PENDING (with ``podless_reason`` when the caller judged that
   its controller is late).
6. Neither: FAILED when the job is recorded, else NOT_FOUND.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kinetic._core import k8s_status
from kinetic._core.lws_spec import host_of_pod
from kinetic._core.status import JobStatus, StatusReport, status_from_records


@dataclass(frozen=True)
class GroupReport:
    """A multi-host job's status, and whose result payload is the job's.

    :ivar report: the status.
    :ivar result_host: the host whose ``result.pkl`` is the job's result (0 on
        success, the deciding failing host when it recorded its failure), or None
        when no payload stands for the job (it failed outside every runner).
    :ivar failed_hosts: every failing host, the deciding one first.
    """

    report: StatusReport
    result_host: int | None = None
    failed_hosts: tuple[int, ...] = ()


def _container(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return statuses[0] if statuses else {}


def container_ended(pod: Mapping[str, Any]) -> bool:
    """Whether the pod's runner container ended at least once (then restarted to idle)."""
    container = _container(pod)
    return (
        isinstance((container.get("state") or {}).get("terminated"), Mapping)
        or isinstance((container.get("lastState") or {}).get("terminated"), Mapping)
        or int(container.get("restartCount") or 0) > 0
        or k8s_status.pod_finished(pod)
    )


def pod_failure(pod: Mapping[str, Any]) -> str | None:
    """Why the pod's runner container failed (its first run), or None if it did not."""
    container = _container(pod)
    for state in (container.get("lastState") or {}, container.get("state") or {}):
        terminated = state.get("terminated")
        if isinstance(terminated, Mapping) and terminated.get("exitCode") != 0:
            return k8s_status.describe_terminated(terminated)
    if (pod.get("status") or {}).get("phase") == "Failed":
        return k8s_status.pod_report(pod).reason or "the pod failed"
    return None


def needs_records(pods: Sequence[Mapping[str, Any]], *, lws_exists: bool) -> bool:
    """Whether the hosts' records may say more than the pods: a container ended, a pod
    is going, or the LWS is gone (callers read storage only then)."""
    return (
        not lws_exists
        or any(container_ended(p) for p in pods)
        or any((p.get("metadata") or {}).get("deletionTimestamp") for p in pods)
    )


def _host_failure(host: int, record: Mapping[str, Any]) -> str:
    phase = record.get("phase")
    where = f" in phase {phase}" if phase else ""
    return f"host {host} failed{where}: {record.get('error') or 'unknown error'}"


def status_from_group(
    *,
    hosts: int,
    final: Mapping[str, Any] | None,
    cancelled: bool,
    host_finals: Mapping[int, Mapping[str, Any]],
    lws_exists: bool,
    pods: Sequence[Mapping[str, Any]],
    lost: Mapping[int, str] | None = None,
    podless_reason: str | None = None,
    recorded: bool = True,
) -> GroupReport:
    """Derive a multi-host job's status (rules in the module docstring).

    :param hosts: the group's size.
    :param final: the job-level final record (may carry ``host`` and ``failed_hosts``).
    :param cancelled: a cancel record exists.
    :param host_finals: the final records written by hosts so far, by host index.
    :param lws_exists: the job's LeaderWorkerSet exists (and is not being deleted).
    :param pods: the group's pods that exist now.
    :param lost: host index -> name of its pod deleted before the host finished.
    :param podless_reason: why an LWS without pods is stuck, when the caller judged so.
    :param recorded: the job's handle is in storage.
    """
    settled = status_from_records(final=final, cancelled=cancelled)
    if settled is not None:
        failed = tuple(int(h) for h in (final or {}).get("failed_hosts") or ())
        if settled.status is JobStatus.SUCCEEDED:
            return GroupReport(settled, result_host=0)
        host = (final or {}).get("host")
        return GroupReport(settled, result_host=host if isinstance(host, int) else None,
                           failed_hosts=failed)  # fmt: skip
    failures: dict[int, str] = {}
    recorded_failures: list[int] = []
    for host, record in sorted(host_finals.items()):
        if record.get("state") != "succeeded":
            failures[host] = _host_failure(host, record)
            recorded_failures.append(host)
    for pod in pods:
        host = host_of_pod(pod)
        if host is None or host in failures:
            continue
        why = pod_failure(pod)
        if why is not None:
            after = " after it recorded success" if host in host_finals else ""
            failures[host] = f"host {host}: {why}{after}"
        elif container_ended(pod) and host not in host_finals:
            failures[host] = f"host {host}: the runner ended without recording an outcome"
    for host, name in sorted((lost or {}).items()):
        if host not in failures and host not in host_finals:
            failures[host] = f"host {host}: pod {name} was deleted before the host finished"
    if failures:
        decider = recorded_failures[0] if recorded_failures else min(failures)
        others = [failures[h] for h in sorted(failures) if h != decider]
        reason = failures[decider]
        if others:
            reason += f" (other failing hosts: {'; '.join(others)})"
        phase = host_finals[decider].get("phase") if decider in recorded_failures else None
        return GroupReport(
            StatusReport(JobStatus.FAILED, reason=reason, phase=phase),
            result_host=decider if decider in recorded_failures else None,
            failed_hosts=(decider, *(h for h in sorted(failures) if h != decider)),
        )
    if all(host_finals.get(h, {}).get("state") == "succeeded" for h in range(hosts)):
        return GroupReport(StatusReport(JobStatus.SUCCEEDED), result_host=0)
    if pods:
        reports = sorted(
            ((host_of_pod(p), k8s_status.pod_report(p)) for p in pods),
            key=lambda hr: -1 if hr[0] is None else hr[0],
        )
        for host, report in reports:
            if k8s_status.cannot_start(report):
                return GroupReport(
                    StatusReport(JobStatus.PENDING, reason=f"host {host}: {report.reason}")
                )
        if not lws_exists:
            return GroupReport(
                StatusReport(
                    JobStatus.FAILED,
                    reason="its LeaderWorkerSet was deleted before every host finished",
                )
            )
        if host_finals or any(r.status is JobStatus.RUNNING for _, r in reports):
            return GroupReport(StatusReport(JobStatus.RUNNING))
        return GroupReport(StatusReport(JobStatus.PENDING))
    if lws_exists:
        return GroupReport(StatusReport(JobStatus.PENDING, reason=podless_reason))
    if recorded:
        return GroupReport(
            StatusReport(
                JobStatus.FAILED,
                reason="its LeaderWorkerSet does not exist and it recorded no outcome "
                "(deleted, or never launched)",
            )
        )
    return GroupReport(StatusReport(JobStatus.NOT_FOUND, reason="no records for this job"))


def job_final(group: GroupReport) -> dict[str, Any] | None:
    """The job-level final record that settles ``group`` for every process, or None
    while the job is not over. Written once by whoever saw the job end."""
    report = group.report
    if report.status is JobStatus.SUCCEEDED:
        return {"state": "succeeded", "phase": None, "error": None, "error_type": None, "host": 0}
    if report.status is JobStatus.FAILED and not report.cancelled:
        return {
            "state": "failed",
            "phase": report.phase,
            "error": report.reason,
            "error_type": None,
            "host": group.result_host,
            "failed_hosts": list(group.failed_hosts),
        }
    return None
