"""What the backends that run a job as Kubernetes objects share (GKE: a Job;
pathways: a LeaderWorkerSet).

Theory of operation
-------------------
A :class:`ClusterBackend` keeps a job's objects in a GCS bucket and its pods in a
namespace of a cluster, reached through the loop's :class:`Cluster` (one API client,
one shared watch per namespace). It holds what does not depend on the kind of object:

* :meth:`ClusterBackend.wait`, the one watch-driven waiter: each pass asks the job's
  :class:`Follower` (made by the subclass) what the watch shows, and
  :mod:`kinetic._core.wait_plan` what to do about it (end the job, give up on a job
  that cannot start, how long to sleep);
* what a submission needs of it (:meth:`ClusterBackend.placement`: the bucket, outputs
  in it, pods of an image; :meth:`ClusterBackend.get_ready`: the cluster's check and
  the pods' service account, before the image is built);
* launching in two steps: :meth:`ClusterBackend.prepare` builds a :class:`LaunchPlan`
  (pure: the job's manifest, before anything is written), and
  :meth:`ClusterBackend.launch` creates the cluster objects it describes; the plan
  travels with the submission (:class:`ClusterLaunch`), nothing is kept in the backend
  between the two;
* cancelling (a cancel record, then the subclass deletes its objects), the result,
  the job's objects in storage, the listing of job ids;
* the pieces of logs: the stored copy, its tail, a pod's live log.

A subclass names its objects (``_delete_cluster_objects``, ``_list_cluster_objects``),
how a job ends and which pod's log is the job's.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar, TypedDict

import anyio

from kinetic._backends.base import JobRef, NewJob, Placement, StatusCallback
from kinetic._backends.gke.client import KubeClient
from kinetic._backends.gke.pod_identity import settle_service_account
from kinetic._backends.gke.watch import SharedWatch
from kinetic._core import k8s_spec, k8s_status, wait_plan
from kinetic._core.accelerators import AcceleratorConfig
from kinetic._core.config import Settings
from kinetic._core.exception_groups import one_error
from kinetic._core.gke_config import GKEOptions
from kinetic._core.status import StatusReport
from kinetic._exceptions import BackendError, ObjectNotFoundError
from kinetic._storage.base import Storage
from kinetic._storage.gcs import GCSStorage
from runner import protocol

CANCEL_KEY = "cancel.json"
LOG_RETRY = 1.0
BATCH_CONCURRENCY = 64
"""A batch's inputs that run at once when ``max_concurrent`` is not given."""
POD_CHUNK = 64
"""The most inputs per stored chunk of a batch with a pod per input (each pod downloads
the chunk holding its input)."""
_PROBE_JOB = "kinetic-reachability-probe"
"""A Job name no Kinetic job has (ids are ``job-…``): the cluster check reads it (404)."""
_PROBE_TIMEOUT = 15.0


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


class ClusterArgs(TypedDict, total=False):
    """A cluster backend's keyword arguments (see :class:`ClusterBackend`), for the
    subclasses to pass on."""

    namespace: str
    options: GKEOptions | None
    storage: GCSStorage | None


@dataclass(frozen=True)
class LaunchPlan:
    """A job ready to launch: what :meth:`ClusterBackend.prepare` built and
    :meth:`ClusterBackend.launch` creates.

    :ivar namespace: where the job's objects go.
    :ivar manifest: the job's ``batch/v1`` Job (on pathways, every host's pod template).
    :ivar accelerator: what the job runs on.
    """

    namespace: str
    manifest: Mapping[str, Any]
    accelerator: AcceleratorConfig

    def with_gcs_fuse(self, buckets: Iterable[str]) -> LaunchPlan:
        """The plan with read-only GCS FUSE volumes for ``buckets`` in its pods."""
        return replace(self, manifest=k8s_spec.with_gcs_fuse(self.manifest, buckets))


@dataclass(frozen=True)
class ClusterLaunch:
    """A job ready to launch on ``backend``: its plan
    (:class:`~kinetic._backends.base.Launch`)."""

    backend: ClusterBackend
    plan: LaunchPlan

    def with_gcs_fuse(self, buckets: Iterable[str]) -> ClusterLaunch:
        return replace(self, plan=self.plan.with_gcs_fuse(buckets))

    async def start(self, job: JobRef) -> None:
        await self.backend.launch(self.plan)


