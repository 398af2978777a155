"""The pathways backend: a multi-host TPU job is one LeaderWorkerSet; objects live in GCS.

Theory of operation
-------------------
Submission is the GKE backend's (same bucket, image, spec and payload); then
:meth:`PathwaysBackend.launch` creates the LeaderWorkerSet built by
:func:`kinetic._core.lws_spec.lws_manifest`: one group of ``hosts`` pods, leader
(host 0) and workers, each running the runner on the same job. Each host writes its
own outcome (``{job_id}/hosts/{i}/``, see :mod:`runner.protocol`), then its container
ends once: StatefulSet pods restart it, and the restarted runner only idles, so a
finished group never runs again.

Status is derived by :func:`kinetic._core.lws_status.status_from_group` from the
group's pods (the namespace's shared watch, the same one GKE jobs use: the pods carry
Kinetic's labels), the LWS and the records. Storage is read only when a container
ended or a pod or the LWS is going. A waiter that sees the job end writes the
job-level final record (so every process agrees, even once the pods are gone) and
deletes the LWS: it has no TTL, and idle hosts would otherwise hold their TPUs.
A worker's failure therefore ends the job at once, while the leader still runs.

The job's value is host 0's; a failed job's exception is the deciding host's, with a
note naming the other failing hosts (this backend unpickles a payload only for that,
in a worker thread). A job that cannot start (unschedulable pods, no pods from the
LWS controller) fails after ``start_grace`` seconds, as on GKE.
"""

from __future__ import annotations

import codecs
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any, Unpack, cast

import anyio
import anyio.to_thread

from kinetic._backends.base import JobRef
from kinetic._backends.cluster import (
    CANCEL_KEY,
    Cluster,
    ClusterArgs,
    ClusterBackend,
    Follower,
    LaunchPlan,
    tail_of,
)
from kinetic._backends.gke.watch import SharedWatch, either_set
from kinetic._backends.pathways.api import LwsApi
from kinetic._core import accelerators, k8s_spec, lws_spec, lws_status, wait_plan
from kinetic._core.exception_groups import one_error
from kinetic._core.lws_status import GroupReport
from kinetic._core.status import JobStatus, StatusReport
from kinetic._exceptions import AcceleratorError, ConfigError, ObjectNotFoundError
from runner import protocol

log = logging.getLogger(__name__)

PODLESS_AFTER = 3.0
"""Seconds an LWS may have no pods before the controller is reported late."""


