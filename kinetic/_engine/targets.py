"""What differs per backend when a job is submitted: small hooks, one class per backend.

:func:`target_for` picks the hooks by backend name. Each hook is called by
:func:`kinetic._engine.submit.submit` at a fixed point: the location fields before
anything is written, :meth:`Target.prepare` (image resolution, spec building:
anything that can fail on bad input) also before anything is written, and
:meth:`Target.launch` once the job's objects are stored. What ``prepare`` builds
travels with the submission (:class:`Prepared`): nothing is kept between the calls.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import anyio.to_thread

from kinetic._backends.base import Backend
from kinetic._core.accelerators import AcceleratorConfig
from kinetic._core.config import Settings
from kinetic._core.image_spec import JobImage
from kinetic._exceptions import ConfigError

if TYPE_CHECKING:
    from kinetic._backends.base import JobRef
    from kinetic._backends.cluster import ClusterBackend as PodBackend
    from kinetic._backends.cluster import LaunchPlan
    from kinetic._core.gke_config import GKEOptions
    from kinetic._core.k8s_spec import JobTemplate, PodOptions
    from kinetic._storage.base import Storage


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
    package_root: Path

    def template(self, image: str, bucket: str, pod: PodOptions) -> JobTemplate:
        """The job's Kubernetes Job template: running ``image``, on ``bucket``, with a
        cluster backend's ``pod`` options."""
        from kinetic._core.k8s_spec import JobTemplate  # cluster backends only

        return JobTemplate(
            namespace=self.settings.namespace,
            image=image,
            bucket=bucket,
            accelerator=self.accelerator,
            output_dir=self.output_dir,
            env=self.env,
            pod=pod,
            func_name=self.func_name,
        )


@dataclass(frozen=True)
class Prepared:
    """A job ready to launch: its image, and on a cluster backend the plan of its
    Kubernetes objects."""

    image: JobImage
    plan: LaunchPlan | None = None

    def with_gcs_fuse(self, buckets: set[str]) -> Prepared:
        """Mount these buckets read-only (``fuse=True`` data) in the job's pods (a local
        job reads its data in place)."""
        if self.plan is None:
            return self
        return Prepared(self.image, self.plan.with_gcs_fuse(buckets))


class Target(Protocol):
    """The backend-specific steps of a submission."""

    def placement(self, settings: Settings, job_id: str, output_dir: str | None) -> Placement:
        """Location fields; ``output_dir`` is the user's, or None for the default."""
        ...

    async def prepare(self, backend: Backend, job: LaunchInput) -> Prepared:
        """Get the job ready to launch (nothing written).

        :raises ConfigError: on input the backend cannot run.
        :raises ImageBuildError: the job's image could not be built.
        """
        ...

    async def launch(self, backend: Backend, job: JobRef, prepared: Prepared) -> None:
        """Start the job. Its spec, payload and handle are already stored.

        :raises BackendError: when it cannot be started; nothing keeps running then.
        """
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

    async def prepare(self, backend: Backend, job: LaunchInput) -> Prepared:
        await warn_missing_requirements(job.package_root)
        await warn_missing_runtime(job.accelerator.kind)
        return Prepared(JobImage(job.container_image or "", "local"))

    async def launch(self, backend: Backend, job: JobRef, prepared: Prepared) -> None:
        from kinetic._backends.local import LocalBackend

        if not isinstance(backend, LocalBackend):
            raise TypeError(f"expected a local backend, got {backend!r}")
        await backend.launch(job)


class GKETarget:
    """Kubernetes objects (a Job on GKE, a LeaderWorkerSet on pathways): the bucket
    ``{project}-kn-{cluster}-jobs``, outputs in it."""

    def placement(self, settings: Settings, job_id: str, output_dir: str | None) -> Placement:
        bucket = settings.bucket_name
        return Placement(
            bucket_name=bucket,
            output_dir=output_dir or f"gs://{bucket}/outputs/{job_id}",
            cluster_name=settings.cluster,
            zone=settings.zone,
        )

    async def prepare(self, backend: Backend, job: LaunchInput) -> Prepared:
        cluster = _cluster_backend(backend)
        await cluster.check_cluster()  # before the image is built or anything is written
        image = await gke_image(
            cluster, job.settings, job.accelerator, job.container_image, job.package_root
        )
        template = job.template(image.uri, cluster.bucket, cluster.options.pod)
        return Prepared(image, cluster.prepare(job.job_id, template))

    async def launch(self, backend: Backend, job: JobRef, prepared: Prepared) -> None:
        if prepared.plan is None:
            raise ValueError(f"job {job.job_id} was not prepared for launch")
        await _cluster_backend(backend).launch(prepared.plan)


def _cluster_backend(backend: Backend) -> PodBackend:
    from kinetic._backends.cluster import ClusterBackend as PodBackend

    if not isinstance(backend, PodBackend):
        raise TypeError(f"expected a cluster backend, got {backend!r}")
    return backend