class Follower(abc.ABC):
    """One waiter's view of its job: what the backend reads in a pass, and how it
    ends the job when :func:`kinetic._core.wait_plan.judge` says so."""

    @abc.abstractmethod
    def podless(self, watch: SharedWatch) -> bool:
        """Whether the job's object exists without a pod, as the watch shows it."""

    @abc.abstractmethod
    async def read(self, watch: SharedWatch, look: wait_plan.Look) -> StatusReport:
        """The job's status now (what ``look`` says to read included)."""

    @abc.abstractmethod
    async def end(self, verdict: wait_plan.Verdict) -> None:
        """Record the job's outcome for every process and delete its cluster objects."""


class ClusterBackend(abc.ABC):
    """Jobs as Kubernetes objects in ``namespace``; storage is the GCS bucket ``bucket``.

    :param bucket: the jobs bucket.
    :param cluster: the loop's shared API client and watches.
    :param namespace: the namespace new jobs go to (a handle names its own).
    :param options: the backend's knobs (pods, start grace, images).
    """

    name: ClassVar[str]
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
        self._cluster_answered = False  # check_cluster succeeded once

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.bucket!r}, namespace={self.namespace!r})"

    @property
    def client(self) -> KubeClient:
        return self.cluster.client

    # -- submission -------------------------------------------------------------------

    def placement(self, settings: Settings) -> Placement:
        """The bucket ``{project}-kn-{cluster}-jobs`` (the settings'), outputs in it, pods
        of an image built with this backend's options."""
        bucket = settings.bucket_name
        return Placement(
            bucket_name=bucket,
            cluster_name=settings.cluster,
            zone=settings.zone,
            outputs=f"gs://{bucket}/outputs",
            images=self.options,
            batch_concurrency=BATCH_CONCURRENCY,
            pod_chunk=POD_CHUNK,
        )

    async def get_ready(self) -> None:
        """Check the cluster (:meth:`check_cluster`), then settle which service account
        the pods run as (before a manifest is built from the options)."""
        await self.check_cluster()
        await settle_service_account(self)

    def prepare_launch(self, job: NewJob) -> ClusterLaunch:
        """The job's plan (:meth:`prepare`), with this backend's bucket and pod options.

        :raises ConfigError: the job cannot run here (pathways: not a TPU slice).
        """
        template = k8s_spec.JobTemplate(
            namespace=job.namespace,
            image=job.image,
            bucket=self.bucket,
            accelerator=job.accelerator,
            output_dir=job.output_dir,
            env=job.env,
            pod=self.options.pod,
            func_name=job.func_name,
            runner_image=job.runner_image,
            secrets=job.secrets,
            timeout=job.timeout,
            retries=job.retries,
        )
        return ClusterLaunch(self, self.prepare(job.job_id, template))

    # -- launching --------------------------------------------------------------------

    async def check_cluster(self) -> None:
        """Check, before anything is built or written, that the cluster can run this
        backend's jobs: its API server answers this client, with its credentials, in the
        jobs' namespace (once per backend: a GET of a Job that does not exist). An
        unreachable cluster, or a kubeconfig without it, is said before an image is
        built or a byte uploaded, not after.

        :raises ConfigError: it cannot (the Kubernetes configuration cannot be loaded).
        :raises BackendError: the API server failed, refused or could not be reached.
        """
        if self._cluster_answered:
            return
        path = f"/apis/batch/v1/namespaces/{self.namespace}/jobs/{_PROBE_JOB}"
        try:
            await self.client.get(path, what="reach the cluster", timeout=_PROBE_TIMEOUT)
        except BackendError as exc:
            raise BackendError(
                f"the cluster cannot run jobs from here ({exc}); nothing was built or "
                "written. Check that it is up and that your kubeconfig names it "
                "(`kinetic doctor` says what fails)"
            ) from exc
        self._cluster_answered = True

    def prepare(self, job_id: str, template: k8s_spec.JobTemplate) -> LaunchPlan:
        """The plan of job ``job_id`` from ``template`` (this backend's bucket and pod
        options in it). Pure.

        :raises ConfigError: the template cannot make a job.
        """
        return LaunchPlan(
            template.namespace, k8s_spec.job_manifest(template, job_id), template.accelerator
        )

    @abc.abstractmethod
    async def launch(self, plan: LaunchPlan) -> None:
        """Create the cluster objects that ``plan`` describes.

        :raises ConfigError: the namespace (or the object's API) does not exist.
        :raises BackendError: the API server refused or could not be reached.
        """

    # -- status and logs (what differs: see the subclasses) ---------------------------

    @abc.abstractmethod
    async def status(self, job: JobRef) -> StatusReport:
        """The job's current status, asked of the API server."""

    @abc.abstractmethod
    async def logs(self, job: JobRef, *, tail: int | None = None) -> str:
        """The job's output so far (the last ``tail`` lines when given)."""

    @abc.abstractmethod
    def follow_logs(self, job: JobRef, finished: anyio.Event | None = None) -> AsyncIterator[str]:
        """Yield the job's output as it is written, from the start, until it ends."""

    # -- waiting ----------------------------------------------------------------------

    @abc.abstractmethod
    def _wait_rules(self) -> wait_plan.WaitRules:
        """How this backend's waiters wait."""

    @abc.abstractmethod
    async def _follower(self, job: JobRef) -> Follower:
        """A waiter's view of ``job``."""

    async def wait(self, job: JobRef, on_change: StatusCallback | None = None) -> StatusReport:
        """Follow the job through the namespace's shared watch until it ends."""
        watch = self.cluster.watch(job.namespace)
        follower = await self._follower(job)
        rules = self._wait_rules()
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
                state, look = wait_plan.look(state, rules, now=now, podless=follower.podless(watch))
                report = await follower.read(watch, look)
                state, verdict = wait_plan.judge(
                    state,
                    rules,
                    report,
                    now=now,
                    podless_for=look.podless_for,
                    lost=watch.lost.get(job.job_id) is not None,
                )
                report = verdict.report
                if verdict.end:
                    await follower.end(verdict)
                if on_change is not None and report != last:
                    await on_change(report)
                last = report
                if report.status.is_terminal:
                    return report
                with anyio.move_on_after(verdict.timeout):
                    await changes.wait()

    async def _read_json(self, key: str) -> Any:
        """The JSON object stored at ``key``; None when there is none (or it is not JSON)."""
        try:
            return protocol.load_json(await self.storage.read(key))
        except (ObjectNotFoundError, ValueError):
            return None

    # -- logs -------------------------------------------------------------------------

    async def _stored(self, key: str) -> bytes | None:
        try:
            return await self.storage.read(key)
        except ObjectNotFoundError:
            return None

    async def _stored_logs(self, key: str) -> str | None:
        data = await self._stored(key)
        return None if data is None else data.decode(errors="replace")

    def _pod_log_stream(self, job: JobRef, pod: str) -> AsyncIterator[bytes]:
        """The live log of ``pod``, from its start, until its container ends."""
        return self.client.stream(
            f"/api/v1/namespaces/{job.namespace}/pods/{pod}/log",
            what=f"follow log of pod {job.namespace}/{pod}",
            query=[("follow", "true")],
            read_timeout=None,
        )

    # -- ending -----------------------------------------------------------------------

    @abc.abstractmethod
    async def _delete_cluster_objects(self, job: JobRef) -> None:
        """Delete the job's Kubernetes objects and pods. Idempotent."""

    @abc.abstractmethod
    async def _list_cluster_objects(self) -> list[Any]:
        """The job objects labelled ``app=kinetic`` in the backend's namespace."""

    async def cancel(self, job: JobRef) -> None:
        """Delete the job's cluster objects. Idempotent.

        A job that has not recorded an outcome gets a cancel record first, so every
        process reports it FAILED (cancelled).
        """
        if not await self.storage.exists(protocol.final_key(job.job_id)):
            await self.storage.write(
                f"{job.job_id}/{CANCEL_KEY}", protocol.dump_json({"cancelled": True})
            )
        await self._delete_cluster_objects(job)

    async def read_result(self, job: JobRef) -> bytes:
        """The job's result payload. :raises ObjectNotFoundError: when there is none."""
        return await self.storage.read(protocol.result_key(job.job_id))

    async def delete_objects(self, job: JobRef) -> None:
        """Delete the job's objects (``{job_id}/``); shared context archives stay."""
        await self.storage.delete_prefix(f"{job.job_id}/")

    async def list_job_ids(self) -> list[str]:
        """Ids of the jobs whose objects are in the namespace, and of recorded jobs."""
        return await known_job_ids(self.storage, self._list_cluster_objects)

    async def aclose(self) -> None:
        """Close the storage session (the shared cluster client is closed by its owner)."""
        await self.storage.aclose()


def tail_of(text: str, tail: int | None) -> str:
    """The last ``tail`` lines of ``text`` (all of it when ``tail`` is None)."""
    if tail is None:
        return text
    return "".join(text.splitlines(keepends=True)[-tail:]) if tail > 0 else ""


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
