"""What differs per backend when a job is submitted: small hooks, one class per backend.

:func:`target_for` picks the hooks by backend name. Each hook is called by
:func:`kinetic._engine.submit.submit` at a fixed point: the location fields before
anything is written, :meth:`Target.prepare` (image resolution, spec building:
anything that can fail on bad input) also before anything is written, and
:meth:`Target.discard` when submission fails after ``prepare``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from kinetic._backends.base import Backend
from kinetic._core.accelerators import AcceleratorConfig
from kinetic._core.config import Settings
from kinetic._exceptions import ConfigError


@dataclass(frozen=True)
class Placement:
    """Where a job's records and outputs live, and the handle's location fields."""

    bucket_name: str
    output_dir: str
    cluster_name: str
    zone: str


@dataclass(frozen=True)
class LaunchInput:
    """What :meth:`Target.prepare` may use to get a job ready to launch."""

    job_id: str
    settings: Settings
    accelerator: AcceleratorConfig
    container_image: str | None
    output_dir: str
    env: Mapping[str, str]
    func_name: str


class Target(Protocol):
    """The backend-specific steps of a submission."""

    def placement(self, settings: Settings, job_id: str, output_dir: str | None) -> Placement:
        """Location fields; ``output_dir`` is the user's, or None for the default."""
        ...

    async def prepare(self, backend: Backend, job: LaunchInput) -> str:
        """Get the job ready to launch (nothing written); return its image URI ("" if none).

        :raises ConfigError: on input the backend cannot run.
        """
        ...

    def mount_gcs_fuse(self, backend: Backend, job_id: str, buckets: set[str]) -> None:
        """Mount these buckets read-only (``fuse=True`` data) in the prepared job."""
        ...

    def discard(self, backend: Backend, job_id: str) -> None:
        """Forget what :meth:`prepare` kept, after a failed submission."""
        ...


class LocalTarget:
    """Local processes: storage and outputs under ``KINETIC_LOCAL_ROOT``."""

    def placement(self, settings: Settings, job_id: str, output_dir: str | None) -> Placement:
        root = Path(settings.local_root).absolute()
        return Placement(
            bucket_name=str(root / "storage"),
            output_dir=output_dir or str(root / "outputs" / job_id),
            cluster_name="local",
            zone="",
        )

    async def prepare(self, backend: Backend, job: LaunchInput) -> str:
        return job.container_image or ""

    def mount_gcs_fuse(self, backend: Backend, job_id: str, buckets: set[str]) -> None:
        return None  # local jobs use local paths in place and download gs:// data

    def discard(self, backend: Backend, job_id: str) -> None:
        return None


class GKETarget:
    """Kubernetes Jobs: the bucket ``{project}-kn-{cluster}-jobs``, outputs in it."""

    def placement(self, settings: Settings, job_id: str, output_dir: str | None) -> Placement:
        bucket = settings.bucket_name
        return Placement(
            bucket_name=bucket,
            output_dir=output_dir or f"gs://{bucket}/outputs/{job_id}",
            cluster_name=settings.cluster,
            zone=settings.zone,
        )

    async def prepare(self, backend: Backend, job: LaunchInput) -> str:
        from kinetic._backends.gke.backend import GKEBackend

        if not isinstance(backend, GKEBackend):
            raise TypeError(f"expected a GKE backend, got {backend!r}")
        image = job.container_image or await built_image(backend)
        backend.prepare(
            job.job_id,
            image=image,
            accelerator=job.accelerator,
            output_dir=job.output_dir,
            env=job.env,
            func_name=job.func_name,
            namespace=job.settings.namespace,
        )
        return image

    def mount_gcs_fuse(self, backend: Backend, job_id: str, buckets: set[str]) -> None:
        from kinetic._backends.gke.backend import GKEBackend

        if isinstance(backend, GKEBackend):
            backend.mount_gcs_fuse(job_id, buckets)

    def discard(self, backend: Backend, job_id: str) -> None:
        from kinetic._backends.gke.backend import GKEBackend

        if isinstance(backend, GKEBackend):
            backend.discard(job_id)


async def built_image(backend: object) -> str:
    """The runner image Kinetic builds and pushes for ``backend`` (a GKE backend).

    :raises ConfigError: when no image registry is configured.
    """
    from kinetic._backends.gke.backend import GKEBackend
    from kinetic._images.runner_image import ensure_runner_image

    assert isinstance(backend, GKEBackend)
    registry = backend.options.image_registry
    if registry is None:
        raise ConfigError(
            "a GKE job needs an image: pass container_image='registry/image:tag' (an image "
            "with kinetic-aio installed), or set KINETIC_IMAGE_REGISTRY to have Kinetic "
            "build and push its runner image there"
        )
    return await ensure_runner_image(registry, backend.options.base_image)


_TARGETS: Mapping[str, Target] = {"local": LocalTarget(), "gke": GKETarget()}


def target_for(backend: Backend) -> Target:
    """The submission hooks of ``backend``.

    :raises ConfigError: for a backend without them.
    """
    try:
        return _TARGETS[backend.name]
    except KeyError:
        raise ConfigError(f"backend {backend.name!r} cannot run jobs yet") from None
