"""The GKE backend: each job is a Kubernetes ``batch/v1`` Job; objects live in GCS.

Theory of operation
-------------------
Submission stores the job's spec, payload and handle in the bucket
(``{project}-kn-{cluster}-jobs``), then :meth:`GKEBackend.launch` creates the Job
built by :func:`kinetic._core.k8s_spec.job_manifest`. The pod runs
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
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any

import anyio

from kinetic._backends.base import JobRef, StatusCallback
from kinetic._backends.gke.client import KubeClient
from kinetic._backends.gke.pool import GKEBatchEngines
from kinetic._backends.gke.watch import SharedWatch, either_set
from kinetic._core import k8s_spec, k8s_status, wait_plan
from kinetic._core.exception_groups import one_error
from kinetic._core.gke_config import GKEOptions
from kinetic._core.status import JobStatus, StatusReport
from kinetic._exceptions import ObjectNotFoundError
from kinetic._storage.base import Storage
from kinetic._storage.gcs import GCSStorage
from runner import protocol

CANCEL_KEY = "cancel.json"
EVENTS_AFTER = 3.0
"""Seconds a Job may have no pod before its events are read for the reason."""
EVENTS_EVERY = 5.0
"""Seconds between two reads of a podless Job's events."""
LOG_RETRY = 1.0


class Cluster:
    """One Kubernetes API client and its shared watches (one per namespace)."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client
        self._watches: dict[str, SharedWatch] = {}

    def watch(self, namespace: str) -> SharedWatch:
        """The shared watch of Kinetic's Jobs and pods in ``namespace``."""
        found = self._watches.get(namespace)
        if found is None:
            found = self._watches[namespace] = SharedWatch(
                self.client, namespace, k8s_spec.SELECTOR
            )
        return found

    async def aclose(self) -> None:
        await self.client.aclose()