class PathwaysBackend(ClusterBackend):
    """Multi-host TPU jobs as LeaderWorkerSets; storage is the GCS bucket ``bucket``.

    :param bucket: the jobs bucket (the GKE backend's).
    :param cluster: the loop's shared API client and watches.
    :param namespace: the namespace new jobs go to (a handle names its own).
    :param options: the GKE backend's knobs (pods, start grace, images).
    :param group: the LWS API group (tests name one that does not exist).
    """

    name = "pathways"

    def __init__(
        self,
        bucket: str,
        cluster: Cluster,
        *,
        group: str = lws_spec.GROUP,
        **args: Unpack[ClusterArgs],
    ) -> None:
        super().__init__(bucket, cluster, **args)
        self.lws = LwsApi(cluster.client, group)

    # -- launching --------------------------------------------------------------------

    async def check_cluster(self) -> None:
        """Check that the cluster answers (as a GKE backend does), then discover the LWS
        API version (cached per process).

        :raises ConfigError: the cluster has no LeaderWorkerSet CRD (says how to install it).
        :raises BackendError: the API server failed or could not be reached.
        """
        await super().check_cluster()
        await self.lws.version()

    def prepare(self, job_id: str, template: k8s_spec.JobTemplate) -> LaunchPlan:
        """The plan of a GKE job from ``template``: its pod template is every host's.
        Pure; raises ConfigError (AcceleratorError for non-TPU)."""
        accelerator = template.accelerator
        if accelerator.kind != "tpu":
            raise AcceleratorError(
                f"the pathways backend runs TPU slices, not {accelerator.name!r}"
            )
        return super().prepare(job_id, template)

    async def launch(self, plan: LaunchPlan) -> None:
        """Create the job's LeaderWorkerSet.

        :raises ConfigError: the namespace or the LWS CRD does not exist.
        :raises BackendError: the API server refused or could not be reached.
        """
        version = await self.lws.version()
        manifest = lws_spec.lws_manifest(
            plan.manifest, accelerator=plan.accelerator, version=version
        )
        await self.lws.create(plan.namespace, manifest)

    # -- status -----------------------------------------------------------------------

    async def _hosts(self, job: JobRef, lws: Mapping[str, Any] | None = None) -> int:
        name = getattr(job, "accelerator", None)
        if isinstance(name, str) and name:
            try:
                return lws_spec.hosts_of(accelerators.parse_accelerator(name))
            except ConfigError:
                pass
        if lws is None:
            lws = await self.lws.get(job.namespace, job.k8s_name)
        size = ((lws or {}).get("spec") or {}).get("leaderWorkerTemplate", {}).get("size")
        return int(size) if isinstance(size, int) else 1

    async def _host_finals(
        self, job: JobRef, cache: dict[int, dict[str, Any]]
    ) -> dict[int, dict[str, Any]]:
        """The hosts' final records (one listing, then a read per record not yet seen;
        records never change once written, so ``cache`` keeps them)."""
        new: list[int] = []
        async for key in self.storage.list(protocol.hosts_prefix(job.job_id)):
            parsed = protocol.parse_host_key(job.job_id, key)
            if parsed is not None and parsed[1] == "status.json" and parsed[0] not in cache:
                new.append(parsed[0])

        async def read(host: int) -> None:
            record = await self._read_json(protocol.host_final_key(job.job_id, host))
            if isinstance(record, dict):
                cache[host] = record

        with one_error():
            async with anyio.create_task_group() as tg:
                for host in new:
                    tg.start_soon(read, host)
        return dict(cache)

    async def _derive(
        self,
        job: JobRef,
        hosts: int,
        pods: list[dict[str, Any]],
        *,
        cache: dict[int, dict[str, Any]],
        lost: Mapping[int, str] | None = None,
        podless_for: float = 0.0,
        lws_exists: bool | None = None,
    ) -> GroupReport:
        if lws_exists is None:
            going = any((p.get("metadata") or {}).get("deletionTimestamp") for p in pods)
            if pods and not going:
                lws_exists = True  # its pods exist and none is going: no need to ask
            else:
                obj = await self.lws.get(job.namespace, job.k8s_name)
                lws_exists = obj is not None and not (obj.get("metadata") or {}).get(
                    "deletionTimestamp"
                )
        final: Any = None
        cancelled = False
        host_finals: dict[int, dict[str, Any]] = {}
        recorded = True
        if lost or lws_status.needs_records(pods, lws_exists=lws_exists):
            final = await self._read_json(protocol.final_key(job.job_id))
            if final is None:
                cancelled = await self.storage.exists(f"{job.job_id}/{CANCEL_KEY}")
                host_finals = await self._host_finals(job, cache)
            if final is None and not cancelled and not lws_exists and not pods:
                recorded = await self.storage.exists(protocol.handle_key(job.job_id))
        podless_reason = None
        if lws_exists and not pods and podless_for >= PODLESS_AFTER:
            podless_reason = (
                f"the LeaderWorkerSet has had no pods for {podless_for:.0f}s "
                "(is the LeaderWorkerSet controller running?)"
            )
        return lws_status.status_from_group(
            hosts=hosts,
            final=final if isinstance(final, dict) else None,
            cancelled=cancelled,
            host_finals=host_finals,
            lws_exists=lws_exists,
            pods=pods,
            lost=lost,
            podless_reason=podless_reason,
            recorded=recorded,
        )

    async def _pods(self, job: JobRef) -> list[dict[str, Any]]:
        listing = await self.client.list_objects(
            "pods", job.namespace, k8s_spec.job_selector(job.job_id)
        )
        return list(listing.get("items") or [])

    async def status(self, job: JobRef) -> StatusReport:
        lws = await self.lws.get(job.namespace, job.k8s_name)
        pods = await self._pods(job)
        hosts = await self._hosts(job, lws)
        exists = lws is not None and not (lws.get("metadata") or {}).get("deletionTimestamp")
        group = await self._derive(job, hosts, pods, cache={}, lws_exists=exists)
        return group.report

    def _wait_rules(self) -> wait_plan.WaitRules:
        return wait_plan.WaitRules(
            start_grace=self.options.start_grace, podless_after=PODLESS_AFTER, ends_outcomes=True
        )

    async def _follower(self, job: JobRef) -> Follower:
        return _GroupFollower(self, job, await self._hosts(job))

    async def _end(self, job: JobRef, group: GroupReport) -> None:
        """Record the job's outcome for every process (unless recorded already), then
        delete its LeaderWorkerSet and pods: idle hosts must not keep their TPUs."""
        record = lws_status.job_final(group)
        if record is not None and not await self.storage.exists(protocol.final_key(job.job_id)):
            await self.storage.write(protocol.final_key(job.job_id), protocol.dump_json(record))
        await self._delete_cluster_objects(job)

    async def _delete_cluster_objects(self, job: JobRef) -> None:
        await self.lws.delete(job.namespace, job.k8s_name)
        # Foreground deletion reaches the pods through their StatefulSets, gracefully;
        # the runner (PID 1) ignores SIGTERM mid-run, so end them now.
        await self.client.delete_pods(job.namespace, k8s_spec.job_selector(job.job_id))

    # -- logs -------------------------------------------------------------------------

    async def logs(self, job: JobRef, *, tail: int | None = None) -> str:
        """The leader's output (host 0): its stored copy once it ended, else its pod's log."""
        text = await self._stored_logs(protocol.host_logs_key(job.job_id, 0))
        if text is None:
            name = lws_spec.pod_name(job.job_id, 0)
            return await self.client.pod_log(job.namespace, name, tail=tail) or ""
        return tail_of(text, tail)

    async def _leader_live(self, job: JobRef, finished: anyio.Event | None) -> bool:
        """Wait until the leader's runner runs its first (only) run: True, its live log
        is worth following. False once that run is over (a restarted container only
        idles: its log is not the job's), or the job or the caller is done."""
        watch = self.cluster.watch(job.namespace)
        leader = lws_spec.pod_name(job.job_id, 0)
        async with watch.subscribe():
            while True:
                changes = watch.job_changes(job.job_id)
                if finished is not None and finished.is_set():
                    return False
                pods = watch.pods(job.job_id)
                for pod in pods:
                    if pod["metadata"]["name"] != leader:
                        continue
                    if lws_status.container_ended(pod):
                        return False
                    state = ((pod.get("status") or {}).get("containerStatuses") or [{}])[0]
                    if "running" in (state.get("state") or {}):
                        return True
                if watch.synced and not pods and (await self.status(job)).status.is_terminal:
                    return False
                with anyio.move_on_after(2.0):
                    await either_set(changes, finished)

    async def follow_logs(
        self, job: JobRef, finished: anyio.Event | None = None
    ) -> AsyncIterator[str]:
        """The leader's output as it is written, from the start until its run ends; its
        stored copy (what the live stream had not shown) when the live log is over or
        cannot be read."""
        sent = 0  # bytes shown: the stored copy holds the same bytes, skip them
        if await self._leader_live(job, finished):
            decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
            # The run may end, and its container restart, between the look that saw it
            # running and the stream's request: the stream then shows the restarted
            # container, which says it idles. Its log is not the job's: the stored copy is.
            idle = protocol.idle_line(job.job_id, 0).encode()
            head: bytes | None = b""  # the start, held until it cannot be that line
            restarted = False
            # An async generator (the client's stream): closed at once when left early.
            stream = cast(
                "AsyncGenerator[bytes, None]",
                self._pod_log_stream(job, lws_spec.pod_name(job.job_id, 0)),
            )
            try:
                async with contextlib.aclosing(stream):
                    async for chunk in stream:
                        if head is not None:
                            head += chunk
                            if len(head) < len(idle) and idle.startswith(head):
                                continue
                            restarted, chunk, head = head.startswith(idle), head, None
                            if restarted:
                                break
                        sent += len(chunk)
                        text = decoder.decode(chunk)
                        if text:
                            yield text
                if not restarted:
                    rest = decoder.decode(head or b"", final=True)
                    if rest:
                        sent += len(head or b"")
                        yield rest
                    return  # the container's run ended: its log is complete
            except Exception as exc:  # noqa: BLE001 - pod gone mid-stream: the stored copy follows
                log.debug("following the log of job %s broke off: %s", job.job_id, exc)
        for _ in range(20):
            stored = await self._stored(protocol.host_logs_key(job.job_id, 0))
            if stored is not None:
                if stored[sent:]:
                    yield stored[sent:].decode(errors="replace")
                return
            report = await self.status(job)
            if report.status.is_terminal and report.reason:
                yield f"kinetic: job {job.job_id} {report.status.value}: {report.reason}\n"
                return
            await anyio.sleep(0.5)

    # -- ending -----------------------------------------------------------------------

    async def read_result(self, job: JobRef) -> bytes:
        """Host 0's payload when every host succeeded; the deciding host's when one
        failed (annotated with the other failing hosts).

        :raises ObjectNotFoundError: no payload stands for the job: it failed outside
            every runner (a pod failed, even after its host recorded success; it could
            not start), it was cancelled, or it is not over.
        """
        final = await self._read_json(protocol.final_key(job.job_id))
        if not isinstance(final, dict):
            if await self.storage.exists(f"{job.job_id}/{CANCEL_KEY}"):
                raise ObjectNotFoundError(f"job {job.job_id} was cancelled")
            hosts = await self._hosts(job)
            finals = await self._host_finals(job, {})
            group = lws_status.status_from_group(
                hosts=hosts,
                final=None,
                cancelled=False,
                host_finals=finals,
                lws_exists=True,
                pods=[],
            )
            final = lws_status.job_final(group) or {}
        host = final.get("host")
        if not isinstance(host, int):
            raise ObjectNotFoundError(f"job {job.job_id} has no result payload")
        data = await self.storage.read(protocol.host_result_key(job.job_id, host))
        if final.get("state") != "succeeded" and len(final.get("failed_hosts") or ()) > 1:
            note = f"kinetic: job {job.job_id} failed: {final.get('error')}"
            data = await anyio.to_thread.run_sync(_annotate, data, note)
        return data

    async def _list_cluster_objects(self) -> list[Any]:
        return list(await self.lws.list(self.namespace, k8s_spec.SELECTOR))


