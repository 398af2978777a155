"""What the GKE backend's two batch engines share: one follower of each batch per
process, asked for its events, snapshots, outcomes and stop record.

:class:`~kinetic._backends.gke.batch.GKEBatches` (one Job per input) and
:class:`~kinetic._backends.gke.pool.GKEPool` (a worker pool) differ in how a batch
advances (their followers) and in the answers about one input; the rest is here,
with how a recorded batch's Jobs are built (:func:`batch_job`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import anyio

from kinetic._backends.base import BatchEvents, Loaded
from kinetic._core import accelerators, k8s_spec, secret_spec
from kinetic._exceptions import BackendError, ObjectNotFoundError, StorageError
from kinetic._storage.base import Storage
from runner import protocol

if TYPE_CHECKING:
    from kinetic._backends.cluster import ClusterBackend


class Follower(Protocol):
    """One process's view of one batch, kept current by its engine."""

    async def step(self, known: Collection[int]) -> BatchEvents: ...

    async def snapshot(self, known: Collection[int]) -> BatchEvents: ...

    async def load_many(self, indices: list[int]) -> Loaded: ...

    async def read_stop(self) -> protocol.StopRecord | None: ...


F = TypeVar("F", bound=Follower)
T = TypeVar("T")

log = logging.getLogger(__name__)

STEP_ATTEMPTS = 5
"""Tries of one step of following a batch before its error reaches the caller. Each
request of a step has already used its own retries: a failed step means a burst of
faults, which a batch that runs for hours must outlive (its inputs run on regardless)."""


async def patiently(what: str, call: Callable[[], Awaitable[T]]) -> T:
    """``call()``, tried again (after 0.5, 1, 2, 4 s) when it fails with a storage or
    Kubernetes API error; the last error is raised. A missing object is not retried."""
    delay = 0.5
    for attempt in range(1, STEP_ATTEMPTS + 1):
        try:
            return await call()
        except (StorageError, BackendError) as exc:
            if isinstance(exc, ObjectNotFoundError) or attempt == STEP_ATTEMPTS:
                raise
            log.warning("%s failed (%s); trying again in %.1f s", what, exc, delay)
        await anyio.sleep(delay)
        delay *= 2
    raise AssertionError("unreachable")


class GroupEngine(Generic[F]):
    """A batch engine of one backend: one follower per batch (made on first use)."""

    def __init__(self, backend: ClusterBackend) -> None:
        self.backend = backend
        self._followers: dict[str, F] = {}

    def _new_follower(self, group_id: str) -> F:
        raise NotImplementedError

    @property
    def storage(self) -> Storage:
        return self.backend.storage

    def follower(self, group_id: str) -> F:
        """This process's follower of the batch (one per batch and backend)."""
        found = self._followers.get(group_id)
        if found is None:
            found = self._followers[group_id] = self._new_follower(group_id)
        return found

    async def follow(self, group_id: str, known: Collection[int]) -> AsyncIterator[BatchEvents]:
        follower = self.follower(group_id)
        what = f"following batch {group_id}"
        while True:
            yield await patiently(what, lambda: follower.step(known))

    async def snapshot(self, group_id: str, known: Collection[int]) -> BatchEvents:
        follower = self.follower(group_id)
        return await patiently(f"looking at batch {group_id}", lambda: follower.snapshot(known))

    async def load_many(self, group_id: str, indices: list[int]) -> Loaded:
        follower = self.follower(group_id)
        what = f"reading outcomes of batch {group_id}"
        return await patiently(what, lambda: follower.load_many(indices))

    async def read_stop(self, group_id: str) -> protocol.StopRecord | None:
        return await self.follower(group_id).read_stop()


def batch_job(
    backend: ClusterBackend,
    manifest: protocol.BatchManifest,
    build: Callable[[k8s_spec.JobTemplate], dict[str, Any]],
) -> dict[str, Any]:
    """A Job of the batch ``manifest`` records: ``build`` given the batch's template (its
    image, namespace, accelerator, outputs, environment and function; this backend's
    bucket and pod options), with the batch's GCS FUSE volumes. Pure.

    :raises ConfigError: as :func:`kinetic._core.k8s_spec.job_manifest`.
    """
    gke = manifest["gke"]
    template = k8s_spec.JobTemplate(
        namespace=gke["namespace"],
        image=gke["image"],
        bucket=backend.bucket,
        accelerator=accelerators.parse_accelerator(gke["accelerator"]),
        output_dir=manifest["spec"]["output_dir"],
        env=manifest["spec"]["env"],
        pod=backend.options.pod,
        func_name=manifest["func_name"],
        runner_image=gke.get("runner_image", ""),
        secrets=tuple(secret_spec.from_record(r) for r in gke.get("secrets", [])),
    )
    job = build(template)
    if gke.get("fuse_buckets"):
        job = k8s_spec.with_gcs_fuse(job, gke["fuse_buckets"])
    return job