class GKEBackend:
    """Jobs as Kubernetes Jobs; storage is the GCS bucket ``bucket``.

    :param bucket: the jobs bucket.
    :param cluster: the shared API client and watches of this loop.
    :param namespace: the namespace new jobs go to (a handle names its own).
    :param options: backend knobs.
    """

    name = "gke"
    ended_jobs_hold_resources = True

    def __init__(
        self,
        bucket: str,
        cluster: Cluster,
        *,
        namespace: str = "default",
        options: GKEOptions | None = None,
        storage: GCSStorage | None = None,
    ) -> None:
        self.bucket = bucket
        self.cluster = cluster
        self.namespace = namespace
        self.options = options or GKEOptions()
        self.storage = storage or GCSStorage(bucket)
        self._pending_specs: dict[str, dict[str, Any]] = {}
        self.batches = GKEBatchEngines(self)
        self.batch_runner = self.batches

    def __repr__(self) -> str:
        return f"GKEBackend({self.bucket!r}, namespace={self.namespace!r})"

    @property
    def client(self) -> KubeClient:
        return self.cluster.client

    # -- launching --------------------------------------------------------------------

    def prepare(self, job_id: str, template: k8s_spec.JobTemplate) -> dict[str, Any]:
        """Build (and keep for :meth:`launch`) the job's manifest from ``template`` (this
        backend's bucket and pod options in it). Pure, raises ConfigError."""
        manifest = k8s_spec.job_manifest(template, job_id)
        self._pending_specs[job_id] = manifest
        return manifest

    def mount_gcs_fuse(self, job_id: str, buckets: Iterable[str]) -> None:
        """Add read-only GCS FUSE volumes for ``buckets`` to a prepared manifest."""
        self._pending_specs[job_id] = k8s_spec.with_gcs_fuse(self._pending_specs[job_id], buckets)

    def discard(self, job_id: str) -> None:
        """Forget a prepared manifest (submission failed before launch)."""
        self._pending_specs.pop(job_id, None)

    async def launch(self, job: JobRef) -> None:
        """Create the job's Job from the manifest :meth:`prepare` built.

        :raises ConfigError: the namespace does not exist.
        :raises BackendError: the API server refused or could not be reached.
        """
        manifest = self._pending_specs.pop(job.job_id, None)
        if manifest is None:
            raise ValueError(f"job {job.job_id} was not prepared for launch")
        await self.client.create_job(job.namespace, manifest)

    # -- status -----------------------------------------------------------------------

    async def _records(self, job: JobRef, *, recorded: bool) -> dict[str, Any]:
        final: Any = None
        try:
            final = protocol.load_json(await self.storage.read(protocol.final_key(job.job_id)))
        except (ObjectNotFoundError, ValueError):
            final = None
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
        return await self._derive(job, k8s_job, pods, lost=None, events_due=True)

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

    async def wait(self, job: JobRef, on_change: StatusCallback | None = None) -> StatusReport:
        watch = self.cluster.watch(job.namespace)
        rules = wait_plan.WaitRules(
            start_grace=self.options.start_grace,
            podless_after=EVENTS_AFTER,
            events_every=EVENTS_EVERY,
        )
        state = wait_plan.WaitState()
        last: StatusReport | None = None
        async with watch.subscribe():
            while True:
                changes = watch.job_changes(job.job_id)
                if watch.error is not None:
                    raise watch.error
                if not watch.synced:
                    await changes.wait()
                    continue
                now = anyio.current_time()
                k8s_job, pods = watch.job(job.job_id), watch.pods(job.job_id)
                lost = watch.lost.get(job.job_id)
                state, seen = wait_plan.look(
                    state, rules, now=now, podless=bool(k8s_job and not pods)
                )
                report = await self._derive(
                    job, k8s_job, pods, lost=lost, events_due=seen.events_due
                )
                if wait_plan.ask_if_unseen(report, seen=k8s_job is not None or bool(pods)) and (
                    await self.client.get_job(job.namespace, job.k8s_name) is not None
                ):
                    report = StatusReport(JobStatus.PENDING)
                state, verdict = wait_plan.judge(
                    state,
                    rules,
                    report,
                    now=now,
                    podless_for=seen.podless_for,
                    lost=lost is not None,
                )
                report = verdict.report
                if verdict.end:
                    await self._end(job, report, phase=report.phase if verdict.gave_up else None)
                if on_change is not None and report != last:
                    await on_change(report)
                last = report
                if report.status.is_terminal:
                    return report
                with anyio.move_on_after(verdict.timeout):
                    await changes.wait()

    async def _end(self, job: JobRef, report: StatusReport, *, phase: str | None) -> None:
        """Delete the Job and record the failure (unless the runner recorded an outcome)."""
        await self.client.delete_job(job.namespace, job.k8s_name)
        if not await self.storage.exists(protocol.final_key(job.job_id)):
            final = {"state": "failed", "phase": phase, "error": report.reason, "error_type": None}
            await self.storage.write(protocol.final_key(job.job_id), protocol.dump_json(final))

    # -- logs -------------------------------------------------------------------------

    async def _stored_logs(self, job: JobRef) -> str | None:
        try:
            return (await self.storage.read(protocol.logs_key(job.job_id))).decode(errors="replace")
        except ObjectNotFoundError:
            return None

    async def logs(self, job: JobRef, *, tail: int | None = None) -> str:
        pods = (
            await self.client.list_objects("pods", job.namespace, k8s_spec.job_selector(job.job_id))
        )["items"]
        pod = k8s_status.newest(pods)
        text: str | None = None
        if pod is not None:
            text = await self.client.pod_log(job.namespace, pod["metadata"]["name"], tail=tail)
        if not text:
            text = await self._stored_logs(job)
            if text is not None and tail is not None:
                lines = text.splitlines(keepends=True)
                text = "".join(lines[-tail:]) if tail > 0 else ""
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
            path = f"/api/v1/namespaces/{job.namespace}/pods/{name}/log"
            for _ in range(20):
                seen = 0
                try:
                    async for chunk in self.client.stream(
                        path,
                        what=f"follow log of pod {job.namespace}/{name}",
                        query=[("follow", "true")],
                        read_timeout=None,
                    ):
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
            stored = await self._stored_logs(job)
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

    async def cancel(self, job: JobRef) -> None:
        """Delete the Job (pods cascade, in the foreground). Idempotent.

        A job that has not recorded an outcome gets a cancel record first, so every
        process reports it FAILED (cancelled).
        """
        if not await self.storage.exists(protocol.final_key(job.job_id)):
            await self.storage.write(
                f"{job.job_id}/{CANCEL_KEY}", protocol.dump_json({"cancelled": True})
            )
        await self.client.delete_job(job.namespace, job.k8s_name)

    async def read_result(self, job: JobRef) -> bytes:
        """The job's result payload. :raises ObjectNotFoundError: when there is none."""
        return await self.storage.read(protocol.result_key(job.job_id))

    async def delete_objects(self, job: JobRef) -> None:
        """Delete the job's objects (``{job_id}/``); shared context archives stay."""
        await self.storage.delete_prefix(f"{job.job_id}/")

    async def list_job_ids(self) -> list[str]:
        """Ids of Jobs labelled ``app=kinetic`` in the namespace, and of recorded jobs."""

        async def jobs() -> list[Any]:
            listing = await self.client.list_objects("jobs", self.namespace, k8s_spec.SELECTOR)
            return list(listing.get("items") or [])

        return await known_job_ids(self.storage, jobs)

    async def aclose(self) -> None:
        """Close the storage session (the shared cluster client is closed by its owner)."""
        await self.storage.aclose()


async def known_job_ids(
    storage: Storage, list_objects: Callable[[], Awaitable[list[Any]]]
) -> list[str]:
    """Ids of the jobs whose Kubernetes objects ``list_objects`` returns, and of those
    with a stored handle, listed concurrently.

    :raises KineticError: what either listing raised (itself, not an exception group).
    """
    found: set[str] = set()

    async def from_cluster() -> None:
        for obj in await list_objects():
            job_id = k8s_status.job_id_of(obj)
            if job_id:
                found.add(job_id)

    async def from_storage() -> None:
        async for key in storage.list("job-"):
            head, _, tail = key.partition("/")
            if tail == "handle.json":
                found.add(head)

    with one_error():  # a missing namespace says so plainly
        async with anyio.create_task_group() as tg:
            tg.start_soon(from_cluster)
            tg.start_soon(from_storage)
    return sorted(found)
