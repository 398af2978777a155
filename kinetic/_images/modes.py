"""Execution modes: which image a GKE job runs in, and what its pod installs at start.

========== ============================== =============================================
mode       ``container_image``            image
========== ============================== =============================================
bundled    None or ``"bundled"``          built here: the category's runtime image
                                          (shared), and on it the project's requirements
prebuilt   ``"prebuilt"``                 ``{base_image_repo}/base-{cat}:{version}-py{X.Y}``;
                                          the pod installs the requirements with uv
custom     anything else                  used as given; Kinetic's runner comes with
                                          the job (:mod:`kinetic._images.delivery`)
========== ============================== =============================================

In bundled and prebuilt mode the project's requirements (read by the caller, the
engine) and the image's runtime are resolved together for the image's platform before
anything is built or written (:mod:`kinetic._images.runtime_resolve`). Lines marked
``# kn:keep`` are the user's override: resolved on their own, and installed as written
after everything else (a step of the project image; a second uv run in the pod).

See ``docs/execution-modes.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence

import anyio.to_thread

from kinetic._core import accel_runtime, image_spec, runner_delivery
from kinetic._core.accel_runtime import RuntimeRequest
from kinetic._core.config import Settings
from kinetic._core.gke_config import GKEOptions
from kinetic._core.image_spec import JobImage
from kinetic._core.index_install import choose_install
from kinetic._core.requirements import (
    Requirement,
    check_installable_remotely,
    requirements_lines,
)
from kinetic._exceptions import ConfigError
from kinetic._images import delivery, runner_image, runtime_resolve
from kinetic._images.builder import ImageBuilder, Progress, choose_builder
from kinetic._images.runtime_resolve import ResolvedRuntime
from kinetic._storage.base import Storage
from kinetic._version import __version__

log = logging.getLogger(__name__)


def make_builder(
    settings: Settings,
    storage: Storage | None,
    env: Mapping[str, str],
    docker_host: str | None = None,
) -> ImageBuilder:
    """The builder the settings choose (``KINETIC_BUILDER`` > profile > default), with
    the install path they choose for it (``KINETIC_BUILD_INSTALL`` > profile > ``index``
    on Cloud Build, ``wheels`` on Docker).

    :param storage: the jobs bucket's store (Cloud Build's sources and logs go there).
    :raises ConfigError: unknown builder or install path, or Cloud Build without a
        project and bucket.
    """
    name = choose_builder(settings.builder, project=settings.project, env=env)
    install = choose_install(settings.build_install, name)
    if name == "docker":
        from kinetic._images.docker import DockerBuilder

        return DockerBuilder(docker_host or env.get("DOCKER_HOST"), install=install)
    from kinetic._images.cloudbuild import CloudBuildBuilder

    if not settings.project or storage is None:
        raise ConfigError("the cloudbuild builder needs a GCP project (KINETIC_PROJECT)")
    return CloudBuildBuilder(
        project=settings.project, storage=storage, bucket=settings.bucket_name, install=install
    )


_said: set[str] = set()


def say_once(notes: Iterable[str]) -> None:
    """Say each note about the user's requirement lines once per process (an INFO
    record: the line is rewritten or kept as asked, nothing to fix)."""
    for note in notes:
        if note not in _said:
            _said.add(note)
            log.info("note: %s", note)


async def resolve_runtime(
    reqs: Iterable[Requirement], category: str, base_image: str
) -> tuple[RuntimeRequest, ResolvedRuntime]:
    """The runtime an image of ``category`` on ``base_image`` carries for these
    requirements, resolved for its platform, the project's lines checked on top of it,
    and its ``# kn:keep`` lines on their own. Notes on rewritten or kept lines are said
    once. Blocking work runs in a worker thread.

    :raises RuntimeConflictError: no installable set; names the line and the platform.
    """
    request = accel_runtime.runtime_request(reqs, category)
    say_once(request.notes)
    python = accel_runtime.image_python(base_image)

    def resolve() -> ResolvedRuntime:
        kinetic_lines = runner_image.runtime_inputs(python)
        resolved = runtime_resolve.resolve_runtime(request, python, kinetic_lines)
        runtime_resolve.check_project(resolved, request.project)
        runtime_resolve.check_kept(resolved, request.kept, request.project)
        return resolved

    return request, await anyio.to_thread.run_sync(resolve)


async def resolve_job_image(
    container_image: str | None,
    *,
    requirements: Sequence[Requirement],
    category: str,
    settings: Settings,
    options: GKEOptions,
    storage: Storage,
    env: Mapping[str, str],
    progress: Progress | None = None,
) -> JobImage:
    """The image (and install list) of a job, building its runtime and project images
    if they are new. Everything that can be wrong with the requirements is found before
    anything is built.

    :param requirements: the project's requirement lines (unused for a custom image).
    :raises RequirementsError: (prebuilt mode) a line cannot be installed from a
        package index.
    :raises RuntimeConflictError: the requirements and the runtime have no installable
        set for the image's platform.
    :raises ConfigError: no registry for bundled images; unknown builder.
    :raises ImageBuildError: an image could not be built or pushed.
    :raises BackendError: the registry failed, or (prebuilt) lacks the base image.
    """
    mode = image_spec.execution_mode(container_image)

    def builder() -> ImageBuilder:
        return make_builder(settings, storage, env)

    if mode == "custom":
        assert container_image is not None
        if not runner_delivery.needs_delivery(container_image):
            return JobImage(container_image, "custom")
        # The image need not carry Kinetic: its pods get the runner from this one.
        runner = await delivery.ensure_delivery_image(
            settings, options, storage, builder, progress=progress
        )
        return JobImage(container_image, "custom", runner=runner)
    if mode == "prebuilt":
        check_installable_remotely(requirements)
        request, _ = await resolve_runtime(requirements, category, options.base_image)
        tag = image_spec.prebuilt_tag(__version__, accel_runtime.image_python(options.base_image))
        uri = image_spec.prebuilt_uri(settings.base_image_repo, category, tag)
        if not await runner_image.image_exists(uri):
            raise ConfigError(
                f"the prebuilt base image {uri} is not in its registry: build it with "
                f"`kinetic build-image --repo {settings.base_image_repo} --category "
                f"{category}`, or set base_image_repo= / KINETIC_BASE_IMAGE_REPO"
            )
        # The base carries the default runtime; a user's pin of it is installed at start.
        pins = () if request.is_default else tuple(r.line for r in request.user_runtime)
        lines = (*pins, *requirements_lines(request.project))
        kept = tuple(requirements_lines(request.kept))
        return JobImage(uri, "prebuilt", install=lines, install_kept=kept)
    request, resolved = await resolve_runtime(requirements, category, options.base_image)
    registry = options.image_registry or settings.default_registry
    runtime = await anyio.to_thread.run_sync(
        runner_image.runtime_plan, registry, options.base_image, resolved
    )

    lines = tuple(requirements_lines(request.project))
    kept = tuple(requirements_lines(request.kept))
    if not lines and not kept:
        await runner_image.ensure_image(runtime, builder, lock_storage=storage, progress=progress)
        return JobImage(runtime.uri, "bundled")
    project = runner_image.project_plan(runtime, lines, kept=kept)
    # A project image is only ever pushed after its runtime: when it is listed, one
    # registry request was all a warm submission needed.
    if not await runner_image.image_exists(project.uri):
        await runner_image.ensure_image(runtime, builder, lock_storage=storage, progress=progress)
        await runner_image.ensure_image(project, builder, lock_storage=storage, progress=progress)
    return JobImage(project.uri, "bundled")
