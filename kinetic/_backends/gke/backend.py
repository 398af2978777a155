"""The GKE backend: each job is a Kubernetes ``batch/v1`` Job; objects live in GCS.

Theory of operation
-------------------
Submission stores the job's spec, payload and handle in the bucket
(``{project}-kn-{cluster}-jobs``), then :meth:`GKEBackend.launch` creates the Job
of the job's plan (built by :func:`kinetic._core.k8s_spec.job_manifest`). The pod runs
``python -m runner --storage gs://BUCKET --job-id ID --upload-logs``, which writes
``result.pkl``, then ``status.json``, and a copy of its output (``logs.txt``).

Status is derived by :func:`kinetic._core.k8s_status.status_from_k8s` from the
Job, its pods and the job's records. :meth:`GKEBackend.status` asks the API
server; :meth:`GKEBackend.wait` follows the namespace's :class:`SharedWatch`
(one per namespace per loop, shared by all handles) and reads storage only when
the Kubernetes side says the job is over.

A job that cannot start (unschedulable, image pull failure, pod creation
refused) is reported PENDING with the reason. A waiter that sees the same job
stuck for ``start_grace`` seconds ends it: the Job is deleted and a final record
(phase ``start``, the reason) is written, so every process then sees FAILED.
Likewise a job whose pod vanished before finishing is ended (Kubernetes would
otherwise start a replacement pod: Kinetic never retries behind the user's back).

Batches go to :attr:`GKEBackend.batch_runner`, a
:class:`~kinetic._backends.gke.pool.GKEBatchEngines`: one Job whose pods are a worker
pool (:mod:`kinetic._backends.gke.pool`, the default), or one Job per input
(:mod:`kinetic._backends.gke.batch`, ``pod_per_input=True``). It answers for their
inputs too: the methods here are for single jobs only.
"""

from __future__ import annotations

import codecs
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from typing import Any, Unpack

import anyio

from kinetic._backends.base import JobRef
from kinetic._backends.cluster import (
    CANCEL_KEY,
    LOG_RETRY,
    Cluster,
    ClusterArgs,
    ClusterBackend,
    Follower,
    LaunchPlan,
    tail_of,
)
from kinetic._backends.gke.pool import GKEBatchEngines
from kinetic._backends.gke.watch import SharedWatch, either_set
from kinetic._core import k8s_spec, k8s_status, wait_plan
from kinetic._core.status import JobStatus, StatusReport, attempts_from_records
from runner import protocol

EVENTS_AFTER = 3.0
"""Seconds a Job may have no pod before its events are read for the reason."""
EVENTS_EVERY = 5.0
"""Seconds between two reads of a podless Job's events."""


