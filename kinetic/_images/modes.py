"""Execution modes: which image a GKE job runs in, and what its pod installs at start.

========== ============================== =============================================
mode       ``container_image``            image
========== ============================== =============================================
bundled    None or ``"bundled"``          built here: Kinetic's runner + the project's
                                          filtered requirements, tag = digest of both
prebuilt   ``"prebuilt"``                 ``{base_image_repo}/base-{cat}:{version}``;
                                          the pod installs the requirements with uv
custom     anything else                  used as given
========== ============================== =============================================

See ``docs/execution-modes.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import anyio.to_thread

from kinetic._core import image_spec
from kinetic._core.config import Settings
from kinetic._core.gke_config import GKEOptions
from kinetic._core.image_spec import JobImage
from kinetic._core.requirements import (
    check_installable_remotely,
    filter_for_category,
    requirements_lines,
)
from kinetic._engine.requirements_io import read_project_requirements
from kinetic._exceptions import ConfigError
from kinetic._images import runner_image
from kinetic._images.builder import ImageBuilder, Progress, choose_builder
from kinetic._storage.base import Storage
from kinetic._version import __version__


def make_builder(
    settings: Settings,
    storage: Storage | None,
    env: Mapping[str, str],
    docker_host: str | None = None,
) -> ImageBuilder:
    """The builder the settings choose (``KINETIC_BUILDER`` > profile > default).

    :param storage: the jobs bucket's store (Cloud Build's sources and logs go there).
    :raises ConfigError: unknown builder, or Cloud Build without a project and bucket.
    """
    name = choose_builder(settings.builder, project=settings.project, env=env)
    if name == "docker":
        from kinetic._images.docker import DockerBuilder

        return DockerBuilder(docker_host or env.get("DOCKER_HOST"))
    from kinetic._images.cloudbuild import CloudBuildBuilder

    if not settings.project or storage is None:
        raise ConfigError("the cloudbuild builder needs a GCP project (KINETIC_PROJECT)")
    return CloudBuildBuilder(project=settings.project, storage=storage, bucket=settings.bucket_name)


async def resolve_job_image(
    container_image: str | None,
    *,
    category: str,
    package_root: Path,
    settings: Settings,
    options: GKEOptions,
    storage: Storage,
    env: Mapping[str, str],
    progress: Progress | None = None,
) -> JobImage:
    """The image (and install list) of a job, building the bundled image if it is new.

    :raises RequirementsError: a requirement line cannot be parsed, or (prebuilt mode)
        cannot be installed from a package index.
    :raises ConfigError: no registry for bundled images; unknown builder.
    :raises ImageBuildError: the bundled image could not be built or pushed.
    :raises BackendError: the registry failed, or (prebuilt) lacks the base image.
    """
    mode = image_spec.execution_mode(container_image)
    if mode == "custom":
        assert container_image is not None
        return JobImage(container_image, "custom")
    reqs = await anyio.to_thread.run_sync(read_project_requirements, package_root)
    reqs = filter_for_category(reqs, category)
    lines = tuple(requirements_lines(reqs))
    if mode == "prebuilt":
        check_installable_remotely(reqs)
        uri = image_spec.prebuilt_uri(settings.base_image_repo, category, __version__)
        if not await runner_image.image_exists(uri):
            raise ConfigError(
                f"the prebuilt base image {uri} is not in its registry: build it with "
                f"`kinetic build-image --repo {settings.base_image_repo} --category "
                f"{category}`, or set base_image_repo= / KINETIC_BASE_IMAGE_REPO"
            )
        return JobImage(uri, "prebuilt", install=lines)
    registry = options.image_registry or settings.default_registry
    the_plan = await anyio.to_thread.run_sync(
        lambda: runner_image.plan(
            registry, options.base_image, category=category, user_requirements=lines
        )
    )
    await runner_image.ensure_image(
        the_plan,
        lambda: make_builder(settings, storage, env),
        lock_storage=storage,
        progress=progress,
    )
    return JobImage(the_plan.uri, "bundled")