@runtime_checkable
class ClusterBackend(Protocol):
    """What building a job's image needs of a backend whose jobs run in pods (GKE,
    Pathways): its knobs and its bucket."""

    options: GKEOptions
    storage: Storage


async def gke_image(
    backend: Backend,
    settings: Settings,
    accelerator: AcceleratorConfig,
    container_image: str | None,
    package_root: Path,
) -> JobImage:
    """The image of a GKE or Pathways job, or a GKE batch, in its execution mode
    (bundled images are built and pushed here when new). Nothing about the job is
    written.

    :raises RequirementsError, ConfigError, ImageBuildError, BackendError: see
        :func:`kinetic._images.modes.resolve_job_image`.
    """
    from kinetic._images.modes import resolve_job_image

    if not isinstance(backend, ClusterBackend):
        raise TypeError(f"expected a cluster backend, got {backend!r}")
    from kinetic._backends.gke.pod_identity import settle_service_account

    # Before the job's manifest is built from the options: which service account.
    await settle_service_account(backend)  # type: ignore[arg-type]
    return await resolve_job_image(
        container_image,
        category=accelerator.kind,
        package_root=package_root,
        settings=settings,
        options=backend.options,
        storage=backend.storage,
        env=os.environ,
        progress=_build_progress,
    )


def _build_progress(line: str) -> None:
    # A build takes minutes: say that it runs and show its steps, not every line of pip.
    if line.startswith(("building ", "Step ")):
        print(f"kinetic: {line}", file=sys.stderr, flush=True)


_warned_roots: set[Path] = set()


async def warn_missing_requirements(package_root: Path) -> None:
    """Say once per project and process which of its requirements this interpreter
    lacks: the local backend runs jobs with it, so they would fail on import."""
    if package_root in _warned_roots:
        return
    _warned_roots.add(package_root)
    from kinetic._engine.requirements_io import missing_distributions, read_project_requirements

    def check() -> list[str]:
        try:
            return missing_distributions(read_project_requirements(package_root))
        except ConfigError as exc:  # an unreadable file is worth a line, not a failure
            return [f"(cannot read the requirements: {exc})"]

    missing = await anyio.to_thread.run_sync(check)
    if missing:
        print(
            f"kinetic: warning: the local backend runs jobs with this interpreter "
            f"({sys.executable}), which lacks requirements of {package_root}: "
            f"{', '.join(missing)}. Install them here (pip install ...) or jobs that "
            "import them will fail.",
            file=sys.stderr,
        )


_warned_categories: set[str] = set()

#: What a job's pod would have that the local interpreter must have too: (distribution,
#: what it is for). CPU jobs run on jaxlib's own CPU backend.
_RUNTIME_NEEDS: Mapping[str, tuple[tuple[str, str], ...]] = {
    "gpu": (("jax", "JAX"), ("jax-cuda12-plugin", "JAX's CUDA plugin"), ("keras", "Keras")),
    "tpu": (("jax", "JAX"), ("libtpu", "JAX's TPU backend"), ("keras", "Keras")),
}


def missing_runtime(category: str) -> list[str]:
    """What of a ``category`` job's pod runtime this interpreter lacks: ``"jax-cuda12-plugin
    (JAX's CUDA plugin)"``, ... Blocking (one metadata lookup per distribution)."""
    import importlib.metadata

    missing = []
    for dist, what in _RUNTIME_NEEDS.get(category, ()):
        try:
            importlib.metadata.distribution(dist)
        except importlib.metadata.PackageNotFoundError:
            missing.append(f"{dist} ({what})")
    return missing


async def warn_missing_runtime(category: str) -> None:
    """Say once per category and process what a GPU or TPU job's pod would have (its
    image's runtime) that this interpreter lacks: the local backend runs jobs with it."""
    if category in _warned_categories or category not in _RUNTIME_NEEDS:
        return
    _warned_categories.add(category)
    missing = await anyio.to_thread.run_sync(missing_runtime, category)
    if missing:
        extra = "cuda12" if category == "gpu" else "tpu"
        print(
            f"kinetic: warning: a {category.upper()} job's image carries "
            f"jax[{extra}] and keras, but the local backend runs jobs with this "
            f"interpreter ({sys.executable}), which lacks {', '.join(missing)}. Install "
            f'them here (pip install "jax[{extra}]" keras) or jobs that use them will '
            "fail or fall back to the CPU.",
            file=sys.stderr,
        )


_TARGETS: Mapping[str, Target] = {
    "local": LocalTarget(),
    "gke": GKETarget(),
    "pathways": GKETarget(),
}


def target_for(backend: Backend) -> Target:
    """The submission hooks of ``backend``.

    :raises ConfigError: for a backend without them.
    """
    try:
        return _TARGETS[backend.name]
    except KeyError:
        raise ConfigError(f"backend {backend.name!r} cannot run jobs yet") from None