class _GroupFollower(Follower):
    """A pathways job as its waiter sees it: a LeaderWorkerSet's pods, one per host."""

    def __init__(self, backend: PathwaysBackend, job: JobRef, hosts: int) -> None:
        self.backend = backend
        self.job = job
        self.hosts = hosts
        self.cache: dict[int, dict[str, Any]] = {}
        self.group = GroupReport(StatusReport(JobStatus.PENDING))

    def podless(self, watch: SharedWatch) -> bool:
        return not watch.pods(self.job.job_id)

    async def read(self, watch: SharedWatch, look: wait_plan.Look) -> StatusReport:
        job = self.job
        lost: dict[int, str] = {}
        lost_name = watch.lost.get(job.job_id)
        lost_host = lws_spec.host_of_pod_name(job.job_id, lost_name or "")
        if lost_name is not None and lost_host is not None:
            lost[lost_host] = lost_name
        self.group = await self.backend._derive(
            job,
            self.hosts,
            watch.pods(job.job_id),
            cache=self.cache,
            lost=lost,
            podless_for=look.podless_for or 0.0,
        )
        return self.group.report

    async def end(self, verdict: wait_plan.Verdict) -> None:
        await self.backend._end(
            self.job, GroupReport(verdict.report) if verdict.gave_up else self.group
        )


def _annotate(data: bytes, note: str) -> bytes:
    """``data`` (a result payload) with ``note`` on its exception, or ``data`` itself
    when the payload cannot be rebuilt here (the engine then reports that)."""
    import cloudpickle

    try:
        payload = cloudpickle.loads(protocol.unseal(data))
        exc = payload.get("exception")
        if isinstance(exc, BaseException):
            exc.add_note(note)
        else:
            payload["error"] = f"{payload.get('error')} ({note})"
        return bytes(cloudpickle.dumps(payload))
    except Exception:  # noqa: BLE001 - the unannotated payload is still the truth
        return data
