"""Prebuilt base images: ``{repo}/base-{cpu,gpu,tpu}:{version}`` for prebuilt mode.

Each is Kinetic's runner image with ``uv`` among its packages, so that a pod installs
the job's requirements at start (:mod:`runner.install`). ``kinetic build-image``
builds and pushes them with the selected builder.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import anyio.to_thread

from kinetic._core import image_spec
from kinetic._images import runner_image
from kinetic._images.builder import ImageBuilder, Progress


def base_plan(repo: str, category: str, tag: str, base_image: str) -> runner_image.BuildPlan:
    """What ``base-{category}:{tag}`` is made of. Blocking the first time per process.

    :raises ValueError: for an unknown category.
    """
    the_plan = runner_image.plan(
        repo,
        base_image,
        f"base-{category}",
        category=category,
        extra_requirements=(image_spec.UV_REQUIREMENT,),
    )
    uri = image_spec.prebuilt_uri(repo, category, tag)
    return dataclasses.replace(the_plan, uri=uri, tag=tag)


async def build_base_images(
    repo: str,
    categories: Sequence[str],
    *,
    tag: str,
    base_image: str,
    builder: ImageBuilder,
    rebuild: bool = False,
    progress: Progress | None = None,
) -> list[str]:
    """Build and push ``base-{category}:{tag}`` for each category; return their URIs.

    An image the registry already lists is kept unless ``rebuild``.

    :raises ImageBuildError: a build or push failed (the images before it stay pushed).
    :raises BackendError: the registry failed.
    """
    uris = []
    for category in categories:
        the_plan = await anyio.to_thread.run_sync(base_plan, repo, category, tag, base_image)
        if rebuild or not await runner_image.image_exists(the_plan.uri):
            await runner_image.build(the_plan, builder, progress=progress)
        elif progress is not None:
            progress(f"{the_plan.uri} is already in its registry (--rebuild to replace it)")
        uris.append(the_plan.uri)
    return uris