class GKEBackend(ClusterBackend):
    """Jobs as Kubernetes Jobs; storage is the GCS bucket ``bucket``.

    :param bucket: the jobs bucket.
    :param cluster: the shared API client and watches of this loop.
    :param namespace: the namespace new jobs go to (a handle names its own).
    :param options: backend knobs.
    """

    name = "gke"

    def __init__(self, bucket: str, cluster: Cluster, **args: Unpack[ClusterArgs]) -> None:
        super().__init__(bucket, cluster, **args)
        self.batches = GKEBatchEngines(self)
        self.batch_runner = self.batches

    # -- launching --------------------------------------------------------------------

    async def launch(self, plan: LaunchPlan) -> None:
        """Create the job's Job.

        :raises ConfigError: the namespace does not exist.
        :raises BackendError: the API server refused or could not be reached.
        """
        await self.client.create_job(plan.namespace, plan.manifest)

    # -- status -----------------------------------------------------------------------

    async def _records(self, job: JobRef, *, recorded: bool) -> dict[str, Any]:
        final = await self._read_json(protocol.final_key(job.job_id))
        cancelled = False
        if final is None:
            cancelled = await self.storage.exists(f"{job.job_id}/{CANCEL_KEY}")
        if final is None and not cancelled and not recorded:
            recorded = await self.storage.exists(protocol.handle_key(job.job_id))
        return {"final": final, "cancelled": cancelled, "recorded": recorded}

    async def _events(self, job: JobRef) -> list[dict[str, Any]]:
        listing = await self.client.list_objects(
            "events",
            job.namespace,
            "",
            field_selector=f"involvedObject.name={k8s_spec.job_name(job.job_id)}",
        )
        return list(listing.get("items") or [])

    async def status(self, job: JobRef) -> StatusReport:
        k8s_job = await self.client.get_job(job.namespace, job.k8s_name)
        pods = (
            await self.client.list_objects("pods", job.namespace, k8s_spec.job_selector(job.job_id))
        )["items"]
        report = await self._derive(job, k8s_job, pods, lost=None, events_due=True)
        if report.status is JobStatus.RUNNING:  # a job that retries says its attempt
            attempts = attempts_from_records(
                await self._read_json(protocol.attempts_key(job.job_id))
            )
            if attempts:
                report = replace(report, attempt=len(attempts) + 1, attempts=attempts)
        return report

    async def _derive(
        self,
        job: JobRef,
        k8s_job: Mapping[str, Any] | None,
        pods: list[dict[str, Any]],
        *,
        lost: str | None,
        events_due: bool,
    ) -> StatusReport:
        over = (
            k8s_job is None
            or lost is not None
            or bool((k8s_job.get("metadata") or {}).get("deletionTimestamp"))  # cancelled?
            or any((p.get("metadata") or {}).get("deletionTimestamp") for p in pods)
            or any(k8s_status.pod_finished(p) for p in pods)
            or (k8s_job is not None and k8s_status.job_conditions_report(k8s_job) is not None)
            or k8s_status.deadline_report(k8s_job) is not None
        )
        records: dict[str, Any] = {"final": None, "cancelled": False, "recorded": True}
        if over:
            records = await self._records(job, recorded=k8s_job is not None or bool(pods))
        events: list[dict[str, Any]] = []
        if k8s_job is not None and not pods and not over and events_due:
            events = await self._events(job)
        return k8s_status.status_from_k8s(
            job=k8s_job, pods=pods, lost_pod=lost, events=events, **records
        )

    def _wait_rules(self) -> wait_plan.WaitRules:
        return wait_plan.WaitRules(
            start_grace=self.options.start_grace,
            podless_after=EVENTS_AFTER,
            events_every=EVENTS_EVERY,
        )

    async def _follower(self, job: JobRef) -> Follower:
        return _JobFollower(self, job)

    async def _end(self, job: JobRef, report: StatusReport, *, phase: str | None) -> None:
        """Delete the Job and record the failure (unless the runner recorded an outcome)."""
        await self.client.delete_job(job.namespace, job.k8s_name)
        if not await self.storage.exists(protocol.final_key(job.job_id)):
            final = {"state": "failed", "phase": phase, "error": report.reason, "error_type": None}
            await self.storage.write(protocol.final_key(job.job_id), protocol.dump_json(final))

    # -- logs -------------------------------------------------------------------------

    async def logs(self, job: JobRef, *, tail: int | None = None) -> str:
        pods = (
            await self.client.list_objects("pods", job.namespace, k8s_spec.job_selector(job.job_id))
        )["items"]
        pod = k8s_status.newest(pods)
        text: str | None = None
        if pod is not None:
            text = await self.client.pod_log(job.namespace, pod["metadata"]["name"], tail=tail)
        if not text:
            stored = await self._stored_logs(protocol.logs_key(job.job_id))
            text = None if stored is None else tail_of(stored, tail)
        if not text:
            report = await self.status(job)
            if report.reason and not report.status.is_terminal:
                return f"kinetic: job {job.job_id} is {report.status.value}: {report.reason}\n"
            return text or ""
        return text

    async def _start_event(
        self, job: JobRef, finished: anyio.Event | None, said: str | None
    ) -> str | dict[str, Any] | None:
        """Wait for the next thing a log follower cares about, and return it.

        A pod whose container started (dict), a new reason why the job cannot start
        (str, different from ``said``), or None: the job ended before a container
        started, or ``finished`` was set.
        """
        watch = self.cluster.watch(job.namespace)
        async with watch.subscribe():
            while True:
                changes = watch.job_changes(job.job_id)
                if finished is not None and finished.is_set():
                    return None
                for pod in watch.pods(job.job_id):
                    statuses = (pod.get("status") or {}).get("containerStatuses") or []
                    state = (statuses[0].get("state") or {}) if statuses else {}
                    if "running" in state or "terminated" in state:
                        return pod
                if watch.synced:
                    report = k8s_status.status_from_k8s(
                        final=None,
                        cancelled=False,
                        job=watch.job(job.job_id),
                        pods=watch.pods(job.job_id),
                        lost_pod=watch.lost.get(job.job_id),
                        recorded=True,
                    )
                    if report.status.is_terminal:
                        return None
                    if report.reason and report.reason != said:
                        return report.reason
                await either_set(changes, finished)

    async def follow_logs(
        self, job: JobRef, finished: anyio.Event | None = None
    ) -> AsyncIterator[str]:
        pod: dict[str, Any] | None = None
        said: str | None = None
        while True:
            item = await self._start_event(job, finished, said)
            if isinstance(item, str):
                said = item
                yield f"kinetic: job {job.job_id} is waiting: {item}\n"
                continue
            pod = item
            break
        if pod is not None:
            sent = 0  # bytes already yielded: a re-opened stream starts over, skip them
            decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
            name = pod["metadata"]["name"]
            for _ in range(20):
                seen = 0
                try:
                    async for chunk in self._pod_log_stream(job, name):
                        new = chunk[max(0, sent - seen) :] if seen < sent else chunk
                        seen += len(chunk)
                        if new:
                            sent += len(new)
                            text = decoder.decode(new)
                            if text:
                                yield text
                    break  # the container ended: its log is complete
                except Exception:  # noqa: BLE001 - pod gone or API restarting: retry, then storage
                    if not await self._pod_exists(job, name):
                        break
                    await anyio.sleep(LOG_RETRY)
            rest = decoder.decode(b"", final=True)
            if rest:
                yield rest
            if sent:
                return
        # No pod (gone, or never started): the runner's copy in storage.
        for _ in range(10):
            stored = await self._stored_logs(protocol.logs_key(job.job_id))
            if stored is not None:
                yield stored
                return
            report = await self.status(job)
            if report.status.is_terminal and report.phase == k8s_status.START_PHASE:
                yield f"kinetic: {report.reason}\n"
                return
            await anyio.sleep(0.5)

    async def _pod_exists(self, job: JobRef, name: str) -> bool:
        pods = (
            await self.client.list_objects("pods", job.namespace, k8s_spec.job_selector(job.job_id))
        )["items"]
        return any(p["metadata"]["name"] == name and not k8s_status.pod_finished(p) for p in pods)

    # -- ending -----------------------------------------------------------------------

    async def _delete_cluster_objects(self, job: JobRef) -> None:
        """Delete the Job (pods cascade, in the foreground)."""
        await self.client.delete_job(job.namespace, job.k8s_name)

    async def _list_cluster_objects(self) -> list[Any]:
        listing = await self.client.list_objects("jobs", self.namespace, k8s_spec.SELECTOR)
        return list(listing.get("items") or [])


class _JobFollower(Follower):
    """A GKE job as its waiter sees it: a Job and its pod."""

    def __init__(self, backend: GKEBackend, job: JobRef) -> None:
        self.backend = backend
        self.job = job

    def podless(self, watch: SharedWatch) -> bool:
        return bool(watch.job(self.job.job_id) and not watch.pods(self.job.job_id))

    async def read(self, watch: SharedWatch, look: wait_plan.Look) -> StatusReport:
        job, backend = self.job, self.backend
        k8s_job, pods = watch.job(job.job_id), watch.pods(job.job_id)
        report = await backend._derive(
            job, k8s_job, pods, lost=watch.lost.get(job.job_id), events_due=look.events_due
        )
        if wait_plan.ask_if_unseen(report, seen=k8s_job is not None or bool(pods)) and (
            await backend.client.get_job(job.namespace, job.k8s_name) is not None
        ):
            return StatusReport(JobStatus.PENDING)
        return report

    async def end(self, verdict: wait_plan.Verdict) -> None:
        report = verdict.report
        await self.backend._end(self.job, report, phase=report.phase if verdict.gave_up else None)
