"""The submission hooks of the pathways backend (see :mod:`kinetic._engine.targets`).

Location fields are the GKE backend's (same bucket and outputs). :meth:`prepare`
checks that the cluster serves LeaderWorkerSets (discovered once per process)
before the image is built or anything is written, so a cluster without the CRD
fails fast and leaves nothing behind.
"""

from __future__ import annotations

from kinetic._backends.base import Backend
from kinetic._backends.pathways.backend import PathwaysBackend
from kinetic._core.image_spec import JobImage
from kinetic._engine.targets import GKETarget, LaunchInput, gke_image


def _expect(backend: Backend) -> PathwaysBackend:
    if not isinstance(backend, PathwaysBackend):
        raise TypeError(f"expected a pathways backend, got {backend!r}")
    return backend


class PathwaysTarget(GKETarget):
    """LeaderWorkerSets: the GKE bucket and image, one pod per host."""

    async def prepare(self, backend: Backend, job: LaunchInput) -> JobImage:
        pathways = _expect(backend)
        await pathways.check_cluster()
        image = await gke_image(
            pathways, job.settings, job.accelerator, job.container_image, job.package_root
        )
        template = job.template(image.uri, pathways.bucket, pathways.options.pod)
        pathways.prepare(job.job_id, template)
        return image

    def mount_gcs_fuse(self, backend: Backend, job_id: str, buckets: set[str]) -> None:
        _expect(backend).mount_gcs_fuse(job_id, buckets)

    def discard(self, backend: Backend, job_id: str) -> None:
        if isinstance(backend, PathwaysBackend):
            backend.discard(job_id)
